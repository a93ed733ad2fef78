//! SSE/AVX memory operands through the SSB (`plan/wide.rs`): rewritten loops run in-process
//! next to their native copies and must leave the same memory, outputs and return value.
//! A wide access that bypassed the log would read memory the buffered stores have not
//! reached yet (the log flushes only at region exits and every 256 back-edges), so the
//! comparison with the native copy catches a missing forward.
//!
//! Every kernel is `fn(buf: *mut u8, n: u64, out: *mut u8) -> u64` and loops `n` times.

mod plan_support;

use iced_x86::code_asm::*;
use laser_repair::plan::{PlanOptions, RefusalReason};
use plan_support::*;

fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

/// Runs `f` on a seeded 256-byte buffer; returns (buffer, 32 output bytes, return value).
fn run(f: u64, seed: u64, n: u64) -> (Vec<u8>, [u8; 32], u64) {
    let mut buf = seeded(256, seed);
    let mut out = [0u8; 32];
    let r = fn3(f)(buf.as_mut_ptr() as u64, n, out.as_mut_ptr() as u64);
    (buf, out, r)
}

fn assert_same(t: &Twin, what: &str) {
    for (seed, n) in [(1u64, 1u64), (2, 2), (3, 17), (4, 300), (5, 1000)] {
        let native = run(t.native, seed, n);
        let repaired = run(t.repaired, seed, n);
        assert_eq!(native, repaired, "{what}: seed {seed}, n {n}");
    }
}

/// The first store inside the loop (the loop starts at the function's first instruction).
fn first_store(base: u64, code: &[u8]) -> Vec<u64> {
    store_pcs(base, code).into_iter().take(1).collect()
}

/// 16-byte loads forwarding from two buffered 8-byte stores (`movdqu`, then `paddd` with a
/// memory source), and 8-/4-byte XMM loads and stores (`movsd`, `movss`).
fn load_from_two_stores(a: &mut CodeAssembler) {
    let mut top = a.create_label();
    a.pxor(xmm1, xmm1).unwrap();
    a.pxor(xmm3, xmm3).unwrap();
    a.set_label(&mut top).unwrap();
    a.mov(rax, qword_ptr(rdi)).unwrap();
    a.add(rax, rsi).unwrap();
    a.mov(qword_ptr(rdi + 32), rax).unwrap();
    a.lea(rcx, qword_ptr(rax + rax * 2 + 1)).unwrap();
    a.mov(qword_ptr(rdi + 40), rcx).unwrap();
    a.movdqu(xmm0, xmmword_ptr(rdi + 32)).unwrap();
    a.paddq(xmm1, xmm0).unwrap();
    a.paddd(xmm1, xmmword_ptr(rdi + 32)).unwrap();
    a.movsd_2(xmm2, qword_ptr(rdi + 40)).unwrap();
    a.movss(dword_ptr(rdi + 52), xmm2).unwrap();
    a.mov(r8d, dword_ptr(rdi + 52)).unwrap();
    a.add(qword_ptr(rdi), r8).unwrap();
    a.dec(rsi).unwrap();
    a.jnz(top).unwrap();
    a.movdqu(xmmword_ptr(rdx), xmm1).unwrap();
    a.movq(rax, xmm2).unwrap();
    a.ret().unwrap();
}

#[test]
fn sixteen_byte_load_forwards_from_two_eight_byte_stores() {
    let t = twin(&load_from_two_stores, &first_store, permissive()).unwrap();
    assert!(t.plan.region.is_loop);
    assert!(t.plan.state_register.is_some());
    // Every store has a fixed address: a fixed region, the movss store a location of its own
    // next to the three GPR stores.
    assert_eq!(t.plan.fixed_locations, 4);
    assert_same(&t, "16-byte load from two 8-byte stores");
}

/// Only vector loads besides GPR stores through an invariant base: a fixed-address region
/// whose vector loads call the helper (the count register is synced around each call).
fn fixed_with_vector_loads(a: &mut CodeAssembler) {
    let mut top = a.create_label();
    a.pxor(xmm1, xmm1).unwrap();
    a.set_label(&mut top).unwrap();
    a.mov(rax, qword_ptr(rdi)).unwrap();
    a.add(rax, rsi).unwrap();
    a.mov(qword_ptr(rdi), rax).unwrap();
    a.mov(qword_ptr(rdi + 8), rsi).unwrap();
    a.movdqu(xmm0, xmmword_ptr(rdi)).unwrap();
    a.paddq(xmm1, xmm0).unwrap();
    a.paddq(xmm1, xmmword_ptr(rdi + 16)).unwrap();
    a.dec(rsi).unwrap();
    a.jnz(top).unwrap();
    a.movdqu(xmmword_ptr(rdx), xmm1).unwrap();
    a.xor(eax, eax).unwrap();
    a.ret().unwrap();
}

#[test]
fn fixed_region_with_vector_loads() {
    let t = twin(&fixed_with_vector_loads, &first_store, permissive()).unwrap();
    assert!(
        t.plan.fixed_locations > 0,
        "GPR stores through an invariant base with only vector loads stay fixed"
    );
    assert_same(&t, "fixed region with vector loads");
}

/// A 16-byte store (to the buffer and to an rsp-based local), then 8-byte and 1-byte loads
/// inside it (the 1-byte one overlaps an 8-byte piece partially: flush, then memory), and a
/// 16-byte load of the local.
fn store_then_narrow_loads(a: &mut CodeAssembler) {
    let mut top = a.create_label();
    a.sub(rsp, 40).unwrap();
    a.xor(r8d, r8d).unwrap();
    a.movdqu(xmm3, xmmword_ptr(rdi + 64)).unwrap();
    a.movdqu(xmmword_ptr(rsp + 8), xmm3).unwrap();
    a.set_label(&mut top).unwrap();
    a.movq(xmm0, rsi).unwrap();
    a.punpcklqdq(xmm0, xmm0).unwrap();
    a.paddq(xmm0, xmmword_ptr(rdi)).unwrap();
    a.movdqu(xmmword_ptr(rdi + 16), xmm0).unwrap();
    a.mov(rax, qword_ptr(rdi + 24)).unwrap();
    a.add(r8, rax).unwrap();
    a.movzx(ecx, byte_ptr(rdi + 17)).unwrap();
    a.add(r8, rcx).unwrap();
    a.mov(qword_ptr(rdi), r8).unwrap();
    a.movdqu(xmm1, xmmword_ptr(rsp + 8)).unwrap();
    a.paddq(xmm1, xmm0).unwrap();
    a.movdqu(xmmword_ptr(rsp + 8), xmm1).unwrap();
    a.dec(rsi).unwrap();
    a.jnz(top).unwrap();
    a.movdqu(xmm1, xmmword_ptr(rsp + 8)).unwrap();
    a.movdqu(xmmword_ptr(rdx), xmm1).unwrap();
    a.mov(rax, r8).unwrap();
    a.add(rsp, 40).unwrap();
    a.ret().unwrap();
}

#[test]
fn sixteen_byte_store_then_eight_and_one_byte_loads() {
    let pcs = |base: u64, code: &[u8]| -> Vec<u64> {
        // Skip the prologue's store to the local.
        store_pcs(base, code).into_iter().skip(1).take(1).collect()
    };
    let t = twin(&store_then_narrow_loads, &pcs, permissive()).unwrap();
    assert!(t.plan.region.is_loop);
    assert_same(&t, "16-byte store then narrow loads");
}

/// 32-byte AVX store and load: `vmovdqu [m],ymm`, `vmovdqu ymm,[m]`, `vpaddq` with a memory
/// source, and an 8-byte load from the middle of the 32-byte store.
fn avx_round_trip(a: &mut CodeAssembler) {
    let mut top = a.create_label();
    a.vpxor(ymm3, ymm3, ymm3).unwrap();
    a.set_label(&mut top).unwrap();
    a.vmovq(xmm1, rsi).unwrap();
    a.vpbroadcastq(ymm1, xmm1).unwrap();
    a.vpaddq(ymm0, ymm1, ymmword_ptr(rdi)).unwrap();
    a.vmovdqu(ymmword_ptr(rdi + 32), ymm0).unwrap();
    a.vmovdqu(ymm2, ymmword_ptr(rdi + 32)).unwrap();
    a.vpxor(ymm3, ymm3, ymm2).unwrap();
    a.mov(rax, qword_ptr(rdi + 48)).unwrap();
    a.add(qword_ptr(rdi + 8), rax).unwrap();
    a.dec(rsi).unwrap();
    a.jnz(top).unwrap();
    a.vmovdqu(ymmword_ptr(rdx), ymm3).unwrap();
    a.vzeroupper().unwrap();
    a.xor(eax, eax).unwrap();
    a.ret().unwrap();
}

#[test]
fn thirty_two_byte_avx_store_and_load() {
    if !has_avx2() {
        eprintln!("skipped: no AVX2");
        return;
    }
    let t = twin(&avx_round_trip, &first_store, permissive()).unwrap();
    assert_same(&t, "32-byte AVX round trip");
}

/// An 8-byte store at +4, then a 16-byte load at +0: the load's first piece partially
/// overlaps the entry (flush, then memory). Also `ptest` with a memory source: its flags
/// must survive the sequence into `setz`.
fn partial_overlap(a: &mut CodeAssembler) {
    let mut top = a.create_label();
    a.xor(r8d, r8d).unwrap();
    a.pxor(xmm1, xmm1).unwrap();
    a.set_label(&mut top).unwrap();
    a.mov(qword_ptr(rdi + 4), rsi).unwrap();
    a.movdqu(xmm0, xmmword_ptr(rdi)).unwrap();
    a.paddq(xmm1, xmm0).unwrap();
    a.mov(byte_ptr(rdi + 32), sil).unwrap();
    a.ptest(xmm1, xmmword_ptr(rdi + 32)).unwrap();
    a.setz(al).unwrap();
    a.movzx(eax, al).unwrap();
    a.add(r8, rax).unwrap();
    a.dec(rsi).unwrap();
    a.jnz(top).unwrap();
    a.movdqu(xmmword_ptr(rdx), xmm1).unwrap();
    a.mov(rax, r8).unwrap();
    a.ret().unwrap();
}

#[test]
fn eight_byte_store_at_plus_four_then_sixteen_byte_load() {
    let t = twin(&partial_overlap, &first_store, permissive()).unwrap();
    assert_same(&t, "partial overlap");
}

/// Two threads at once, each on its own 64 bytes (GPR and vector stores buffered side by
/// side, flushed every 256 back-edges): the final bytes must match native runs.
#[test]
fn two_threads_adjacent_buffers_match_native() {
    let t = twin(&load_from_two_stores, &first_store, permissive()).unwrap();
    let go = |f: u64| -> Vec<u8> {
        let mut buf = seeded(512, 7);
        let p = buf.as_mut_ptr() as u64;
        let ready = std::sync::atomic::AtomicU32::new(0);
        std::thread::scope(|s| {
            for k in 0..2u64 {
                let ready = &ready;
                s.spawn(move || {
                    start_line(ready, 2);
                    let mut out = [0u8; 32];
                    fn3(f)(p + 64 * k, 5000 + k, out.as_mut_ptr() as u64);
                    out
                });
            }
        });
        buf
    };
    assert_eq!(go(t.native), go(t.repaired));
}

/// Fixed-address vector stores: a 16-byte `movups` and a 32-byte `vmovdqu` to fixed
/// locations, a 16-byte load of the first (forwarding from both piece slots) and GPR loads
/// inside both.
fn fixed_vector_stores(a: &mut CodeAssembler) {
    let mut top = a.create_label();
    a.xor(r8d, r8d).unwrap();
    a.vpxor(ymm3, ymm3, ymm3).unwrap();
    a.set_label(&mut top).unwrap();
    a.vmovq(xmm0, rsi).unwrap();
    a.vpaddq(xmm0, xmm0, xmmword_ptr(rdi)).unwrap();
    a.movups(xmmword_ptr(rdi), xmm0).unwrap();
    a.vmovdqu(xmm1, xmmword_ptr(rdi)).unwrap();
    a.vpaddq(ymm3, ymm3, ymm1).unwrap();
    a.vinserti128(ymm2, ymm1, xmm0, 1).unwrap();
    a.vmovdqu(ymmword_ptr(rdi + 64), ymm2).unwrap();
    a.add(r8, qword_ptr(rdi + 88)).unwrap();
    a.movzx(ecx, byte_ptr(rdi + 73)).unwrap();
    a.add(r8, rcx).unwrap();
    a.add(qword_ptr(rdi + 8), r8).unwrap();
    a.dec(rsi).unwrap();
    a.jnz(top).unwrap();
    a.vmovdqu(ymmword_ptr(rdx), ymm3).unwrap();
    a.vzeroupper().unwrap();
    a.mov(rax, r8).unwrap();
    a.ret().unwrap();
}

#[test]
fn fixed_region_with_vector_stores() {
    if !has_avx2() {
        eprintln!("skipped: no AVX2");
        return;
    }
    let t = twin(&fixed_vector_stores, &first_store, permissive()).unwrap();
    // movups: 2 pieces (the second shared with the RMW at +8), vmovdqu: 4.
    assert_eq!(t.plan.fixed_locations, 6);
    assert_same(&t, "fixed region with vector stores");
}

/// Vector accesses whose pieces cannot take the fast path (the instruction mentions rax and
/// the flags are live across it, so no flag save is possible): the helpers serve them.
fn helper_pieces(a: &mut CodeAssembler) {
    let mut top = a.create_label();
    let mut skip = a.create_label();
    a.xor(r8d, r8d).unwrap();
    a.set_label(&mut top).unwrap();
    a.mov(rax, rdi).unwrap();
    a.cmp(rsi, 5).unwrap();
    a.movdqu(xmm0, xmmword_ptr(rax)).unwrap();
    a.paddq(xmm0, xmm0).unwrap();
    a.movdqu(xmmword_ptr(rax + 16), xmm0).unwrap();
    a.jne(skip).unwrap();
    a.mov(qword_ptr(rdi + 40), rsi).unwrap();
    a.set_label(&mut skip).unwrap();
    a.mov(rcx, qword_ptr(rdi + 24)).unwrap();
    a.add(r8, rcx).unwrap();
    a.add(qword_ptr(rdi), rcx).unwrap();
    a.dec(rsi).unwrap();
    a.jnz(top).unwrap();
    a.mov(rax, r8).unwrap();
    a.ret().unwrap();
}

#[test]
fn vector_pieces_through_the_helpers() {
    let pcs = |base: u64, code: &[u8]| -> Vec<u64> {
        store_pcs(base, code).into_iter().take(1).collect()
    };
    let t = twin(&helper_pieces, &pcs, permissive()).unwrap();
    assert_eq!(t.plan.fixed_locations, 0, "rax moves: not a fixed region");
    assert_same(&t, "helper pieces");
}

/// A rip-relative 16-byte struct (a global, as in spinlock_tas): `movdqu` load, `paddq`,
/// `movups` store, an 8-byte load of its second half; the region is fixed (a global group).
fn global_struct(a: &mut CodeAssembler) {
    let mut top = a.create_label();
    let mut g = a.create_label();
    let mut g8 = a.create_label();
    a.movq(xmm1, rsi).unwrap();
    a.punpcklqdq(xmm1, xmm1).unwrap();
    a.set_label(&mut top).unwrap();
    a.movdqu(xmm0, xmmword_ptr(g)).unwrap();
    a.paddq(xmm0, xmm1).unwrap();
    a.movups(xmmword_ptr(g), xmm0).unwrap();
    a.mov(rax, qword_ptr(g8)).unwrap();
    a.add(qword_ptr(rdi), rax).unwrap();
    a.dec(rsi).unwrap();
    a.jnz(top).unwrap();
    a.movdqu(xmm0, xmmword_ptr(g)).unwrap();
    a.movdqu(xmmword_ptr(rdx), xmm0).unwrap();
    // Leave the global as it was, so each call starts from the same state.
    a.pxor(xmm0, xmm0).unwrap();
    a.movdqu(xmmword_ptr(g), xmm0).unwrap();
    a.xor(eax, eax).unwrap();
    a.ret().unwrap();
    a.set_label(&mut g).unwrap();
    a.dq(&[0]).unwrap();
    a.set_label(&mut g8).unwrap();
    a.dq(&[0]).unwrap();
}

#[test]
fn rip_relative_sixteen_byte_global() {
    let pcs = |base: u64, code: &[u8]| -> Vec<u64> {
        // The movups in the loop (the first explicit store).
        store_pcs(base, code).into_iter().take(1).collect()
    };
    let t = twin(&global_struct, &pcs, permissive()).unwrap();
    assert!(t.plan.region.is_loop);
    assert!(t.plan.fixed_locations >= 2, "{}", t.plan.fixed_locations);
    assert_same(&t, "rip-relative 16-byte global");
}

#[test]
fn helper_only_path_refuses_vector_operands() {
    let opts = PlanOptions {
        inline_fast_path: false,
        ..permissive()
    };
    let r = twin(&load_from_two_stores, &first_store, opts);
    match r {
        Err(e) => assert!(
            matches!(e.reason, RefusalReason::UnsupportedInstruction { .. }),
            "{e}"
        ),
        Ok(_) => panic!("vector operands need the state register"),
    }
}

/// `fn(s: *mut [u64; 2], n)`: n times `s[0] += 1; s[1] += 2` as one 16-byte load, add and
/// store: what gcc -O2 makes of two adjacent counter updates (heap_objects, spinlock_tas).
fn struct_update_loop(a: &mut CodeAssembler) {
    let mut top = a.create_label();
    a.mov(eax, 1).unwrap();
    a.movq(xmm1, rax).unwrap();
    a.mov(eax, 2).unwrap();
    a.movq(xmm2, rax).unwrap();
    a.punpcklqdq(xmm1, xmm2).unwrap();
    a.set_label(&mut top).unwrap();
    a.movdqu(xmm0, xmmword_ptr(rdi)).unwrap();
    a.paddq(xmm0, xmm1).unwrap();
    a.movdqu(xmmword_ptr(rdi), xmm0).unwrap();
    a.dec(rsi).unwrap();
    a.jnz(top).unwrap();
    a.ret().unwrap();
}

/// Two threads, two 16-byte structs `stride` bytes apart, each thread updating its own;
/// returns the wall time and both structs.
fn two_structs(f: u64, n: u64, stride: usize) -> (std::time::Duration, [[u64; 2]; 2]) {
    #[repr(align(64))]
    struct Lines([u64; 32]);
    let mut lines = Lines([0; 32]);
    let base = lines.0.as_mut_ptr() as u64;
    let ready = std::sync::atomic::AtomicU32::new(0);
    let start = std::time::Instant::now();
    std::thread::scope(|s| {
        for k in 0..2u64 {
            let ready = &ready;
            s.spawn(move || {
                start_line(ready, 2);
                fn2(f)(base + stride as u64 * k, n)
            });
        }
    });
    let el = start.elapsed();
    let w = stride / 8;
    (el, [[lines.0[0], lines.0[1]], [lines.0[w], lines.0[w + 1]]])
}

#[test]
fn false_shared_sixteen_byte_structs_count_exactly() {
    let t = twin(&struct_update_loop, &first_store, PlanOptions::default()).unwrap();
    // What `laser repair` accepts by default: a fixed region (one 16-byte store, 2 pieces).
    assert_eq!(t.plan.fixed_locations, 2);
    const N: u64 = 200_000;
    let (_, native) = two_structs(t.native, N, 16);
    let (_, repaired) = two_structs(t.repaired, N, 16);
    assert_eq!(native, [[N, 2 * N]; 2]);
    assert_eq!(
        repaired,
        [[N, 2 * N]; 2],
        "repaired loop lost or duplicated updates"
    );
}

/// Side-by-side ratios for the integrator: unpadded native, padded native, repaired.
#[test]
#[ignore = "benchmark: run on a quiet machine with --release --nocapture"]
fn bench_false_shared_sixteen_byte_structs() {
    let t = twin(&struct_update_loop, &first_store, PlanOptions::default()).unwrap();
    const N: u64 = 20_000_000;
    let best = |f: u64, stride: usize| {
        (0..3)
            .map(|_| two_structs(f, N, stride))
            .map(|(d, c)| {
                assert_eq!(c, [[N, 2 * N]; 2]);
                d.as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    };
    let native = best(t.native, 16);
    let padded = best(t.native, 128);
    let repaired = best(t.repaired, 16);
    let repaired_padded = best(t.repaired, 128);
    println!("2 threads x {N} 16-byte struct updates, best of 3:");
    println!("  native unpadded {native:.3}s, padded {padded:.3}s, repaired {repaired:.3}s");
    println!("  repaired on padded structs (the buffer's own cost) {repaired_padded:.3}s");
    println!(
        "  padding gain {:.2}x, repair gain {:.2}x",
        native / padded,
        native / repaired
    );
}

/// `fn(p: *mut u64, n)`: for i = 1..=n, `p[0..2] = (i, i)` with one `movdqu` store, then
/// the flag `p[8] = i` (another cache line).
fn wide_then_flag(a: &mut CodeAssembler) {
    let mut top = a.create_label();
    a.mov(ecx, 1).unwrap();
    a.set_label(&mut top).unwrap();
    a.movq(xmm0, rcx).unwrap();
    a.punpcklqdq(xmm0, xmm0).unwrap();
    a.movdqu(xmmword_ptr(rdi), xmm0).unwrap();
    a.mov(qword_ptr(rdi + 64), rcx).unwrap();
    a.add(rcx, 1).unwrap();
    a.cmp(rcx, rsi).unwrap();
    a.jbe(top).unwrap();
    a.ret().unwrap();
}

/// Message passing through a repaired wide store (TSO: stores become visible in program
/// order). A reader on another thread reads the flag, then the second word, then the first:
/// `flag <= hi <= lo` must hold in every sample, which a flush writing the pieces out of
/// order or after the flag would break.
#[test]
fn wide_store_pieces_and_flag_are_seen_in_order() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let t = twin(&wide_then_flag, &first_store, permissive()).unwrap();
    #[repr(align(64))]
    struct Lines([u64; 16]);
    let mut lines = Lines([0; 16]);
    let p = lines.0.as_mut_ptr() as u64;
    const N: u64 = 8_000_000;
    let done = AtomicBool::new(false);
    let ready = std::sync::atomic::AtomicU32::new(0);
    let (samples, bad) = std::thread::scope(|s| {
        let done = &done;
        let ready = &ready;
        let reader = s.spawn(move || {
            // SAFETY: `lines` outlives the scope; its words are 8-aligned and only accessed
            // atomically by this thread while the writer runs.
            let word = |k: u64| unsafe { AtomicU64::from_ptr((p + 8 * k) as *mut u64) };
            start_line(ready, 2);
            let (mut samples, mut bad) = (0u64, Vec::new());
            // At least one sample, however the threads are scheduled.
            loop {
                // ATOMICS: Acquire pairs with the writer's Release store of `done`.
                let last = done.load(Ordering::Acquire);
                // ATOMICS: Acquire loads in this order observe the writer's stores in its
                // program order (x86-TSO), which is what the test checks.
                let f = word(8).load(Ordering::Acquire);
                let hi = word(1).load(Ordering::Acquire);
                let lo = word(0).load(Ordering::Acquire);
                samples += 1;
                if !(f <= hi && hi <= lo) && bad.len() < 8 {
                    bad.push((f, hi, lo));
                }
                if last {
                    break;
                }
            }
            (samples, bad)
        });
        start_line(ready, 2);
        fn2(t.repaired)(p, N);
        // ATOMICS: Release pairs with the reader's Acquire: it stops after the writer.
        done.store(true, Ordering::Release);
        reader.join().unwrap()
    });
    assert_eq!(lines.0[0..2], [N, N]);
    assert_eq!(lines.0[8], N);
    assert!(samples > 0);
    assert!(
        bad.is_empty(),
        "reordered observations (flag, hi, lo): {bad:?}"
    );
}
