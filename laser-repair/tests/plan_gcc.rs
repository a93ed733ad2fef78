//! The planner on real compiler output: a gcc -O2 false-sharing loop (fixture bytes), placed
//! in executable memory, run natively and repaired with one and two threads.
//!
//! Fixture: `gcc -O2 -fcf-protection=full -c fs.c && objcopy -O binary --only-section=.text
//! fs.o fs.bin` (gcc 12.2.0, Debian 12) on:
//! ```c
//! struct acc { long sum; long cnt; unsigned char bytes[8]; int mx; };
//! void work(struct acc *a, long n, const long *x) {
//!   for (long i = 0; i < n; i++) {
//!     a->sum += x[i];
//!     a->cnt++;
//!     a->bytes[i & 7] ^= (unsigned char)x[i];
//!     if (x[i] > a->mx) a->mx = (int)x[i];
//!   }
//! }
//! ```
//! Two `struct acc` (32 bytes each) share one cache line: the false sharing LASER repairs.

mod plan_support;

use plan_support::*;

const WORK: [u8; 85] = [
    0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x85, 0xf6, 0x7e, 0x4b, 0x48, 0x8b, 0x4f, 0x08, 0x4c, 0x8b, 0x07,
    0x31, 0xc0, 0x4c, 0x8d, 0x51, 0x01, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x49, 0x89, 0xc1, 0x4c, 0x03, 0x04, 0xc2, 0x49, 0x8d, 0x0c, 0x02, 0x41, 0x83, 0xe1, 0x07, 0x4c,
    0x89, 0x07, 0x48, 0x89, 0x4f, 0x08, 0x48, 0x8b, 0x0c, 0xc2, 0x42, 0x30, 0x4c, 0x0f, 0x10, 0x4c,
    0x63, 0x4f, 0x18, 0x4c, 0x39, 0xc9, 0x7e, 0x03, 0x89, 0x4f, 0x18, 0x48, 0x83, 0xc0, 0x01, 0x48,
    0x39, 0xc6, 0x75, 0xcc, 0xc3,
];
/// `mov %r8,(%rdi)`: the store to `a->sum`.
const SUM_STORE: u64 = 0x2f;

#[repr(C, align(64))]
#[derive(Clone, Copy, Default, PartialEq, Debug)]
struct Line {
    acc: [[u64; 4]; 2],
}

fn xs(seed: u64, n: usize) -> Vec<i64> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 1_000_003) as i64 - 500_000
        })
        .collect()
}

fn run(f: u64, threads: u64, n: usize) -> Line {
    let mut line = Line::default();
    let base = line.acc.as_mut_ptr() as u64;
    let inputs: Vec<Vec<i64>> = (0..threads).map(|k| xs(k + 7, n)).collect();
    std::thread::scope(|s| {
        for (k, x) in inputs.iter().enumerate() {
            let xp = x.as_ptr() as u64;
            s.spawn(move || fn3(f)(base + 32 * k as u64, n as u64, xp));
        }
    });
    line
}

#[test]
fn gcc_false_sharing_loop_same_results_one_and_two_threads() {
    let t = twin(
        &|a| a.db(&WORK).unwrap(),
        &|base, _| vec![base + SUM_STORE],
        Default::default(),
    )
    .unwrap_or_else(|r| panic!("gcc loop refused: {r}"));
    let p = &t.plan;
    assert!(p.region.is_loop);
    assert_eq!(
        p.state_register,
        Some(iced_x86::Register::R11),
        "r11 is free in this loop"
    );
    assert_eq!(p.patches.len(), 1);
    assert_eq!(
        p.patches[0].addr,
        t.repaired + 0x20,
        "patch at the loop header"
    );
    assert_eq!(p.region.stores, 4);
    for threads in [1, 2] {
        for n in [1usize, 5, 10_000] {
            assert_eq!(
                run(t.native, threads, n),
                run(t.repaired, threads, n),
                "{threads} threads, n {n}"
            );
        }
    }
}

/// Side by side, two threads: accumulators sharing a line (native), padded to separate lines
/// (the fix by hand), sharing a line but repaired. Prints ratios only.
#[test]
#[ignore = "benchmark: run on a quiet machine with --nocapture"]
fn bench_gcc_false_sharing_ratios() {
    use std::time::Instant;
    let t = twin(
        &|a| a.db(&WORK).unwrap(),
        &|base, _| vec![base + SUM_STORE],
        Default::default(),
    )
    .unwrap();
    const N: usize = 20_000_000;
    let rt = &t.plan.runtime;
    println!(
        "code cache {:#x}..{:#x}, load helpers {:x?}, store helpers {:x?}, flush {:#x}",
        t.plan.cache.code_addr,
        t.plan.cache.code_addr + t.plan.cache.code.len() as u64,
        rt.load,
        rt.store,
        rt.flush
    );
    let inputs: Vec<Vec<i64>> = (0..2).map(|k| xs(k + 7, N)).collect();
    let time = |f: u64, stride: u64| -> f64 {
        let mut lines = [Line::default(); 4];
        let base = lines.as_mut_ptr() as u64;
        let s0 = Instant::now();
        std::thread::scope(|s| {
            for (k, x) in inputs.iter().enumerate() {
                let xp = x.as_ptr() as u64;
                s.spawn(move || fn3(f)(base + stride * k as u64, N as u64, xp));
            }
        });
        s0.elapsed().as_secs_f64()
    };
    let best = |f: u64, stride: u64| {
        (0..3)
            .map(|_| time(f, stride))
            .fold(f64::INFINITY, f64::min)
    };
    let (native, padded, repaired) = (
        best(t.native, 32),
        best(t.native, 128),
        best(t.repaired, 32),
    );
    println!("gcc loop, 2 threads x {N}: native {native:.3}s, padded {padded:.3}s, repaired {repaired:.3}s");
    println!(
        "padding gain {:.2}x, repair gain {:.2}x, recovered {:.0}% of the padding gain",
        native / padded,
        native / repaired,
        100.0 * (native / repaired - 1.0) / (native / padded - 1.0).max(1e-9)
    );
}
