//! Online repair: the decision `laser run --repair` takes mid-run, and how its outcome is
//! told in the final report.
//!
//! ```text
//!  launch ──monitor──▶ every --repair-after: any false-sharing line at or above --threshold?
//!     no: keep monitoring        yes: report so far (not printed) ──▶ repair its false-sharing
//!     sources in the child, once (session still open, samples wait in the rings)
//!         ──monitor, code-cache samples counted not analysed──▶ exit ──▶ report + "repaired:"
//! ```
//!
//! The check uses the detector's own rates (watch-window rates where a line was watched, so a
//! slow start of the program does not dilute them) and the report's rule for which findings
//! it keeps ([`crossed`]), and symbolizes nothing: only when a line crosses does the report
//! get built. The monitor loop's watchpoint steering lives across checks (`commands::run`):
//! restarting it at every check made the survey start over each `--repair-after`, and the
//! checks missed lines (Phoenix linear_regression -O0) that the report at exit showed.
//!
//! The child is laser's own (forked, not traced): the tracee seizes its threads like any
//! other process's, and the perf events, inherited per CPU, keep sampling through and after
//! the hold. Messages during the run go to stderr: stdout is shared with the program.

use std::time::Duration;

use laser_detect::{Analysis, Kind, Report};
use laser_repair::plan::SsbMode;

use super::budget::Budget;
use super::{repair_report, Settings, Summary};

/// What the mid-run repair did.
#[derive(Debug)]
pub enum Online {
    /// The program exited before `--repair-after`.
    ExitedFirst { after: Duration },
    /// The program exited; no false sharing had reached the threshold at any check.
    NothingFound { checks: usize, last: Duration },
    /// A repair pass ran (possibly finding nothing to repair).
    Ran { at: Duration, summary: Summary },
    /// laser failed while repairing (the tracee restored the function it was working on).
    Failed { at: Duration, error: String },
    /// False sharing crossed the threshold at `at`, but the trial's holds did not fit its
    /// budget before the program exited (`budget.rs`; it would have fit from `until`).
    Deferred {
        at: Duration,
        until: Option<Duration>,
        exited: Duration,
    },
}

/// Whether a trial (`trial` args) of process `pid` may start now: its first round's holds
/// and a losing window fit its budget (`budget.rs`) less what this run's earlier trials
/// `spent`. Without a trial, or without a limit, it may.
pub fn trial_fits(pid: i32, trial: &crate::cli::TrialArgs, spent: Duration) -> bool {
    let Some(t) = trial.settings() else {
        return true;
    };
    let mut b = Budget::for_pid(pid, t.budget);
    b.charge_earlier(spent);
    b.affords_first_round()
}

/// How long until the placement trial alone (`Settings::placement_only`: two holds and a
/// losing window) fits the budget of process `pid`, which grows with its age: zero when it
/// fits now; `None` when it never will (no trial, one CPU online).
pub fn placement_wait(pid: i32, trial: &crate::cli::TrialArgs) -> Option<Duration> {
    let t = trial.settings()?;
    if super::placement::online_cpus() < 2 {
        return None;
    }
    let b = Budget::for_pid(pid, t.budget);
    if b.affords_placement_trial() {
        return Some(Duration::ZERO);
    }
    Some(b.placement_trial_age()?.saturating_sub(b.age))
}

/// The process age from which [`trial_fits`] holds, by the budget's prior estimates.
pub fn trial_fits_from(pid: i32, trial: &crate::cli::TrialArgs) -> Option<Duration> {
    let t = trial.settings()?;
    Budget::for_pid(pid, t.budget).first_round_age()
}

/// What `run --repair` says when it first defers a repair.
pub fn deferral_line(at: Duration, until: Option<Duration>) -> String {
    format!(
        "laser: after {:.2} s: false sharing at or above the threshold; the repair waits{} \
         (the trial's holds must stay under its budget, --trial-budget)",
        at.as_secs_f64(),
        until.map_or(String::new(), |u| format!(
            " until the process has run {:.2} s",
            u.as_secs_f64()
        ))
    )
}

/// Whether the report built from `analysis` would hold a false-sharing finding at or above
/// `threshold` events/s: the same rule the report keeps findings by (a line at or above the
/// threshold, or lines below it that one set of instructions moves along and that add up to
/// it, `model::migratory`, each from enough events, `LineFinding::reported_at`), so a line the
/// report shows is a line the check sees. A forked
/// copy's line is not this process's to repair.
pub fn crossed(analysis: &Analysis, threshold: f64) -> bool {
    analysis
        .findings
        .iter()
        .any(|f| f.kind == Kind::FalseSharing && f.reported_at(threshold) && f.process.is_none())
        || laser_detect::model::migratory::migratory(&analysis.findings, threshold)
            .iter()
            .any(|(f, _)| {
                f.kind == Kind::FalseSharing && f.reported_at(threshold) && f.process.is_none()
            })
}

/// Repairs the false-sharing sources of `report` (the run so far) in process `pid`.
pub fn repair_now(pid: i32, report: &Report, at: Duration, settings: &Settings) -> Online {
    let n = report
        .findings
        .iter()
        .filter(|f| f.kind == Kind::FalseSharing)
        .count();
    eprintln!(
        "laser: after {:.2} s: {n} false-sharing finding(s) at or above {}/s{}",
        at.as_secs_f64(),
        report.threshold,
        if n > 0 { "; repairing" } else { "" }
    );
    if n == 0 {
        return Online::Ran {
            at,
            summary: Summary::default(),
        };
    }
    let mut say = |l: &str| eprintln!("laser: {l}");
    match repair_report(pid, report, settings, &mut say) {
        Ok(summary) => Online::Ran { at, summary },
        Err(e) => {
            let error = format!("{e:#}");
            eprintln!("laser: repair failed: {error}");
            Online::Failed { at, error }
        }
    }
}

impl Online {
    /// Whether the pass kept a repair in the process.
    pub fn kept_any(&self) -> bool {
        matches!(self, Online::Ran { summary, .. } if !summary.repaired.is_empty())
    }

    /// What the pass's trials charged to their budget.
    pub fn spent(&self) -> Duration {
        match self {
            Online::Ran { summary, .. } => summary.spent,
            _ => Duration::ZERO,
        }
    }

    /// The code caches now in the process (their samples are not in any ELF file).
    pub fn caches(&self) -> Vec<std::ops::Range<u64>> {
        match self {
            Online::Ran { summary, .. } => summary.caches(),
            _ => Vec::new(),
        }
    }

    /// The "repaired:" section printed after the report.
    pub fn section(&self, repair_after: Duration, skipped_samples: u64) -> String {
        let mut out = String::new();
        let secs = |d: &Duration| d.as_secs_f64();
        match self {
            Online::ExitedFirst { after } => out.push_str(&format!(
                "repaired: nothing (the program exited after {:.2} s, before --repair-after {:.2} s)\n",
                secs(after),
                secs(&repair_after)
            )),
            Online::NothingFound { checks, last } => out.push_str(&format!(
                "repaired: nothing (no false sharing at or above the threshold in {checks} \
                 check(s), every {:.2} s, the last at {:.2} s)\n",
                secs(&repair_after),
                secs(last)
            )),
            Online::Failed { at, error } => out.push_str(&format!(
                "repaired: nothing (the repair at {:.2} s failed: {error})\n",
                secs(at)
            )),
            Online::Deferred { .. } => out.push_str(&format!("repaired: nothing ({})\n", self.why_deferred())),
            Online::Ran { at, summary } if summary.functions == 0 => out.push_str(&format!(
                "repaired: nothing (false sharing crossed the threshold at {:.2} s, but none of \
                 its sources is in code the process maps)\n",
                secs(at)
            )),
            Online::Ran { at, summary } => {
                out.push_str(&format!(
                    "repaired: {} of {} function(s) at {:.2} s\n",
                    summary.repaired.len(),
                    summary.functions,
                    secs(at)
                ));
                for r in &summary.repaired {
                    if let Some(p) = &r.placement {
                        out.push_str(&format!("  {}: {p}\n", r.label));
                        continue;
                    }
                    out.push_str(&format!(
                        "  {}: code cache {:#x}..{:#x}, target paused {:.2} ms ({} thread(s)), {}\n",
                        r.label,
                        r.cache.start,
                        r.cache.end,
                        r.pause.as_secs_f64() * 1e3,
                        r.threads_held,
                        match r.mode {
                            Some(SsbMode::Rtm) => "SSB: RTM coalescing buffer",
                            Some(SsbMode::Fifo) => "SSB: FIFO log",
                            _ => "SSB mode not reported yet",
                        }
                    ));
                }
                for r in summary.repaired.iter().chain(&summary.undone) {
                    if let Some(t) = &r.trial {
                        let region = r.label.as_str();
                        out.push_str(&format!("  {region}: trial {}\n", t.describe()));
                    }
                }
                for (f, why) in &summary.refused {
                    out.push_str(&format!("  refused {f}: {why}\n"));
                }
                if skipped_samples > 0 {
                    out.push_str(&format!(
                        "  {skipped_samples} sample(s) after the repair were in laser's code \
                         cache (repaired code): counted, not analysed\n"
                    ));
                }
            }
        }
        out
    }

    /// `false sharing crossed the threshold at 0.80 s; the trial's holds fit its budget
    /// from 3.47 s and the program exited at 3.10 s`.
    fn why_deferred(&self) -> String {
        let Online::Deferred { at, until, exited } = self else {
            return String::new();
        };
        format!(
            "false sharing crossed the threshold at {:.2} s; the trial's holds fit its budget{} \
             and the program exited at {:.2} s",
            at.as_secs_f64(),
            until.map_or(String::new(), |u| format!(
                " from a process age of {:.2} s",
                u.as_secs_f64()
            )),
            exited.as_secs_f64()
        )
    }

    /// One line for the report's notes (text and JSON).
    pub fn note(&self) -> String {
        match self {
            Online::ExitedFirst { .. } => {
                "run --repair: the program exited before the first check; nothing repaired"
                    .to_string()
            }
            Online::NothingFound { checks, .. } => format!(
                "run --repair: no false sharing reached the threshold in {checks} check(s); \
                 nothing repaired"
            ),
            Online::Failed { at, error } => format!(
                "run --repair: the repair at {:.2} s failed ({error}); counts are of unrepaired code",
                at.as_secs_f64()
            ),
            Online::Deferred { .. } => format!("run --repair: {}", self.why_deferred()),
            Online::Ran { at, summary } => format!(
                "run --repair: {} function(s) repaired, {} undone by their trial, {} refused at \
                 {:.2} s; counts before then are of the original code, after it of the code left \
                 outside laser's code cache{}",
                summary.repaired.len(),
                summary.undone.len(),
                summary.refused.len(),
                at.as_secs_f64(),
                summary
                    .repaired
                    .iter()
                    .chain(&summary.undone)
                    .filter_map(|r| r.trial.as_ref())
                    .map(|t| format!(
                        "; trial: {:.2}x native ({:.3e} vs {:.3e} it/s), {}",
                        t.speedup(),
                        t.repaired.rate(),
                        t.native.rate(),
                        if t.kept() { "kept" } else { "undone" }
                    ))
                    .collect::<String>()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repair::Repaired;

    fn repaired(label: &str) -> Repaired {
        Repaired {
            label: label.into(),
            cache: 0x1000..0x9000,
            pause: Duration::from_micros(11_640),
            threads_held: 3,
            mode: Some(SsbMode::Fifo),
            trial: None,
            placement: None,
            trial_caches: Vec::new(),
        }
    }

    #[test]
    fn section_names_what_was_repaired_refused_and_skipped() {
        let o = Online::Ran {
            at: Duration::from_secs(1),
            summary: Summary {
                functions: 2,
                repaired: vec![repaired("bump [0x10..0x40]")],
                undone: Vec::new(),
                refused: vec![("avx_loop".into(), "vmovdqu".into())],
                spent: Duration::from_millis(3),
            },
        };
        assert!(o.kept_any());
        assert_eq!(o.spent(), Duration::from_millis(3));
        let s = o.section(Duration::from_secs(1), 7);
        assert!(
            s.starts_with("repaired: 1 of 2 function(s) at 1.00 s"),
            "{s}"
        );
        assert!(
            s.contains("bump [0x10..0x40]: code cache 0x1000..0x9000"),
            "{s}"
        );
        assert!(s.contains("paused 11.64 ms (3 thread(s))"), "{s}");
        assert!(s.contains("refused avx_loop: vmovdqu"), "{s}");
        assert!(s.contains("7 sample(s)"), "{s}");
        assert_eq!(o.caches(), vec![0x1000..0x9000]);
    }

    #[test]
    fn section_says_why_nothing_was_repaired() {
        let early = Online::ExitedFirst {
            after: Duration::from_millis(300),
        };
        let s = early.section(Duration::from_secs(1), 0);
        assert!(
            s.contains("repaired: nothing (the program exited after 0.30 s"),
            "{s}"
        );
        assert!(early.caches().is_empty());
        let none = Online::NothingFound {
            checks: 3,
            last: Duration::from_secs(3),
        };
        let s = none.section(Duration::from_secs(1), 0);
        assert!(
            s.contains(
                "repaired: nothing (no false sharing at or above the threshold in 3 check(s)"
            ),
            "{s}"
        );
        assert!(none.note().contains("3 check(s)"));
        let failed = Online::Failed {
            at: Duration::from_secs(1),
            error: "boom 42".into(),
        };
        assert!(failed
            .section(Duration::from_secs(1), 0)
            .contains("boom 42"));
        assert!(failed.note().contains("boom 42"));
    }

    /// The check keeps lines by the report's rule: a false-sharing line rated from one or
    /// two events crosses the threshold only if the low end of its rate's interval does.
    #[test]
    fn a_line_crosses_the_threshold_only_as_the_report_would_list_it() {
        use laser_detect::model::findings::{LineFinding, MIN_FINDING_EVENTS};
        let line = |events| LineFinding {
            line_addr: 0x1000,
            line_size: 64,
            kind: Kind::FalseSharing,
            events,
            true_events: 0,
            false_events: events,
            rate_per_s: 5000.0,
            share: 1.0,
            threads: vec![1, 2],
            data: laser_detect::Location::Heap,
            process: None,
            sources: Vec::new(),
            by_code: false,
            front: false,
        };
        let analysis = |f| Analysis {
            backend: laser_driver::BackendKind::Soft,
            duration_s: 1.0,
            samples: 100,
            lost: 0,
            throttles: 0,
            filtered: 0,
            line_size: 64,
            findings: vec![f],
            modules: Vec::new(),
            notes: Vec::new(),
            survey: None,
            concurrency: None,
        };
        // 5,000 ev/s from 2 events: 605 ev/s at the interval's low end.
        assert!(!crossed(&analysis(line(MIN_FINDING_EVENTS - 1)), 1000.0));
        assert!(crossed(&analysis(line(MIN_FINDING_EVENTS - 1)), 600.0));
        assert!(crossed(&analysis(line(MIN_FINDING_EVENTS)), 1000.0));
        assert!(!crossed(&analysis(line(MIN_FINDING_EVENTS)), 6000.0));
    }
}
