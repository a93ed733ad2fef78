//! Typed errors of the live driver. Messages carry the numbers involved (pid, cpu, errno,
//! sysctl values) so the CLI can print them as they are; the CLI adds context, not facts.

use std::io;

use crate::event::BackendKind;
use crate::ring::RingError;

/// Everything that can go wrong while launching, attaching to or sampling a target.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    /// `perf_event_open` (or the ptrace check behind it) said EACCES/EPERM. The message says
    /// what `perf_event_paranoid` is and what to change; see [`explain_permission`].
    #[error("{explanation}")]
    PermissionDenied {
        what: String,
        errno: i32,
        paranoid: Option<i32>,
        explanation: String,
    },
    #[error("perf_event_open for {what} (pid {pid}, cpu {cpu}) failed: {source}")]
    Open {
        what: String,
        pid: i32,
        cpu: i32,
        #[source]
        source: io::Error,
    },
    #[error("mmap of a {pages}-page perf ring buffer ({kib} KiB) failed: {source}{hint}")]
    Mmap {
        pages: usize,
        kib: usize,
        hint: String,
        #[source]
        source: io::Error,
    },
    /// The program to launch does not exist (no such file, or not found on `$PATH`).
    #[error("cannot launch {program:?}: program not found (searched {searched})")]
    ProgramNotFound { program: String, searched: String },
    /// `execve` of the program failed for another reason (EACCES, ENOEXEC, …).
    #[error("cannot launch {program:?}: execve failed: {source}")]
    Exec {
        program: String,
        #[source]
        source: io::Error,
    },
    #[error("no command given to launch")]
    EmptyCommand,
    #[error("process {pid} does not exist (or has already exited)")]
    NoSuchProcess { pid: i32 },
    /// A backend asked for explicitly that this machine cannot provide.
    #[error("backend {backend} is not available on this machine: {reason}")]
    BackendUnavailable {
        backend: BackendKind,
        reason: String,
    },
    #[error("invalid watchpoint at {addr:#x} length {len}: {reason}")]
    BadWatch {
        addr: u64,
        len: u8,
        reason: &'static str,
    },
    #[error("{requested} watchpoints requested, but x86 has {max} debug registers per thread")]
    TooManyWatches { requested: usize, max: usize },
    #[error("sampling frequency {requested} Hz: {reason}")]
    BadFrequency { requested: u64, reason: String },
    #[error("watchpoints were not enabled in this session's Config (watch = false)")]
    WatchNotEnabled,
    /// The trap guard ([`crate::trap_guard`]) has not traced every thread yet: windows wait.
    #[error("watchpoints wait for the trap guard to trace the target")]
    WatchGuardStarting,
    /// The target cannot be traced (or its guard is gone), so no window may trap in it.
    #[error("watchpoints are off: the target is not guarded against lost debug traps ({reason})")]
    WatchUnguarded { reason: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("perf ring buffer: {0}")]
    Ring(#[from] RingError),
}

impl DriverError {
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Self {
        DriverError::Io {
            what: what.into(),
            source,
        }
    }
}

/// Builds the message for a denied `perf_event_open`. Pure: the caller reads
/// `/proc/sys/kernel/perf_event_paranoid` and passes its text (or `None` if unreadable).
///
/// Levels (kernel `Documentation/admin-guide/sysctl/kernel.rst`): -1 everything; 0 no raw
/// tracepoints; 1 no kernel profiling; 2 user-space profiling of one's own processes only;
/// ≥3 (Debian/Android patch) nothing at all without CAP_PERFMON. laser samples user space only
/// (`exclude_kernel`), so ≤ 2 suffices for the user's own processes.
pub fn explain_permission(what: &str, errno: i32, paranoid_text: Option<&str>) -> String {
    let paranoid = paranoid_text.and_then(|t| t.trim().parse::<i32>().ok());
    let errname = if errno == libc::EPERM {
        "EPERM"
    } else {
        "EACCES"
    };
    let mut msg = format!("permission denied ({errname}) opening perf events for {what}. ");
    let setcap = "`sudo setcap cap_perfmon,cap_sys_ptrace+ep $(command -v laser)`";
    match paranoid {
        Some(p) if p <= 2 => {
            let meaning = match p {
                i32::MIN..=-1 => "no restrictions",
                0 => "no raw tracepoint access without CAP_PERFMON",
                1 => "no kernel profiling without CAP_PERFMON",
                _ => "user-space profiling of your own processes only",
            };
            msg += &format!(
                "/proc/sys/kernel/perf_event_paranoid is {p} ({meaning}), which allows \
                 laser's user-space events on your own processes, so the target most likely \
                 belongs to another user (or a container/seccomp policy blocks \
                 perf_event_open). Missing: CAP_SYS_PTRACE (the kernel applies the ptrace \
                 access check; /proc/sys/kernel/yama/ptrace_scope must also be <= 1 for \
                 same-user attach). To fix: run laser as the target's user or as root, or \
                 grant it the capabilities: {setcap}."
            );
        }
        Some(p) => {
            msg += &format!(
                "/proc/sys/kernel/perf_event_paranoid is {p} (all perf events forbidden \
                 without CAP_PERFMON). Missing: CAP_PERFMON (Linux >= 5.8; CAP_SYS_ADMIN on \
                 older kernels). To fix: `sudo sysctl kernel.perf_event_paranoid=2` (until \
                 reboot; 2 allows profiling your own processes' user space), or grant laser \
                 the capabilities: {setcap}, or run it as root."
            );
        }
        None => {
            msg += &format!(
                "/proc/sys/kernel/perf_event_paranoid could not be read. laser needs \
                 perf_event_paranoid <= 2 or CAP_PERFMON (Linux >= 5.8; CAP_SYS_ADMIN on \
                 older kernels). To fix: `sudo sysctl kernel.perf_event_paranoid=2`, or grant \
                 laser the capabilities: {setcap}, or run it as root."
            );
        }
    }
    msg
}

/// Reads `perf_event_paranoid` and builds [`DriverError::PermissionDenied`].
pub(crate) fn permission_error(what: &str, errno: i32) -> DriverError {
    let text = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").ok();
    DriverError::PermissionDenied {
        what: what.to_string(),
        errno,
        paranoid: text.as_deref().and_then(|t| t.trim().parse().ok()),
        explanation: explain_permission(what, errno, text.as_deref()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paranoid_three_says_what_to_run() {
        let m = explain_permission("pid 42", libc::EACCES, Some("3\n"));
        assert!(m.contains("perf_event_paranoid is 3"), "{m}");
        assert!(m.contains("CAP_PERFMON"), "{m}");
        assert!(m.contains("sysctl kernel.perf_event_paranoid=2"), "{m}");
        assert!(m.contains("EACCES"), "{m}");
    }

    #[test]
    fn paranoid_two_points_at_ptrace_and_other_users() {
        let m = explain_permission("pid 42", libc::EPERM, Some("2"));
        assert!(m.contains("is 2"), "{m}");
        assert!(m.contains("Missing: CAP_SYS_PTRACE"), "{m}");
        assert!(m.contains("setcap"), "{m}");
        assert!(m.contains("EPERM"), "{m}");
    }

    #[test]
    fn unreadable_paranoid_is_said() {
        let m = explain_permission("cpu 0", libc::EACCES, None);
        assert!(m.contains("could not be read"), "{m}");
        assert!(m.contains("CAP_PERFMON"), "{m}");
        let m = explain_permission("cpu 0", libc::EACCES, Some("garbage"));
        assert!(m.contains("could not be read"), "{m}");
    }
}
