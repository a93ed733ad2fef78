//! Starting a program so that laser's events exist before its first instruction.
//!
//! ```text
//!  laser                                   child
//!  ─────                                   ─────
//!  resolve argv[0] on $PATH
//!  fork ─────────────────────────────────▶ read(go) … blocks
//!  open events on child pid (per CPU,
//!    inherit, enable_on_exec)
//!  write(go) ────────────────────────────▶ execv(prog)  ── events enable here
//!  read(err): EOF = exec succeeded   ◀──── (on failure) write(err, errno); _exit(127)
//! ```
//!
//! The child runs only async-signal-safe calls between fork and exec (read, execv, write,
//! _exit): laser may be multithreaded and another thread may hold the malloc lock.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::error::DriverError;

/// How a target ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// `exit(code)`.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
    /// The process is gone but was not laser's child (attach), so its status is unknowable.
    Unknown,
}

/// A forked child parked before `execv`.
#[derive(Debug)]
pub struct Stopped {
    pub pid: i32,
    program: String,
    go: Option<OwnedFd>,
    err: OwnedFd,
}

fn pipe() -> Result<(OwnedFd, OwnedFd), DriverError> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(DriverError::io("pipe2", io::Error::last_os_error()));
    }
    // SAFETY: both descriptors are fresh and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Finds the file `execvp` would run, so "not found" is known before forking.
pub fn resolve_program(program: &OsStr, path_var: Option<&OsStr>) -> Result<PathBuf, String> {
    if program.as_bytes().contains(&b'/') {
        return Ok(PathBuf::from(program));
    }
    let path_var = path_var.unwrap_or(OsStr::new("/usr/local/bin:/usr/bin:/bin"));
    for dir in std::env::split_paths(path_var) {
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        let cand = dir.join(program);
        if is_executable_file(&cand) {
            return Ok(cand);
        }
    }
    Err(format!("$PATH = {}", path_var.to_string_lossy()))
}

fn is_executable_file(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Extra set-up of a launched program: environment variables set (replacing any of the same
/// name in laser's environment) and file descriptors it inherits (laser's are close-on-exec).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChildSetup {
    pub env: Vec<(OsString, OsString)>,
    pub inherit_fds: Vec<i32>,
}

/// Forks a child that waits for [`Stopped::release`] before exec'ing `argv`.
pub fn spawn_stopped(argv: &[OsString]) -> Result<Stopped, DriverError> {
    spawn_stopped_with(argv, &ChildSetup::default())
}

/// [`spawn_stopped`] with an environment and inherited descriptors.
pub fn spawn_stopped_with(argv: &[OsString], setup: &ChildSetup) -> Result<Stopped, DriverError> {
    let first = argv.first().ok_or(DriverError::EmptyCommand)?;
    let program = first.to_string_lossy().into_owned();
    let path = resolve_program(first, std::env::var_os("PATH").as_deref()).map_err(|searched| {
        DriverError::ProgramNotFound {
            program: program.clone(),
            searched,
        }
    })?;
    let nul = |s: &OsStr| {
        CString::new(s.as_bytes()).map_err(|_| DriverError::Exec {
            program: program.clone(),
            source: io::Error::new(io::ErrorKind::InvalidInput, "argument contains a NUL byte"),
        })
    };
    let c_path = nul(path.as_os_str())?;
    let c_args = argv.iter().map(|a| nul(a)).collect::<Result<Vec<_>, _>>()?;
    let mut c_argv: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
    c_argv.push(std::ptr::null());
    // The environment is built before the fork: the child may only call async-signal-safe
    // functions, so it cannot allocate.
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| !setup.env.iter().any(|(n, _)| n == k))
        .collect();
    env.extend(setup.env.iter().cloned());
    let c_env = env
        .iter()
        .map(|(k, v)| {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            nul(OsStr::from_bytes(&kv))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut c_envp: Vec<*const libc::c_char> = c_env.iter().map(|a| a.as_ptr()).collect();
    c_envp.push(std::ptr::null());
    let inherit = setup.inherit_fds.clone();

    // SAFETY: sigemptyset initialises the set it is given; a zeroed sigset_t is valid input.
    let empty_mask = unsafe {
        let mut m: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut m);
        m
    };
    let (go_r, go_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    // SAFETY: fork has no preconditions; the child below only calls async-signal-safe
    // functions on memory prepared before the fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(DriverError::io("fork", io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY (whole block): child side of fork. Only close/signal/sigprocmask/read/fcntl/
        // execve/write/_exit are called, all async-signal-safe; the pointers are to CStrings and a
        // sigset prepared before the fork, alive for the whole block.
        unsafe {
            libc::close(go_w.as_raw_fd());
            libc::close(err_r.as_raw_fd());
            // The program must start with default signal state, as from a shell: Rust sets
            // SIGPIPE to SIG_IGN (ignored dispositions survive exec) and laser's threads may
            // block signals (the mask survives exec too). std::process::Command does the same.
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            libc::sigprocmask(libc::SIG_SETMASK, &empty_mask, std::ptr::null_mut());
            let mut b = 0u8;
            let n = loop {
                let n = libc::read(go_r.as_raw_fd(), &mut b as *mut u8 as *mut libc::c_void, 1);
                if n < 0 && *libc::__errno_location() == libc::EINTR {
                    continue;
                }
                break n;
            };
            if n != 1 {
                // laser gave up (dropped the handle) before releasing us.
                libc::_exit(127);
            }
            for &fd in &inherit {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags >= 0 {
                    libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
                }
            }
            libc::execve(c_path.as_ptr(), c_argv.as_ptr(), c_envp.as_ptr());
            let errno = *libc::__errno_location();
            libc::write(
                err_w.as_raw_fd(),
                &errno as *const i32 as *const libc::c_void,
                4,
            );
            libc::_exit(127);
        }
    }
    drop(go_r);
    drop(err_w);
    Ok(Stopped {
        pid,
        program,
        go: Some(go_w),
        err: err_r,
    })
}

impl Stopped {
    /// Lets the child exec and waits until the exec happened (the CLOEXEC error pipe closes)
    /// or failed (the child sends errno). On failure the child is reaped.
    pub fn release(mut self) -> Result<i32, DriverError> {
        let go = self.go.take().expect("released once");
        let b = 1u8;
        // SAFETY: writes one byte from a live local to a pipe we own.
        let w = unsafe { libc::write(go.as_raw_fd(), &b as *const u8 as *const libc::c_void, 1) };
        if w != 1 {
            return Err(DriverError::io(
                "waking the launched child",
                io::Error::last_os_error(),
            ));
        }
        drop(go);
        let mut buf = [0u8; 4];
        let mut got = 0;
        while got < 4 {
            // SAFETY: reads into the unfilled tail of a local buffer.
            let n = unsafe {
                libc::read(
                    self.err.as_raw_fd(),
                    buf[got..].as_mut_ptr() as *mut libc::c_void,
                    4 - got,
                )
            };
            if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            if n <= 0 {
                break;
            }
            got += n as usize;
        }
        if got == 0 {
            return Ok(self.pid);
        }
        let errno = i32::from_ne_bytes(buf);
        let _ = wait(self.pid, false);
        self.pid = -1;
        if errno == libc::ENOENT {
            return Err(DriverError::ProgramNotFound {
                program: self.program.clone(),
                searched: "the given path".into(),
            });
        }
        Err(DriverError::Exec {
            program: self.program.clone(),
            source: io::Error::from_raw_os_error(errno),
        })
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // Not released (an event failed to open): closing `go` makes the child _exit(127);
        // reap it so no zombie is left.
        if self.go.take().is_some() && self.pid > 0 {
            let _ = wait(self.pid, false);
        }
    }
}

/// `waitpid` on our child. `nohang`: `Ok(None)` while it runs.
pub fn wait(pid: i32, nohang: bool) -> Result<Option<ExitStatus>, DriverError> {
    let mut status = 0;
    loop {
        // SAFETY: waitpid writes the status word into a live local.
        let r = unsafe { libc::waitpid(pid, &mut status, if nohang { libc::WNOHANG } else { 0 }) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(DriverError::io(format!("waitpid({pid})"), e));
        }
        if r == 0 {
            return Ok(None);
        }
        if libc::WIFEXITED(status) {
            return Ok(Some(ExitStatus::Code(libc::WEXITSTATUS(status))));
        }
        if libc::WIFSIGNALED(status) {
            return Ok(Some(ExitStatus::Signal(libc::WTERMSIG(status))));
        }
        // Stopped/continued notifications are not requested; loop defensively.
        if nohang {
            return Ok(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_on_path_and_reports_what_was_searched() {
        let p = resolve_program(
            OsStr::new("sh"),
            Some(OsStr::new("/nonexistent:/bin:/usr/bin")),
        )
        .unwrap();
        assert!(p.ends_with("sh"));
        let e =
            resolve_program(OsStr::new("no-such-prog-xyz"), Some(OsStr::new("/bin"))).unwrap_err();
        assert!(e.contains("/bin"), "{e}");
        assert_eq!(
            resolve_program(OsStr::new("./rel/x"), None).unwrap(),
            PathBuf::from("./rel/x")
        );
    }

    #[test]
    fn exit_code_and_signal_are_reported() {
        let argv: Vec<OsString> = ["sh", "-c", "exit 7"].iter().map(Into::into).collect();
        let s = spawn_stopped(&argv).unwrap();
        let pid = s.release().unwrap();
        assert_eq!(wait(pid, false).unwrap(), Some(ExitStatus::Code(7)));

        let argv: Vec<OsString> = ["sh", "-c", "kill -9 $$"].iter().map(Into::into).collect();
        let pid = spawn_stopped(&argv).unwrap().release().unwrap();
        assert_eq!(wait(pid, false).unwrap(), Some(ExitStatus::Signal(9)));
    }

    #[test]
    fn the_program_starts_with_default_signal_dispositions() {
        // The test harness ignores SIGPIPE; a shell that inherits an ignored signal cannot
        // un-ignore it, so this exits 3 unless the child reset SIGPIPE to default.
        let argv: Vec<OsString> = ["sh", "-c", "kill -PIPE $$; exit 3"]
            .iter()
            .map(Into::into)
            .collect();
        let pid = spawn_stopped(&argv).unwrap().release().unwrap();
        assert_eq!(
            wait(pid, false).unwrap(),
            Some(ExitStatus::Signal(libc::SIGPIPE))
        );
    }

    #[test]
    fn exec_failures_are_typed() {
        let argv = vec![OsString::from("/nonexistent/prog")];
        let e = spawn_stopped(&argv).unwrap().release().unwrap_err();
        assert!(matches!(e, DriverError::ProgramNotFound { .. }), "{e}");

        // A directory: exec fails with EACCES.
        let argv = vec![OsString::from("/tmp")];
        let e = spawn_stopped(&argv).unwrap().release().unwrap_err();
        match e {
            DriverError::Exec { source, .. } => {
                assert_eq!(source.raw_os_error(), Some(libc::EACCES))
            }
            e => panic!("{e}"),
        }

        let e = spawn_stopped(&[OsString::from("no-such-prog-xyz")]).unwrap_err();
        assert!(matches!(e, DriverError::ProgramNotFound { .. }), "{e}");
        assert!(matches!(spawn_stopped(&[]), Err(DriverError::EmptyCommand)));
    }

    #[test]
    fn dropping_an_unreleased_child_reaps_it() {
        let s = spawn_stopped(&[OsString::from("true")]).unwrap();
        let pid = s.pid;
        drop(s);
        // Already reaped: waitpid reports ECHILD.
        assert!(wait(pid, true).is_err());
    }
}
