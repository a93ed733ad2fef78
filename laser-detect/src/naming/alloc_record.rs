//! The allocation records laser's preloaded recorder (`shim/laser_alloc.c`) keeps in the
//! target: their layout, and finding the record of one block. Parsers take bytes; the reads
//! go through the [`Memory`] seam, so tests run on byte images.
//!
//! ```text
//!  table ──▶ header: magic "lsalloc1", sets, ways, stack_words, (2 reserved),
//!                    early, armed_n, armed_lo[8], armed_hi[8]          (24 words)
//!            tags[sets·ways]      live pointer of each entry (0 free, 1 being written)
//!            entries[sets·ways]   ptr, size, ret, sp, bp, stack[stack_words]
//! ```
//!
//! A block's set is `((ptr >> 4) · 0x9E3779B97F4A7C15) >> (64 − log2 sets)`; an entry counts
//! when its tag and its `ptr` both equal the block (the target may be rewriting it).

use crate::naming::heap_blocks::Memory;

/// `"lsalloc1"` little-endian.
pub const MAGIC: u64 = 0x3163_6f6c_6c61_736c;
/// Words before `tags`.
pub const HEADER_WORDS: u64 = 24;
/// Byte offset of `armed_n`; `armed_lo` and `armed_hi` follow.
pub const ARMED_N_OFFSET: u64 = 7 * 8;
/// Ranges laser may arm.
pub const MAX_ARMED: usize = 8;
/// Words of an entry before its stack copy.
const ENTRY_FIXED_WORDS: u64 = 5;

/// One allocation as the recorder saw it: the block, the requested size and the caller's
/// state at the call (its return address, stack and frame pointer, and a copy of its stack
/// from `sp`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocRecord {
    pub ptr: u64,
    pub size: u64,
    pub ret: u64,
    pub sp: u64,
    pub bp: u64,
    pub stack: Vec<u64>,
}

impl AllocRecord {
    /// Parses one entry (`ptr, size, ret, sp, bp, stack…`) from `bytes`.
    pub fn parse(bytes: &[u8]) -> Option<AllocRecord> {
        let words: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        let (fixed, stack) = words.split_at_checked(ENTRY_FIXED_WORDS as usize)?;
        Some(AllocRecord {
            ptr: fixed[0],
            size: fixed[1],
            ret: fixed[2],
            sp: fixed[3],
            bp: fixed[4],
            stack: stack.to_vec(),
        })
    }

    /// The stack word at `addr`, if the copy holds it.
    pub fn stack_word(&self, addr: u64) -> Option<u64> {
        let off = addr.checked_sub(self.sp)?;
        if !off.is_multiple_of(8) {
            return None;
        }
        self.stack.get(usize::try_from(off / 8).ok()?).copied()
    }
}

/// The table's shape, from its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Table {
    pub addr: u64,
    pub sets: u64,
    pub ways: u64,
    pub stack_words: u64,
}

impl Table {
    /// Reads and checks the header at `addr`.
    pub fn read(mem: &mut dyn Memory, addr: u64) -> Option<Table> {
        let mut h = [0u8; 48];
        if mem.read(addr, &mut h) != h.len() {
            return None;
        }
        let w = |i: usize| u64::from_le_bytes(h[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        let t = Table {
            addr,
            sets: w(1),
            ways: w(2),
            stack_words: w(3),
        };
        let sane = w(0) == MAGIC
            && t.sets.is_power_of_two()
            && (1..=64).contains(&t.ways)
            && t.stack_words <= 512;
        sane.then_some(t)
    }

    fn entry_bytes(&self) -> u64 {
        (ENTRY_FIXED_WORDS + self.stack_words) * 8
    }

    fn set_of(&self, ptr: u64) -> u64 {
        let bits = self.sets.trailing_zeros();
        ((ptr >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15)) >> (64 - bits)
    }

    /// The record of the block malloc returned as `ptr`, if the table holds it.
    pub fn lookup(&self, mem: &mut dyn Memory, ptr: u64) -> Option<AllocRecord> {
        let first = self.set_of(ptr) * self.ways;
        let tags_at = self.addr + HEADER_WORDS * 8;
        let mut tags = vec![0u8; (self.ways * 8) as usize];
        if mem.read(tags_at + first * 8, &mut tags) != tags.len() {
            return None;
        }
        let way = tags
            .chunks_exact(8)
            .position(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")) == ptr)?
            as u64;
        let entries_at = tags_at + self.sets * self.ways * 8;
        let mut e = vec![0u8; self.entry_bytes() as usize];
        if mem.read(entries_at + (first + way) * self.entry_bytes(), &mut e) != e.len() {
            return None;
        }
        AllocRecord::parse(&e).filter(|r| r.ptr == ptr)
    }

    /// The bytes that arm `ranges` (`[lo, hi)`, at most [`MAX_ARMED`]): written at
    /// `addr + ARMED_N_OFFSET`, they make the recorder record every block allocated there.
    pub fn armed_bytes(ranges: &[(u64, u64)]) -> Vec<u8> {
        let n = ranges.len().min(MAX_ARMED);
        let mut lo = [0u64; MAX_ARMED];
        let mut hi = [0u64; MAX_ARMED];
        for (i, &(l, h)) in ranges.iter().take(n).enumerate() {
            (lo[i], hi[i]) = (l, h);
        }
        std::iter::once(n as u64)
            .chain(lo)
            .chain(hi)
            .flat_map(u64::to_le_bytes)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::naming::heap_blocks::Image;

    /// A table image of 4 sets × 2 ways, 3 stack words, holding `recs`.
    fn image(base: u64, recs: &[AllocRecord]) -> Vec<u8> {
        let t = Table {
            addr: base,
            sets: 4,
            ways: 2,
            stack_words: 3,
        };
        let mut words = vec![MAGIC, 4, 2, 3, 0, 0];
        words.resize(HEADER_WORDS as usize, 0);
        let tags_at = words.len();
        words.resize(tags_at + 8, 0);
        let entries_at = words.len();
        words.resize(entries_at + 8 * 8, 0);
        for r in recs {
            let s = t.set_of(r.ptr) * 2;
            let w = (0..2)
                .find(|&w| words[tags_at + (s + w) as usize] == 0)
                .unwrap();
            let i = (s + w) as usize;
            words[tags_at + i] = r.ptr;
            let at = entries_at + i * 8;
            words[at..at + 5].copy_from_slice(&[r.ptr, r.size, r.ret, r.sp, r.bp]);
            words[at + 5..at + 8].copy_from_slice(&r.stack);
        }
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    fn rec(ptr: u64, size: u64) -> AllocRecord {
        AllocRecord {
            ptr,
            size,
            ret: 0x401234,
            sp: 0x7ff0,
            bp: 0x8000,
            stack: vec![1, 2, 3],
        }
    }

    #[test]
    fn finds_recorded_blocks_and_only_them() {
        let base = 0x10_0000;
        let recs = [rec(0x5000_0010, 24), rec(0x5000_0040, 120)];
        let bytes = image(base, &recs);
        let mut mem = Image {
            base,
            bytes: &bytes,
        };
        let t = Table::read(&mut mem, base).expect("header");
        assert_eq!((t.sets, t.ways, t.stack_words), (4, 2, 3));
        assert_eq!(t.lookup(&mut mem, 0x5000_0040), Some(recs[1].clone()));
        assert_eq!(t.lookup(&mut mem, 0x5000_0010), Some(recs[0].clone()));
        assert_eq!(t.lookup(&mut mem, 0x5000_0020), None);
        assert_eq!(recs[0].stack_word(0x7ff8), Some(2));
        assert_eq!(recs[0].stack_word(0x7ff4), None);
        assert_eq!(recs[0].stack_word(0x8010), None);
    }

    #[test]
    fn a_bad_header_is_refused() {
        let bytes = vec![0u8; 4096];
        let mut mem = Image {
            base: 0,
            bytes: &bytes,
        };
        assert_eq!(Table::read(&mut mem, 0), None);
    }

    #[test]
    fn armed_bytes_layout() {
        let b = Table::armed_bytes(&[(0x1000, 0x1040)]);
        assert_eq!(b.len(), 8 * (1 + 2 * MAX_ARMED));
        assert_eq!(&b[..8], &1u64.to_le_bytes());
        assert_eq!(&b[8..16], &0x1000u64.to_le_bytes());
        assert_eq!(
            &b[8 + 8 * MAX_ARMED..16 + 8 * MAX_ARMED],
            &0x1040u64.to_le_bytes()
        );
    }
}
