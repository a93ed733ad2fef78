//! How much of the run the target's threads actually ran at the same time, from the timer
//! samples the run already has: contention needs two threads running at once on different
//! CPUs, so a run in which they mostly took turns (a busy 2-vCPU runner, a host that
//! serializes the vCPUs) shows little or none of the contention that is there, and a report
//! with no finding is then no evidence that there is none.
//!
//! A `cpu-clock` timer sample of thread T on CPU c says T was running there during the
//! sampling period before it. Time is cut into slots one period wide (the longest among the
//! first samples: whole-CPU samplers run each CPU at its own rate); a slot is *concurrent*
//! when it holds samples of two or more threads on two or more CPUs. A thread is *alive* from
//! its first sample to its last. The overlap is the share of the slots in which two or more
//! threads were alive that were concurrent:
//!
//! ```text
//!   slots (2 ms)   |  0  |  1  |  2  |  3  |  4  |  5  |  6  |
//!   T1 on cpu 0    |  x  |  x  |  x  |     |     |  x  |  x  |
//!   T2 on cpu 1    |     |  x  |     |  x  |  x  |  x  |     |
//!   two alive            ├──────────────────────────┤          slots 1..=5: 5
//!   concurrent           ✓                       ✓            2 → overlap 2/5 = 40%
//! ```
//!
//! Two threads running side by side give about one sample each per slot, so an overlap near
//! 1 (0.7–0.95 measured here: sample phases jitter); threads that take turns give 0 whatever
//! CPUs they run on. A sleeping thread gives no samples, so it is alive only between its
//! first and last sample; threads that never were alive together (or a single thread) give
//! no overlap at all: there was nothing to contend with.

use hashbrown::HashMap;
use serde::{Deserialize, Serialize};

/// Below this overlap a run with no finding says it could not observe (see the module doc):
/// the threads ran together less than half the time they could have.
pub const LOW_OVERLAP: f64 = 0.5;

/// Less time than this with two threads running at once and a run with no finding says it
/// could not observe, whatever the overlap: laser's first look at a line takes that long (a
/// line must be sampled by its threads before a watch window can open on it). Measured
/// (benchmarks/RESULTS.md, "Runs too short to observe"): kmeans_flag's shared flag was found in
/// 0 of 8 runs with 0.02–0.03 s of concurrent time and 8 of 8 with 0.09 s or more; the "less
/// sharing" twins of spinlock_tas and ticket_counter (0.03–0.09 s runs) flipped between runs.
pub const MIN_CONCURRENT_S: f64 = 0.2;

/// Fewer slots with two threads alive than this and the program counts as single-threaded
/// for the overlap (it had no time to contend in).
const MIN_MULTI_SLOTS: u64 = 10;

/// Slots this far behind the newest sample are settled (samples from the per-CPU rings
/// arrive out of order by at most a read interval).
const SETTLE_SLOTS: u64 = 1024;

/// What the report says about concurrency (JSON `concurrency`, laser-detect/REPORT.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Concurrency {
    /// Threads that had timer samples.
    pub threads: u32,
    /// Slot width: the timer's sampling period (the longest, where CPUs sample at different
    /// rates).
    pub slot_ms: f64,
    /// Time in which two or more threads were alive (slots × width).
    pub alive_s: f64,
    /// Of it, time in which two or more ran at once on different CPUs.
    pub concurrent_s: f64,
    /// `concurrent_s / alive_s`; `None` when fewer than 10 slots had two threads alive (a
    /// single-threaded run: no overlap to speak of).
    pub overlap: Option<f64>,
}

impl Concurrency {
    /// The overlap was too low, or the threads ran together too briefly, for a run without
    /// findings to mean there is no contention.
    pub fn low(&self) -> bool {
        self.overlap.is_some_and(|o| o < LOW_OVERLAP) || self.short()
    }

    /// Two threads were alive together, but ran at once for less than [`MIN_CONCURRENT_S`].
    pub fn short(&self) -> bool {
        self.overlap.is_some() && self.concurrent_s < MIN_CONCURRENT_S
    }

    /// One sentence for the report and the gate's verdict line.
    pub fn describe(&self) -> String {
        if self.overlap.is_some_and(|o| o >= LOW_OVERLAP) {
            return format!(
                "the program's threads ran at the same time on different CPUs for only {:.2} s \
                 ({:.0}% of the {:.2} s in which two or more of its {} threads were alive), \
                 less than the {:.1} s laser needs to look at a contended line",
                self.concurrent_s,
                100.0 * self.overlap.unwrap_or(1.0),
                self.alive_s,
                self.threads,
                MIN_CONCURRENT_S
            );
        }
        format!(
            "the program's threads ran at the same time on different CPUs in {:.0}% of the \
             {:.2} s in which two or more of its {} threads were alive ({:.0}% or more when \
             they run side by side), so contention between them had little time to happen",
            100.0 * self.overlap.unwrap_or(1.0),
            self.alive_s,
            self.threads,
            100.0 * LOW_OVERLAP
        )
    }
}

/// The slot's first sample and whether another thread on another CPU joined it.
#[derive(Clone, Copy)]
struct Slot {
    /// Slot number (time / period); `u64::MAX`: empty.
    k: u64,
    tid: u32,
    cpu: u32,
    concurrent: bool,
}

const EMPTY: Slot = Slot {
    k: u64::MAX,
    tid: 0,
    cpu: 0,
    concurrent: false,
};

/// Open slots: a direct-mapped ring twice the settle distance, so a slot is only ever
/// replaced by one at least [`RING`] newer, which is settled by then (this runs on every timer
/// sample; two hash-map operations per sample were a sixth of the detector's replay time).
const RING: usize = 2 * SETTLE_SLOTS as usize;

/// Samples held before the slot width is fixed: the width is the longest period among them.
/// Whole-CPU samplers run each CPU at its own rate (up to 10% under the requested one, so
/// their timers never line up), and slots one *short* period wide would miss a sample of the
/// slower CPUs every ~16 slots: two threads running side by side throughout read ~0.90
/// instead of ~0.94. (Per-thread timers all share one period: no change there.)
const PENDING: usize = 64;

/// Accumulates timer samples into the overlap (memory: per thread 16 bytes, plus the slots of
/// the last ~4 s at the default rate).
#[derive(Clone)]
pub struct ConcurrencyTracker {
    period_ns: u64,
    /// The first samples (tid, cpu, time, period), until the width is fixed.
    pending: Vec<(u32, u32, u64, u64)>,
    ring: Vec<Slot>,
    newest: u64,
    settled_concurrent: u64,
    /// Per thread, its first and last sample time; `span_of` indexes it.
    spans: Vec<(u32, u64, u64)>,
    span_of: HashMap<u32, usize>,
    /// Direct-mapped by thread id: (thread, its index in `spans`), so a sample finds its
    /// span with one compare however the threads interleave (`u32::MAX`: empty).
    recent: [(u32, u32); RECENT_THREADS],
}

/// Entries of [`ConcurrencyTracker::recent`] (a power of two).
const RECENT_THREADS: usize = 64;

impl Default for ConcurrencyTracker {
    fn default() -> Self {
        ConcurrencyTracker {
            period_ns: 0,
            pending: Vec::new(),
            ring: vec![EMPTY; RING],
            newest: 0,
            settled_concurrent: 0,
            spans: Vec::new(),
            span_of: HashMap::new(),
            recent: [(u32::MAX, 0); RECENT_THREADS],
        }
    }
}

impl ConcurrencyTracker {
    /// One timer sample: thread `tid` was running on `cpu` for the `period_ns` before `time`.
    pub fn sample(&mut self, tid: u32, cpu: u32, time: u64, period_ns: u64) {
        if self.period_ns == 0 {
            self.pending.push((tid, cpu, time, period_ns));
            if self.pending.len() >= PENDING {
                self.settle();
            }
            return;
        }
        self.place(tid, cpu, time);
    }

    /// Fixes the slot width from the held samples ([`PENDING`]; a 10 µs floor guards against
    /// a weight that is not a period) and places them.
    fn settle(&mut self) {
        let held = std::mem::take(&mut self.pending);
        let Some(longest) = held.iter().map(|p| p.3).max() else {
            return;
        };
        self.period_ns = longest.max(10_000);
        for (tid, cpu, time, _) in held {
            self.place(tid, cpu, time);
        }
    }

    fn place(&mut self, tid: u32, cpu: u32, time: u64) {
        self.note_span(tid, time);
        let k = time / self.period_ns;
        if k + SETTLE_SLOTS < self.newest {
            return; // far too late to place; rare, and only ever undercounts overlap
        }
        self.newest = self.newest.max(k);
        let slot = &mut self.ring[(k % RING as u64) as usize];
        if slot.k != k {
            // Only an older slot can sit here (a newer one would be at least RING ahead of
            // `k`, which was refused above): it is settled.
            if slot.k != u64::MAX && slot.concurrent {
                self.settled_concurrent += 1;
            }
            *slot = Slot {
                k,
                tid,
                cpu,
                concurrent: false,
            };
        } else if slot.tid != tid && slot.cpu != cpu {
            slot.concurrent = true;
        }
    }

    fn note_span(&mut self, tid: u32, time: u64) {
        let r = self.recent[tid as usize % RECENT_THREADS];
        let i = if r.0 == tid {
            r.1 as usize
        } else {
            self.span_index(tid, time)
        };
        let s = &mut self.spans[i];
        s.1 = s.1.min(time);
        s.2 = s.2.max(time);
    }

    /// The index of `tid`'s span, made on its first sample, and cached in `recent`.
    #[cold]
    fn span_index(&mut self, tid: u32, time: u64) -> usize {
        let n = self.spans.len();
        let i = *self.span_of.entry(tid).or_insert(n);
        if i == n {
            self.spans.push((tid, time, time));
        }
        self.recent[tid as usize % RECENT_THREADS] = (tid, i as u32);
        i
    }

    /// The overlap so far; `None` when no timer sample came.
    pub fn summary(&self) -> Option<Concurrency> {
        if self.period_ns == 0 {
            if self.pending.is_empty() {
                return None;
            }
            // Fewer samples than it takes to fix the width: fix it on a copy.
            let mut settled = self.clone();
            settled.settle();
            return settled.summary();
        }
        let open = self.ring.iter().filter(|s| s.k != u64::MAX && s.concurrent);
        let concurrent = self.settled_concurrent + open.count() as u64;
        let multi = self.multi_slots();
        let slot_s = self.period_ns as f64 * 1e-9;
        Some(Concurrency {
            threads: self.spans.len() as u32,
            slot_ms: slot_s * 1e3,
            alive_s: multi as f64 * slot_s,
            concurrent_s: concurrent as f64 * slot_s,
            overlap: (multi >= MIN_MULTI_SLOTS)
                .then(|| (concurrent as f64 / multi as f64).min(1.0)),
        })
    }

    /// Slots in which two or more threads' spans overlap (a sweep over span ends).
    fn multi_slots(&self) -> u64 {
        let p = self.period_ns;
        let mut edges: Vec<(u64, i32)> = Vec::with_capacity(2 * self.spans.len());
        for &(_, a, b) in &self.spans {
            edges.push((a / p, 1));
            edges.push((b / p + 1, -1));
        }
        // Ends are exclusive (the slot after the last sample): a thread that starts in the
        // slot after another's last sample was never alive with it.
        edges.sort_unstable_by_key(|&(k, d)| (k, -d));
        let (mut alive, mut since, mut total) = (0i32, 0u64, 0u64);
        for (k, d) in edges {
            if alive >= 2 {
                total += k - since;
            }
            alive += d;
            since = k;
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 2_000_000; // 2 ms: 500 Hz

    /// Samples of `tid` on `cpu` every period from slot `from` to `to` (exclusive), at a
    /// phase `phase` ns into each slot.
    fn run(t: &mut ConcurrencyTracker, tid: u32, cpu: u32, from: u64, to: u64, phase: u64) {
        for k in from..to {
            t.sample(tid, cpu, k * P + phase, P);
        }
    }

    /// T1 on cpu 0 and T2 on cpu 1, both sampled in each of the first `slots` slots.
    fn side_by_side(slots: u64) -> ConcurrencyTracker {
        let mut t = ConcurrencyTracker::default();
        run(&mut t, 1, 0, 0, slots, 100_000);
        run(&mut t, 2, 1, 0, slots, 1_300_000);
        t
    }

    #[test]
    fn two_threads_side_by_side_overlap_fully() {
        // T1 ████████  cpu 0
        // T2 ████████  cpu 1
        let t = side_by_side(500);
        let c = t.summary().unwrap();
        assert_eq!(c.threads, 2);
        assert_eq!(c.overlap, Some(1.0));
        assert!((c.alive_s - 1.0).abs() < 1e-9, "{c:?}");
        assert!(!c.low());
    }

    #[test]
    fn threads_taking_turns_do_not_overlap_whatever_cpu() {
        // T1 ██  ██  ██   (cpu 0)
        // T2   ██  ██  ██ (cpu 1): alive together throughout, never running together
        let mut t = ConcurrencyTracker::default();
        for turn in 0..50 {
            let (tid, cpu) = if turn % 2 == 0 { (1, 0) } else { (2, 1) };
            run(&mut t, tid, cpu, turn * 5, turn * 5 + 5, 500_000);
        }
        let c = t.summary().unwrap();
        assert_eq!(c.overlap, Some(0.0));
        assert!(c.low());
        assert!(c.describe().contains("in 0% of the"), "{}", c.describe());
    }

    #[test]
    fn cpus_sampled_at_different_rates_side_by_side_overlap_fully() {
        // Whole-CPU samplers: cpu 0 every 2 ms, cpu 1 every 2.12 ms (its own rate). Slots
        // one 2 ms period wide would hold no cpu-1 sample in ~6% of them.
        let mut t = ConcurrencyTracker::default();
        let q = 2_123_142;
        for i in 0..1000u64 {
            t.sample(1, 0, i * P + 50_000, P);
            if i < 940 {
                t.sample(2, 1, i * q + 700_000, q);
            }
        }
        let c = t.summary().unwrap();
        assert!((c.slot_ms - 2.123142).abs() < 1e-6, "{c:?}");
        assert!(c.overlap.unwrap() > 0.99, "{c:?}");
    }

    #[test]
    fn a_few_samples_still_give_a_summary() {
        let mut t = ConcurrencyTracker::default();
        run(&mut t, 1, 0, 0, 12, 100_000);
        run(&mut t, 2, 1, 0, 12, 900_000);
        let c = t.summary().unwrap();
        assert_eq!(c.overlap, Some(1.0), "{c:?}");
        assert_eq!(c.threads, 2);
    }

    #[test]
    fn two_threads_on_one_cpu_are_not_concurrent() {
        let mut t = ConcurrencyTracker::default();
        run(&mut t, 1, 0, 0, 100, 100_000);
        run(&mut t, 2, 0, 0, 100, 1_100_000);
        assert_eq!(t.summary().unwrap().overlap, Some(0.0));
    }

    #[test]
    fn serial_phases_do_not_count_against_the_overlap() {
        // main ████                    ██   alone: not in the denominator
        // T1       ████████████████         cpu 0
        // T2       ████████████████         cpu 1
        // main sleeps in join (no samples) between: its span covers everything, so the
        // workers' slots have 2+ alive and both run: overlap 1.
        let mut t = ConcurrencyTracker::default();
        run(&mut t, 10, 0, 0, 200, 0);
        run(&mut t, 1, 0, 200, 700, 100_000);
        run(&mut t, 2, 1, 200, 700, 900_000);
        run(&mut t, 10, 1, 700, 750, 0);
        let c = t.summary().unwrap();
        assert_eq!(c.overlap, Some(1.0), "{c:?}");
        assert!((c.alive_s - 1.0).abs() < 0.01, "{c:?}");
    }

    #[test]
    fn half_the_time_together_is_half() {
        let mut t = ConcurrencyTracker::default();
        run(&mut t, 1, 0, 0, 400, 100_000);
        // T2 alive over the same span, running together for the first half only.
        run(&mut t, 2, 1, 0, 200, 700_000);
        t.sample(2, 1, 399 * P + 700_000, P);
        let o = t.summary().unwrap().overlap.unwrap();
        assert!((o - 0.5).abs() < 0.01, "{o}");
    }

    #[test]
    fn threads_side_by_side_too_briefly_are_flagged_short() {
        // 50 slots of 2 ms together: 0.1 s, overlap 1, under MIN_CONCURRENT_S.
        let mut t = side_by_side(50);
        let c = t.summary().unwrap();
        assert_eq!(c.overlap, Some(1.0));
        assert!(c.short() && c.low(), "{c:?}");
        assert!(c.describe().contains("for only 0.10 s"), "{}", c.describe());
        // 0.2 s and more is long enough.
        run(&mut t, 1, 0, 50, 100, 100_000);
        run(&mut t, 2, 1, 50, 100, 1_300_000);
        let c = t.summary().unwrap();
        assert!(!c.short() && !c.low(), "{c:?}");
    }

    #[test]
    fn one_thread_or_threads_never_alive_together_give_no_overlap() {
        let mut t = ConcurrencyTracker::default();
        run(&mut t, 1, 0, 0, 300, 0);
        assert_eq!(t.summary().unwrap().overlap, None);
        run(&mut t, 2, 1, 300, 600, 0); // starts after T1's last sample
        let c = t.summary().unwrap();
        assert_eq!(c.threads, 2);
        assert_eq!(c.overlap, None, "{c:?}");
        assert!(!c.low());
        assert!(ConcurrencyTracker::default().summary().is_none());
    }

    #[test]
    fn long_runs_settle_old_slots_without_losing_them() {
        // 20 s side by side at 500 Hz: far more slots than are kept open.
        let mut t = ConcurrencyTracker::default();
        for k in 0..10_000u64 {
            // The two CPUs' rings are read in turns: T2's samples arrive a little late.
            t.sample(1, 0, k * P + 10, P);
            if k >= 5 {
                t.sample(2, 1, (k - 5) * P + 1_000_000, P);
            }
        }
        run(&mut t, 2, 1, 9_995, 10_000, 1_000_000);
        assert_eq!(t.ring.len(), RING);
        assert_eq!(t.summary().unwrap().overlap, Some(1.0));
    }
}
