//! What armed watchpoints cost the target when they do not trap.
//!
//! An enabled data breakpoint in DR7 turns off the CPU's fast-string microcode: `rep movsb` and
//! `rep stosb` (glibc's `memcpy`/`memset` above ~2 KiB) then move one element per step so a
//! breakpoint on any of them can be reported precisely. Measured here (`benchmarks/RESULTS.md`,
//! "armed watchpoints and fast strings"): a 4 KiB `memset` loop runs ~30x slower with one
//! breakpoint armed on an address it never touches, and Phoenix string_match 2.1x slower. The
//! trap budget cannot see this cost (there are no traps), so it is measured from the timer
//! samples themselves: the share of them that land on a `rep movs`/`rep stos` (an interrupted
//! repeated string instruction is resumed, so the sample's IP is the instruction itself) while
//! watchpoints are armed, against the share while nothing is armed.
//!
//! The other work of a thread runs at the same speed armed or not, so if a share `u` of
//! unarmed time and `a` of armed time goes to fast strings, the same work takes
//! `(1 - u) / (1 - a)` times as long armed. Shares cannot resolve a program that spends nearly
//! all its time copying (98% armed or not: a 2.4x slowdown moves the share by 0.5%), so the
//! estimate is also at least what a share `a` costs if each copy is only
//! [`MIN_FAST_STRING_SLOWDOWN`] times slower armed (the mildest slowdown measured here):
//! `1 / ((1 - a) + a / k)` ([`ArmedCost::slowdown`]). The watch steering keeps armed time to
//! what that slowdown leaves within its overhead budget.

use std::collections::VecDeque;

/// Samples of armed time before the slowdown estimate is used: ~10 ms of armed time at the
/// default sampling rate on 2 CPUs. Fewer leave one sample's luck deciding.
pub const MIN_ARMED_SAMPLES: u64 = 10;
/// Fast-string samples of armed time before they count against it. One or two among a
/// hundred armed samples are a copy the program makes now and then, caught by luck: one
/// `rep movs` sample in 132 armed ones (none unarmed) made an estimated 0.8%
/// slowdown of PARSEC streamcluster, which stopped its watch steering. A program that copies
/// for a real share of its time has more within its first [`MIN_ARMED_SAMPLES`].
pub const MIN_ARMED_FAST_STRING: u64 = 3;
/// Samples of unarmed time before its share replaces the conservative baseline of 0.
const MIN_UNARMED_SAMPLES: u64 = 30;
/// How many times slower a fast-string copy runs with a data breakpoint armed, at least:
/// `rep movsq` of 8 KiB measured 2.4x, `rep stosb` of 4 KiB ~30x (benchmarks/RESULTS.md).
pub const MIN_FAST_STRING_SLOWDOWN: f64 = 2.0;
/// Arm/disarm transitions kept for samples that arrive after a later transition.
const TRANSITIONS: usize = 64;
/// Bound on the estimate: a share of 1 would be an infinite slowdown.
const MAX_SHARE: f64 = 0.95;

/// Timer samples split by whether watchpoints were armed when they were taken, and by whether
/// they landed on a fast-string instruction.
#[derive(Clone, Debug, Default)]
pub struct ArmedCost {
    /// (time, armed from then on), oldest first.
    transitions: VecDeque<(u64, bool)>,
    /// [unarmed, armed] × [samples, of which on fast strings].
    tally: [[u64; 2]; 2],
}

/// The tallies behind a slowdown estimate, for the report.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ArmedCostSummary {
    pub armed_samples: u64,
    pub armed_fast_string: u64,
    pub unarmed_samples: u64,
    pub unarmed_fast_string: u64,
}

impl ArmedCost {
    /// Watchpoints are armed (or not) from `time` on.
    pub fn transition(&mut self, time: u64, armed: bool) {
        if self.transitions.back().is_some_and(|&(_, a)| a == armed) {
            return;
        }
        if self.transitions.len() == TRANSITIONS {
            self.transitions.pop_front();
        }
        self.transitions.push_back((time, armed));
    }

    /// A timer sample taken at `time`, on a fast-string instruction or not.
    #[inline]
    pub fn sample(&mut self, time: u64, fast_string: bool) {
        // Nearly every sample comes after the latest transition: one compare (this runs on
        // every timer sample of a replay).
        let armed = match self.transitions.back() {
            None => false,
            Some(&(t, a)) if t <= time => a,
            Some(_) => self.armed_at(time),
        };
        let t = &mut self.tally[usize::from(armed)];
        t[0] += 1;
        t[1] += u64::from(fast_string);
    }

    /// Whether watchpoints were armed at `time`, before the latest transition.
    #[cold]
    fn armed_at(&self, time: u64) -> bool {
        self.transitions
            .iter()
            .rev()
            .find(|&&(t, _)| t <= time)
            .is_some_and(|&(_, a)| a)
    }

    pub fn summary(&self) -> ArmedCostSummary {
        ArmedCostSummary {
            armed_samples: self.tally[1][0],
            armed_fast_string: self.tally[1][1],
            unarmed_samples: self.tally[0][0],
            unarmed_fast_string: self.tally[0][1],
        }
    }

    /// How many times longer the target's work takes while watchpoints are armed, once there
    /// are [`MIN_ARMED_SAMPLES`] of armed time, or earlier where fast-string samples already
    /// show a cost (`ArmedCostSummary::early_slowdown`); `None` before. Without enough
    /// unarmed samples the unarmed share is taken as 0, which charges every fast-string
    /// sample to the watchpoints: an overestimate, on the side of the target.
    pub fn slowdown(&self) -> Option<f64> {
        self.summary().slowdown()
    }
}

impl ArmedCostSummary {
    /// See [`ArmedCost::slowdown`].
    pub fn slowdown(&self) -> Option<f64> {
        let share = |n: u64, of: u64| (n as f64 / of as f64).min(MAX_SHARE);
        if self.armed_samples < MIN_ARMED_SAMPLES {
            return self.early_slowdown();
        }
        if self.armed_fast_string < MIN_ARMED_FAST_STRING {
            return Some(1.0);
        }
        let armed = share(self.armed_fast_string, self.armed_samples);
        let unarmed = if self.unarmed_samples >= MIN_UNARMED_SAMPLES {
            share(self.unarmed_fast_string, self.unarmed_samples)
        } else {
            0.0
        };
        let by_shares = (1.0 - unarmed) / (1.0 - armed);
        let by_floor = 1.0 / ((1.0 - armed) + armed / MIN_FAST_STRING_SLOWDOWN);
        Some(by_shares.max(by_floor).max(1.0))
    }

    /// The estimate before [`MIN_ARMED_SAMPLES`] of armed time, where the evidence is
    /// already clear: [`MIN_ARMED_FAST_STRING`] fast-string samples of armed time (a third
    /// or more of it: a copy loop, not luck), or as many among [`MIN_UNARMED_SAMPLES`] of
    /// unarmed time (a program that copies, before anything was armed). Both at the floor
    /// slowdown, [`MIN_FAST_STRING_SLOWDOWN`]: the least such a share costs. Waiting for the
    /// full count let the run's first survey window stay armed its whole turn (~40 ms) on
    /// Phoenix string_match, ~2x slower armed, which alone cost it ~4% of its 0.5 s.
    fn early_slowdown(&self) -> Option<f64> {
        let share = |n: u64, of: u64| (n as f64 / of as f64).min(MAX_SHARE);
        if self.armed_fast_string >= MIN_ARMED_FAST_STRING {
            let a = share(self.armed_fast_string, self.armed_samples);
            return Some(1.0 / ((1.0 - a) + a / MIN_FAST_STRING_SLOWDOWN));
        }
        if self.unarmed_samples >= MIN_UNARMED_SAMPLES
            && self.unarmed_fast_string >= MIN_ARMED_FAST_STRING
        {
            let u = share(self.unarmed_fast_string, self.unarmed_samples);
            return Some((1.0 - u) + u * MIN_FAST_STRING_SLOWDOWN);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_split_by_the_transition_in_effect_at_their_time() {
        let mut c = ArmedCost::default();
        c.transition(100, true);
        c.transition(200, false);
        // Arrives after the disarm but was taken while armed.
        c.sample(150, true);
        c.sample(250, false);
        c.sample(50, false);
        let s = c.summary();
        assert_eq!((s.armed_samples, s.armed_fast_string), (1, 1));
        assert_eq!((s.unarmed_samples, s.unarmed_fast_string), (2, 0));
    }

    #[test]
    fn no_estimate_before_enough_armed_time() {
        let mut c = ArmedCost::default();
        c.transition(0, true);
        for t in 0..MIN_ARMED_SAMPLES - 1 {
            c.sample(t, t < MIN_ARMED_FAST_STRING - 1);
        }
        assert_eq!(c.slowdown(), None);
        c.sample(100, false);
        assert_eq!(c.slowdown(), Some(1.0));
    }

    /// Three fast-string samples in a few of armed time are a copy loop: estimated at once,
    /// at the floor. (Phoenix string_match: its first survey window ran ~40 ms at ~2x before
    /// the ten samples came.)
    #[test]
    fn fast_strings_early_in_armed_time_are_a_cost_at_once() {
        let mut c = ArmedCost::default();
        c.transition(0, true);
        for t in 0..MIN_ARMED_FAST_STRING {
            c.sample(t, true);
        }
        c.sample(10, false);
        let a = 0.75;
        let floor = 1.0 / ((1.0 - a) + a / MIN_FAST_STRING_SLOWDOWN);
        assert_eq!(c.slowdown(), Some(floor));
    }

    /// Unarmed time that copies: before anything is armed, the cost its share would have at
    /// the floor slowdown; the armed time's own share replaces it once there is enough.
    #[test]
    fn unarmed_fast_strings_give_the_estimate_before_any_armed_time() {
        let mut c = ArmedCost::default();
        for t in 0..MIN_UNARMED_SAMPLES {
            c.sample(t, t % 5 == 0);
        }
        let u = 0.2;
        let prior = c.slowdown().unwrap();
        assert!((prior - ((1.0 - u) + u * MIN_FAST_STRING_SLOWDOWN)).abs() < 1e-9);
        // Fewer unarmed samples, or fewer fast strings among them: no estimate.
        let mut few = ArmedCost::default();
        for t in 0..MIN_UNARMED_SAMPLES - 1 {
            few.sample(t, true);
        }
        assert_eq!(few.slowdown(), None);
        c.transition(1000, true);
        for t in 0..MIN_ARMED_SAMPLES {
            c.sample(1000 + t, false);
        }
        assert_eq!(c.slowdown(), Some(1.0));
    }

    #[test]
    fn half_the_armed_time_in_fast_strings_is_a_2x_slowdown() {
        let mut c = ArmedCost::default();
        c.transition(1000, true);
        // Unarmed: 10% of samples in fast strings; armed: 55%. (0.9 / 0.45 = 2.)
        for t in 0..100 {
            c.sample(t, t % 10 == 0);
        }
        for t in 0..100 {
            c.sample(1000 + t, t % 20 < 11);
        }
        let s = c.slowdown().unwrap();
        assert!((s - 2.0).abs() < 1e-9, "{s}");
    }

    /// control_memcpy: ~98% of samples in `rep movsq`/`rep stos` armed or not (perf annotate
    /// with and without a breakpoint: 98.3% and 97.7%), 2.4x slower armed.
    #[test]
    fn a_program_that_mostly_copies_is_charged_at_least_the_floor() {
        let mut c = ArmedCost::default();
        c.transition(1000, true);
        for t in 0..1000 {
            c.sample(t, t % 100 >= 2);
        }
        for t in 0..1000 {
            c.sample(1000 + t, t % 100 >= 3);
        }
        let s = c.slowdown().unwrap();
        // The armed share, 97%, is taken at most at MAX_SHARE.
        let a = 0.97f64.min(MAX_SHARE);
        let floor = 1.0 / ((1.0 - a) + a / MIN_FAST_STRING_SLOWDOWN);
        assert!((s - floor).abs() < 1e-9, "{s} vs {floor}");
        assert!(s > 1.9);
    }

    #[test]
    fn a_program_without_fast_strings_costs_nothing_armed() {
        let mut c = ArmedCost::default();
        c.transition(0, true);
        for t in 0..50 {
            c.sample(t, false);
        }
        assert_eq!(c.slowdown(), Some(1.0));
    }

    /// A copy or two caught while armed is luck, not a cost; a third makes it one.
    #[test]
    fn a_stray_fast_string_sample_is_not_a_slowdown() {
        let mut c = ArmedCost::default();
        for t in 0..600 {
            c.sample(t, false);
        }
        c.transition(1000, true);
        for t in 0..132 {
            c.sample(1000 + t, t < MIN_ARMED_FAST_STRING - 1);
        }
        assert_eq!(c.slowdown(), Some(1.0));
        c.sample(2000, true);
        let s = c.slowdown().unwrap();
        assert!(s > 1.02, "{s}");
    }

    #[test]
    fn a_repeated_transition_is_one() {
        let mut c = ArmedCost::default();
        c.transition(10, true);
        c.transition(20, true);
        c.sample(15, false);
        assert_eq!(c.summary().armed_samples, 1);
    }
}
