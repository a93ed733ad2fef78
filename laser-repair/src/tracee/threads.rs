//! `ThreadLock`: every thread of a process seized and held in a ptrace-stop; `Drop` undoes it.
//!
//! Seizing a live multithreaded process races with thread creation and exit:
//!
//! ```text
//!  pass 1: /proc/PID/task = {A, B}      seize+interrupt A, B; wait for both stops
//!          B was inside clone()    ──▶  PTRACE_EVENT_CLONE: C is auto-attached (TRACECLONE)
//!  pass 2: /proc/PID/task = {A, B, C}   C known (its first stop waited for) → nothing new
//!  pass 3: nothing new                   two quiet passes in a row → every thread is held
//! ```
//!
//! A thread that vanishes on the way (`ESRCH`, or `EPERM` from a zombie) is gone, not an error.
//!
//! Signals: a thread whose first stop is a signal-delivery-stop stays in it, and the signal is
//! handed back with `PTRACE_DETACH(sig)`, which delivers it with its original siginfo at the
//! (possibly moved) RIP. Signals that arrive while laser runs a thread for an injected syscall
//! cannot stay pending in the stop, so they are re-sent with `tgkill` just before detaching
//! (same number, to the thread that took it; the siginfo then says SI_TKILL from laser's pid). Only SIGTRAPs raised by our own single-steps
//! are swallowed. Real-time signals are handled like any other (raw numbers, see `sys`).
//! Signals merely pending when a thread is interrupted (the interrupt stop comes first) stay
//! pending and are delivered normally once the thread is detached.
//!
//! Registers: `set_regs` remembers a thread's registers from before laser's first change;
//! unless `commit_regs` is called, `Drop` puts them back before detaching. Restoring registers in
//! a ptrace-stop is also what keeps an interrupted syscall intact: see `remote`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use libc::user_regs_struct;
use nix::errno::Errno;
use nix::sys::ptrace;
use nix::unistd::Pid;

use super::error::{Result, TraceeError};
use super::maps;
use super::sys::{self, WaitEvent, PTRACE_EVENT_CLONE, PTRACE_EVENT_STOP};

/// How long one thread may take to reach a stop before laser gives up (and undoes).
const STOP_TIMEOUT: Duration = Duration::from_secs(3);

/// The ptrace-stop a held thread is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopKind {
    /// `PTRACE_INTERRUPT` stop (or the first stop of an auto-attached thread).
    Interrupt,
    /// Group-stop: the process is job-control stopped by this signal.
    GroupStop(i32),
    /// Another `PTRACE_EVENT_*` stop (e.g. `PTRACE_EVENT_CLONE` in the parent).
    Event(i32),
    /// Signal-delivery-stop for a signal from outside laser.
    Signal(i32),
    /// After one of laser's single-steps.
    Stepped,
}

#[derive(Debug)]
struct Thread {
    /// Seized but its stop not reported yet.
    running: bool,
    stop: StopKind,
    /// Signal to deliver with `PTRACE_DETACH` (thread still in its signal-delivery-stop).
    pass_on: Option<i32>,
    /// Signals to re-send with `tgkill` before detaching.
    deferred: Vec<i32>,
    /// Registers before laser's first uncommitted change.
    orig_regs: Option<user_regs_struct>,
}

impl Thread {
    fn running() -> Self {
        Thread {
            running: true,
            stop: StopKind::Interrupt,
            pass_on: None,
            deferred: Vec::new(),
            orig_regs: None,
        }
    }
}

/// What one hold cost the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LockStats {
    /// From the first `PTRACE_INTERRUPT` to the last detach: the longest any thread was held.
    pub paused: Duration,
    /// Threads held (not counting those that exited meanwhile).
    pub threads: usize,
    /// Foreign signals handed back to the target.
    pub signals_passed: usize,
    /// Threads created while laser was seizing (auto-attached through `PTRACE_EVENT_CLONE`).
    pub clone_events: usize,
    /// Where the hold's time went (see [`HoldPhases`]).
    pub phases: HoldPhases,
}

/// One hold's time by phase. `seize` and `detach` are the lock's; `syscalls` (injected mmap,
/// mprotect, munmap) and `writes` (cache fill, patches, read back) are filled in by the
/// transaction that used the lock; the rest of `paused` is reading registers, maps and
/// records, planning and moving threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HoldPhases {
    /// First `PTRACE_INTERRUPT` → every thread in a ptrace-stop.
    pub seize: Duration,
    pub syscalls: Duration,
    pub writes: Duration,
    /// Start of the release (registers restored, signals re-sent) → last `PTRACE_DETACH`.
    pub detach: Duration,
}

impl HoldPhases {
    pub fn add(&mut self, o: &HoldPhases) {
        self.seize += o.seize;
        self.syscalls += o.syscalls;
        self.writes += o.writes;
        self.detach += o.detach;
    }
}

/// Every thread of one process, held in ptrace-stops until dropped or released.
#[derive(Debug)]
pub struct ThreadLock {
    pid: i32,
    threads: BTreeMap<i32, Thread>,
    gone: BTreeSet<i32>,
    started: Option<Instant>,
    /// How long `seize_all` took from the first interrupt.
    seize_time: Duration,
    /// Filled in by the transaction using the lock (reported in `LockStats::phases`).
    pub(crate) phases: HoldPhases,
    clone_events: usize,
    released: bool,
    /// The tracer thread's scheduling, raised for the hold (see [`RealTime`]).
    rt: Option<RealTime>,
    /// ptrace binds a tracee to the tracer *thread*: the lock must stay on the thread that made
    /// it (ptrace calls from another thread fail with ESRCH).
    _not_send: std::marker::PhantomData<*const ()>,
}

impl ThreadLock {
    /// Seizes and interrupts every thread of `pid` (including threads created meanwhile) and
    /// waits until all are in a ptrace-stop.
    pub fn seize_all(pid: i32) -> Result<Self> {
        Self::seize_all_with_hook(pid, &mut |_| {})
    }

    /// `seize_all` calling `between_seize_and_interrupt(tid)` in the window between the two
    /// requests: lets tests make a signal arrive there, which is the one way a thread's first
    /// stop becomes a signal-delivery-stop (otherwise the interrupt stop comes first).
    #[doc(hidden)]
    pub fn seize_all_with_hook(
        pid: i32,
        between_seize_and_interrupt: &mut dyn FnMut(i32),
    ) -> Result<Self> {
        let mut lock = ThreadLock {
            pid,
            threads: BTreeMap::new(),
            gone: BTreeSet::new(),
            started: None,
            seize_time: Duration::ZERO,
            phases: HoldPhases::default(),
            clone_events: 0,
            released: false,
            rt: RealTime::for_hold(),
            _not_send: std::marker::PhantomData,
        };
        let mut quiet = 0;
        while quiet < 2 {
            let mut found_new = false;
            for tid in list_tasks(pid)? {
                if lock.threads.contains_key(&tid) || lock.gone.contains(&tid) {
                    continue;
                }
                found_new = true;
                lock.seize_one(tid, between_seize_and_interrupt)?;
            }
            lock.settle()?;
            quiet = if found_new { 0 } else { quiet + 1 };
        }
        if lock.threads.is_empty() {
            return Err(TraceeError::NoSuchProcess { pid });
        }
        lock.seize_time = lock.paused_so_far();
        Ok(lock)
    }

    fn seize_one(&mut self, tid: i32, hook: &mut dyn FnMut(i32)) -> Result<()> {
        let p = Pid::from_raw(tid);
        match ptrace::seize(p, ptrace::Options::PTRACE_O_TRACECLONE) {
            Ok(()) => {}
            Err(Errno::ESRCH) => {
                self.gone.insert(tid);
                return Ok(());
            }
            Err(Errno::EPERM) => {
                let status =
                    std::fs::read_to_string(format!("/proc/{}/task/{tid}/status", self.pid));
                match status {
                    Err(_) => {
                        self.gone.insert(tid);
                    }
                    Ok(s) if maps::is_dead(&s) => {
                        self.gone.insert(tid);
                    }
                    // Auto-attached by our TRACECLONE before we saw its clone event.
                    Ok(s) if maps::tracer_pid(&s) == Some(std::process::id() as i32) => {
                        self.threads.insert(tid, Thread::running());
                    }
                    Ok(_) => {
                        return Err(TraceeError::Seize {
                            tid,
                            errno: Errno::EPERM,
                        })
                    }
                }
                return Ok(());
            }
            Err(errno) => return Err(TraceeError::Seize { tid, errno }),
        }
        self.started.get_or_insert_with(Instant::now);
        self.threads.insert(tid, Thread::running());
        hook(tid);
        match ptrace::interrupt(p) {
            // An exited thread still reports its exit to us; `settle` reaps it.
            Ok(()) | Err(Errno::ESRCH) => Ok(()),
            Err(errno) => Err(TraceeError::ptrace("PTRACE_INTERRUPT", tid, errno)),
        }
    }

    /// Waits until every seized thread is in a ptrace-stop (or gone).
    fn settle(&mut self) -> Result<()> {
        while let Some(tid) = self
            .threads
            .iter()
            .find(|(_, t)| t.running)
            .map(|(&tid, _)| tid)
        {
            let ev = match sys::wait_for(tid, STOP_TIMEOUT) {
                Ok(Some(ev)) => ev,
                Ok(None) => {
                    return Err(TraceeError::StopTimeout {
                        tid,
                        waited_ms: STOP_TIMEOUT.as_millis() as u64,
                    })
                }
                Err(Errno::ECHILD) => {
                    self.mark_gone(tid);
                    continue;
                }
                Err(errno) => return Err(TraceeError::ptrace("waitpid", tid, errno)),
            };
            self.on_stop(tid, ev);
        }
        Ok(())
    }

    /// Records what a stop report means for `tid`.
    fn on_stop(&mut self, tid: i32, ev: WaitEvent) {
        match ev {
            WaitEvent::Exited(_) | WaitEvent::Killed(_) => self.mark_gone(tid),
            WaitEvent::Event { event, sig } => {
                if event == PTRACE_EVENT_CLONE {
                    if let Ok(child) = ptrace::getevent(Pid::from_raw(tid)) {
                        self.clone_events += 1;
                        self.threads
                            .entry(child as i32)
                            .or_insert_with(Thread::running);
                    }
                }
                let stop = match (event, sig) {
                    (PTRACE_EVENT_STOP, libc::SIGTRAP) => StopKind::Interrupt,
                    (PTRACE_EVENT_STOP, s) => StopKind::GroupStop(s),
                    (e, _) => StopKind::Event(e),
                };
                self.set_stopped(tid, stop, None);
            }
            WaitEvent::Signal(sig) => self.set_stopped(tid, StopKind::Signal(sig), Some(sig)),
            WaitEvent::Other(_) => {}
        }
    }

    fn set_stopped(&mut self, tid: i32, stop: StopKind, pass_on: Option<i32>) {
        if let Some(t) = self.threads.get_mut(&tid) {
            t.running = false;
            t.stop = stop;
            t.pass_on = pass_on;
        }
    }

    fn mark_gone(&mut self, tid: i32) {
        self.threads.remove(&tid);
        self.gone.insert(tid);
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Held threads, ascending.
    pub fn tids(&self) -> Vec<i32> {
        self.threads.keys().copied().collect()
    }

    /// The stop `tid` is in.
    pub fn stop_kind(&self, tid: i32) -> Option<StopKind> {
        self.threads.get(&tid).map(|t| t.stop)
    }

    /// Whether `tid` holds a foreign signal to pass on at detach.
    pub fn has_pending_signal(&self, tid: i32) -> bool {
        self.threads
            .get(&tid)
            .is_some_and(|t| t.pass_on.is_some() || !t.deferred.is_empty())
    }

    /// Time since the first thread was interrupted.
    pub fn paused_so_far(&self) -> Duration {
        self.started.map(|s| s.elapsed()).unwrap_or_default()
    }

    pub fn regs(&self, tid: i32) -> Result<user_regs_struct> {
        self.check(tid)?;
        ptrace::getregs(Pid::from_raw(tid)).map_err(|e| TraceeError::ptrace("GETREGS", tid, e))
    }

    /// Sets the registers of `tid`, remembering the original ones for `Drop`.
    pub fn set_regs(&mut self, tid: i32, regs: &user_regs_struct) -> Result<()> {
        self.check(tid)?;
        // Only the first change needs the originals (one GETREGS less per injected syscall).
        if self
            .threads
            .get(&tid)
            .is_some_and(|t| t.orig_regs.is_none())
        {
            let orig = self.regs(tid)?;
            if let Some(t) = self.threads.get_mut(&tid) {
                t.orig_regs = Some(orig);
            }
        }
        ptrace::setregs(Pid::from_raw(tid), *regs)
            .map_err(|e| TraceeError::ptrace("SETREGS", tid, e))
    }

    /// Makes all register changes so far permanent (not restored at detach).
    pub fn commit_regs(&mut self) {
        for t in self.threads.values_mut() {
            t.orig_regs = None;
        }
    }

    /// Puts back the registers of every thread changed since the last commit.
    pub fn restore_regs(&mut self) {
        for (&tid, t) in self.threads.iter_mut() {
            if let Some(orig) = t.orig_regs.take() {
                if let Err(e) = ptrace::setregs(Pid::from_raw(tid), orig) {
                    log::warn!("laser: restoring registers of thread {tid}: {e}");
                }
            }
        }
    }

    fn check(&self, tid: i32) -> Result<()> {
        match self.threads.get(&tid) {
            Some(t) if !t.running => Ok(()),
            _ => Err(TraceeError::NotTraced { tid }),
        }
    }

    /// Executes one instruction of `tid` (the tracer has set its RIP) and returns when it has
    /// run. Foreign signals arriving meanwhile are deferred; stops that come before the
    /// instruction ran (a pending interrupt, a signal) just lead to another step.
    pub(crate) fn step(&mut self, tid: i32) -> Result<()> {
        self.check(tid)?;
        let start_rip = self.regs(tid)?.rip;
        if let Some(t) = self.threads.get_mut(&tid) {
            // Stepping out of a signal-delivery-stop with signal 0 would drop the signal.
            if let Some(sig) = t.pass_on.take() {
                t.deferred.push(sig);
            }
        }
        // Each signal-delivery-stop consumes one pending signal, so a flood of queued signals
        // needs as many rounds as there are signals: only other stops count against the limit,
        // and the whole step against a deadline.
        let deadline = std::time::Instant::now() + STOP_TIMEOUT;
        let mut idle_rounds = 0;
        while idle_rounds < 64 && std::time::Instant::now() < deadline {
            sys::step(tid, 0).map_err(|e| TraceeError::ptrace("SINGLESTEP", tid, e))?;
            let ev = match sys::wait_for(tid, STOP_TIMEOUT) {
                Ok(Some(ev)) => ev,
                Ok(None) => {
                    return Err(TraceeError::StopTimeout {
                        tid,
                        waited_ms: STOP_TIMEOUT.as_millis() as u64,
                    })
                }
                Err(errno) => return Err(TraceeError::ptrace("waitpid", tid, errno)),
            };
            match ev {
                WaitEvent::Exited(_) | WaitEvent::Killed(_) => {
                    self.mark_gone(tid);
                    return Err(TraceeError::ThreadGone { tid });
                }
                // Kernel-raised trap (si_code > 0): ours, from the single-step.
                WaitEvent::Signal(libc::SIGTRAP)
                    if sys::siginfo_code(tid).map(|c| c > 0).unwrap_or(false) =>
                {
                    self.set_stopped(tid, StopKind::Stepped, None);
                    if self.regs(tid)?.rip != start_rip {
                        return Ok(());
                    }
                    idle_rounds += 1;
                }
                WaitEvent::Signal(sig) => {
                    self.set_stopped(tid, StopKind::Signal(sig), None);
                    if let Some(t) = self.threads.get_mut(&tid) {
                        t.deferred.push(sig);
                    }
                }
                other => {
                    idle_rounds += 1;
                    self.on_stop(tid, other);
                    // A clone event cannot come from our own instruction, but a thread can
                    // be reported this way; make sure any new thread is held too.
                    self.settle()?;
                }
            }
        }
        Err(TraceeError::Ptrace {
            op: "SINGLESTEP (no progress after 64 stops or 3 s)",
            tid,
            errno: Errno::EAGAIN,
        })
    }

    /// Restores uncommitted registers, passes on signals and detaches every thread.
    pub fn release(mut self) -> LockStats {
        self.release_inner()
    }

    fn release_inner(&mut self) -> LockStats {
        if self.released {
            return LockStats::default();
        }
        self.released = true;
        let release_start = Instant::now();
        self.restore_regs();
        let mut stats = LockStats {
            clone_events: self.clone_events,
            ..LockStats::default()
        };
        // Phase 1: everything that is not a detach, so phase 2 releases all threads in one
        // tight loop: the pause ends at the last detach. (Each PTRACE_DETACH itself may wait in
        // the kernel until the thread is off its runqueue; on a loaded machine that showed up as
        // a few ms per busy thread.)
        for tid in self.tids() {
            let running = self.threads.get(&tid).is_some_and(|t| t.running);
            if running {
                // Seized but never reported: a thread must be in a stop to be detached.
                match sys::wait_for(tid, STOP_TIMEOUT) {
                    Ok(Some(ev)) => self.on_stop(tid, ev),
                    other => {
                        log::warn!("laser: thread {tid} never stopped ({other:?}); cannot detach");
                        self.threads.remove(&tid);
                        continue;
                    }
                }
            }
            let Some(t) = self.threads.get_mut(&tid) else {
                continue;
            };
            for sig in std::mem::take(&mut t.deferred) {
                match sys::tgkill(self.pid, tid, sig) {
                    Ok(()) => stats.signals_passed += 1,
                    Err(e) => log::warn!("laser: re-sending signal {sig} to thread {tid}: {e}"),
                }
            }
        }
        // Phase 2.
        for (&tid, t) in &self.threads {
            let sig = t.pass_on.unwrap_or(0);
            match sys::detach(tid, sig) {
                Ok(()) => {
                    stats.threads += 1;
                    if sig != 0 {
                        stats.signals_passed += 1;
                    }
                }
                Err(Errno::ESRCH) => {}
                Err(e) => log::warn!("laser: detaching thread {tid}: {e}"),
            }
        }
        stats.paused = self.paused_so_far();
        stats.phases = HoldPhases {
            seize: self.seize_time,
            detach: release_start.elapsed(),
            ..self.phases
        };
        // Only after the last detach: a detached worker must not take the CPU between two.
        // (Dropping it lets the workers preempt the tracer at once: not part of the hold.)
        drop(self.rt.take());
        stats
    }
}

impl Drop for ThreadLock {
    fn drop(&mut self) {
        let _ = self.release_inner();
    }
}

/// The calling thread at `SCHED_FIFO` (priority 1, above every ordinary task, below the
/// kernel's own real-time threads) until dropped, when its own policy is put back.
///
/// The tracer runs a hold this way: a hold waits for the tracer more than for the target:
/// between two ptrace requests, and after each sleep while it polls for stops, the tracer is
/// an ordinary task competing with the workers it has not stopped yet (or has just released),
/// and on 2 busy vCPUs with a 4 ms tick that cost 0.1–25.8 ms to seize and 1.5–5 ms to detach
/// per hold (issue 15). A real-time tracer preempts them at once. It only ever runs short
/// ptrace and /proc calls and sleeps while it waits, so it cannot starve the threads it waits
/// for, and the kernel's real-time throttling bounds it anyway. The monitor's ring reader
/// uses it while a watch window counts (`src/monitor.rs`). Without the privilege (not root,
/// no CAP_SYS_NICE), or with the caller's opt-out variable set, nothing changes.
#[derive(Debug)]
pub struct RealTime {
    policy: libc::c_int,
    param: libc::sched_param,
}

impl RealTime {
    const PRIORITY: libc::c_int = 1;

    /// Raises the calling thread, unless the environment variable `opt_out` is set (for
    /// measuring what the policy changes) or the thread is real-time already (a caller's
    /// choice: left as it is). `None`: nothing changed.
    pub fn raise_unless(opt_out: &str) -> Option<RealTime> {
        if std::env::var_os(opt_out).is_some() {
            return None;
        }
        // SAFETY: sched_getscheduler/sched_getparam/sched_setscheduler on the calling thread
        // (tid 0) with a sched_param we own; no memory is shared with the kernel afterwards.
        unsafe {
            let policy = libc::sched_getscheduler(0);
            let mut param: libc::sched_param = std::mem::zeroed();
            if policy < 0 || libc::sched_getparam(0, &mut param) != 0 {
                return None;
            }
            if policy & !libc::SCHED_RESET_ON_FORK != libc::SCHED_OTHER
                && policy & !libc::SCHED_RESET_ON_FORK != libc::SCHED_BATCH
            {
                return None;
            }
            let rt = libc::sched_param {
                sched_priority: Self::PRIORITY,
            };
            // RESET_ON_FORK: a thread or process started meanwhile does not inherit it.
            (libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &rt) == 0)
                .then_some(RealTime { policy, param })
        }
    }

    /// For one hold: `LASER_HOLDS_NO_RT` opts out (scripts/hold-cost's A/B).
    fn for_hold() -> Option<RealTime> {
        RealTime::raise_unless("LASER_HOLDS_NO_RT")
    }
}

impl Drop for RealTime {
    fn drop(&mut self) {
        // SAFETY: as in `raise_unless`; the saved policy keeps its own RESET_ON_FORK bit and
        // an ordinary policy its nice value.
        if unsafe { libc::sched_setscheduler(0, self.policy, &self.param) } != 0 {
            log::warn!(
                "laser: restoring a thread's scheduling policy: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Whether holds made by this thread run its tracer at `SCHED_FIFO` (root or CAP_SYS_NICE):
/// they are then several times shorter on a loaded machine, which a budget for holds may
/// count on before it has measured one.
pub fn realtime_holds() -> bool {
    RealTime::for_hold().is_some()
}

/// Thread ids in `/proc/PID/task`.
pub fn list_tasks(pid: i32) -> Result<Vec<i32>> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            TraceeError::NoSuchProcess { pid }
        } else {
            TraceeError::io(pid, "listing /proc/PID/task", e)
        }
    })?;
    let mut tids: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    Ok(tids)
}
