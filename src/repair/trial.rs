//! The trial: a repair stays in only if it makes the loop faster.
//!
//! The detector can call a line false sharing when it is not (or not enough to pay for the
//! store buffer's ~40 instructions per access): a forced repair of a padded loop ran 6.3x
//! slower. So after planning, laser measures before it commits:
//!
//! ```text
//!  round 1: apply count-only plan ─ window ─ Σ iterations → native rate ─ undo
//!           apply the repair      ─ window ─ Σ iterations → repaired rate
//!           repaired < native × (1 + margin): kill switch, undo, stop
//!           else undo (not the last round), round 2 the same; won every round: keep
//! ```
//!
//! Rounds alternate the two plans so a scheduler placement that lasts one window (on 2
//! vCPUs: both threads sharing a CPU makes a contended loop look uncontended; a neighbour's
//! burst halves one window) meets both; the output gives each round's rates and the
//! interval (from the trial's start) each was measured over.
//!
//! Both plans cover the same region with the same trampolines and the same per-thread
//! back-edge counter (`plan::ssb_layout::iters_offset`), read from outside through
//! /proc/PID/mem without stopping the target; the count-only plan runs every access
//! natively, so the comparison is the repair's effect alone. The kill switch
//! (`ssb_layout::KILL_OFF`) sends threads to the uninstrumented copy within one flush period,
//! before the undo's pause. A loop that never iterates in either window is not measured, and
//! an unmeasured repair is not kept (it could be the 6x slower kind).

use std::time::{Duration, Instant};

use laser_repair::plan::ssb_layout::{self, RuntimeConfig, KEYS_OFF, KILL_OFF};
use laser_repair::tracee::{ProcMem, TraceeError};

/// How to run a trial (`--trial-ms`, `--no-trial`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrialSettings {
    /// How long each of the two plans runs while it is measured.
    pub window: Duration,
    /// The repair must beat native by this fraction (0.05: 5%) to be kept.
    pub margin: f64,
    /// Rounds of (native window, repaired window); the repair must win every one.
    pub rounds: u32,
    /// Share of the process's age the trial may cost it (`budget.rs`); `None`: no limit.
    pub budget: Option<f64>,
}

impl Default for TrialSettings {
    fn default() -> Self {
        TrialSettings {
            window: Duration::from_millis(DEFAULT_TRIAL_MS),
            margin: 0.05,
            rounds: DEFAULT_TRIAL_ROUNDS,
            budget: Some(super::budget::DEFAULT_BUDGET_PERCENT / 100.0),
        }
    }
}

/// Rounds by default. One round (native then repaired, 50 ms each) decided on whatever the
/// scheduler did in those 100 ms: on Phoenix linear_regression -O0 (2 vCPUs, shared) one
/// run kept a repair at "1.38x" and ran 1.5x slower than without it, another undid it at
/// 0.63x. A second round must confirm a win; a loss ends the trial at once.
pub const DEFAULT_TRIAL_ROUNDS: u32 = 2;

/// One round: the count-only window, then the repaired one, with their start times from
/// the trial's start (the interval the verdict was decided on).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Round {
    pub native: Window,
    pub repaired: Window,
    pub native_at: Duration,
    pub repaired_at: Duration,
}

/// `--trial-ms` default: long enough for ~10^5 iterations of a slow loop, short next to a
/// run worth repairing.
pub const DEFAULT_TRIAL_MS: u64 = 50;

/// Iterations counted over one window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    pub iterations: u64,
    pub elapsed: Duration,
}

impl Window {
    /// Iterations per second.
    pub fn rate(&self) -> f64 {
        self.iterations as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Faster by at least the margin: the repair stays.
    Kept,
    /// Not faster enough: taken out.
    Undone,
    /// The loop did not iterate in one of the windows: nothing to compare, taken out.
    Idle,
    /// The budget (`budget.rs`) ran out before every round ran, none lost: taken out.
    OutOfBudget,
}

/// What a trial measured and decided.
#[derive(Clone, Debug, PartialEq)]
pub struct TrialOutcome {
    /// All rounds' native windows together, and all repaired ones.
    pub native: Window,
    pub repaired: Window,
    pub rounds: Vec<Round>,
    pub verdict: Verdict,
    /// Target pauses the trial added, in order: count-only apply, count-only undo, and the
    /// undo of a repair that lost; on top of the repair's own apply.
    pub extra_pauses: Vec<Duration>,
    /// Wall time the trial added to the repair (windows, pauses, planning).
    pub cost: Duration,
    /// Why it ended before its last round, if it did (the budget ran out).
    pub stopped: Option<String>,
    /// What it cost the target against its budget (`Budget::describe`).
    pub budget: Option<String>,
}

/// Keep, undo, or "not measured".
pub fn decide(native: &Window, repaired: &Window, margin: f64) -> Verdict {
    if native.iterations == 0 || repaired.iterations == 0 {
        return Verdict::Idle;
    }
    if repaired.rate() >= native.rate() * (1.0 + margin) {
        Verdict::Kept
    } else {
        Verdict::Undone
    }
}

impl TrialOutcome {
    /// The verdict over `rounds`: kept only if all `wanted` rounds ran and kept it (the
    /// caller stops at the first loss, or when the budget runs out: out of budget when no
    /// round lost), idle if a window saw no iteration.
    pub fn from_rounds(
        rounds: Vec<Round>,
        wanted: u32,
        margin: f64,
        extra_pauses: Vec<Duration>,
        cost: Duration,
    ) -> TrialOutcome {
        let sum = |f: fn(&Round) -> Window| Window {
            iterations: rounds.iter().map(|r| f(r).iterations).sum(),
            elapsed: rounds.iter().map(|r| f(r).elapsed).sum(),
        };
        let verdicts: Vec<Verdict> = rounds
            .iter()
            .map(|r| decide(&r.native, &r.repaired, margin))
            .collect();
        let verdict = if verdicts.is_empty() || verdicts.contains(&Verdict::Idle) {
            Verdict::Idle
        } else if verdicts.iter().all(|v| *v == Verdict::Kept) {
            // Fewer rounds than wanted and none lost: the budget ended the trial.
            if verdicts.len() as u32 >= wanted {
                Verdict::Kept
            } else {
                Verdict::OutOfBudget
            }
        } else {
            Verdict::Undone
        };
        TrialOutcome {
            native: sum(|r| r.native),
            repaired: sum(|r| r.repaired),
            verdict,
            rounds,
            extra_pauses,
            cost,
            stopped: None,
            budget: None,
        }
    }

    /// The trial ended early for `why` (its budget); with no round run at all that is the
    /// verdict ([`Verdict::OutOfBudget`], not "did not iterate").
    pub fn stop(&mut self, why: Option<String>) {
        if why.is_some() && self.rounds.is_empty() {
            self.verdict = Verdict::OutOfBudget;
        }
        self.stopped = why;
    }

    /// Repaired rate over native rate.
    pub fn speedup(&self) -> f64 {
        self.repaired.rate() / self.native.rate().max(1e-9)
    }

    pub fn kept(&self) -> bool {
        self.verdict == Verdict::Kept
    }

    pub fn extra_pause(&self) -> Duration {
        self.extra_pauses.iter().sum()
    }

    /// `trial: region 0x401130 kept: 1.62x native (repaired 1.20e7 it/s over 50 ms, native
    /// 7.40e6 it/s over 50 ms; …)`.
    pub fn line(&self, region: u64) -> String {
        format!("trial: region {region:#x} {}", self.describe())
    }

    /// The verdict with both rates (the line without its region).
    pub fn describe(&self) -> String {
        let what = match self.verdict {
            Verdict::Kept => format!("kept: {:.2}x native", self.speedup()),
            Verdict::Undone => format!("undone: {:.2}x native", self.speedup()),
            Verdict::Idle => "undone: the loop did not iterate in a window (not measured, so \
                 not kept)"
                .to_string(),
            Verdict::OutOfBudget => {
                "undone: its budget ran out before it could decide (not measured, so not kept)"
                    .to_string()
            }
        };
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let rounds: Vec<String> = self
            .rounds
            .iter()
            .enumerate()
            .map(|(k, r)| {
                format!(
                    "round {}: native {:.2e} it/s at +{:.0}..{:.0} ms, repaired {:.2e} it/s at \
                     +{:.0}..{:.0} ms ({:.2}x)",
                    k + 1,
                    r.native.rate(),
                    ms(r.native_at),
                    ms(r.native_at + r.native.elapsed),
                    r.repaired.rate(),
                    ms(r.repaired_at),
                    ms(r.repaired_at + r.repaired.elapsed),
                    r.repaired.rate() / r.native.rate().max(1e-9)
                )
            })
            .collect();
        let tail: String = self
            .stopped
            .iter()
            .chain(&self.budget)
            .map(|s| format!("; {s}"))
            .collect();
        format!(
            "{what} (repaired {:.2e} it/s over {:.0} ms, native {:.2e} it/s over {:.0} ms; {}; \
             trial cost {:.0} ms, extra pause {:.2} ms: {}{tail})",
            self.repaired.rate(),
            self.repaired.elapsed.as_secs_f64() * 1e3,
            self.native.rate(),
            self.native.elapsed.as_secs_f64() * 1e3,
            rounds.join("; "),
            self.cost.as_secs_f64() * 1e3,
            self.extra_pause().as_secs_f64() * 1e3,
            self.extra_pauses
                .iter()
                .map(|d| format!("{:.2}", d.as_secs_f64() * 1e3))
                .collect::<Vec<_>>()
                .join(" + "),
        )
    }
}

/// Σ of the iteration counters of every claimed slot of the cache whose data starts at
/// `data_base`, read without stopping the target. A slot is claimed when its key is set.
pub fn read_iterations(mem: &ProcMem, data_base: u64, cfg: &RuntimeConfig) -> u64 {
    let keys = mem.read_partial(data_base + KEYS_OFF, 8 * cfg.thread_slots as usize);
    let states = data_base + ssb_layout::states_offset(cfg);
    let size = ssb_layout::state_size(cfg);
    let off = ssb_layout::iters_offset(cfg) as u64;
    keys.chunks_exact(8)
        .enumerate()
        .filter(|(_, k)| k.iter().any(|&b| b != 0))
        .map(|(n, _)| {
            let w = mem.read_partial(states + n as u64 * size + off, 8);
            w.try_into().map(u64::from_le_bytes).unwrap_or(0)
        })
        .sum()
}

/// Counts iterations for `window` from now, or less: every 25th of it (at least 1 ms),
/// `enough` sees the count so far and may end the window early (a window that loses is
/// charged to the trial's budget by the millisecond).
pub fn measure(
    mem: &ProcMem,
    data_base: u64,
    cfg: &RuntimeConfig,
    window: Duration,
    enough: impl Fn(&Window) -> bool,
) -> Window {
    let c0 = read_iterations(mem, data_base, cfg);
    let t0 = Instant::now();
    let step = poll_step(window);
    loop {
        let left = window.saturating_sub(t0.elapsed());
        std::thread::sleep(step.min(left));
        let w = Window {
            iterations: read_iterations(mem, data_base, cfg).saturating_sub(c0),
            elapsed: t0.elapsed(),
        };
        if w.elapsed >= window || enough(&w) {
            return w;
        }
    }
}

/// How often [`measure`] looks at the count: a window that loses may lose this long more
/// than `enough` saw.
pub fn poll_step(window: Duration) -> Duration {
    (window / 25).max(Duration::from_millis(1))
}

/// Ends the repaired window early once the repair is clearly losing: at under half the
/// native rate over a fifth of the window (the caller's bound), noise would not change the
/// verdict, and every further millisecond runs the target at that speed.
pub fn clearly_losing(native: &Window, so_far: &Window) -> bool {
    native.iterations > 0 && so_far.rate() < 0.5 * native.rate()
}

/// Sets the kill switch of the cache at `data_base` (a plain write: no stop).
pub fn kill(mem: &ProcMem, data_base: u64) -> Result<(), TraceeError> {
    mem.write_verified(data_base + KILL_OFF, &1u64.to_le_bytes())
}

/// A window of `iterations` in `ms` milliseconds (the tests of the trial and its budget).
#[cfg(test)]
pub(crate) fn test_window(iterations: u64, ms: u64) -> Window {
    Window {
        iterations,
        elapsed: Duration::from_millis(ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::test_window as w;

    #[test]
    fn decide_keeps_only_a_repair_faster_by_the_margin() {
        assert_eq!(decide(&w(1000, 50), &w(1600, 50), 0.05), Verdict::Kept);
        assert_eq!(decide(&w(1000, 50), &w(1040, 50), 0.05), Verdict::Undone);
        assert_eq!(decide(&w(1000, 50), &w(160, 50), 0.05), Verdict::Undone);
        // Rates, not counts: the repaired window ran twice as long.
        assert_eq!(decide(&w(1000, 50), &w(1600, 100), 0.05), Verdict::Undone);
        assert_eq!(decide(&w(0, 50), &w(0, 50), 0.05), Verdict::Idle);
        assert_eq!(decide(&w(0, 50), &w(10, 50), 0.05), Verdict::Idle);
        assert_eq!(decide(&w(10, 50), &w(0, 50), 0.05), Verdict::Idle);
    }

    fn round(native: u64, repaired: u64) -> Round {
        Round {
            native: w(native, 50),
            repaired: w(repaired, 50),
            native_at: Duration::from_millis(10),
            repaired_at: Duration::from_millis(70),
        }
    }

    #[test]
    fn every_round_must_keep_the_repair() {
        let kept = TrialOutcome::from_rounds(
            vec![round(1000, 1600), round(900, 1500)],
            2,
            0.05,
            Vec::new(),
            Duration::ZERO,
        );
        assert_eq!(kept.verdict, Verdict::Kept);
        assert_eq!(kept.native.iterations, 1900);
        assert_eq!(kept.repaired.elapsed, Duration::from_millis(100));
        // The first round's native window was uncontended (or the second's repaired one
        // unlucky): one loss undoes it, whatever the pooled rates say.
        let lost = TrialOutcome::from_rounds(
            vec![round(1000, 3000), round(1000, 1000)],
            2,
            0.05,
            Vec::new(),
            Duration::ZERO,
        );
        assert_eq!(lost.verdict, Verdict::Undone);
        assert!(lost.speedup() > 1.5, "pooled {}", lost.speedup());
        let l = lost.line(0x10);
        assert!(
            l.contains("round 2: native 2.00e4 it/s at +10..60 ms, repaired 2.00e4 it/s at +70..120 ms (1.00x)"),
            "{l}"
        );
        // The budget ended the trial after a won first round: one round does not keep it.
        let short =
            TrialOutcome::from_rounds(vec![round(1000, 3000)], 2, 0.05, Vec::new(), Duration::ZERO);
        assert_eq!(short.verdict, Verdict::OutOfBudget);
        assert!(!short.kept());
        let idle =
            TrialOutcome::from_rounds(vec![round(0, 10)], 2, 0.05, Vec::new(), Duration::ZERO);
        assert_eq!(idle.verdict, Verdict::Idle);
        let none = TrialOutcome::from_rounds(Vec::new(), 2, 0.05, Vec::new(), Duration::ZERO);
        assert_eq!(none.verdict, Verdict::Idle);
        // Stopped by the budget: out of budget unless a round lost.
        let mut s = short.clone();
        s.stop(Some("ended before round 2".into()));
        assert_eq!(s.verdict, Verdict::OutOfBudget);
        assert!(s.line(1).contains("budget ran out"), "{}", s.line(1));
        assert!(
            s.line(1).contains("; ended before round 2"),
            "{}",
            s.line(1)
        );
        let mut n = none.clone();
        n.stop(Some("ended before round 1's repaired window".into()));
        assert_eq!(n.verdict, Verdict::OutOfBudget);
        let mut l = lost.clone();
        l.stop(Some("round 2's repaired window ended".into()));
        assert_eq!(l.verdict, Verdict::Undone, "a round lost: that decides");
    }

    #[test]
    fn a_repair_at_under_half_native_is_clearly_losing() {
        assert!(clearly_losing(&w(1000, 50), &w(40, 10)));
        assert!(!clearly_losing(&w(1000, 50), &w(150, 10)));
        assert!(
            !clearly_losing(&w(0, 50), &w(0, 10)),
            "nothing to compare with"
        );
    }

    #[test]
    fn line_says_kept_or_undone_with_both_rates() {
        let o = TrialOutcome {
            native: w(370_000, 50),
            repaired: w(600_000, 50),
            rounds: Vec::new(),
            verdict: Verdict::Kept,
            extra_pauses: vec![Duration::from_millis(4), Duration::from_millis(6)],
            cost: Duration::from_millis(130),
            stopped: None,
            budget: Some("cost to the target 12.0 ms".into()),
        };
        let l = o.line(0x401130);
        assert!(
            l.starts_with("trial: region 0x401130 kept: 1.62x native"),
            "{l}"
        );
        assert!(
            l.contains("repaired 1.20e7 it/s over 50 ms, native 7.40e6 it/s over 50 ms"),
            "{l}"
        );
        assert!(
            l.contains("extra pause 10.00 ms: 4.00 + 6.00; cost to the target 12.0 ms)"),
            "{l}"
        );
        let u = TrialOutcome {
            verdict: Verdict::Undone,
            repaired: w(59_200, 50),
            ..o.clone()
        };
        assert!(u.line(1).contains("undone: 0.16x native"), "{}", u.line(1));
        let i = TrialOutcome {
            verdict: Verdict::Idle,
            ..o
        };
        assert!(i.line(1).contains("did not iterate"));
    }
}
