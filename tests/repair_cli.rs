//! `laser repair` end to end on a live process compiled here with gcc: two threads bump
//! neighbouring longs of one line in `bump` (the store is found with objdump), counting rounds,
//! so the program itself proves no increment was lost (`ok 1`). Each test repairs a fresh
//! process while its threads run, and checks the bytes of the target through /proc/PID/mem.
//!
//! Built with gcc's defaults (`-fipa-ra` included: callers may keep values in caller-saved
//! registers across a call they know does not touch them; the repair must not clobber them).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

const LASER: &str = env!("CARGO_BIN_EXE_laser");

const FS_C: &str = r#"#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#define CHUNK 100000L
struct pair { long a; long b; } __attribute__((aligned(64)));
static struct pair counters;
static volatile int stop;
static long rounds[2];
__attribute__((noinline)) void bump(volatile long *p, long n) {
    for (long i = 0; i < n; i++) (*p)++;
}
/* Never called: an AVX store the rewriter must refuse. */
__asm__(".text\n.globl avx_loop\n.type avx_loop,@function\navx_loop:\n"
        "  xor %eax,%eax\n1:\n.globl avx_store\navx_store:\n  vmovdqu %ymm0,(%rdi,%rax)\n"
        "  add $32,%rax\n  cmp %rsi,%rax\n  jb 1b\n  vzeroupper\n  ret\n.size avx_loop,.-avx_loop\n");
static void *worker(void *arg) {
    long k = (long)arg;
    volatile long *p = k ? &counters.b : &counters.a;
    while (!stop) { bump(p, CHUNK); rounds[k]++; }
    return 0;
}
int main(void) {
    pthread_t t[2];
    for (long k = 0; k < 2; k++) pthread_create(&t[k], 0, worker, (void *)k);
    printf("pid %d\n", getpid()); fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin) && strncmp(line, "stop", 4) != 0) {}
    stop = 1;
    for (int k = 0; k < 2; k++) pthread_join(t[k], 0);
    printf("a %ld ra %ld b %ld rb %ld ok %d\n", counters.a, rounds[0], counters.b, rounds[1],
           counters.a == rounds[0] * CHUNK && counters.b == rounds[1] * CHUNK);
    return 0;
}
"#;

/// One live target at a time: two busy programs on 2 cores would only slow each other down.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

struct Bin {
    path: PathBuf,
    /// ELF vaddrs.
    bump: (u64, u64),
    store: u64,
    avx_store: u64,
}

fn build(name: &str, extra: &[&str]) -> Bin {
    let d = std::env::temp_dir().join(format!("laser-repair-cli-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let src = d.join("fs.c");
    std::fs::write(&src, FS_C).unwrap();
    let path = d.join(name);
    let ok = Command::new("gcc")
        .args(["-O2", "-g", "-pthread"])
        .args(extra)
        .arg("-o")
        .arg(&path)
        .arg(&src)
        .status()
        .expect("gcc runs");
    assert!(ok.success(), "gcc failed");
    let nm = run_text(Command::new("nm").arg("-S").arg(&path));
    let sym = |name: &str| -> (u64, u64) {
        let l = nm
            .lines()
            .find(|l| l.split_whitespace().last() == Some(name))
            .unwrap_or_else(|| panic!("{name} not in nm output"));
        let f: Vec<&str> = l.split_whitespace().collect();
        let a = u64::from_str_radix(f[0], 16).unwrap();
        let size = if f.len() == 4 {
            u64::from_str_radix(f[1], 16).unwrap()
        } else {
            0
        };
        (a, a + size)
    };
    let bump = sym("bump");
    // The store of `(*p)++`: the one instruction in bump writing through %rdi.
    let dis = run_text(
        Command::new("objdump")
            .args(["-d", "--no-show-raw-insn"])
            .arg(&path),
    );
    let store = dis
        .lines()
        .filter_map(|l| {
            let (a, rest) = l.trim().split_once(':')?;
            let a = u64::from_str_radix(a, 16).ok()?;
            ((bump.0..bump.1).contains(&a) && rest.contains("mov") && rest.contains(",(%rdi)"))
                .then_some(a)
        })
        .next()
        .expect("store in bump");
    Bin {
        path,
        bump,
        store,
        avx_store: sym("avx_store").0,
    }
}

fn bin() -> &'static Bin {
    static B: OnceLock<Bin> = OnceLock::new();
    B.get_or_init(|| build("fs", &[]))
}

fn run_text(c: &mut Command) -> String {
    let o = c.output().expect("tool runs");
    assert!(o.status.success(), "{c:?} failed");
    String::from_utf8(o.stdout).unwrap()
}

struct Target {
    child: Child,
    stdin: Option<ChildStdin>,
    pid: i32,
    bias: u64,
}

impl Target {
    fn spawn(b: &Bin) -> Target {
        let mut child = Command::new(&b.path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let pid: i32 = line.trim().strip_prefix("pid ").unwrap().parse().unwrap();
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        let p = b.path.to_str().unwrap();
        let bias = maps
            .lines()
            .filter(|l| l.ends_with(p) && l.contains(" 00000000 "))
            .map(|l| u64::from_str_radix(l.split('-').next().unwrap(), 16).unwrap())
            .next()
            .expect("first mapping of the binary (PIE, p_vaddr 0 at offset 0)");
        let stdin = child.stdin.take();
        Target {
            child,
            stdin,
            pid,
            bias,
        }
    }

    fn read(&self, vaddr: u64, len: usize) -> Vec<u8> {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::open(format!("/proc/{}/mem", self.pid)).unwrap();
        let mut b = vec![0; len];
        f.read_exact_at(&mut b, self.bias + vaddr).unwrap();
        b
    }

    fn anon_exec(&self) -> usize {
        std::fs::read_to_string(format!("/proc/{}/maps", self.pid))
            .unwrap()
            .lines()
            .filter(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() == 5 && f[1].contains('x')
            })
            .count()
    }

    /// Not stopped, not traced: what "untouched" means for the process state.
    fn free_running(&self) -> bool {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap();
        let field = |k: &str| {
            s.lines()
                .find(|l| l.starts_with(k))
                .map(|l| l[k.len()..].trim().to_string())
                .unwrap()
        };
        field("TracerPid:") == "0" && !field("State:").starts_with('t')
    }

    /// Stops the workers; returns the program's final line, asserting it proved its counts.
    fn finish(mut self) -> String {
        writeln!(self.stdin.as_mut().unwrap(), "stop").unwrap();
        drop(self.stdin.take());
        let mut text = String::new();
        std::io::Read::read_to_string(self.child.stdout.as_mut().unwrap(), &mut text).unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "target failed: {status:?} {text}");
        assert!(text.contains("ok 1"), "lost increments: {text}");
        text
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn laser(args: &[String]) -> Output {
    let o = Command::new(LASER).args(args).output().unwrap();
    eprintln!(
        "$ laser {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn repair_args(t: &Target, extra: &[&str]) -> Vec<String> {
    let mut v = vec!["repair".into(), "-p".into(), t.pid.to_string()];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

fn settle() {
    std::thread::sleep(Duration::from_millis(300));
}

#[test]
fn repair_mid_run_then_undo_keeps_every_increment() {
    let _g = serial();
    let b = bin();
    let t = Target::spawn(b);
    let orig = t.read(b.bump.0, (b.bump.1 - b.bump.0) as usize);
    let pc = format!("{:#x}", t.bias + b.store);
    let o = laser(&repair_args(&t, &["--pc", &pc]));
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    assert!(out.contains("applied: cache"), "{out}");
    assert!(out.contains("pause: "), "{out}");
    assert!(out.contains("SSB mode in use: FIFO") || out.contains("SSB mode in use: RTM"));
    assert_ne!(
        t.read(b.bump.0, orig.len()),
        orig,
        "bump's loop entry is patched"
    );
    assert!(t.free_running(), "laser detached");
    settle();
    assert!(t.free_running());
    let o = laser(&repair_args(&t, &["--undo"]));
    assert_eq!(o.status.code(), Some(0));
    assert!(
        stdout(&o).contains("1 patch(es) restored"),
        "{}",
        stdout(&o)
    );
    assert_eq!(t.read(b.bump.0, orig.len()), orig, "original bytes back");
    settle();
    // Undo again: nothing active is left (a retired cache may still be collected).
    let o = laser(&repair_args(&t, &["--undo"]));
    assert_eq!(o.status.code(), Some(0));
    assert!(
        !stdout(&o).contains("1 patch(es) restored"),
        "{}",
        stdout(&o)
    );
    let fin = t.finish();
    eprintln!("target: {fin}");
}

#[test]
fn dry_run_prints_the_plan_and_touches_nothing() {
    let _g = serial();
    let b = bin();
    let t = Target::spawn(b);
    let orig = t.read(b.bump.0, (b.bump.1 - b.bump.0) as usize);
    let maps = t.anon_exec();
    let pc = format!("{:#x}", t.bias + b.store);
    let o = laser(&repair_args(&t, &["--pc", &pc, "--dry-run"]));
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    for want in [
        "region:",
        "stores per flush",
        "entry patch at",
        "dry run",
        "SSB mode",
    ] {
        assert!(out.contains(want), "{want:?} missing: {out}");
    }
    assert_eq!(t.read(b.bump.0, orig.len()), orig);
    assert_eq!(t.anon_exec(), maps, "no code cache mapped");
    assert!(t.free_running());
    t.finish();
}

#[test]
fn avx_store_is_refused_with_a_reason_and_the_process_is_untouched() {
    let _g = serial();
    let b = bin();
    let t = Target::spawn(b);
    let avx = t.read(b.avx_store - 2, 24);
    let bump = t.read(b.bump.0, (b.bump.1 - b.bump.0) as usize);
    let maps = t.anon_exec();
    let pc = format!("{:#x}", t.bias + b.avx_store);
    let o = laser(&repair_args(&t, &["--pc", &pc]));
    assert_eq!(o.status.code(), Some(4), "REPAIR_REFUSED");
    let out = stdout(&o);
    assert!(out.contains("refused"), "{out}");
    assert!(
        out.contains("vmovdqu"),
        "the reason names the instruction: {out}"
    );
    assert_eq!(t.read(b.avx_store - 2, 24), avx);
    assert_eq!(t.read(b.bump.0, bump.len()), bump);
    assert_eq!(t.anon_exec(), maps);
    assert!(t.free_running());
    t.finish();
}

#[test]
fn a_second_repair_of_the_same_function_is_refused() {
    let _g = serial();
    let b = bin();
    let t = Target::spawn(b);
    let pc = format!("{:#x}", t.bias + b.store);
    assert_eq!(
        laser(&repair_args(&t, &["--pc", &pc])).status.code(),
        Some(0)
    );
    let o = laser(&repair_args(&t, &["--pc", &pc]));
    assert_eq!(o.status.code(), Some(4));
    assert!(stdout(&o).contains("already repaired"), "{}", stdout(&o));
    assert_eq!(laser(&repair_args(&t, &["--undo"])).status.code(), Some(0));
    t.finish();
}

#[test]
fn bad_pid_is_a_clear_error() {
    let o = laser(&[
        "repair".into(),
        "-p".into(),
        "999999999".into(),
        "--undo".into(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("process 999999999 does not exist"), "{err}");
    let o = laser(&["repair".into(), "-p".into(), "1".into()]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "--pc, --from or --undo is required"
    );
}

/// A report as `laser run --json` writes it (module + ELF vaddr per source): the
/// false-sharing finding is repaired at this process's load address, the true-sharing one
/// skipped with the reason.
#[test]
fn from_report_resolves_module_offsets_in_this_process() {
    let _g = serial();
    let b = bin();
    let t = Target::spawn(b);
    let module = b.path.to_str().unwrap();
    let source = |off: u64| {
        serde_json::json!({
            "pc": "0x1", "module": module, "offset": format!("{off:#x}"), "function": "bump",
            "op": "store", "offsets": [0], "events": 10, "threads": [1]
        })
    };
    let finding = |kind: &str, off: u64| {
        serde_json::json!({
            "kind": kind, "line_addr": "0x1000", "rate_per_s": 5000.0, "events": 100,
            "share": 0.5, "threads": [1, 2], "fix": "pad",
            "data": {"kind": "global", "name": "counters"},
            "sources": [source(off)]
        })
    };
    let report = serde_json::json!({
        "schema": "laser-report/1", "backend": "soft", "duration_s": 1.0, "samples": 10,
        "lost": 0, "line_size": 64, "threshold": 1000.0,
        "findings": [finding("true_sharing", b.avx_store), finding("false_sharing", b.store)]
    });
    let path = b.path.with_file_name(format!("report-{}.json", t.pid));
    std::fs::write(&path, report.to_string()).unwrap();
    let orig = t.read(b.bump.0, (b.bump.1 - b.bump.0) as usize);
    let o = laser(&repair_args(&t, &["--from", path.to_str().unwrap()]));
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("false sharing only"), "{out}");
    assert!(
        out.contains("repair bump ["),
        "function named from the report: {out}"
    );
    assert!(out.contains(&format!("{:#x}", t.bias + b.store)), "{out}");
    assert!(out.contains("applied: cache"), "{out}");
    assert_ne!(t.read(b.bump.0, orig.len()), orig);
    settle();
    assert_eq!(laser(&repair_args(&t, &["--undo"])).status.code(), Some(0));
    assert_eq!(t.read(b.bump.0, orig.len()), orig);
    t.finish();
}

/// With gcc's default `-fipa-ra`, `worker` keeps `k` in a caller-saved register across
/// `call bump`. A planner that took caller-saved registers as dead at `ret` would clobber it
/// and the worker would fault (it did, before the planner kept every register live there).
#[test]
fn repair_of_ipa_ra_code_keeps_the_caller_alive() {
    let _g = serial();
    let b = build("fs-ipa-ra", &[]);
    let t = Target::spawn(&b);
    let pc = format!("{:#x}", t.bias + b.store);
    assert_eq!(
        laser(&repair_args(&t, &["--pc", &pc])).status.code(),
        Some(0)
    );
    settle();
    assert_eq!(laser(&repair_args(&t, &["--undo"])).status.code(), Some(0));
    t.finish();
}

/// An error in the ptrace half (here: another tracer already holds the process, so seizing
/// fails with EPERM) leaves the target as it was: same bytes, no cache, not stopped.
#[test]
fn a_tracee_failure_leaves_the_process_untouched() {
    let _g = serial();
    let b = bin();
    let t = Target::spawn(b);
    let orig = t.read(b.bump.0, (b.bump.1 - b.bump.0) as usize);
    let maps = t.anon_exec();
    let pid = t.pid;
    // SAFETY: plain ptrace requests on our own child; no memory is passed.
    let r = unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, 0, 0) };
    assert_eq!(r, 0, "seize: {}", std::io::Error::last_os_error());
    let pc = format!("{:#x}", t.bias + b.store);
    let o = laser(&repair_args(&t, &["--pc", &pc]));
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cannot ptrace"), "{err}");
    assert_eq!(t.read(b.bump.0, orig.len()), orig);
    assert_eq!(t.anon_exec(), maps);
    // Let go of it again (a seized thread must be in a stop to detach).
    // SAFETY: as above; `st` is a valid out-pointer for waitpid.
    unsafe {
        assert_eq!(libc::ptrace(libc::PTRACE_INTERRUPT, pid, 0, 0), 0);
        let mut st = 0;
        assert_eq!(libc::waitpid(pid, &mut st, libc::__WALL), pid);
        assert_eq!(libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0), 0);
    }
    assert!(t.free_running());
    t.finish();
}

/// Repair, undo, repair again on one live process: every cycle keeps the counts right.
#[test]
fn repeated_repair_and_undo_on_one_process() {
    let _g = serial();
    let b = bin();
    let t = Target::spawn(b);
    let orig = t.read(b.bump.0, (b.bump.1 - b.bump.0) as usize);
    let pc = format!("{:#x}", t.bias + b.store);
    for i in 0..5 {
        let o = laser(&repair_args(&t, &["--pc", &pc]));
        assert_eq!(o.status.code(), Some(0), "cycle {i}");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(laser(&repair_args(&t, &["--undo"])).status.code(), Some(0));
        assert_eq!(t.read(b.bump.0, orig.len()), orig, "cycle {i}");
    }
    t.finish();
}

/// The whole loop: `laser run --json` on the program finds the false sharing in `bump`, and
/// `laser repair --from` that report repairs a second run of it (other load address).
#[test]
fn laser_run_report_then_repair_from_it() {
    let _g = serial();
    let b = bin();
    let json = b.path.with_file_name("run-report.json");
    // Sampling on a loaded 2-core machine: threads that are not running at once do not
    // contend, so a run may see nothing; three tries.
    let mut found = false;
    for _ in 0..3 {
        let mut run = Command::new(LASER)
            .args(["run", "--threshold", "1", "-q", "--json"])
            .arg(&json)
            .arg("--")
            .arg(&b.path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_secs(2));
        writeln!(run.stdin.as_mut().unwrap(), "stop").unwrap();
        let o = run.wait_with_output().unwrap();
        assert!(o.status.success(), "laser run: {o:?}");
        let report = std::fs::read_to_string(&json).unwrap();
        if report.contains("\"false_sharing\"") {
            found = true;
            break;
        }
        eprintln!("no false sharing seen this run: {report}");
    }
    assert!(found, "laser run never reported the false sharing in bump");
    let t = Target::spawn(b);
    let orig = t.read(b.bump.0, (b.bump.1 - b.bump.0) as usize);
    let o = laser(&repair_args(&t, &["--from", json.to_str().unwrap()]));
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("repair bump ["), "{out}");
    assert_ne!(t.read(b.bump.0, orig.len()), orig);
    settle();
    assert_eq!(laser(&repair_args(&t, &["--undo"])).status.code(), Some(0));
    t.finish();
}

#[test]
fn a_report_of_another_program_is_an_error() {
    let _g = serial();
    let b = bin();
    let t = Target::spawn(b);
    let report = serde_json::json!({
        "schema": "laser-report/1", "backend": "soft", "duration_s": 1.0, "samples": 10,
        "lost": 0, "line_size": 64, "threshold": 1000.0,
        "findings": [{
            "kind": "false_sharing", "line_addr": "0x1000", "rate_per_s": 5000.0, "events": 100,
            "share": 0.5, "threads": [1, 2], "fix": "pad",
            "data": {"kind": "global", "name": "x"},
            "sources": [{"pc": "0x1", "module": "/nonexistent/other-program", "offset": "0x1139",
                         "op": "store", "offsets": [0], "events": 10}]
        }]
    });
    let path = b.path.with_file_name(format!("other-{}.json", t.pid));
    std::fs::write(&path, report.to_string()).unwrap();
    let o = laser(&repair_args(&t, &["--from", path.to_str().unwrap()]));
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("none of the report's 1 false-sharing source"),
        "{err}"
    );
    assert!(t.free_running());
    t.finish();
}
