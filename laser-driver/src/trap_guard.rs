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
//! trap, a small program of its own (`shim/laser_trap_guard.c`, embedded in laser and run
//! from memory) traces every thread of the target with `PTRACE_SEIZE`, which stops nothing
//! by itself, and follows the threads and processes it creates. It passes on every signal as
//! it came, except a SIGTRAP only a lost debug exception explains (`si_code` `TRAP_HWBKPT`,
//! or `TRAP_BRKPT` with no `int1` opcode before the address or at it: some hypervisors
//! deliver `int1` as a fault, at the instruction), which it drops and counts:
//! each one cost its watch window one hit. This module is laser's side of it.
//!
//! ```text
//!  laser ── (a thread of its own) spawn `GUARD PID`
//!                      guard: seize every thread (following clones and forks) ─▶ "ready N"
//!  (watch windows wait for "ready"; "error …" turns them off, the run goes on)
//!         ◀─ tracee stops (signals, clones, group-stops): passed on or resumed at once
//!  ── "TID" ─▶ a thread laser read the creation of: seized if new (after 64 clones)
//!  laser closes the guard's stdin (run over, or a repair needs the tracees); or the
//!  target's last thread exits
//!                                   guard: resumes what is pending, prints "done KEPT
//!                                   PASSED CLONES FORWARDED", exits; the kernel detaches
//!                                   every tracee
//! ```
//!
//! Following a new thread means stopping it and its creator until the guard has run: ~190 µs
//! a thread on this VM while the program keeps both CPUs busy, which cost Phoenix kmeans
//! (~400 threads a run) 1.08–1.10x its bare time against 0.997 without. So the guard stops
//! following clones after 64, and laser sends it each new thread's id as it reads the
//! creation record; such a thread runs unguarded until then (laser reads every 0.5 ms while a
//! program makes threads). The kernel's process-event connector would tell the guard sooner,
//! but listening to it cost kmeans 1.19x (benchmarks/RESULTS.md, thirty-eighth session).
//!
//! A separate process rather than a thread of laser: laser's `waitpid` of its child would
//! otherwise also collect the ptrace stops of that child, and a tracer that dies for any
//! reason only detaches its tracees, which run on. A program with no C library rather than a
//! second laser: that took ~1 ms of the CPUs the program runs on (glibc's start-up probes the
//! caches with `cpuid`, a VM exit each), this ~0.1 ms.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

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

impl GuardTotals {
    /// Adds another guard's totals (one guard per stretch between repairs).
    pub fn add(&mut self, o: &GuardTotals) {
        self.kept += o.kept;
        self.passed += o.passed;
        self.clones += o.clones;
        self.forwarded += o.forwarded;
    }
}

/// One line of the guard's.
#[derive(Debug, PartialEq, Eq)]
enum Said {
    State(GuardState),
    Done(GuardTotals),
}

fn said(line: &str) -> Option<Said> {
    let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
    Some(match word {
        "ready" => Said::State(GuardState::Ready),
        "gone" => Said::State(GuardState::Gone),
        "error" => Said::State(GuardState::Failed(rest.to_string())),
        "done" => {
            let mut n = rest.split_whitespace().map(|v| v.parse().unwrap_or(0));
            let mut next = || n.next().unwrap_or(0);
            Said::Done(GuardTotals {
                kept: next(),
                passed: next(),
                clones: next(),
                forwarded: next(),
            })
        }
        _ => return None,
    })
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
    /// Starts `exe PID` (`exe`: the guard program, `shim/laser_trap_guard.c`).
    pub fn spawn(exe: &Path, pid: i32) -> io::Result<TrapGuard> {
        let mut child = Command::new(exe)
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
            // One write of a whole line: a pipe takes up to PIPE_BUF bytes at once or not at
            // all, so a full pipe never leaves half an id to run into the next.
            match w.write(format!("{tid}\n").as_bytes()) {
                Ok(_) | Err(_) => {}
            }
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
            match said(String::from_utf8_lossy(&line).trim()) {
                Some(Said::State(s)) => self.state = s,
                Some(Said::Done(t)) => self.totals = Some(t),
                None => {}
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
    fn the_guards_lines_are_read_as_said() {
        assert_eq!(said("ready 3"), Some(Said::State(GuardState::Ready)));
        assert_eq!(said("gone process 7"), Some(Said::State(GuardState::Gone)));
        assert_eq!(
            said("error PTRACE_SEIZE of thread 9: errno 1"),
            Some(Said::State(GuardState::Failed(
                "PTRACE_SEIZE of thread 9: errno 1".into()
            )))
        );
        let t = GuardTotals {
            kept: 2,
            passed: 5,
            clones: 64,
            forwarded: 3,
        };
        assert_eq!(said("done 2 5 64 3"), Some(Said::Done(t)));
        assert_eq!(said("something else"), None);
    }
}
