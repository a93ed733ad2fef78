//! Stores that two threads make through one instruction to addresses close together: the
//! mark of per-thread parts of one array or heap block, whose boundaries are where false
//! sharing lives, found from samples that never show the boundary line itself contended.
//!
//! ```text
//!   block  |part 0 ................|part 1 ................|
//!   T1      store @ +0x40 (sampled)     ↑ shared line at the boundary
//!   T2                                   store @ +0x118 (sampled)
//!   same pc, |0x40 - 0x118| < NEAR  →  the instruction gets a code window
//! ```
//! A timer sample lands on a store that runs once per long computation only a few times a
//! run (PARSEC streamcluster's `lower[c] += …` between 128-dimension distances: ~10 of
//! ~2,000 samples), and two of them on the same line, from two threads, next to each other in
//! time, almost never: the line model sees no contention and no data window is pointed at
//! the line. Those few samples still show one instruction storing for two threads into
//! neighbouring memory. A code window on it (instruction breakpoints: every execution traps,
//! with its address) sees where the threads' stores meet, and its front window rates that
//! line ([`crate::model::estimate`], "Code windows").
//!
//! A load counts through the store that follows it to the same address (`x += …`); a load
//! with none does not (a line two threads only read is not contended). The stack is filtered
//! before this sees an access, and memory far apart (two threads' own heaps, 64 MiB apart in
//! glibc) is not neighbouring. A per-thread array padded to lines gets code windows too,
//! which find no shared line: the cost is a few windows' trap budget (one window a look,
//! [`crate::model::detector::NEIGHBOUR_CODE_WINDOWS`] looks at most), never a finding.

use hashbrown::HashMap;

/// Two threads' stores through one instruction closer than this are neighbours: per-thread
/// parts of up to ~2 KiB each, sampled anywhere in them (streamcluster's parts are 32–192
/// bytes).
pub const NEAR: u64 = 4096;

/// Sampled stores kept per instruction: enough that one thread's run of samples does not
/// push the other thread's last one out before they are compared (each new store is compared
/// with all of them as it comes).
const PER_PC: usize = 8;

/// Instructions tracked at most: a program's distinct store sites seen in samples are
/// hundreds; past this, new ones are not tracked (the table stays a few hundred KiB).
const MAX_PCS: usize = 8192;

/// Recent sampled stores of one instruction, and whether two threads' were neighbours.
#[derive(Clone, Copy, Debug, Default)]
struct Recent {
    seen: [(u32, u64); PER_PC],
    len: u8,
    next: u8,
    near: bool,
    /// Some sample of the instruction stored (else it is a load, which counts through the
    /// store that follows it to the same address: [`NeighbourStores::near`]).
    stores: bool,
}

/// Per store instruction, whether samples showed it storing for two threads into neighbouring
/// memory (module doc).
#[derive(Clone, Debug, Default)]
pub struct NeighbourStores {
    pcs: HashMap<u64, Recent>,
}

impl NeighbourStores {
    /// A sampled access by `tid` through `pc` to `addr`. Loads are kept too: the sample
    /// that lands after `x += …`'s load is as good a witness of where the thread works as
    /// one after its store (the update's store is found from the load when asked).
    #[inline]
    pub fn note(&mut self, pc: u64, tid: u32, addr: u64, stores: bool) {
        if self.pcs.len() >= MAX_PCS && !self.pcs.contains_key(&pc) {
            return;
        }
        let r = self.pcs.entry(pc).or_default();
        r.stores |= stores;
        if r.near {
            return;
        }
        let n = usize::from(r.len);
        if r.seen[..n]
            .iter()
            .any(|&(t, a)| t != tid && a.abs_diff(addr) < NEAR)
        {
            r.near = true;
            return;
        }
        if n < PER_PC {
            r.seen[n] = (tid, addr);
            r.len += 1;
        } else {
            r.seen[usize::from(r.next)] = (tid, addr);
            r.next = (r.next + 1) % PER_PC as u8;
        }
    }

    /// The store instructions whose samples showed two threads accessing neighbouring
    /// memory, ascending. A load stands for the store `store_of` finds for it (the store of
    /// a read-modify-write to the same address); a load with none is left out (two threads
    /// that only read contend for nothing).
    pub fn near(&self, store_of: impl Fn(u64) -> Option<u64>) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .pcs
            .iter()
            .filter(|(_, r)| r.near)
            .filter_map(|(&pc, r)| if r.stores { Some(pc) } else { store_of(pc) })
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_threads_storing_close_together_through_one_instruction() {
        let mut n = NeighbourStores::default();
        n.note(0x10, 1, 0x1000, true);
        n.note(0x10, 1, 0x1040, true);
        assert!(n.near(|_| None).is_empty(), "one thread alone");
        n.note(0x20, 2, 0x1100, true);
        assert!(n.near(|_| None).is_empty(), "another instruction");
        n.note(0x10, 2, 0x1000 + NEAR + 0x40, true);
        assert!(n.near(|_| None).is_empty(), "too far from both");
        n.note(0x10, 2, 0x1118, true);
        assert_eq!(n.near(|_| None), vec![0x10]);
    }

    #[test]
    fn a_load_counts_through_its_store() {
        let mut n = NeighbourStores::default();
        // The load of `x += …` (0x30), whose store is at 0x34; and a load with no store.
        for (pc, addr) in [(0x30, 0x2000), (0x50, 0x3000)] {
            n.note(pc, 1, addr, false);
            n.note(pc, 2, addr + 0x40, false);
        }
        assert_eq!(n.near(|pc| (pc == 0x30).then_some(0x34)), vec![0x34]);
        // Stores sampled at 0x34 as well: one candidate.
        n.note(0x34, 1, 0x2000, true);
        n.note(0x34, 2, 0x2040, true);
        assert_eq!(n.near(|pc| (pc == 0x30).then_some(0x34)), vec![0x34]);
    }

    #[test]
    fn one_threads_run_of_samples_does_not_hide_the_other() {
        let mut n = NeighbourStores::default();
        n.note(0x10, 2, 0x5000, true);
        // Thread 1's stores far away (its own heap) push thread 2's out of the window...
        for i in 0..PER_PC as u64 {
            n.note(0x10, 1, 0x4000_0000 + 64 * i, true);
        }
        n.note(0x10, 2, 0x5008, true);
        assert!(
            n.near(|_| None).is_empty(),
            "far apart: two threads' own memory"
        );
        // ...and thread 1 storing next to thread 2 later still counts.
        n.note(0x10, 1, 0x5100, true);
        assert_eq!(n.near(|_| None), vec![0x10]);
    }

    #[test]
    fn the_table_is_bounded() {
        let mut n = NeighbourStores::default();
        for pc in 0..MAX_PCS as u64 + 10 {
            n.note(pc, 1, 0x1000, true);
        }
        assert_eq!(n.pcs.len(), MAX_PCS);
        n.note(MAX_PCS as u64 + 5, 2, 0x1000, true);
        assert!(
            n.near(|_| None).is_empty(),
            "an instruction past the bound is not tracked"
        );
    }
}
