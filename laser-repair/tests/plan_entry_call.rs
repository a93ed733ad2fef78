//! A loop that opens with a direct call: the call lies under the 5-byte entry jmp, so the
//! region cannot leave by jumping to it; the cache imitates it instead (push the original
//! return address, jump to the callee) and the callee returns into original code.

mod plan_support;

use iced_x86::code_asm::*;
use laser_repair::plan::PlanOptions;
use plan_support::*;

/// `fn(c: *mut u64, n: u64)`: n times { helper(): c[1] += 1; c[0] += 1 }.
fn call_first_loop(a: &mut CodeAssembler) {
    let mut top = a.create_label();
    let mut helper = a.create_label();
    a.set_label(&mut top).unwrap();
    a.call(helper).unwrap();
    a.mov(rax, qword_ptr(rdi)).unwrap();
    a.add(rax, 1).unwrap();
    a.mov(qword_ptr(rdi), rax).unwrap();
    a.dec(rsi).unwrap();
    a.jnz(top).unwrap();
    a.ret().unwrap();
    a.set_label(&mut helper).unwrap();
    a.add(qword_ptr(rdi + 8), 1).unwrap();
    a.ret().unwrap();
}

#[test]
fn a_call_under_the_entry_jmp_is_imitated_and_the_loop_runs_exactly() {
    let opts = PlanOptions {
        min_stores_per_flush: 0.0,
        ..Default::default()
    };
    let t = twin(
        &call_first_loop,
        &|base, code| store_pcs(base, code)[..1].to_vec(),
        opts,
    )
    .expect("planned, not refused");
    assert!(t.plan.region.is_loop);
    assert_eq!(
        t.plan.patches[0].addr, t.repaired,
        "the entry jmp sits on the loop's first instruction, the call"
    );
    let mut c = [[0u64; 2]; 2];
    fn2(t.native)(c[0].as_mut_ptr() as u64, 10_000);
    fn2(t.repaired)(c[1].as_mut_ptr() as u64, 10_000);
    assert_eq!(c[0], [10_000, 10_000]);
    assert_eq!(c[1], c[0], "every call made and returned, every store kept");
}
