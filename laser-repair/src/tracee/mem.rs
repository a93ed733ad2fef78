//! Reading and writing target memory through `/proc/PID/mem`.
//!
//! Why not `process_vm_writev`: it honours page protections, and code pages are read-only. The
//! kernel serves `/proc/PID/mem` writes with FOLL_FORCE for a ptrace-attached tracer, the same way
//! debuggers plant breakpoints, so code and the read-only code cache are written in place
//! (private file pages get copied on write, as for a breakpoint). One positioned call per write;
//! every write is read back, because a short or silently dropped write is the one failure that
//! would leave a half-patched instruction behind.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;

use super::error::{Result, TraceeError};

/// An open `/proc/PID/mem`.
#[derive(Debug)]
pub struct ProcMem {
    pid: i32,
    file: File,
}

impl ProcMem {
    /// Opens the memory of `pid` for reading and writing.
    pub fn open(pid: i32) -> Result<Self> {
        let path = format!("/proc/{pid}/mem");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    TraceeError::NoSuchProcess { pid }
                } else {
                    TraceeError::io(pid, format!("opening {path}"), e)
                }
            })?;
        Ok(ProcMem { pid, file })
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Reads exactly `len` bytes at `addr`.
    pub fn read(&self, addr: u64, len: usize) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        self.file.read_exact_at(&mut buf, addr).map_err(|e| {
            TraceeError::io(self.pid, format!("reading {len} bytes at {addr:#x}"), e)
        })?;
        Ok(buf)
    }

    /// Reads up to `len` bytes at `addr`, stopping early at an unmapped page.
    pub fn read_partial(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        let mut got = 0;
        while got < len {
            match self.file.read_at(&mut buf[got..], addr + got as u64) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        buf.truncate(got);
        buf
    }

    /// Writes `bytes` at `addr` and reads them back.
    pub fn write_verified(&self, addr: u64, bytes: &[u8]) -> Result<()> {
        self.file.write_all_at(bytes, addr).map_err(|e| {
            TraceeError::io(
                self.pid,
                format!("writing {} bytes at {addr:#x}", bytes.len()),
                e,
            )
        })?;
        if self.read(addr, bytes.len())? != bytes {
            return Err(TraceeError::VerifyFailed {
                addr,
                len: bytes.len(),
            });
        }
        Ok(())
    }
}
