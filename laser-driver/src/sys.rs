//! The narrow seam to the kernel: `perf_event_open`, its ioctls, and the CPU list. Everything
//! unsafe about perf file descriptors lives here (the ring mapping lives in `ring::mmap`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use perf_event_open_sys::bindings as b;
use perf_event_open_sys::ioctls;

use crate::error::{permission_error, DriverError};

/// Opens one perf event. `what` names it in errors ("cpu-clock on cpu 1 of pid 42").
/// EACCES/EPERM become [`DriverError::PermissionDenied`] with the paranoid explanation.
pub fn open(
    attr: &b::perf_event_attr,
    pid: i32,
    cpu: i32,
    what: &str,
) -> Result<OwnedFd, DriverError> {
    open_in_group(attr, pid, cpu, None, what)
}

/// [`open`] as a member of `group`'s event group (scheduled on the PMU together with its
/// leader: PEBS load-latency events on recent Intel cores must sit under `mem-loads-aux`).
pub fn open_in_group(
    attr: &b::perf_event_attr,
    pid: i32,
    cpu: i32,
    group: Option<&OwnedFd>,
    what: &str,
) -> Result<OwnedFd, DriverError> {
    let mut a = *attr;
    let group_fd = group.map_or(-1, |g| g.as_raw_fd());
    // SAFETY: `a` is a fully initialised perf_event_attr whose `size` is its own size; the
    // kernel only reads it (and may write back `size` on E2BIG, which is our local copy).
    // `group_fd` is -1 or a perf event descriptor the caller owns; FD_CLOEXEC so the target
    // never inherits laser's descriptors.
    let fd = unsafe {
        perf_event_open_sys::perf_event_open(
            &mut a,
            pid,
            cpu,
            group_fd,
            b::PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd < 0 {
        let err = io::Error::last_os_error();
        let errno = err.raw_os_error().unwrap_or(0);
        if errno == libc::EACCES || errno == libc::EPERM {
            return Err(permission_error(what, errno));
        }
        return Err(DriverError::Open {
            what: what.to_string(),
            pid,
            cpu,
            source: err,
        });
    }
    // SAFETY: the syscall returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn check(rc: libc::c_int, what: &str) -> Result<(), DriverError> {
    if rc < 0 {
        Err(DriverError::io(what, io::Error::last_os_error()))
    } else {
        Ok(())
    }
}

/// Enables the event and (for inherited events) all its children.
pub fn enable(fd: &OwnedFd) -> Result<(), DriverError> {
    // SAFETY: fd is an open perf event descriptor; the argument is a flag word.
    check(
        unsafe { ioctls::ENABLE(fd.as_raw_fd(), 0) },
        "PERF_EVENT_IOC_ENABLE",
    )
}

/// Enables a sampling event for `overflows` more samples, after which the kernel disables it
/// itself, in the overflow handler on the CPU that took the last one (no interrupt to wait
/// for, no reader to wake). The kernel refuses it for inherited events (`EINVAL`).
pub fn refresh(fd: &OwnedFd, overflows: u32) -> Result<(), DriverError> {
    let n = overflows.clamp(1, i32::MAX as u32) as libc::c_int;
    // SAFETY: fd is an open perf event descriptor; the argument is a count.
    check(
        unsafe { ioctls::REFRESH(fd.as_raw_fd(), n) },
        "PERF_EVENT_IOC_REFRESH",
    )
}

/// Disables the event and all its inherited children.
pub fn disable(fd: &OwnedFd) -> Result<(), DriverError> {
    // SAFETY: as in `enable`.
    check(
        unsafe { ioctls::DISABLE(fd.as_raw_fd(), 0) },
        "PERF_EVENT_IOC_DISABLE",
    )
}

/// Re-points a breakpoint (and, since Linux 4.19/5.x, every inherited child: the kernel's
/// `perf_event_modify_attr` walks `child_list`; the launch integration test checks it).
pub fn modify(fd: &OwnedFd, attr: &b::perf_event_attr) -> Result<(), DriverError> {
    let mut a = *attr;
    // SAFETY: fd is a perf breakpoint event; `a` is a complete attr the kernel only reads.
    check(
        unsafe { ioctls::MODIFY_ATTRIBUTES(fd.as_raw_fd(), &mut a) },
        "PERF_EVENT_IOC_MODIFY_ATTRIBUTES",
    )
}

/// Sends `fd`'s records into `target`'s ring buffer (same CPU, or same task for per-thread
/// events), so one mmap per CPU/thread carries every event.
pub fn set_output(fd: &OwnedFd, target: RawFd) -> Result<(), DriverError> {
    // SAFETY: both are perf event descriptors owned by the caller.
    check(
        unsafe { ioctls::SET_OUTPUT(fd.as_raw_fd(), target) },
        "PERF_EVENT_IOC_SET_OUTPUT",
    )
}

/// The kernel's id of an event: what `PERF_SAMPLE_IDENTIFIER` reports for it and for its
/// inherited children.
pub fn event_id(fd: &OwnedFd) -> Result<u64, DriverError> {
    let mut id = 0u64;
    // SAFETY: the kernel writes one u64 through the pointer, which points at `id`.
    check(
        unsafe { ioctls::ID(fd.as_raw_fd(), &mut id) },
        "PERF_EVENT_IOC_ID",
    )?;
    Ok(id)
}

/// CPU time used so far by the whole process `pid` (every thread, live or exited), read from
/// its kernel CPU clock (`clock_getcpuclockid`; any process's clock is readable).
pub fn process_cpu_time(pid: libc::pid_t) -> Result<Duration, DriverError> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: writes one clockid_t into a live local.
    let r = unsafe { libc::clock_getcpuclockid(pid, &mut clock) };
    if r != 0 {
        return Err(DriverError::io(
            "finding the target's CPU clock",
            io::Error::from_raw_os_error(r),
        ));
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec into a live local.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return Err(DriverError::io(
            "reading the target's CPU clock",
            io::Error::last_os_error(),
        ));
    }
    Ok(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// Parses a kernel CPU list such as `/sys/devices/system/cpu/online` ("0-3,6,8-9").
pub fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

/// The online CPUs, one event each for launched targets.
pub fn online_cpus() -> Result<Vec<u32>, DriverError> {
    let path = "/sys/devices/system/cpu/online";
    let text = std::fs::read_to_string(path).map_err(|e| DriverError::io(path, e))?;
    parse_cpu_list(&text).ok_or_else(|| {
        DriverError::io(
            path,
            io::Error::new(io::ErrorKind::InvalidData, format!("bad cpu list {text:?}")),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_cpu_time_counts_every_thread_and_refuses_a_missing_pid() {
        let me = std::process::id() as libc::pid_t;
        let before = process_cpu_time(me).unwrap();
        // Burn CPU on another thread: the process clock must see it.
        std::thread::spawn(|| {
            let t = std::time::Instant::now();
            let mut x = 0u64;
            while t.elapsed() < Duration::from_millis(30) {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
            }
        })
        .join()
        .unwrap();
        let after = process_cpu_time(me).unwrap();
        assert!(
            after >= before + Duration::from_millis(20),
            "{before:?} -> {after:?}"
        );
        // pid_max is at most 2^22: this pid cannot exist.
        assert!(process_cpu_time(1 << 23).is_err());
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-1\n"), Some(vec![0, 1]));
        assert_eq!(parse_cpu_list("0,2-4,7"), Some(vec![0, 2, 3, 4, 7]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
        assert_eq!(parse_cpu_list(""), Some(vec![]));
    }
}
