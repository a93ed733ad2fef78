//! Starting a program so that laser's events exist before its first instruction.
//!
//! ```text
//!  laser                                   child
//!  ─────                                   ─────
//!  resolve argv[0] on $PATH
//!  clone(CLONE_VM) ──────────────────────▶ read(go) … blocks
//!  open events on child pid (per CPU,
//!    inherit, enable_on_exec)
//!  write(go) ────────────────────────────▶ execv(prog)  ── events enable here
//!  read(err): EOF = exec succeeded   ◀──── (on failure) write(err, errno); _exit(127)
//! ```
//!
//! The child runs in laser's memory until its exec, as a `posix_spawn` child does (see
//! `child_main`), and makes only async-signal-safe calls there (read, execve, write, _exit):
//! laser is multithreaded and another thread may hold the malloc lock.

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

/// A child parked before `execve`.
pub struct Stopped {
    pub pid: i32,
    program: String,
    go: Option<OwnedFd>,
    err: OwnedFd,
    /// What the child reads until its exec (`None` once it has exec'd or been reaped).
    child: Option<Box<ChildMem>>,
}

impl std::fmt::Debug for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stopped")
            .field("pid", &self.pid)
            .field("program", &self.program)
            .finish_non_exhaustive()
    }
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

/// Finds the file `execvp` would run, so "not found" is known before the child exists.
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

/// Starts a child that waits for [`Stopped::release`] before exec'ing `argv`.
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
    // The environment is built before the clone: the child may only call async-signal-safe
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
    let mut child = Box::new(ChildMem {
        args: ChildArgs {
            path: c_path,
            argv: c_argv,
            envp: c_envp,
            inherit,
            empty_mask,
            go_r: go_r.as_raw_fd(),
            go_w: go_w.as_raw_fd(),
            err_r: err_r.as_raw_fd(),
            err_w: err_w.as_raw_fd(),
        },
        _args: c_args,
        _env: c_env,
        stack: ChildStack::new()?,
    });
    let arg = &mut child.args as *mut ChildArgs as *mut libc::c_void;
    // SAFETY: the child runs `child_main` on its own stack in laser's address space
    // (CLONE_VM) with a copy of laser's descriptor table and signal handlers (no
    // CLONE_FILES, no CLONE_SIGHAND); everything it reads is owned by `child`, which the
    // returned handle keeps until the child has exec'd or been reaped. SIGCHLD makes it an
    // ordinary child for waitpid.
    let pid = unsafe {
        libc::clone(
            child_main,
            child.stack.top(),
            libc::CLONE_VM | libc::SIGCHLD,
            arg,
        )
    };
    if pid < 0 {
        return Err(DriverError::io("clone", io::Error::last_os_error()));
    }
    drop(go_r);
    drop(err_w);
    Ok(Stopped {
        pid,
        program,
        go: Some(go_w),
        err: err_r,
        child: Some(child),
    })
}

/// What the parked child reads before its exec: it shares laser's memory (`CLONE_VM`), so
/// this stays alive, in the [`Stopped`] handle, until the exec happened or the child was
/// reaped.
struct ChildMem {
    args: ChildArgs,
    /// The strings `args`' pointer arrays point into.
    _args: Vec<CString>,
    _env: Vec<CString>,
    stack: ChildStack,
}

/// `child_main`'s argument: plain data and descriptor numbers only.
struct ChildArgs {
    path: CString,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    inherit: Vec<i32>,
    empty_mask: libc::sigset_t,
    go_r: i32,
    go_w: i32,
    err_r: i32,
    err_w: i32,
}

/// The parked child's stack, unmapped on drop.
struct ChildStack {
    base: *mut libc::c_void,
    len: usize,
}

impl ChildStack {
    /// Enough for `child_main` and the libc calls it makes (a few syscall wrappers).
    const LEN: usize = 64 * 1024;

    fn new() -> Result<Self, DriverError> {
        // SAFETY: an anonymous private mapping; the kernel picks the address.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                Self::LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(DriverError::io(
                "mapping the launched child's stack",
                io::Error::last_os_error(),
            ));
        }
        #[cfg(test)]
        LIVE_STACKS.with(|n| n.set(n.get() + 1));
        Ok(ChildStack {
            base,
            len: Self::LEN,
        })
    }

    /// The stack grows down from its end (16-byte aligned: a page boundary).
    fn top(&self) -> *mut libc::c_void {
        // SAFETY: one past the end of the mapping, which is what clone wants.
        unsafe { (self.base as *mut u8).add(self.len) as *mut libc::c_void }
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`.
        unsafe { libc::munmap(self.base, self.len) };
        #[cfg(test)]
        LIVE_STACKS.with(|n| n.set(n.get() - 1));
    }
}

#[cfg(test)]
thread_local! {
    /// Child stacks this thread mapped and has not unmapped yet.
    static LIVE_STACKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The child between its creation and its exec: waits for [`Stopped::release`], then execs.
///
/// It runs in laser's address space (`CLONE_VM`, as `posix_spawn` does) rather than in a
/// forked copy: a fork write-protects all of laser's memory, and every page laser and its
/// threads then wrote took a fault and, laser having several threads, a TLB shootdown
/// interrupt on the other CPUs, some 1–2 ms of laser's CPU at each launch, taken from the
/// program that had just started on those CPUs. Only async-signal-safe libc calls that touch
/// nothing of laser's but the errno of the thread that cloned it (the TLS is shared): close,
/// signal, sigprocmask, read, fcntl, execve, write, _exit. Descriptors and signal
/// dispositions are the child's own copies.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY (whole body): `arg` is the `ChildArgs` the parent keeps alive until this child
    // has exec'd or exited; the pointers in it are to CStrings it owns.
    unsafe {
        let a = &*(arg as *const ChildArgs);
        libc::close(a.go_w);
        libc::close(a.err_r);
        // The program must start with default signal state, as from a shell: Rust sets
        // SIGPIPE to SIG_IGN (ignored dispositions survive exec) and laser's threads may
        // block signals (the mask survives exec too). std::process::Command does the same.
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::sigprocmask(libc::SIG_SETMASK, &a.empty_mask, std::ptr::null_mut());
        let mut b = 0u8;
        let n = loop {
            let n = libc::read(a.go_r, &mut b as *mut u8 as *mut libc::c_void, 1);
            if n < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            }
            break n;
        };
        if n != 1 {
            // laser gave up (dropped the handle) before releasing us.
            libc::_exit(127);
        }
        for &fd in &a.inherit {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
            }
        }
        libc::execve(a.path.as_ptr(), a.argv.as_ptr(), a.envp.as_ptr());
        let errno = *libc::__errno_location();
        libc::write(a.err_w, &errno as *const i32 as *const libc::c_void, 4);
        libc::_exit(127)
    }
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
            // Exec'd (or killed before it): nothing of laser's is in use by it any more.
            self.child = None;
            return Ok(self.pid);
        }
        let errno = i32::from_ne_bytes(buf);
        let _ = wait(self.pid, false);
        self.child = None;
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
        // reap it so no zombie is left, and only then free what it ran on.
        let reaped = self.go.take().is_some() && self.pid > 0 && wait(self.pid, false).is_ok();
        if !reaped {
            // A child not known to be gone may still be parked on this memory (a release
            // whose wake-up failed): leave it mapped.
            if let Some(c) = self.child.take() {
                std::mem::forget(c);
            }
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

    /// The parked child runs in laser's memory on a stack of its own, mapped for it: each
    /// launch frees that once the child has exec'd, failed to, or been dropped unreleased.
    #[test]
    fn launches_leave_no_child_stack_behind() {
        let run = |argv: &[&str]| {
            let argv: Vec<OsString> = argv.iter().map(Into::into).collect();
            spawn_stopped(&argv).unwrap()
        };
        let live = || LIVE_STACKS.with(|n| n.get());
        let s = run(&["true"]);
        assert_eq!(live(), 1, "parked on its stack");
        let pid = s.release().unwrap();
        assert_eq!(live(), 0, "exec'd");
        assert_eq!(wait(pid, false).unwrap(), Some(ExitStatus::Code(0)));
        assert!(run(&["/tmp"]).release().is_err());
        assert_eq!(live(), 0, "failed exec");
        drop(run(&["true"]));
        assert_eq!(live(), 0, "dropped unreleased");
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
