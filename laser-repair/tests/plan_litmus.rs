//! x86-TSO litmus tests on thread bodies rewritten onto the SSB (LITMUS.md).
//!
//! Each body is `fn(x: *mut u64, y: *mut u64, out: *mut u64)`, straight-line code ending in
//! `ret`; the plan rewrites the whole body, so every load and store goes through the SSB and
//! the log is flushed at the `ret`. Iteration `i` uses fresh `x`, `y` (one line per
//! iteration) so no reset races with the other thread; the two threads run each iteration in
//! lockstep (each publishes `i`, then waits for the other to reach `i`).

mod plan_support;

use iced_x86::code_asm::*;
use laser_repair::plan::{PlanOptions, RuntimeConfig};
use plan_support::*;
use std::sync::atomic::{AtomicU64, Ordering};

type Body = fn(&mut CodeAssembler);
/// (out of P0, out of P1, final x, final y) -> does the outcome match?
type Outcome = fn([u64; 2], [u64; 2], u64, u64) -> bool;

fn st(a: &mut CodeAssembler, p: AsmRegister64, v: i32) {
    a.mov(qword_ptr(p), v).unwrap();
}

/// out[k] = [p]
fn ld(a: &mut CodeAssembler, p: AsmRegister64, k: i32) {
    a.mov(rax, qword_ptr(p)).unwrap();
    a.mov(qword_ptr(rdx + 8 * k), rax).unwrap();
}

struct Litmus {
    name: &'static str,
    p0: Body,
    p1: Body,
    /// (out0, out1, final x, final y) -> forbidden?
    forbidden: Outcome,
    /// The relaxed outcome that must stay reachable (printed, not asserted: timing-dependent).
    relaxed: Option<Outcome>,
}

fn tests() -> Vec<Litmus> {
    vec![
        Litmus {
            name: "MP",
            p0: |a| {
                st(a, rdi, 1);
                st(a, rsi, 1);
                a.ret().unwrap();
            },
            p1: |a| {
                ld(a, rsi, 0);
                ld(a, rdi, 1);
                a.ret().unwrap();
            },
            forbidden: |_, o1, _, _| o1 == [1, 0],
            relaxed: None,
        },
        Litmus {
            name: "SB",
            p0: |a| {
                st(a, rdi, 1);
                ld(a, rsi, 0);
                a.ret().unwrap();
            },
            p1: |a| {
                st(a, rsi, 1);
                ld(a, rdi, 0);
                a.ret().unwrap();
            },
            forbidden: |_, _, _, _| false,
            relaxed: Some(|o0, o1, _, _| o0[0] == 0 && o1[0] == 0),
        },
        Litmus {
            name: "2+2W",
            p0: |a| {
                st(a, rdi, 1);
                st(a, rsi, 2);
                a.ret().unwrap();
            },
            p1: |a| {
                st(a, rsi, 1);
                st(a, rdi, 2);
                a.ret().unwrap();
            },
            forbidden: |_, _, x, y| x == 1 && y == 1,
            relaxed: None,
        },
        Litmus {
            name: "S",
            p0: |a| {
                st(a, rdi, 2);
                st(a, rsi, 1);
                a.ret().unwrap();
            },
            p1: |a| {
                ld(a, rsi, 0);
                st(a, rdi, 1);
                a.ret().unwrap();
            },
            forbidden: |_, o1, x, _| o1[0] == 1 && x == 2,
            relaxed: None,
        },
        Litmus {
            name: "LB",
            p0: |a| {
                ld(a, rdi, 0);
                st(a, rsi, 1);
                a.ret().unwrap();
            },
            p1: |a| {
                ld(a, rsi, 0);
                st(a, rdi, 1);
                a.ret().unwrap();
            },
            forbidden: |o0, o1, _, _| o0[0] == 1 && o1[0] == 1,
            relaxed: None,
        },
        Litmus {
            name: "SB-merge-xy (W x=1; W y=1; W x=2 || R x; R y)",
            p0: |a| {
                st(a, rdi, 1);
                st(a, rsi, 1);
                st(a, rdi, 2);
                a.ret().unwrap();
            },
            p1: |a| {
                ld(a, rdi, 0);
                ld(a, rsi, 1);
                a.ret().unwrap();
            },
            forbidden: |_, o1, _, _| o1 == [2, 0],
            relaxed: None,
        },
        Litmus {
            name: "SB-merge-yx (W x=1; W y=1; W x=2 || R y; R x)",
            p0: |a| {
                st(a, rdi, 1);
                st(a, rsi, 1);
                st(a, rdi, 2);
                a.ret().unwrap();
            },
            p1: |a| {
                ld(a, rsi, 0);
                ld(a, rdi, 1);
                a.ret().unwrap();
            },
            forbidden: |_, o1, _, _| o1 == [1, 0],
            relaxed: None,
        },
    ]
}

/// Every instruction of the body: the whole body is the region.
fn all_pcs(base: u64, code: &[u8]) -> Vec<u64> {
    iced_x86::Decoder::with_ip(64, code, base, iced_x86::DecoderOptions::NONE)
        .into_iter()
        .map(|i| i.ip())
        .collect()
}

#[repr(C, align(64))]
#[derive(Clone, Copy, Default)]
struct Cell {
    x: u64,
    y: u64,
    _pad: [u64; 6],
}

#[repr(C, align(64))]
#[derive(Clone, Copy, Default)]
struct Out {
    o: [[u64; 2]; 2],
    _pad: [u64; 4],
}

/// Runs `iters` iterations; returns (forbidden, relaxed) counts.
/// Returns (forbidden, relaxed, whether either body became a fixed-address region).
fn run(t: &Litmus, iters: usize, opts: PlanOptions) -> (u64, u64, bool) {
    let b0 = twin(&|a| (t.p0)(a), &all_pcs, opts)
        .unwrap_or_else(|r| panic!("{}: P0 refused: {r}", t.name));
    let b1 = twin(&|a| (t.p1)(a), &all_pcs, opts)
        .unwrap_or_else(|r| panic!("{}: P1 refused: {r}", t.name));
    assert_eq!(
        b0.plan.state_register.is_some(),
        opts.inline_fast_path,
        "{}",
        t.name
    );
    let fixed = b0.plan.fixed_locations + b1.plan.fixed_locations > 0;
    let (f0, f1) = (fn3(b0.repaired), fn3(b1.repaired));
    const CHUNK: usize = 100_000;
    let (mut forbidden, mut relaxed) = (0u64, 0u64);
    let mut done = 0;
    while done < iters {
        let n = CHUNK.min(iters - done);
        let mut cells = vec![Cell::default(); n];
        let mut outs = vec![Out::default(); n];
        let progress = [AtomicU64::new(0), AtomicU64::new(0)];
        let (cp, op) = (cells.as_mut_ptr() as u64, outs.as_mut_ptr() as u64);
        std::thread::scope(|s| {
            for (me, f) in [(0usize, f0), (1usize, f1)] {
                let progress = &progress;
                s.spawn(move || {
                    for i in 0..n {
                        // ATOMICS: release publishes "I am at i"; acquire on the other's counter
                        // only paces the loop (the bodies' accesses are the tested ones).
                        progress[me].store(i as u64 + 1, Ordering::Release);
                        let mut spins = 0u32;
                        while progress[1 - me].load(Ordering::Acquire) < i as u64 + 1 {
                            spins += 1;
                            if spins > 200 {
                                std::thread::yield_now();
                            } else {
                                std::hint::spin_loop();
                            }
                        }
                        let c = cp + (i * std::mem::size_of::<Cell>()) as u64;
                        let o = op + (i * std::mem::size_of::<Out>()) as u64 + 16 * me as u64;
                        f(c, c + 8, o);
                    }
                });
            }
        });
        for (c, o) in cells.iter().zip(&outs) {
            if (t.forbidden)(o.o[0], o.o[1], c.x, c.y) {
                forbidden += 1;
            }
            if t.relaxed.is_some_and(|r| r(o.o[0], o.o[1], c.x, c.y)) {
                relaxed += 1;
            }
        }
        done += n;
    }
    (forbidden, relaxed, fixed)
}

fn run_all(iters: usize, opts: PlanOptions) {
    let mut bad = Vec::new();
    let path = if opts.inline_fast_path {
        "inline"
    } else {
        "helper"
    };
    let mut fixed_tests = 0;
    for t in tests() {
        let (forbidden, relaxed, fixed) = run(&t, iters, opts);
        println!(
            "{:<48} {path}{} {iters} iterations: forbidden {forbidden}, relaxed {relaxed}",
            t.name,
            if fixed { " (fixed region)" } else { "" }
        );
        fixed_tests += usize::from(fixed);
        if forbidden > 0 {
            bad.push((t.name, forbidden));
        }
    }
    assert!(bad.is_empty(), "forbidden outcomes under the SSB: {bad:?}");
    // The bodies store through argument registers they never change: on the inline path
    // they are fixed-address regions, whose slots and range tests are then what is tested.
    if opts.inline_fast_path {
        assert!(
            fixed_tests > 0,
            "no litmus body became a fixed-address region"
        );
    }
}

/// Both code paths in one test: two litmus tests running at once would put four spinning
/// threads on two cores.
#[test]
fn litmus_rewritten_bodies_no_forbidden_outcomes() {
    run_all(100_000, permissive());
    run_all(
        20_000,
        PlanOptions {
            inline_fast_path: false,
            ..permissive()
        },
    );
}

#[test]
#[ignore = "long: 10^7 iterations per test"]
fn litmus_rewritten_bodies_long() {
    run_all(10_000_000, permissive());
    run_all(
        10_000_000,
        PlanOptions {
            inline_fast_path: false,
            ..permissive()
        },
    );
}

/// The harness can see the bug it guards against: a store buffer that merges into any
/// matching entry (not only the tail) lets P1 see `x=2` without `y=1`. Prints the count;
/// asserting it would depend on timing.
#[test]
#[ignore = "demonstration: a deliberately broken SSB, counts printed"]
fn litmus_detects_merge_into_older_entry() {
    let broken = PlanOptions {
        runtime: RuntimeConfig {
            merge_any_entry_broken: true,
            ..RuntimeConfig::default()
        },
        ..permissive()
    };
    for t in tests()
        .into_iter()
        .filter(|t| t.name.starts_with("SB-merge"))
    {
        let (forbidden, _, _) = run(&t, 200_000, broken);
        println!("{:<48} broken merge: forbidden {forbidden}", t.name);
    }
}
