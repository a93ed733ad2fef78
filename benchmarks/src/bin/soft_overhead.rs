//! Sampling overhead of laser's soft backend: wall time of a workload bare and under
//! cpu-clock sampling, interleaved (bare, sampled, bare, sampled, …) so machine noise hits
//! both alike; prints the median of the per-pair ratios for each frequency (`median_ratio`:
//! wall time, the goal metric; `cpu_ratio`: the target's user+sys CPU time).
//!
//! ```text
//! cargo run --release -p laser-benchmarks --bin soft_overhead -- \
//!     [--freq 1000,2000,4000] [--runs 7] [--work-ms 400] [-- CMD ARGS…]
//! ```
//!
//! Without a command, the workload is built in: this binary re-executed with `--workload N`
//! runs two threads that each do N fixed iterations of integer work on their own cache line
//! (CPU-bound, no sharing), so the wall time measures only what sampling adds. `--work-ms`
//! calibrates N to about that many milliseconds bare. `--freq 0` measures observation
//! without sampling (events, ring buffers and side-band records only): the floor.

use std::ffi::OsString;
use std::hint::black_box;
use std::process::Command;
use std::time::{Duration, Instant};

use laser_driver::{Config, Session, Status};

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

fn run_sampled(cmd: &[OsString], freq: u64) -> (Duration, u64, u64) {
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
    let mut samples = 0u64;
    loop {
        match s.poll(Duration::from_millis(100), &mut |e| {
            samples += matches!(e, laser_driver::Event::Sample(_)) as u64
        }) {
            Ok(Status::Running) => {}
            Ok(Status::Exited(_)) => break,
            Err(e) => {
                eprintln!("poll failed: {e}");
                std::process::exit(2);
            }
        }
    }
    (t.elapsed(), samples, s.stats().lost)
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
    }
    println!(
        "{:>8} {:>5} {:>9} {:>11} {:>12} {:>10} {:>9} {:>5} {:>10}",
        "freq_hz",
        "runs",
        "bare_ms",
        "sampled_ms",
        "median_ratio",
        "cpu_ratio",
        "samples",
        "lost",
        "us/sample"
    );
    for &freq in &freqs {
        let (mut bare, mut sampled, mut ratios) = (vec![], vec![], vec![]);
        let mut cpu_ratios = vec![];
        let mut per_sample_us = vec![];
        let (mut nsamples, mut lost) = (vec![], 0);
        for _ in 0..runs {
            let c0 = children_cpu();
            let b = run_bare(&cmd);
            let c1 = children_cpu();
            let (s, n, l) = run_sampled(&cmd, freq);
            let c2 = children_cpu();
            cpu_ratios.push((c2 - c1).as_secs_f64() / (c1 - c0).as_secs_f64().max(1e-9));
            if n > 0 {
                // Extra target CPU per sample: the per-sample cost on this machine.
                let extra = (c2 - c1).as_secs_f64() - (c1 - c0).as_secs_f64();
                per_sample_us.push(extra / n as f64 * 1e6);
            }
            bare.push(b.as_secs_f64() * 1e3);
            sampled.push(s.as_secs_f64() * 1e3);
            ratios.push(s.as_secs_f64() / b.as_secs_f64());
            nsamples.push(n as f64);
            lost += l;
        }
        println!(
            "{:>8} {:>5} {:>9.1} {:>11.1} {:>12.4} {:>10.4} {:>9.0} {:>5} {:>10.1}",
            freq,
            runs,
            median(&mut bare),
            median(&mut sampled),
            median(&mut ratios),
            median(&mut cpu_ratios),
            median(&mut nsamples),
            lost,
            median(&mut per_sample_us)
        );
    }
}
