//! The LASER per-line model.
//!
//! Per cache line, the previous access: thread, read/write, byte bitmap, PC. A new access by
//! another thread where either access writes is a contention event; if the two accesses'
//! bytes overlap it is true sharing, if disjoint false sharing:
//!
//! ```text
//!   line 0x1000 (64 B)     bytes 0..8        bytes 8..16
//!   T1  ──W──────────────────W──────────▶
//!   T2  ──────────W─────────────────W───▶
//!          event: T1 W[0..8) then T2 W[8..16): disjoint → false sharing
//! ```
//!
//! Threads stand in for cores (the paper used cores): with threads pinned or few, they agree,
//! and a thread is what a programmer can act on.
//!
//! Memory is bounded and nothing is kept per sample: a 32-byte entry per recently touched line
//! in a set-associative table ([`crate::model::line_table`], LRU, default 128 Ki lines = 4 MiB), and per
//! *contended* line its source PCs and threads (default at most 16 Ki lines; the least
//! contended half is dropped when full).

use hashbrown::HashMap;

use crate::decode::access::Access;
use crate::model::findings::Op;
use crate::model::line_table::{LastAccess, LineTable};
use crate::model::recent::RecentByThread;

/// Bytes `[off, off+len)` of a line as a bitmap (bit N = byte N).
#[inline]
pub fn byte_mask(off: u32, len: u32) -> u128 {
    debug_assert!(off + len <= 128);
    if len == 0 {
        return 0;
    }
    // This runs for every remembered access at every contention event: bytes in the first
    // 64 (every line of 64 bytes) take two u64 shifts, a u128 shift is several instructions.
    if off + len <= 64 {
        return ((u64::MAX >> (64 - len)) << off) as u128;
    }
    (u128::MAX >> (128 - len)) << off
}

/// Per (line, PC) statistics of a contended line.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceStat {
    pub pc: u64,
    pub op: Op,
    pub offsets: u128,
    pub events: u64,
    pub true_events: u64,
    pub false_events: u64,
    pub threads: Vec<u32>,
}

/// Statistics of one contended line.
#[derive(Clone, Debug, PartialEq)]
pub struct LineStat {
    pub line_addr: u64,
    pub events: u64,
    pub true_events: u64,
    pub false_events: u64,
    /// Of `true_events`, those whose two accesses touched disjoint bytes but whose threads
    /// were exchanging data on the line at the time ([`crate::model::recent`]): neighbour accesses of
    /// true sharing, which padding would not remove.
    pub exchange_events: u64,
    pub sources: Vec<SourceStat>,
    /// Per thread, the bytes it touched in contending accesses (both sides of each event).
    pub threads: Vec<(u32, u128)>,
    /// Per thread, its latest contending accesses (for the exchange test).
    pub recent: RecentByThread,
}

impl LineStat {
    fn source(&mut self, pc: u64, op: Op) -> &mut SourceStat {
        let i = match self.sources.iter().position(|s| s.pc == pc) {
            Some(i) => i,
            None => {
                self.sources.push(SourceStat {
                    pc,
                    op,
                    offsets: 0,
                    events: 0,
                    true_events: 0,
                    false_events: 0,
                    threads: Vec::new(),
                });
                self.sources.len() - 1
            }
        };
        let s = &mut self.sources[i];
        if s.op != op {
            s.op = Op::Rmw; // one PC seen both reading and writing (decoded as RMW elsewhere)
        }
        s
    }

    fn participant(&mut self, tid: u32, pc: u64, op: Op, bytes: u128) {
        let s = self.source(pc, op);
        s.offsets |= bytes;
        if !s.threads.contains(&tid) {
            s.threads.push(tid);
        }
        match self.threads.iter_mut().find(|t| t.0 == tid) {
            Some(t) => t.1 |= bytes,
            None => self.threads.push((tid, bytes)),
        }
    }
}

fn bytes_of(a: &LastAccess) -> u128 {
    byte_mask(a.off as u32, a.len as u32)
}

/// What one access did to the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    None,
    TrueSharing,
    FalseSharing,
}

/// Default bound on lines remembered: 128 Ki lines, 32 bytes each = 4 MiB, small enough to
/// stay in the CPU's caches (the table lookup is the detector's one random memory access).
/// A line is forgotten only after 128 Ki other distinct lines were accessed since its last
/// access: at soft sampling rates (~10–20 k samples/s) that is seconds, so only transfers
/// rarer than one per several seconds can be missed, far below any reporting threshold.
pub const DEFAULT_MAX_LINES: usize = 1 << 17;
/// Default bound on contended lines kept with per-PC detail (≈ 0.5–1 KiB each with a few
/// threads and PCs: ≤ 16 MiB). Real programs have a handful of hot lines; the bound only
/// matters for adversarial streams where every line is shared.
pub const DEFAULT_MAX_CONTENDED: usize = 1 << 14;

pub struct LineModel {
    line_size: u32,
    lines: LineTable,
    contended: HashMap<u64, LineStat>,
    max_contended: usize,
    /// Events of contended lines pruned to bound memory (counted for shares and notes).
    pruned_events: u64,
    pruned_lines: u64,
    /// Threads that have exited ([`Self::thread_exited`]).
    gone: hashbrown::HashSet<u32>,
}

impl LineModel {
    /// `line_size` is 64 or 128 (adjacent-line pairs); other values are rounded to those.
    pub fn new(line_size: u32) -> Self {
        Self::with_limits(line_size, DEFAULT_MAX_LINES, DEFAULT_MAX_CONTENDED)
    }

    /// Bounded memory: at most `max_lines` remembered lines and `max_contended` contended
    /// lines with detail. When the contended table is full, the half with the fewest events is
    /// dropped (a line that becomes hot later re-enters and is counted from then on).
    pub fn with_limits(line_size: u32, max_lines: usize, max_contended: usize) -> Self {
        Self {
            line_size: if line_size > 64 { 128 } else { 64 },
            lines: LineTable::new(max_lines),
            contended: HashMap::new(),
            max_contended: max_contended.max(2),
            pruned_events: 0,
            pruned_lines: 0,
            gone: hashbrown::HashSet::new(),
        }
    }

    pub fn line_size(&self) -> u32 {
        self.line_size
    }

    pub fn line_of(&self, addr: u64) -> u64 {
        addr & !(self.line_size as u64 - 1)
    }

    /// Lines remembered now (the model's memory is proportional to this, up to its bound).
    pub fn lines_tracked(&self) -> usize {
        self.lines.len()
    }

    /// Lines forgotten because the table was full.
    pub fn evictions(&self) -> u64 {
        self.lines.evictions()
    }

    /// (lines, events) of contended lines dropped to bound memory.
    pub fn pruned(&self) -> (u64, u64) {
        (self.pruned_lines, self.pruned_events)
    }

    /// Whether `line` has had a contention event (and is still kept).
    pub fn is_contended(&self, line: u64) -> bool {
        self.contended.contains_key(&line)
    }

    /// Two threads' accesses to one watched word, one of them a store, on a line already
    /// contended: both become participants of the line, with no event. A watch window's hits
    /// are every access to its words, so a store made inside a critical section whose lock
    /// shares the line never directly precedes another thread's access (the same thread's
    /// unlock comes between) and [`Self::access`] never pairs it; the word's own history
    /// does. Returns whether the line was contended (and so took them).
    pub fn share_word(&mut self, prev: &Access, a: &Access) -> bool {
        let line = self.line_of(a.addr);
        if self.line_of(prev.addr) != line || prev.tid == a.tid {
            return false;
        }
        if !(prev.op.writes() || a.op.writes()) {
            return false;
        }
        let ls = u64::from(self.line_size);
        let bytes = |x: &Access| {
            let off = (x.addr - line) as u32;
            byte_mask(off, u32::from(x.size.max(1)).min(ls as u32 - off))
        };
        let Some(st) = self.contended.get_mut(&line) else {
            return false;
        };
        st.participant(prev.tid, prev.pc, prev.op, bytes(prev));
        st.participant(a.tid, a.pc, a.op, bytes(a));
        true
    }

    /// Contended lines, in no particular order.
    pub fn contended(&self) -> impl Iterator<Item = &LineStat> + '_ {
        self.contended.values()
    }

    /// Thread `tid` has exited: [`Self::access_live`] no longer pairs an access with that
    /// thread's.
    pub fn thread_exited(&mut self, tid: u32) {
        self.gone.insert(tid);
    }

    /// [`Self::access`] for an access of an exact stream (a watchpoint hit), which is not
    /// paired with the line's last access when that access's thread has since exited: the
    /// main thread reading the workers' results after joining them reads their bytes, but
    /// contends with no thread (a window open then named the asm-test harness's final read
    /// of the shared bytes, in ~1 run of 30).
    pub fn access_live(&mut self, a: &Access) -> Event {
        self.access_as(a, !self.gone.is_empty())
    }

    /// Feed one access; an access straddling lines is split. Returns the last event caused.
    pub fn access(&mut self, a: &Access) -> Event {
        self.access_as(a, false)
    }

    /// [`Self::access`], not pairing with exited threads' accesses when `live_only`.
    fn access_as(&mut self, a: &Access, live_only: bool) -> Event {
        let ls = self.line_size as u64;
        let mut addr = a.addr;
        let end = a.addr.saturating_add(a.size.max(1) as u64);
        let mut ev = Event::None;
        while addr < end {
            let line = addr & !(ls - 1);
            let off = (addr - line) as u32;
            let len = (end.min(line + ls) - addr) as u32;
            let e = self.one_line(a, line, off, len, live_only);
            if e != Event::None {
                ev = e;
            }
            addr = line + ls;
        }
        ev
    }

    #[inline]
    fn one_line(&mut self, a: &Access, line: u64, off: u32, len: u32, live_only: bool) -> Event {
        let new = LastAccess {
            pc: a.pc,
            tid: a.tid,
            stamp: 0,
            off: off as u8,
            len: len as u8,
            op: a.op,
            contended: false,
        };
        let Some(prev) = self.lines.swap(line, new) else {
            return Event::None;
        };
        if live_only && self.gone.contains(&prev.tid) {
            return Event::None;
        }
        if prev.tid == a.tid || !(prev.op.writes() || a.op.writes()) {
            if prev.contended {
                // No event, but what this thread touches now decides whether its later
                // disjoint events are neighbour accesses of an exchange (crate::model::recent).
                if let Some(st) = self.contended.get_mut(&line) {
                    st.recent.push(a.tid, bytes_of(&new), a.op.writes(), false);
                }
            }
            return Event::None;
        }
        if !prev.contended {
            self.lines.mark_contended(line);
        }
        let bytes = bytes_of(&new);
        let prev_bytes = bytes_of(&prev);
        let overlap = prev_bytes & bytes != 0;
        if self.contended.len() >= self.max_contended && !self.contended.contains_key(&line) {
            self.prune();
        }
        let st = self.contended.entry(line).or_insert_with(|| LineStat {
            line_addr: line,
            events: 0,
            true_events: 0,
            false_events: 0,
            exchange_events: 0,
            sources: Vec::new(),
            threads: Vec::new(),
            recent: RecentByThread::default(),
        });
        st.recent.push(prev.tid, prev_bytes, prev.op.writes(), true);
        st.recent.push(a.tid, bytes, a.op.writes(), false);
        let exchange = !overlap && st.recent.pair_shares(prev.tid, a.tid);
        let is_true = overlap || exchange;
        let w = a.weight;
        st.events += w;
        if is_true {
            st.true_events += w;
            if exchange {
                st.exchange_events += w;
            }
        } else {
            st.false_events += w;
        }
        st.participant(prev.tid, prev.pc, prev.op, prev_bytes);
        st.participant(a.tid, a.pc, a.op, bytes);
        let s = st.source(a.pc, a.op);
        s.events += w;
        if is_true {
            s.true_events += w;
            Event::TrueSharing
        } else {
            s.false_events += w;
            Event::FalseSharing
        }
    }

    /// Drop the contended lines with the fewest events (the lower half).
    fn prune(&mut self) {
        let mut ev: Vec<u64> = self.contended.values().map(|l| l.events).collect();
        let mid = ev.len() / 2;
        let (_, &mut cut, _) = ev.select_nth_unstable(mid);
        let mut budget = mid; // drop at most half, even when many lines tie at the cut
        let (mut lines, mut events) = (0, 0);
        self.contended.retain(|_, l| {
            if budget > 0 && l.events <= cut {
                budget -= 1;
                lines += 1;
                events += l.events;
                false
            } else {
                true
            }
        });
        self.pruned_lines += lines;
        self.pruned_events += events;
    }
}

/// Hits remembered per (word, thread) by a [`WordHistory`].
const MAX_HISTORY_WORDS: usize = 64;

/// The latest watch hit of each thread on each 8-byte word, the latest
/// [`MAX_HISTORY_WORDS`]: each new hit is held against the other threads' on its word
/// ([`LineModel::share_word`]). The detector keeps one for the hits of looks (words of a
/// contended line no sample showed): the accesses a look is there to name, such as a store
/// to a counter under a lock on the same line, are seen only in the word's own history. That
/// history spans a line's looks: a look fills its trap cap in microseconds, often with one
/// thread's accesses alone (the two threads of a locked queue ran side by side in a fifth of
/// a run here), and the other thread's turn at the word is in another look.
#[derive(Clone, Debug, Default)]
pub struct WordHistory {
    latest: Vec<Access>,
}

impl WordHistory {
    /// Drops thread `tid`'s hits: it has exited, and what it touched last is not contended
    /// by an access after it is gone (the main thread reading results after the join).
    pub fn forget(&mut self, tid: u32) {
        self.latest.retain(|a| a.tid != tid);
    }

    /// Holds hit `a` against the other threads' latest hits on its word, then keeps it as
    /// its thread's.
    pub fn note(&mut self, model: &mut LineModel, a: &Access) {
        let word = a.addr & !7;
        let mut own = None;
        for (i, p) in self.latest.iter().enumerate() {
            if p.addr & !7 != word {
                continue;
            }
            if p.tid == a.tid {
                own = Some(i);
            } else {
                model.share_word(p, a);
            }
        }
        match own {
            Some(i) => self.latest[i] = *a,
            None => {
                if self.latest.len() >= MAX_HISTORY_WORDS {
                    self.latest.remove(0);
                }
                self.latest.push(*a);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A timeline step: thread, op, byte range, pc.
    fn acc(tid: u32, op: Op, off: u64, len: u8, pc: u64) -> Access {
        Access {
            tid,
            time: 0,
            pc,
            addr: 0x1000 + off,
            size: len,
            op,
            weight: 1,
        }
    }

    fn run(steps: &[Access]) -> (LineModel, Vec<Event>) {
        let mut m = LineModel::new(64);
        let ev = steps.iter().map(|a| m.access(a)).collect();
        (m, ev)
    }

    use Event::{FalseSharing as F, None as N, TrueSharing as T};
    use Op::{Load as R, Store as W};

    #[test]
    fn writes_to_neighbouring_words_are_false_sharing() {
        // T1:  W[0..8)          W[0..8)
        // T2:         W[8..16)          → 2 false-sharing events
        let (m, ev) = run(&[
            acc(1, W, 0, 8, 0xa),
            acc(2, W, 8, 8, 0xb),
            acc(1, W, 0, 8, 0xa),
        ]);
        assert_eq!(ev, vec![N, F, F]);
        let l = &m.contended().next().unwrap();
        assert_eq!(
            (l.line_addr, l.events, l.false_events, l.true_events),
            (0x1000, 2, 2, 0)
        );
        let a = l.sources.iter().find(|s| s.pc == 0xa).unwrap();
        let b = l.sources.iter().find(|s| s.pc == 0xb).unwrap();
        assert_eq!((a.offsets, b.offsets), (0xff, 0xff00));
        assert_eq!((a.events, b.events), (1, 1));
        assert_eq!((a.threads.clone(), b.threads.clone()), (vec![1], vec![2]));
    }

    #[test]
    fn same_bytes_are_true_sharing() {
        // T1:  W[0..8)         R[0..8)
        // T2:         R[4..8)          → 2 true-sharing events (overlap)
        let (m, ev) = run(&[acc(1, W, 0, 8, 1), acc(2, R, 4, 4, 2), acc(1, R, 0, 8, 1)]);
        assert_eq!(ev, vec![N, T, N]);
        // The second read follows a read: no write on either side, no event.
        assert_eq!(m.contended().next().unwrap().true_events, 1);
    }

    #[test]
    fn reads_only_never_contend() {
        // T1:  R[0..8)         R[8..16)
        // T2:         R[0..8)          R[8..16)   → read-only sharing: nothing
        let (m, ev) = run(&[
            acc(1, R, 0, 8, 1),
            acc(2, R, 0, 8, 2),
            acc(1, R, 8, 8, 1),
            acc(2, R, 8, 8, 2),
        ]);
        assert_eq!(ev, vec![N, N, N, N]);
        assert!(m.contended().next().is_none());
    }

    #[test]
    fn one_thread_alone_never_contends() {
        // T1:  W[0..8) W[8..16) R[0..8) W[0..8)   → private line
        let (m, _) = run(&[
            acc(1, W, 0, 8, 1),
            acc(1, W, 8, 8, 1),
            acc(1, R, 0, 8, 1),
            acc(1, W, 0, 8, 1),
        ]);
        assert!(m.contended().next().is_none());
    }

    #[test]
    fn read_after_remote_write_is_an_event() {
        // T1:  W[0..4)
        // T2:         R[32..40)   → false sharing (reader of other bytes pays the transfer)
        let (_, ev) = run(&[acc(1, W, 0, 4, 1), acc(2, R, 32, 8, 2)]);
        assert_eq!(ev, vec![N, F]);
    }

    #[test]
    fn contended_lines_are_bounded() {
        // 1000 lines each ping-ponged once; room for 100: the least contended are pruned and
        // the hottest line (many events) survives.
        let mut m = LineModel::with_limits(64, 1 << 12, 100);
        for i in 0..1000u64 {
            let base = 0x10_0000 + i * 64;
            for _ in 0..(if i == 500 { 50 } else { 1 }) {
                m.access(&Access {
                    addr: base,
                    ..acc(1, W, 0, 8, 1)
                });
                m.access(&Access {
                    addr: base,
                    ..acc(2, W, 0, 8, 2)
                });
            }
        }
        assert!(m.contended().count() <= 100);
        assert!(m.contended().any(|l| l.line_addr == 0x10_0000 + 500 * 64));
        let (lines, events) = m.pruned();
        assert!(lines >= 900 && events >= lines, "{lines} {events}");
    }

    #[test]
    fn different_lines_do_not_interact() {
        // T1: W line 0x1000;  T2: W line 0x1040  → no event
        let (m, ev) = run(&[acc(1, W, 0, 8, 1), acc(2, W, 64, 8, 2)]);
        assert_eq!(ev, vec![N, N]);
        assert_eq!(m.lines_tracked(), 2);
    }

    #[test]
    fn line_128_groups_adjacent_pair() {
        // With --line 128, bytes 0 and 64 are one (prefetch-pair) line: false sharing.
        let mut m = LineModel::new(128);
        m.access(&acc(1, W, 0, 8, 1));
        assert_eq!(m.access(&acc(2, W, 64, 8, 2)), F);
        assert_eq!(
            m.contended().next().unwrap().sources[1].offsets,
            byte_mask(64, 8)
        );
    }

    #[test]
    fn straddling_access_touches_both_lines() {
        // T1 writes [60..68): bytes 60..64 of line 0x1000 and 0..4 of 0x1040.
        let mut m = LineModel::new(64);
        m.access(&acc(1, W, 60, 8, 1));
        assert_eq!(m.lines_tracked(), 2);
        assert_eq!(
            m.access(&acc(2, W, 64, 1, 2)),
            T,
            "byte 64 was written by T1"
        );
    }

    #[test]
    fn mixed_line_counts_both_kinds_and_weights() {
        let mut m = LineModel::new(64);
        let mut a = acc(1, W, 0, 8, 1);
        a.weight = 10;
        m.access(&a);
        let mut b = acc(2, W, 0, 8, 2);
        b.weight = 10;
        m.access(&b); // true, weight 10
                      // A third thread's private word: false (T1 and T2 exchange word 0, so a write of
                      // word 1 by T1 would be a neighbour access of that exchange, counted true).
        let mut c = acc(3, W, 8, 8, 3);
        c.weight = 5;
        m.access(&c); // false, weight 5
        let l = &m.contended().next().unwrap();
        assert_eq!((l.events, l.true_events, l.false_events), (15, 10, 5));
        assert_eq!(l.threads.len(), 3);
    }

    #[test]
    fn neighbour_accesses_of_a_shared_word_are_true_sharing() {
        // regs_rw_true: T0 publishes word 0 and also writes word 2; T1 reads word 0.
        // T0:  W[0..8) W[16..24)          W[0..8) W[16..24)          W[0..8) W[16..24)
        // T1:                    R[0..8)                    R[0..8)                    R[0..8)
        //                        F         T                T(x)     T                 T(x)
        // The first event has no history yet (the line was not contended before it): false.
        // Later, T1's R0 after T0's W16 touches disjoint bytes, but T0 wrote word 0 in its
        // window: a neighbour access of the exchange (x), which padding word 2 away would not
        // remove.
        let (m, ev) = run(&[
            acc(0, W, 0, 8, 1),
            acc(0, W, 16, 8, 2),
            acc(1, R, 0, 8, 3),
            acc(0, W, 0, 8, 1),
            acc(0, W, 16, 8, 2),
            acc(1, R, 0, 8, 3),
            acc(0, W, 0, 8, 1),
            acc(0, W, 16, 8, 2),
            acc(1, R, 0, 8, 3),
        ]);
        assert_eq!(ev, vec![N, N, F, T, N, T, T, N, T]);
        let l = m.contended().next().unwrap();
        assert_eq!(
            (l.true_events, l.false_events, l.exchange_events),
            (4, 1, 2)
        );
    }

    #[test]
    fn private_words_stay_false_sharing_over_time() {
        // T0 writes words 0 and 2, T1 reads and writes word 1: never the same bytes.
        let mut steps = Vec::new();
        for _ in 0..10 {
            steps.push(acc(0, W, 0, 8, 1));
            steps.push(acc(1, R, 8, 8, 2));
            steps.push(acc(0, W, 16, 8, 3));
            steps.push(acc(1, W, 8, 8, 4));
        }
        let (m, _) = run(&steps);
        let l = m.contended().next().unwrap();
        assert_eq!((l.true_events, l.exchange_events), (0, 0));
        assert!(l.false_events >= 30, "{}", l.false_events);
    }

    #[test]
    fn a_genuinely_split_line_keeps_both_kinds() {
        // T0/T1 hand word 0 back and forth; T2 writes its private word 4 between them.
        // T2's events stay false sharing (padding word 4 removes them), T0/T1's are true.
        let mut steps = Vec::new();
        for _ in 0..10 {
            steps.push(acc(0, W, 0, 8, 1));
            steps.push(acc(1, W, 0, 8, 2));
            steps.push(acc(2, W, 32, 8, 3));
        }
        let (m, _) = run(&steps);
        let l = m.contended().next().unwrap();
        let t2 = l.sources.iter().find(|s| s.pc == 3).unwrap();
        assert_eq!(t2.true_events, 0);
        assert!(t2.false_events >= 9);
        assert!(l.true_events >= 9 && l.false_events >= 9, "{l:?}");
    }

    #[test]
    fn byte_masks() {
        assert_eq!(byte_mask(0, 8), 0xff);
        assert_eq!(byte_mask(8, 8), 0xff00);
        assert_eq!(byte_mask(0, 128), u128::MAX);
        assert_eq!(byte_mask(120, 8), 0xffu128 << 120);
        assert_eq!(byte_mask(0, 64), u64::MAX as u128);
        assert_eq!(byte_mask(60, 8), 0xffu128 << 60);
        assert_eq!(byte_mask(64, 64), (u64::MAX as u128) << 64);
        assert_eq!(byte_mask(3, 0), 0);
    }

    /// A locked queue's look (its tail word at offset 48 with the lock word at 0): the
    /// store to the tail inside the critical section is followed by the same thread's
    /// unlock, never by the other thread, so the line's last-access pairing leaves it out;
    /// the word's history names it, across looks, with the other thread's load.
    #[test]
    fn a_words_history_names_a_store_its_own_unlock_hides() {
        let mut m = LineModel::new(64);
        // Contended first (a timer sample's pair), as looks' lines are.
        m.access(&acc(1, Op::Rmw, 0, 4, 0x10));
        m.access(&acc(2, Op::Rmw, 0, 4, 0x10));
        let mut h = WordHistory::default();
        let look = |m: &mut LineModel, h: &mut WordHistory, a: Access| {
            let a = Access { weight: 0, ..a };
            h.note(m, &a);
            m.access(&a);
        };
        // One look: thread 1 alone (lock, read tail, store tail, unlock).
        look(&mut m, &mut h, acc(1, Op::Rmw, 0, 4, 0x10));
        look(&mut m, &mut h, acc(1, R, 48, 8, 0x38));
        look(&mut m, &mut h, acc(1, W, 48, 8, 0x39));
        look(&mut m, &mut h, acc(1, W, 0, 4, 0x40));
        let named = |m: &LineModel, pc| {
            m.contended()
                .next()
                .unwrap()
                .sources
                .iter()
                .any(|s| s.pc == pc)
        };
        assert!(!named(&m, 0x39));
        // A later look: thread 2 takes the lock and reads the tail.
        look(&mut m, &mut h, acc(2, Op::Rmw, 0, 4, 0x10));
        look(&mut m, &mut h, acc(2, R, 48, 8, 0x47));
        assert!(named(&m, 0x39) && named(&m, 0x47));
        // Thread 2 exits; thread 3 (main, after the join) reads the tail: not named.
        h.forget(2);
        h.forget(1);
        look(&mut m, &mut h, acc(3, R, 48, 8, 0x60));
        let l = m.contended().next().unwrap();
        assert!(l.sources.iter().all(|s| s.pc != 0x60));
        assert_eq!(l.sources.iter().find(|s| s.pc == 0x39).unwrap().events, 0);
        // Loads alone share nothing, and a line not contended takes no participants.
        let mut quiet = LineModel::new(64);
        let mut h = WordHistory::default();
        h.note(&mut quiet, &acc(1, W, 0x100, 8, 0x50));
        h.note(&mut quiet, &acc(2, R, 0x100, 8, 0x51));
        assert_eq!(quiet.contended().count(), 0);
        assert!(!quiet.share_word(&acc(1, R, 8, 8, 1), &acc(2, R, 8, 8, 2)));
    }

    /// A watch hit after a thread's exit does not pair with that thread's last access (the
    /// main thread's read of the results after the join); a timer sample still does, and a
    /// live thread's access still pairs.
    #[test]
    fn a_watch_hit_after_a_threads_exit_is_not_paired_with_it() {
        let mut m = LineModel::new(64);
        assert_eq!(m.access_live(&acc(1, W, 0, 8, 1)), N);
        assert_eq!(m.access_live(&acc(2, W, 8, 8, 2)), F, "both alive");
        m.thread_exited(2);
        assert_eq!(
            m.access_live(&acc(3, R, 8, 8, 3)),
            N,
            "after thread 2's exit"
        );
        assert_eq!(m.access_live(&acc(1, W, 0, 8, 1)), F, "thread 3 lives");
        m.thread_exited(1);
        assert_eq!(m.access(&acc(3, R, 0, 8, 3)), T, "a sample pairs as before");
    }
}
