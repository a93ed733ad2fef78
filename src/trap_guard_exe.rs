//! The trap guard program (`shim/laser_trap_guard.c`, built by build.rs and embedded here),
//! made runnable without a file: laser writes it once into a memory file and starts it as
//! `/proc/self/fd/N` (`laser_driver::trap_guard` says what it does).

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::OnceLock;

const GUARD: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/laser_trap_guard"));

/// The path to start the guard from, made at the first call: the memory file stays open
/// (close-on-exec: a child laser starts opens it by this path before its exec closes it).
pub fn path() -> Result<PathBuf, String> {
    static FILE: OnceLock<Result<OwnedFd, String>> = OnceLock::new();
    FILE.get_or_init(|| {
        // SAFETY: memfd_create with a NUL-terminated name; the descriptor is then ours.
        let fd = unsafe { libc::memfd_create(c"laser-trap-guard".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: fd is fresh and owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut f = std::fs::File::from(fd);
        f.write_all(GUARD)
            .map_err(|e| format!("writing the trap guard to memory: {e}"))?;
        Ok(OwnedFd::from(f))
    })
    .as_ref()
    .map(|fd| PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())))
    .map_err(Clone::clone)
}
