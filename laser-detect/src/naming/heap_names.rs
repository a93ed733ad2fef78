//! The malloc blocks behind a run's contended heap lines, collected while the process lives.
//!
//! `laser run` cannot read the target when it builds the report (the program has exited), so
//! [`HeapNamer::update`] is called now and then during the run with the current top lines;
//! it walks each new heap line's arena a bounded number of bytes per call (resuming next
//! call) and keeps the answer. `laser attach` calls it once at the end with the report's
//! heap lines. The result, [`HeapBlocks`], goes into the report options.
//!
//! A line is named once, from the first walk that reaches it: a block freed and reused later
//! in the run by an object of another size is not noticed.

use std::collections::BTreeMap;

use crate::decode::maps::Region;
use crate::naming::heap_blocks::{arena_for, Arena, Block, HeapError, Memory, Step, Walk};

/// Per heap line (run-time line address): its blocks, or why they are unknown.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HeapBlocks {
    pub lines: BTreeMap<u64, Result<Vec<Block>, HeapError>>,
    /// Allocation sites of blocks, by the pointer malloc returned (`laser run` with the
    /// allocation recorder; see `naming::alloc_site`).
    pub sites: BTreeMap<u64, crate::naming::alloc_site::AllocSite>,
    /// Why blocks have no site, when none could be had (a note for the report).
    pub sites_note: Option<String>,
}

/// Failed attempts after which a line is left unnamed (a torn chain is retried: the target
/// writes its heap while we read it).
const MAX_ATTEMPTS: u32 = 3;

/// Collects [`HeapBlocks`] incrementally.
#[derive(Clone, Debug)]
pub struct HeapNamer {
    line_size: u64,
    done: HeapBlocks,
    pending: BTreeMap<u64, Walk>,
    attempts: BTreeMap<u64, u32>,
    /// Bytes of target memory read so far, for the cost note.
    pub bytes_read: u64,
}

/// Whether `addr` lies where malloc memory can be: `[heap]` or anonymous read-write memory.
pub fn in_heap_memory(regions: &[Region], addr: u64) -> bool {
    regions.iter().any(|r| {
        r.start <= addr
            && addr < r.end
            && r.read
            && r.write
            && (r.path == "[heap]" || r.path.is_empty())
    })
}

impl HeapNamer {
    pub fn new(line_size: u32) -> HeapNamer {
        HeapNamer {
            line_size: u64::from(line_size.max(1)),
            done: HeapBlocks::default(),
            pending: BTreeMap::new(),
            attempts: BTreeMap::new(),
            bytes_read: 0,
        }
    }

    /// Whether `line` still needs work (not named, not given up).
    pub fn wants(&self, line: u64) -> bool {
        !self.done.lines.contains_key(&line)
    }

    /// Works on `lines` (line addresses; those not in heap memory are skipped), reading at
    /// most `budget` bytes of `mem` in all.
    ///
    /// The lines are walked in address order, and a new walk to a line starts where the last
    /// walk of this call in the same arena stopped, not at the arena's first chunk: eight
    /// lines among a heap of many small blocks (kmeans' points) read the same megabytes eight
    /// times. Within one call the heap is read at one moment, so those chunk headers still
    /// are headers.
    pub fn update(&mut self, lines: &[u64], regions: &[Region], mem: &mut dyn Memory, budget: u64) {
        let mut left = budget;
        let mut lines = lines.to_vec();
        lines.sort_unstable();
        lines.dedup();
        // The arena and chunk header the last finished walk of this call stopped at.
        let mut resume: Option<(Arena, u64)> = None;
        for line in lines {
            if !self.wants(line) || !in_heap_memory(regions, line) {
                continue;
            }
            let before = left;
            let walk = match self.pending.remove(&line) {
                Some(w) => Ok(w),
                None => arena_for(regions, line, mem).map(|a| match resume {
                    Some((r, at)) if r == a => Walk::resuming(a, at, line, self.line_size),
                    _ => Walk::new(a, line, self.line_size),
                }),
            };
            let outcome = walk.and_then(|mut w| match w.step(mem, &mut left)? {
                Step::Done(blocks) => {
                    resume = w.resume_point().map(|at| (w.arena(), at));
                    Ok(Some(blocks))
                }
                Step::Pending => {
                    self.pending.insert(line, w);
                    Ok(None)
                }
            });
            self.bytes_read += before - left;
            match outcome {
                Ok(Some(blocks)) => {
                    self.done.lines.insert(line, Ok(blocks));
                }
                Ok(None) => {}
                Err(e) => {
                    let n = self.attempts.entry(line).or_insert(0);
                    *n += 1;
                    if *n >= MAX_ATTEMPTS || !transient(&e) {
                        self.done.lines.insert(line, Err(e));
                    }
                }
            }
            if left == 0 {
                break;
            }
        }
    }

    /// Bytes per line.
    pub fn line_size(&self) -> u64 {
        self.line_size
    }

    /// The blocks named so far, with their line.
    pub fn named(&self) -> impl Iterator<Item = (u64, &Block)> {
        self.done
            .lines
            .iter()
            .filter_map(|(&l, r)| r.as_ref().ok().map(|b| (l, b)))
            .flat_map(|(l, bs)| bs.iter().map(move |b| (l, b)))
    }

    /// What was found. Lines still being walked are reported as too far to finish.
    pub fn finish(&self) -> HeapBlocks {
        let mut out = self.done.clone();
        for (&line, w) in &self.pending {
            out.lines.entry(line).or_insert(Err(HeapError::TooFar {
                line,
                distance: line.saturating_sub(w.arena().first_chunk),
                cap: self.bytes_read,
            }));
        }
        out
    }
}

/// Errors a later read may not hit: the target changed its heap under our read.
fn transient(e: &HeapError) -> bool {
    matches!(
        e,
        HeapError::BadSize { .. }
            | HeapError::PastEnd { .. }
            | HeapError::Unreadable { .. }
            | HeapError::NotMalloc { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::naming::heap_blocks::{BlockState, Image};

    /// Chunks of the given sizes (flags added: PREV_INUSE on all) back to back from `base`.
    fn heap(sizes: &[u64]) -> Vec<u8> {
        let mut b = Vec::new();
        for &s in sizes {
            let at = b.len();
            b.resize(at + s as usize, 0);
            b[at + 8..at + 16].copy_from_slice(&(s | 1).to_le_bytes());
        }
        b
    }

    fn regions(base: u64, len: u64) -> Vec<Region> {
        crate::decode::maps::parse(&format!(
            "{base:x}-{:x} rw-p 00000000 00:00 0                          [heap]\n\
             400000-401000 r-xp 00000000 08:01 12 /bin/app\n",
            base + len
        ))
    }

    #[test]
    fn names_heap_lines_across_calls_and_skips_other_memory() {
        let base = 0x10_0000;
        // 0x1000 bytes of small chunks, then one 32-byte chunk pair on a line, then top.
        let mut sizes = vec![0x40; 0x1000 / 0x40];
        sizes.extend([0x20, 0x20, 0x1000 - 0x40]);
        let bytes = heap(&sizes);
        let r = regions(base, bytes.len() as u64);
        let mut mem = Image {
            base,
            bytes: &bytes,
        };
        let mut n = HeapNamer::new(64);
        let line = base + 0x1000;
        // The code line is not heap: never named, never an error.
        n.update(&[0x400040, line], &r, &mut mem, 100);
        assert!(n.wants(line), "100 bytes cannot reach the line");
        assert!(n.wants(0x400040));
        for _ in 0..100 {
            n.update(&[0x400040, line], &r, &mut mem, 0x1000);
        }
        let got = n.finish();
        assert!(!got.lines.contains_key(&0x400040));
        let blocks = got.lines[&line].as_ref().unwrap();
        // The chunk before the line owns its first 8 bytes (the next chunk's prev_size).
        assert_eq!(blocks.len(), 3, "{blocks:x?}");
        assert_eq!((blocks[0].user, blocks[0].usable), (line - 0x30, 0x38));
        assert_eq!((blocks[1].user, blocks[1].usable), (line + 16, 24));
        assert_eq!((blocks[2].user, blocks[2].usable), (line + 0x30, 24));
        assert!(blocks.iter().all(|b| b.state == BlockState::InUse));
        assert!(n.bytes_read >= 0x1000);
    }

    #[test]
    fn lines_of_one_call_share_one_walk_and_name_the_same_blocks() {
        let base = 0x10_0000;
        // 256 KiB of 64-byte chunks (a heap of small objects), then top.
        let mut sizes = vec![0x40; 0x4_0000 / 0x40];
        sizes.push(0x1000);
        let bytes = heap(&sizes);
        let r = regions(base, bytes.len() as u64);
        let mut mem = Image {
            base,
            bytes: &bytes,
        };
        // Eight lines spread over the heap, given in no order.
        let lines: Vec<u64> = [7u64, 1, 3, 6, 2, 5, 4, 0]
            .iter()
            .map(|i| base + 0x8000 * i + 0x7fc0)
            .collect();
        let mut together = HeapNamer::new(64);
        together.update(&lines, &r, &mut mem, 64 << 20);
        let mut alone = HeapNamer::new(64);
        for &l in &lines {
            alone.update(&[l], &r, &mut mem, 64 << 20);
        }
        let (a, b) = (together.finish(), alone.finish());
        for l in &lines {
            let got = a.lines[l].as_ref().unwrap();
            assert_eq!(got, b.lines[l].as_ref().unwrap(), "line {l:#x}");
            // The chunk starting on the line, and the one before (its last 8 bytes are the
            // line's first: the next chunk's prev_size).
            let users: Vec<u64> = got.iter().map(|b| b.user).collect();
            assert_eq!(users, [l - 0x30, l + 0x10], "{got:x?}");
        }
        // One pass to the farthest line, not one per line.
        assert!(
            together.bytes_read * 3 < alone.bytes_read,
            "{} bytes together, {} alone",
            together.bytes_read,
            alone.bytes_read
        );
    }

    #[test]
    fn a_torn_chain_is_retried_then_given_up() {
        let base = 0x10_0000;
        let mut bytes = heap(&[0x40, 0x40, 0x1000 - 0x80]);
        bytes[0x48..0x50].copy_from_slice(&0x39u64.to_le_bytes());
        let r = regions(base, bytes.len() as u64);
        let mut mem = Image {
            base,
            bytes: &bytes,
        };
        let mut n = HeapNamer::new(64);
        n.update(&[base + 0x80], &r, &mut mem, 1 << 20);
        assert!(n.wants(base + 0x80), "one failure is retried");
        n.update(&[base + 0x80], &r, &mut mem, 1 << 20);
        n.update(&[base + 0x80], &r, &mut mem, 1 << 20);
        let got = n.finish();
        assert!(matches!(
            got.lines[&(base + 0x80)],
            Err(HeapError::BadSize { chunk, .. }) if chunk == base + 0x40
        ));
    }
}
