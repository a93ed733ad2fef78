//! Confidence intervals for the rates a report gives, so a gate can say when its verdict is a
//! coin toss instead of guessing.
//!
//! A finding's `rate_per_s` is `events / t`, where `events` is a count of contention events
//! actually seen (watchpoint transfers, or sampled contention events) and `t` the time they
//! were seen over (`laser_detect::model::estimate` gives the same count a relative error of
//! `1/sqrt(events)`). Counts of independent rare events are Poisson, so the interval of the
//! rate is the Poisson interval of the count, scaled by `rate / events`:
//!
//! ```text
//!   events n ──Poisson score interval (95%)──▶ [n_lo, n_hi] ──× rate/n──▶ [rate_lo, rate_hi]
//!   n_lo,hi = n + z²/2 ∓ z·sqrt(n + z²/4),   z = 1.96
//! ```
//!
//! The score interval (not `n ± z·sqrt(n)`) because it stays inside `[0, ∞)` and is honest at
//! the small counts a short CI run gives (n = 4 → 1.6..10.3, not 0.1..7.9). It covers only the
//! counting noise: a busy 2-vCPU runner that schedules both threads on one CPU really does
//! contend less, which no interval from one run can show.

/// z for a two-sided 95% interval.
const Z: f64 = 1.96;

/// A point estimate with its 95% interval (`lo <= value <= hi`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    pub value: f64,
    pub lo: f64,
    pub hi: f64,
}

impl Estimate {
    /// A value known exactly (a count of findings, a sample count).
    pub fn exact(value: f64) -> Self {
        Estimate {
            value,
            lo: value,
            hi: value,
        }
    }

    /// The interval of `rate` measured from `events` Poisson events.
    pub fn rate(rate: f64, events: u64) -> Self {
        if events == 0 || !(rate.is_finite() && rate > 0.0) {
            return Estimate::exact(if rate.is_finite() { rate } else { 0.0 });
        }
        let (lo, hi) = poisson(events);
        let per_event = rate / events as f64;
        Estimate {
            value: rate,
            lo: lo * per_event,
            hi: hi * per_event,
        }
    }

    /// The sum of independent estimates: values add, half-widths add in quadrature (the
    /// normal approximation; each part is already a Poisson interval).
    pub fn sum(parts: impl IntoIterator<Item = Estimate>) -> Self {
        let (mut value, mut var_lo, mut var_hi) = (0.0, 0.0, 0.0);
        for p in parts {
            value += p.value;
            var_lo += (p.value - p.lo).powi(2);
            var_hi += (p.hi - p.value).powi(2);
        }
        Estimate {
            value,
            lo: (value - var_lo.sqrt()).max(0.0),
            hi: value + var_hi.sqrt(),
        }
    }

    /// `self / base`, with the widest interval the two intervals allow (conservative: the
    /// ends are not independent draws, so this over-covers rather than under-covers).
    pub fn ratio(self, base: Estimate) -> Self {
        let div = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::INFINITY };
        Estimate {
            value: div(self.value, base.value),
            lo: div(self.lo, base.hi),
            hi: div(self.hi, base.lo),
        }
    }

    pub fn is_exact(&self) -> bool {
        self.lo == self.hi
    }
}

/// The 95% Poisson score interval of a count `n`.
pub fn poisson(n: u64) -> (f64, f64) {
    let n = n as f64;
    let centre = n + Z * Z / 2.0;
    let half = Z * (n + Z * Z / 4.0).sqrt();
    ((centre - half).max(0.0), centre + half)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_interval_holds_the_count_and_narrows_relatively() {
        for n in [1u64, 4, 55, 10_000] {
            let (lo, hi) = poisson(n);
            assert!(lo < n as f64 && (n as f64) < hi, "{n}: {lo}..{hi}");
        }
        let (lo, hi) = poisson(4);
        assert!(
            (lo - 1.55).abs() < 0.01 && (hi - 10.3).abs() < 0.05,
            "{lo}..{hi}"
        );
        let rel = |n: u64| {
            let (lo, hi) = poisson(n);
            (hi - lo) / n as f64
        };
        assert!(rel(10_000) < rel(55) && rel(55) < rel(4));
        assert_eq!(poisson(0).0, 0.0);
    }

    #[test]
    fn rate_interval_scales_the_count_interval() {
        // The golden fs report: 55 transfers at 10,770/s.
        let e = Estimate::rate(10_770.0, 55);
        let (lo, hi) = poisson(55);
        assert!((e.lo - lo * 10_770.0 / 55.0).abs() < 1e-6);
        assert!((e.hi - hi * 10_770.0 / 55.0).abs() < 1e-6);
        assert!(
            e.lo < 10_000.0 && 10_000.0 < e.hi && e.lo > 1_000.0,
            "{e:?}"
        );
        assert!(Estimate::rate(0.0, 0).is_exact());
    }

    #[test]
    fn sums_and_ratios() {
        let a = Estimate::rate(1000.0, 100);
        let s = Estimate::sum([a, a]);
        assert_eq!(s.value, 2000.0);
        // Independent halves: the sum's interval is sqrt(2) wider, not 2x.
        let w = (s.hi - s.lo) / (a.hi - a.lo);
        assert!((w - 2f64.sqrt()).abs() < 1e-9, "{w}");
        let r = Estimate::rate(3000.0, 300).ratio(a);
        assert!((r.value - 3.0).abs() < 1e-12);
        assert!(r.lo < 3.0 && r.hi > 3.0 && r.lo > 1.0, "{r:?}");
    }
}
