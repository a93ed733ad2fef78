//! The facade the CLI uses: launch or attach, then `poll` in a loop until the target exits.
//!
//! One ring buffer per CPU (launch) or per thread (attach), owned by a *leader* event
//! (sampling cpu-clock for `soft`, counting-only cpu-clock for `watch`) that also carries the
//! Mmap/Comm/Fork/Exit side-band records; watchpoint events write into the leader's ring
//! (`PERF_EVENT_IOC_SET_OUTPUT`). The leaders' counts are the target's CPU time (the
//! watchpoint duty cycle's budget). `poll` must run continuously: two threads sampled at
//! 10 kHz fill 64 pages in well under a second.
//!
//! ```text
//!  launch (per CPU, inherit)           attach (per thread, no inherit: mmap-able)
//!  cpu0: leader ◀─ watch slot 0..3     tid A: leader ◀─ watch slot 0..3
//!   └ ring ──┐                           └ ring ──┐
//!  cpu1: leader ◀─ watch slot 0..3     tid B: …   │
//!   └ ring ──┴─▶ poll: drain all rings, decode, sort batch by time ─▶ sink(Event)
//! ```
//!
//! Launch windows write into a ring per watched thread instead (`watch::ThreadRing`, owned
//! by a dummy event on that thread), drained after the leaders'.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use perf_event_open_sys::bindings::perf_event_attr;

use crate::attr::{self, Binding};
use crate::decode::{Decoder, Source};
use crate::error::DriverError;
use crate::event::{BackendKind, Event, StreamStats};
use crate::launch::{self, ExitStatus};
use crate::mmap_ring::MmapRing;
use crate::pmu::live::PrecisePlan;
use crate::procinfo;
use crate::ring;
use crate::sys;
use crate::threads;
use crate::trap_guard::{GuardState, GuardTotals, TrapGuard};
use crate::watch::{DutyCycle, Watcher};

/// Default cpu-clock frequency of the soft backend (per thread, Hz), chosen to keep the
/// target's overhead ≤ 2 %. Measured with `benchmarks/src/bin/soft_overhead.rs` (2 CPU-bound
/// threads, 7 interleaved pairs, target CPU time sampled/bare) on the 2-vCPU KVM guest at load
/// average ~6: 10 Hz ×1.001, 250 Hz ×1.001, 500 Hz ×1.014, 1 kHz ×1.022, 2 kHz ×1.049,
/// 4 kHz ×1.088 — each sample costs the target ≈ 20–25 µs here (timer VM exits), so the
/// overhead is ≈ frequency × that cost and 1 kHz already misses the goal on this machine.
/// Re-measure on a quiet host: if a sample costs ≤ 10 µs there, 1–2 kHz fits the goal.
///
/// 500 Hz until the twenty-fourth session; 250 Hz since: on the real programs the
/// whole run must fit the 2 %, and there 500 Hz alone took 1.5–3 % (side by side,
/// `--watch=false` against `--freq 100`/`250`: streamcluster 1.030 / 1.011 at 250 Hz, 1.002 at
/// 100 Hz; matrix_multiply 1.026 at 500 Hz, 1.010 at 50 Hz; kmeans 1.031 at 500 Hz, 1.006 at
/// 100 Hz), while recall held at 250 Hz on every suite (asm-tests 226/226 lines, workloads,
/// controls clean, realworld 16/16 three times, kmeans 10/10; benchmarks/RESULTS.md): the
/// watchpoint windows, not the samples, give the rates and find sparse contention.
pub const DEFAULT_SOFT_FREQ: u64 = 250;

/// Longest wait between polls while a launch window counts and the target has been making
/// threads as it runs (a creation [`CHURN_GAP`] or more after the one before it, read within
/// [`CHURN_MEMORY`]). Such a window watches a new thread from when laser reads
/// its Fork record, and a program that starts its workers afresh for every phase (Phoenix
/// kmeans: two threads per phase, two phases per ~13 ms iteration) would otherwise run them
/// unwatched for up to the 50 ms the reader sleeps: of the 18 threads that store `modified`
/// created during one quiet 100 ms window of a kmeans run, 1 trapped, and the window's armed
/// time with no transfers in it diluted the line under the threshold (twenty-second
/// session).
pub const CHURN_POLL: Duration = Duration::from_micros(500);

/// How long after a launch its trap guard starts (`trap_guard`); watch windows wait for it.
/// Started at the launch, it stopped the threads the program creates in its first
/// milliseconds at their creation (the first 64 creations are stopped until the guard has
/// run), and its start competed for the CPUs with the program's own: side by side on Phoenix
/// histogram (two workers, created ~1 ms after the exec), with no window ever armed, laser
/// cost 1.054–1.060x the bare time with the guard started at the launch and 1.026–1.033x
/// with none; started 5 ms later, 1.032x (60–100 alternating runs each). Stopping the
/// creations costs nothing measurable without laser (the guard alone on the same program:
/// 1.002x); what laser adds to make them cost is not known. Windows start that much later:
/// a program's first 5 ms are not watched.
pub const GUARD_DELAY: Duration = Duration::from_millis(5);

/// How long after reading the target's last thread creation that came [`CHURN_GAP`] after
/// the one before it the reader keeps polling every [`CHURN_POLL`] while a window counts.
pub const CHURN_MEMORY: Duration = Duration::from_millis(100);

/// A thread creation this long (perf clock, ns) after the target's previous one means the
/// target makes threads as it runs, not only a pool at its start. Phoenix histogram starts
/// its two workers 0.6 ms apart, ~50 ms before its first window, and polling every 0.5 ms
/// through that window woke laser (real-time while a window counts) 36 times on the
/// target's CPUs for nothing; kmeans starts two every ~6.5 ms. (Counting only creations made
/// while a window counted missed kmeans' `modified` in 1 run of 20: its windows end at their
/// cap within milliseconds, so few creation records are read while one counts.)
pub const CHURN_GAP: u64 = 2_000_000;

/// Default data pages per ring: 128 (512 KiB), perf's own default — with the control page it
/// is exactly the 516 KiB `perf_event_mlock_kb` lets an unprivileged user lock per CPU. Even
/// at 1 kHz × 2 threads × 224-byte samples that is over a second of headroom between polls.
pub const DEFAULT_BUFFER_PAGES: usize = 128;

/// Why watch windows may not arm in the target now.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Unguarded {
    /// The guard let go of the threads ([`Session::release_guard`]): no failure, no note.
    Released,
    /// The target ended before its guard could trace it: no note either.
    EndedFirst,
    /// The target cannot be traced, or its guard is gone: the report says why.
    Failed(String),
}

impl std::fmt::Display for Unguarded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unguarded::Released => f.write_str("released for a repair"),
            Unguarded::EndedFirst => f.write_str("the program ended first"),
            Unguarded::Failed(why) => f.write_str(why),
        }
    }
}

/// What to sample and how.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// `Soft` or `Watch` (resolve `auto` with [`crate::probe::probe`] first). `Pebs`/`Ibs`
    /// give [`DriverError::BackendUnavailable`] until their backends exist.
    pub backend: BackendKind,
    /// cpu-clock samples per second per thread (soft).
    pub frequency: u64,
    /// Data pages per ring buffer (rounded up to a power of two): per CPU when launching;
    /// when attaching each thread gets its own ring of a quarter of this (at least 8 pages),
    /// since a thread fills it at a per-thread rate and many threads would otherwise lock
    /// many megabytes.
    pub buffer_pages: usize,
    /// Open watchpoint events so `watch_mut().arm(…)` works. Implied by `backend = Watch`.
    pub watch: bool,
    pub duty_cycle: DutyCycle,
    /// Launch only: what the program gets besides laser's own environment (see
    /// [`launch::ChildSetup`]): `laser run` preloads its allocation recorder this way.
    pub child: launch::ChildSetup,
    /// Launch, soft backend: sample whole CPUs and drop other processes' samples
    /// ([`attr::soft_cpu_wide`]) where the machine allows CPU-wide events, instead of one
    /// timer per thread, which restarts at every context switch. Not the default yet
    /// (RESULTS, sixteenth session).
    pub sample_cpus: bool,
    /// With watchpoints: the trap guard program, started as `EXE PID` to trace the target
    /// so that the SIGTRAP of a lost debug exception never reaches it
    /// ([`crate::trap_guard`]); windows arm only once it has every thread. `None`: no guard
    /// (windows may then kill the target: rarely, and more often while CPUs trap at once).
    pub trap_guard: Option<std::path::PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            backend: BackendKind::Soft,
            frequency: DEFAULT_SOFT_FREQ,
            buffer_pages: DEFAULT_BUFFER_PAGES,
            watch: false,
            duty_cycle: DutyCycle::default(),
            child: launch::ChildSetup::default(),
            sample_cpus: false,
            trap_guard: None,
        }
    }
}

/// Result of one [`Session::poll`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Running,
    Exited(ExitStatus),
}

/// One opened `perf_event_attr`: raw bytes (as the kernel got them) and a description.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttrInfo {
    pub bytes: Vec<u8>,
    pub description: String,
}

/// What a recording header needs to be self-describing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderInfo {
    pub backend: BackendKind,
    pub pid: u32,
    /// argv for launched targets; `/proc/PID/cmdline` for attached ones.
    pub command: Vec<String>,
    pub frequency: u64,
    pub attrs: Vec<AttrInfo>,
    pub cpu_model: Option<String>,
    /// `/proc/PID/maps` text (re-read at the call; the last snapshot if the target is gone).
    pub maps: String,
    /// GNU build-id of each mapped ELF file, by path.
    pub build_ids: BTreeMap<String, Vec<u8>>,
    /// Wall clock when the session started, nanoseconds since the Unix epoch…
    pub start_time_unix_ns: u64,
    /// …and the sample clock (CLOCK_MONOTONIC, see `attr::base`) at the same instant, so
    /// event times map to wall time.
    pub start_time_perf_ns: u64,
}

struct Leader {
    key: i64,
    fd: OwnedFd,
    ring: MmapRing,
    hup: bool,
    /// PEBS/IBS events writing into this leader's ring (closed with it).
    _precise: Vec<OwnedFd>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Launched,
    Attached,
}

/// A target under observation. `Send`, so the CLI may poll it from a worker thread.
///
/// Dropping it closes every event (the target is no longer observed) but does not stop a
/// launched program: use [`Session::signal`] first if it should end with laser.
pub struct Session {
    mode: Mode,
    pid: i32,
    command: Vec<String>,
    config: Config,
    leader_attr: perf_event_attr,
    /// The PEBS/IBS events opened with every leader (`--backend pebs|ibs`).
    precise: Option<PrecisePlan>,
    leaders: Vec<Leader>,
    watcher: Option<Watcher>,
    /// The tracer keeping lost debug exceptions' SIGTRAPs from the target while windows may
    /// trap (declared after `watcher`, so dropped after its events are closed).
    guard: Option<TrapGuard>,
    /// A guard being started in the background (a launch's, by [`Session::poll`]).
    guard_spawn: Option<std::thread::JoinHandle<io::Result<TrapGuard>>>,
    /// When a launch's guard is to be started ([`GUARD_DELAY`] after the launch), until
    /// `poll` starts it.
    guard_due: Option<Instant>,
    /// Why windows may not arm in this target, once known.
    unguarded: Option<Unguarded>,
    /// What the guards of this session (one per stretch between repairs) kept and passed.
    guard_totals: GuardTotals,
    decoder: Decoder,
    scratch: Vec<u8>,
    batch: Vec<Event>,
    pending: VecDeque<Event>,
    stats: StreamStats,
    ring_errors: u64,
    known_tids: BTreeSet<i32>,
    exited: Option<ExitStatus>,
    maps_snapshot: String,
    start_unix_ns: u64,
    start_perf_ns: u64,
    /// Readable once the target has exited (`pidfd_open`, Linux ≥ 5.3): the poll wakes at the
    /// exit instead of on the next timer tick, so `laser run` ends as soon as the program does.
    /// `None` on older kernels.
    pidfd: Option<OwnedFd>,
    /// Launch, soft backend, `Config::sample_cpus`, where CPU-wide events are allowed: one
    /// cpu-clock sampler per CPU sampling whatever runs there ([`attr::soft_cpu_wide`]),
    /// writing into that CPU's leader ring; the leaders only track. Empty: the leaders
    /// sample (per task).
    samplers: Vec<OwnedFd>,
    /// Each sampler's frequency ([`attr::cpu_wide_frequency`]: one per CPU).
    sampler_hz: Vec<u64>,
    /// Samples of processes other than the target's ([`Decoder::is_target`]: the launched
    /// one and those it forked) are dropped as read: with CPU-wide samplers or whole-CPU
    /// watch windows ([`Watcher::set_cpu_wide`]).
    drop_foreign: bool,
    /// The leaders are CPU-wide too ([`attr::tracking_cpu_wide`]): the side-band records
    /// (mmap, comm, fork, exit) of processes other than the target's are dropped as read,
    /// and a process joins the target when its parent is in it.
    cpu_wide_leaders: bool,
    /// When the last Fork record of the target that came [`CHURN_GAP`] after the one before
    /// it was read (launch): see [`CHURN_POLL`].
    last_fork: Option<Instant>,
    /// Perf time of the latest thread creation read.
    last_fork_time: Option<u64>,
}

impl Session {
    /// Starts `argv` with events on every CPU, counting from its exec: where laser samples
    /// whole CPUs, events of the whole CPU (none bound to the target's threads, see
    /// [`attr::tracking_cpu_wide`]); else events bound to the target, inherited by its
    /// threads. Returns once the exec has happened.
    pub fn launch(argv: &[OsString], config: &Config) -> Result<Session, DriverError> {
        let config = checked(config)?;
        let whole_cpus = config.sample_cpus && cpu_wide_allowed(config.frequency);
        let cpu_wide = whole_cpus && config.backend == BackendKind::Soft;
        let watch = config.watch || config.backend == BackendKind::Watch;
        let stopped = launch::spawn_stopped_with(argv, &config.child)?;
        let pid = stopped.pid;
        // Events of whole CPUs are bound to no task, so they need nothing of the child: it
        // is released at once and execs while laser opens them (~0.35 ms of every launch
        // the program no longer waits for, on this VM), and what it mapped before they
        // counted is read from /proc afterwards, as attach does. Events bound to the child
        // must exist before its exec (enabled by it), so that launch holds it until then.
        let held = if cpu_wide {
            stopped.release()?;
            None
        } else {
            Some(stopped)
        };
        // A released program laser cannot observe is not left running on its own: it is
        // killed and reaped, and the error says why (a held one never runs: it _exits when
        // `Stopped` is dropped). The machine probe before the launch opened the same kind of
        // events, so this takes a failure between the two (descriptors or memory run out).
        let opened = Self::open_launch_events(pid, argv, &config, whole_cpus, cpu_wide);
        let mut s = match opened {
            Ok(s) => s,
            Err(e) => {
                if held.is_none() {
                    kill_and_reap(pid);
                }
                return Err(e);
            }
        };
        if let Some(stopped) = held {
            stopped.release()?;
        }
        // The exec has happened: from here on the CPUs' samples are the target's when its
        // pid is theirs.
        if let Err(e) = s.samplers.iter().try_for_each(sys::enable) {
            kill_and_reap(pid);
            return Err(e);
        }
        s.maps_snapshot = read_maps(s.pid).unwrap_or_default();
        if cpu_wide {
            s.note_premapped();
        }
        if watch && config.trap_guard.is_some() {
            s.guard_due = Some(Instant::now() + GUARD_DELAY);
        }
        Ok(s)
    }

    /// The session's events for a launch of `pid` (the leaders enabled, the samplers not).
    fn open_launch_events(
        pid: i32,
        argv: &[OsString],
        config: &Config,
        whole_cpus: bool,
        cpu_wide: bool,
    ) -> Result<Session, DriverError> {
        let mut s = Session::new(Mode::Launched, pid, config, Binding::Launch)?;
        s.command = argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let cpus = sys::online_cpus()?;
        if cpu_wide {
            s.leader_attr = attr::tracking_cpu_wide(wakeup_bytes(Mode::Launched, config));
            s.cpu_wide_leaders = true;
            s.decoder.follow(pid as u32, true);
        }
        if let (true, Some(w)) = (whole_cpus, &mut s.watcher) {
            // Watch windows for whole CPUs too; their hits in other processes are dropped as
            // read, as other processes' samples are.
            w.set_cpu_wide(true);
        }
        s.drop_foreign = cpu_wide || (whole_cpus && s.watcher.is_some());
        // A CPU-wide leader is bound to no task (so no enable at exec): enabled, it records
        // the mappings, forks and execs from here on ([`Session::note_premapped`] covers what
        // came before).
        let leader_pid = if cpu_wide { -1 } else { pid };
        for &cpu in &cpus {
            s.open_leader(leader_pid, cpu as i32, cpu as i64)?;
            if cpu_wide {
                s.open_sampler(cpu as i32)?;
            }
        }
        if cpu_wide {
            s.leaders.iter().try_for_each(|l| sys::enable(&l.fd))?;
        }
        Ok(s)
    }

    /// Launch with whole-CPU events, released before they counted: what the leaders missed
    /// of the target and of any process it forked meanwhile, from /proc
    /// ([`procinfo::premapped_events`]). Later changes come from the leaders' records; a
    /// mapping made in between is in both, which is harmless.
    fn note_premapped(&mut self) {
        let procs = procinfo::launched_tree(self.pid, self.maps_snapshot.clone());
        let events = procinfo::premapped_events(&procs, procinfo::read_build_ids);
        adopt_premapped(
            &mut self.decoder,
            self.watcher.as_mut(),
            &mut self.pending,
            events,
        );
    }

    /// Attaches to a running process: per-thread events for every current thread, new
    /// threads picked up on each poll. The first poll delivers Mmap events synthesized from
    /// `/proc/PID/maps` (and Comm events for existing threads) so the detector knows the
    /// mappings that predate the attach.
    pub fn attach(pid: i32, config: &Config) -> Result<Session, DriverError> {
        let config = checked(config)?;
        if pid <= 0 || !threads::is_alive(pid) {
            return Err(DriverError::NoSuchProcess { pid });
        }
        let mut s = Session::new(Mode::Attached, pid, &config, Binding::Attach)?;
        s.command = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| {
                b.split(|&c| c == 0)
                    .filter(|a| !a.is_empty())
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect()
            })
            .unwrap_or_default();
        // Events first: a permission problem is reported with the perf_event_paranoid
        // explanation rather than as an unreadable maps file.
        s.rescan_threads()?;
        if s.leaders.is_empty() {
            return Err(DriverError::NoSuchProcess { pid });
        }
        s.maps_snapshot = read_maps(pid).map_err(|e| match e.raw_os_error() {
            Some(errno @ (libc::EACCES | libc::EPERM)) => {
                crate::error::permission_error(&format!("reading /proc/{pid}/maps"), errno)
            }
            _ => DriverError::NoSuchProcess { pid },
        })?;
        let maps = procinfo::parse_maps(&s.maps_snapshot);
        let ids = procinfo::read_build_ids(&maps);
        let mmaps = procinfo::mmap_events(pid as u32, &maps, &ids);
        mmaps.iter().for_each(|m| s.decoder.note_mmap(m));
        s.pending.extend(mmaps.into_iter().map(Event::Mmap));
        for &tid in &s.known_tids {
            if let Ok(name) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")) {
                s.pending.push_back(Event::Comm {
                    pid: pid as u32,
                    tid: tid as u32,
                    time: 0,
                    name: name.trim_end().to_string(),
                    exec: false,
                });
            }
        }
        s.start_guard();
        Ok(s)
    }

    fn new(
        mode: Mode,
        pid: i32,
        config: &Config,
        binding: Binding,
    ) -> Result<Session, DriverError> {
        let wake = wakeup_bytes(mode, config);
        // Precise backends sample with their own events; the leader only carries the
        // side-band records and owns the ring they all write into.
        let (leader_attr, source) = match config.backend {
            BackendKind::Soft => (attr::soft(binding, config.frequency, wake), Source::Soft),
            _ => (attr::tracking(binding, wake), Source::Tracking),
        };
        let precise = match config.backend {
            b @ (BackendKind::Pebs | BackendKind::Ibs) => Some(PrecisePlan::system(b, binding)?),
            _ => None,
        };
        let info = attr::parse_info(&attr::to_bytes(&leader_attr))
            .map_err(|e| DriverError::io("parsing our own perf_event_attr", e))?;
        let watch = config.watch || config.backend == BackendKind::Watch;
        let mut decoder = Decoder::new(info, source);
        decoder.follow(pid as u32, false);
        Ok(Session {
            mode,
            pid,
            command: Vec::new(),
            config: config.clone(),
            leader_attr,
            precise,
            leaders: Vec::new(),
            watcher: watch.then(|| Watcher::new(binding, config.duty_cycle, Some(pid))),
            guard: None,
            guard_spawn: None,
            guard_due: None,
            unguarded: None,
            guard_totals: GuardTotals::default(),
            decoder,
            scratch: Vec::new(),
            batch: Vec::new(),
            pending: VecDeque::new(),
            stats: StreamStats::default(),
            ring_errors: 0,
            known_tids: BTreeSet::new(),
            exited: None,
            maps_snapshot: String::new(),
            start_unix_ns: clock_ns(libc::CLOCK_REALTIME),
            start_perf_ns: clock_ns(libc::CLOCK_MONOTONIC),
            pidfd: pidfd_open(pid),
            samplers: Vec::new(),
            sampler_hz: Vec::new(),
            drop_foreign: false,
            cpu_wide_leaders: false,
            last_fork: None,
            last_fork_time: None,
        })
    }

    /// Opens the leader (and watch events) for one CPU (`cpu >= 0`) or thread (`cpu = -1`).
    fn open_leader(&mut self, pid: i32, cpu: i32, key: i64) -> Result<(), DriverError> {
        let soft = self.config.backend == BackendKind::Soft;
        let what = format!(
            "{} on pid {pid} cpu {cpu}",
            if soft {
                "cpu-clock sampling"
            } else {
                "tracking event"
            }
        );
        let fd = sys::open(&self.leader_attr, pid, cpu, &what)?;
        let ring = MmapRing::new(&fd, self.ring_pages())?;
        let source = if soft { Source::Soft } else { Source::Tracking };
        self.decoder.add_source(sys::event_id(&fd)?, source);
        let precise = match &self.precise {
            Some(p) => p.open(pid, cpu, &fd, &mut self.decoder)?,
            None => Vec::new(),
        };
        if let Some(w) = &mut self.watcher {
            for (id, slot) in w.add(pid, cpu, key, &fd)? {
                self.decoder.add_source(id, Source::Watch(slot));
            }
        }
        self.leaders.push(Leader {
            key,
            fd,
            ring,
            hup: false,
            _precise: precise,
        });
        Ok(())
    }

    /// Launch with CPU-wide sampling: the sampler for `cpu`, writing into the leader just
    /// opened for it, disabled until the exec.
    fn open_sampler(&mut self, cpu: i32) -> Result<(), DriverError> {
        let freq = attr::cpu_wide_frequency(self.config.frequency, cpu.unsigned_abs());
        let a = attr::soft_cpu_wide(freq);
        let fd = sys::open(&a, -1, cpu, &format!("cpu-clock sampling of cpu {cpu}"))?;
        let leader = self.leaders.last().expect("the leader is opened first");
        sys::set_output(&fd, leader.fd.as_raw_fd())?;
        self.decoder.add_source(sys::event_id(&fd)?, Source::Soft);
        self.samplers.push(fd);
        self.sampler_hz.push(freq);
        Ok(())
    }

    fn ring_pages(&self) -> usize {
        match self.mode {
            Mode::Launched => self.config.buffer_pages,
            Mode::Attached => (self.config.buffer_pages / 4).max(8),
        }
    }

    /// Sends `signal` to the target (e.g. SIGINT when a `--duration` ends). Refused once the
    /// target has exited: a reaped pid may already belong to another process.
    pub fn signal(&self, signal: i32) -> Result<(), DriverError> {
        if self.exited.is_some() {
            return Err(DriverError::NoSuchProcess { pid: self.pid });
        }
        // SAFETY: kill has no memory-safety preconditions.
        if unsafe { libc::kill(self.pid, signal) } != 0 {
            return Err(DriverError::io(
                format!("kill({}, {signal})", self.pid),
                io::Error::last_os_error(),
            ));
        }
        Ok(())
    }

    /// Attach mode: opens events for threads not yet covered.
    ///
    /// Race handling: a thread can be created between listing `/proc/PID/task` and opening
    /// events, and a covered thread can spawn more while we open. So the directory is listed
    /// again until two consecutive listings find nothing new (bounded at 64 rounds for
    /// thread-spawning storms; the next poll continues). A thread that exits between listing
    /// and `perf_event_open` gives ESRCH and is skipped. Threads created after the last
    /// listing are found on the next poll (every poll rescans; the CLI polls every ~100 ms);
    /// their first moments until then are unobserved. The kernel's Fork record for such a
    /// thread still arrives through its (covered) creator's ring, so the detector knows it.
    fn rescan_threads(&mut self) -> Result<(), DriverError> {
        let mut quiet = 0;
        for _ in 0..64 {
            let Ok(tids) = threads::list_tids(self.pid) else {
                return Ok(()); // process gone; poll reports the exit
            };
            let mut new = false;
            for tid in tids {
                if !self.known_tids.insert(tid) {
                    continue;
                }
                new = true;
                if let Some(g) = self.guard.as_mut() {
                    g.follow(tid);
                }
                match self.open_leader(tid, -1, tid as i64) {
                    Ok(()) => {}
                    Err(DriverError::Open { source, .. })
                        if source.raw_os_error() == Some(libc::ESRCH) => {}
                    Err(e) => return Err(e),
                }
            }
            quiet = if new { 0 } else { quiet + 1 };
            if quiet >= 2 {
                break;
            }
        }
        Ok(())
    }

    /// Waits up to `timeout` for records, hands every decoded event to `sink` (sorted by time
    /// within one call), advances the watchpoint duty cycle, picks up new threads (attach),
    /// and reports whether the target has exited. After `Exited`, further calls return
    /// `Exited` again with nothing new.
    pub fn poll(
        &mut self,
        timeout: Duration,
        sink: &mut dyn FnMut(Event),
    ) -> Result<Status, DriverError> {
        while let Some(e) = self.pending.pop_front() {
            self.stats.account(&e);
            sink(e);
        }
        if let Some(st) = self.exited {
            self.drain_all(sink)?;
            return Ok(Status::Exited(st));
        }
        let now = Instant::now();
        let mut deadline = now + timeout;
        if let Some(d) = self.watcher.as_ref().and_then(|w| w.next_deadline(now)) {
            deadline = deadline.min(d.max(now));
        }
        if let Some(due) = self.guard_due {
            deadline = deadline.min(due.max(now));
        }
        // A thread created while a launch window counts is watched from when its Fork record
        // is read: while the target is making threads, read them promptly.
        if let (Some(w), Some(f)) = (&self.watcher, self.last_fork) {
            if w.covers_new_threads_when_read() && now.duration_since(f) < CHURN_MEMORY {
                deadline = deadline.min(now + CHURN_POLL);
            }
        }
        if let Some(w) = &mut self.watcher {
            // A window's events count from here: opened disabled, enabled now that the
            // reader has nothing left to do but sleep.
            w.enable_opened()?;
            w.restamp_start(clock_ns(libc::CLOCK_MONOTONIC));
        }
        self.wait_readable(deadline.saturating_duration_since(now))?;
        self.drain_all(sink)?;

        let exited = match self.mode {
            Mode::Launched => launch::wait(self.pid, true)?,
            Mode::Attached => {
                if threads::is_alive(self.pid) {
                    self.drop_exited_threads();
                    self.rescan_threads()?;
                    None
                } else {
                    Some(ExitStatus::Unknown)
                }
            }
        };
        if let Some(st) = exited {
            self.exited = Some(st);
            // Everything the target wrote is in the rings now.
            self.drain_all(sink)?;
            if let Some(w) = &mut self.watcher {
                w.finish(Instant::now());
                // Deliver the closing marker now: callers stop polling after `Exited`.
                for e in w.take_markers() {
                    self.stats.account(&e);
                    sink(e);
                }
            }
            return Ok(Status::Exited(st));
        }
        if self.guard_due.is_some_and(|due| Instant::now() >= due) {
            self.spawn_guard();
        }
        Ok(Status::Running)
    }

    /// Starts the launch's guard from a thread of its own (starting a process blocks its
    /// caller until the exec, ~0.5 ms); `watch_mut` takes it once it is up.
    fn spawn_guard(&mut self) {
        self.guard_due = None;
        if let Some(exe) = self.config.trap_guard.clone() {
            let pid = self.pid;
            self.guard_spawn = Some(std::thread::spawn(move || TrapGuard::spawn(&exe, pid)));
        }
    }

    fn wait_readable(&mut self, timeout: Duration) -> Result<(), DriverError> {
        let live: Vec<usize> = (0..self.leaders.len())
            .filter(|&i| !self.leaders[i].hup)
            .collect();
        // Sub-millisecond waits stay sub-millisecond (ppoll takes a timespec): steering
        // follows contention that moves at a fraction of a millisecond's notice.
        let timeout = if live.is_empty() {
            // Every leader hung up (launch: the main thread exited, other threads may still
            // write through inherited events). Poll the rings on a short timer instead.
            timeout.min(Duration::from_millis(10))
        } else {
            timeout
        };
        let mut pfds: Vec<libc::pollfd> = live
            .iter()
            .map(|&i| libc::pollfd {
                fd: self.leaders[i].fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        if let Some(fd) = &self.pidfd {
            pfds.push(libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        let rings_from = pfds.len();
        if let Some(w) = &self.watcher {
            pfds.extend(w.thread_ring_fds().into_iter().map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            }));
        }
        if pfds.is_empty() {
            std::thread::sleep(timeout);
            return Ok(());
        }
        let ts = libc::timespec {
            tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
            tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
        };
        // SAFETY: pfds is a live, correctly sized array of pollfd for the duration of the
        // call; the descriptors stay open (owned by self.leaders); ts outlives the call and
        // a null signal mask leaves the mask as it is (plain poll).
        let r = unsafe {
            libc::ppoll(
                pfds.as_mut_ptr(),
                pfds.len() as libc::nfds_t,
                &ts,
                std::ptr::null(),
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(DriverError::io("poll on perf ring buffers", e));
            }
        }
        for (p, &i) in pfds.iter().zip(&live) {
            if p.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
                self.leaders[i].hup = true;
            }
        }
        if let Some(w) = &mut self.watcher {
            for p in &pfds[rings_from..] {
                if p.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
                    w.thread_ring_hung_up(p.fd);
                }
            }
        }
        Ok(())
    }

    /// Attach mode: a thread whose event hung up has exited; its ring was just drained.
    fn drop_exited_threads(&mut self) {
        let gone: Vec<i64> = self
            .leaders
            .iter()
            .filter(|l| l.hup)
            .map(|l| l.key)
            .collect();
        if gone.is_empty() {
            return;
        }
        self.leaders.retain(|l| !l.hup);
        if let Some(w) = &mut self.watcher {
            gone.iter().for_each(|&k| w.remove(k));
        }
    }

    fn drain_all(&mut self, sink: &mut dyn FnMut(Event)) -> Result<(), DriverError> {
        // Launch: watch events come and go with windows. Ids of events opened since the last
        // drain are known before their records are read; those of events closed since are
        // forgotten after this drain, which reads everything written before the close.
        let mut closed = Vec::new();
        if let Some(w) = &mut self.watcher {
            for (id, slot) in w.take_opened_ids() {
                self.decoder.add_source(id, Source::Watch(slot));
            }
            closed = w.take_closed_ids();
        }
        let Session {
            leaders,
            decoder,
            scratch,
            batch,
            ring_errors,
            watcher,
            ..
        } = self;
        for l in leaders.iter_mut() {
            let hits = drain_ring(&mut l.ring, scratch, decoder, batch, ring_errors);
            if let (Some(w), true) = (watcher.as_mut(), hits > 0) {
                w.ring_samples(l.key, hits);
            }
        }
        // Launch: each watched thread's own ring (`watch::ThreadRing`), after the leaders:
        // an exit record read there is later than everything its thread wrote here.
        if let Some(w) = watcher.as_mut() {
            w.drain_thread_rings(|ring| drain_ring(ring, scratch, decoder, batch, ring_errors));
        }
        closed.iter().for_each(|&id| decoder.remove_source(id));
        // Watch markers queued since the last drain (arm/disarm between polls, duty-cycle
        // transitions at the last tick) are later than everything drained before and are
        // sorted in with the records that arrived since.
        if let Some(w) = &mut self.watcher {
            batch.extend(w.take_markers());
        }
        // Rings are drained one after another; order the batch so the detector sees
        // cross-CPU accesses in time order (stable: same-time records keep ring order).
        batch.sort_by_key(Event::time);
        let mut watch_hits = 0;
        let mut open_error = None;
        // A launched target's windows watch the threads and processes it creates, so their
        // CPU time joins the trap budget, and one created while a window counts gets its
        // events now (an attached target's threads are found by `rescan_threads`).
        let follow_forks = matches!(self.mode, Mode::Launched);
        for e in batch.drain(..) {
            if self.drop_foreign {
                match &e {
                    // Another process's sample from a CPU-wide sampler (laser's own threads
                    // among them), or its hit in a whole-CPU watch window: not the target's
                    // business. The hit spent its CPU's limit all the same.
                    Event::Sample(s) if !self.decoder.is_target(s.pid) => {
                        self.stats.foreign += 1;
                        let spent = match (s.watch_slot, self.watcher.as_mut()) {
                            (Some(slot), Some(w)) => w.note_foreign_hit(s.cpu, slot, s.time),
                            _ => None,
                        };
                        if let Some(m) = spent {
                            self.stats.account(&m);
                            sink(m);
                        }
                        continue;
                    }
                    // The decoder followed the forks as it read them (a task leader sees
                    // only the target's; a CPU-wide one every process's, and a process is
                    // the target's when its parent is).
                    Event::Fork { pid, .. } if !self.decoder.is_target(*pid) => continue,
                    Event::Mmap(m) if self.cpu_wide_leaders && !self.decoder.is_target(m.pid) => {
                        continue
                    }
                    Event::Comm { pid, .. } | Event::Exit { pid, .. }
                        if self.cpu_wide_leaders && !self.decoder.is_target(*pid) =>
                    {
                        continue
                    }
                    _ => {}
                }
            }
            // The end of a window that a spent limit stopped, due right after its hit.
            let mut spent = None;
            match (&e, self.watcher.as_mut()) {
                (Event::Sample(s), w) => {
                    if let (Some(slot), Some(w)) = (s.watch_slot, w) {
                        watch_hits += 1;
                        spent = w.note_hit(s.tid, s.cpu, slot, s.time);
                    }
                }
                (Event::Lost { .. }, Some(w)) => w.note_lost(),
                (
                    Event::Fork {
                        pid,
                        ppid,
                        tid,
                        time,
                        ..
                    },
                    Some(w),
                ) if follow_forks => {
                    if self
                        .last_fork_time
                        .is_some_and(|t| time.saturating_sub(t) >= CHURN_GAP)
                    {
                        self.last_fork = Some(Instant::now());
                    }
                    self.last_fork_time = Some(self.last_fork_time.map_or(*time, |t| t.max(*time)));
                    if pid != ppid {
                        w.add_process(*pid as libc::pid_t);
                    }
                    if let Some(g) = self.guard.as_mut() {
                        g.follow(*tid as i32);
                    }
                    if let Err(err) = w.thread_created(*tid as i32) {
                        open_error.get_or_insert(err);
                    }
                }
                (Event::Exit { pid, tid, .. }, Some(w)) => {
                    w.thread_exited(*tid as i32);
                    if pid == tid {
                        w.retire_process(*pid as libc::pid_t)
                    }
                }
                _ => {}
            }
            self.stats.account(&e);
            sink(e);
            if let Some(m) = spent {
                self.stats.account(&m);
                sink(m);
            }
        }
        if let Some(w) = &mut self.watcher {
            w.yield_to_peers()?;
            w.tick(Instant::now(), watch_hits)?;
        }
        open_error.map_or(Ok(()), Err)
    }

    /// The watchpoints, if `Config::watch` (or `backend = Watch`) was set and the target is
    /// guarded ([`Config::trap_guard`]): [`DriverError::WatchGuardStarting`] until the guard
    /// has every thread, [`DriverError::WatchUnguarded`] if it cannot (the windows are
    /// disarmed first if it failed after they armed).
    pub fn watch_mut(&mut self) -> Result<&mut Watcher, DriverError> {
        if self.watcher.is_none() {
            return Err(DriverError::WatchNotEnabled);
        }
        if self.guard_due.is_some() || !self.settle_guard_spawn(false) {
            return Err(DriverError::WatchGuardStarting);
        }
        match self.guard.as_mut().map(|g| g.poll()) {
            None | Some(GuardState::Ready) => {}
            Some(GuardState::Starting) => return Err(DriverError::WatchGuardStarting),
            // The target ended before it could be traced, or cannot be: the release disarms
            // the windows and says which.
            Some(GuardState::Gone | GuardState::Failed(_)) => self.release_guard(),
        }
        if let Some(why) = &self.unguarded {
            return Err(DriverError::WatchUnguarded {
                reason: why.to_string(),
            });
        }
        self.watcher.as_mut().ok_or(DriverError::WatchNotEnabled)
    }

    /// The watchpoints whether or not they may arm now: for their totals, and to disarm.
    pub fn watcher(&mut self) -> Option<&mut Watcher> {
        self.watcher.as_mut()
    }

    /// Takes the guard started in the background once it is (`block`: waits for it).
    /// Returns false while it is still being started.
    fn settle_guard_spawn(&mut self, block: bool) -> bool {
        match self.guard_spawn.take() {
            None => true,
            Some(h) if !block && !h.is_finished() => {
                self.guard_spawn = Some(h);
                false
            }
            Some(h) => {
                match h.join() {
                    Ok(Ok(g)) => self.guard = Some(g),
                    Ok(Err(e)) => {
                        self.unguarded =
                            Some(Unguarded::Failed(format!("starting the trap guard: {e}")))
                    }
                    Err(_) => {
                        self.unguarded =
                            Some(Unguarded::Failed("starting the trap guard panicked".into()))
                    }
                }
                true
            }
        }
    }

    /// Starts the trap guard where this session watches and names a guard executable.
    fn start_guard(&mut self) {
        let Some(exe) = self.config.trap_guard.clone() else {
            return;
        };
        if self.watcher.is_none()
            || self.guard.is_some()
            || self.guard_spawn.is_some()
            || self.exited.is_some()
        {
            return;
        }
        match TrapGuard::spawn(&exe, self.pid) {
            Ok(g) => {
                self.unguarded = None;
                self.guard = Some(g);
            }
            Err(e) => {
                self.unguarded = Some(Unguarded::Failed(format!(
                    "starting {}: {e}",
                    exe.display()
                )))
            }
        }
    }

    /// Waits up to `max` for the trap guard to have every thread (an allocation held for
    /// `--history-site` waits for its window).
    pub fn wait_guard(&mut self, max: Duration) {
        if self.guard_due.is_some() {
            self.spawn_guard();
        }
        self.settle_guard_spawn(true);
        if let Some(g) = self.guard.as_mut() {
            g.wait_ready(max);
        }
    }

    /// Ends the trap guard, which detaches it from every thread: before a repair seizes
    /// them (a thread has one tracer). Disarms the windows first; they stay off until
    /// [`Session::restore_guard`].
    pub fn release_guard(&mut self) {
        if self.guard_due.take().is_some() {
            // Not started yet: windows stay off all the same until `restore_guard`.
            self.unguarded = Some(Unguarded::Released);
            return;
        }
        self.settle_guard_spawn(true);
        if let Some(g) = self.guard.take() {
            if let Some(w) = self.watcher.as_mut() {
                let _ = w.disarm();
            }
            let (state, totals) = if self.exited.is_some() {
                g.finish_after_exit()
            } else {
                g.finish()
            };
            if let Some(t) = totals {
                self.guard_totals.add(&t);
            }
            self.unguarded = Some(match state {
                GuardState::Gone => Unguarded::EndedFirst,
                GuardState::Failed(why) => Unguarded::Failed(why),
                GuardState::Starting | GuardState::Ready => Unguarded::Released,
            });
        }
    }

    /// Starts a new trap guard after [`Session::release_guard`]; windows wait for it.
    pub fn restore_guard(&mut self) {
        if self.guard.is_none() && self.config.trap_guard.is_some() {
            self.unguarded = None;
            self.start_guard();
        }
    }

    /// Ends the trap guard and says, for the report, what it kept from the target, or why
    /// windows could not arm.
    pub fn guard_note(&mut self) -> Option<String> {
        self.release_guard();
        let kept = self.guard_totals.kept;
        if let Some(Unguarded::Failed(reason)) = &self.unguarded {
            return Some(format!(
                "watch windows: off, the target could not be traced to keep the SIGTRAP of a \
                 lost debug exception from it ({reason}); what only the windows find (sparse \
                 accesses, exact bytes, rates of briefly hot lines) is missing"
            ));
        }
        (kept > 0).then(|| {
            format!(
                "trap guard: kept {kept} SIGTRAP(s) from the target: debug exceptions the \
                 hypervisor delivered with no cause in DR6 (rare: ~1 breakpoint hit in 3 \
                 million on this kind of VM, more while several CPUs trap at once), which would \
                 have killed it; each cost its window one hit"
            )
        })
    }

    /// Totals of everything delivered so far (samples, lost, throttles, records).
    pub fn stats(&self) -> StreamStats {
        self.stats
    }

    /// Records that could not be parsed or framed (should stay 0; reports should say so if
    /// not).
    pub fn malformed_records(&self) -> u64 {
        self.decoder.malformed + self.ring_errors
    }

    /// The target's pid.
    /// Whether the CPUs are sampled whole, other processes' samples dropped as read
    /// ([`attr::soft_cpu_wide`]), rather than the target's threads each by its own timer.
    pub fn samples_whole_cpus(&self) -> bool {
        !self.samplers.is_empty()
    }

    /// The lowest and highest frequency of the whole-CPU samplers (None: none open).
    pub fn whole_cpu_hz(&self) -> Option<(u64, u64)> {
        Some((
            *self.sampler_hz.iter().min()?,
            *self.sampler_hz.iter().max()?,
        ))
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn backend(&self) -> BackendKind {
        self.config.backend
    }

    /// Attach mode: the threads covered so far (launch mode: empty; inheritance covers all).
    pub fn threads(&self) -> Vec<i32> {
        self.known_tids.iter().copied().collect()
    }

    /// Everything a recording header needs. Re-reads `/proc/PID/maps` now (call it after the
    /// first polls so a launched program's libraries are mapped).
    pub fn header_info(&self) -> HeaderInfo {
        let maps = read_maps(self.pid).unwrap_or_else(|_| self.maps_snapshot.clone());
        let parsed = procinfo::parse_maps(&maps);
        // The sampling event first: with CPU-wide samplers that is theirs, and the leaders
        // (tracking only) come second.
        let mut attrs = Vec::new();
        if !self.samplers.is_empty() {
            let a = attr::soft_cpu_wide(self.config.frequency);
            attrs.push(AttrInfo {
                bytes: attr::to_bytes(&a),
                description: attr::describe(&a),
            });
        }
        attrs.push(AttrInfo {
            bytes: attr::to_bytes(&self.leader_attr),
            description: attr::describe(&self.leader_attr),
        });
        for a in self.precise.iter().flat_map(PrecisePlan::attrs) {
            attrs.push(AttrInfo {
                bytes: attr::to_bytes(&a),
                description: attr::describe(&a),
            });
        }
        if self.watcher.is_some() {
            let binding = match self.mode {
                Mode::Launched => Binding::Launch,
                Mode::Attached => Binding::Attach,
            };
            let w = attr::watch(binding, 1);
            attrs.push(AttrInfo {
                bytes: attr::to_bytes(&w),
                description: attr::describe(&w),
            });
        }
        HeaderInfo {
            backend: self.config.backend,
            pid: self.pid as u32,
            command: self.command.clone(),
            frequency: self.config.frequency,
            attrs,
            cpu_model: std::fs::read_to_string("/proc/cpuinfo")
                .ok()
                .and_then(|t| procinfo::cpu_model(&t)),
            build_ids: procinfo::read_build_ids(&parsed),
            maps,
            start_time_unix_ns: self.start_unix_ns,
            start_time_perf_ns: self.start_perf_ns,
        }
    }
}

fn checked(config: &Config) -> Result<Config, DriverError> {
    match config.backend {
        BackendKind::Soft | BackendKind::Watch => {}
        // Plan now, before a program is started: without the hardware this says what is
        // missing (no `cpu` PMU, no `mem-loads` event, no `ibs_op`, Zen 3).
        b @ (BackendKind::Pebs | BackendKind::Ibs) => {
            PrecisePlan::system(b, Binding::Launch)?;
        }
    }
    if config.backend == BackendKind::Soft {
        let max = std::fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
            .ok()
            .and_then(|t| t.trim().parse().ok());
        check_frequency(config.frequency, max)?;
    }
    Ok(config.clone())
}

/// Bytes of records after which a leader wakes the reader: a quarter of its ring.
fn wakeup_bytes(mode: Mode, config: &Config) -> u32 {
    let pages = match mode {
        Mode::Launched => config.buffer_pages,
        Mode::Attached => (config.buffer_pages / 4).max(8),
    }
    .max(1)
    .next_power_of_two();
    (pages * 4096 / 4).min(u32::MAX as usize) as u32
}

/// Whether this machine lets laser sample whole CPUs (`perf_event_paranoid` ≤ 0, or
/// `CAP_PERFMON`/root): tried with a real open on CPU 0, closed at once. Without, the launch
/// leaders sample per task as before, and pay a timer reprogramming at every context switch.
fn cpu_wide_allowed(freq: u64) -> bool {
    let a = attr::soft_cpu_wide(freq);
    sys::open(&a, -1, 0, "cpu-clock sampling of cpu 0 (probe)").is_ok()
}

/// The kernel rejects `sample_freq` above `perf_event_max_sample_rate` with a bare EINVAL;
/// say which limit it is and how to raise it instead.
fn check_frequency(requested: u64, max: Option<u64>) -> Result<(), DriverError> {
    if requested == 0 {
        return Err(DriverError::BadFrequency {
            requested,
            reason: "must be at least 1 Hz".into(),
        });
    }
    match max {
        Some(max) if requested > max => Err(DriverError::BadFrequency {
            requested,
            reason: format!(
                "/proc/sys/kernel/perf_event_max_sample_rate is {max} (the kernel lowers it \
                 when sampling interrupts take too long); use a lower frequency or raise it \
                 with `sudo sysctl kernel.perf_event_max_sample_rate={requested}`"
            ),
        }),
        _ => Ok(()),
    }
}

pub(crate) fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into a live local.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// [`Session::note_premapped`]'s events, taken in as the leaders' records would have been:
/// the decoder learns the mappings and the forked processes, and the watcher counts a forked
/// process's CPU time toward the budget that pays for its windows' cooldowns, as it does for
/// a Fork record it reads (`drain_ring`'s `add_process`). Without that, a program whose work
/// runs in a process it forked before the events counted paid for no cooldown: one window a
/// run (the early-fork CLI test, once in CI: its line stayed under the threshold, unwatched).
/// Then they are queued for the first poll.
fn adopt_premapped(
    decoder: &mut Decoder,
    mut watcher: Option<&mut Watcher>,
    pending: &mut VecDeque<Event>,
    events: Vec<Event>,
) {
    for e in events {
        match &e {
            Event::Mmap(m) => decoder.note_mmap(m),
            Event::Fork { pid, ppid, .. } => {
                decoder.add_target(*pid);
                if let (Some(w), true) = (watcher.as_deref_mut(), pid != ppid) {
                    w.add_process(*pid as libc::pid_t);
                }
            }
            _ => {}
        }
        pending.push_back(e);
    }
}

/// Ends a launched program laser could not go on observing, and reaps it.
fn kill_and_reap(pid: i32) {
    // SAFETY: kill has no memory-safety preconditions; `pid` is our unreaped child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    let _ = launch::wait(pid, false);
}

fn read_maps(pid: i32) -> io::Result<String> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
}

/// A pidfd for `pid`, or `None` where the kernel has no `pidfd_open` (before 5.3).
/// Reads every record of `ring` into `batch`, decoded (a ring that cannot be framed any more
/// counts in `errors`), and returns how many watch samples were among them: the kernel counts
/// wake-ups per ring (`watch::RingWake`).
fn drain_ring(
    ring: &mut MmapRing,
    scratch: &mut Vec<u8>,
    decoder: &mut Decoder,
    batch: &mut Vec<Event>,
    errors: &mut u64,
) -> u64 {
    let before = batch.len();
    if ring::drain(ring, scratch, |raw| batch.extend(decoder.decode(raw))).is_err() {
        *errors += 1;
    }
    batch[before..]
        .iter()
        .filter(|e| matches!(e, Event::Sample(s) if s.watch_slot.is_some()))
        .count() as u64
}

fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; nothing
    // else is read or written.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<Session>();
    }

    /// A process the launched one forked before the events counted is taken in from /proc:
    /// the decoder follows it, and the watcher budgets with its CPU time.
    #[test]
    fn a_process_forked_before_the_events_counts_toward_the_watch_budget() {
        let mut parent = std::process::Command::new("sleep")
            .arg("20")
            .spawn()
            .unwrap();
        let mut child = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap();
        let (ppid, pid) = (parent.id(), child.id());
        let info =
            attr::parse_info(&attr::to_bytes(&attr::soft(Binding::Launch, 1000, 0))).unwrap();
        let mut decoder = Decoder::new(info, Source::Soft);
        decoder.follow(ppid, true);
        let mut w = Watcher::new(
            Binding::Launch,
            DutyCycle::default(),
            Some(ppid as libc::pid_t),
        );
        let mut pending = VecDeque::new();
        let fork = Event::Fork {
            pid,
            ppid,
            tid: pid,
            ptid: ppid,
            time: 0,
        };
        adopt_premapped(&mut decoder, Some(&mut w), &mut pending, vec![fork]);
        let t0 = Instant::now();
        while sys::process_cpu_time(pid as libc::pid_t).unwrap() < Duration::from_millis(30)
            && t0.elapsed() < Duration::from_secs(20)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        let counted = w.target_cpu();
        for p in [&mut parent, &mut child] {
            let _ = p.kill();
            let _ = p.wait();
        }
        assert!(decoder.is_target(pid), "the forked process is the target's");
        assert_eq!(pending.len(), 1, "queued for the first poll");
        assert!(
            counted >= Duration::from_millis(30),
            "the forked process's CPU counts toward the budget: {counted:?}"
        );
    }

    #[test]
    fn frequency_limits_are_explained() {
        assert!(check_frequency(1000, Some(100_000)).is_ok());
        assert!(check_frequency(1000, None).is_ok());
        let e = check_frequency(200_000, Some(100_000))
            .unwrap_err()
            .to_string();
        assert!(e.contains("200000") && e.contains("is 100000"), "{e}");
        assert!(
            e.contains("sysctl kernel.perf_event_max_sample_rate"),
            "{e}"
        );
        assert!(check_frequency(0, Some(100_000)).is_err());
    }

    #[test]
    fn precise_backends_without_hardware_are_refused_with_advice() {
        // Machines of this project have no PMU; elsewhere the plan succeeds.
        if std::path::Path::new("/sys/bus/event_source/devices/ibs_op").exists() {
            return;
        }
        let c = Config {
            backend: BackendKind::Ibs,
            ..Config::default()
        };
        let e = checked(&c).unwrap_err().to_string();
        assert!(e.contains("no IBS") && e.contains("--backend soft"), "{e}");
    }
}
