//! Shared by the tests that repair a live process: `fs.c` (two threads bump neighbouring
//! longs of one line in `bump`, counting rounds, so the program itself proves no increment was
//! lost: `ok 1`), built here with gcc, and a handle on one running copy of it.
//!
//! `fs 3` exits with status 3 after `stop` (exit-status pass-through). `-DPAD` builds the
//! twin with each counter on its own line: no false sharing at all. `-DLREG` runs the
//! linear-regression loop `lreg` instead of bump (5 falsely shared stores per point).
#![allow(dead_code)] // each test binary uses a different part

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

pub const LASER: &str = env!("CARGO_BIN_EXE_laser");

pub const FS_C: &str = r#"#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define CHUNK 100000L
#ifdef PAD
struct pair { long a __attribute__((aligned(64))); long b __attribute__((aligned(64))); };
#else
struct pair { long a; long b; } __attribute__((aligned(64)));
#endif
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
/* Never called: a histogram-style loop whose store address changes every iteration. */
__asm__(".text\n.globl vary_loop\n.type vary_loop,@function\nvary_loop:\n"
        "  xor %eax,%eax\n1:\n.globl vary_store\nvary_store:\n  addq $1,(%rdi,%rax,8)\n"
        "  add $1,%rax\n  and $7,%rax\n  sub $1,%rsi\n  jnz 1b\n  ret\n.size vary_loop,.-vary_loop\n");
#ifdef LREG
/* -DLREG: Phoenix linear_regression's loop instead of bump. Each thread's five sums sit next
   to the other's on one line; the loop stores 5 times per point (a repair that pays). */
struct sums { volatile long long sx, sxx, sy, syy, sxy; };
static struct sums lsums[2] __attribute__((aligned(64)));
static unsigned char xs[CHUNK], ys[CHUNK];
__attribute__((noinline)) void lreg(struct sums *s, long n) {
    for (long i = 0; i < n; i++) {
        s->sx += xs[i]; s->sxx += xs[i] * xs[i]; s->sy += ys[i];
        s->syy += ys[i] * ys[i]; s->sxy += xs[i] * ys[i];
    }
}
#endif
static void *worker(void *arg) {
    long k = (long)arg;
    volatile long *p = k ? &counters.b : &counters.a;
    long r = 0; /* local: the only shared writes are bump's */
#ifdef LREG
    (void)p;
    while (!stop) { lreg(&lsums[k], CHUNK); r++; }
#else
    while (!stop) { bump(p, CHUNK); r++; }
#endif
    rounds[k] = r;
    return 0;
}
int main(int argc, char **argv) {
    pthread_t t[2];
#ifdef LREG
    for (long i = 0; i < CHUNK; i++) { xs[i] = i & 0x7f; ys[i] = (i * 7) & 0x7f; }
#endif
    for (long k = 0; k < 2; k++) pthread_create(&t[k], 0, worker, (void *)k);
    printf("pid %d\n", getpid()); fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin) && strncmp(line, "stop", 4) != 0) {}
    stop = 1;
    for (int k = 0; k < 2; k++) pthread_join(t[k], 0);
#ifdef LREG
    long long want[5] = {0, 0, 0, 0, 0};
    for (long i = 0; i < CHUNK; i++) {
        want[0] += xs[i]; want[1] += xs[i] * xs[i]; want[2] += ys[i];
        want[3] += ys[i] * ys[i]; want[4] += xs[i] * ys[i];
    }
    int good = 1;
    for (int k = 0; k < 2; k++) {
        struct sums *s = &lsums[k];
        long long got[5] = {s->sx, s->sxx, s->sy, s->syy, s->sxy};
        for (int f = 0; f < 5; f++) good &= got[f] == want[f] * rounds[k];
    }
    printf("a %lld ra %ld b %lld rb %ld ok %d\n", lsums[0].sx, rounds[0], lsums[1].sx, rounds[1], good);
#else
    printf("a %ld ra %ld b %ld rb %ld ok %d\n", counters.a, rounds[0], counters.b, rounds[1],
           counters.a == rounds[0] * CHUNK && counters.b == rounds[1] * CHUNK);
#endif
    return argc > 1 ? atoi(argv[1]) : 0;
}
"#;

/// One live target at a time: two busy programs on 2 cores would only slow each other down.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

pub struct Bin {
    pub path: PathBuf,
    /// ELF vaddrs.
    pub bump: (u64, u64),
    pub store: u64,
    pub avx_store: u64,
    pub vary_store: u64,
}

pub fn build(name: &str, extra: &[&str]) -> Bin {
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
        vary_store: sym("vary_store").0,
    }
}

/// ELF vaddrs of the explicit stores in function `func` of `b` (objdump).
pub fn stores_in(b: &Bin, func: &str) -> Vec<u64> {
    let dis = run_text(
        Command::new("objdump")
            .args(["-d", "--no-show-raw-insn"])
            .arg(&b.path),
    );
    let mut inside = false;
    let mut out = Vec::new();
    for l in dis.lines() {
        if l.ends_with(">:") {
            inside = l.contains(&format!("<{func}>:"));
            continue;
        }
        let Some((a, rest)) = l.trim().split_once(':') else {
            continue;
        };
        if inside && rest.contains("\tmov") && rest.trim_end().ends_with(')') {
            if let Ok(a) = u64::from_str_radix(a, 16) {
                out.push(a);
            }
        }
    }
    out
}

pub fn bin() -> &'static Bin {
    static B: OnceLock<Bin> = OnceLock::new();
    B.get_or_init(|| build("fs", &[]))
}

pub fn run_text(c: &mut Command) -> String {
    let o = c.output().expect("tool runs");
    assert!(o.status.success(), "{c:?} failed");
    String::from_utf8(o.stdout).unwrap()
}

pub struct Target {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    pub pid: i32,
    pub bias: u64,
}

impl Target {
    pub fn spawn(b: &Bin) -> Target {
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

    pub fn read(&self, vaddr: u64, len: usize) -> Vec<u8> {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::open(format!("/proc/{}/mem", self.pid)).unwrap();
        let mut b = vec![0; len];
        f.read_exact_at(&mut b, self.bias + vaddr).unwrap();
        b
    }

    pub fn anon_exec(&self) -> usize {
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
    pub fn free_running(&self) -> bool {
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
    pub fn finish(mut self) -> String {
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

pub fn laser(args: &[String]) -> Output {
    let o = Command::new(LASER).args(args).output().unwrap();
    eprintln!(
        "$ laser {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// `laser repair -p PID --no-trial EXTRA…`: the tests that check the repaired code itself
/// keep it whatever its speed (on this VM fs.c's repair measures slower than native).
pub fn repair_args(t: &Target, extra: &[&str]) -> Vec<String> {
    let mut v = vec!["repair".into(), "-p".into(), t.pid.to_string()];
    v.push("--no-trial".into());
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// `laser repair -p PID EXTRA…` with the trial (without its budget).
pub fn repair_args_trial(t: &Target, extra: &[&str]) -> Vec<String> {
    // No budget: a test target is under a second old, and the default budget (1.5% of the
    // process's age) would refuse every trial; these tests are about the trial's verdicts.
    let mut v = vec![
        "repair".into(),
        "-p".into(),
        t.pid.to_string(),
        "--trial-budget".into(),
        "0".into(),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

pub fn settle() {
    std::thread::sleep(Duration::from_millis(300));
}
