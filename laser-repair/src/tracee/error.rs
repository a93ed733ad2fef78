//! The one error type of the tracee half. Every variant names the thread, address or count
//! involved, so the CLI can print it without guessing.

use nix::errno::Errno;

use super::apply::FailPoint;

/// Why a repair, an undo or one of their steps was refused or failed.
///
/// Whatever the variant, the operation that returned it has already put the target back the way
/// it found it (bytes, registers, mappings) and detached, unless the variant says otherwise.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceeError {
    #[error("process {pid} does not exist")]
    NoSuchProcess { pid: i32 },
    #[error(
        "cannot ptrace thread {tid}: {errno}{hint}",
        hint = if *errno == Errno::EPERM {
            " (already traced by another debugger, not root, or kernel.yama.ptrace_scope too high)"
        } else { "" }
    )]
    Seize { tid: i32, errno: Errno },
    #[error("ptrace {op} on thread {tid} failed: {errno}")]
    Ptrace {
        op: &'static str,
        tid: i32,
        errno: Errno,
    },
    #[error("thread {tid} did not reach a ptrace stop within {waited_ms} ms")]
    StopTimeout { tid: i32, waited_ms: u64 },
    #[error("thread {tid} exited while laser was using it")]
    ThreadGone { tid: i32 },
    #[error("thread {tid} is not traced by this lock")]
    NotTraced { tid: i32 },
    #[error("{what} of process {pid}: {source}")]
    Io {
        pid: i32,
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("/proc/PID/maps line {line}: {reason}")]
    Maps { line: usize, reason: String },
    #[error("reading back {len} bytes written at {addr:#x} gave different bytes")]
    VerifyFailed { addr: u64, len: usize },
    #[error(
        "bytes at {addr:#x} are {found:02x?}, not the expected {expected:02x?}: the code changed \
         under us, refusing to patch"
    )]
    PatchMismatch {
        addr: u64,
        expected: Vec<u8>,
        found: Vec<u8>,
    },
    #[error("thread {tid} runs under seccomp mode {mode}: an injected syscall could kill it")]
    Seccomp { tid: i32, mode: u32 },
    #[error("every thread of process {pid} is job-control stopped (SIGSTOP); continue it first")]
    ProcessStopped { pid: i32 },
    #[error("no usable thread for injected syscalls in process {pid}")]
    NoSyscallThread { pid: i32 },
    #[error("injected {name} in thread {tid} failed: {errno}")]
    RemoteSyscall {
        name: &'static str,
        tid: i32,
        errno: Errno,
    },
    #[error(
        "no free hole of {len} bytes within ±2 GiB of code {span_start:#x}..{span_end:#x} \
         ({tried} candidate(s) refused)"
    )]
    NoHole {
        len: u64,
        span_start: u64,
        span_end: u64,
        tried: usize,
    },
    #[error(
        "thread {tid} is at {rip:#x}, inside patched bytes {start:#x}..{end:#x}, and the plan \
         maps no new pc for it"
    )]
    UnmappedThread {
        tid: i32,
        rip: u64,
        start: u64,
        end: u64,
    },
    #[error(
        "thread {tid} is inside a restartable syscall returning to {rip:#x} in patched bytes; \
         moving it would corrupt the restart"
    )]
    ThreadInSyscall { tid: i32, rip: u64 },
    #[error(
        "thread {tid} is at {rip:#x} in the retired code cache at {map_base:#x}, whose exits \
         jump into bytes this repair patches; it leaves within microseconds"
    )]
    ThreadInRetiredCache { tid: i32, rip: u64, map_base: u64 },
    #[error(
        "no safe point for undo after {attempts} tries: thread {tid} keeps stopping at {rip:#x}, \
         inside patched bytes"
    )]
    NoSafePoint { tid: i32, rip: u64, attempts: usize },
    #[error("invalid patch set: {0}")]
    InvalidPatchSet(String),
    #[error("the plan could not be built for cache at {code_base:#x}: {reason}")]
    Build { code_base: u64, reason: String },
    #[error("repair record needs {need} bytes but only {cap} were reserved")]
    RecordTooLarge { need: usize, cap: usize },
    #[error("repair record at {addr:#x}: {reason}")]
    BadRecord { addr: u64, reason: String },
    #[error("no laser repair cache at {addr:#x} in process {pid}")]
    NoSuchRepair { pid: i32, addr: u64 },
    #[error("injected failure at {0:?} (test hook)")]
    Injected(FailPoint),
}

pub type Result<T, E = TraceeError> = std::result::Result<T, E>;

impl TraceeError {
    pub(crate) fn ptrace(op: &'static str, tid: i32, errno: Errno) -> Self {
        if errno == Errno::ESRCH {
            TraceeError::ThreadGone { tid }
        } else {
            TraceeError::Ptrace { op, tid, errno }
        }
    }

    pub(crate) fn io(pid: i32, what: impl Into<String>, source: std::io::Error) -> Self {
        TraceeError::Io {
            pid,
            what: what.into(),
            source,
        }
    }
}
