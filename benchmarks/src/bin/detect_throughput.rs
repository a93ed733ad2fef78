//! Detector throughput and memory on a synthetic soft-sample stream.
//!
//! ```text
//! cargo run --release -p laser-benchmarks --bin detect_throughput -- [SAMPLES] [LINES] [MODE]
//! ```
//! SAMPLES (default 20,000,000) samples from 4 threads at the PCs of a counter loop; 1 in 8
//! hits one falsely shared line (threads on different words), the rest spread over LINES
//! (default 1,000,000) distinct heap lines: in MODE `private` (default, the common case) each
//! thread has its own quarter of them; in MODE `random` (adversarial) every thread touches
//! all of them, so nearly every line is contended and the bounds on memory are exercised. Each sample is built in place in one reusable
//! `Event` (no allocation), so the generator costs the same in the baseline pass, which does
//! everything but `feed`. Prints both passes side by side, their ratio, the detector's
//! samples/s, and peak RSS (VmHWM) before and after, with the lines tracked.

use std::time::Instant;

use laser_detect::{Config, Detector, MemoryCode};
use laser_driver::{Event, Reg, Sample, UserRegs};

const CODE: u64 = 0x40_1000;
const HEAP: u64 = 0x1000_0000;
const HEAP_LEN: u64 = 0x1000_0000;

/// ```text
/// 401000: 48 8b 31      mov rsi,[rcx]
/// 401003: 48 83 c6 01   add rsi,1
/// 401007: 48 89 31      mov [rcx],rsi
/// 40100a: 48 ff c8      dec rax
/// 40100d: 75 f1         jne 401000
/// 40100f: c3            ret
/// ```
const LOOP: [u8; 16] = [
    0x48, 0x8b, 0x31, 0x48, 0x83, 0xc6, 0x01, 0x48, 0x89, 0x31, 0x48, 0xff, 0xc8, 0x75, 0xf1, 0xc3,
];
const PCS: [u64; 5] = [CODE, CODE + 3, CODE + 7, CODE + 0xa, CODE + 0xd];

/// Nanoseconds this thread has run on a CPU (`/proc/thread-self/schedstat`, first field): on a
/// loaded machine wall time counts time spent waiting for a CPU, this does not.
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Rewrite `e` into sample number `i` of the stream.
#[inline]
fn make(e: &mut Event, i: u64, rng: &mut u64, lines: u64, private: bool) {
    let Event::Sample(s) = e else { unreachable!() };
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    let tid = 1 + (i & 3) as u32;
    s.tid = tid;
    s.time = 1_000_000_000 + i * 25_000;
    s.ip = PCS[(i % 5) as usize];
    let addr = if (i >> 2) & 7 == 0 {
        HEAP + 8 * (tid as u64 & 1) // the contended line, one word per thread parity
    } else if private {
        let quarter = (lines / 4).max(1);
        HEAP + 64 + ((tid as u64 - 1) * quarter + *rng % quarter) * 64 + (*rng >> 40) % 8 * 8
    } else {
        HEAP + 64 + (*rng % lines) * 64 + (*rng >> 40) % 8 * 8
    };
    let r = s.regs.as_mut().unwrap();
    r.values[Reg::Cx as usize] = addr;
    r.values[Reg::Ip as usize] = s.ip;
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000_000);
    let lines: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000)
        .clamp(4, HEAP_LEN / 64 - 2);
    let mode = args.next().unwrap_or_else(|| "private".to_string());
    let private = mode != "random";

    let mut regs = UserRegs::default();
    for r in [Reg::Ax, Reg::Cx, Reg::Si, Reg::Ip] {
        regs.set(r, 1);
    }
    regs.set(Reg::Sp, 0x7ffd_0000_8000);
    let mut ev = Event::Sample(Sample::soft(1, 1, 0, 0, CODE, regs));

    // Baseline: generate every sample, touch it, do not analyse it.
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut sink = 0u64;
    let c0 = cpu_ns();
    let t0 = Instant::now();
    for i in 0..n {
        make(&mut ev, i, &mut rng, lines, private);
        if let Event::Sample(s) = &ev {
            sink = sink.wrapping_add(s.regs.as_ref().unwrap().values[Reg::Cx as usize] ^ s.ip);
        }
        std::hint::black_box(&ev);
    }
    let base = t0.elapsed().as_secs_f64();
    let base_cpu = (cpu_ns() - c0) as f64 * 1e-9;
    std::hint::black_box(sink);
    let rss_before = peak_rss_kib();

    let mut code = MemoryCode::new();
    code.add_function(CODE, LOOP.to_vec());
    let mut d = Detector::new(Config::default(), code);
    d.add_maps(
        1,
        &format!(
            "{:x}-{:x} r-xp 00001000 08:01 1 /bench\n{:x}-{:x} rw-p 00000000 00:00 0 [heap]\n\
             7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]\n",
            CODE,
            CODE + 0x1000,
            HEAP,
            HEAP + HEAP_LEN
        ),
    );
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let c1 = cpu_ns();
    let t1 = Instant::now();
    for i in 0..n {
        make(&mut ev, i, &mut rng, lines, private);
        d.feed(&ev);
    }
    let det = t1.elapsed().as_secs_f64();
    let det_cpu = (cpu_ns() - c1) as f64 * 1e-9;
    let a = d.finish();
    let rss_after = peak_rss_kib();

    let fs = d.filter_stats();
    if std::env::var_os("DT_DEBUG").is_some() {
        eprintln!("{:#?}", a);
    }
    println!(
        "samples                 {n} (mode {})",
        if private { "private" } else { "random" }
    );
    println!(
        "distinct data lines     {lines} (remembered {}, evicted {})",
        d.lines_tracked(),
        d.line_evictions()
    );
    println!(
        "baseline (generate)     {:.3} s  {:.1} ns/sample",
        base,
        base * 1e9 / n as f64
    );
    println!(
        "detector (generate+feed){:.3} s  {:.1} ns/sample",
        det,
        det * 1e9 / n as f64
    );
    println!("ratio detector/baseline {:.2}", det / base.max(1e-9));
    println!(
        "detector throughput     {:.2} M samples/s (generator included)",
        n as f64 / det / 1e6
    );
    println!(
        "detector alone          {:.2} M samples/s (baseline subtracted)",
        n as f64 / (det - base).max(1e-9) / 1e6
    );
    println!(
        "on-CPU time             baseline {:.3} s, detector {:.3} s → detector alone {:.2} M samples/s",
        base_cpu,
        det_cpu,
        n as f64 / (det_cpu - base_cpu).max(1e-9) / 1e6
    );
    println!(
        "peak RSS                {:.1} MiB before detector, {:.1} MiB after",
        rss_before as f64 / 1024.0,
        rss_after as f64 / 1024.0
    );
    println!(
        "accesses {} / findings {} / top kind {:?} / no-memory samples {}",
        fs.accesses,
        a.findings.len(),
        a.findings.first().map(|f| f.kind),
        fs.no_memory
    );
}
