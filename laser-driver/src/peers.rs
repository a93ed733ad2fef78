//! Other laser sessions on this machine, so that whole-CPU watch windows
//! ([`crate::Watcher::set_cpu_wide`]) are opened only by a session that is alone.
//!
//! x86 has 4 debug registers per CPU, and the kernel gives a breakpoint bound to a whole CPU
//! one of them for every task that runs there: while one session's whole-CPU window counts,
//! another session's breakpoints (per thread or per CPU) find no room (`ENOSPC`), and its
//! threads go unwatched for that window. Breakpoints bound to threads coexist (each thread
//! has its own 4). So every watching session holds a shared lock on one byte of a file in the
//! temporary directory (`/tmp/laser-watch.lock`), and a window opens for whole CPUs only when no other session holds
//! one; otherwise per thread, as before whole-CPU windows existed. Open-file-description
//! locks (`F_OFD_SETLK`): two sessions of one process (tests) see each other, and the lock
//! goes with the descriptor, whatever else the process closes.
//!
//! A session holds a second byte while one of its whole-CPU windows is open. One that joins
//! meanwhile is seen at the holder's next poll (≤ 50 ms), which then re-opens that window per
//! thread and lets the byte go; a breakpoint of the newcomer refused in between waits for that
//! ([`Peers::wait_for_whole_cpu_windows`]) and is tried again. `LASER_TRACE_PEERS=1` prints
//! each such wait on stderr.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The lock file, shared by every user's sessions (created world-readable; a read lock needs
/// only read access). Always in `/tmp`, not `$TMPDIR`: the debug registers are the machine's,
/// and sessions with different temporary directories must still see each other.
pub fn lock_path() -> PathBuf {
    PathBuf::from("/tmp/laser-watch.lock")
}

/// The byte every watching session holds a read lock on.
const SESSIONS: i64 = 0;
/// The byte a session holds while one of its whole-CPU windows is open.
const WINDOW: i64 = 1;

/// This session's shared lock on the peers file.
#[derive(Debug)]
pub struct Peers {
    file: File,
}

impl Peers {
    /// Takes this session's shared lock on `path` (created if missing). `None` where the
    /// file cannot be opened or locked (a read-only temporary directory, a kernel before 3.15
    /// without OFD locks): the session cannot know its peers.
    pub fn join(path: &Path) -> Option<Peers> {
        // O_NOFOLLOW: a link planted at the name in a shared directory is not followed; the
        // file is never written, only locked.
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .or_else(|_| {
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .mode(0o644)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(path)
            })
            .ok()?;
        let peers = Peers { file };
        peers.lock(libc::F_OFD_SETLK, libc::F_RDLCK as i16)?;
        Some(peers)
    }

    /// Whether no other session holds a lock on the file now.
    pub fn alone(&self) -> bool {
        self.free(SESSIONS)
    }

    /// This session has a whole-CPU window open (`true`) or not.
    pub fn hold_whole_cpu_window(&self, open: bool) {
        let kind = if open { libc::F_RDLCK } else { libc::F_UNLCK };
        // A failure leaves the others unable to see the window: they meet it as before
        // peers were known (a refused breakpoint), nothing worse.
        let _ = self.lock_at(WINDOW, libc::F_OFD_SETLK, kind as i16);
    }

    /// Waits until no other session has a whole-CPU window open, up to `max`; whether none
    /// has.
    pub fn wait_for_whole_cpu_windows(&self, max: std::time::Duration) -> bool {
        let start = std::time::Instant::now();
        loop {
            if self.free(WINDOW) {
                return true;
            }
            if start.elapsed() >= max {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Whether no other session holds a lock on byte `at`: F_OFD_GETLK answers with the
    /// first lock that would conflict with a write lock, any other session's read lock (this
    /// descriptor's own never conflicts).
    fn free(&self, at: i64) -> bool {
        self.lock_at(at, libc::F_OFD_GETLK, libc::F_WRLCK as i16)
            .is_some_and(|l| l.l_type == libc::F_UNLCK as i16)
    }

    fn lock(&self, cmd: libc::c_int, kind: i16) -> Option<libc::flock> {
        self.lock_at(SESSIONS, cmd, kind)
    }

    fn lock_at(&self, at: i64, cmd: libc::c_int, kind: i16) -> Option<libc::flock> {
        // SAFETY: an all-zero flock is a valid value of the plain C struct.
        let mut l: libc::flock = unsafe { std::mem::zeroed() };
        l.l_type = kind;
        l.l_whence = libc::SEEK_SET as i16;
        l.l_start = at;
        l.l_len = 1;
        // SAFETY: fcntl with an OFD lock command reads and (GETLK) writes the one flock
        // struct it is given, which lives on this stack frame for the call.
        let r = unsafe { libc::fcntl(self.file.as_raw_fd(), cmd, &mut l) };
        (r == 0).then_some(l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_see_each_other_and_their_leaving() {
        let dir = std::env::temp_dir().join(format!("laser-peers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("laser-watch.lock");
        let a = Peers::join(&path).expect("a lock in the temporary directory");
        assert!(a.alone());
        let b = Peers::join(&path).unwrap();
        assert!(!a.alone() && !b.alone());
        // b holds a whole-CPU window: a waits for it, in vain while it stays open.
        b.hold_whole_cpu_window(true);
        assert!(!a.wait_for_whole_cpu_windows(std::time::Duration::from_millis(5)));
        assert!(b.wait_for_whole_cpu_windows(std::time::Duration::ZERO));
        b.hold_whole_cpu_window(false);
        assert!(a.wait_for_whole_cpu_windows(std::time::Duration::ZERO));
        b.hold_whole_cpu_window(true);
        drop(b);
        assert!(a.alone());
        assert!(a.wait_for_whole_cpu_windows(std::time::Duration::ZERO));
        // A second session opens the file the first created (read-only suffices).
        let c = Peers::join(&path).unwrap();
        assert!(!a.alone());
        drop((a, c));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_link_at_the_name_is_not_followed() {
        let dir = std::env::temp_dir().join(format!("laser-peers-link-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let target = dir.join("elsewhere");
        std::fs::write(&target, b"").unwrap();
        let path = dir.join("laser-watch.lock");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        assert!(Peers::join(&path).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
