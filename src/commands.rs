//! One function per subcommand. Each returns the process exit code.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use laser_driver::{Config, Session};

use crate::alloc_history::{History, HistoryTarget};
use crate::alloc_shim::AllocShim;
use crate::cli::{AttachArgs, MonitorArgs, RecordArgs, ReportArgs, RunArgs};
use crate::live_heap::LiveHeap;
use crate::monitor::{self, LoopOptions};
use crate::recording::{self, Recorder};
use crate::repair::{self, online::Online};
use crate::{analyze, backend, exit, gate};

/// Whether to name heap lines by their malloc blocks while the target runs. On by default;
/// `LASER_HEAP_BLOCKS=0` turns it off (to measure what it costs).
fn heap_naming() -> bool {
    std::env::var("LASER_HEAP_BLOCKS").map_or(true, |v| v != "0")
}

/// Whether `laser run` preloads its allocation recorder: `--alloc-sites`, or
/// `LASER_ALLOC_SITES=1` (off by default: it costs allocation-heavy programs more than the
/// detection overhead goal allows; `LASER_ALLOC_SITES=0` keeps it off even with the flag).
fn alloc_sites_enabled(flag: bool) -> bool {
    match std::env::var_os("LASER_ALLOC_SITES") {
        Some(v) if v == "0" => false,
        Some(v) if v == "1" => true,
        _ => flag,
    }
}

/// The heap blocks for the report, or `None` with a note saying why there are none.
fn heap_blocks(
    heap: Option<&mut LiveHeap>,
    analysis: &mut laser_detect::Analysis,
) -> Option<laser_detect::naming::heap_names::HeapBlocks> {
    let heap = heap?;
    let (bytes, spent) = heap.cost();
    if bytes > 0 {
        analysis.notes.push(format!(
            "heap blocks: read {} KiB of the target's heap, {:.1} ms in all, to name heap lines",
            bytes.div_ceil(1024),
            spent.as_secs_f64() * 1e3
        ));
    }
    match heap.finish() {
        Ok(h) => Some(h),
        Err(note) => {
            analysis.notes.push(note);
            None
        }
    }
}

fn session_config(m: &MonitorArgs) -> Result<Config> {
    let backend = backend::choose(m.backend)?;
    let mut config = Config {
        backend,
        watch: m.watch,
        sample_cpus: m.sample_cpus,
        ..Config::default()
    };
    guard_watch(&mut config);
    if let Some(f) = m.freq {
        anyhow::ensure!(f > 0, "--freq must be positive");
        config.frequency = f;
    }
    let d = config.duty_cycle;
    config.duty_cycle = laser_driver::DutyCycle {
        calibrate: d.calibrate,
        model: m.watch_cost_model,
        ..laser_driver::DutyCycle::new(d.window, m.watch_budget / 100.0, d.hit_cost)
    };
    Ok(config)
}

/// Names the trap guard in a config that watches (`laser_driver::trap_guard`); if it cannot
/// be made, turns the watch off: unguarded windows can kill the program.
fn guard_watch(config: &mut Config) {
    if !(config.watch || config.backend == laser_driver::BackendKind::Watch) {
        return;
    }
    match crate::trap_guard_exe::path() {
        Ok(p) => config.trap_guard = Some(p),
        Err(e) => {
            eprintln!("laser: warning: watch windows off: the trap guard cannot start ({e})");
            config.watch = false;
        }
    }
}

/// `repair`, with the trap guard let go of the threads meanwhile: the repair traces them
/// itself, and a thread has one tracer. Windows wait for the new guard after.
fn repair_unguarded<T>(session: &mut Session, repair: impl FnOnce() -> T) -> T {
    session.release_guard();
    let out = repair();
    session.restore_guard();
    out
}

/// How a launch's timer samples were taken (soft backend): the report says so, since the two
/// ways differ in what they cost (`--sample-cpus`) and in what they need.
fn sampling_note(session: &Session, config: &Config) -> Option<String> {
    if config.backend != laser_driver::BackendKind::Soft {
        return None;
    }
    let hz = config.frequency;
    Some(if let Some((lo, hi)) = session.whole_cpu_hz() {
        format!(
            "sampling: whole CPUs at {lo}-{hi} Hz (each CPU at its own rate, so their timers \
             keep no common phase), other processes' samples dropped as read ({} dropped); \
             `--sample-cpus=false` gives every thread its own timer",
            session.stats().foreign
        )
    } else if config.sample_cpus {
        format!(
            "sampling: one timer per thread at {hz} Hz (whole-CPU events need root or \
             perf_event_paranoid <= 0; a thread's own timer restarts at every context switch, \
             which costs programs that switch often)"
        )
    } else {
        format!("sampling: one timer per thread at {hz} Hz (--sample-cpus=false)")
    })
}

/// `laser run`: launch, monitor, report; exit with the program's status. With `--repair`,
/// the monitoring pauses every `--repair-after` to check the rates, until one check finds
/// false sharing at or above the threshold and repairs it (once; `repair::online`).
pub fn run(args: RunArgs) -> Result<i32> {
    let start = Instant::now();
    let precedence = monitor::launch_precedence();
    let mut config = session_config(&args.monitor)?;
    // Allocation sites need the recorder in the program, and heap naming to ask for them.
    let mut shim = None;
    let history_target = match (&args.history_site, &args.history_type) {
        (Some(s), _) => Some((format!("allocated at {s}"), HistoryTarget::parse_site(s)?)),
        (None, Some(t)) => Some((
            format!("of type {t} (allocations of its size)"),
            HistoryTarget::Type { name: t.clone() },
        )),
        (None, None) => None,
    };
    let history_filter = match (&history_target, args.command.first()) {
        (Some((_, t)), Some(program)) => {
            let path =
                laser_driver::launch::resolve_program(program, std::env::var_os("PATH").as_deref())
                    .map_err(|searched| anyhow::anyhow!("{program:?} not found ({searched})"))?;
            // The watchpoints follow the object, not the detector's candidates; its hits
            // are what the user asked for, so the trap budget is generous.
            config.watch = true;
            guard_watch(&mut config);
            config.duty_cycle = laser_driver::DutyCycle {
                max_hits_per_window: u64::MAX / 4,
                max_slowdown: 100.0,
                ..config.duty_cycle
            };
            Some(t.filter(&path)?)
        }
        _ => None,
    };
    if (heap_naming() && alloc_sites_enabled(args.alloc_sites)) || history_filter.is_some() {
        let (s, setup) = AllocShim::prepare(history_filter.as_ref())?;
        config.child = setup;
        shim = Some(s);
    }
    let mut session = Session::launch(&args.command, &config)?;
    drop(precedence);
    let elf = analyze::warm_up(args.command.first().map(|p| p.as_os_str()));
    if let Some(s) = shim.as_mut() {
        s.launched();
    }
    let mut recorder = match &args.output {
        Some(p) => Some(Recorder::create(p, &session.header_info())?),
        None => None,
    };
    let mut detector = analyze::detector_with(&args.analysis, None, elf);
    let mut heap = (heap_naming() || history_target.is_some())
        .then(|| LiveHeap::new(session.pid(), args.analysis.line).with_shim(shim.take()));
    let mut history =
        history_target.map(|(s, _)| History::new(s, args.history_objects, session.pid()));
    let mut opts = LoopOptions {
        duration: args.repair.then_some(args.repair_after),
        stop_on_interrupt: false,
        steer_watchpoints: config.watch && history.is_none(),
        skip_pcs: Vec::new(),
        forced_watch: monitor::forced_watch(&args.monitor.watch_addr),
        live_view: !args.analysis.quiet,
    };
    // One steering for the whole run: `--repair` checks return from the loop and resume it,
    // and the watch survey must carry on where it was, or the checks would see only the
    // first ~1 s of every survey (the report, built at the end, sees all of them).
    let mut steering = crate::steering::Steering::with_threshold(args.analysis.threshold);
    let mut monitor = |session: &mut Session, detector: &mut _, opts: &LoopOptions| {
        monitor::run_loop(
            session,
            opts,
            Some(detector),
            recorder.as_mut(),
            heap.as_mut(),
            &mut steering,
            history.as_mut(),
        )
        .map_err(|e| e.context("monitoring failed"))
    };
    let mut outcome = monitor(&mut session, &mut detector, &opts)?;
    let mut online = None;
    if args.repair {
        // Check every --repair-after until false sharing crosses the threshold; repair once.
        let (mut checks, mut last) = (0, Duration::ZERO);
        // Set when a line crossed but the trial did not fit its budget yet (`budget.rs`).
        let mut deferred: Option<(Duration, Option<Duration>)> = None;
        // The placement trial tried alone meanwhile, when it lost (its cost is charged to
        // the later trial's budget).
        let mut early: Option<Online> = None;
        let settings = args.repair_opts.settings();
        while outcome.exit.is_none() {
            checks += 1;
            let at = start.elapsed();
            last = at;
            let mut so_far = detector.finish();
            let crossed = repair::online::crossed(&so_far, args.analysis.threshold);
            let pid = session.pid();
            let trial = &args.repair_opts.trial;
            // (An early placement trial that loses only lowers what is left: `fits` stays.)
            let spent = early.as_ref().map_or(Duration::ZERO, Online::spent);
            let fits = repair::online::trial_fits(pid, trial, spent);
            let placement = (crossed && !fits && early.is_none())
                .then(|| repair::online::placement_wait(pid, trial))
                .flatten();
            if placement == Some(Duration::ZERO) {
                // The store buffer's trial must wait; placement alone may go now.
                so_far.duration_s = at.as_secs_f64();
                let report = analyze::build(&so_far, &args.analysis, None);
                let alone = repair::Settings {
                    placement_only: true,
                    ..settings
                };
                let o = repair_unguarded(&mut session, || {
                    repair::online::repair_now(pid, &report, at, &alone)
                });
                if o.kept_any() {
                    online = Some(o);
                    break;
                }
                // Its count-only copy ran in a code cache, now gone.
                opts.skip_pcs = o.caches();
                early = Some(o);
            }
            if crossed && !fits {
                if deferred.is_none() {
                    let until = repair::online::trial_fits_from(pid, trial);
                    eprintln!("{}", repair::online::deferral_line(at, until));
                    deferred = Some((at, until));
                }
            } else if crossed {
                so_far.duration_s = at.as_secs_f64();
                let report = analyze::build(&so_far, &args.analysis, None);
                let settings = repair::Settings {
                    spent_before: spent,
                    ..settings
                };
                online = Some(repair_unguarded(&mut session, || {
                    repair::online::repair_now(pid, &report, at, &settings)
                }));
                break;
            }
            // A line has crossed and placement alone will fit at a known age: check then,
            // not at the next --repair-after tick (up to 250 ms of the repair's gain).
            opts.duration = Some(args.repair_after);
            if let Some(wait) = placement.filter(|w| !w.is_zero()) {
                let soonest = Duration::from_millis(5);
                opts.duration = Some(wait.clamp(soonest, args.repair_after.max(soonest)));
            }
            outcome = monitor(&mut session, &mut detector, &opts)?;
        }
        if let Some(o) = &online {
            opts.duration = None;
            opts.skip_pcs = o.caches();
            outcome = monitor(&mut session, &mut detector, &opts)?;
        } else {
            online = Some(match (checks, deferred) {
                (0, _) => Online::ExitedFirst {
                    after: start.elapsed(),
                },
                // What was done (placement tried alone, undone) over what was not.
                (_, Some(_)) if early.is_some() => early.take().expect("checked"),
                (_, Some((at, until))) => Online::Deferred {
                    at,
                    until,
                    exited: start.elapsed(),
                },
                _ => Online::NothingFound { checks, last },
            });
        }
    }
    let elapsed = start.elapsed();
    if let Some(r) = recorder {
        r.finish(elapsed.as_nanos() as u64)?;
    }
    let mut analysis = detector.finish();
    analysis.duration_s = elapsed.as_secs_f64();
    analysis.notes.extend(sampling_note(&session, &config));
    analysis.notes.extend(session.guard_note());
    if let Some(o) = &online {
        analysis.notes.push(o.note());
    }
    analysis.notes.extend(outcome.unwatched.clone());
    analysis
        .notes
        .extend(monitor::watch_cost_note(outcome.watch_cost, elapsed));
    if outcome.skipped > 0 {
        analysis.notes.push(format!(
            "{} sample(s) in laser's code cache (repaired code, in no ELF file) were counted, \
             not analysed",
            outcome.skipped
        ));
    }
    let blocks = heap_blocks(heap.as_mut(), &mut analysis);
    let title = format!("laser run {}", command_line(&args.command));
    let emitted = analyze::emit(&analysis, &args.analysis, blocks, &title)?;
    if let Some(o) = &online {
        let section = o.section(args.repair_after, outcome.skipped);
        // stdout carries the report; with --quiet the section still reaches the user.
        if args.analysis.quiet {
            eprint!("{section}");
        } else {
            print!("{section}");
        }
    }
    if let Some(h) = history {
        let text = h.render();
        if args.analysis.quiet {
            eprint!("{text}");
        } else {
            print!("{text}");
        }
    }
    // The program's own failure wins over a tripped gate (README, "Exit status").
    let status = outcome.exit.map_or(exit::OK, exit::of_program);
    let code = gate::exit_code(status, emitted.tripped);
    leave_to_exit(heap, (session, detector, analysis, steering));
    Ok(code)
}

/// Frees what must be undone by hand, and leaves the rest to the kernel: `main` exits right
/// after the report (`std::process::exit`, no destructors), and the target has exited too.
/// Dropping the session, the detector and the analysis piece by piece (hash tables, line
/// tables, ELF images, rings) kept the user waiting ~0.3 ms after every program's exit,
/// where the kernel frees the same memory and descriptors at once. Only the allocation
/// recorder's temporary library is removed ([`AllocShim`]'s drop, through `heap`).
fn leave_to_exit<T>(heap: Option<LiveHeap>, rest: T) {
    drop(heap);
    std::mem::forget(rest);
}

/// The program and its arguments as one string, for titles.
fn command_line(command: &[std::ffi::OsString]) -> String {
    command
        .iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

/// `laser record`: launch and write every event to a file.
pub fn record(args: RecordArgs) -> Result<i32> {
    let config = session_config(&args.monitor)?;
    let mut session = Session::launch(&args.command, &config)?;
    let mut recorder = Recorder::create(&args.output, &session.header_info())?;
    // The detector runs only to steer watchpoints at the lines it suspects, so the recording
    // holds the same exact histories (and WatchSet windows) a live `run` would have used.
    let mut steering = crate::analyze::detector(&crate::cli::AnalysisArgs::default(), None);
    let opts = LoopOptions {
        duration: None,
        stop_on_interrupt: false,
        steer_watchpoints: config.watch,
        skip_pcs: Vec::new(),
        forced_watch: monitor::forced_watch(&args.monitor.watch_addr),
        live_view: true,
    };
    let outcome = monitor::run_loop(
        &mut session,
        &opts,
        Some(&mut steering),
        Some(&mut recorder),
        None,
        &mut crate::steering::Steering::default(),
        None,
    )?;
    recorder.finish(outcome.elapsed.as_nanos() as u64)?;
    if let Some(note) = session.guard_note() {
        eprintln!("laser: {note}");
    }
    if let Some(note) = &outcome.unwatched {
        // A recording carries events, not notes: say it here.
        eprintln!("laser: warning: {note}");
    }
    if let Some(note) = monitor::watch_cost_note(outcome.watch_cost, outcome.elapsed) {
        eprintln!("laser: {note}");
    }
    let st = session.stats();
    eprintln!(
        "laser: recorded {} samples ({} lost) in {:.2} s to {}",
        st.samples,
        st.lost,
        outcome.elapsed.as_secs_f64(),
        args.output.display()
    );
    Ok(outcome.exit.map_or(exit::OK, exit::of_program))
}

/// `laser report`: analyse a recording, or re-deliver a saved JSON report (gates, exports,
/// other formats; a `--threshold` given can only raise its threshold, and without one the
/// report keeps its own).
pub fn report(args: ReportArgs, threshold_given: bool) -> Result<i32> {
    if is_json(&args.input)? {
        let text = std::fs::read_to_string(&args.input)
            .with_context(|| format!("reading {}", args.input.display()))?;
        let mut report = laser_detect::Report::from_json(&text)
            .with_context(|| format!("parsing {}", args.input.display()))?;
        if threshold_given {
            report.apply_threshold(args.analysis.threshold);
        }
        let title = format!("laser report {}", args.input.display());
        let tripped = crate::output::deliver(&report, &args.analysis, &title)?;
        return Ok(gate::exit_code(exit::OK, tripped));
    }
    let mut detector = analyze::detector(&args.analysis, None);
    let replay = recording::replay(&args.input, Some(&mut detector))?;
    let h = &replay.header;
    eprintln!(
        "laser: recording of `{}` (pid {}, {} backend, {})",
        h.cmdline.join(" "),
        h.pid,
        h.backend,
        if h.cpu_model.is_empty() {
            "unknown CPU"
        } else {
            &h.cpu_model
        }
    );
    if let Some(w) = recording::end_warning(&args.input, &replay.end) {
        eprintln!("laser: warning: {w}");
    }
    let mut analysis = detector.finish();
    if let Some(f) = replay.footer.filter(|f| f.duration_ns > 0) {
        analysis.duration_s = f.duration_ns as f64 / 1e9;
    }
    if !replay.end.is_complete() {
        analysis
            .notes
            .push("the recording ended early: counts cover only what was read".into());
    }
    let title = format!("laser report {}", args.input.display());
    let emitted = analyze::emit(&analysis, &args.analysis, None, &title)?;
    Ok(gate::exit_code(exit::OK, emitted.tripped))
}

/// Whether `path` holds a JSON report rather than a recording (which starts with a binary
/// magic): its first non-blank byte is `{`.
fn is_json(path: &std::path::Path) -> Result<bool> {
    use std::io::Read;
    let mut head = [0u8; 64];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .with_context(|| format!("opening {}", path.display()))?;
    Ok(head[..n]
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|&b| b == b'{'))
}

/// Target memory `attach` may read at the end to name the report's heap lines.
const ATTACH_HEAP_BUDGET: u64 = 256 << 20;

/// `laser attach`: monitor a running process for a while (or until it exits / Ctrl-C); with
/// `--repair`, then repair the report's false-sharing sources (exit codes: `repair.rs`).
pub fn attach(args: AttachArgs) -> Result<i32> {
    let config = session_config(&args.monitor)?;
    let pid = i32::try_from(args.pid).context("pid out of range")?;
    let duration = args
        .duration
        .or(args.repair.then_some(crate::cli::ATTACH_REPAIR_DURATION));
    // Opening the events of every thread is a short burst of work, but a target whose
    // threads outnumber the CPUs leaves an ordinary laser a sliver of a CPU for it: attaching
    // to 400 busy threads on 2 vCPUs took ~7 s before the first sample was read. Real-time
    // for the burst only ([`RealTime`]; nothing changes without the privilege).
    let setup = laser_repair::tracee::RealTime::raise_unless("LASER_READER_NO_RT");
    let mut session = Session::attach(pid, &config)?;
    // One read of the target's maps and build-ids serves the recording and the detector.
    let info = session.header_info();
    drop(setup);
    let mut recorder = match &args.output {
        Some(p) => Some(Recorder::create(p, &info)?),
        None => None,
    };
    let mut detector = analyze::detector(&args.analysis, None);
    detector.add_maps(args.pid, &info.maps);
    match duration {
        None => eprintln!("laser: monitoring pid {pid} until it exits or Ctrl-C"),
        Some(d) if args.repair => eprintln!(
            "laser: monitoring pid {pid} for {:.1} s, then repairing",
            d.as_secs_f64()
        ),
        Some(_) => {}
    }
    let opts = LoopOptions {
        duration,
        stop_on_interrupt: true,
        steer_watchpoints: config.watch,
        skip_pcs: Vec::new(),
        forced_watch: monitor::forced_watch(&args.monitor.watch_addr),
        live_view: !args.analysis.quiet,
    };
    let mut heap = heap_naming().then(|| LiveHeap::new(pid, args.analysis.line));
    let outcome = monitor::run_loop(
        &mut session,
        &opts,
        Some(&mut detector),
        recorder.as_mut(),
        heap.as_mut(),
        &mut crate::steering::Steering::with_threshold(args.analysis.threshold),
        None,
    )?;
    let guard_note = session.guard_note();
    drop(session); // detach before the (possibly slow) symbolization
    if let Some(r) = recorder {
        r.finish(outcome.elapsed.as_nanos() as u64)?;
    }
    let mut analysis = detector.finish();
    analysis.duration_s = outcome.elapsed.max(Duration::from_millis(1)).as_secs_f64();
    analysis.notes.extend(outcome.unwatched.clone());
    analysis.notes.extend(guard_note);
    analysis.notes.extend(monitor::watch_cost_note(
        outcome.watch_cost,
        outcome.elapsed,
    ));
    if let Some(h) = heap.as_mut() {
        // The process is still there: read the blocks of every heap line worth reporting.
        let lines: Vec<u64> = analysis
            .findings
            .iter()
            // A forked copy's line is no address in this process.
            .filter(|f| {
                f.data == laser_detect::Location::Heap
                    && f.reported_at(args.analysis.threshold)
                    && f.process.is_none()
            })
            .map(|f| f.line_addr)
            .collect();
        h.name(&lines, ATTACH_HEAP_BUDGET);
    }
    let blocks = heap_blocks(heap.as_mut(), &mut analysis);
    let title = format!("laser attach -p {pid}");
    let emitted = analyze::emit(&analysis, &args.analysis, blocks, &title)?;
    let (report, tripped) = (emitted.report, emitted.tripped);
    if !args.repair {
        return Ok(gate::exit_code(exit::OK, tripped));
    }
    if outcome.exit.is_some() {
        println!("repair: process {pid} exited while monitored; nothing to repair");
        return Ok(gate::exit_code(exit::OK, tripped));
    }
    if monitor::interrupted() {
        println!("repair: interrupted; process {pid} not repaired");
        return Ok(gate::exit_code(exit::OK, tripped));
    }
    let settings = args.repair_opts.settings();
    let summary = repair::repair_report(pid, &report, &settings, &mut |l| println!("{l}"))?;
    if summary.functions > 0 {
        println!(
            "repaired {} of {} function(s) in process {pid}{}",
            summary.repaired.len(),
            summary.functions,
            if summary.repaired.is_empty() {
                String::new()
            } else {
                format!(" (undo: laser repair -p {pid} --undo)")
            }
        );
    }
    // A refused or failed repair (4, 1) wins over a tripped gate, as a program's status does.
    Ok(gate::exit_code(summary.exit_code(), tripped))
}
