//! The trap guard: keeps the SIGTRAPs of lost debug exceptions from the target.
//!
//! On this kind of machine (a KVM guest) a breakpoint hit sometimes reaches the guest kernel
//! with DR6 empty: the hypervisor lost the cause. Counted on this VM with a C program that
//! only watches one of its own variables through a perf breakpoint: 3 in 10,000,000 hits
//! with one CPU trapping, and all 5 runs of 2,000,000 hits killed while both CPUs trapped at
//! once. The kernel cannot tell that `#DB` from the `int1` instruction (icebp) and sends the
//! thread SIGTRAP with `si_code` `TRAP_BRKPT`. Nothing a perf event can ask for stops that
//! signal, and its default action kills the program (exit 133, with a core): one 1-second
//! asm-test run in ~750 under laser's watch windows died that way, and a CI run lost a test.
//!
//! A ptrace tracer sees every signal before its tracee does, so while laser's windows may
//! trap, a small process of its own ([`serve`], run as `laser trap-guard PID`) traces every
//! thread of the target with `PTRACE_SEIZE`, which stops nothing by itself, and follows the
//! threads and processes it creates. It passes on every signal as it came, except a SIGTRAP
//! only a lost debug exception explains ([`spurious`]), which it drops and counts: each one
//! cost its watch window one hit.
//!
//! ```text
//!  laser ── (a thread of its own) spawn `laser trap-guard PID`
//!                       guard: seize every thread (following clones and forks) ─▶ "ready N"
//!  (watch windows wait for "ready"; "error …" turns them off, the run goes on)
//!         ◀─ tracee stops (signals, clones, group-stops): passed on or resumed at once
//!  ── "TID" ─▶ a thread laser read the creation of: seized if new (after CHURN_CLONES)
//!  laser closes the guard's stdin (run over, or a repair needs the tracees); or the
//!  target's last thread exits
//!                                   guard: resumes what is pending, prints "done KEPT
//!                                   PASSED CLONES FORWARDED", exits; the kernel detaches
//!                                   every tracee
//! ```
//!
//! A separate process rather than a thread of laser: laser's `waitpid` of its child would
//! otherwise also collect the ptrace stops of that child, and a tracer that dies for any
//! reason only detaches its tracees, which run on.

use std::collections::BTreeSet;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// `si_code` of a SIGTRAP from `int1` or from a `#DB` whose DR6 names no cause.
const TRAP_BRKPT: i32 = 1;
/// `si_code` of a SIGTRAP from a hardware breakpoint the kernel found no handler for. Only a
/// ptrace tracer's own breakpoints send it, and the guard sets none.
const TRAP_HWBKPT: i32 = 4;
/// The `int1` (icebp) opcode: a program's own `int1` traps with `TRAP_BRKPT` too.
const INT1: u8 = 0xf1;

/// What a tracee stop is, from the `waitpid` status (`PTRACE_SEIZE` semantics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// A signal about to be delivered.
    Signal(i32),
    /// A group-stop (SIGSTOP and its kin): the tracee must stay stopped until SIGCONT.
    Group,
    /// A thread creation (`PTRACE_EVENT_CLONE`): resumed, and counted ([`CHURN_CLONES`]).
    Clone,
    /// Any other ptrace event (fork, exec, an interrupt, a new thread's first stop):
    /// resumed with nothing to deliver.
    Event,
}

/// Classifies a stopped status.
pub fn stop_of(status: i32) -> Stop {
    let sig = (status >> 8) & 0xff;
    match status >> 16 {
        0 => Stop::Signal(sig),
        libc::PTRACE_EVENT_STOP
            if matches!(
                sig,
                libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
            ) =>
        {
            Stop::Group
        }
        libc::PTRACE_EVENT_CLONE => Stop::Clone,
        _ => Stop::Event,
    }
}

/// Whether a SIGTRAP with this `si_code` at this address is a lost debug exception, given
/// the byte before the address (`None`: unreadable). `int1` traps after itself, so a
/// program's own `int1` has its opcode right before the address and is passed on.
pub fn spurious(si_code: i32, byte_before: Option<u8>) -> bool {
    match si_code {
        TRAP_HWBKPT => true,
        TRAP_BRKPT => byte_before != Some(INT1),
        _ => false,
    }
}

fn ptrace(req: libc::c_uint, tid: i32, addr: usize, data: usize) -> io::Result<libc::c_long> {
    // SAFETY: the requests used here take integers, or (GETSIGINFO) a pointer to a live
    // local of the size the kernel writes. errno is cleared first: PEEKDATA's word may be -1.
    let r = unsafe {
        *libc::__errno_location() = 0;
        libc::ptrace(
            req,
            tid,
            addr as *mut libc::c_void,
            data as *mut libc::c_void,
        )
    };
    if r == -1 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(0) {
            return Err(e);
        }
    }
    Ok(r)
}

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// The tracer's state.
struct Guard {
    tracees: BTreeSet<i32>,
    /// `PTRACE_SETOPTIONS` of a seize: clone and fork following, until [`CHURN_CLONES`].
    options: usize,
    kept: u64,
    passed: u64,
    /// Thread creations stopped for ([`Stop::Clone`]).
    clones: u64,
    /// Threads seized from laser's word after the switch.
    forwarded: u64,
}

/// Following: clones and forks, or forks only.
const FOLLOW_ALL: usize =
    (libc::PTRACE_O_TRACECLONE | libc::PTRACE_O_TRACEFORK | libc::PTRACE_O_TRACEVFORK) as usize;
const FOLLOW_FORKS: usize = (libc::PTRACE_O_TRACEFORK | libc::PTRACE_O_TRACEVFORK) as usize;

/// Thread creations the guard stops for before it stops no more. `PTRACE_O_TRACECLONE`
/// stops the creating thread and the new one until the guard has run: ~190 µs a thread on
/// this VM while the program's threads keep both CPUs busy, which cost Phoenix kmeans (~400
/// threads a run) 1.076–1.096x its bare time against 0.997 without (benchmarks/RESULTS.md,
/// thirty-eighth session). After this many, a thread that creates one more stops following
/// clones, and laser sends the guard each new thread's id as it reads its creation record
/// instead: that thread runs unguarded until then (laser reads every 0.5 ms while a program
/// makes threads). The kernel's process-event connector would tell the guard sooner, but
/// listening to it cost kmeans 1.19x.
const CHURN_CLONES: u64 = 64;

impl Guard {
    /// Seizes every thread of `pid`, again until a listing shows none new (a thread created
    /// by one not yet seized is not followed by the kernel).
    fn seize_all(&mut self, pid: i32) -> Result<(), String> {
        let opts = self.options;
        let mut skipped = BTreeSet::new();
        loop {
            let dir = std::fs::read_dir(format!("/proc/{pid}/task"))
                .map_err(|e| format!("gone process {pid} ({e})"))?;
            let mut new = 0;
            for tid in dir
                .filter_map(|d| d.ok()?.file_name().to_str()?.parse::<i32>().ok())
                .collect::<Vec<_>>()
            {
                if self.tracees.contains(&tid) || skipped.contains(&tid) {
                    continue;
                }
                match ptrace(libc::PTRACE_SEIZE as _, tid, 0, opts) {
                    Ok(_) => {
                        self.tracees.insert(tid);
                        new += 1;
                    }
                    // Gone since the listing, or a zombie (an exited leader whose threads
                    // run on): nothing left there to trap.
                    Err(e) if errno(&e) == libc::ESRCH || zombie(pid, tid) => {
                        skipped.insert(tid);
                    }
                    Err(e) => return Err(format!("PTRACE_SEIZE of thread {tid}: {e}")),
                }
            }
            if new == 0 {
                return if self.tracees.is_empty() {
                    Err(format!("gone process {pid} has no live thread"))
                } else {
                    Ok(())
                };
            }
        }
    }

    /// Seizes a thread or process laser read the creation of (after the switch from
    /// [`Stop::Clone`]'s stops); one already traced, or gone, is left as it is.
    fn follow(&mut self, tid: i32) {
        if !self.tracees.contains(&tid)
            && ptrace(libc::PTRACE_SEIZE as _, tid, 0, self.options).is_ok()
        {
            self.tracees.insert(tid);
            self.forwarded += 1;
        }
    }

    /// Handles every stop and exit waiting, without blocking.
    fn reap(&mut self) {
        loop {
            let mut status = 0;
            // SAFETY: waitpid writes the status word into a live local.
            let tid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG | libc::__WALL) };
            if tid <= 0 {
                return;
            }
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                self.tracees.remove(&tid);
            } else if libc::WIFSTOPPED(status) {
                self.tracees.insert(tid);
                self.stopped(tid, status);
            }
        }
    }

    fn stopped(&mut self, tid: i32, status: i32) {
        let r = match stop_of(status) {
            Stop::Signal(sig) => {
                let deliver = if sig == libc::SIGTRAP && self.lost_debug_trap(tid) {
                    self.kept += 1;
                    0
                } else {
                    self.passed += 1;
                    sig
                };
                ptrace(libc::PTRACE_CONT as _, tid, 0, deliver as usize)
            }
            // Stays stopped, and still reports SIGCONT or a kill.
            Stop::Group => ptrace(libc::PTRACE_LISTEN as _, tid, 0, 0),
            Stop::Clone => {
                self.clones += 1;
                if self.clones > CHURN_CLONES {
                    self.options = FOLLOW_FORKS;
                    let _ = ptrace(libc::PTRACE_SETOPTIONS as _, tid, 0, FOLLOW_FORKS);
                }
                ptrace(libc::PTRACE_CONT as _, tid, 0, 0)
            }
            Stop::Event => ptrace(libc::PTRACE_CONT as _, tid, 0, 0),
        };
        if r.is_err() {
            // ESRCH: killed (SIGKILL) while stopped; its exit is reported next.
            self.tracees.remove(&tid);
        }
    }

    fn lost_debug_trap(&self, tid: i32) -> bool {
        // SAFETY: siginfo_t is plain data; GETSIGINFO fills it.
        let mut si: libc::siginfo_t = unsafe { std::mem::zeroed() };
        if ptrace(
            libc::PTRACE_GETSIGINFO as _,
            tid,
            0,
            &mut si as *mut _ as usize,
        )
        .is_err()
        {
            return false;
        }
        // SAFETY: a SIGTRAP's siginfo is a fault siginfo: si_addr is its field.
        let addr = unsafe { si.si_addr() } as usize;
        let before = addr
            .checked_sub(1)
            .and_then(|a| ptrace(libc::PTRACE_PEEKDATA as _, tid, a, 0).ok())
            .map(|word| word as u8);
        spurious(si.si_code, before)
    }
}

fn zombie(pid: i32, tid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(|st| st == "Z"))
        })
        .unwrap_or(true)
}

/// The guard process: traces `pid` until its threads are gone or its stdin closes. Prints
/// `ready N` (threads seized), `gone …` (the target ended first) or `error WHY`, then `done KEPT PASSED` at the end. Returns the
/// exit code.
pub fn serve(pid: i32) -> i32 {
    // The guard must outlive whatever ends the target's run: a Ctrl-C or Ctrl-Z at the
    // terminal reaches it too, and laser closes its stdin when it is done.
    for s in [
        libc::SIGINT,
        libc::SIGQUIT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGTSTP,
        libc::SIGTTIN,
        libc::SIGTTOU,
        libc::SIGPIPE,
    ] {
        // SAFETY: SIG_IGN for signals the guard never handles.
        unsafe { libc::signal(s, libc::SIG_IGN) };
    }
    // Tracee stops arrive as SIGCHLD: blocked, and read from a signalfd beside stdin.
    // SAFETY: sigset operations on a local set; signalfd takes it by pointer.
    let sfd = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK)
    };
    let mut out = io::stdout();
    if sfd < 0 {
        let _ = writeln!(out, "error signalfd: {}", io::Error::last_os_error());
        return 1;
    }
    let mut g = Guard {
        tracees: BTreeSet::new(),
        options: FOLLOW_ALL,
        kept: 0,
        passed: 0,
        clones: 0,
        forwarded: 0,
    };
    if let Err(why) = g.seize_all(pid) {
        // "gone …": the target ended first, which is no failure.
        let word = if why.starts_with("gone ") {
            ""
        } else {
            "error "
        };
        let _ = writeln!(out, "{word}{why}");
        return 1;
    }
    let _ = writeln!(out, "ready {}", g.tracees.len());
    let _ = out.flush();
    g.reap();
    let mut stdin = io::stdin();
    let mut line = Vec::new();
    while !g.tracees.is_empty() {
        let pollfd = |fd: i32| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let mut fds = [pollfd(stdin.as_raw_fd()), pollfd(sfd)];
        // SAFETY: two live pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            continue;
        }
        if fds[1].revents != 0 {
            let mut buf = [0u8; 128 * 8];
            // SAFETY: reads signalfd_siginfo records into a local buffer (drained only).
            while unsafe { libc::read(sfd, buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
            g.reap();
        }
        if fds[0].revents != 0 {
            // Thread ids, one a line, until laser closes the pipe.
            let mut b = [0u8; 512];
            match stdin.read(&mut b) {
                Ok(0) | Err(_) => break,
                Ok(n) => line.extend_from_slice(&b[..n]),
            }
            while let Some(i) = line.iter().position(|&c| c == b'\n') {
                let tid = std::str::from_utf8(&line[..i])
                    .ok()
                    .and_then(|t| t.parse().ok());
                line.drain(..=i);
                if let Some(tid) = tid {
                    g.follow(tid);
                }
            }
        }
    }
    // Whatever stopped meanwhile is resumed (and filtered) before the exit detaches the rest.
    g.reap();
    let _ = writeln!(
        out,
        "done {} {} {} {}",
        g.kept, g.passed, g.clones, g.forwarded
    );
    let _ = out.flush();
    0
}

/// Where the guard stands, as laser sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GuardState {
    /// Started; not every thread seized yet: windows wait.
    Starting,
    /// Every thread traced.
    Ready,
    /// The target ended before the guard could trace it.
    Gone,
    /// The target cannot be guarded (the reason), or the guard is gone while the target runs.
    Failed(String),
}

/// Totals of a guard that has ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuardTotals {
    /// SIGTRAPs of lost debug exceptions kept from the target.
    pub kept: u64,
    /// Signals passed on to the target.
    pub passed: u64,
    /// Thread creations it stopped for, and threads seized from laser's word after those.
    pub clones: u64,
    pub forwarded: u64,
}

/// laser's handle on a running guard process.
pub struct TrapGuard {
    child: Child,
    out: ChildStdout,
    buf: Vec<u8>,
    state: GuardState,
    totals: Option<GuardTotals>,
    last_check: Instant,
    /// The guard's stdout has ended (it exited).
    eof: bool,
}

/// How often a ready guard's pipe is read for news (a guard that died).
const CHECK_EVERY: Duration = Duration::from_millis(20);

impl TrapGuard {
    /// Starts `exe trap-guard PID` (`exe`: laser's own binary).
    /// Starts `exe trap-guard PID` (`exe`: laser's own binary).
    pub fn spawn(exe: &Path, pid: i32) -> io::Result<TrapGuard> {
        let mut child = Command::new(exe)
            .arg("trap-guard")
            .arg(pid.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let out = child.stdout.take().expect("piped");
        // Neither end blocks laser: it reads what the guard said when it looks, and a thread
        // id the full pipe cannot take is dropped.
        for fd in [
            out.as_raw_fd(),
            child.stdin.as_ref().expect("piped").as_raw_fd(),
        ] {
            // SAFETY: fcntl on descriptors we own.
            unsafe {
                let fl = libc::fcntl(fd, libc::F_GETFL);
                libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
            }
        }
        Ok(TrapGuard {
            child,
            out,
            buf: Vec::new(),
            state: GuardState::Starting,
            totals: None,
            last_check: Instant::now(),
            eof: false,
        })
    }

    /// Tells the guard of a thread or process the target created (laser read its creation
    /// record): it seizes those it does not trace yet. Never blocks: a full pipe drops it.
    pub fn follow(&mut self, tid: i32) {
        if let Some(w) = self.child.stdin.as_mut() {
            let _ = w.write_all(format!("{tid}\n").as_bytes());
        }
    }

    /// Reads what the guard said so far, without blocking.
    pub fn poll(&mut self) -> &GuardState {
        if self.state == GuardState::Ready && self.last_check.elapsed() < CHECK_EVERY {
            return &self.state;
        }
        self.read_now()
    }

    fn read_now(&mut self) -> &GuardState {
        self.last_check = Instant::now();
        let mut b = [0u8; 256];
        let eof = loop {
            match self.out.read(&mut b) {
                Ok(0) => break true,
                Ok(n) => self.buf.extend_from_slice(&b[..n]),
                Err(_) => break false,
            }
        };
        self.eof |= eof;
        self.take_lines();
        if eof
            && self.totals.is_none()
            && matches!(self.state, GuardState::Starting | GuardState::Ready)
        {
            self.state = GuardState::Failed("the trap guard exited".into());
        }
        &self.state
    }

    fn take_lines(&mut self) {
        while let Some(i) = self.buf.iter().position(|&c| c == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=i).collect();
            let line = String::from_utf8_lossy(&line).trim().to_string();
            if line.starts_with("ready") {
                self.state = GuardState::Ready;
            } else if line.starts_with("gone ") {
                self.state = GuardState::Gone;
            } else if let Some(why) = line.strip_prefix("error ") {
                self.state = GuardState::Failed(why.to_string());
            } else if let Some(rest) = line.strip_prefix("done ") {
                let mut n = rest.split_whitespace().map(|v| v.parse().unwrap_or(0));
                self.totals = Some(GuardTotals {
                    kept: n.next().unwrap_or(0),
                    passed: n.next().unwrap_or(0),
                    clones: n.next().unwrap_or(0),
                    forwarded: n.next().unwrap_or(0),
                });
            }
        }
    }

    /// Waits up to `max` for the guard to be ready or to fail.
    pub fn wait_ready(&mut self, max: Duration) -> &GuardState {
        let until = Instant::now() + max;
        while self.poll() == &GuardState::Starting && Instant::now() < until {
            std::thread::sleep(Duration::from_micros(200));
        }
        &self.state
    }

    /// Ends the guard: it resumes what is pending and exits, which detaches every tracee.
    /// Returns its totals (`None` if it never said them: it failed or was killed).
    pub fn finish(mut self) -> (GuardState, Option<GuardTotals>) {
        self.stop();
        (self.state.clone(), self.totals)
    }

    /// Ends a guard whose target has exited: one still starting is killed (it has nothing
    /// to report, and a program that ran for a millisecond would otherwise wait on its
    /// start-up), a ready one is finished.
    pub fn finish_after_exit(mut self) -> (GuardState, Option<GuardTotals>) {
        if self.read_now() == &GuardState::Starting {
            let _ = self.child.kill();
            let _ = self.child.wait();
            drop(self.child.stdin.take());
            return (GuardState::Gone, None);
        }
        self.finish()
    }

    fn stop(&mut self) {
        drop(self.child.stdin.take());
        let until = Instant::now() + Duration::from_secs(2);
        // The guard's stdout ends when it exits: wait for that, not in steps.
        while !self.eof {
            self.read_now();
            let left = until.saturating_duration_since(Instant::now());
            if self.eof || left.is_zero() {
                break;
            }
            let mut p = libc::pollfd {
                fd: self.out.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one live pollfd.
            unsafe { libc::poll(&mut p, 1, left.as_millis().max(1) as i32) };
        }
        if !self.eof {
            // Killing the tracer detaches its tracees too.
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for TrapGuard {
    fn drop(&mut self) {
        if self.child.stdin.is_some() {
            self.stop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_trap_no_instruction_explains_is_spurious() {
        // A lost DR6: TRAP_BRKPT after an ordinary instruction.
        assert!(spurious(TRAP_BRKPT, Some(0x90)));
        assert!(spurious(TRAP_BRKPT, None));
        // The program's own int1.
        assert!(!spurious(TRAP_BRKPT, Some(INT1)));
        assert!(spurious(TRAP_HWBKPT, Some(0x90)));
        // int3 (SI_KERNEL), kill(SIGTRAP) (SI_USER), single-step (TRAP_TRACE), perf sigtrap.
        for code in [0x80, 0, 2, 6] {
            assert!(!spurious(code, Some(0x90)), "{code}");
        }
    }

    #[test]
    fn stops_are_told_apart_by_their_status() {
        let stopped = |sig: i32, event: i32| (event << 16) | (sig << 8) | 0x7f;
        assert_eq!(
            stop_of(stopped(libc::SIGTRAP, 0)),
            Stop::Signal(libc::SIGTRAP)
        );
        assert_eq!(
            stop_of(stopped(libc::SIGSEGV, 0)),
            Stop::Signal(libc::SIGSEGV)
        );
        let ev = libc::PTRACE_EVENT_STOP;
        assert_eq!(stop_of(stopped(libc::SIGSTOP, ev)), Stop::Group);
        assert_eq!(stop_of(stopped(libc::SIGTSTP, ev)), Stop::Group);
        assert_eq!(stop_of(stopped(libc::SIGTRAP, ev)), Stop::Event);
        let clone = libc::PTRACE_EVENT_CLONE;
        assert_eq!(stop_of(stopped(libc::SIGTRAP, clone)), Stop::Clone);
        let fork = libc::PTRACE_EVENT_FORK;
        assert_eq!(stop_of(stopped(libc::SIGTRAP, fork)), Stop::Event);
    }
}
