//! What a trial may cost the program it measures.
//!
//! A trial is not free: every plan it puts in or takes out holds the whole process (seize,
//! inject an mmap, write the cache, move threads: 5–17 ms each here with an ordinary
//! tracer, 0.5–2 ms with a real-time one, see `tracee::threads`), and a repaired or
//! pinned window that loses runs the loop slower while it lasts. On Phoenix
//! linear_regression -O0 (1.3 s) a `run --repair` that ended by repairing nothing ran 16%
//! longer than native: the store buffer's two rounds and the placement trial's rounds
//! measured close to 1.0x, so almost all of that was holds and windows.
//!
//! The budget bounds it: the trial may cost at most `fraction` of the time the process has
//! run when the trial starts. The process runs at least that long in all, so the trial's
//! share of the whole run is at most `fraction`.
//!
//! ```text
//!  age of the process (T)          allowed = fraction × T
//!  ├──────────────────────────────┤
//!  trial:  hold  window  hold hold  window(loses)  hold …
//!  charged: pause  0      pause      (1 − rate/native) × elapsed, ended when it would overrun
//! ```
//!
//! A trial starts only when the budget covers its first round's holds and the placement
//! trial's (estimated from the mean of the holds measured so far, never below a prior
//! that depends on whether the tracer can run real-time for its holds) plus a
//! little loss for each; a second round, and the placement trial, run only when what is
//! left then covers theirs; each window that loses ends as
//! soon as its loss would leave no room for the undo. A trial the budget ended before its
//! last round keeps nothing (`Verdict::OutOfBudget`). `run --repair` defers the repair to a later check until the process is old enough
//! (`needed_age`).

use std::time::Duration;

use laser_repair::tracee::{threads::realtime_holds, PauseStats};

use super::trial::Window;

/// `--trial-budget` default, percent of the process's age when the trial starts. Under the
/// 2% goal with room for what the budget does not see (laser's planning on the target's
/// CPUs, the count-only copy's own cost over the untouched loop).
pub const DEFAULT_BUDGET_PERCENT: f64 = 1.5;

/// What a hold is expected to cost before one was measured in this pass.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HoldPriors {
    pub apply: Duration,
    pub undo: Duration,
}

/// A tracer that competes with the workers as an ordinary task: an apply (seize, mmap,
/// write ~30 KB, move) took 6.8–11 ms on the 2-vCPU VM, up to 17 ms, an undo after the kill
/// switch 0.7–5.5 ms, up to 11 ms in two holds (most of it waiting to be scheduled).
pub const ORDINARY_HOLDS: HoldPriors = HoldPriors {
    apply: Duration::from_millis(8),
    undo: Duration::from_millis(4),
};

/// A tracer at SCHED_FIFO for the hold (`tracee::threads::realtime_holds`): on lreg -O0 and
/// linear_regression (2 vCPUs, load 2-3) applies took 0.6–1.9 ms (median 0.7–0.9, one of
/// 52 took 56 ms: a worker runnable on the other, busy CPU), undos 0.5–0.9 ms (median
/// 0.6–0.7), all but one undo in one hold (benchmarks/RESULTS.md, "Cheaper holds").
pub const REALTIME_HOLDS: HoldPriors = HoldPriors {
    apply: Duration::from_micros(1500),
    undo: Duration::from_millis(1),
};

/// Loss a trial must be able to afford besides its holds: two polls of a losing window.
pub const MIN_LOSS: Duration = Duration::from_millis(4);

#[derive(Clone, Debug, PartialEq)]
pub struct Budget {
    /// Share of the age allowed (0.015); `None`: no limit.
    fraction: Option<f64>,
    /// The process's age when the budget was set.
    pub age: Duration,
    spent: Duration,
    /// Of `spent`: windows' losses (the rest is holds, see [`Budget::pauses`]).
    pub losses: Duration,
    priors: HoldPriors,
    /// Holds measured so far that put a plan in, and that took one out: (count, total).
    applies: (u32, Duration),
    undos: (u32, Duration),
    /// Every hold charged, by phase.
    pub holds: PauseStats,
}

impl Budget {
    /// `fraction` (0.015) of `age`; `None` for no limit; holds estimated at
    /// [`ORDINARY_HOLDS`] until measured (the tests' budget).
    #[cfg(test)]
    pub fn new(age: Duration, fraction: Option<f64>) -> Budget {
        Budget::with_priors(age, fraction, ORDINARY_HOLDS)
    }

    /// [`Budget::new`] with holds estimated at `priors` until measured.
    pub fn with_priors(age: Duration, fraction: Option<f64>, priors: HoldPriors) -> Budget {
        Budget {
            fraction,
            age,
            spent: Duration::ZERO,
            losses: Duration::ZERO,
            priors,
            applies: (0, Duration::ZERO),
            undos: (0, Duration::ZERO),
            holds: PauseStats::default(),
        }
    }

    /// For process `pid` now (its age from /proc; 0 if unreadable: nothing allowed), with
    /// the priors of the holds this thread can make.
    pub fn for_pid(pid: i32, fraction: Option<f64>) -> Budget {
        static RT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let priors = if *RT.get_or_init(realtime_holds) {
            REALTIME_HOLDS
        } else {
            ORDINARY_HOLDS
        };
        Budget::with_priors(process_age(pid).unwrap_or_default(), fraction, priors)
    }

    pub fn allowed(&self) -> Option<Duration> {
        self.fraction.map(|f| self.age.mul_f64(f))
    }

    /// Charges what earlier trials of the same run spent (`Settings::spent_before`).
    pub fn charge_earlier(&mut self, d: Duration) {
        self.spent += d;
    }

    /// What was charged so far.
    pub fn spent(&self) -> Duration {
        self.spent
    }

    /// What is left (`Duration::MAX` without a limit).
    pub fn left(&self) -> Duration {
        self.allowed()
            .map_or(Duration::MAX, |a| a.saturating_sub(self.spent))
    }

    /// Estimated cost of `applies` holds that put a plan in and `undos` that take one out,
    /// plus `extra`.
    pub fn estimate(&self, applies: u32, undos: u32, extra: Duration) -> Duration {
        let est = |(n, total): (u32, Duration), prior: Duration| {
            if n == 0 {
                prior
            } else {
                prior.max(total / n)
            }
        };
        est(self.applies, self.priors.apply) * applies
            + est(self.undos, self.priors.undo) * undos
            + extra
    }

    /// Of what was spent, the holds.
    pub fn pauses(&self) -> Duration {
        self.applies.1 + self.undos.1
    }

    /// Whether what is left covers that estimate.
    pub fn affords(&self, applies: u32, undos: u32, extra: Duration) -> bool {
        self.left() >= self.estimate(applies, undos, extra)
    }

    /// The age at which a fresh budget would cover that estimate (when `run --repair`
    /// should try again); `None` without a limit or with a zero fraction.
    pub fn needed_age(&self, applies: u32, undos: u32, extra: Duration) -> Option<Duration> {
        let f = self.fraction.filter(|f| *f > 0.0)?;
        Some(self.estimate(applies, undos, extra).div_f64(f))
    }

    /// Whether a trial may start: its first round's holds (the count-only plan in and out,
    /// the repair in and out) and a losing window fit, and so do the placement trial's (the
    /// count-only plan in and out, a losing pinned window), which follows when the store
    /// buffer loses. Started with only the first round's worth, the placement trial found
    /// nothing left in 2 of 3 runs of linear_regression, where it was the repair that paid
    /// (1.8-2.4x). A second round is checked when it comes, against what is left then.
    pub fn affords_first_round(&self) -> bool {
        self.affords(3, 3, 2 * MIN_LOSS)
    }

    /// The process age from which [`Budget::affords_first_round`] holds.
    pub fn first_round_age(&self) -> Option<Duration> {
        self.needed_age(3, 3, 2 * MIN_LOSS)
    }

    /// What [`Budget::affords_first_round`] needs.
    pub fn first_round_need(&self) -> Duration {
        self.estimate(3, 3, 2 * MIN_LOSS)
    }

    /// Whether the placement trial fits what is left: the count-only plan in and out and a
    /// losing pinned window (`placement.rs`).
    pub fn affords_placement_trial(&self) -> bool {
        self.affords(1, 1, MIN_LOSS)
    }

    /// The process age from which a fresh budget affords the placement trial.
    pub fn placement_trial_age(&self) -> Option<Duration> {
        self.needed_age(1, 1, MIN_LOSS)
    }

    /// Why the placement trial is not tried: what it needs against what is left.
    pub fn placement_trial_short(&self) -> String {
        format!(
            "its holds (~{:.0} ms) and a losing window do not fit what is left of the budget \
             ({:.1} ms)",
            self.estimate(1, 1, Duration::ZERO).as_secs_f64() * 1e3,
            self.left().as_secs_f64() * 1e3
        )
    }

    /// A hold (or an undo's holds) happened: charge it, keep its phases for the summary,
    /// and let it inform the next estimates.
    pub fn charge_hold(&mut self, p: &PauseStats, apply: bool) {
        self.holds.merge(p);
        self.charge_pause(p.paused, apply);
    }

    /// A hold happened: charge it and let it inform the next estimates (the mean of the
    /// holds of its kind, never below the prior). Was the largest hold measured: one 25 ms
    /// seize among 1 ms holds then refused every later round.
    pub fn charge_pause(&mut self, d: Duration, apply: bool) {
        self.spent += d;
        let kind = if apply {
            &mut self.applies
        } else {
            &mut self.undos
        };
        kind.0 += 1;
        kind.1 += d;
    }

    /// A window ran at `w`'s rate where the loop ran at `native`'s: charge what it lost.
    pub fn charge_loss(&mut self, native: &Window, w: &Window) {
        let l = loss(native, w);
        self.spent += l;
        self.losses += l;
    }

    /// Whether a window losing `so_far` against `native` must end now to leave room for
    /// `reserve`: the holds that take the plan out, and whatever must still run after it
    /// (the placement trial after a store buffer that loses: with 1 ms holds, a losing
    /// repaired window was what used up the budget before the placement trial could run).
    pub fn must_stop(&self, native: &Window, so_far: &Window, reserve: Duration) -> bool {
        loss(native, so_far) >= self.left().saturating_sub(reserve)
    }

    /// `cost to the target 23.4 ms (holds 21.0, losing windows 2.4) of 45.0 ms allowed
    /// (1.5% of the process's 3.00 s)`.
    pub fn describe(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let allowed = match (self.allowed(), self.fraction) {
            (Some(a), Some(f)) => format!(
                "of {:.1} ms allowed ({:.1}% of the process's {:.2} s)",
                ms(a),
                f * 100.0,
                self.age.as_secs_f64()
            ),
            _ => "(no budget: --trial-budget 0)".to_string(),
        };
        let phases = if self.holds.holds == 0 {
            String::new()
        } else {
            format!(
                "; {} holds: {}, longest {:.2} ms, longest seize {:.2} ms",
                self.holds.holds,
                self.holds.phases_line(),
                ms(self.holds.longest),
                ms(self.holds.longest_seize)
            )
        };
        format!(
            "cost to the target {:.1} ms (holds {:.1}, losing windows {:.1}) {allowed}{phases}",
            ms(self.spent),
            ms(self.pauses()),
            ms(self.losses)
        )
    }
}

/// Wall time a window at `w`'s rate lost against `native`'s rate: the share of the loop's
/// work it did not do, times its length. Zero when it ran as fast or faster.
pub fn loss(native: &Window, w: &Window) -> Duration {
    if native.iterations == 0 {
        return Duration::ZERO;
    }
    let short = 1.0 - w.rate() / native.rate();
    if short <= 0.0 {
        Duration::ZERO
    } else {
        w.elapsed.mul_f64(short.min(1.0))
    }
}

/// How long process `pid` has run: now minus its start time (/proc/PID/stat field 22, clock
/// ticks since boot) against /proc/uptime.
pub fn process_age(pid: i32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    // SAFETY: sysconf takes an integer.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    age_from(&stat, &uptime, hz.max(1) as u64)
}

/// [`process_age`] on the files' text.
pub fn age_from(stat: &str, uptime: &str, hz: u64) -> Option<Duration> {
    // Fields after the command (which may hold spaces and parentheses) start after the last
    // ')': state is field 3, starttime field 22.
    let rest = &stat[stat.rfind(')')? + 1..];
    let start: u64 = rest.split_whitespace().nth(19)?.parse().ok()?;
    let up: f64 = uptime.split_whitespace().next()?.parse().ok()?;
    let age = up - start as f64 / hz as f64;
    (age >= 0.0).then(|| Duration::from_secs_f64(age))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repair::trial::test_window as w;

    #[test]
    fn age_reads_starttime_after_the_command() {
        // A command with a space and a ')' in it; starttime 150000 ticks at 100 Hz = 1500 s.
        let stat = "4242 (a) b) R 1 4242 4242 0 -1 4194304 100 0 0 0 5 1 0 0 20 0 3 0 \
                    150000 1000 100 18446744073709551615";
        let age = age_from(stat, "1503.25 2000.00\n", 100).expect("parses");
        assert_eq!(age, Duration::from_millis(3250));
        assert_eq!(age_from(stat, "1400.00 1.0", 100), None, "started later");
        let own = process_age(std::process::id() as i32).expect("own age");
        assert!(own < Duration::from_secs(3600), "{own:?}");
    }

    #[test]
    fn loss_is_the_work_a_slower_window_did_not_do() {
        assert_eq!(loss(&w(1000, 50), &w(500, 50)), Duration::from_millis(25));
        assert_eq!(loss(&w(1000, 50), &w(1200, 50)), Duration::ZERO);
        assert_eq!(loss(&w(0, 50), &w(10, 50)), Duration::ZERO);
        assert_eq!(loss(&w(1000, 50), &w(0, 10)), Duration::from_millis(10));
    }

    #[test]
    fn an_earlier_trial_of_the_run_is_charged_to_the_later_one() {
        // 2 s old at 1.5%: 30 ms. Placement alone first (2 holds, 4 ms loss at most), then
        // the full gate (3 + 3 holds and two losses) must fit what is left.
        let mut b = Budget::with_priors(Duration::from_secs(2), Some(0.015), REALTIME_HOLDS);
        assert!(b.affords_first_round());
        b.charge_earlier(Duration::from_millis(20));
        assert_eq!(b.spent(), Duration::from_millis(20));
        assert_eq!(b.left(), Duration::from_millis(10));
        assert!(!b.affords_first_round());
        assert!(b.affords(1, 1, MIN_LOSS));
    }

    #[test]
    fn a_trial_starts_only_when_its_holds_fit_and_a_losing_window_stops_in_time() {
        // 3 s old at 1.5%: 45 ms. Two rounds' holds at the priors: 4 × 8 + 4 × 4 = 48 ms.
        let b = Budget::new(Duration::from_secs(3), Some(0.015));
        assert!(!b.affords(4, 4, MIN_LOSS));
        assert!(b.affords(1, 1, MIN_LOSS));
        let need = b.needed_age(4, 4, MIN_LOSS).expect("limited");
        assert!(
            (need.as_secs_f64() - 52.0e-3 / 0.015).abs() < 1e-6,
            "{need:?}"
        );
        let mut b = Budget::new(Duration::from_secs(10), Some(0.015));
        assert_eq!(b.allowed(), Some(Duration::from_millis(150)));
        assert!(b.affords(4, 4, MIN_LOSS));
        // A slow hold raises the estimate for the next ones: the mean, at least the prior.
        b.charge_pause(Duration::from_millis(30), true);
        assert_eq!(b.estimate(1, 0, Duration::ZERO), Duration::from_millis(30));
        let mut m = b.clone();
        m.charge_pause(Duration::from_millis(2), true);
        assert_eq!(m.estimate(1, 0, Duration::ZERO), Duration::from_millis(16));
        m.charge_pause(Duration::from_millis(1), false);
        assert_eq!(m.estimate(0, 1, Duration::ZERO), ORDINARY_HOLDS.undo);
        assert_eq!(b.left(), Duration::from_millis(120));
        // Room for a loss: 120 ms left less one undo (4 ms) = 116 ms. A window at half the
        // native rate 40 ms in has lost 20 ms: go on; one at a tenth 130 ms in has lost
        // 117 ms: stop.
        let undo = b.estimate(0, 1, Duration::ZERO);
        assert!(!b.must_stop(&w(1000, 50), &w(400, 40), undo));
        assert!(b.must_stop(&w(1000, 50), &w(260, 130), undo));
        // Reserving the placement trial too (an apply at the 30 ms measured, an undo, a
        // losing window: 38 ms): a window that lost 90 ms of the 120 left ends now, where
        // reserving the undo alone let it run on.
        let more = undo + b.estimate(1, 1, MIN_LOSS);
        assert!(!b.must_stop(&w(1000, 50), &w(400, 40), more));
        assert!(!b.must_stop(&w(1000, 50), &w(200, 100), undo));
        assert!(b.must_stop(&w(1000, 50), &w(200, 100), more));
        b.charge_loss(&w(1000, 50), &w(250, 50));
        assert_eq!(b.losses, Duration::from_micros(37_500));
        assert!(b.describe().starts_with(
            "cost to the target 67.5 ms (holds 30.0, losing windows 37.5) of 150.0 ms allowed \
             (1.5% of the process's 10.00 s)"
        ));
        // Real-time holds: the trial fits a 1.3 s process (lreg -O0 runs 1.3-3 s).
        let rt = Budget::with_priors(Duration::from_millis(1300), Some(0.015), REALTIME_HOLDS);
        assert!(rt.affords_first_round(), "{:?}", rt.first_round_need());
        let none = Budget::new(Duration::ZERO, None);
        assert!(none.affords(100, 100, Duration::from_secs(10)));
        assert_eq!(none.needed_age(1, 1, MIN_LOSS), None);
        assert!(none.describe().contains("no budget"));
    }
}
