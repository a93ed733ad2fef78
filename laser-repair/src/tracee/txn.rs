//! A change to a held process as one transaction: every step logs how to undo itself, and
//! dropping an uncommitted transaction replays that log backwards (bytes restored, mappings
//! unmapped), then the `ThreadLock` restores registers and detaches. One log instead of a guard
//! per step keeps the undo order right (newest first) and lets the undo of a mapping use the
//! same held thread for its injected `munmap`.

use std::ops::Range;
use std::time::Instant;

use super::error::{Result, TraceeError};
use super::maps::{self, MapRegion};
use super::mem::ProcMem;
use super::patch::{CacheAddrs, CacheSizes, ThreadPos};
use super::remote::{self, SyscallSite, SYS_MMAP, SYS_MPROTECT, SYS_MUNMAP};
use super::threads::{LockStats, ThreadLock};

#[derive(Debug)]
enum UndoStep {
    Bytes { addr: u64, bytes: Vec<u8> },
    Unmap { addr: u64, len: u64 },
}

/// Held threads, target memory, and the log of changes made so far.
#[derive(Debug)]
pub(crate) struct Txn {
    lock: Option<ThreadLock>,
    pub mem: ProcMem,
    site: Option<SyscallSite>,
    prefer_tid: Option<i32>,
    log: Vec<UndoStep>,
}

impl Txn {
    /// Seizes every thread, then opens the target's memory (in that order: with
    /// `kernel.yama.ptrace_scope = 1` only a tracer may open `/proc/PID/mem`).
    pub fn begin(pid: i32, prefer_tid: Option<i32>) -> Result<Self> {
        let lock = ThreadLock::seize_all(pid)?;
        let mem = ProcMem::open(pid)?;
        Ok(Txn {
            lock: Some(lock),
            mem,
            site: None,
            prefer_tid,
            log: Vec::new(),
        })
    }

    pub fn lock(&mut self) -> &mut ThreadLock {
        self.lock.as_mut().expect("lock present until commit")
    }

    pub fn lock_ref(&self) -> &ThreadLock {
        self.lock.as_ref().expect("lock present until commit")
    }

    pub fn pid(&self) -> i32 {
        self.mem.pid()
    }

    pub fn maps(&self) -> Result<Vec<MapRegion>> {
        let pid = self.pid();
        let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .map_err(|e| TraceeError::io(pid, "reading /proc/PID/maps", e))?;
        maps::parse_maps(&text)
    }

    /// Runs one syscall in the target (choosing the thread and instruction on first use).
    pub fn syscall(&mut self, nr: u64, args: [u64; 6]) -> Result<i64> {
        let t = Instant::now();
        let r = self.syscall_inner(nr, args);
        self.lock().phases.syscalls += t.elapsed();
        r
    }

    fn syscall_inner(&mut self, nr: u64, args: [u64; 6]) -> Result<i64> {
        if self.site.is_none() {
            let regions = self.maps()?;
            let lock = self.lock.as_ref().expect("lock present until commit");
            self.site = Some(remote::choose_site(
                lock,
                &self.mem,
                &regions,
                self.prefer_tid,
            )?);
        }
        let site = self.site.clone().expect("just set");
        let lock = self.lock.as_mut().expect("lock present until commit");
        remote::remote_syscall(lock, &self.mem, &site, nr, args)
    }

    fn syscall_ok(&mut self, name: &'static str, nr: u64, args: [u64; 6]) -> Result<u64> {
        let raw = self.syscall(nr, args)?;
        let tid = self.site.as_ref().map(|s| s.tid).unwrap_or(0);
        remote::syscall_result(raw).map_err(|errno| TraceeError::RemoteSyscall { name, tid, errno })
    }

    /// Maps a cache for `sizes` within rel32 reach of `span`: code r-x, data rw-.
    pub fn map_cache(&mut self, span: &Range<u64>, sizes: &CacheSizes) -> Result<CacheAddrs> {
        let len = CacheAddrs::layout(sizes, 0).map_len;
        let regions = self.maps()?;
        let candidates = maps::hole_candidates(&regions, span, len);
        let mut tried = 0;
        for &base in candidates.iter().take(16) {
            tried += 1;
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
            let prot = libc::PROT_READ | libc::PROT_EXEC;
            let raw = self.syscall(
                SYS_MMAP,
                [base, len, prot as u64, flags as u64, u64::MAX, 0],
            )?;
            match remote::syscall_result(raw) {
                Ok(got) if got == base => {
                    self.log.push(UndoStep::Unmap { addr: base, len });
                    let cache = CacheAddrs::layout(sizes, base);
                    if cache.data_len > 0 {
                        let rw = (libc::PROT_READ | libc::PROT_WRITE) as u64;
                        self.syscall_ok(
                            "mprotect",
                            SYS_MPROTECT,
                            [cache.data_base, cache.data_len as u64, rw, 0, 0, 0],
                        )?;
                    }
                    return Ok(cache);
                }
                // A kernel without MAP_FIXED_NOREPLACE (< 4.17) takes it as a hint only.
                Ok(got) => {
                    self.syscall_ok("munmap", SYS_MUNMAP, [got, len, 0, 0, 0, 0])?;
                }
                Err(nix::errno::Errno::EEXIST) => {}
                Err(errno) => {
                    let tid = self.site.as_ref().map(|s| s.tid).unwrap_or(0);
                    return Err(TraceeError::RemoteSyscall {
                        name: "mmap",
                        tid,
                        errno,
                    });
                }
            }
        }
        Err(TraceeError::NoHole {
            len,
            span_start: span.start,
            span_end: span.end,
            tried,
        })
    }

    /// Unmaps a mapping now (no undo: used by undo itself).
    pub fn unmap(&mut self, addr: u64, len: u64) -> Result<()> {
        self.syscall_ok("munmap", SYS_MUNMAP, [addr, len, 0, 0, 0, 0])
            .map(drop)
    }

    /// Writes bytes into a fresh mapping (its unmap already undoes them).
    pub fn fill(&mut self, addr: u64, bytes: &[u8]) -> Result<()> {
        let t = Instant::now();
        let r = self.mem.write_verified(addr, bytes);
        self.lock().phases.writes += t.elapsed();
        r
    }

    /// Replaces `expected` at `addr` by `new`, refusing if `expected` is not what is there.
    pub fn patch(&mut self, addr: u64, expected: &[u8], new: &[u8]) -> Result<()> {
        let found = self.mem.read(addr, expected.len())?;
        if found != expected {
            return Err(TraceeError::PatchMismatch {
                addr,
                expected: expected.to_vec(),
                found,
            });
        }
        // Logged before writing: a failed or partial write is undone too.
        self.log.push(UndoStep::Bytes { addr, bytes: found });
        let t = Instant::now();
        let r = self.mem.write_verified(addr, new);
        self.lock().phases.writes += t.elapsed();
        r
    }

    /// Every held thread's position.
    pub fn positions(&self) -> Result<Vec<ThreadPos>> {
        let lock = self.lock_ref();
        lock.tids()
            .into_iter()
            .map(|tid| Ok(ThreadPos::from_regs(tid, &lock.regs(tid)?)))
            .collect()
    }

    /// Sets `tid`'s RIP (restored by the lock unless committed).
    pub fn move_thread(&mut self, tid: i32, to: u64) -> Result<()> {
        let lock = self.lock();
        let mut regs = lock.regs(tid)?;
        regs.rip = to;
        lock.set_regs(tid, &regs)
    }

    /// Keeps every change, restores nothing, detaches.
    pub fn commit(mut self) -> LockStats {
        self.log.clear();
        let mut lock = self.lock.take().expect("lock present until commit");
        lock.commit_regs();
        lock.release()
    }

    fn rollback(&mut self) {
        while let Some(step) = self.log.pop() {
            let done = match &step {
                UndoStep::Bytes { addr, bytes } => self.mem.write_verified(*addr, bytes),
                UndoStep::Unmap { addr, len } => self.unmap(*addr, *len),
            };
            if let Err(e) = done {
                log::warn!("laser: undoing {step:?} in process {}: {e}", self.pid());
            }
        }
    }
}

impl Drop for Txn {
    fn drop(&mut self) {
        self.rollback();
        // The lock's own Drop restores registers and detaches.
    }
}
