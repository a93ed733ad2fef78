//! Thin wrappers over the ptrace, waitpid and tgkill calls that carry signals as plain numbers.
//!
//! nix's `Signal` enum cannot hold real-time signals (SIGRTMIN..SIGRTMAX), and glibc itself uses
//! two of them (cancellation, setxid). A tracer that meets one in a signal-delivery-stop must pass
//! it on, so everything that sees or sends a signal here uses the raw number. Requests that carry
//! no signal (SEIZE, INTERRUPT, GETREGS, …) go through nix.

use std::time::{Duration, Instant};

use libc::c_void;
use nix::errno::Errno;

/// `PTRACE_EVENT_STOP`: group-stop or PTRACE_INTERRUPT stop of a seized tracee.
pub const PTRACE_EVENT_STOP: i32 = 128;
/// `PTRACE_EVENT_CLONE`.
pub const PTRACE_EVENT_CLONE: i32 = 3;

/// What one `waitpid` status says about a traced thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEvent {
    /// Signal-delivery-stop: `sig` is about to be delivered unless the tracer suppresses it.
    Signal(i32),
    /// A `PTRACE_EVENT_*` stop (`event` from `status >> 16`), with its stop signal.
    Event { event: i32, sig: i32 },
    /// The thread exited with this status.
    Exited(i32),
    /// The thread was killed by this signal.
    Killed(i32),
    /// Anything else (`WIFCONTINUED`): not a stop.
    Other(i32),
}

/// Decodes a `waitpid` status word (pure; see ptrace(2) "Stopped states").
pub fn decode_status(status: i32) -> WaitEvent {
    if libc::WIFEXITED(status) {
        WaitEvent::Exited(libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        WaitEvent::Killed(libc::WTERMSIG(status))
    } else if libc::WIFSTOPPED(status) {
        let sig = libc::WSTOPSIG(status);
        let event = (status >> 16) & 0xff;
        if event != 0 {
            WaitEvent::Event { event, sig }
        } else {
            WaitEvent::Signal(sig)
        }
    } else {
        WaitEvent::Other(status)
    }
}

/// One non-blocking `waitpid(tid, __WALL)`: `None` while the thread has nothing to report.
pub fn wait_nohang(tid: i32) -> Result<Option<WaitEvent>, Errno> {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: waitpid only writes the status word we pass a valid pointer to.
        let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
        match r {
            -1 if Errno::last() == Errno::EINTR => continue,
            -1 => return Err(Errno::last()),
            0 => return Ok(None),
            _ => return Ok(Some(decode_status(status))),
        }
    }
}

/// Waits for the next report of `tid` until `timeout` passes (`Ok(None)` then).
///
/// Polls rather than blocking so a thread stuck in an uninterruptible sleep cannot hang laser
/// with the rest of the target stopped. It yields a few times (a seized thread usually stops
/// within microseconds), then sleeps in short steps: on a loaded 2-core machine the threads we
/// wait for need the CPU to reach their stop, and spinning longer made pauses longer (p95 ≈ 55
/// vs 22–50 ms, 100 apply+undo at load 15).
pub fn wait_for(tid: i32, timeout: Duration) -> Result<Option<WaitEvent>, Errno> {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        if let Some(ev) = wait_nohang(tid)? {
            return Ok(Some(ev));
        }
        if start.elapsed() >= timeout {
            return Ok(None);
        }
        spins += 1;
        if spins < 16 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

fn request(req: libc::c_uint, tid: i32, data: usize) -> Result<(), Errno> {
    // SAFETY: CONT/SINGLESTEP/DETACH take no pointer: `addr` is ignored and `data` is a signal
    // number, so no memory of ours is read or written by the kernel.
    let r = unsafe {
        libc::ptrace(
            req,
            tid,
            std::ptr::null_mut::<c_void>(),
            data as *mut c_void,
        )
    };
    if r == -1 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// `PTRACE_CONT`, delivering `sig` (0 = none).
pub fn cont(tid: i32, sig: i32) -> Result<(), Errno> {
    request(libc::PTRACE_CONT, tid, sig as usize)
}

/// `PTRACE_SINGLESTEP`, delivering `sig` (0 = none).
pub fn step(tid: i32, sig: i32) -> Result<(), Errno> {
    request(libc::PTRACE_SINGLESTEP, tid, sig as usize)
}

/// `PTRACE_DETACH`; `sig` is delivered only when the thread is in a signal-delivery-stop.
pub fn detach(tid: i32, sig: i32) -> Result<(), Errno> {
    request(libc::PTRACE_DETACH, tid, sig as usize)
}

/// `tgkill(pid, tid, sig)`.
pub fn tgkill(pid: i32, tid: i32, sig: i32) -> Result<(), Errno> {
    // SAFETY: a plain syscall with integer arguments.
    let r = unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, sig) };
    if r == -1 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// `si_code` of the signal that put `tid` in its current signal-delivery-stop.
pub fn siginfo_code(tid: i32) -> Result<i32, Errno> {
    let info = nix::sys::ptrace::getsiginfo(nix::unistd::Pid::from_raw(tid))?;
    Ok(info.si_code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_stop_kinds_of_ptrace_2() {
        // Layouts from ptrace(2): exit = code << 8; killed = sig; stopped = 0x7f | sig << 8 |
        // event << 16.
        assert_eq!(decode_status(3 << 8), WaitEvent::Exited(3));
        assert_eq!(
            decode_status(libc::SIGKILL),
            WaitEvent::Killed(libc::SIGKILL)
        );
        assert_eq!(
            decode_status(0x7f | (libc::SIGUSR1 << 8)),
            WaitEvent::Signal(libc::SIGUSR1)
        );
        assert_eq!(
            decode_status(0x7f | (libc::SIGTRAP << 8) | (PTRACE_EVENT_STOP << 16)),
            WaitEvent::Event {
                event: PTRACE_EVENT_STOP,
                sig: libc::SIGTRAP
            }
        );
        assert_eq!(
            decode_status(0x7f | (libc::SIGTRAP << 8) | (PTRACE_EVENT_CLONE << 16)),
            WaitEvent::Event {
                event: PTRACE_EVENT_CLONE,
                sig: libc::SIGTRAP
            }
        );
        // Real-time signals (nix's Signal cannot hold these) decode as plain numbers.
        assert_eq!(decode_status(0x7f | (40 << 8)), WaitEvent::Signal(40));
        assert_eq!(decode_status(0xffff), WaitEvent::Other(0xffff));
    }
}
