//! The allocation recorder `laser run` preloads (`shim/laser_alloc.c`, built by build.rs and
//! embedded here): writing it out, the environment and pipe the program gets, and the
//! messages it sends (the address of its table).

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use laser_detect::naming::alloc_record::AllocRecord;
use laser_driver::launch::ChildSetup;

/// What the recorder announced in history mode.
#[derive(Clone, Debug)]
pub enum Message {
    /// A block allocated on the history's site; the thread waits for [`AllocShim::answer`].
    Alloc {
        tid: u32,
        cpu: u32,
        rec: AllocRecord,
    },
    /// The watched block is being freed; the thread waits for an answer.
    Free { tid: u32, cpu: u32, ptr: u64 },
}

/// The recorder, compiled for this machine by build.rs.
const SHIM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/liblaser_alloc.so"));

/// Bytes of one message: kind, pid, tid, cpu, then an entry (ptr, size, ret, sp, bp, 24
/// stack words).
const MESSAGE_BYTES: usize = 8 * (4 + 5 + 24);

/// The recorder's file (removed on drop) and laser's end of its pipe.
pub struct AllocShim {
    /// The program's end of the pipe, held until it has been launched.
    child_end: Option<OwnedFd>,
    path: PathBuf,
    announce: std::fs::File,
    pending: Vec<u8>,
    /// Run-time address of the recorder's table in the target, once it said so.
    pub table: Option<u64>,
    /// History mode: laser's end of the answer pipe, and the program's until it has it.
    ack: Option<std::fs::File>,
    child_ack: Option<OwnedFd>,
    /// Announcements not handled yet.
    pub messages: Vec<Message>,
}

fn pipe(flags: libc::c_int) -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), flags) } != 0 {
        return Err(std::io::Error::last_os_error()).context("pipe for the allocation recorder");
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

impl AllocShim {
    /// Writes the recorder out and returns the set-up that preloads it into the program.
    /// `history_sites`: return addresses (ELF vaddrs in the executable) whose allocations the
    /// recorder announces and holds until laser answers (`--history-site`).
    pub fn prepare(
        history: Option<&crate::alloc_history::HistoryFilter>,
    ) -> Result<(AllocShim, ChildSetup)> {
        let path = std::env::temp_dir().join(format!("laser-alloc-{}.so", std::process::id()));
        crate::private_file::write(&path, SHIM)
            .with_context(|| format!("writing the allocation recorder to {}", path.display()))?;
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into the array it is given.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(std::io::Error::last_os_error())
                .context("pipe for the allocation recorder");
        }
        // SAFETY: both descriptors were just created and are owned by nobody else.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let preload = match std::env::var_os("LD_PRELOAD") {
            Some(p) if !p.is_empty() => {
                let mut s = p;
                s.push(":");
                s.push(&path);
                s
            }
            _ => path.clone().into_os_string(),
        };
        let mut env: Vec<(OsString, OsString)> = vec![
            ("LD_PRELOAD".into(), preload),
            (
                "LASER_ALLOC_PARENT".into(),
                std::process::id().to_string().into(),
            ),
            ("LASER_ALLOC_FD".into(), w.as_raw_fd().to_string().into()),
        ];
        let mut inherit_fds = vec![w.as_raw_fd()];
        let (mut ack, mut child_ack) = (None, None);
        if let Some(h) = history {
            // Blocking on both ends: the program waits for each answer (≤ 2 s, its poll).
            let (ar, aw) = pipe(libc::O_CLOEXEC)?;
            env.push(("LASER_ALLOC_ACK".into(), ar.as_raw_fd().to_string().into()));
            if !h.sites.is_empty() {
                let list: Vec<String> = h.sites.iter().map(|v| format!("{v:x}")).collect();
                env.push(("LASER_ALLOC_SITES".into(), list.join(",").into()));
            }
            if let Some(n) = h.size {
                env.push(("LASER_ALLOC_SIZE".into(), n.to_string().into()));
            }
            inherit_fds.push(ar.as_raw_fd());
            ack = Some(std::fs::File::from(aw));
            child_ack = Some(ar);
        }
        let setup = ChildSetup { env, inherit_fds };
        Ok((
            AllocShim {
                child_end: Some(w),
                path,
                announce: std::fs::File::from(r),
                pending: Vec::new(),
                table: None,
                ack,
                child_ack,
                messages: Vec::new(),
            },
            setup,
        ))
    }

    /// Whether the recorder is mapped in the process whose maps are `regions`: an `exec`
    /// without it (e.g. `env LD_PRELOAD=x ./app`) leaves a table address that points into
    /// another image.
    pub fn mapped_in(&self, regions: &[laser_detect::decode::maps::Region]) -> bool {
        regions.iter().any(|r| Path::new(&r.path) == self.path)
    }

    /// Closes laser's copy of the program's end once the program has it.
    pub fn launched(&mut self) {
        self.child_end = None;
        self.child_ack = None;
    }

    /// Answers the announcement the program waits on: `w` watching it, `n` not this one,
    /// `q` announce no more.
    pub fn answer(&mut self, c: u8) {
        if let Some(a) = self.ack.as_mut() {
            let _ = std::io::Write::write_all(a, &[c]);
        }
    }

    /// Reads what the recorder said since the last call.
    pub fn drain(&mut self) {
        let mut buf = [0u8; 4096];
        while let Ok(n) = self.announce.read(&mut buf) {
            if n == 0 {
                break;
            }
            self.pending.extend_from_slice(&buf[..n]);
        }
        while self.pending.len() >= MESSAGE_BYTES {
            let m: Vec<u8> = self.pending.drain(..MESSAGE_BYTES).collect();
            let w = |i: usize| u64::from_le_bytes(m[i * 8..i * 8 + 8].try_into().expect("8"));
            match w(0) {
                0 => self.table = Some(w(4)),
                1 => {
                    if let Some(rec) = AllocRecord::parse(&m[32..]) {
                        let (tid, cpu) = (w(2) as u32, w(3) as u32);
                        self.messages.push(Message::Alloc { tid, cpu, rec });
                    }
                }
                2 => self.messages.push(Message::Free {
                    tid: w(2) as u32,
                    cpu: w(3) as u32,
                    ptr: w(4),
                }),
                _ => {}
            }
        }
    }
}

impl Drop for AllocShim {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
