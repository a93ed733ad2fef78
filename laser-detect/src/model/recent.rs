//! Which bytes of a line each thread touched recently, to tell a false-sharing event that
//! padding would remove from one that would stay.
//!
//! The LASER rule compares a new access with the *previous* access to the line: disjoint bytes
//! → false sharing. That misnames the neighbour accesses of two threads that really exchange
//! data through the line:
//!
//! ```text
//!   line (64 B)       word 0 [0..8)      word 2 [16..24)
//!   T0  ──W0──W16────────W0──W16────────▶      T0 publishes word 0, also writes word 2
//!   T1  ─────────R0───────────────R0────▶      T1 reads word 0
//!        T1 R0 after T0 W16: disjoint bytes → "false", yet the line moves for word 0
//! ```
//!
//! Moving word 2 to its own line would not remove a single transfer: T0 and T1 share word 0.
//! So an event between two threads is counted as true sharing when the bytes either thread
//! touched in its last [`WINDOW`] accesses to the line overlap bytes the other *wrote* in its
//! own last [`WINDOW`] (plain byte overlap of the two accesses stays the first test). Two
//! threads writing only their own words never overlap, however long they run; a thread that
//! reads another's word once (a final result) only reclassifies the few events around that read.
//! A line is then `mixed` only when it is genuinely split: some thread pairs exchange data on
//! it and others only collide on neighbouring bytes ([`crate::model::line_kind`]).
//!
//! Where the accesses come from: the line model ([`crate::model::line_model`]) remembers both sides
//! of every event and, once a line has had one, every later sampled access to it (a flag in the
//! line table says so; uncontended lines cost nothing); its first event has no history and
//! keeps the byte test. The watch estimator ([`crate::model::estimate`]) remembers every access to
//! the watched words, across windows.

/// Accesses per thread remembered: small, because "recently" must mean "in the same
/// exchange", but enough for a lock/unlock pair touching a mutex's fields (glibc's
/// `pthread_mutex_lock` and `unlock` touch the lock word, owner, user count and kind: about
/// eight accesses per critical section).
pub const WINDOW: usize = 8;

use crate::model::line_model::byte_mask;

/// One thread's last [`WINDOW`] accesses to one line, each kept as a byte range (offset,
/// length, written) in 3 bytes, so a window costs 25 bytes per thread per contended line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recent {
    /// (offset, length, written); length 0 = empty slot.
    slots: [(u8, u8, bool); WINDOW],
    next: u8,
}

/// The byte range of a mask (accesses are contiguous; a mask with holes is widened to its
/// span, which can only add overlap, never hide it).
fn range_of(bytes: u128) -> (u8, u8) {
    if bytes == 0 {
        return (0, 0);
    }
    let lo = bytes.trailing_zeros();
    let hi = 128 - bytes.leading_zeros();
    (lo as u8, (hi - lo) as u8)
}

fn mask_of(off: u8, len: u8) -> u128 {
    byte_mask(off as u32, len as u32)
}

impl Recent {
    /// Remember an access of `bytes`, written when `writes`.
    #[inline]
    pub fn push(&mut self, bytes: u128, writes: bool) {
        let (off, len) = range_of(bytes);
        self.slots[self.next as usize] = (off, len, writes);
        self.next = ((self.next as usize + 1) % WINDOW) as u8;
    }

    /// Remember an access unless it is the latest one remembered (the previous access of a
    /// line is often the one the last event already pushed as its new access).
    #[inline]
    pub fn push_once(&mut self, bytes: u128, writes: bool) {
        let last = (self.next as usize + WINDOW - 1) % WINDOW;
        let (off, len) = range_of(bytes);
        if self.slots[last] != (off, len, writes) {
            self.push(bytes, writes);
        }
    }

    /// Bytes (touched, written) by the remembered accesses, in one pass (every contention
    /// event needs both for both threads).
    pub fn masks(&self) -> (u128, u128) {
        self.slots.iter().fold((0, 0), |(t, w), s| {
            let m = mask_of(s.0, s.1);
            (t | m, if s.2 { w | m } else { w })
        })
    }

    /// Whether the two threads exchange data: one wrote bytes the other touched.
    pub fn shares_with(&self, other: &Recent) -> bool {
        let ((t0, w0), (t1, w1)) = (self.masks(), other.masks());
        (w0 & t1) | (t0 & w1) != 0
    }
}

/// Per-thread [`Recent`] windows of one line (a handful of threads per contended line).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecentByThread(Vec<(u32, Recent)>);

impl RecentByThread {
    /// Remember an access by `tid`; `once` skips it when it repeats that thread's latest.
    pub fn push(&mut self, tid: u32, bytes: u128, writes: bool, once: bool) {
        match self.0.iter_mut().find(|r| r.0 == tid) {
            Some(r) if once => r.1.push_once(bytes, writes),
            Some(r) => r.1.push(bytes, writes),
            None => {
                let mut r = Recent::default();
                r.push(bytes, writes);
                self.0.push((tid, r));
            }
        }
    }

    pub fn get(&self, tid: u32) -> Option<&Recent> {
        self.0.iter().find(|r| r.0 == tid).map(|r| &r.1)
    }

    /// Whether threads `a` and `b` exchanged data on the line recently.
    pub fn pair_shares(&self, a: u32, b: u32) -> bool {
        match (self.get(a), self.get(b)) {
            (Some(x), Some(y)) => x.shares_with(y),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_round_trip_through_masks() {
        for (off, len) in [(0u8, 8u8), (16, 8), (60, 4), (0, 128), (120, 8), (5, 1)] {
            let m = byte_mask(off as u32, len as u32);
            assert_eq!(range_of(m), (off, len));
            assert_eq!(mask_of(off, len), m);
        }
        assert_eq!(range_of(0), (0, 0));
        assert_eq!(mask_of(0, 0), 0);
        // Holes widen to the span: more overlap, never less.
        assert_eq!(range_of(0b1001), (0, 4));
    }

    #[test]
    fn publisher_and_reader_of_one_word_share_despite_a_private_neighbour() {
        // T0: W[0..8) W[16..24);  T1: R[0..8)
        let mut r = RecentByThread::default();
        r.push(0, byte_mask(0, 8), true, false);
        r.push(0, byte_mask(16, 8), true, false);
        r.push(1, byte_mask(0, 8), false, false);
        assert!(r.pair_shares(0, 1));
        assert!(r.pair_shares(1, 0));
    }

    #[test]
    fn writers_of_their_own_words_never_share() {
        // T0: W[0..8) ×10;  T1: W[8..16) ×10, R[8..16)
        let mut r = RecentByThread::default();
        for _ in 0..10 {
            r.push(0, byte_mask(0, 8), true, false);
            r.push(1, byte_mask(8, 8), true, false);
        }
        r.push(1, byte_mask(8, 8), false, false);
        assert!(!r.pair_shares(0, 1));
    }

    #[test]
    fn readers_of_one_word_do_not_share() {
        // Both read word 0 and each writes its own word: read-only overlap is no exchange.
        let mut r = RecentByThread::default();
        r.push(0, byte_mask(0, 8), false, false);
        r.push(0, byte_mask(8, 8), true, false);
        r.push(1, byte_mask(0, 8), false, false);
        r.push(1, byte_mask(16, 8), true, false);
        assert!(!r.pair_shares(0, 1));
    }

    #[test]
    fn an_old_exchange_is_forgotten_after_the_window() {
        // T1 read T0's word once, then only its own word WINDOW times: no longer sharing.
        let mut r = RecentByThread::default();
        r.push(0, byte_mask(0, 8), true, false);
        r.push(1, byte_mask(0, 8), false, false);
        assert!(r.pair_shares(0, 1));
        for _ in 0..WINDOW {
            r.push(1, byte_mask(8, 8), true, false);
        }
        assert!(!r.pair_shares(0, 1));
    }

    #[test]
    fn a_previous_access_pushed_again_is_not_remembered_twice() {
        // The event T0→T1 pushes T1's R0 as new; the next event T1→T0 pushes it as previous:
        // once only, so T1's window still holds its older write of word 2.
        let mut r = RecentByThread::default();
        r.push(1, byte_mask(16, 8), true, false);
        for _ in 0..WINDOW - 1 {
            r.push(1, byte_mask(0, 8), false, false);
            r.push(1, byte_mask(0, 8), false, true);
        }
        assert_eq!(r.get(1).unwrap().masks().1, byte_mask(16, 8));
        // Pushed as a new access, a repeat does count: the write falls out of the window.
        r.push(1, byte_mask(0, 8), false, false);
        assert_eq!(r.get(1).unwrap().masks().1, 0);
    }

    #[test]
    fn unknown_threads_share_nothing() {
        let r = RecentByThread::default();
        assert!(!r.pair_shares(3, 4));
    }
}
