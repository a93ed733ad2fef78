//! Syscalls run inside the target (rr's `AutoRemoteSyscalls` idea): the only way to create a
//! mapping in another process.
//!
//! One call: save the registers of a held thread, point RIP at a `syscall` instruction already in
//! the target's code (any `0f 05` byte pair in an executable mapping will do, since the CPU
//! decodes from RIP; the vDSO is small and always has one) and set RAX and the argument
//! registers, single-step it, read RAX, put every register back. If no such bytes exist, `0f 05`
//! is written over the thread's current RIP for the call and the old bytes are put back after
//! it. Every path out of [`remote_syscall`], including errors, restores registers and bytes.
//!
//! **Interrupted syscalls.** A thread held while blocked in a syscall (read, futex, nanosleep)
//! stops inside the kernel's signal path with RAX = -ERESTARTSYS (or -ERESTARTNOHAND,
//! -ERESTARTNOINTR, -ERESTART_RESTARTBLOCK), ORIG_RAX = its syscall number and RIP just after its
//! `syscall`. The kernel decides whether to restart it (RIP -= 2, RAX = ORIG_RAX) when the thread
//! resumes, looking at the registers *as they are then*. So laser:
//! - sets ORIG_RAX = -1 in the registers it injects, so the kernel does not "restart" our
//!   injected state on the way out to the `syscall` gadget;
//! - after the step, while the thread is again in a ptrace-stop inside the signal path, restores
//!   the saved registers exactly (RAX = -ERESTARTSYS, ORIG_RAX = number, RIP), so when laser
//!   finally detaches the kernel restarts the original syscall as if nothing had happened
//!   (nanosleep via its restart block, which our mmap/munmap never touch).
//!
//! Interfaces that Linux never restarts after any stop (epoll_wait, semop, sigtimedwait,
//! inotify reads…; signal(7) "Interruption of system calls … by stop signals") return EINTR
//! after any ptrace hold, as under gdb; laser cannot change that.

use super::error::{Result, TraceeError};
use super::maps::{self, MapRegion};
use super::mem::ProcMem;
use super::threads::{StopKind, ThreadLock};

pub const SYS_MMAP: u64 = libc::SYS_mmap as u64;
pub const SYS_MPROTECT: u64 = libc::SYS_mprotect as u64;
pub const SYS_MUNMAP: u64 = libc::SYS_munmap as u64;
pub const SYS_GETPID: u64 = libc::SYS_getpid as u64;

/// Where and in which thread injected syscalls run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyscallSite {
    pub tid: i32,
    /// Address of a `0f 05` pair, or of the thread's RIP when `scratch` is set.
    pub addr: u64,
    /// Original bytes at `addr` when laser writes the instruction itself for each call.
    pub scratch: Option<Vec<u8>>,
}

/// Picks the thread for injected syscalls and finds a `syscall` instruction.
///
/// The thread must not be under seccomp (a filter may answer mmap with SIGSYS and kill the
/// process), should not be in a group-stop (running it would silently end the job-control stop)
/// and preferably holds no foreign signal. `prefer` forces a thread, e.g. to exercise the
/// interrupted-syscall path in tests.
pub fn choose_site(
    lock: &ThreadLock,
    mem: &ProcMem,
    regions: &[MapRegion],
    prefer: Option<i32>,
) -> Result<SyscallSite> {
    let pid = lock.pid();
    let mut best: Option<(u8, i32)> = None;
    let mut seccomp: Option<(i32, u32)> = None;
    let mut all_group_stopped = true;
    for tid in lock.tids() {
        let kind = lock.stop_kind(tid);
        if !matches!(kind, Some(StopKind::GroupStop(_))) {
            all_group_stopped = false;
        } else {
            continue;
        }
        // A task outside /proc/PID/task (a non-thread clone auto-attached through
        // TRACECLONE) is held and released like the rest but never runs our syscalls.
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")) else {
            continue;
        };
        match maps::seccomp_mode(&status) {
            Some(0) | None => {}
            Some(mode) => {
                seccomp.get_or_insert((tid, mode));
                continue;
            }
        }
        let rank = if Some(tid) == prefer {
            0
        } else if lock.has_pending_signal(tid) {
            2
        } else {
            1
        };
        if best.is_none_or(|(r, _)| rank < r) {
            best = Some((rank, tid));
        }
    }
    let Some((_, tid)) = best else {
        if let Some((tid, mode)) = seccomp {
            return Err(TraceeError::Seccomp { tid, mode });
        }
        if all_group_stopped {
            return Err(TraceeError::ProcessStopped { pid });
        }
        return Err(TraceeError::NoSyscallThread { pid });
    };
    // Smallest executable mappings first: the vDSO is two pages and has syscall fallbacks.
    let mut exec: Vec<&MapRegion> = regions.iter().filter(|r| r.exec && r.read).collect();
    exec.sort_by_key(|r| (r.path != "[vdso]", r.end - r.start));
    for r in exec {
        if r.path == "[vsyscall]" {
            continue;
        }
        let len = (r.end - r.start).min(1 << 20) as usize;
        let code = mem.read_partial(r.start, len);
        if let Some(off) = maps::find_syscall_bytes(&code) {
            return Ok(SyscallSite {
                tid,
                addr: r.start + off as u64,
                scratch: None,
            });
        }
    }
    let rip = lock.regs(tid)?.rip;
    let old = mem.read(rip, 2)?;
    Ok(SyscallSite {
        tid,
        addr: rip,
        scratch: Some(old),
    })
}

/// Runs syscall `nr` with `args` in the site's thread and returns the raw RAX (negative errno on
/// failure). Registers and any scratch bytes are restored before returning, on every path.
pub fn remote_syscall(
    lock: &mut ThreadLock,
    mem: &ProcMem,
    site: &SyscallSite,
    nr: u64,
    args: [u64; 6],
) -> Result<i64> {
    let tid = site.tid;
    let saved = lock.regs(tid)?;
    let mut guard = Restore {
        lock,
        mem,
        tid,
        saved,
        scratch: None,
    };
    if let Some(old) = &site.scratch {
        guard.mem.write_verified(site.addr, &[0x0f, 0x05])?;
        guard.scratch = Some((site.addr, old.clone()));
    }
    let mut regs = saved;
    regs.rip = site.addr;
    regs.rax = nr;
    // Not a syscall in progress: stop the kernel's restart logic from touching our RIP.
    regs.orig_rax = u64::MAX;
    regs.rdi = args[0];
    regs.rsi = args[1];
    regs.rdx = args[2];
    regs.r10 = args[3];
    regs.r8 = args[4];
    regs.r9 = args[5];
    guard.lock.set_regs(tid, &regs)?;
    guard.lock.step(tid)?;
    let after = guard.lock.regs(tid)?;
    if after.rip != site.addr + 2 {
        return Err(TraceeError::Ptrace {
            op: "injected syscall ended at an unexpected RIP",
            tid,
            errno: nix::errno::Errno::EFAULT,
        });
    }
    Ok(after.rax as i64)
}

/// Puts registers (and scratch bytes) back when a remote syscall ends, however it ends.
struct Restore<'a> {
    lock: &'a mut ThreadLock,
    mem: &'a ProcMem,
    tid: i32,
    saved: libc::user_regs_struct,
    scratch: Option<(u64, Vec<u8>)>,
}

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.lock.set_regs(self.tid, &self.saved) {
            log::warn!(
                "laser: restoring registers of thread {} after an injected syscall: {e}",
                self.tid
            );
        }
        if let Some((addr, old)) = self.scratch.take() {
            if let Err(e) = self.mem.write_verified(addr, &old) {
                log::warn!("laser: restoring bytes at {addr:#x} after an injected syscall: {e}");
            }
        }
    }
}

/// Splits a raw syscall return into value or errno.
pub fn syscall_result(raw: i64) -> std::result::Result<u64, nix::errno::Errno> {
    if (-4095..0).contains(&raw) {
        Err(nix::errno::Errno::from_raw(-raw as i32))
    } else {
        Ok(raw as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_returns_split_into_errno() {
        assert_eq!(syscall_result(0x7f00_0000_0000), Ok(0x7f00_0000_0000));
        assert_eq!(syscall_result(-17), Err(nix::errno::Errno::EEXIST));
        assert_eq!(syscall_result(-4096), Ok((-4096i64) as u64));
    }
}
