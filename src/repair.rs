//! Repair of false sharing in a running process, for three callers:
//!
//! - `laser repair -p PID --pc ADDR… | --from report.json [--dry-run]`, `--undo`;
//! - `laser attach -p PID --repair`: monitor, report, then repair the report's false-sharing
//!   sources (this module's [`repair_report`], on the in-memory report);
//! - `laser run --repair -- prog`: the same, once, in the child laser launched, as soon as a
//!   false-sharing line reaches the threshold (checked every `--repair-after`), while the
//!   monitoring session keeps running (`online.rs`, called from `commands::run`).
//!
//! `attach --repair` monitors for `--duration` (default 2 s, `cli::ATTACH_REPAIR_DURATION`),
//! prints the report, detaches the perf session, then repairs. `run --repair` keeps its perf
//! session open across the repair: the child is laser's own forked (not traced) process, which
//! the tracee seizes like any other; inherited per-CPU events keep sampling through and after
//! the hold. Samples in the code cache are in no ELF file: they are counted, not analysed.
//!
//! ```text
//!  PCs (given, or report module+offset + load bias from /proc/PID/maps)
//!    └─ grouped by enclosing ELF function ─▶ plan at a dummy cache address (refusal: reason
//!       printed, function untouched) ─▶ tracee::apply, re-planning at the real cache address
//!       inside the hold (group.rs)
//! ```
//!
//! Trial (default; `--no-trial` skips it, `--trial-ms` sets its windows): before a repair
//! stays, a count-only plan of the same region and then the repair each run for one window
//! and the loop's iteration rates are compared (`trial.rs`); a repair not faster than native
//! by 5% is killed and undone, and the output says `trial: region … undone`.
//!
//! Outcomes and exit codes (the same for `laser repair` and `laser attach --repair`):
//! nothing to repair, or every repair undone by its trial → 0 (says so); everything asked
//! for repaired → 0; at least one function
//! refused → [`exit::REPAIR_REFUSED`] (4; the others may be repaired, the output says which);
//! a failure (laser's own error: the tracee guards restored the failing function, functions
//! repaired before it stay repaired) → [`exit::FAILED`] (1). `laser run --repair` reports
//! the same outcomes in its "repaired:" section and exits with the program's status.

use std::ops::Range;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use laser_detect::Report;
use laser_repair::plan::SsbMode;
use laser_repair::tracee::{self, UndoOptions};

pub mod budget;
mod group;
pub mod online;
pub mod placement;
mod targets;
pub mod trial;

use group::{repair_group, ssb_mode_line, Outcome};
use targets::{from_report, group_pcs, Group, Space};

pub use trial::{TrialOutcome, TrialSettings};

use crate::cli::RepairArgs;
use crate::exit;

/// Where a repair's progress lines go: stdout for `laser repair` and `attach --repair`;
/// stderr during `run --repair`, whose stdout is the program's.
pub type Say<'a> = dyn FnMut(&str) + 'a;

/// How to repair.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Plan and print, but do not touch the process.
    pub dry_run: bool,
    /// The planner's profitability floor (`--min-stores-per-flush`).
    pub min_stores_per_flush: f64,
    /// Measure the repair against native speed and keep it only if it is faster
    /// (`trial.rs`); `None` (`--no-trial`) keeps it unmeasured.
    pub trial: Option<TrialSettings>,
    /// Try placement alone (`placement.rs`), no store buffer: `run --repair` does so while
    /// the store buffer's trial does not fit its budget yet but the placement trial's does.
    pub placement_only: bool,
    /// Budget this run's trials have spent already (an early placement trial): charged
    /// before the pass, so all trials of a run together stay within one budget.
    pub spent_before: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            dry_run: false,
            min_stores_per_flush: 4.0,
            trial: Some(TrialSettings::default()),
            placement_only: false,
            spent_before: Duration::ZERO,
        }
    }
}

/// One function put into the process.
#[derive(Clone, Debug)]
pub struct Repaired {
    /// `name [start..end]`, as printed.
    pub label: String,
    /// The code cache mapping (samples here are in repaired code, not in any ELF file).
    pub cache: Range<u64>,
    /// How long the target was held.
    pub pause: Duration,
    pub threads_held: usize,
    /// The SSB flush path the runtime reported, if it had started.
    pub mode: Option<SsbMode>,
    /// What the trial measured and decided (`None`: `--no-trial`).
    pub trial: Option<TrialOutcome>,
    /// The placement repair kept instead of the store buffer (`placement.rs`): what it did.
    pub placement: Option<String>,
    /// Every code cache a plan of this repair ran in: the trial's count-only windows, earlier
    /// rounds, a lost repair, and the kept repair's own `cache`. Samples taken in one arrive
    /// after it may be gone (`Summary::caches`).
    pub trial_caches: Vec<Range<u64>>,
}

impl Repaired {
    /// A function whose repair in the end is placement's trial alone: no code cache is left
    /// in the target (the trials' count-only copies are gone); its threads are pinned as
    /// `placement` says, or (`None`, the trial lost) left as they were.
    pub fn by_placement(
        label: String,
        trial: TrialOutcome,
        placement: Option<String>,
        trial_caches: Vec<Range<u64>>,
    ) -> Repaired {
        Repaired {
            label,
            cache: 0..0,
            pause: Duration::ZERO,
            threads_held: 0,
            mode: None,
            trial: Some(trial),
            placement,
            trial_caches,
        }
    }
}

/// What a repair pass did.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Functions the request named (0: nothing to repair).
    pub functions: usize,
    pub repaired: Vec<Repaired>,
    /// Put in, measured slower than native (or not measured) by the trial, taken out again.
    pub undone: Vec<Repaired>,
    /// `(function, reason)`: left untouched.
    pub refused: Vec<(String, String)>,
    /// What the pass's trials charged to their budget (holds and losing windows), with
    /// `Settings::spent_before`.
    pub spent: Duration,
}

impl Summary {
    /// 0 unless something was refused (see the module docs).
    pub fn exit_code(&self) -> i32 {
        if self.refused.is_empty() {
            exit::OK
        } else {
            exit::REPAIR_REFUSED
        }
    }

    /// Code cache ranges of every plan put in, kept or undone, trial windows included: the
    /// samples taken in a cache that was then undone are read after it is gone, and are no
    /// more program code than those of a kept one (they showed as "undecodable").
    pub fn caches(&self) -> Vec<Range<u64>> {
        let all = self.repaired.iter().chain(&self.undone);
        let mut out: Vec<Range<u64>> = all
            .flat_map(|r| std::iter::once(r.cache.clone()).chain(r.trial_caches.iter().cloned()))
            .filter(|c| !c.is_empty())
            .collect();
        out.sort_by_key(|c| (c.start, c.end));
        out.dedup();
        out
    }
}

/// `laser repair`.
pub fn run(a: RepairArgs) -> Result<i32> {
    let pid = a.pid;
    check_pid(pid)?;
    if a.undo {
        return undo(pid);
    }
    let settings = Settings {
        dry_run: a.dry_run,
        min_stores_per_flush: a.min_stores_per_flush,
        trial: a.trial.settings(),
        ..Settings::default()
    };
    let mut say = |l: &str| println!("{l}");
    let summary = if let Some(path) = &a.from {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading report {}", path.display()))?;
        let report =
            Report::from_json(&text).with_context(|| format!("parsing {}", path.display()))?;
        repair_report(pid, &report, &settings, &mut say)?
    } else {
        let space = Space::read(pid)?;
        let groups = group_pcs(&a.pc, &space, |_| None);
        repair_groups(&space, &groups, &settings, &mut say)?
    };
    Ok(summary.exit_code())
}

fn check_pid(pid: i32) -> Result<()> {
    if pid <= 0 || !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        bail!("process {pid} does not exist");
    }
    Ok(())
}

/// Repairs the sources of `report`'s false-sharing findings (those it holds: already at or
/// above its threshold) in process `pid`, as `laser repair --from` does with the JSON form.
pub fn repair_report(
    pid: i32,
    report: &Report,
    settings: &Settings,
    say: &mut Say<'_>,
) -> Result<Summary> {
    check_pid(pid)?;
    let space = Space::read(pid)?;
    let groups = from_report(report, &space, say)?;
    repair_groups(&space, &groups, settings, say)
}

fn repair_groups(
    space: &Space,
    groups: &[Group],
    settings: &Settings,
    say: &mut Say<'_>,
) -> Result<Summary> {
    let pid = space.pid;
    let mut summary = Summary {
        functions: groups.len(),
        ..Summary::default()
    };
    if groups.is_empty() {
        say(&format!("nothing to repair in process {pid}"));
        return Ok(summary);
    }
    say(&ssb_mode_line(None));
    // One budget for the pass: every group's trial is charged to it.
    let mut budget = budget::Budget::for_pid(pid, settings.trial.and_then(|t| t.budget));
    budget.charge_earlier(settings.spent_before);
    for g in groups {
        match repair_group(pid, space, g, settings, &mut budget, say) {
            Ok(Some(r)) if r.trial.as_ref().is_some_and(|t| !t.kept()) => summary.undone.push(r),
            Ok(Some(r)) => summary.repaired.push(r),
            Ok(None) => {}
            Err(Outcome::Refused(why)) => {
                say(&format!("  refused: {why}; function left untouched"));
                let name = g.name.clone().unwrap_or_else(|| format!("{:#x}", g.pcs[0]));
                summary.refused.push((name, why));
            }
            Err(Outcome::Failed(e)) => {
                if !summary.repaired.is_empty() {
                    say(&format!(
                        "  failed; {} function(s) repaired before this one stay repaired",
                        summary.repaired.len()
                    ));
                }
                return Err(e);
            }
        }
    }
    if !summary.refused.is_empty() {
        eprintln!(
            "laser: {} of {} repair(s) refused (see above)",
            summary.refused.len(),
            groups.len()
        );
    }
    summary.spent = budget.spent();
    Ok(summary)
}

fn undo(pid: i32) -> Result<i32> {
    if let Some(cpu) = placement::pinned_cpu(pid) {
        let n = placement::unpin_all(pid);
        println!(
            "gave {n} thread(s) every CPU again (all were pinned to CPU {cpu}: a placement repair)"
        );
    }
    let opts = UndoOptions::default();
    let reports = tracee::undo(pid, &opts).with_context(|| format!("undoing repairs in {pid}"))?;
    if reports.is_empty() {
        println!("no laser repairs in process {pid}");
        return Ok(exit::OK);
    }
    let mut left = 0;
    for r in &reports {
        println!(
            "undid cache {:#x}: {} patch(es) restored, {} thread(s) moved out, {}",
            r.map_base,
            r.restored_patches,
            r.moved.len(),
            if r.unmapped {
                "unmapped".to_string()
            } else {
                format!(
                    "kept retired ({} thread(s) still refer to it)",
                    r.threads_left_in_cache
                )
            },
        );
        left += usize::from(!r.unmapped);
    }
    let p = reports[0].pause;
    println!(
        "pause: {:.2} ms in {} hold(s) (waiting for threads at safe points between them), longest {:.2} ms",
        p.paused.as_secs_f64() * 1e3,
        p.holds,
        p.longest.as_secs_f64() * 1e3
    );
    // Threads moved to a flush stub leave the cache within microseconds; collect it then. A
    // dead register still holding the SSB state pointer (the fast path's r11) keeps it until
    // the program overwrites it: a few tries only, each one is a hold of the target.
    for _ in 0..3 {
        if left == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        let again = tracee::undo(pid, &opts)?;
        left = again.iter().filter(|r| !r.unmapped).count();
    }
    if left > 0 {
        println!(
            "{left} cache(s) kept retired: a later `laser repair -p {pid} --undo` unmaps them"
        );
    }
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_code_is_refused_only_when_something_was_refused() {
        let mut s = Summary::default();
        assert_eq!(s.exit_code(), exit::OK, "nothing to repair");
        s.functions = 2;
        s.repaired.push(Repaired {
            label: "f".into(),
            cache: 0x1000..0x2000,
            pause: Duration::from_millis(3),
            threads_held: 2,
            mode: None,
            trial: None,
            placement: None,
            trial_caches: Vec::new(),
        });
        assert_eq!(s.exit_code(), exit::OK, "repaired");
        assert_eq!(s.caches(), vec![0x1000..0x2000]);
        // An undone repair's cache still holds samples its trial took: skipped too.
        let mut undone = s.repaired[0].clone();
        undone.cache = 0..0;
        undone.trial_caches = vec![0x3000..0x4000, 0x5000..0x6000];
        s.undone.push(undone);
        assert_eq!(
            s.caches(),
            vec![0x1000..0x2000, 0x3000..0x4000, 0x5000..0x6000]
        );
        s.undone.clear();
        s.refused.push(("g".into(), "vmovdqu".into()));
        assert_eq!(s.exit_code(), exit::REPAIR_REFUSED, "one of two refused");
    }
}
