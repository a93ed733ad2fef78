//! The live loop shared by `run`, `record` and `attach`: drain the session's ring buffers into
//! the detector and/or a recording, steer watchpoints at the lines the detector suspects, show
//! progress, and stop when the target exits, the duration is up, or the user interrupts.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use laser_detect::{Detector, WatchCandidate};
use laser_driver::{Event, ExitStatus, Session, Status, Unwatched};
use laser_repair::tracee::RealTime;

use crate::live_heap::LiveHeap;
use crate::recording::Recorder;
use crate::steering::Steering;

/// Set by SIGINT/SIGTERM. `run` keeps going until the program (which got the same Ctrl-C, being
/// in our process group) exits; `attach` stops monitoring and reports.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // ATOMICS: a lone flag read by the poll loop; no other memory is published through it.
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Installs the SIGINT/SIGTERM handler (no `SA_RESTART`, so a blocking poll returns early).
pub fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: `on_signal` only stores to an atomic, which is async-signal-safe; the
        // sigaction struct is fully initialized (zeroed, then the handler set).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

pub fn interrupted() -> bool {
    // ATOMICS: see `on_signal`.
    INTERRUPTED.load(Ordering::Relaxed)
}

/// How the loop should behave.
pub struct LoopOptions {
    /// Stop after this long (attach `--duration`).
    pub duration: Option<Duration>,
    /// Stop on Ctrl-C instead of waiting for the target to exit (attach).
    pub stop_on_interrupt: bool,
    /// Point watchpoints at the detector's candidate lines.
    pub steer_watchpoints: bool,
    /// Samples whose IP falls here are counted, not analysed: laser's code caches (repaired
    /// code lives in anonymous memory, in no ELF file, and its accesses go through the SSB).
    pub skip_pcs: Vec<Range<u64>>,
    /// Lines to watch in turn with the detector's candidates (`--watch-addr`).
    pub forced_watch: Vec<WatchCandidate>,
    /// Draw the live view on a terminal (off with `--quiet`; `live_view.rs`).
    pub live_view: bool,
}

/// `--watch-addr` words grouped by 64-byte line, at most 4 words per line (debug registers).
pub fn forced_watch(words: &[(u64, u32)]) -> Vec<WatchCandidate> {
    let mut out: Vec<WatchCandidate> = Vec::new();
    for &(addr, len) in words {
        let line = addr & !63;
        match out.iter_mut().find(|c| c.line_addr == line) {
            Some(c) if c.words.len() < laser_detect::model::candidates::MAX_WORDS => {
                c.words.push((addr, len))
            }
            Some(_) => {}
            None => out.push(WatchCandidate {
                line_addr: line,
                words: vec![(addr, len)],
            }),
        }
    }
    out
}

/// What ended the loop.
pub struct Outcome {
    /// The target's exit status, if it exited while we watched.
    pub exit: Option<ExitStatus>,
    pub elapsed: Duration,
    /// Samples left out because their IP was in `LoopOptions::skip_pcs`.
    pub skipped: u64,
    /// The report's note on threads the watchpoints could not cover ([`unwatched_note`]).
    pub unwatched: Option<String>,
    /// Traps taken so far in the session and the duty cycle that bounded them, for
    /// [`watch_cost_note`] (`None`: no watchpoints).
    pub watch_cost: Option<(laser_driver::WatchStats, laser_driver::DutyCycle)>,
}

/// How often the monitor loop hands the contended lines' modules to the DWARF prefetcher.
/// Early and often: a program that exits within a second must still leave the worker time.
const PREFETCH_EVERY: Duration = Duration::from_millis(100);

pub fn run_loop(
    session: &mut Session,
    opts: &LoopOptions,
    mut detector: Option<&mut Detector<crate::analyze::Code>>,
    mut recorder: Option<&mut Recorder>,
    mut heap: Option<&mut LiveHeap>,
    steering: &mut Steering,
    mut history: Option<&mut crate::alloc_history::History>,
) -> Result<Outcome> {
    let start = Instant::now();
    raise_reader_priority();
    let mut reader = ReaderPolicy::default();
    let mut view = crate::live_view::LiveView::new(session.pid(), opts.live_view);
    let mut record_error: Option<anyhow::Error> = None;
    let mut skipped = 0;
    let mut last_prefetch = Instant::now();
    if opts.steer_watchpoints && detector.is_some() {
        steering.expect_steps();
    }
    let exit = loop {
        let status = {
            let mut sink = |e: Event| {
                let skip = matches!(&e, Event::Sample(s)
                    if opts.skip_pcs.iter().any(|r| r.contains(&s.ip)));
                skipped += u64::from(skip);
                if let (Some(h), Event::Sample(s)) = (history.as_deref_mut(), &e) {
                    h.observe(s);
                }
                if let Some(d) = detector.as_deref_mut().filter(|_| !skip) {
                    d.feed(&e);
                }
                if let Some(r) = recorder.as_deref_mut() {
                    if record_error.is_none() {
                        if let Err(err) = r.write(&e) {
                            record_error = Some(err);
                        }
                    }
                }
            };
            let wait = steering.poll_wait();
            reader.set(session.watch_mut().is_ok_and(|w| w.is_counting()));
            match session.poll(wait, &mut sink) {
                Ok(st) => st,
                // Our child was reaped by someone else's waitpid: a repair's tracee (laser
                // itself) collects a thread that exits while it holds the process. The
                // program is gone; its status went with that wait.
                Err(e) if reaped_elsewhere(&e) => Status::Exited(ExitStatus::Unknown),
                Err(e) => {
                    return Err(anyhow::Error::new(e).context("reading samples from the kernel"))
                }
            }
        };
        if let Some(err) = record_error.take() {
            return Err(err);
        }
        if let Status::Exited(st) = status {
            break Some(st);
        }
        if opts.duration.is_some_and(|d| start.elapsed() >= d)
            || (opts.stop_on_interrupt && interrupted())
        {
            break None;
        }
        if opts.steer_watchpoints {
            if let Some(d) = detector.as_deref() {
                steering.step(session, d, &opts.forced_watch)?;
            }
        }
        if let Some(d) = detector.as_deref() {
            // The report will symbolize these modules: load their DWARF now, in idle time,
            // rather than after the program has exited (glibc's takes ~100 ms).
            if last_prefetch.elapsed() >= PREFETCH_EVERY {
                last_prefetch = Instant::now();
                laser_detect::naming::prefetch::prefetch(d.contended_modules());
            }
        }
        if let (Some(h), Some(d)) = (heap.as_deref_mut(), detector.as_deref()) {
            h.tick(d);
        }
        if let (Some(hist), Some(shim)) = (
            history.as_deref_mut(),
            heap.as_deref_mut().and_then(LiveHeap::shim_mut),
        ) {
            hist.step(session, shim)?;
        }
        if view.is_shown() {
            let st = session.stats();
            view.update(st.samples, st.lost, detector.as_deref());
        }
    };
    let unwatched = session
        .watcher()
        .and_then(|w| unwatched_note(w.unwatched()));
    let watch_cost = session.watcher().map(|w| (w.stats(), w.duty_cycle()));
    if opts.steer_watchpoints {
        if let Some(w) = session.watcher() {
            // Leave nothing armed in a process we are about to let go of.
            let _ = w.disarm();
        }
        // The caller may call again (`run --repair` checks between calls): the next call
        // arms a new turn, and what the survey learned so far is kept.
        steering.suspend();
    }
    view.finish();
    Ok(Outcome {
        exit,
        elapsed: start.elapsed(),
        skipped,
        unwatched,
        watch_cost,
    })
}

/// What watching cost the target, for the report, against the run and the budget that
/// bounded it (`--watch-budget`): the traps (hits × the per-trap cost laser measured on this
/// machine), laser's own work on the window events, and the watched threads' context switches
/// while armed (each reloads the debug registers) — what the duty cycle charged; and laser's
/// work between polls while windows counted, which it does not charge.
pub fn watch_cost_note(
    cost: Option<(laser_driver::WatchStats, laser_driver::DutyCycle)>,
    elapsed: Duration,
) -> Option<String> {
    let (stats, duty) = cost?;
    let hits = stats.hits;
    if hits == 0 {
        return None;
    }
    let traps = duty.hit_cost.as_secs_f64() * hits as f64;
    let (ops, reader, switches) = (
        stats.ops_time.as_secs_f64(),
        stats.reader_time.as_secs_f64(),
        stats.switch_time.as_secs_f64(),
    );
    let spent = traps + ops + switches;
    let run = elapsed.as_secs_f64().max(1e-3);
    // An access history's watchpoints follow the object unbounded (`--history-site`).
    let budget = if duty.max_slowdown < 1.0 {
        format!("budget {}%, --watch-budget", duty.max_slowdown * 100.0)
    } else {
        "no budget: an access history's watchpoints".to_string()
    };
    let trap_text = format!(
        "{hits} trap(s) × {:.1} µs = {:.1} ms",
        duty.hit_cost.as_secs_f64() * 1e6,
        traps * 1e3
    );
    let parts = match duty.model {
        laser_driver::CostModel::Traps => format!(
            "{trap_text} (--watch-cost-model traps: each trap priced with a wake-up of laser, \
             standing in for the windows' other costs)"
        ),
        laser_driver::CostModel::Full => format!(
            "{trap_text}, laser's work on the events of {} window(s) {:.1} ms, {} context \
             switch(es) of watched threads {:.1} ms",
            stats.windows,
            ops * 1e3,
            stats.switches,
            switches * 1e3,
        ),
    };
    // Not charged (`DutyState::note_reader`), but the target pays for it too.
    let reading = if reader > 0.0 {
        format!(
            "; not charged: laser's reading and steering while windows counted, {:.1} ms \
             ({:.2}%)",
            reader * 1e3,
            100.0 * reader / run
        )
    } else {
        String::new()
    };
    // Where windows opened for whole CPUs (`laser_driver::Watcher::set_cpu_wide`).
    let windows = match (stats.cpu_wide_opens, stats.thread_opens) {
        (0, _) => String::new(),
        (_, 0) => "; windows on whole CPUs (no debug-register reload at context switches; \
                   other processes' hits dropped)"
            .to_string(),
        (c, t) => format!(
            "; windows on whole CPUs {c} time(s), per thread {t} time(s) (while another laser \
             session watched, or another tool held debug registers)"
        ),
    };
    // Windows that waited for the threads they watch for (`laser_driver::company`): time
    // moved, not spent.
    let waits = match stats.company_waits {
        0 => String::new(),
        n => format!(
            "; {n} window(s) waited {:.1} ms in all to open until two of the threads \
             contending on their line could run",
            stats.company_waited.as_secs_f64() * 1e3
        ),
    };
    Some(format!(
        "watchpoint cost: {parts}, {:.2}% of the {:.2} s run ({budget}){reading}{windows}{waits}",
        100.0 * spent / run,
        run,
    ))
}

/// What the report says about threads the watchpoints could not cover: their accesses are
/// sampled like every thread's, but missing from the watch windows, so a watched line's exact
/// rate leaves them out.
fn unwatched_note(threads: &BTreeMap<i32, Unwatched>) -> Option<String> {
    if threads.is_empty() {
        return None;
    }
    let of = |why: Unwatched| -> Vec<String> {
        threads
            .iter()
            .filter(|(_, w)| **w == why)
            .map(|(t, _)| format!("T{t}"))
            .collect()
    };
    let mut parts = Vec::new();
    let taken = of(Unwatched::DebugRegistersTaken);
    if !taken.is_empty() {
        parts.push(format!(
            "{} thread(s) had their debug registers taken by another tool (a debugger's \
             hardware watchpoints, `perf record -e mem:ADDR`, another laser): {}",
            taken.len(),
            taken.join(", ")
        ));
    }
    let nofile = of(Unwatched::NoDescriptors);
    if !nofile.is_empty() {
        parts.push(format!(
            "{} thread(s) found laser out of file descriptors (raise `ulimit -n`): {}",
            nofile.len(),
            nofile.join(", ")
        ));
    }
    Some(format!(
        "watch: {}; they were sampled but not watched, so watched lines' exact rates leave \
         their accesses out",
        parts.join("; ")
    ))
}

/// Nice value of the thread that reads the rings and runs the duty cycle, when laser may set
/// it (root, or CAP_SYS_NICE).
const READER_NICE: i32 = -10;

/// Gives this thread (only: Linux nice values are per thread, and the target was forked
/// before) precedence over the target's threads. A watch window ends when the reader drains
/// its hits and disables it; on 2 CPUs both busy with the target, a reader at the target's
/// priority woke late and a window meant to stop at ~66 hits took 600–900 (kmeans), whose
/// cooldown then kept every other watch turn off for ~0.5 s. The reader uses ~1% of a CPU,
/// so precedence changes when it runs, not how much. Without the privilege nothing changes.
fn raise_reader_priority() {
    // SAFETY: gettid and setpriority take plain integers and touch no memory of ours.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        let _ = libc::setpriority(libc::PRIO_PROCESS, tid, READER_NICE);
    }
}

/// `SCHED_FIFO` for the calling thread from the start of `laser run` until the program is
/// launched (drop the value then), so that nothing laser starts meanwhile takes the CPU
/// from it. This machine's kernel places a new task on its creator's CPU and runs it first
/// (`sched_vcpu_pack`), even with the other CPU idle: the program's process, forked halfway
/// through the launch, took the CPU from laser for ~1 ms in some runs, and the launch then
/// finished that much later. The launch takes ~0.7 ms, so it holds a CPU no longer than it
/// would anyway. `SCHED_RESET_ON_FORK` keeps the program ordinary. That reset also drops a
/// negative nice value, which the program would otherwise inherit, so a laser started at
/// one is left as it is (as it is without the privilege). `LASER_LAUNCH_NO_RT` turns it off
/// (for A/B measurements).
pub fn launch_precedence() -> Option<RealTime> {
    // SAFETY: getpriority reads the calling thread's nice value. An error (-1) is taken as
    // a negative value: nothing changes.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    if nice < 0 {
        return None;
    }
    RealTime::raise_unless("LASER_LAUNCH_NO_RT")
}

/// The reader at `SCHED_FIFO` while a watch window counts ([`RealTime`]), an ordinary thread
/// (at [`READER_NICE`]) otherwise.
///
/// A window ends at its hit cap only when the reader drains the hits and disables it. At nice
/// -10 the reader still woke 4–12 ms late when the CPUs were busy with more than the target
/// (two CPU hogs beside a two-thread program: 8 of 377 windows took 284–1,196 hits where the
/// cap was ~150), and one such window's cooldown took its share of the trap budget for most
/// of a second: a 1.5 s run under test load got 2 windows, both on one thread, and no
/// estimate (tests/cli.rs, the record → report test, once in CI). A real-time reader
/// preempts the target at once. It runs only short drains while a window counts and sleeps
/// in between, so it cannot starve the target, and the kernel's real-time throttling bounds
/// it anyway; between windows it is an ordinary thread again, so the detector's and
/// steering's longer work does not preempt anyone. Dropping it (every way out of the loop,
/// an error too) makes the thread ordinary again. `LASER_READER_NO_RT` turns it off (for
/// A/B measurements).
#[derive(Default)]
struct ReaderPolicy {
    realtime: Option<RealTime>,
    /// Raising failed once (no privilege, or turned off): never tried again.
    off: bool,
}

impl ReaderPolicy {
    fn set(&mut self, realtime: bool) {
        if !realtime {
            self.realtime = None;
        } else if self.realtime.is_none() && !self.off {
            self.realtime = RealTime::raise_unless("LASER_READER_NO_RT");
            self.off = self.realtime.is_none();
        }
    }
}

/// `waitpid` on the launched child failed with ECHILD: it has been reaped already.
fn reaped_elsewhere(e: &laser_driver::DriverError) -> bool {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return io.raw_os_error() == Some(libc::ECHILD);
        }
        src = s.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> libc::c_int {
        // SAFETY: sched_getscheduler on the calling thread reads no memory of ours.
        let p = unsafe { libc::sched_getscheduler(0) };
        p & !libc::SCHED_RESET_ON_FORK
    }

    fn nice() -> i32 {
        // SAFETY: gettid and getpriority take plain integers.
        unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::getpriority(libc::PRIO_PROCESS, tid)
        }
    }

    /// Real-time while a window counts, ordinary with its nice value kept after, and ordinary
    /// again however the loop ends (drop). Without the privilege nothing changes at all.
    #[test]
    fn the_reader_is_real_time_only_while_a_window_counts() {
        // The test harness's thread is ours alone.
        raise_reader_priority();
        let nice0 = nice();
        let mut r = ReaderPolicy::default();
        r.set(true);
        if r.off {
            assert_eq!(policy(), libc::SCHED_OTHER, "no privilege: unchanged");
            return;
        }
        assert_eq!(policy(), libc::SCHED_FIFO);
        r.set(false);
        assert_eq!(policy(), libc::SCHED_OTHER);
        assert_eq!(
            nice(),
            nice0,
            "back to ordinary keeps the reader's nice value"
        );
        r.set(true);
        drop(r);
        assert_eq!(
            policy(),
            libc::SCHED_OTHER,
            "dropped while counting: ordinary again"
        );
    }

    /// Real-time while held, and what is started meanwhile (the program, forked then) is an
    /// ordinary task; ordinary again after. At a negative nice value (which the reset on
    /// fork would take from the program) nothing changes.
    #[test]
    fn the_launch_is_real_time_and_what_it_starts_is_not() {
        let held = launch_precedence();
        if held.is_none() {
            assert_eq!(policy(), libc::SCHED_OTHER, "no privilege: unchanged");
            return;
        }
        assert_eq!(policy(), libc::SCHED_FIFO);
        let started = std::thread::spawn(policy).join().unwrap();
        assert_eq!(
            started,
            libc::SCHED_OTHER,
            "a task started meanwhile is ordinary"
        );
        drop(held);
        assert_eq!(policy(), libc::SCHED_OTHER);
        // SAFETY: setpriority on the calling thread (the test's own) with plain integers.
        let lowered = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, -1) } == 0;
        if lowered {
            assert!(
                launch_precedence().is_none(),
                "a negative nice value is left alone"
            );
            assert_eq!(policy(), libc::SCHED_OTHER);
        }
    }
}
