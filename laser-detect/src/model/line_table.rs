//! The line model's memory of the previous access per line: a set-associative table, like the
//! cache it models, so its size is bounded no matter how long the run or how large the
//! target's footprint.
//!
//! ```text
//!   hash(line) ─▶ set ─▶ [way0 | way1 | way2 | way3]   32 B per way, 128 B per set
//!   miss in a full set: the least recently used way is forgotten
//! ```
//! Forgetting a line loses at most the event its next access would have formed with the
//! forgotten one: a line untouched while 128 Ki others were accessed (the default capacity,
//! see `line_model::DEFAULT_MAX_LINES`) is not being contended at any rate that matters. The table starts small and
//! doubles (rehashing) until the capacity cap, so small runs use little memory.

use crate::model::findings::Op;

/// The previous access to one line. The byte range is offset + length (accesses are
/// contiguous), not a 16-byte bitmap, to keep a way at 32 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LastAccess {
    pub pc: u64,
    pub tid: u32,
    /// Recency stamp for LRU replacement (wrapping counter).
    pub stamp: u32,
    pub off: u8,
    pub len: u8,
    pub op: Op,
    /// The line has had a contention event (its later accesses feed the line's
    /// [`crate::model::recent`] windows). Carried from access to access by [`LineTable::swap`].
    pub contended: bool,
}

#[derive(Clone, Copy)]
struct Way {
    /// `line + 1`; 0 = empty (line addresses are multiples of 64, never `u64::MAX`).
    key: u64,
    last: LastAccess,
}

const EMPTY: Way = Way {
    key: 0,
    last: LastAccess {
        pc: 0,
        tid: 0,
        stamp: 0,
        off: 0,
        len: 0,
        op: Op::Load,
        contended: false,
    },
};

const WAYS: usize = 4;

pub struct LineTable {
    ways: Vec<Way>,
    /// log2 of the number of sets.
    bits: u32,
    max_bits: u32,
    used: usize,
    clock: u32,
    evictions: u64,
}

impl LineTable {
    /// A table holding at most `max_lines` lines (rounded up to a power of two, ≥ 64).
    pub fn new(max_lines: usize) -> Self {
        let max_sets = (max_lines.max(64) / WAYS).next_power_of_two();
        let max_bits = max_sets.trailing_zeros();
        let bits = 8.min(max_bits);
        Self {
            ways: vec![EMPTY; (1usize << bits) * WAYS],
            bits,
            max_bits,
            used: 0,
            clock: 0,
            evictions: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.used
    }

    pub fn is_empty(&self) -> bool {
        self.used == 0
    }

    /// Lines forgotten to make room.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Bytes of table memory.
    pub fn bytes(&self) -> usize {
        self.ways.len() * std::mem::size_of::<Way>()
    }

    #[inline]
    fn set_of(&self, line: u64) -> usize {
        // Fibonacci hashing of the line number: neighbouring lines land in different sets.
        let h = (line >> 6).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        ((h >> (64 - self.bits)) as usize) * WAYS
    }

    /// Record `new` as the last access to `line`, returning the previous one if remembered.
    #[inline]
    pub fn swap(&mut self, line: u64, mut new: LastAccess) -> Option<LastAccess> {
        self.clock = self.clock.wrapping_add(1);
        new.stamp = self.clock;
        let key = line + 1;
        let s = self.set_of(line);
        let set = &mut self.ways[s..s + WAYS];
        if let Some(w) = set.iter_mut().find(|w| w.key == key) {
            new.contended |= w.last.contended;
            return Some(std::mem::replace(&mut w.last, new));
        }
        // Below the cap, grow rather than forget: when the table is 3/4 full or this set is.
        let set_full = set.iter().all(|w| w.key != 0);
        if (set_full || self.used * 4 >= self.ways.len() * 3) && self.bits < self.max_bits {
            self.grow();
            return self.swap_insert(line, new);
        }
        self.swap_insert(line, new)
    }

    /// Mark `line` contended (no-op when it is not remembered).
    pub fn mark_contended(&mut self, line: u64) {
        let key = line + 1;
        let s = self.set_of(line);
        if let Some(w) = self.ways[s..s + WAYS].iter_mut().find(|w| w.key == key) {
            w.last.contended = true;
        }
    }

    fn swap_insert(&mut self, line: u64, new: LastAccess) -> Option<LastAccess> {
        let s = self.set_of(line);
        let clock = self.clock;
        let set = &mut self.ways[s..s + WAYS];
        let victim = set
            .iter_mut()
            .max_by_key(|w| {
                if w.key == 0 {
                    u32::MAX // empty ways first
                } else {
                    clock.wrapping_sub(w.last.stamp)
                }
            })
            .expect("WAYS > 0");
        if victim.key == 0 {
            self.used += 1;
        } else {
            self.evictions += 1;
        }
        *victim = Way {
            key: line + 1,
            last: new,
        };
        None
    }

    fn grow(&mut self) {
        let old = std::mem::replace(&mut self.ways, vec![EMPTY; (2usize << self.bits) * WAYS]);
        self.bits += 1;
        self.used = 0;
        // Re-insert oldest first so LRU order survives within each set.
        let mut live: Vec<Way> = old.into_iter().filter(|w| w.key != 0).collect();
        let clock = self.clock;
        live.sort_by_key(|w| std::cmp::Reverse(clock.wrapping_sub(w.last.stamp)));
        for w in live {
            self.swap_insert(w.key - 1, w.last);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acc(tid: u32) -> LastAccess {
        LastAccess {
            pc: tid as u64,
            tid,
            stamp: 0,
            off: 0,
            len: 8,
            op: Op::Store,
            contended: false,
        }
    }

    #[test]
    fn the_contended_mark_carries_from_access_to_access() {
        let mut t = LineTable::new(1 << 10);
        t.swap(0x1000, acc(1));
        t.mark_contended(0x1000);
        assert!(t.swap(0x1000, acc(2)).unwrap().contended);
        assert!(
            t.swap(0x1000, acc(3)).unwrap().contended,
            "carried to the next access"
        );
        t.mark_contended(0x2000); // not remembered: nothing happens
        assert!(!t.swap(0x2000, acc(1)).is_some_and(|a| a.contended));
    }

    #[test]
    fn remembers_and_replaces() {
        let mut t = LineTable::new(1 << 10);
        assert_eq!(t.swap(0x1000, acc(1)), None);
        assert_eq!(t.swap(0x1000, acc(2)).map(|a| a.tid), Some(1));
        assert_eq!(t.swap(0x1000, acc(3)).map(|a| a.tid), Some(2));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn grows_to_its_cap_then_evicts_lru() {
        let mut t = LineTable::new(1024);
        for i in 0..512u64 {
            t.swap(i * 64, acc(1));
        }
        // Grew instead of evicting while below the cap…
        assert_eq!(t.evictions(), 0);
        assert_eq!(t.len(), 512);
        assert!(t.bytes() <= 1024 * 32);
        // …and beyond the cap it forgets, never grows.
        for i in 1024..100_000u64 {
            t.swap(i * 64, acc(1));
        }
        assert!(t.bytes() <= 1024 * 32);
        assert!(t.len() <= 1024);
        assert!(t.evictions() > 90_000);
        // The most recent lines are still there.
        assert!(t.swap(99_999 * 64, acc(2)).is_some());
    }

    #[test]
    fn hot_line_survives_a_scan() {
        // A line touched between every few cold lines stays (LRU), as in a real cache.
        let mut t = LineTable::new(256);
        t.swap(0, acc(1));
        for i in 1..10_000u64 {
            t.swap(i * 64 + 0x10_0000, acc(1));
            if i % 8 == 0 {
                assert!(t.swap(0, acc(2)).is_some(), "hot line lost at {i}");
            }
        }
    }
}
