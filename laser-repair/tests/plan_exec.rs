//! Executes rewritten code in-process and compares it with the native copy.

mod plan_support;

use iced_x86::code_asm::*;
use plan_support::*;
use std::time::Instant;

#[test]
fn counter_loop_single_thread_counts_exactly() {
    let t = twin(&counter_loop, &store_pcs, Default::default()).unwrap();
    assert!(t.plan.region.is_loop);
    assert_eq!(t.plan.patches.len(), 1);
    let mut c = [0u64; 2];
    fn2(t.native)(&mut c[0] as *mut u64 as u64, 1000);
    fn2(t.repaired)(&mut c[1] as *mut u64 as u64, 1000);
    assert_eq!(c, [1000, 1000]);
}

/// Two threads, two counters on one cache line:
/// ```text
///   line: | c[0] (thread A) | c[1] (thread B) | ... |
/// ```
/// Native, the line bounces on every store; repaired, once per flush.
/// Runs `f(counter_k, n)` on two threads started together, counters `stride` bytes apart;
/// returns the wall time and both counters.
fn two_counters(f: u64, n: u64, stride: u64) -> (std::time::Duration, [u64; 2]) {
    use std::sync::atomic::AtomicU32;
    #[repr(align(64))]
    struct Lines([u64; 32]);
    let mut lines = Lines([0; 32]);
    let base = lines.0.as_mut_ptr() as u64;
    let ready = AtomicU32::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for k in 0..2u64 {
            let ready = &ready;
            s.spawn(move || {
                start_line(ready, 2);
                fn2(f)(base + stride * k, n)
            });
        }
    });
    let el = start.elapsed();
    (el, [lines.0[0], lines.0[(stride / 8) as usize]])
}

#[test]
fn false_sharing_loop_two_threads_exact_and_timed() {
    let t = twin(&counter_loop, &store_pcs, Default::default()).unwrap();
    const N: u64 = 2_000_000;
    let (tn, cn) = two_counters(t.native, N, 8);
    let (tr, cr) = two_counters(t.repaired, N, 8);
    assert_eq!(cn, [N, N]);
    assert_eq!(cr, [N, N], "repaired loop lost or duplicated increments");
    println!(
        "false-sharing loop, 2 threads x {N}: native {:?}, repaired {:?}, speedup {:.2}x",
        tn,
        tr,
        tn.as_secs_f64() / tr.as_secs_f64()
    );
}

/// Side-by-side ratios for the integrator: unpadded native, padded native (the fix by
/// hand), repaired, and the single-thread cost of the repair. Prints only.
#[test]
#[ignore = "benchmark: run on a quiet machine with --nocapture"]
fn bench_false_sharing_ratios() {
    let t = twin(&counter_loop, &store_pcs, Default::default()).unwrap();
    const N: u64 = 50_000_000;
    let best = |f: u64, stride: u64| {
        (0..3)
            .map(|_| two_counters(f, N, stride))
            .map(|(d, c)| {
                assert_eq!(c, [N, N]);
                d.as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    };
    let native = best(t.native, 8);
    let padded = best(t.native, 128);
    let repaired = best(t.repaired, 8);
    let one = |f: u64| {
        let mut c = 0u64;
        let s = Instant::now();
        fn2(f)(&mut c as *mut u64 as u64, N);
        s.elapsed().as_secs_f64()
    };
    let (n1, r1) = (one(t.native), one(t.repaired));
    println!("2 threads x {N} increments, best of 3:");
    println!("  native unpadded {native:.3}s, padded {padded:.3}s, repaired {repaired:.3}s");
    println!(
        "  padding gain {:.2}x, repair gain {:.2}x, recovered {:.0}% of the padding gain",
        native / padded,
        native / repaired,
        100.0 * (native / repaired - 1.0) / (native / padded - 1.0).max(1e-9)
    );
    println!(
        "  single thread: native {n1:.3}s, repaired {r1:.3}s, cost {:.2}x",
        r1 / n1
    );
}

/// A loop exercising the rewriter: every size, RMW, sign/zero extension, partial-overlap
/// loads (forced flush), rsp-based locals, rip-relative loads and RMW, flags live across a
/// memory access, a high-byte register store, a locked RMW, a fence, `pause`, and a call
/// (region exit). `fn(buf: *mut u8, n: u64, out: *mut u64) -> u64`.
fn kernel(a: &mut CodeAssembler) {
    kernel_with(a, true)
}

/// The kernel without the call and without r11: r11 is then dead in the whole loop and
/// becomes the state register, so every access takes the inline fast path.
fn kernel_fast(a: &mut CodeAssembler) {
    kernel_with(a, false)
}

fn kernel_with(a: &mut CodeAssembler, with_call: bool) {
    let mut top = a.create_label();
    let mut skip = a.create_label();
    let mut global = a.create_label();
    let mut leaf = a.create_label();
    a.push(rbx).unwrap();
    a.push(rbp).unwrap();
    a.sub(rsp, 40).unwrap();
    a.xor(ebx, ebx).unwrap();
    a.mov(qword_ptr(rsp + 8), 0).unwrap();
    a.mov(rbp, rdx).unwrap();
    a.set_label(&mut top).unwrap();
    a.mov(rax, qword_ptr(rdi)).unwrap();
    a.add(rax, rsi).unwrap();
    a.mov(qword_ptr(rdi + 8), rax).unwrap();
    a.movzx(ecx, byte_ptr(rdi + 3)).unwrap();
    a.add(byte_ptr(rdi + 16), cl).unwrap();
    a.inc(dword_ptr(rdi + 20)).unwrap();
    a.mov(dx, word_ptr(rdi + 21)).unwrap(); // overlaps the 4-byte entry at +20: flush + load
    a.add(word_ptr(rdi + 24), dx).unwrap();
    a.movsx(r8, word_ptr(rdi + 24)).unwrap();
    a.xor(qword_ptr(rdi + 32), r8).unwrap();
    a.mov(qword_ptr(rsp + 8), rax).unwrap();
    a.add(rbx, qword_ptr(rsp + 8)).unwrap();
    a.mov(eax, dword_ptr(rdi + 8)).unwrap(); // narrower than the 8-byte entry: flush + load
    a.add(rbx, rax).unwrap();
    a.cmp(rsi, 3).unwrap(); // flags set here ...
    a.mov(r9, qword_ptr(rdi + 40)).unwrap(); // ... survive this rewritten load ...
    a.jne(skip).unwrap(); // ... and are used here
    a.mov(byte_ptr(rdi + 48), 7).unwrap();
    a.set_label(&mut skip).unwrap();
    a.add(r9, 1).unwrap();
    a.mov(qword_ptr(rdi + 40), r9).unwrap();
    a.mov(eax, esi).unwrap();
    a.mov(byte_ptr(rdi + 49), ah).unwrap(); // scratch must be a legacy byte register
    let g = if with_call { r11 } else { r10 };
    a.mov(g, qword_ptr(global)).unwrap(); // rip-relative load
    a.add(rbx, g).unwrap();
    a.add(qword_ptr(global), rsi).unwrap(); // rip-relative RMW
    a.lock().add(qword_ptr(rdi + 56), 1).unwrap(); // flush point
    a.mov(r10, qword_ptr(rdi + 56)).unwrap();
    a.add(rbx, r10).unwrap();
    a.mfence().unwrap();
    a.imul_3(r10, qword_ptr(rdi + 8), 3).unwrap();
    a.sub(qword_ptr(rdi + 64), r10).unwrap();
    a.cmp(qword_ptr(rdi + 64), rbx).unwrap();
    a.setb(byte_ptr(rdi + 50)).unwrap();
    if with_call {
        a.call(leaf).unwrap(); // region exit: the rest of this iteration runs natively
    }
    a.pause().unwrap();
    a.dec(rsi).unwrap();
    a.jnz(top).unwrap();
    a.mov(qword_ptr(rbp), rbx).unwrap();
    a.mov(rax, qword_ptr(global)).unwrap();
    a.add(rsp, 40).unwrap();
    a.pop(rbp).unwrap();
    a.pop(rbx).unwrap();
    a.ret().unwrap();
    a.set_label(&mut leaf).unwrap();
    a.add(qword_ptr(rdi + 72), 5).unwrap();
    a.ret().unwrap();
    a.set_label(&mut global).unwrap();
    a.dq(&[11]).unwrap();
}

/// PCs inside the loop (the block after the prologue): the first store.
fn kernel_pcs(base: u64, code: &[u8]) -> Vec<u64> {
    store_pcs(base, code).into_iter().skip(1).take(1).collect()
}

fn run_kernel(f: u64, buf: &mut [u8], n: u64) -> (u64, u64) {
    let mut out = 0u64;
    let r = fn3(f)(buf.as_mut_ptr() as u64, n, &mut out as *mut u64 as u64);
    (r, out)
}

#[test]
fn kernel_same_memory_single_thread() {
    // The function is placed twice; the code bytes include the rip-relative global, so each
    // copy has its own global and the returned global must match.
    let t = twin(&kernel, &kernel_pcs, permissive()).unwrap();
    assert!(t.plan.region.is_loop);
    assert!(t.plan.region.stores >= 8, "{:?}", t.plan.region);
    for (seed, n) in [(1u64, 1u64), (2, 3), (3, 17), (4, 1000)] {
        let mut a = seeded(128, seed);
        let mut b = a.clone();
        let ra = run_kernel(t.native, &mut a, n);
        let rb = run_kernel(t.repaired, &mut b, n);
        assert_eq!(a, b, "final memory differs (seed {seed}, n {n})");
        assert_eq!(ra, rb, "return/out differ (seed {seed}, n {n})");
    }
}

#[test]
fn kernel_fast_path_same_memory_single_thread() {
    let t = twin(&kernel_fast, &kernel_pcs, permissive()).unwrap();
    assert_eq!(t.plan.state_register, Some(iced_x86::Register::R11));
    for (seed, n) in [(1u64, 1u64), (2, 3), (3, 17), (4, 1000)] {
        let mut a = seeded(128, seed);
        let mut b = a.clone();
        let ra = run_kernel(t.native, &mut a, n);
        let rb = run_kernel(t.repaired, &mut b, n);
        assert_eq!(a, b, "final memory differs (seed {seed}, n {n})");
        assert_eq!(ra, rb, "return/out differ (seed {seed}, n {n})");
    }
}

#[test]
fn kernel_fast_path_two_threads_tiny_log_one_slot() {
    use laser_repair::plan::{PlanOptions, RuntimeConfig};
    for slots in [1u32, 4] {
        let opts = PlanOptions {
            runtime: RuntimeConfig {
                thread_slots: slots,
                log_capacity: 2,
                backedges_per_flush: 1,
                rtm_retries: 1,
                ..RuntimeConfig::default()
            },
            min_stores_per_flush: 0.0,
            ..PlanOptions::default()
        };
        let t = twin(&kernel_fast, &kernel_pcs, opts).unwrap();
        assert!(t.plan.state_register.is_some());
        let go = |f: u64| -> Vec<u8> {
            let mut buf = seeded(256, 5);
            let p = buf.as_mut_ptr() as u64;
            // Both threads alive at once, so they have distinct thread pointers.
            let barrier = std::sync::Barrier::new(2);
            std::thread::scope(|s| {
                for k in 0..2u64 {
                    let barrier = &barrier;
                    s.spawn(move || {
                        barrier.wait();
                        let mut out = 0u64;
                        let r = fn3(f)(p + 128 * k, 300 + 7 * k, &mut out as *mut u64 as u64);
                        barrier.wait();
                        r
                    });
                }
            });
            buf
        };
        assert_eq!(go(t.native), go(t.repaired), "{slots} slots");
        let words = t.area.bytes(t.plan.runtime.no_slot_addr, 8);
        let bypassed = u64::from_le_bytes(words.try_into().unwrap());
        if slots == 1 {
            assert!(
                bypassed > 0,
                "with one slot, one thread must run the native copy"
            );
        }
    }
}

#[test]
fn kernel_same_memory_two_threads_adjacent_buffers() {
    let t = twin(&kernel, &kernel_pcs, permissive()).unwrap();
    // Two buffers 128 bytes apart; each thread writes only its own, so results are
    // deterministic even though the lines are shared with the neighbour's padding.
    let go = |f: u64| -> Vec<u8> {
        let mut buf = seeded(256, 9);
        let p = buf.as_mut_ptr() as u64;
        std::thread::scope(|s| {
            for k in 0..2u64 {
                s.spawn(move || {
                    let mut out = 0u64;
                    fn3(f)(p + 128 * k, 500 + k, &mut out as *mut u64 as u64)
                });
            }
        });
        buf
    };
    assert_eq!(go(t.native), go(t.repaired));
}

/// The rare paths: a 2-entry log (full-log flushes on every third distinct store), a flush
/// on every back-edge, and a single thread slot so the second thread finds no slot and
/// bypasses the SSB. Results must still equal native.
#[test]
fn kernel_same_memory_tiny_log_one_slot() {
    use laser_repair::plan::{PlanOptions, RuntimeConfig};
    let opts = PlanOptions {
        runtime: RuntimeConfig {
            thread_slots: 1,
            log_capacity: 2,
            backedges_per_flush: 1,
            rtm_retries: 1,
            ..RuntimeConfig::default()
        },
        min_stores_per_flush: 0.0,
        inline_fast_path: false,
        ..PlanOptions::default()
    };
    let t = twin(&kernel, &kernel_pcs, opts).unwrap();
    let go = |f: u64| -> Vec<u8> {
        let mut buf = seeded(256, 5);
        let p = buf.as_mut_ptr() as u64;
        // Both threads alive at once: distinct thread pointers (glibc reuses a finished
        // thread's TCB, which would legitimately hand the slot to the next thread).
        let barrier = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            for k in 0..2u64 {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let mut out = 0u64;
                    let r = fn3(f)(p + 128 * k, 300 + 7 * k, &mut out as *mut u64 as u64);
                    barrier.wait();
                    r
                });
            }
        });
        buf
    };
    assert_eq!(go(t.native), go(t.repaired));
    // One thread claimed the only slot; the other's accesses were counted as bypasses.
    let words = t.area.bytes(t.plan.runtime.no_slot_addr, 8);
    let bypassed = u64::from_le_bytes(words.try_into().unwrap());
    assert!(bypassed > 0, "second thread should have bypassed the SSB");
}

#[test]
fn fast_path_is_used_where_a_register_is_free() {
    let t = twin(&counter_loop, &store_pcs, Default::default()).unwrap();
    assert!(
        t.plan.state_register.is_some(),
        "counter loop leaves many registers free"
    );
    let t = twin(&kernel, &kernel_pcs, permissive()).unwrap();
    println!("kernel state register: {:?}", t.plan.state_register);
}

/// The helper-only path (no state register) on the same kernel.
#[test]
fn kernel_same_memory_helper_path() {
    use laser_repair::plan::PlanOptions;
    let opts = PlanOptions {
        inline_fast_path: false,
        ..permissive()
    };
    let t = twin(&kernel, &kernel_pcs, opts).unwrap();
    assert_eq!(t.plan.state_register, None);
    for (seed, n) in [(1u64, 1u64), (4, 1000)] {
        let mut a = seeded(128, seed);
        let mut b = a.clone();
        assert_eq!(
            run_kernel(t.native, &mut a, n),
            run_kernel(t.repaired, &mut b, n)
        );
        assert_eq!(a, b, "final memory differs (seed {seed}, n {n})");
    }
}

/// Prints the rewritten counter loop (run with --nocapture to read it).
#[test]
fn dump_counter_loop_rewrite() {
    let t = twin(&counter_loop, &store_pcs, Default::default()).unwrap();
    let region_start = t.plan.pc_map.iter().map(|p| p.1).min().unwrap();
    let code = &t.plan.cache.code;
    let off = (t.plan.runtime.code_len as usize).div_ceil(16) * 16;
    let mut n = 0;
    for i in iced_x86::Decoder::with_ip(64, &code[off..], t.plan.cache.code_addr + off as u64, 0) {
        println!("{:#x} {}", i.ip(), i);
        n += 1;
    }
    println!("entry trampolines from {region_start:#x}; {n} instructions");
    assert!(n > 0);
}

// `__cpuid` became a safe fn in recent Rust; the unsafe block keeps older toolchains building.
#[allow(unused_unsafe)]
fn cpu_has_rtm() -> bool {
    // SAFETY: cpuid is always available on x86-64; leaf 7 is checked against the max leaf.
    let max = unsafe { std::arch::x86_64::__cpuid(0) }.eax;
    if max < 7 {
        return false;
    }
    // SAFETY: as above.
    let l7 = unsafe { std::arch::x86_64::__cpuid_count(7, 0) };
    // RTM, and not RTM_ALWAYS_ABORT.
    l7.ebx & (1 << 11) != 0 && l7.edx & (1 << 11) == 0
}

fn mode_of(t: &Twin) -> laser_repair::plan::SsbMode {
    let w = t.area.bytes(t.plan.runtime.mode_addr, 8);
    laser_repair::plan::SsbMode::from_word(u64::from_le_bytes(w.try_into().unwrap()))
}

/// The runtime probes CPUID when the first thread claims a slot and exposes its choice.
#[test]
fn runtime_reports_the_flush_path_cpuid_allows() {
    use laser_repair::plan::SsbMode;
    let t = twin(&counter_loop, &store_pcs, Default::default()).unwrap();
    assert_eq!(mode_of(&t), SsbMode::NotYetProbed);
    let mut c = 0u64;
    fn2(t.repaired)(&mut c as *mut u64 as u64, 10);
    assert_eq!(c, 10);
    let want = if cpu_has_rtm() {
        SsbMode::Rtm
    } else {
        SsbMode::Fifo
    };
    assert_eq!(mode_of(&t), want);
}

/// Where RTM exists, flushes run inside transactions; results must not change.
#[test]
#[ignore = "needs RTM"]
fn rtm_flush_path_same_results() {
    assert!(cpu_has_rtm(), "this test needs a CPU with RTM enabled");
    let t = twin(&kernel_fast, &kernel_pcs, permissive()).unwrap();
    let mut a = seeded(128, 3);
    let mut b = a.clone();
    assert_eq!(
        run_kernel(t.native, &mut a, 1000),
        run_kernel(t.repaired, &mut b, 1000)
    );
    assert_eq!(a, b);
    assert_eq!(mode_of(&t), laser_repair::plan::SsbMode::Rtm);
}

/// `W x=1; W y=1; W x=2; spin until *z != 0; ret` — while the thread spins inside the region,
/// look at its log from outside:
/// ```text
///   log: [x=1] [y=1] [x=2]     memory: x=0 y=0   (nothing visible yet)
/// ```
/// The third store must not merge into the first entry (only into the tail, which is `y`):
/// merging would let another thread see x=2 before y=1. After the spin ends, the exit flush
/// makes x=2, y=1 visible.
fn buffered_then_spin(a: &mut CodeAssembler) {
    let mut spin = a.create_label();
    a.mov(qword_ptr(rdi), 1).unwrap();
    a.mov(qword_ptr(rsi), 1).unwrap();
    a.mov(qword_ptr(rdi), 2).unwrap();
    a.set_label(&mut spin).unwrap();
    a.cmp(qword_ptr(rdx), 0).unwrap();
    a.je(spin).unwrap();
    a.ret().unwrap();
}

fn log_of_spinning_thread(merge_any_entry_broken: bool) -> (Vec<[u64; 3]>, [u64; 2], [u64; 2]) {
    use laser_repair::plan::{PlanOptions, RuntimeConfig};
    use std::time::Duration;
    let opts = PlanOptions {
        runtime: RuntimeConfig {
            backedges_per_flush: 1 << 30,
            merge_any_entry_broken,
            ..RuntimeConfig::default()
        },
        min_stores_per_flush: 0.0,
        ..PlanOptions::default()
    };
    // Region = the stores' block plus the spin loop.
    let pcs = |base: u64, code: &[u8]| -> Vec<u64> {
        let ips: Vec<u64> = iced_x86::Decoder::with_ip(64, code, base, 0)
            .into_iter()
            .map(|i| i.ip())
            .collect();
        vec![ips[0], ips[3]]
    };
    let t = twin(&buffered_then_spin, &pcs, opts).unwrap();
    let rt = t.plan.runtime.clone();
    // Atomics only so that raw-pointer writes from the rewritten code are allowed; the
    // accesses under test are the plain ones inside the region.
    let mem: [std::sync::atomic::AtomicU64; 3] = Default::default();
    let (xa, ya, za) = (
        mem[0].as_ptr() as u64,
        mem[1].as_ptr() as u64,
        mem[2].as_ptr() as u64,
    );
    // SAFETY: reads of plain u64s another thread may be writing; volatile so each poll
    // really reads memory. The values are only compared, never trusted as references.
    let rd = |addr: u64| unsafe { std::ptr::read_volatile(addr as *const u64) };
    let entries = |st: u64| (0..64u64).take_while(|n| rd(st + 64 + 32 * n) != 0).count() as u64;
    let (log, before) = std::thread::scope(|s| {
        let f = t.repaired;
        s.spawn(move || fn3(f)(xa, ya, za));
        // Find the slot the thread claimed and wait for its three stores.
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut state = None;
        while Instant::now() < deadline {
            state = (0..rt.config.thread_slots)
                .find(|&k| rd(rt.keys_addr + 8 * u64::from(k)) != 0)
                .map(|k| rt.state_addr(k));
            if let Some(st) = state {
                // Three log entries (inline appends), or three stores counted by the helper
                // (the mutation routes every store there). Entries are counted by their
                // address fields (a fresh state is zero-filled): a fixed region keeps the
                // count in a register while it runs.
                if entries(st) >= 3 || rd(st + 24) >= 3 {
                    break;
                }
            }
            std::thread::yield_now();
        }
        let st = state.expect("thread never claimed a slot");
        let count = entries(st);
        let log: Vec<[u64; 3]> = (0..count.min(64))
            .map(|n| st + 64 + 32 * n)
            .map(|e| [rd(e), rd(e + 8), rd(e + 16)])
            .collect();
        let before = [rd(xa), rd(ya)];
        // SAFETY: the spinning thread only reads z; this plain write releases it.
        unsafe { std::ptr::write_volatile(za as *mut u64, 1) };
        (log, before)
    });
    // The scope joined the thread: its exit flush is done.
    (log, before, [rd(xa), rd(ya)])
}

#[test]
fn store_buffer_keeps_program_order_and_merges_only_into_tail() {
    let (log, before, after) = log_of_spinning_thread(false);
    let (x, y) = (
        log.first().map(|e| e[0]).unwrap_or(0),
        log.get(1).map(|e| e[0]).unwrap_or(0),
    );
    assert_eq!(
        log,
        vec![[x, 8, 1], [y, 8, 1], [x, 8, 2]],
        "log must be x=1, y=1, x=2 in order"
    );
    assert_eq!(
        before,
        [0, 0],
        "buffered stores became visible before the flush"
    );
    assert_eq!(after, [2, 1]);
}

/// The same check catches the TSO-breaking mutation (merge into an older entry).
#[test]
fn store_buffer_check_detects_merge_into_older_entry() {
    let (log, _, after) = log_of_spinning_thread(true);
    assert_eq!(
        log.len(),
        2,
        "broken merge should have folded x=2 into the first entry: {log:?}"
    );
    assert_eq!(log[0][2], 2);
    assert_eq!(after, [2, 1]);
}

/// Undo safe points: every key is an instruction start in the cache; sequence starts map to
/// stubs that flush, restore the state register and continue at the original instruction.
#[test]
fn undo_map_points_and_stub_run() {
    let t = twin(&counter_loop, &store_pcs, Default::default()).unwrap();
    let p = &t.plan;
    let cache_end = p.cache.code_addr + p.cache.code.len() as u64;
    let starts: std::collections::HashSet<u64> =
        iced_x86::Decoder::with_ip(64, &p.cache.code, p.cache.code_addr, 0)
            .into_iter()
            .map(|i| i.ip())
            .collect();
    let (f_start, f_end) = p.function;
    for &(from, to) in &p.undo_map {
        assert!(
            starts.contains(&from),
            "{from:#x} is not an instruction start"
        );
        assert!(
            (to >= p.cache.code_addr && to < cache_end) || (to >= f_start && to < f_end),
            "{to:#x} goes nowhere known"
        );
    }
    // Every original instruction has a sequence-start safe point, plus (fast path) one at its
    // trampoline and one in the uninstrumented copy.
    assert!(p.state_register.is_some());
    assert_eq!(p.undo_map.len(), 3 * p.pc_map.len());
    // The uninstrumented copy (where slot-less threads run) is a working loop on its own:
    // its first instruction maps back to the loop's first original instruction.
    let trampoline = p.map_pc(t.repaired).unwrap();
    let native = p
        .undo_map
        .iter()
        .find(|&&(from, to)| to == t.repaired && from != trampoline)
        .map(|&(from, _)| from)
        .unwrap();
    let mut c = 0u64;
    fn2(native)(&mut c as *mut u64 as u64, 5);
    assert_eq!(c, 5);
}

/// A thread stopped inside the region continues at `map_pc(pc)`: entering the counter loop at
/// its top or at `dec rsi` through the pc map (fast path: through the entry trampoline that
/// sets the state register) must do exactly what the original does from there.
#[test]
fn pc_map_entries_continue_like_the_original() {
    use laser_repair::plan::PlanOptions;
    for fast in [true, false] {
        let opts = PlanOptions {
            inline_fast_path: fast,
            ..PlanOptions::default()
        };
        let t = twin(&counter_loop, &store_pcs, opts).unwrap();
        let insns: Vec<u64> =
            iced_x86::Decoder::with_ip(64, t.area.bytes(t.native, t.len), t.native, 0)
                .into_iter()
                .map(|i| i.ip())
                .collect();
        // Instruction 0 is `mov rax,[rdi]`, 3 is `dec rsi`: nothing live but rdi and rsi.
        for k in [0usize, 3] {
            let native_pc = insns[k];
            let old_pc = t.repaired + (native_pc - t.native);
            let new_pc = t
                .plan
                .map_pc(old_pc)
                .expect("region instruction in the pc map");
            let (mut a, mut b) = (0u64, 0u64);
            fn2(native_pc)(&mut a as *mut u64 as u64, 50);
            fn2(new_pc)(&mut b as *mut u64 as u64, 50);
            assert_eq!(a, b, "entry at instruction {k}, fast path {fast}");
            assert_eq!(a, if k == 0 { 50 } else { 49 });
        }
    }
}

/// Forwarding must give exactly what memory would: a 4-byte store from a register with
/// dirty upper bits, then a 4-byte load of the same address, must zero-extend; narrower
/// and overlapping loads see the right bytes.
#[test]
fn forwarding_respects_sizes_and_zero_extension() {
    fn body(a: &mut CodeAssembler) {
        let mut top = a.create_label();
        a.mov(rax, 0xdead_beef_0000_0000u64 | 0x1234_5678).unwrap();
        a.mov(rcx, -1i64).unwrap();
        a.mov(rdx, -1i64).unwrap();
        a.set_label(&mut top).unwrap();
        a.mov(dword_ptr(rdi), eax).unwrap(); // store 4 (rax has dirty upper bits)
        a.mov(ecx, dword_ptr(rdi)).unwrap(); // forwarded: must be zero-extended
        a.mov(qword_ptr(rdi + 8), rcx).unwrap();
        a.mov(word_ptr(rdi + 16), ax).unwrap();
        a.movzx(edx, byte_ptr(rdi + 17)).unwrap(); // overlaps the 2-byte entry: flush + load
        a.mov(qword_ptr(rdi + 24), rdx).unwrap();
        a.mov(r8, qword_ptr(rdi)).unwrap(); // 8-byte load over a 4-byte entry
        a.mov(qword_ptr(rdi + 32), r8).unwrap();
        a.dec(rsi).unwrap();
        a.jnz(top).unwrap();
        a.ret().unwrap();
    }
    for fast in [true, false] {
        let opts = laser_repair::plan::PlanOptions {
            inline_fast_path: fast,
            ..permissive()
        };
        let t = twin(
            &body,
            &|b, c| store_pcs(b, c).into_iter().take(1).collect(),
            opts,
        )
        .unwrap();
        assert_eq!(t.plan.state_register.is_some(), fast);
        let (mut x, mut y) = ([0xffu8; 48], [0xffu8; 48]);
        fn2(t.native)(x.as_mut_ptr() as u64, 3);
        fn2(t.repaired)(y.as_mut_ptr() as u64, 3);
        assert_eq!(x, y, "fast path {fast}");
        assert_eq!(
            u64::from_le_bytes(x[8..16].try_into().unwrap()),
            0x1234_5678
        );
    }
}

/// Callers may keep values in registers the callee never writes (gcc `-fipa-ra`, hand-written
/// asm). The state register (r11 here) must come back unchanged from a repaired function.
#[test]
fn state_register_is_restored_for_the_caller() {
    let t = twin(&counter_loop, &store_pcs, Default::default()).unwrap();
    assert_eq!(t.plan.state_register, Some(iced_x86::Register::R11));
    // wrapper(counter, n, f): r11 = magic; f(counter, n); return r11.
    let wrapper = t.area.base + 0x20_0000;
    place(&t.area, wrapper, &|a| {
        a.push(rbx).unwrap();
        a.mov(r11, 0x0bad_cafe_dead_beefu64).unwrap();
        a.call(rdx).unwrap();
        a.mov(rax, r11).unwrap();
        a.pop(rbx).unwrap();
        a.ret().unwrap();
    });
    for f in [t.native, t.repaired] {
        let mut c = 0u64;
        let r = fn3(wrapper)(&mut c as *mut u64 as u64, 7, f);
        assert_eq!(r, 0x0bad_cafe_dead_beef, "r11 clobbered by {f:#x}");
        assert_eq!(c, 7);
    }
    // A region that leaves through its own `ret`.
    let body = twin(
        &|a| {
            a.mov(qword_ptr(rdi), rsi).unwrap();
            a.mov(qword_ptr(rdi + 8), rsi).unwrap();
            a.ret().unwrap();
        },
        &|b, _| vec![b],
        permissive(),
    )
    .unwrap();
    assert_eq!(body.plan.state_register, Some(iced_x86::Register::R11));
    let wrapper2 = body.area.base + 0x20_0000;
    place(&body.area, wrapper2, &|a| {
        a.mov(r11, 0x0bad_cafe_dead_beefu64).unwrap();
        a.call(rdx).unwrap();
        a.mov(rax, r11).unwrap();
        a.ret().unwrap();
    });
    let mut m = [0u64; 2];
    let r = fn3(wrapper2)(m.as_mut_ptr() as u64, 9, body.repaired);
    assert_eq!((r, m), (0x0bad_cafe_dead_beef, [9, 9]));
}

/// Scratch registers are chosen by liveness, and at calls and returns every register counts
/// as live: a repaired function must leave every register it does not itself write intact.
#[test]
fn untouched_registers_survive_a_repaired_call() {
    type Fn4 = extern "C" fn(u64, u64, u64, u64) -> u64;
    let t = twin(&counter_loop, &store_pcs, Default::default()).unwrap();
    // wrapper(counter, n, f, out): set rbx rcx rbp r8..r15 to known values, call f, store them.
    let wrapper = t.area.base + 0x20_0000;
    let kept = [rbx, rcx, rbp, r8, r9, r10, r11, r12, r13, r14, r15];
    place(&t.area, wrapper, &|a| {
        for r in [rbx, rbp, r12, r13, r14, r15] {
            a.push(r).unwrap();
        }
        a.push(rcx).unwrap();
        a.sub(rsp, 8).unwrap(); // keep rsp 16-byte aligned at the call
        for (k, &r) in kept.iter().enumerate() {
            a.mov(r, 0x1111_1111_1111_1111u64 * (k as u64 + 1)).unwrap();
        }
        a.call(rdx).unwrap();
        a.add(rsp, 8).unwrap();
        a.pop(rax).unwrap();
        for (k, &r) in kept.iter().enumerate() {
            a.mov(qword_ptr(rax + 8 * k as i32), r).unwrap();
        }
        for r in [r15, r14, r13, r12, rbp, rbx] {
            a.pop(r).unwrap();
        }
        a.ret().unwrap();
    });
    // SAFETY: `wrapper` is the SysV function just assembled, 4 args.
    let w = unsafe { std::mem::transmute::<usize, Fn4>(wrapper as usize) };
    for f in [t.native, t.repaired] {
        let (mut c, mut out) = (0u64, [0u64; 11]);
        w(&mut c as *mut u64 as u64, 9, f, out.as_mut_ptr() as u64);
        let want: Vec<u64> = (1..=11).map(|k| 0x1111_1111_1111_1111u64 * k).collect();
        assert_eq!(out.to_vec(), want, "registers clobbered by {f:#x}");
        assert_eq!(c, 9);
    }
}

/// `fn(p, n)`: n times `g += 1` on a global next to the code (rip-relative) and `*p += g`;
/// returns g. Two store groups, one of them rip-relative; with `p = &g` they are the same
/// bytes, so each group's loads must see the other's buffered stores.
fn global_and_pointer(a: &mut CodeAssembler) {
    let mut top = a.create_label();
    let mut g = a.create_label();
    // The global first (jumped over), so no data bytes follow the loop's exit.
    a.jmp(top).unwrap();
    a.set_label(&mut g).unwrap();
    a.dq(&[0]).unwrap();
    a.set_label(&mut top).unwrap();
    a.mov(rax, qword_ptr(g)).unwrap();
    a.add(rax, 1).unwrap();
    a.mov(qword_ptr(g), rax).unwrap();
    a.mov(rcx, qword_ptr(rdi)).unwrap();
    a.add(rcx, rax).unwrap();
    a.mov(qword_ptr(rdi), rcx).unwrap();
    a.dec(rsi).unwrap();
    a.jnz(top).unwrap();
    a.mov(rax, qword_ptr(g)).unwrap();
    a.ret().unwrap();
}

#[test]
fn rip_relative_global_group_matches_native_even_aliased() {
    // The loop's two `mov` stores (the global's zero bytes decode as `add [rax],al`).
    let pcs = |base: u64, code: &[u8]| -> Vec<u64> {
        iced_x86::Decoder::with_ip(64, code, base, 0)
            .into_iter()
            .filter(|i| i.mnemonic() == iced_x86::Mnemonic::Mov)
            .filter(|i| i.op0_kind() == iced_x86::OpKind::Memory)
            .map(|i| i.ip())
            .collect()
    };
    let t = twin(&global_and_pointer, &pcs, permissive()).unwrap();
    assert_eq!(t.plan.fixed_locations, 2, "a global and a pointer location");
    // The global: right after the first instruction (the jmp over it).
    let first = iced_x86::Decoder::with_ip(64, t.area.bytes(t.native, 16), t.native, 0).decode();
    let g_off = first.len() as u64;
    let (gn, gr) = (t.native + g_off, t.repaired + g_off);
    let mut c = [0u64; 2];
    let rn = fn2(t.native)(&mut c[0] as *mut u64 as u64, 1000);
    let rr = fn2(t.repaired)(&mut c[1] as *mut u64 as u64, 1000);
    assert_eq!((rn, c[0]), (rr, c[1]), "separate bytes");
    // Aliased: p points at the global itself.
    let rn = fn2(t.native)(gn, 700);
    let rr = fn2(t.repaired)(gr, 700);
    assert_eq!(rn, rr, "aliased global and pointer");
    assert_eq!(t.area.bytes(gn, 8), t.area.bytes(gr, 8));
}

/// The flush lock keeps results exact: two threads, the false-sharing counter loop, a
/// flush every 7 back-edges taking the lock.
#[test]
fn flush_lock_keeps_counts_exact() {
    use laser_repair::plan::{PlanOptions, RuntimeConfig};
    let opts = PlanOptions {
        runtime: RuntimeConfig {
            flush_lock: true,
            backedges_per_flush: 7,
            ..RuntimeConfig::default()
        },
        ..PlanOptions::default()
    };
    let t = twin(&counter_loop, &store_pcs, opts).unwrap();
    const N: u64 = 300_000;
    let (_, c) = two_counters(t.repaired, N, 8);
    assert_eq!(c, [N, N]);
}
