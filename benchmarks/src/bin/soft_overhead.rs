//! Sampling overhead of laser's soft backend: wall time of a workload bare and under
//! cpu-clock sampling, interleaved (bare, sampled, bare, sampled, …) so machine noise hits
//! both alike; prints the median of the per-pair ratios for each frequency (`median_ratio`:
//! wall time, the goal metric; `cpu_ratio`: the target's user+sys CPU time).
//!
//! ```text
//! cargo run --release -p laser-benchmarks --bin soft_overhead -- \
//!     [--freq 1000,2000,4000] [--runs 7] [--work-ms 400] [--watch-hot] [-- CMD ARGS…]
//! ```
//!
//! Without a command, the workload is built in: this binary re-executed with `--workload N`
//! runs two threads that each do N fixed iterations of integer work on their own cache line
//! (CPU-bound, no sharing), so the wall time measures only what sampling adds. `--work-ms`
//! calibrates N to about that many milliseconds bare. `--freq 0` measures observation
//! without sampling (events, ring buffers and side-band records only): the floor.
//!
//! `--watch-hot` adds, per frequency, a third run of each repetition: sampled *and* with
//! hardware watchpoints armed on the two words the built-in workload's threads store to on
//! every iteration, under the driver's default duty cycle (what `laser run` uses). That is
//! the worst case for traps: the duty cycle runs at its budget the whole time. Its row
//! (`FREQ+hot`) gives the measured cost next to the budget the duty cycle believes it kept
//! (`trap_share` = hits × calibrated hit cost / target CPU): if the measured CPU ratio of
//! `+hot` over the sampled run exceeds 1 + trap_share by much, the calibrated hit cost
//! under-states what a trap really costs the target.

use std::ffi::OsString;
use std::hint::black_box;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use laser_driver::{Config, Session, Status, WatchKind, WatchSpec};

/// One word per thread, a line apart (no sharing): stored to on every iteration, so a
/// watchpoint on it traps as often as the duty cycle lets it (`--watch-hot`).
#[repr(C, align(128))]
struct Words([AtomicU64; 16]);
static WORDS: Words = Words([const { AtomicU64::new(0) }; 16]);

fn word(t: usize) -> &'static AtomicU64 {
    &WORDS.0[t * 8]
}

fn workload(iters: u64) {
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            std::thread::spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t;
                for _ in 0..iters {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x = black_box(x);
                    // ATOMICS: Relaxed: a plain store, only there to be watched.
                    word(t as usize).store(x, Ordering::Relaxed);
                }
                x
            })
        })
        .collect();
    let mut acc = 0;
    for t in threads {
        acc ^= t.join().unwrap_or(0);
    }
    black_box(acc);
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// CPU time (user + sys) of all reaped children so far. Both runners reap their child, so
/// the delta around one run is that run's CPU time: less sensitive than wall time to other
/// load on a shared machine, though it misses the reader's own work in laser.
fn children_cpu() -> Duration {
    // SAFETY: getrusage writes one rusage struct into a zeroed local.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn run_bare(cmd: &[OsString]) -> Duration {
    let t = Instant::now();
    let st = Command::new(&cmd[0]).args(&cmd[1..]).status();
    let d = t.elapsed();
    if !st.as_ref().is_ok_and(|s| s.success()) {
        eprintln!("workload failed: {st:?}");
        std::process::exit(2);
    }
    d
}

/// The load address of this executable's first mapping in `maps` (`/proc/PID/maps` text).
fn exe_base(maps: &str, exe: &str) -> Option<u64> {
    maps.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let range = f.next()?;
        let offset = f.nth(1)?;
        let path = f.nth(2)?;
        (path == exe && u64::from_str_radix(offset, 16).ok()? == 0)
            .then(|| u64::from_str_radix(range.split('-').next()?, 16).ok())
            .flatten()
    })
}

/// The two words' addresses in the child (same executable, another ASLR base).
fn child_words(pid: i32) -> Option<[u64; 2]> {
    let exe = std::env::current_exe().ok()?;
    let exe = exe.to_str()?;
    let own = exe_base(&std::fs::read_to_string("/proc/self/maps").ok()?, exe)?;
    let child = exe_base(
        &std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?,
        exe,
    )?;
    let at = |t: usize| word(t) as *const AtomicU64 as u64 - own + child;
    Some([at(0), at(1)])
}

struct Sampled {
    wall: Duration,
    samples: u64,
    lost: u64,
    /// With `--watch-hot`: (hits, hits × calibrated hit cost / target CPU).
    traps: Option<(u64, f64)>,
}

fn run_sampled(cmd: &[OsString], freq: u64, watch_hot: bool) -> Sampled {
    // freq 0: observation without sampling (counting cpu-clock leader with tracking records,
    // the watch backend never armed): the floor that is not due to samples.
    let cfg = if freq == 0 {
        Config {
            backend: laser_driver::BackendKind::Watch,
            ..Config::default()
        }
    } else {
        Config {
            frequency: freq,
            watch: watch_hot,
            ..Config::default()
        }
    };
    let t = Instant::now();
    let mut s = match Session::launch(cmd, &cfg) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("launch under the soft backend failed: {e}");
            std::process::exit(2);
        }
    };
    if watch_hot {
        let Some(words) = child_words(s.pid()) else {
            eprintln!("--watch-hot: cannot find the workload's words in the child");
            std::process::exit(2);
        };
        let specs: Vec<WatchSpec> = words
            .iter()
            .map(|&addr| WatchSpec {
                addr,
                len: 8,
                kind: WatchKind::Write,
            })
            .collect();
        if let Err(e) = s.watch_mut().and_then(|w| w.arm(&specs)) {
            eprintln!("--watch-hot: arming failed: {e}");
            std::process::exit(2);
        }
    }
    let mut samples = 0u64;
    loop {
        match s.poll(Duration::from_millis(50), &mut |e| {
            samples +=
                matches!(e, laser_driver::Event::Sample(ref x) if x.watch_slot.is_none()) as u64
        }) {
            Ok(Status::Running) => {}
            Ok(Status::Exited(_)) => break,
            Err(e) => {
                eprintln!("poll failed: {e}");
                std::process::exit(2);
            }
        }
    }
    let traps = s.watch_mut().ok().filter(|_| watch_hot).map(|w| {
        let (st, duty) = (w.stats(), w.duty_cycle());
        let share =
            duty.hit_cost.as_secs_f64() * st.hits as f64 / st.target_cpu.as_secs_f64().max(1e-9);
        (st.hits, share)
    });
    Sampled {
        wall: t.elapsed(),
        samples,
        lost: s.stats().lost,
        traps,
    }
}

fn main() {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if args.first().is_some_and(|a| a == "--workload") {
        let n = args
            .get(1)
            .and_then(|a| a.to_str()?.parse().ok())
            .unwrap_or(100_000_000);
        workload(n);
        return;
    }
    let mut freqs = vec![laser_driver::DEFAULT_SOFT_FREQ];
    let mut runs = 7usize;
    let mut work_ms = 400u64;
    let mut cmd: Vec<OsString> = Vec::new();
    let mut watch_hot = false;
    let mut i = 0;
    while i < args.len() {
        let a = args[i].to_string_lossy().into_owned();
        let val = || args.get(i + 1).map(|v| v.to_string_lossy().into_owned());
        match a.as_str() {
            "--freq" => {
                freqs = val()
                    .unwrap_or_default()
                    .split(',')
                    .filter_map(|f| f.trim().parse().ok())
                    .collect();
                i += 1;
            }
            "--runs" => {
                runs = val().and_then(|v| v.parse().ok()).unwrap_or(runs);
                i += 1;
            }
            "--work-ms" => {
                work_ms = val().and_then(|v| v.parse().ok()).unwrap_or(work_ms);
                i += 1;
            }
            "--watch-hot" => watch_hot = true,
            "--" => {
                cmd = args[i + 1..].to_vec();
                break;
            }
            other => {
                eprintln!("unknown argument {other}");
                std::process::exit(2);
            }
        }
        i += 1;
    }
    if cmd.is_empty() {
        // Calibrate: time 10 M iterations in-process, scale to work_ms.
        let t = Instant::now();
        workload(10_000_000);
        let per_iter = t.elapsed().as_secs_f64() / 10_000_000.0;
        let n = ((work_ms as f64 / 1000.0) / per_iter.max(1e-12)) as u64;
        let exe = std::env::current_exe().expect("own path");
        cmd = vec![exe.into(), "--workload".into(), n.to_string().into()];
        println!("built-in workload: 2 threads × {n} iterations (~{work_ms} ms bare)");
    } else if watch_hot {
        eprintln!("--watch-hot needs the built-in workload (no command)");
        std::process::exit(2);
    }
    println!(
        "{:>8} {:>5} {:>9} {:>11} {:>12} {:>10} {:>9} {:>5} {:>10} {:>8} {:>10}",
        "freq_hz",
        "runs",
        "bare_ms",
        "sampled_ms",
        "median_ratio",
        "cpu_ratio",
        "samples",
        "lost",
        "us/sample",
        "hits",
        "trap_share"
    );
    for &freq in &freqs {
        let mut rows = vec![Row::default()];
        if watch_hot && freq > 0 {
            rows.push(Row::default());
        }
        for r in 0..runs {
            // Bare first on even repetitions, last on odd ones: drift hits both alike.
            let mut bare = None;
            if r % 2 == 0 {
                bare = Some(timed(|| run_bare(&cmd)));
            }
            let measured: Vec<(Sampled, Duration)> = (0..rows.len())
                .map(|k| timed(|| run_sampled(&cmd, freq, k == 1)))
                .collect();
            let (b, bcpu) = bare.unwrap_or_else(|| timed(|| run_bare(&cmd)));
            for (row, (s, cpu)) in rows.iter_mut().zip(measured) {
                row.add(b, bcpu, &s, cpu);
            }
        }
        for (k, row) in rows.iter_mut().enumerate() {
            let label = if k == 1 {
                format!("{freq}+hot")
            } else {
                freq.to_string()
            };
            row.print(&label, runs);
        }
    }
}

/// `f`'s result and the CPU time of the children it reaped.
fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let c0 = children_cpu();
    let v = f();
    (v, children_cpu().saturating_sub(c0))
}

/// One variant's measurements over the repetitions, each paired with that repetition's
/// bare run.
#[derive(Default)]
struct Row {
    bare_ms: Vec<f64>,
    sampled_ms: Vec<f64>,
    ratios: Vec<f64>,
    cpu_ratios: Vec<f64>,
    per_sample_us: Vec<f64>,
    samples: Vec<f64>,
    lost: u64,
    hits: Vec<f64>,
    trap_share: Vec<f64>,
}

impl Row {
    fn add(&mut self, bare: Duration, bare_cpu: Duration, s: &Sampled, cpu: Duration) {
        self.cpu_ratios
            .push(cpu.as_secs_f64() / bare_cpu.as_secs_f64().max(1e-9));
        if s.samples > 0 && s.traps.is_none() {
            // Extra target CPU per sample: the per-sample cost on this machine.
            let extra = cpu.as_secs_f64() - bare_cpu.as_secs_f64();
            self.per_sample_us.push(extra / s.samples as f64 * 1e6);
        }
        self.bare_ms.push(bare.as_secs_f64() * 1e3);
        self.sampled_ms.push(s.wall.as_secs_f64() * 1e3);
        self.ratios.push(s.wall.as_secs_f64() / bare.as_secs_f64());
        self.samples.push(s.samples as f64);
        self.lost += s.lost;
        if let Some((hits, share)) = s.traps {
            self.hits.push(hits as f64);
            self.trap_share.push(share);
        }
    }

    fn print(&mut self, label: &str, runs: usize) {
        let opt = |v: &mut Vec<f64>, prec: usize| {
            if v.is_empty() {
                "-".to_string()
            } else {
                format!("{:.*}", prec, median(v))
            }
        };
        println!(
            "{:>8} {:>5} {:>9.1} {:>11.1} {:>12.4} {:>10.4} {:>9.0} {:>5} {:>10} {:>8} {:>10}",
            label,
            runs,
            median(&mut self.bare_ms),
            median(&mut self.sampled_ms),
            median(&mut self.ratios),
            median(&mut self.cpu_ratios),
            median(&mut self.samples),
            self.lost,
            opt(&mut self.per_sample_us, 1),
            opt(&mut self.hits, 0),
            opt(&mut self.trap_share, 4),
        );
    }
}
