//! Executes rewritten code in-process and compares it with the native copy.

mod plan_support;

use iced_x86::code_asm::*;
use plan_support::*;
use std::time::Instant;

/// `fn(counter: *mut u64, n: u64)`: n times `*counter += 1` through a register, the
/// false-sharing loop of DESIGN.md.
fn counter_loop(a: &mut CodeAssembler) {
    let mut top = a.create_label();
    a.set_label(&mut top).unwrap();
    a.mov(rax, qword_ptr(rdi)).unwrap();
    a.add(rax, 1).unwrap();
    a.mov(qword_ptr(rdi), rax).unwrap();
    a.dec(rsi).unwrap();
    a.jnz(top).unwrap();
    a.ret().unwrap();
}

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
#[test]
fn false_sharing_loop_two_threads_exact_and_timed() {
    let t = twin(&counter_loop, &store_pcs, Default::default()).unwrap();
    const N: u64 = 2_000_000;
    let run = |f: u64| -> (std::time::Duration, [u64; 2]) {
        #[repr(align(64))]
        struct Line([u64; 8]);
        let line = Line([0; 8]);
        let base = line.0.as_ptr() as u64;
        let start = Instant::now();
        std::thread::scope(|s| {
            for k in 0..2u64 {
                s.spawn(move || fn2(f)(base + 8 * k, N));
            }
        });
        let el = start.elapsed();
        (el, [line.0[0], line.0[1]])
    };
    let (tn, cn) = run(t.native);
    let (tr, cr) = run(t.repaired);
    assert_eq!(cn, [N, N]);
    assert_eq!(cr, [N, N], "repaired loop lost or duplicated increments");
    println!(
        "false-sharing loop, 2 threads x {N}: native {:?}, repaired {:?}, speedup {:.2}x",
        tn,
        tr,
        tn.as_secs_f64() / tr.as_secs_f64()
    );
}
