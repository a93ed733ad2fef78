//! The linear-regression loop (benchmarks/workloads/linear_regression.c, gcc 12 -O2 output,
//! instruction for instruction) repaired in-process: same sums as native with two threads,
//! and a side-by-side timing of native packed, native padded (the fix by hand) and repaired.
//!
//! ```text
//!   args[0]: | points | n | SX SY SXX SYY SXY |  args[1]: | points | n | SX ...
//!            '------------- 56 bytes ----------''---------- shares the line -------
//! ```
//! Per iteration: two byte loads of `points[i]`, then five `volatile +=` (load, add, store)
//! on the thread's own sums, whose neighbour's sums share the cache line.

mod plan_support;

use iced_x86::code_asm::*;
use plan_support::*;
use std::time::Instant;

/// `fn(args: *mut Args, passes: u64)`: `linear_regression_map` with `passes` as an argument
/// (gcc reads the global with a rip-relative load; an argument keeps the fixture standalone).
fn lreg_map(a: &mut CodeAssembler) {
    let mut done = a.create_label();
    let mut outer = a.create_label();
    let mut inner = a.create_label();
    a.mov(r10, rsi).unwrap();
    a.test(r10, r10).unwrap();
    a.jle(done).unwrap();
    a.mov(rax, qword_ptr(rdi + 8)).unwrap();
    a.mov(rdx, rdi).unwrap();
    a.xor(r9d, r9d).unwrap();
    a.lea(r8, qword_ptr(rax + rax)).unwrap();
    a.test(rax, rax).unwrap();
    a.jle(done).unwrap();
    a.push(rbp).unwrap();
    a.mov(rbp, rsp).unwrap();
    a.push(rbx).unwrap();
    a.mov(r11, qword_ptr(rdx)).unwrap();
    a.add(r8, r11).unwrap();
    a.set_label(&mut outer).unwrap();
    a.mov(rdi, r11).unwrap();
    a.set_label(&mut inner).unwrap();
    a.mov(rsi, qword_ptr(rdx + 0x10)).unwrap();
    a.movsx(rcx, byte_ptr(rdi)).unwrap();
    a.add(rdi, 2).unwrap();
    a.mov(rax, rcx).unwrap();
    a.add(rcx, rsi).unwrap();
    a.mov(qword_ptr(rdx + 0x10), rcx).unwrap();
    a.mov(ecx, eax).unwrap();
    a.mov(rsi, qword_ptr(rdx + 0x20)).unwrap();
    a.imul_2(ecx, eax).unwrap();
    a.movsxd(rcx, ecx).unwrap();
    a.add(rcx, rsi).unwrap();
    a.mov(qword_ptr(rdx + 0x20), rcx).unwrap();
    a.mov(rbx, qword_ptr(rdx + 0x18)).unwrap();
    a.movsx(rsi, byte_ptr(rdi - 1)).unwrap();
    a.mov(rcx, rsi).unwrap();
    a.add(rsi, rbx).unwrap();
    a.mov(qword_ptr(rdx + 0x18), rsi).unwrap();
    a.mov(esi, ecx).unwrap();
    a.mov(rbx, qword_ptr(rdx + 0x28)).unwrap();
    a.imul_2(eax, ecx).unwrap();
    a.imul_2(esi, ecx).unwrap();
    a.cdqe().unwrap();
    a.movsxd(rsi, esi).unwrap();
    a.add(rsi, rbx).unwrap();
    a.mov(qword_ptr(rdx + 0x28), rsi).unwrap();
    a.mov(rsi, qword_ptr(rdx + 0x30)).unwrap();
    a.add(rax, rsi).unwrap();
    a.mov(qword_ptr(rdx + 0x30), rax).unwrap();
    a.cmp(r8, rdi).unwrap();
    a.jne(inner).unwrap();
    a.add(r9, 1).unwrap();
    a.cmp(r9, r10).unwrap();
    a.jne(outer).unwrap();
    a.mov(rbx, qword_ptr(rbp - 8)).unwrap();
    a.leave().unwrap();
    a.set_label(&mut done).unwrap();
    a.ret().unwrap();
}

/// The C struct: 56 bytes, packed in an array (`stride` 56) or padded (`stride` 64/128).
const SUMS: usize = 5;

fn points(seed: u64, n: usize) -> Vec<u8> {
    let mut s = seed | 1;
    (0..2 * n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s & 0x7f) as u8
        })
        .collect()
}

/// What the loop computes: SX, SY, SXX, SYY, SXY over `passes` passes.
fn expected(p: &[u8], passes: u64) -> [u64; SUMS] {
    let mut s = [0i64; SUMS];
    for xy in p.chunks(2) {
        let (x, y) = (xy[0] as i8 as i64, xy[1] as i8 as i64);
        s[0] += x;
        s[1] += y;
        s[2] += x * x;
        s[3] += y * y;
        s[4] += x * y;
    }
    s.map(|v| (v * passes as i64) as u64)
}

/// Runs `f` on two threads over `n` points each, args `stride` bytes apart; returns the mean
/// CPU time per thread and each thread's sums (SX, SY, SXX, SYY, SXY).
fn run(f: u64, stride: usize, n: usize, passes: u64) -> (f64, Vec<[u64; SUMS]>, Vec<Vec<u8>>) {
    let (cpu, _, sums, pts) = run_timed(f, stride, n, passes);
    (cpu, sums, pts)
}

/// [`run`] with the wall time too: (CPU s per thread, wall s, sums, points).
#[allow(clippy::type_complexity)]
fn run_timed(
    f: u64,
    stride: usize,
    n: usize,
    passes: u64,
) -> (f64, f64, Vec<[u64; SUMS]>, Vec<Vec<u8>>) {
    use std::sync::atomic::AtomicU32;
    #[repr(C, align(128))]
    struct Block([u64; 64]);
    let mut block = Block([0; 64]);
    let pts: Vec<Vec<u8>> = (0..2).map(|k| points(k + 3, n)).collect();
    // glibc's malloc returns 16 mod 64 here: with 56-byte structs, args[0]'s SXY and
    // args[1]'s SX..SYY then share a line (at 0 mod 64 they would not).
    let base = block.0.as_mut_ptr() as u64 + 16;
    for (k, p) in pts.iter().enumerate() {
        let w = 2 + k * stride / 8;
        block.0[w] = p.as_ptr() as u64;
        block.0[w + 1] = n as u64;
    }
    let ready = AtomicU32::new(0);
    let cpu = std::sync::Mutex::new(0.0f64);
    let cpu = &cpu;
    let start = Instant::now();
    std::thread::scope(|s| {
        for k in 0..2u64 {
            let ready = &ready;
            s.spawn(move || {
                start_line(ready, 2);
                let c0 = thread_cpu();
                fn2(f)(base + stride as u64 * k, passes);
                cpu.lock().map(|mut c| *c += thread_cpu() - c0).ok();
            });
        }
    });
    let wall = start.elapsed().as_secs_f64();
    // Threads' CPU time, not wall time: on a shared machine the two threads often take turns
    // on one core; CPU time still counts every stall the contention causes.
    let el = cpu.lock().map(|c| *c).unwrap_or(0.0) / 2.0;
    let sums = (0..2)
        .map(|k| {
            let w = 2 + k * stride / 8 + 2;
            // Field order in memory: SX SY SXX SYY SXY.
            [
                block.0[w],
                block.0[w + 1],
                block.0[w + 2],
                block.0[w + 3],
                block.0[w + 4],
            ]
        })
        .collect();
    (el, wall, sums, pts)
}

fn check(sums: &[[u64; SUMS]], pts: &[Vec<u8>], passes: u64) {
    for (s, p) in sums.iter().zip(pts) {
        assert_eq!(*s, expected(p, passes), "repaired sums differ from native");
    }
}

#[test]
fn lreg_repaired_two_threads_same_sums() {
    let t = twin(&lreg_map, &store_pcs, Default::default()).unwrap();
    assert!(t.plan.region.is_loop);
    let (_, sums, pts) = run(t.native, 56, 10_000, 3);
    check(&sums, &pts, 3);
    let (_, sums, pts) = run(t.repaired, 56, 10_000, 3);
    check(&sums, &pts, 3);
    // Odd sizes cross flush and back-edge boundaries at different points.
    let (_, sums, pts) = run(t.repaired, 56, 777, 5);
    check(&sums, &pts, 5);
}

/// The goal of issue 5: recover >= 50% of the padding gain. Prints only (timing on a shared
/// machine is not assertable), for several log capacities side by side:
/// `cargo test -p laser-repair --release --test plan_lreg -- --ignored --nocapture`
/// (`LREG_CAPS=64,1024 LREG_PASSES=10` to choose).
#[test]
#[ignore = "benchmark: run on a quiet machine with --nocapture"]
fn bench_lreg_repair() {
    use laser_repair::plan::{PlanOptions, RuntimeConfig};
    let caps: Vec<u32> = std::env::var("LREG_CAPS")
        .unwrap_or_else(|_| "64,256,1024".into())
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    let passes: u64 = std::env::var("LREG_PASSES")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(10);
    let twins: Vec<_> = caps
        .iter()
        .map(|&log_capacity| {
            let opts = PlanOptions {
                runtime: RuntimeConfig {
                    log_capacity,
                    ..RuntimeConfig::default()
                },
                ..PlanOptions::default()
            };
            twin(&lreg_map, &store_pcs, opts).unwrap()
        })
        .collect();
    for t in &twins {
        let rt = &t.plan.runtime;
        eprintln!(
            "cache code {:#x}+{:#x}: load {:x?} store {:x?} flush {:#x} enter {:#x}",
            rt.code_addr,
            t.plan.cache.code.len(),
            rt.load,
            rt.store,
            rt.flush,
            rt.enter
        );
    }
    const N: usize = 1 << 20;
    let mut variants: Vec<(String, u64, usize)> = vec![
        ("native".into(), twins[0].native, 56),
        ("padded".into(), twins[0].native, 128),
    ];
    for (c, t) in caps.iter().zip(&twins) {
        variants.push((format!("repaired log {c}"), t.repaired, 56));
    }
    // The same repair without the flush lock (the two threads' replays may interleave).
    let mut no_lock = PlanOptions::default();
    no_lock.runtime.log_capacity = caps[caps.len() - 1];
    no_lock.runtime.flush_lock = false;
    let t_nl = twin(&lreg_map, &store_pcs, no_lock).unwrap();
    variants.push(("repaired no lock".into(), t_nl.repaired, 56));
    // The control: the repair applied where there is no contention (padded structs).
    variants.push((
        "repaired padded".into(),
        twins[twins.len() - 1].repaired,
        128,
    ));
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    let mut walls: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for rep in 0..5 {
        let order: Vec<usize> = if rep % 2 == 0 {
            (0..variants.len()).collect()
        } else {
            (0..variants.len()).rev().collect()
        };
        for j in order {
            let (_, f, stride) = variants[j];
            let (el, wall, sums, pts) = run_timed(f, stride, N, passes);
            check(&sums, &pts, passes);
            times[j].push(el);
            walls[j].push(wall);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let med: Vec<f64> = times.iter_mut().map(median).collect();
    let wmed: Vec<f64> = walls.iter_mut().map(median).collect();
    let per = |s: f64| s * 1e9 / (N as f64 * passes as f64);
    let (n, p) = (med[0], med[1]);
    println!("lreg, 2 threads x {N} points x {passes} passes, CPU s per thread, median of 5 interleaved:");
    println!(
        "  ('repaired padded' vs 'padded' is the cost of repairing a loop with no contention)"
    );
    for (j, (name, _, _)) in variants.iter().enumerate() {
        let r = med[j];
        println!(
            "  {name:19} {r:.3}s {:6.1} ns/it  speedup vs native {:.2}x  recovered {:4.0}%  \
             (wall {:.3}s, {:.2}x)",
            per(r),
            n / r,
            100.0 * (n - r) / (n - p),
            wmed[j],
            wmed[0] / wmed[j]
        );
    }
}

/// Prints the rewritten loop (`--ignored --nocapture`): count the instructions per access.
#[test]
#[ignore = "prints code"]
fn dump_lreg_rewrite() {
    let t = twin(&lreg_map, &store_pcs, Default::default()).unwrap();
    let code = &t.plan.cache.code;
    // Offsets from the cache's code start (the runtime's helpers come first).
    for i in iced_x86::Decoder::with_ip(64, code, 0, 0) {
        println!("{:#06x} {}", i.ip(), i);
    }
    println!("pc map {:x?}", t.plan.pc_map);
}
