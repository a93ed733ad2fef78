//! Phoenix linear_regression at -O0 (`linear_regression_pthread`, gcc 12.2 `-O0 -g`, the
//! bytes of `../shared/realworld`'s `phx_linear_regression_O0` at 0x12a5..0x145f) repaired
//! in-process: the loop reloads `args` from its stack slot `[rbp-0x10]` before every access,
//! so the base register of its five `+=` stores is rewritten every iteration although its
//! value never changes (`plan/frame.rs`). Same sums as native with two threads; a
//! side-by-side timing (ignored test) of packed, padded and repaired.
//!
//! ```text
//!   lreg_args (64 B): | tid | points | num_elems | SX SY SXX SYY SXY |
//!   array at 48 mod 64: arg[0].SX..SXY share a line with arg[1].tid/points (thread 1
//!   reloads points every access)
//! ```

mod plan_support;

use laser_repair::plan::{PlanOptions, RefusalReason};
use plan_support::*;
use std::time::Instant;

/// `void *linear_regression_pthread(void *args)`, as gcc -O0 emitted it (442 bytes, a leaf
/// with no calls and no rip-relative operands: it runs wherever it is placed).
const LREG_O0: [u8; 442] = [
    0x55, 0x48, 0x89, 0xe5, 0x48, 0x89, 0x7d, 0xe8, 0x48, 0x8b, 0x45, 0xe8, 0x48, 0x89, 0x45, 0xf0,
    0x48, 0x8b, 0x45, 0xf0, 0x48, 0xc7, 0x40, 0x18, 0x00, 0x00, 0x00, 0x00, 0x48, 0x8b, 0x45, 0xf0,
    0x48, 0xc7, 0x40, 0x28, 0x00, 0x00, 0x00, 0x00, 0x48, 0x8b, 0x45, 0xf0, 0x48, 0xc7, 0x40, 0x20,
    0x00, 0x00, 0x00, 0x00, 0x48, 0x8b, 0x45, 0xf0, 0x48, 0xc7, 0x40, 0x30, 0x00, 0x00, 0x00, 0x00,
    0x48, 0x8b, 0x45, 0xf0, 0x48, 0xc7, 0x40, 0x38, 0x00, 0x00, 0x00, 0x00, 0xc7, 0x45, 0xfc, 0x00,
    0x00, 0x00, 0x00, 0xe9, 0x4b, 0x01, 0x00, 0x00, 0x48, 0x8b, 0x45, 0xf0, 0x48, 0x8b, 0x50, 0x18,
    0x48, 0x8b, 0x45, 0xf0, 0x48, 0x8b, 0x40, 0x08, 0x8b, 0x4d, 0xfc, 0x48, 0x63, 0xc9, 0x48, 0x01,
    0xc9, 0x48, 0x01, 0xc8, 0x0f, 0xb6, 0x00, 0x48, 0x0f, 0xbe, 0xc0, 0x48, 0x01, 0xc2, 0x48, 0x8b,
    0x45, 0xf0, 0x48, 0x89, 0x50, 0x18, 0x48, 0x8b, 0x45, 0xf0, 0x48, 0x8b, 0x48, 0x28, 0x48, 0x8b,
    0x45, 0xf0, 0x48, 0x8b, 0x40, 0x08, 0x8b, 0x55, 0xfc, 0x48, 0x63, 0xd2, 0x48, 0x01, 0xd2, 0x48,
    0x01, 0xd0, 0x0f, 0xb6, 0x00, 0x0f, 0xbe, 0xd0, 0x48, 0x8b, 0x45, 0xf0, 0x48, 0x8b, 0x40, 0x08,
    0x8b, 0x75, 0xfc, 0x48, 0x63, 0xf6, 0x48, 0x01, 0xf6, 0x48, 0x01, 0xf0, 0x0f, 0xb6, 0x00, 0x0f,
    0xbe, 0xc0, 0x0f, 0xaf, 0xc2, 0x48, 0x98, 0x48, 0x8d, 0x14, 0x01, 0x48, 0x8b, 0x45, 0xf0, 0x48,
    0x89, 0x50, 0x28, 0x48, 0x8b, 0x45, 0xf0, 0x48, 0x8b, 0x50, 0x20, 0x48, 0x8b, 0x45, 0xf0, 0x48,
    0x8b, 0x40, 0x08, 0x8b, 0x4d, 0xfc, 0x48, 0x63, 0xc9, 0x48, 0x01, 0xc9, 0x48, 0x01, 0xc8, 0x0f,
    0xb6, 0x40, 0x01, 0x48, 0x0f, 0xbe, 0xc0, 0x48, 0x01, 0xc2, 0x48, 0x8b, 0x45, 0xf0, 0x48, 0x89,
    0x50, 0x20, 0x48, 0x8b, 0x45, 0xf0, 0x48, 0x8b, 0x48, 0x30, 0x48, 0x8b, 0x45, 0xf0, 0x48, 0x8b,
    0x40, 0x08, 0x8b, 0x55, 0xfc, 0x48, 0x63, 0xd2, 0x48, 0x01, 0xd2, 0x48, 0x01, 0xd0, 0x0f, 0xb6,
    0x40, 0x01, 0x0f, 0xbe, 0xd0, 0x48, 0x8b, 0x45, 0xf0, 0x48, 0x8b, 0x40, 0x08, 0x8b, 0x75, 0xfc,
    0x48, 0x63, 0xf6, 0x48, 0x01, 0xf6, 0x48, 0x01, 0xf0, 0x0f, 0xb6, 0x40, 0x01, 0x0f, 0xbe, 0xc0,
    0x0f, 0xaf, 0xc2, 0x48, 0x98, 0x48, 0x8d, 0x14, 0x01, 0x48, 0x8b, 0x45, 0xf0, 0x48, 0x89, 0x50,
    0x30, 0x48, 0x8b, 0x45, 0xf0, 0x48, 0x8b, 0x48, 0x38, 0x48, 0x8b, 0x45, 0xf0, 0x48, 0x8b, 0x40,
    0x08, 0x8b, 0x55, 0xfc, 0x48, 0x63, 0xd2, 0x48, 0x01, 0xd2, 0x48, 0x01, 0xd0, 0x0f, 0xb6, 0x00,
    0x0f, 0xbe, 0xd0, 0x48, 0x8b, 0x45, 0xf0, 0x48, 0x8b, 0x40, 0x08, 0x8b, 0x75, 0xfc, 0x48, 0x63,
    0xf6, 0x48, 0x01, 0xf6, 0x48, 0x01, 0xf0, 0x0f, 0xb6, 0x40, 0x01, 0x0f, 0xbe, 0xc0, 0x0f, 0xaf,
    0xc2, 0x48, 0x98, 0x48, 0x8d, 0x14, 0x01, 0x48, 0x8b, 0x45, 0xf0, 0x48, 0x89, 0x50, 0x38, 0x83,
    0x45, 0xfc, 0x01, 0x48, 0x8b, 0x45, 0xf0, 0x8b, 0x40, 0x10, 0x39, 0x45, 0xfc, 0x0f, 0x8c, 0xa5,
    0xfe, 0xff, 0xff, 0xb8, 0x00, 0x00, 0x00, 0x00, 0x5d, 0xc3,
];

/// Offsets of the five stores to SX..SXY in [`LREG_O0`] (0x1327, 0x1374, 0x13a3, 0x13f2,
/// 0x1440 in the binary).
const STORES: [u64; 5] = [0x82, 0xcf, 0xfe, 0x14d, 0x19b];

fn build(a: &mut iced_x86::code_asm::CodeAssembler) {
    a.db(&LREG_O0).unwrap();
}

fn pcs(base: u64, _: &[u8]) -> Vec<u64> {
    STORES.iter().map(|o| base + o).collect()
}

/// The planner's options `laser repair` uses: the general path refused.
fn strict() -> PlanOptions {
    PlanOptions {
        refuse_general_path: true,
        ..PlanOptions::default()
    }
}

fn points(seed: u64, n: usize) -> Vec<u8> {
    let mut s = seed | 1;
    (0..2 * n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as u8
        })
        .collect()
}

/// SX, SY, SXX, SYY, SXY as the C code computes them (chars are signed).
fn expected(p: &[u8]) -> [u64; 5] {
    let mut s = [0i64; 5];
    for xy in p.chunks(2) {
        let (x, y) = (xy[0] as i8 as i64, xy[1] as i8 as i64);
        s[0] += x;
        s[1] += y;
        s[2] += x * x;
        s[3] += y * y;
        s[4] += x * y;
    }
    s.map(|v| v as u64)
}

/// Runs `f` on two threads, `n` points each, the two 64-byte structs at `offset` mod 64
/// (48: as calloc placed them; 0: the aligned twin). Returns CPU s per thread and the sums.
fn run(f: u64, offset: usize, n: usize) -> (f64, Vec<[u64; 5]>, Vec<Vec<u8>>) {
    use std::sync::atomic::AtomicU32;
    #[repr(C, align(64))]
    struct Block([u64; 40]);
    let mut block = Block([0; 40]);
    let pts: Vec<Vec<u8>> = (0..2).map(|k| points(k + 7, n)).collect();
    let w0 = offset / 8;
    for (k, p) in pts.iter().enumerate() {
        let w = w0 + 8 * k;
        block.0[w + 1] = p.as_ptr() as u64;
        block.0[w + 2] = n as u64; // int num_elems, little-endian low half
    }
    let base = block.0.as_mut_ptr() as u64 + offset as u64;
    let ready = AtomicU32::new(0);
    let cpu = std::sync::Mutex::new(0.0f64);
    let cpu = &cpu;
    std::thread::scope(|s| {
        for k in 0..2u64 {
            let ready = &ready;
            s.spawn(move || {
                start_line(ready, 2);
                let c0 = thread_cpu();
                fn2(f)(base + 64 * k, 0);
                cpu.lock().map(|mut c| *c += thread_cpu() - c0).ok();
            });
        }
    });
    let el = cpu.lock().map(|c| *c).unwrap_or(0.0) / 2.0;
    let sums = (0..2)
        .map(|k| {
            let w = w0 + 8 * k + 3;
            [
                block.0[w],
                block.0[w + 1],
                block.0[w + 2],
                block.0[w + 3],
                block.0[w + 4],
            ]
        })
        .collect();
    (el, sums, pts)
}

/// Field order in memory is SX SY SXX SYY SXY (offsets 0x18..0x40).
fn check(sums: &[[u64; 5]], pts: &[Vec<u8>]) {
    for (s, p) in sums.iter().zip(pts) {
        let e = expected(p);
        assert_eq!(
            *s,
            [e[0], e[1], e[2], e[3], e[4]],
            "repaired sums differ from native"
        );
    }
}

#[test]
fn o0_loop_is_a_fixed_region_with_its_frame_bypassed() {
    let t = twin(&build, &pcs, strict()).expect("the -O0 loop is a fixed-address region");
    assert!(t.plan.region.is_loop);
    assert_eq!(t.plan.fixed_locations, 5, "SX..SXY, one slot each");
    let (_, sums, pts) = run(t.native, 48, 10_000);
    check(&sums, &pts);
    let (_, sums, pts) = run(t.repaired, 48, 10_000);
    check(&sums, &pts);
    // Sizes that end between the every-256-back-edges flushes.
    let (_, sums, pts) = run(t.repaired, 48, 777);
    check(&sums, &pts);
    let (_, sums, pts) = run(t.repaired, 0, 3);
    check(&sums, &pts);
}

/// Each buffered store of this single-block loop writes three words of the thread's log
/// (address, size, value) and nothing else: its loads find the youngest value at a fixed
/// distance back in the log, so no per-location shadow is written (one store in four fewer).
#[test]
fn o0_loop_appends_write_three_words_each() {
    use iced_x86::{Decoder, InstructionInfoFactory, OpAccess, Register};
    let t = twin(&build, &pcs, strict()).unwrap();
    let rt = &t.plan.runtime;
    let region = (rt.code_addr + rt.code_len).div_ceil(16) * 16;
    let code = &t.plan.cache.code;
    let off = (region - t.plan.cache.code_addr) as usize;
    let mut info = InstructionInfoFactory::new();
    let mut writes = 0;
    // The hot path of one iteration: from the loop head to its own `jl` (the condition).
    for i in Decoder::with_ip(64, &code[off..], region, 0) {
        if i.mnemonic() == iced_x86::Mnemonic::Jl {
            break;
        }
        // (Frame accesses run verbatim; a spill's push writes the stack.)
        writes += info
            .info(&i)
            .used_memory()
            .iter()
            .filter(|m| matches!(m.access(), OpAccess::Write | OpAccess::ReadWrite))
            .filter(|m| !matches!(m.base(), Register::RBP | Register::RSP))
            .count();
    }
    assert_eq!(writes, 5 * 3, "five appends of (address, size, value)");
}

/// A store into the frame slot `args` is reloaded from makes its value move: not fixed.
#[test]
fn a_stored_slot_is_not_a_fixed_base() {
    let mut bytes = LREG_O0;
    // `addl $1,-0x4(%rbp)` (83 45 fc 01, the loop counter) becomes `addl $1,-0x10(%rbp)`:
    // the slot args is reloaded from is now written inside the loop.
    let at = bytes
        .windows(4)
        .position(|w| w == [0x83, 0x45, 0xfc, 0x01])
        .unwrap();
    bytes[at + 2] = 0xf0;
    let build2 = |a: &mut iced_x86::code_asm::CodeAssembler| a.db(&bytes).unwrap();
    match twin(&build2, &pcs, strict()) {
        Err(e) => assert!(matches!(e.reason, RefusalReason::GeneralPath), "{e}"),
        Ok(_) => panic!("a loop that stores its base's slot was planned as fixed"),
    }
}

/// Side by side, interleaved: packed (48 mod 64) native, aligned native, repaired packed,
/// repaired aligned (the cost where nothing is contended).
/// `cargo test -p laser-repair --release --test plan_lreg_o0 -- --ignored --nocapture`
#[test]
#[ignore = "benchmark: run on a quiet machine with --nocapture"]
fn bench_lreg_o0_repair() {
    let t = twin(&build, &pcs, strict()).unwrap();
    const N: usize = 1 << 23;
    let variants = [
        ("native packed", t.native, 48),
        ("native aligned", t.native, 0),
        ("repaired packed", t.repaired, 48),
        ("repaired aligned", t.repaired, 0),
    ];
    let mut times = vec![Vec::new(); variants.len()];
    for rep in 0..5 {
        for j in 0..variants.len() {
            let j = if rep % 2 == 0 {
                j
            } else {
                variants.len() - 1 - j
            };
            let (_, f, off) = variants[j];
            let t0 = Instant::now();
            let (el, sums, pts) = run(f, off, N);
            check(&sums, &pts);
            times[j].push((el, t0.elapsed().as_secs_f64()));
        }
    }
    let med = |v: &mut Vec<(f64, f64)>| {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v[v.len() / 2].0
    };
    let m: Vec<f64> = times.iter_mut().map(med).collect();
    println!("lreg -O0, 2 threads x {N} points, CPU s per thread, median of 5 interleaved:");
    for (j, (name, _, _)) in variants.iter().enumerate() {
        println!(
            "  {name:17} {:.3}s {:5.1} ns/it  recovered {:4.0}%",
            m[j],
            m[j] * 1e9 / N as f64,
            100.0 * (m[0] - m[j]) / (m[0] - m[1])
        );
    }
}

/// Prints the rewritten loop (`--ignored --nocapture`): count the instructions per access.
#[test]
#[ignore = "prints code"]
fn dump_lreg_o0_rewrite() {
    let t = twin(&build, &pcs, strict()).unwrap();
    let code = &t.plan.cache.code;
    let start = t.plan.runtime.code_addr;
    for i in iced_x86::Decoder::with_ip(64, code, start, 0) {
        println!("{:#x} {}", i.ip() - start, i);
    }
    println!("pc map {:x?}", t.plan.pc_map);
}

/// Where the repaired loop's cycles go: prints the code cache's parts (one `part NAME START`
/// line each), then runs the repaired loop on packed structs for a while. Under
/// `perf record -e cpu-clock` (software clock: no PMU needed), `scripts/ssb-profile` buckets
/// the samples by part.
#[test]
#[ignore = "profile: run under perf record, see scripts/ssb-profile"]
fn profile_lreg_o0_repair() {
    let t = twin(&build, &pcs, strict()).unwrap();
    let rt = &t.plan.runtime;
    let region = (rt.code_addr + rt.code_len).div_ceil(16) * 16;
    let tramp = t.plan.pc_map.iter().map(|p| p.1).min().unwrap_or(region);
    let mut parts = vec![
        ("flush", rt.flush),
        ("backedge", rt.backedge),
        ("enter", rt.enter),
        ("region-body", region),
        ("trampolines-copy-cold", tramp),
    ];
    for (k, &a) in rt.load.iter().enumerate() {
        parts.push((["load1", "load2", "load4", "load8"][k], a));
    }
    for (k, &a) in rt.store.iter().enumerate() {
        parts.push((["store1", "store2", "store4", "store8"][k], a));
    }
    parts.push((
        "end",
        t.plan.cache.code_addr + t.plan.cache.code.len() as u64,
    ));
    parts.push(("native-fn", t.native));
    parts.push(("native-fn-end", t.native + t.len as u64));
    for (n, a) in &parts {
        println!("part {n} {a:#x}");
    }
    let reps: usize = std::env::var("LREG_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    for _ in 0..reps {
        let (_, sums, pts) = run(t.repaired, 48, 1 << 23);
        check(&sums, &pts);
    }
}
