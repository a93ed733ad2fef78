//! One function's repair: plan it (refusals come back with the planner's reason), put it
//! into the process with the tracee (retrying while a thread sits where it cannot be moved),
//! and say what happened through the caller's sink.
//!
//! Planning runs twice on purpose: the first run decides (and prints) everything with the
//! target running; the second, inside the pause, only resolves addresses, on a snapshot of the
//! function's bytes taken beforehand, so the pause does not read the target's memory.
//!
//! Undo safety: the tracee keeps one `(old, new)` pc map for both directions. The planner's
//! `pc_map` is right for apply (a thread entering the cache has an empty log) but not for undo
//! (a thread stopped in the cache may hold buffered stores). So the record's map is the
//! planner's `undo_map` reversed (cache pc ← flush stub or original pc) plus those `pc_map`
//! pairs whose cache pc the undo map does not already claim.

use std::time::{Duration, Instant};

use laser_detect::CodeSource as _;
use laser_repair::plan::{
    self, CodeBytes, PlanOptions, PlanRequest, RefusalReason, RepairPlan, SsbMode,
};
use laser_repair::tracee::{
    self, maps as tmaps, ApplyOptions, CacheAddrs, CacheSizes, FnSource, PatchSet, TraceeError,
    UndoOptions,
};

use super::budget::{Budget, MIN_LOSS};
use super::placement::{self, online_cpus};
use super::targets::{Group, Live, Space};
use super::trial::{self, TrialOutcome, Verdict};
use super::{Repaired, Say, Settings};

/// Apply attempts when a thread sits where it cannot be moved (inside the patched bytes at an
/// unmapped pc, or in a restartable syscall there): it moves on within microseconds.
const APPLY_TRIES: usize = 20;

pub enum Outcome {
    Refused(String),
    Failed(anyhow::Error),
}

impl From<anyhow::Error> for Outcome {
    fn from(e: anyhow::Error) -> Self {
        Outcome::Failed(e)
    }
}

/// Tracee errors that mean "cannot repair this here" rather than "laser broke": the target is
/// untouched either way.
pub fn tracee_refusal(e: &TraceeError) -> bool {
    matches!(
        e,
        TraceeError::Seccomp { .. }
            | TraceeError::NoHole { .. }
            | TraceeError::ProcessStopped { .. }
            | TraceeError::UnmappedThread { .. }
            | TraceeError::ThreadInSyscall { .. }
            | TraceeError::ThreadInRetiredCache { .. }
            | TraceeError::PatchMismatch { .. }
    )
}

pub fn repair_group(
    pid: i32,
    space: &Space,
    g: &Group,
    settings: &Settings,
    budget: &mut Budget,
    say: &mut Say<'_>,
) -> Result<Option<Repaired>, Outcome> {
    let (dry_run, min_stores_per_flush) = (settings.dry_run, settings.min_stores_per_flush);
    let opts = PlanOptions {
        min_stores_per_flush,
        // The profitability floor covers the path too: 0 repairs whatever can be rewritten.
        refuse_general_path: min_stores_per_flush > 0.0,
        ..PlanOptions::default()
    };
    let label = match (&g.name, g.function) {
        (Some(n), Some((s, e))) => format!("{n} [{s:#x}..{e:#x}]"),
        (None, Some((s, e))) => format!("function [{s:#x}..{e:#x}]"),
        (_, None) => "unknown function (no ELF symbol: bounded scan)".to_string(),
    };
    let pcs: Vec<String> = g
        .pcs
        .iter()
        .map(|&pc| match space.module_of(pc) {
            Some((m, off)) => format!("{pc:#x} ({}+{off:#x})", m.rsplit('/').next().unwrap_or(&m)),
            None => format!("{pc:#x}"),
        })
        .collect();
    say(&format!("repair {label}: PCs {}", pcs.join(", ")));
    if let Some(span) = g.function {
        let recs = tracee::find_repairs(pid).map_err(|e| Outcome::Failed(e.into()))?;
        if let Some(p) = recs
            .iter()
            .filter(|r| r.state == tracee::RecordState::Active)
            .flat_map(|r| &r.patches)
            .find(|p| span.0 <= p.addr && p.addr < span.1)
        {
            return Err(Outcome::Refused(format!(
                "already repaired (entry patched at {:#x}); run `laser repair -p {pid} --undo` first",
                p.addr
            )));
        }
    }
    // Snapshot of the function: the in-pause re-plan reads this, not the target.
    let snap = g.function.map(|(s, e)| {
        let mut b = vec![0u8; (e - s) as usize];
        let n = space.mem.read_code(s, &mut b);
        b.truncate(n);
        (s, b)
    });
    let live = Live(&space.mem);
    let snap_src = snap.as_ref().map(|(s, b)| CodeBytes { base: *s, bytes: b });
    let src: &dyn plan::CodeSource = match &snap_src {
        Some(c) => c,
        None => &live,
    };
    let span_guess = g.function.unwrap_or((g.pcs[0], g.pcs[0] + 1));
    let sizes0 = CacheSizes {
        code: plan::CODE_RESERVATION as usize,
        data: plan::ssb_layout::data_len(&opts.runtime) as usize,
        record: 0,
    };
    let regions = tmaps::parse_maps(&space.maps_text).map_err(|e| Outcome::Failed(e.into()))?;
    let Some(&hole) = tmaps::hole_candidates(
        &regions,
        &(span_guess.0..span_guess.1),
        CacheAddrs::layout(&sizes0, 0).map_len,
    )
    .first() else {
        return Err(Outcome::Refused(format!(
            "no free address range within ±2 GiB of {:#x}",
            span_guess.0
        )));
    };
    let dummy = CacheAddrs::layout(&sizes0, hole).data_base;
    let t0 = Instant::now();
    let p = plan::plan(&request(src, g, dummy, opts)).map_err(|r| {
        Outcome::Refused(match r.reason {
            RefusalReason::GeneralPath => {
                format!("{}; --min-stores-per-flush 0 repairs it anyway", r.reason)
            }
            reason => reason.to_string(),
        })
    })?;
    let plan_time = t0.elapsed();
    print_plan(&p, plan_time, say);
    let record_room = record_len(&p);
    if dry_run {
        say(&format!("  dry run: process {pid} not touched"));
        return Ok(None);
    }
    if settings.trial.is_some() && !p.region.is_loop {
        // The trial counts loop iterations: straight-line code would be undone unmeasured.
        return Err(Outcome::Refused(
            "the region has no loop, so the trial cannot measure it; --no-trial repairs it \
             unmeasured"
                .to_string(),
        ));
    }
    let n_rounds = settings.trial.map_or(1, |t| t.rounds.max(1));
    if settings.trial.is_some() && !settings.placement_only && !budget.affords_first_round() {
        return Err(Outcome::Refused(budget_refusal(budget)));
    }
    let sizes = CacheSizes {
        record: record_room,
        ..sizes0
    };
    let put = Put {
        pid,
        src,
        g,
        span: p.function.0..p.function.1,
        sizes,
    };
    let mem = tracee::ProcMem::open(pid).map_err(|e| Outcome::Failed(e.into()))?;
    if settings.placement_only {
        let region = p.region.ranges.first().map_or(0, |r| r.0);
        return placement_alone(&put, opts, &mem, settings, budget, label, region, say);
    }
    // The trial: rounds of (count-only window, repaired window), alternating, so that a
    // scheduler placement that lasts a window (both threads on one CPU, a neighbour's burst)
    // falls on both plans; every round must show the gain (`trial::decide_rounds`). Each
    // plan is applied for its window and undone after it, except the repair after the last
    // round that it won.
    let trial_start = Instant::now();
    let mut extra_pauses = Vec::new();
    let mut rounds: Vec<trial::Round> = Vec::new();
    let mut stopped: Option<String> = None;
    let mut kept: Option<(tracee::AppliedRepair, usize, Duration)> = None;
    let mut repair_pause = Duration::ZERO;
    // Every code cache a plan ran in, for the samples taken there (`Summary::caches`).
    let mut trial_caches: Vec<std::ops::Range<u64>> = Vec::new();
    for r in 0..n_rounds {
        if r > 0 && !budget.affords(2, 2, MIN_LOSS) {
            // The holds measured so far were slower than estimated at the start.
            stopped = Some(format!(
                "ended before round {}: its holds (~{:.0} ms) no longer fit the budget",
                r + 1,
                budget.estimate(2, 2, Duration::ZERO).as_secs_f64() * 1e3
            ));
            break;
        }
        let native = match settings.trial {
            Some(t) => {
                let counting = PlanOptions {
                    count_only: true,
                    ..opts
                };
                let (a, _, _) = put.apply(counting, say)?;
                trial_caches.push(a.cache.map_base..a.cache.map_base + a.cache.map_len);
                extra_pauses.push(a.pause.paused);
                budget.charge_hold(&a.pause, true);
                trace_hold(say, "count-only apply", &a.pause);
                let at = trial_start.elapsed();
                let w = trial::measure(&mem, a.cache.data_base, &opts.runtime, t.window, |_| false);
                let u = kill_and_undo(&mem, &a, "the trial's count-only plan")?;
                extra_pauses.push(u.paused);
                budget.charge_hold(&u, false);
                trace_hold(say, "count-only undo", &u);
                Some((at, w))
            }
            None => None,
        };
        if settings.trial.is_some() && !budget.affords(1, 1, MIN_LOSS) {
            stopped = Some(format!(
                "ended before round {}'s repaired window: the repair's holds (~{:.0} ms) no \
                 longer fit the budget",
                r + 1,
                budget.estimate(1, 1, Duration::ZERO).as_secs_f64() * 1e3
            ));
            break;
        }
        let (applied, tries, replan) = put.apply(opts, say)?;
        trial_caches.push(applied.cache.map_base..applied.cache.map_base + applied.cache.map_len);
        if r == 0 {
            repair_pause = applied.pause.paused;
        } else {
            extra_pauses.push(applied.pause.paused);
        }
        let (Some(t), Some((n_at, native))) = (settings.trial, native) else {
            kept = Some((applied, tries, replan));
            break;
        };
        budget.charge_hold(&applied.pause, true);
        trace_hold(say, "repair apply", &applied.pause);
        let r_at = trial_start.elapsed();
        // Whatever it shows, its loss must leave room for the undo and, on a machine where
        // placement can follow a losing store buffer, for the placement trial's holds and a
        // losing pinned window (what the gate reserved for it).
        // (Plus one poll: the loss is seen every `poll_step`, and a 0.7x window that left
        // 5.9 ms of the 6.5 the placement trial needed skipped it.)
        let mut reserve = budget.estimate(0, 1, Duration::ZERO);
        if online_cpus() >= 2 {
            reserve += budget.estimate(1, 1, MIN_LOSS) + trial::poll_step(t.window);
        }
        let repaired = trial::measure(
            &mem,
            applied.cache.data_base,
            &opts.runtime,
            t.window,
            |w| {
                // Not before a fifth of the window (10 ms: a few scheduler ticks).
                (w.elapsed >= t.window / 5 && trial::clearly_losing(&native, w))
                    || budget.must_stop(&native, w, reserve)
            },
        );
        if repaired.elapsed < t.window && budget.must_stop(&native, &repaired, reserve) {
            stopped = Some(format!(
                "round {}'s repaired window ended after {:.0} ms: its loss would overrun the \
                 budget",
                r + 1,
                repaired.elapsed.as_secs_f64() * 1e3
            ));
        }
        budget.charge_loss(&native, &repaired);
        rounds.push(trial::Round {
            native,
            repaired,
            native_at: n_at,
            repaired_at: r_at,
        });
        let won = trial::decide(&native, &repaired, t.margin) == Verdict::Kept;
        if won && r + 1 == n_rounds {
            kept = Some((applied, tries, replan));
        } else {
            let what = if won {
                "the repair between trial rounds"
            } else {
                "a repair that lost its trial"
            };
            let u = kill_and_undo(&mem, &applied, what)?;
            extra_pauses.push(u.paused);
            budget.charge_hold(&u, false);
            trace_hold(say, "repair undo", &u);
        }
        if !won || stopped.is_some() {
            break;
        }
    }
    let trial = settings.trial.map(|t| {
        let mut out = TrialOutcome::from_rounds(
            rounds,
            n_rounds,
            t.margin,
            extra_pauses.clone(),
            trial_start.elapsed(),
        );
        out.stop(stopped.clone());
        out.budget = Some(budget.describe());
        say(&format!(
            "  {}",
            out.line(p.region.ranges.first().map_or(0, |r| r.0))
        ));
        out
    });
    let Some((applied, tries, replan)) = kept else {
        // Undone by its trial: nothing of it is left in the process. The other repair that
        // keeps TSO trivially, one CPU for the threads, gets its own trial.
        if let (Some(t), Some(out)) = (settings.trial, &trial) {
            let afford = budget.affords_placement_trial();
            if out.verdict == Verdict::Undone && online_cpus() >= 2 && !afford {
                say(&format!(
                    "  placement trial not tried: {}",
                    budget.placement_trial_short()
                ));
            }
            if out.verdict == Verdict::Undone && online_cpus() >= 2 && afford {
                let (pout, pin) =
                    put.placement_trial(opts, &mem, &t, budget, say, &mut trial_caches)?;
                let region = p.region.ranges.first().map_or(0, |r| r.0);
                say(&format!("  placement {}", pout.line(region)));
                if let Some(pin) = pin {
                    let what = placement::describe(&pin, &pout, "the store buffer lost its trial");
                    say(&format!("  {what}"));
                    return Ok(Some(Repaired::by_placement(
                        label,
                        pout,
                        Some(what),
                        trial_caches,
                    )));
                }
            }
        }
        return Ok(Some(Repaired {
            label,
            cache: 0..0,
            pause: repair_pause,
            threads_held: 0,
            mode: None,
            trial,
            placement: None,
            trial_caches,
        }));
    };
    // Kept: the placement trial may still beat it (keep whichever measures fastest). On
    // lreg -O0 and linear_regression here the store buffer won at 1.1–1.6x while pinning
    // the untouched loop measured 1.2–2.1x, and only a losing store buffer led to the
    // placement trial. Pinning the repaired loop is no test (0.47–0.78x: the store buffer
    // already removed the contention, pinning only gives up a CPU), so the store buffer
    // goes out, the placement trial runs over the count-only plan as after a loss, and the
    // store buffer comes back unless pinning beat its speedup: four more holds (~3 ms).
    let mut applied = applied;
    if let (Some(t), Some(out)) = (settings.trial, &trial) {
        if out.kept() && online_cpus() >= 2 && budget.affords(2, 2, MIN_LOSS) {
            let region = p.region.ranges.first().map_or(0, |r| r.0);
            let u = kill_and_undo(&mem, &applied, "the store buffer for the placement trial")?;
            budget.charge_hold(&u, false);
            trace_hold(say, "repair undo (placement next)", &u);
            let (mut pout, pin) =
                put.placement_trial(opts, &mem, &t, budget, say, &mut trial_caches)?;
            // Kept by its trial but slower than the store buffer: unpinned now.
            let better = match pin {
                Some(pin) if pout.speedup() > out.speedup() => Some(pin),
                Some(pin) => {
                    pin.undo();
                    // Said as what happened to it: taken out again.
                    pout.verdict = Verdict::Undone;
                    None
                }
                None => None,
            };
            say(&format!(
                "  placement (after the kept store buffer) {}",
                pout.line(region)
            ));
            if let Some(pin) = better {
                let what = placement::describe(
                    &pin,
                    &pout,
                    &format!("faster than the store buffer's {:.2}x", out.speedup()),
                );
                say(&format!("  {what}"));
                return Ok(Some(Repaired::by_placement(
                    label,
                    pout,
                    Some(what),
                    trial_caches,
                )));
            }
            // Placement lost (or won by less): the store buffer goes back in, as measured.
            let (again, _, _) = put.apply(opts, say)?;
            trial_caches.push(again.cache.map_base..again.cache.map_base + again.cache.map_len);
            budget.charge_hold(&again.pause, true);
            trace_hold(say, "repair apply (again)", &again.pause);
            say(&format!(
                "  the store buffer ({:.2}x) goes back in",
                out.speedup()
            ));
            applied = again;
        }
    }
    let c = applied.cache;
    say(&format!(
        "  applied: cache {:#x}..{:#x} (data {:#x}, code {:#x}), {} patch(es), {} thread(s) moved in",
        c.map_base,
        c.map_base + c.map_len,
        c.data_base,
        c.code_base,
        applied.record.patches.len(),
        applied.moved.len()
    ));
    say(&format!(
        "  pause: {:.2} ms ({} thread(s) held{}; re-plan at the cache address {:.2} ms of it), \
         plan {:.2} ms before the pause",
        applied.pause.paused.as_secs_f64() * 1e3,
        applied.pause.threads,
        if tries > 1 {
            format!(", {tries} attempts")
        } else {
            String::new()
        },
        replan.as_secs_f64() * 1e3,
        plan_time.as_secs_f64() * 1e3
    ));
    if trial.is_none() {
        // The runtime probes CPUID when the first thread claims a slot: give it a moment.
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut w = [0u8; 8];
    let mode = (space
        .mem
        .read_code(c.data_base + plan::ssb_layout::MODE_OFF, &mut w)
        == 8)
        .then(|| SsbMode::from_word(u64::from_le_bytes(w)));
    say(&format!("  {}", ssb_mode_line(mode)));
    Ok(Some(Repaired {
        label,
        cache: c.map_base..c.map_base + c.map_len,
        pause: applied.pause.paused,
        threads_held: applied.pause.threads,
        mode,
        trial,
        placement: None,
        trial_caches,
    }))
}

/// The placement trial alone (`Settings::placement_only`): `run --repair` tries it while the
/// store buffer's trial (six holds and two losing windows) does not fit its budget yet, and
/// this one (two holds and one losing window) does. Phoenix linear_regression -O0 here: the
/// full trial fits from a process age of ~1 s of a ~1.8 s run, placement is the repair that
/// pays (1.3–1.6x), and waiting for the full trial left it ~14% of the padding gain.
#[allow(clippy::too_many_arguments)]
fn placement_alone(
    put: &Put<'_>,
    opts: PlanOptions,
    mem: &tracee::ProcMem,
    settings: &Settings,
    budget: &mut Budget,
    label: String,
    region: u64,
    say: &mut Say<'_>,
) -> Result<Option<Repaired>, Outcome> {
    let Some(t) = settings.trial else {
        return Err(Outcome::Refused(
            "placement alone is decided by a trial; --no-trial has none".to_string(),
        ));
    };
    if online_cpus() < 2 {
        return Err(Outcome::Refused(
            "one CPU online: there is no placement to try".to_string(),
        ));
    }
    if !budget.affords_placement_trial() {
        return Err(Outcome::Refused(format!(
            "the placement trial: {}",
            budget.placement_trial_short()
        )));
    }
    let mut trial_caches = Vec::new();
    let (pout, pin) = put.placement_trial(opts, mem, &t, budget, say, &mut trial_caches)?;
    say(&format!(
        "  placement (alone: the store buffer's trial does not fit its budget yet) {}",
        pout.line(region)
    ));
    let pinned = pin.map(|pin| {
        let why = "the store buffer's trial did not fit its budget yet";
        let what = placement::describe(&pin, &pout, why);
        say(&format!("  {what}"));
        what
    });
    Ok(Some(Repaired::by_placement(
        label,
        pout,
        pinned,
        trial_caches,
    )))
}

/// Why a trial does not start: its first round's holds do not fit the budget (`budget.rs`).
fn budget_refusal(b: &Budget) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!(
        "the trial's first round and the placement trial after it (6 holds of the target, ~{:.0} \
         ms with a losing window each) would cost more than its budget ({:.1} ms left{}); --trial-budget 0 lifts the limit",
        ms(b.first_round_need()),
        ms(b.left()),
        match b.first_round_age() {
            Some(age) => format!(
                "; the process has run {:.2} s, the trial fits from {:.2} s",
                b.age.as_secs_f64(),
                age.as_secs_f64()
            ),
            None => String::new(),
        },
    )
}

/// What `tracee::apply` needs besides the plan options, so the trial's count-only plan and
/// the repair go in the same way.
struct Put<'a> {
    pid: i32,
    src: &'a dyn plan::CodeSource,
    g: &'a Group,
    span: std::ops::Range<u64>,
    sizes: CacheSizes,
}

fn request<'a>(
    src: &'a dyn plan::CodeSource,
    g: &'a Group,
    cache_addr: u64,
    options: PlanOptions,
) -> PlanRequest<'a> {
    PlanRequest {
        code: src,
        function: g.function,
        contending_pcs: &g.pcs,
        cache_addr,
        options,
    }
}

impl Put<'_> {
    /// Where `tracee::apply` will most likely map the cache: the first hole it tries, from
    /// the maps as they are now.
    fn likely_cache(&self) -> Option<CacheAddrs> {
        let text = std::fs::read_to_string(format!("/proc/{}/maps", self.pid)).ok()?;
        let regions = tmaps::parse_maps(&text).ok()?;
        let len = CacheAddrs::layout(&self.sizes, 0).map_len;
        let base = *tmaps::hole_candidates(&regions, &self.span, len).first()?;
        Some(CacheAddrs::layout(&self.sizes, base))
    }

    /// The placement trial (every thread on one CPU, see `placement`), measured over the
    /// count-only plan put in for it and taken out after; holds charged to `budget`. A pinning
    /// its rounds kept is undone if the count-only plan cannot be taken out.
    fn placement_trial(
        &self,
        opts: PlanOptions,
        mem: &tracee::ProcMem,
        t: &trial::TrialSettings,
        budget: &mut Budget,
        say: &mut Say<'_>,
        trial_caches: &mut Vec<std::ops::Range<u64>>,
    ) -> Result<(TrialOutcome, Option<placement::Pinning>), Outcome> {
        let counting = PlanOptions {
            count_only: true,
            ..opts
        };
        let (a, _, _) = self.apply(counting, say)?;
        trial_caches.push(a.cache.map_base..a.cache.map_base + a.cache.map_len);
        budget.charge_hold(&a.pause, true);
        trace_hold(say, "placement count-only apply", &a.pause);
        let (mut pout, pin) =
            placement::trial_rounds(self.pid, mem, a.cache.data_base, &opts.runtime, t, budget);
        let u = match kill_and_undo(mem, &a, "the placement trial's count-only plan") {
            Ok(u) => u,
            Err(e) => {
                if let Some(pin) = &pin {
                    pin.undo();
                }
                return Err(e);
            }
        };
        budget.charge_hold(&u, false);
        trace_hold(say, "placement count-only undo", &u);
        pout.budget = Some(budget.describe());
        Ok((pout, pin))
    }

    /// Applies the plan with `options`, re-planned inside the pause at the real cache
    /// address; retries while a thread sits where it cannot be moved. Returns the repair,
    /// the attempts and the in-pause re-plan time.
    fn apply(
        &self,
        options: PlanOptions,
        say: &mut Say<'_>,
    ) -> Result<(tracee::AppliedRepair, usize, Duration), Outcome> {
        let pid = self.pid;
        let replan = std::cell::Cell::new(Duration::ZERO);
        let plan_at = |c: &CacheAddrs| -> Result<PatchSet, String> {
            let q = plan::plan(&request(self.src, self.g, c.data_base, options))
                .map_err(|r| r.to_string())?;
            if q.cache.code_addr != c.code_base || q.cache.data_len > c.data_len as u64 {
                return Err(format!(
                    "plan puts code at {:#x} after {} data bytes; the cache has code at {:#x} after {}",
                    q.cache.code_addr, q.cache.data_len, c.code_base, c.data_len
                ));
            }
            Ok(patch_set(&q))
        };
        // Planned before the hold at the address the hold will most likely map (the first
        // hole the tracee tries): the hold then only compares addresses (a plan of the
        // -O0 linear_regression loop took 2.9 ms of an 11 ms hold).
        let ahead = self
            .likely_cache()
            .and_then(|c| Some((c.data_base, plan_at(&c).ok()?)));
        let build = |c: &CacheAddrs| -> Result<PatchSet, String> {
            let t = Instant::now();
            let q = match &ahead {
                Some((base, set)) if *base == c.data_base => Ok(set.clone()),
                _ => plan_at(c),
            };
            replan.set(t.elapsed());
            q
        };
        let source = FnSource {
            span: self.span.clone(),
            sizes: self.sizes,
            build,
        };
        let mut tries = 0;
        loop {
            tries += 1;
            // The trial undoes a plan and applies the next one at once (see the option).
            let opts = ApplyOptions {
                wait_for_retired: true,
                ..ApplyOptions::default()
            };
            match tracee::apply(pid, &source, &opts) {
                Ok(a) => return Ok((a, tries, replan.get())),
                Err(
                    e @ (TraceeError::UnmappedThread { .. }
                    | TraceeError::ThreadInSyscall { .. }
                    | TraceeError::ThreadInRetiredCache { .. }),
                ) if tries < APPLY_TRIES => {
                    say(&format!("  {e}; retrying"));
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) if tracee_refusal(&e) => return Err(Outcome::Refused(e.to_string())),
                Err(e) => {
                    return Err(Outcome::Failed(
                        anyhow::Error::new(e).context(format!("repairing process {pid}")),
                    ))
                }
            }
        }
    }
}

/// The tracee's patch set for a plan placed at its cache.
pub fn patch_set(p: &RepairPlan) -> PatchSet {
    PatchSet {
        code: p.cache.code.clone(),
        data: Vec::new(),
        patches: p
            .patches
            .iter()
            .map(|q| tracee::Patch {
                addr: q.addr,
                old_bytes: q.old_bytes.clone(),
                new_bytes: q.new_bytes.clone(),
            })
            .collect(),
        pc_map: record_pc_map(p),
    }
}

/// `(old, new)` pairs for the tracee (see the module docs): undo safe points first, then the
/// apply entries for cache pcs they leave free. New pcs stay unique, as the tracee requires.
pub fn record_pc_map(p: &RepairPlan) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &(cache_pc, to) in &p.undo_map {
        if !out.iter().any(|&(_, n)| n == cache_pc) {
            out.push((to, cache_pc));
        }
    }
    for &(old, new) in &p.pc_map {
        if !out.iter().any(|&(_, n)| n == new) {
            out.push((old, new));
        }
    }
    out
}

/// Bytes of the undo record for this plan (tracee `record` layout), with slack for the
/// re-plan at the real address.
pub fn record_len(p: &RepairPlan) -> usize {
    let patches: usize = p.patches.iter().map(|q| 16 + 2 * q.old_bytes.len()).sum();
    let n = 96 + patches + 16 * record_pc_map(p).len();
    n + n / 4 + 1024
}

fn print_plan(p: &RepairPlan, took: Duration, say: &mut Say<'_>) {
    let r = &p.region;
    let ranges: Vec<String> = r
        .ranges
        .iter()
        .map(|(s, e)| format!("{s:#x}..{e:#x}"))
        .collect();
    say(&format!(
        "  region: {} ({}), {} stores, {} loads, {} flush points, ~{:.1} stores per flush",
        ranges.join(" "),
        if r.is_loop { "loop" } else { "no loop" },
        r.stores,
        r.loads,
        r.flush_points,
        r.estimated_stores_per_flush
    ));
    for q in &p.patches {
        say(&format!(
            "  entry patch at {:#x}: {} bytes",
            q.addr,
            q.old_bytes.len()
        ));
    }
    say(&format!(
        "  code cache: {} data + {} code bytes; {}; planned in {:.2} ms",
        p.cache.data_len,
        p.cache.code.len(),
        match p.state_register {
            Some(reg) => format!("inline fast path, SSB state in {reg:?}"),
            None => "every access through a helper (no free register)".to_string(),
        } + &match p.fixed_locations {
            0 => "; general path (store addresses vary: per-access log lookups)".to_string(),
            n => format!("; fixed-address path ({n} store location(s) with their own slots)"),
        },
        took.as_secs_f64() * 1e3
    ));
}

fn cpu_has_rtm() -> bool {
    // CPUID leaf 7 subleaf 0, EBX bit 11 = RTM.
    std::arch::x86_64::__cpuid_count(7, 0).ebx & (1 << 11) != 0
}

/// Which SSB flush path runs: from the runtime's mode word when known, else from CPUID here.
pub fn ssb_mode_line(mode: Option<SsbMode>) -> String {
    let cpu = if cpu_has_rtm() {
        "this CPU has RTM"
    } else {
        "RTM is absent on this CPU"
    };
    match mode {
        Some(SsbMode::Fifo) => format!("SSB mode in use: FIFO log ({cpu})"),
        Some(SsbMode::Rtm) => format!("SSB mode in use: RTM coalescing buffer ({cpu})"),
        _ if cpu_has_rtm() => {
            format!(
                "SSB mode: RTM coalescing buffer with FIFO fallback ({cpu}; chosen at run time)"
            )
        }
        _ => format!("SSB mode: FIFO log ({cpu})"),
    }
}

/// Sets the cache's kill switch, then undoes the repair; returns the undo's pause. Threads
/// leave for the native copy within one flush period, whose pcs all map straight back to the
/// original code, so the undo finds its safe point in one hold.
fn kill_and_undo(
    mem: &tracee::ProcMem,
    applied: &tracee::AppliedRepair,
    what: &str,
) -> Result<tracee::PauseStats, Outcome> {
    trial::kill(mem, applied.cache.data_base).map_err(|e| Outcome::Failed(e.into()))?;
    // Threads reach the native copy within one flush period (256 back-edges, microseconds);
    // holding at once found some still in the repaired copy, and every retry is another
    // hold (an undo took 2 holds and 5–54 ms here).
    std::thread::sleep(Duration::from_millis(1));
    let u = applied
        .undo(&UndoOptions::default())
        .map_err(|e| Outcome::Failed(anyhow::Error::new(e).context(format!("undoing {what}"))))?;
    Ok(u.pause)
}

/// With `LASER_TRACE_HOLDS` set: one line per hold of the trial, by phase (what issue 15
/// measured the holds with).
fn trace_hold(say: &mut Say<'_>, what: &str, p: &tracee::PauseStats) {
    if std::env::var_os("LASER_TRACE_HOLDS").is_some() {
        say(&format!(
            "  hold: {what} {:.2} ms in {} hold(s), {} thread(s): {}",
            p.paused.as_secs_f64() * 1e3,
            p.holds,
            p.threads,
            p.phases_line()
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// gcc -O2 `for (i = 0; i < n; i++) (*p)++;` on a volatile long (the CLI tests' `bump`).
    const BUMP: [u8; 36] = [
        0x48, 0x85, 0xf6, 0x7e, 0x1e, 0x31, 0xd2, 0x66, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x48, 0x8b, 0x07, 0x48, 0x83, 0xc2, 0x01, 0x48, 0x83, 0xc0, 0x01, 0x48, 0x89, 0x07,
        0x48, 0x39, 0xd6, 0x75, 0xed, 0xc3,
    ];
    const BASE: u64 = 0x40_1000;
    const STORE: u64 = BASE + 0x1b;

    fn plan_bump(inline_fast_path: bool) -> RepairPlan {
        let code = CodeBytes {
            base: BASE,
            bytes: &BUMP,
        };
        let options = PlanOptions {
            inline_fast_path,
            ..PlanOptions::default()
        };
        plan::plan(&PlanRequest {
            code: &code,
            function: Some((BASE, BASE + BUMP.len() as u64)),
            contending_pcs: &[STORE],
            cache_addr: 0x4000_0000,
            options,
        })
        .expect("bump plans")
    }

    /// Undo must send a thread at a sequence start through its flush stub (its log may hold
    /// stores), never straight back to the original instruction; apply keeps the moves the
    /// undo map leaves room for; new pcs stay unique (the tracee validates that).
    #[test]
    fn record_map_prefers_undo_safe_points() {
        for fast in [true, false] {
            let p = plan_bump(fast);
            let m = record_pc_map(&p);
            let mut news: Vec<u64> = m.iter().map(|&(_, n)| n).collect();
            news.sort_unstable();
            news.dedup();
            assert_eq!(news.len(), m.len(), "fast {fast}: new pcs unique");
            for &(cache_pc, to) in &p.undo_map {
                assert_eq!(
                    m.iter().find(|&&(_, n)| n == cache_pc),
                    Some(&(to, cache_pc)),
                    "fast {fast}: undo at {cache_pc:#x}"
                );
            }
            for &(old, new) in &p.pc_map {
                let claimed = p.undo_map.iter().any(|&(c, _)| c == new);
                if !claimed {
                    assert!(m.contains(&(old, new)), "fast {fast}: apply move {old:#x}");
                }
            }
            if fast {
                // Trampolines: the apply move and the undo move are the same pair.
                assert!(p.pc_map.iter().all(|pair| m.contains(pair)));
            }
            assert!(record_len(&p) > 96 + 16 * m.len());
        }
    }

    #[test]
    fn patch_set_carries_the_plan() {
        let p = plan_bump(true);
        let s = patch_set(&p);
        assert_eq!(s.code, p.cache.code);
        assert_eq!(s.patches.len(), p.patches.len());
        assert_eq!(s.patches[0].addr, p.patches[0].addr);
        assert_eq!(s.patches[0].old_bytes, p.patches[0].old_bytes);
        assert!(s.data.is_empty(), "the runtime's data starts zeroed");
    }
}
