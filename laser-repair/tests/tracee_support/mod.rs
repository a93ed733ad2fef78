//! Shared by the tracee integration tests: builds `target.c` with gcc, runs it, talks to it, and
//! provides the repair the tests apply (a jump from the spin loop into a cache copy that loads
//! another constant).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use laser_repair::tracee::{CacheAddrs, CacheSizes, Patch, PatchSet, RepairSource};

/// Live tests share 2 cores with everything else: run them one at a time.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn target_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/tracee_support/target.c");
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("tracee_target_{}", std::process::id()));
        let st = Command::new("gcc")
            .args(["-O2", "-g", "-pthread", "-o"])
            .arg(&out)
            .arg(&src)
            .status()
            .expect("gcc runs");
        assert!(st.success(), "compiling {}", src.display());
        out
    })
    .clone()
}

/// One line of `report`/`final` from the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub last: Vec<i64>,
    pub usr1: i64,
    pub rt: i64,
    pub eintr: i64,
    pub spawned: i64,
}

fn parse_report(line: &str) -> Report {
    let mut r = Report {
        last: vec![],
        usr1: 0,
        rt: 0,
        eintr: 0,
        spawned: 0,
    };
    for f in line.split_whitespace().skip(1) {
        match f.split_once('=') {
            Some(("usr1", v)) => r.usr1 = v.parse().unwrap(),
            Some(("rt", v)) => r.rt = v.parse().unwrap(),
            Some(("eintr", v)) => r.eintr = v.parse().unwrap(),
            Some(("spawned", v)) => r.spawned = v.parse().unwrap(),
            _ => r.last.push(f.parse().unwrap()),
        }
    }
    r
}

pub struct Target {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub pid: i32,
    pub site: u64,
    pub after: u64,
    pub slots: u64,
}

fn hex_field(line: &str, key: &str) -> u64 {
    let v = line
        .split_whitespace()
        .find_map(|f| f.strip_prefix(key))
        .unwrap_or_else(|| panic!("{key} in {line:?}"));
    u64::from_str_radix(v.trim_start_matches("0x"), 16).unwrap()
}

impl Target {
    pub fn spawn(workers: usize, spawner: bool) -> Target {
        Self::spawn_with(workers, spawner, false)
    }

    pub fn spawn_with(workers: usize, spawner: bool, seccomp: bool) -> Target {
        let mut child = Command::new(target_binary())
            .arg(workers.to_string())
            .arg(if spawner { "1" } else { "0" })
            .arg(if seccomp { "1" } else { "0" })
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("target starts");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert!(line.starts_with("ready"), "{line:?}");
        let pid = child.id() as i32;
        let t = Target {
            child,
            stdin,
            stdout,
            pid,
            site: hex_field(&line, "site="),
            after: hex_field(&line, "after="),
            slots: hex_field(&line, "slots="),
        };
        // Every worker has run its loop once.
        t.wait_for(|r| r.last.iter().all(|&v| v == 1), "workers start")
    }

    pub fn report(&mut self) -> Report {
        self.stdin.write_all(b"report\n").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        assert!(line.starts_with("report"), "target said {line:?}");
        parse_report(&line)
    }

    /// Polls reports until `ok` holds (10 s at most).
    pub fn wait_for(mut self, ok: impl Fn(&Report) -> bool, what: &str) -> Self {
        self.poll(ok, what);
        self
    }

    pub fn poll(&mut self, ok: impl Fn(&Report) -> bool, what: &str) -> Report {
        let start = Instant::now();
        loop {
            let r = self.report();
            if ok(&r) {
                return r;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "timed out waiting for {what}: {r:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Asks the target to finish; returns its final report and exit code.
    pub fn quit(mut self) -> (Report, i32) {
        self.stdin.write_all(b"quit\n").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let code = self.child.wait().unwrap().code().unwrap_or(-1);
        assert!(line.starts_with("final"), "target said {line:?}");
        (parse_report(&line), code)
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The 7 original bytes at `spin_site`: `movq $1, %rax`.
pub const ORIGINAL: [u8; 7] = [0x48, 0xc7, 0xc0, 1, 0, 0, 0];

/// A repair of the spin loop: `spin_site` jumps to `incq data; movq $K, %rax; jmp spin_after`
/// in the cache (`data` = first word of the cache's data area).
pub struct LoopRepair {
    pub site: u64,
    pub after: u64,
    pub k: u32,
    /// Claimed original bytes (tests pass wrong ones to provoke a refusal).
    pub old: Vec<u8>,
    pub map_pcs: bool,
}

impl LoopRepair {
    pub fn new(t: &Target, k: u32) -> Self {
        LoopRepair {
            site: t.site,
            after: t.after,
            k,
            old: ORIGINAL.to_vec(),
            map_pcs: true,
        }
    }
}

fn rel32(from_next: u64, to: u64) -> Result<[u8; 4], String> {
    let d = to.wrapping_sub(from_next) as i64;
    i32::try_from(d)
        .map(|d| d.to_le_bytes())
        .map_err(|_| format!("{to:#x} out of rel32 reach of {from_next:#x}"))
}

impl RepairSource for LoopRepair {
    fn code_span(&self) -> std::ops::Range<u64> {
        self.site..self.after + 32
    }
    fn sizes(&self) -> CacheSizes {
        CacheSizes {
            code: 64,
            data: 4096,
            record: 0,
        }
    }
    fn materialize(&self, c: &CacheAddrs) -> Result<PatchSet, String> {
        // incq data(%rip): proves the data area is writable and the copy runs.
        let mut code = vec![0x48, 0xff, 0x05];
        code.extend_from_slice(&rel32(c.code_base + 7, c.data_base)?);
        let jmp_at = c.code_base + 14;
        code.extend_from_slice(&[0x48, 0xc7, 0xc0]);
        code.extend_from_slice(&self.k.to_le_bytes());
        code.push(0xe9);
        code.extend_from_slice(&rel32(jmp_at + 5, self.after)?);
        let mut new = vec![0xe9];
        new.extend_from_slice(&rel32(self.site + 5, c.code_base)?);
        new.extend_from_slice(&[0x66, 0x90]);
        let pc_map = if self.map_pcs {
            // The copy's `movq` is also a safe point for undo: going back to `spin_site` just
            // skips one count in the data area.
            vec![
                (self.site, c.code_base),
                (self.site, c.code_base + 7),
                (self.after, jmp_at),
            ]
        } else {
            vec![]
        };
        Ok(PatchSet {
            code,
            data: vec![],
            patches: vec![Patch {
                addr: self.site,
                old_bytes: self.old.clone(),
                new_bytes: new,
            }],
            pc_map,
        })
    }
}

/// Anonymous executable mappings of `pid` (where code caches live).
pub fn anon_exec_mappings(pid: i32) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() == 5 && f[1].contains('x')
        })
        .map(str::to_string)
        .collect()
}

pub fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}
