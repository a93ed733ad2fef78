//! Which glibc malloc block (chunk) holds a heap address: the extent of a heap object, read
//! from the target's memory through a [`Memory`] seam (tests feed byte images).
//!
//! glibc (x86-64, `SIZE_SZ` 8, `MALLOC_ALIGNMENT` 16) lays chunks back to back:
//!
//! ```text
//!   chunk ──▶ ┌───────────────┬──────────────────┐
//!             │ prev_size (8) │ size | A | M | P │   P PREV_INUSE, M IS_MMAPPED, A NON_MAIN_ARENA
//!   user  ──▶ ├───────────────┴──────────────────┤   user = chunk + 16 (what malloc returned)
//!             │ user data …                       │
//!   next  ──▶ ├───────────────┬──────────────────┤   next = chunk + (size & !7)
//!             │ (user's last 8│ next size | P    │   P here says whether `chunk` is in use
//!             └───────────────┴──────────────────┘
//! ```
//!
//! An in-use chunk's usable size is `size − 8` (it also owns the next chunk's `prev_size`
//! word); an mmapped chunk's is `size − 16` (glibc `musable`). Chunk sizes are multiples of
//! 16 and at least 32 (`MINSIZE`); the only smaller "chunk" is a thread heap's 16-byte
//! fencepost at its end.
//!
//! Where chains start:
//! - main arena: the `[heap]` mapping (the brk area), first chunk at its start rounded up so
//!   that `chunk + 16` is 16-aligned (glibc's `front_misalign` correction);
//! - blocks of ≥ 128 KiB (the default `M_MMAP_THRESHOLD`): their own anonymous mmap, an
//!   `IS_MMAPPED` chunk at the mapping start (with `prev_size` 0); adjacent ones may share a
//!   mapping after the kernel merges them, so the walk goes on while chunks stay mmapped;
//! - thread arenas: 64 MiB-aligned heaps starting with a `heap_info` (`ar_ptr`, `prev`,
//!   `size`, …), in the first heap of an arena followed by its `malloc_state`. The header
//!   sizes change between glibc versions, so the first chunk is found by trying 16-aligned
//!   offsets after the header and keeping the first one from which a chain of valid chunks
//!   runs (see [`thread_heap_first_chunk`]).
//!
//! The walk validates every size and gives up with a typed error on anything implausible
//! (the target keeps running while we read, so a chain may be torn). Free chunks cached in
//! tcache or fastbins keep their successor's `PREV_INUSE` bit set: they look in use here.

use crate::decode::maps::Region;

pub const PREV_INUSE: u64 = 1;
pub const IS_MMAPPED: u64 = 2;
pub const NON_MAIN_ARENA: u64 = 4;
const FLAGS: u64 = 7;
/// `MINSIZE` on x86-64.
pub const MIN_CHUNK: u64 = 32;
/// `MALLOC_ALIGNMENT` on x86-64.
pub const ALIGN: u64 = 16;
/// `HEAP_MAX_SIZE` on 64-bit glibc: thread heaps are this large and aligned to it.
pub const HEAP_MAX: u64 = 64 << 20;
/// A walk gives up after this much heap between its first chunk and the line.
pub const SCAN_CAP: u64 = 64 << 20;
/// Bytes read per memory access of the walk (headers of many small chunks per read)…
const WINDOW: usize = 64 << 10;
/// …and at least, where chunks are larger than the reads ([`Walk::header`]).
const MIN_WINDOW: usize = 256;
/// `heap_info` is at least 4 words; the first chunk of a thread heap is after it and, in an
/// arena's first heap, after the `malloc_state` (2,200 bytes in glibc 2.26–2.38).
const THREAD_HEAP_FIRST_MIN: u64 = 32;
const THREAD_HEAP_FIRST_MAX: u64 = 4096;
/// Consecutive valid chunks that make a candidate first chunk of a thread heap believable.
const CHAIN_PROOF: usize = 4;

/// Reads the target's memory: up to `buf.len()` bytes at `addr`, returns how many it read
/// (0: unreadable). The seam that lets tests run on byte images.
pub trait Memory {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> usize;
}

/// A byte image of memory at `base` (tests, core files).
pub struct Image<'a> {
    pub base: u64,
    pub bytes: &'a [u8],
}

impl Memory for Image<'_> {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> usize {
        let Some(off) = addr.checked_sub(self.base) else {
            return 0;
        };
        let Ok(off) = usize::try_from(off) else {
            return 0;
        };
        let Some(src) = self.bytes.get(off..) else {
            return 0;
        };
        let n = src.len().min(buf.len());
        buf[..n].copy_from_slice(&src[..n]);
        n
    }
}

/// Which kind of malloc memory a chain lies in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArenaKind {
    /// The main arena's brk heap (`[heap]`).
    Main,
    /// A thread arena's 64 MiB-aligned heap.
    Thread,
    /// A block malloc served with its own mmap.
    Mmapped,
}

impl ArenaKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ArenaKind::Main => "main",
            ArenaKind::Thread => "thread",
            ArenaKind::Mmapped => "mmap",
        }
    }
}

/// Whether a block is allocated, as far as the chunk headers tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockState {
    /// The next chunk's `PREV_INUSE` is set. Includes blocks freed into tcache or a fastbin,
    /// which glibc leaves marked in use.
    InUse,
    /// Freed into a normal bin (the next chunk's `PREV_INUSE` is clear).
    Free,
    /// The arena's top chunk: not handed out yet.
    Top,
    /// An mmapped block (always in use while mapped).
    Mmapped,
}

impl BlockState {
    pub fn as_str(self) -> &'static str {
        match self {
            BlockState::InUse => "in_use",
            BlockState::Free => "free",
            BlockState::Top => "top",
            BlockState::Mmapped => "mmapped",
        }
    }
}

/// One malloc block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Block {
    /// Address of the chunk header.
    pub chunk: u64,
    /// Chunk size without flag bits.
    pub chunk_size: u64,
    /// The pointer malloc returned: `chunk + 16`.
    pub user: u64,
    /// Bytes from `user` the program may use (`malloc_usable_size`).
    pub usable: u64,
    pub state: BlockState,
    pub arena: ArenaKind,
}

impl Block {
    /// Whether `addr` is inside the user part.
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.user && addr - self.user < self.usable
    }
}

/// Why a block could not be named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeapError {
    #[error("{addr:#x} is not in a readable heap mapping")]
    NotHeap { addr: u64 },
    #[error("anonymous mapping at {start:#x} holds no malloc chunk chain glibc would have made")]
    NotMalloc { start: u64 },
    #[error("chunk at {chunk:#x} has implausible size {size:#x} (chain torn or not glibc)")]
    BadSize { chunk: u64, size: u64 },
    #[error("chunk at {chunk:#x} of size {size:#x} runs past the heap end {end:#x}")]
    PastEnd { chunk: u64, size: u64, end: u64 },
    #[error("could not read {len} bytes of the target at {addr:#x}")]
    Unreadable { addr: u64, len: usize },
    #[error("the chain ends at {at:#x}, before line {line:#x}")]
    EndedBefore { at: u64, line: u64 },
    #[error("line {line:#x} is {distance} bytes into the heap, beyond the {cap}-byte scan cap")]
    TooFar { line: u64, distance: u64, cap: u64 },
}

/// Where a chain of chunks starts and ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arena {
    pub kind: ArenaKind,
    pub first_chunk: u64,
    /// Exclusive end of the memory chunks may occupy.
    pub end: u64,
}

fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(off..off + 8)?.try_into().ok()?))
}

/// The size field (with flags) of the chunk header in `bytes` (16 bytes: prev_size, size).
pub fn size_field(header: &[u8]) -> Option<u64> {
    u64_at(header, 8)
}

fn read_exact(mem: &mut dyn Memory, addr: u64, buf: &mut [u8]) -> Result<(), HeapError> {
    if mem.read(addr, buf) == buf.len() {
        Ok(())
    } else {
        Err(HeapError::Unreadable {
            addr,
            len: buf.len(),
        })
    }
}

/// A plausible ordinary chunk size at `chunk` for a heap ending at `end`.
fn check_size(chunk: u64, size: u64, end: u64) -> Result<(), HeapError> {
    if size < MIN_CHUNK || !size.is_multiple_of(ALIGN) {
        return Err(HeapError::BadSize { chunk, size });
    }
    if chunk.checked_add(size).is_none_or(|n| n > end) {
        return Err(HeapError::PastEnd { chunk, size, end });
    }
    Ok(())
}

/// The arena whose chain covers `addr`, from the target's maps.
pub fn arena_for(regions: &[Region], addr: u64, mem: &mut dyn Memory) -> Result<Arena, HeapError> {
    let r = regions
        .iter()
        .find(|r| r.start <= addr && addr < r.end && r.read && r.write)
        .ok_or(HeapError::NotHeap { addr })?;
    if r.path == "[heap]" {
        // chunk2mem(first) must be 16-aligned: round the start up to 16.
        let first = r.start.next_multiple_of(ALIGN);
        return Ok(Arena {
            kind: ArenaKind::Main,
            first_chunk: first,
            end: r.end,
        });
    }
    if !r.path.is_empty() {
        return Err(HeapError::NotHeap { addr });
    }
    let mut head = [0u8; 32];
    read_exact(mem, r.start, &mut head)?;
    let (w0, w1, w2) = (
        u64_at(&head, 0).unwrap_or(0),
        u64_at(&head, 8).unwrap_or(0),
        u64_at(&head, 16).unwrap_or(0),
    );
    if w0 == 0 && w1 & IS_MMAPPED != 0 && w1 & (NON_MAIN_ARENA | PREV_INUSE) == 0 {
        check_size(r.start, w1 & !FLAGS, r.end)?;
        return Ok(Arena {
            kind: ArenaKind::Mmapped,
            first_chunk: r.start,
            end: r.end,
        });
    }
    // heap_info: ar_ptr (non-null), prev, size (page multiple, within the mapping).
    if r.start.is_multiple_of(HEAP_MAX) && w0 != 0 && w2 > 0 && w2 <= r.end - r.start {
        let end = r.start + w2;
        let first = thread_heap_first_chunk(mem, r.start, end)?;
        return Ok(Arena {
            kind: ArenaKind::Thread,
            first_chunk: first,
            end,
        });
    }
    Err(HeapError::NotMalloc { start: r.start })
}

/// The first chunk of the thread heap at `start` (ending at `end`): the first 16-aligned
/// offset after the headers from which [`CHAIN_PROOF`] valid chunks follow (or a valid chain
/// reaches the heap's end), the first one with `PREV_INUSE` set as glibc always leaves it.
/// Inside `heap_info` and `malloc_state` the words are pointers, small counters and zeros,
/// which fail the size checks.
pub fn thread_heap_first_chunk(
    mem: &mut dyn Memory,
    start: u64,
    end: u64,
) -> Result<u64, HeapError> {
    let span = (THREAD_HEAP_FIRST_MAX + 16).min(end - start) as usize;
    let mut head = vec![0u8; span];
    read_exact(mem, start, &mut head)?;
    let mut off = THREAD_HEAP_FIRST_MIN;
    while off + 16 <= span as u64 {
        let field = u64_at(&head, off as usize + 8).unwrap_or(0);
        if field & PREV_INUSE != 0
            && field & IS_MMAPPED == 0
            && chain_holds(mem, start + off, end).is_ok()
        {
            return Ok(start + off);
        }
        off += ALIGN;
    }
    Err(HeapError::NotMalloc { start })
}

/// Whether [`CHAIN_PROOF`] valid chunks (or a valid chain to `end`) start at `chunk`.
fn chain_holds(mem: &mut dyn Memory, mut chunk: u64, end: u64) -> Result<(), HeapError> {
    for _ in 0..CHAIN_PROOF {
        if chunk == end {
            return Ok(());
        }
        let mut h = [0u8; 16];
        read_exact(mem, chunk, &mut h)?;
        let size = size_field(&h).unwrap_or(0) & !FLAGS;
        if size == ALIGN && chunk + 2 * ALIGN <= end {
            return Ok(()); // fencepost: the heap's chain ends here
        }
        if size & IS_MMAPPED != 0 {
            return Err(HeapError::BadSize { chunk, size });
        }
        check_size(chunk, size, end)?;
        chunk += size;
    }
    Ok(())
}

/// A walk from an arena's first chunk to one line, resumable across budgets (`laser run`
/// reads a few MiB per tick, not a whole big heap at once).
#[derive(Clone, Debug)]
pub struct Walk {
    arena: Arena,
    line: u64,
    line_end: u64,
    cur: u64,
    blocks: Vec<Block>,
    window: Vec<u8>,
    window_base: u64,
    /// The size of the next read, and how many headers the current window gave.
    window_len: usize,
    served: u32,
    /// The chunk header examined last: where a walk to a later line may start
    /// ([`Walk::resume_point`]).
    last_header: Option<u64>,
}

/// What a walk step came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// The blocks whose user part overlaps the line, in address order (may be empty when
    /// the line holds only chunk headers).
    Done(Vec<Block>),
    /// The budget ran out; call [`Walk::step`] again later.
    Pending,
}

impl Walk {
    pub fn new(arena: Arena, line: u64, line_size: u64) -> Walk {
        Walk {
            arena,
            line,
            line_end: line.saturating_add(line_size),
            cur: arena.first_chunk,
            blocks: Vec::new(),
            window: Vec::new(),
            window_base: 0,
            window_len: WINDOW,
            served: 0,
            last_header: None,
        }
    }

    /// A walk to `line` that starts at `start`, a chunk header of `arena` at or below the
    /// line that a walk of the same memory just reached ([`Walk::resume_point`]), rather than
    /// at the arena's first chunk.
    pub fn resuming(arena: Arena, start: u64, line: u64, line_size: u64) -> Walk {
        let mut w = Walk::new(arena, line, line_size);
        if (arena.first_chunk..=line).contains(&start) {
            w.cur = start;
        }
        w
    }

    /// Once done: the header of the last chunk that starts below the line's end, from which a
    /// walk to any later line of this arena may go on (the chunk may reach into that line).
    /// `None` after a fencepost (nothing lies beyond) or before any header was read.
    pub fn resume_point(&self) -> Option<u64> {
        self.last_header
    }

    pub fn arena(&self) -> Arena {
        self.arena
    }

    /// The 16-byte header at `addr`, from the window or a fresh read; `budget` is the bytes
    /// the walk may still read.
    fn header(
        &mut self,
        mem: &mut dyn Memory,
        addr: u64,
        budget: &mut u64,
    ) -> Result<Option<[u8; 16]>, HeapError> {
        let in_window =
            addr >= self.window_base && addr + 16 <= self.window_base + self.window.len() as u64;
        if !in_window {
            // A window that gave one header sat inside one chunk: the chunks here are larger
            // than the reads, so the next reads shrink towards one header's worth (a heap of
            // megabyte arrays was read at 64 KiB per chunk: most of laser's CPU while kmeans
            // ran went to copying them); a window that gave many grows back.
            if !self.window.is_empty() {
                self.window_len = match self.served {
                    0 | 1 => (self.window_len / 8).max(MIN_WINDOW),
                    2..=7 => self.window_len,
                    _ => (self.window_len * 4).min(WINDOW),
                };
            }
            self.served = 0;
            let want = (self.arena.end.saturating_sub(addr)).min(self.window_len as u64) as usize;
            if want < 16 {
                return Err(HeapError::Unreadable { addr, len: 16 });
            }
            // A smaller window when the budget is low; none when not even a header fits.
            let want = want.min(usize::try_from(*budget).unwrap_or(usize::MAX));
            if want < 16 {
                return Ok(None);
            }
            *budget -= want as u64;
            self.window.resize(want, 0);
            let got = mem.read(addr, &mut self.window);
            if got < 16 {
                self.window.clear();
                return Err(HeapError::Unreadable { addr, len: 16 });
            }
            self.window.truncate(got);
            self.window_base = addr;
        }
        let off = (addr - self.window_base) as usize;
        let mut h = [0u8; 16];
        h.copy_from_slice(&self.window[off..off + 16]);
        self.served += 1;
        Ok(Some(h))
    }

    /// Walks on until the line is passed or `budget` bytes have been read.
    pub fn step(&mut self, mem: &mut dyn Memory, budget: &mut u64) -> Result<Step, HeapError> {
        let a = self.arena;
        loop {
            if self.cur >= self.line_end {
                return Ok(Step::Done(std::mem::take(&mut self.blocks)));
            }
            let distance = self.cur - a.first_chunk;
            if distance > SCAN_CAP {
                return Err(HeapError::TooFar {
                    line: self.line,
                    distance: self.line.saturating_sub(a.first_chunk),
                    cap: SCAN_CAP,
                });
            }
            if self.cur >= a.end {
                return Err(HeapError::EndedBefore {
                    at: self.cur,
                    line: self.line,
                });
            }
            let Some(h) = self.header(mem, self.cur, budget)? else {
                return Ok(Step::Pending);
            };
            let field = size_field(&h).unwrap_or(0);
            let size = field & !FLAGS;
            if a.kind == ArenaKind::Thread && size == ALIGN {
                // Fencepost: nothing of this heap's chain lies beyond.
                self.last_header = None;
                if self.blocks.is_empty() {
                    return Err(HeapError::EndedBefore {
                        at: self.cur,
                        line: self.line,
                    });
                }
                return Ok(Step::Done(std::mem::take(&mut self.blocks)));
            }
            let mmapped = field & IS_MMAPPED != 0;
            if mmapped != (a.kind == ArenaKind::Mmapped) {
                return Err(HeapError::BadSize {
                    chunk: self.cur,
                    size: field,
                });
            }
            check_size(self.cur, size, a.end)?;
            self.last_header = Some(self.cur);
            let next = self.cur + size;
            let user = self.cur + 16;
            let (usable, state) = if mmapped {
                (size - 16, BlockState::Mmapped)
            } else if next >= a.end {
                (size - 16, BlockState::Top)
            } else if next + 8 > self.line && user < self.line_end {
                // Only blocks on the line need their successor's PREV_INUSE.
                let Some(nh) = self.header(mem, next, budget)? else {
                    return Ok(Step::Pending);
                };
                let in_use = size_field(&nh).unwrap_or(0) & PREV_INUSE != 0;
                let state = if in_use {
                    BlockState::InUse
                } else {
                    BlockState::Free
                };
                (size - 8, state)
            } else {
                (size - 8, BlockState::InUse)
            };
            if user < self.line_end && user + usable > self.line {
                self.blocks.push(Block {
                    chunk: self.cur,
                    chunk_size: size,
                    user,
                    usable,
                    state,
                    arena: a.kind,
                });
            }
            self.cur = next;
        }
    }
}

/// The blocks overlapping `[line, line + line_size)` in one go (tests, `laser attach`):
/// finds the arena from `regions`, then walks with at most `budget` bytes read.
pub fn blocks_on_line(
    regions: &[Region],
    mem: &mut dyn Memory,
    line: u64,
    line_size: u64,
    budget: u64,
) -> Result<Vec<Block>, HeapError> {
    let arena = arena_for(regions, line, mem)?;
    let mut walk = Walk::new(arena, line, line_size);
    let mut left = budget;
    match walk.step(mem, &mut left)? {
        Step::Done(b) => Ok(b),
        Step::Pending => Err(HeapError::TooFar {
            line,
            distance: line.saturating_sub(arena.first_chunk),
            cap: budget,
        }),
    }
}

#[cfg(test)]
#[path = "heap_blocks_tests.rs"]
mod tests;
