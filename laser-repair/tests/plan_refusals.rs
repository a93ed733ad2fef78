//! Refusals: regions the planner must leave untouched, each with a reason naming the culprit.
//! Also the runtime's generated code, checked by decoding it.

mod plan_support;

use iced_x86::code_asm::*;
use iced_x86::{Decoder, DecoderOptions, Mnemonic};
use laser_repair::plan::{plan, CodeBytes, PlanOptions, PlanRequest, RefusalReason, RuntimeConfig};
use plan_support::{counter_loop, permissive};

const BASE: u64 = 0x40_0000;
const CACHE: u64 = 0x50_0000;

fn asm(build: impl FnOnce(&mut CodeAssembler)) -> Vec<u8> {
    let mut a = CodeAssembler::new(64).unwrap();
    build(&mut a);
    a.assemble(BASE).unwrap()
}

fn nth_ip(code: &[u8], n: usize) -> u64 {
    Decoder::with_ip(64, code, BASE, DecoderOptions::NONE)
        .into_iter()
        .nth(n)
        .unwrap()
        .ip()
}

fn plan_on(
    code: &[u8],
    pcs: &[u64],
    options: PlanOptions,
) -> Result<laser_repair::plan::RepairPlan, RefusalReason> {
    let src = CodeBytes {
        base: BASE,
        bytes: code,
    };
    let req = PlanRequest {
        code: &src,
        function: Some((BASE, BASE + code.len() as u64)),
        contending_pcs: pcs,
        cache_addr: CACHE,
        options,
    };
    plan(&req).map_err(|r| r.reason)
}

#[test]
fn x87_store_in_loop_is_refused_by_name() {
    let code = asm(|a| {
        let mut top = a.create_label();
        a.set_label(&mut top).unwrap();
        a.mov(qword_ptr(rdi), rax).unwrap();
        // SSE/AVX operands are rewritten now (plan_wide.rs); x87 ones are still refused.
        a.fstp(qword_ptr(rdi + 16)).unwrap();
        a.dec(rsi).unwrap();
        a.jnz(top).unwrap();
        a.ret().unwrap();
    });
    let err = plan_on(&code, &[BASE], PlanOptions::default()).unwrap_err();
    match &err {
        RefusalReason::UnsupportedInstruction { pc, text, .. } => {
            assert_eq!(*pc, nth_ip(&code, 1));
            assert!(text.contains("fstp"), "{text}");
        }
        other => panic!("wrong refusal: {other}"),
    }
    assert!(err.to_string().contains("fstp"));
}

#[test]
fn indirect_jump_in_region_is_refused() {
    let code = asm(|a| {
        a.mov(qword_ptr(rdi), rax).unwrap();
        a.mov(qword_ptr(rdi + 8), rax).unwrap();
        a.jmp(rcx).unwrap();
    });
    let err = plan_on(&code, &[BASE], permissive()).unwrap_err();
    assert!(matches!(err, RefusalReason::IndirectJump { .. }), "{err}");
}

#[test]
fn short_entry_block_is_refused() {
    // top: mov [rdi],eax (2 bytes) — `l2` is a branch target right after it.
    let code = asm(|a| {
        let mut top = a.create_label();
        let mut l2 = a.create_label();
        a.set_label(&mut top).unwrap();
        a.mov(dword_ptr(rdi), eax).unwrap();
        a.set_label(&mut l2).unwrap();
        a.add(eax, 1).unwrap();
        a.cmp(eax, 5).unwrap();
        a.je(l2).unwrap();
        a.dec(rsi).unwrap();
        a.jnz(top).unwrap();
        a.ret().unwrap();
    });
    let err = plan_on(&code, &[BASE], permissive()).unwrap_err();
    assert_eq!(err, RefusalReason::EntryTooShort { pc: BASE, len: 2 });
}

#[test]
fn straight_line_code_with_few_stores_is_not_worth_it() {
    let code = asm(|a| {
        a.mov(qword_ptr(rdi), rax).unwrap();
        a.mov(qword_ptr(rdi + 8), rax).unwrap();
        a.ret().unwrap();
    });
    let err = plan_on(&code, &[BASE], PlanOptions::default()).unwrap_err();
    assert_eq!(
        err,
        RefusalReason::TooFewStoresPerFlush {
            estimated: 2.0,
            minimum: 4.0
        }
    );
    // The same code is accepted when the caller lowers the bar.
    assert!(plan_on(&code, &[BASE], permissive()).is_ok());
}

#[test]
fn pc_inside_an_instruction_is_refused() {
    let code = asm(|a| {
        a.mov(qword_ptr(rdi), rax).unwrap();
        a.ret().unwrap();
    });
    let err = plan_on(&code, &[BASE + 1], permissive()).unwrap_err();
    assert!(
        matches!(err, RefusalReason::PcNotOnInstruction { pc, .. } if pc == BASE + 1),
        "{err}"
    );
}

#[test]
fn indirect_call_under_the_entry_patch_is_refused() {
    // A direct call there is imitated in the cache (plan_entry_call.rs); an indirect one
    // would need its operand evaluated with the return address already pushed.
    let code = asm(|a| {
        let mut top = a.create_label();
        a.set_label(&mut top).unwrap();
        a.call(rdx).unwrap();
        a.mov(qword_ptr(rdi), rax).unwrap();
        a.dec(rsi).unwrap();
        a.jnz(top).unwrap();
        a.ret().unwrap();
    });
    let pc = nth_ip(&code, 1);
    let err = plan_on(&code, &[pc], permissive()).unwrap_err();
    assert_eq!(
        err,
        RefusalReason::CallUnderPatch {
            pc: BASE,
            entry: BASE
        }
    );
}

#[test]
fn cache_out_of_reach_is_refused() {
    let code = asm(|a| {
        let mut top = a.create_label();
        a.set_label(&mut top).unwrap();
        a.mov(qword_ptr(rdi), rax).unwrap();
        a.dec(rsi).unwrap();
        a.jnz(top).unwrap();
        a.ret().unwrap();
    });
    let src = CodeBytes {
        base: BASE,
        bytes: &code,
    };
    let pcs = [BASE];
    let req = PlanRequest {
        code: &src,
        function: Some((BASE, BASE + code.len() as u64)),
        contending_pcs: &pcs,
        cache_addr: BASE + (8 << 30),
        options: PlanOptions::default(),
    };
    let err = plan(&req).unwrap_err().reason;
    assert_eq!(
        err,
        RefusalReason::CacheOutOfReach {
            pc: BASE,
            cache: BASE + (8 << 30)
        }
    );
}

/// Without symbols, the planner finds the function from the PC (endbr64 start, ret end)
/// inside a blob holding a neighbour function before and after.
#[test]
fn plans_without_symbols_by_scanning() {
    let code = asm(|a| {
        // A neighbour: 3 bytes of code, a ret and int3 padding.
        a.xor(eax, eax).unwrap();
        a.ret().unwrap();
        a.int3().unwrap();
        a.int3().unwrap();
        a.endbr64().unwrap();
        counter_loop(a);
        a.int3().unwrap();
        a.xor(eax, eax).unwrap();
        a.ret().unwrap();
    });
    let store = nth_ip(&code, 7);
    let src = CodeBytes {
        base: BASE,
        bytes: &code,
    };
    let pcs = [store];
    let req = PlanRequest {
        code: &src,
        function: None,
        contending_pcs: &pcs,
        cache_addr: CACHE,
        options: PlanOptions::default(),
    };
    let p = plan(&req).unwrap();
    let start = nth_ip(&code, 4);
    let ret = nth_ip(&code, 10);
    assert_eq!(p.function, (start, ret + 1));
    // The loop starts after endbr64; the patch goes there, 5 bytes of jmp + int3 padding.
    assert_eq!(p.patches.len(), 1);
    assert_eq!(p.patches[0].addr, start + 4);
    assert_eq!(p.patches[0].new_bytes[0], 0xe9);
    assert_eq!(p.patches[0].old_bytes.len(), p.patches[0].new_bytes.len());
    assert!(p.map_pc(store).is_some());
}

/// The generated runtime holds the RTM flush (xbegin/xend) and the CPUID probe even though
/// this machine cannot run it; every helper address is inside the code.
#[test]
fn runtime_contains_rtm_flush_and_probe() {
    let code = asm(|a| {
        let mut top = a.create_label();
        a.set_label(&mut top).unwrap();
        a.mov(qword_ptr(rdi), rax).unwrap();
        a.dec(rsi).unwrap();
        a.jnz(top).unwrap();
        a.ret().unwrap();
    });
    let p = plan_on(&code, &[BASE], PlanOptions::default()).unwrap();
    assert!(p.cache.map_len() <= PlanOptions::default().cache_reservation());
    let rt = &p.runtime;
    let bytes = &p.cache.code[..rt.code_len as usize];
    let insns: Vec<_> = Decoder::with_ip(64, bytes, rt.code_addr, DecoderOptions::NONE)
        .into_iter()
        .collect();
    assert!(insns.iter().all(|i| !i.is_invalid()));
    let xbegin = insns
        .iter()
        .find(|i| i.mnemonic() == Mnemonic::Xbegin)
        .expect("xbegin");
    assert!(insns.iter().any(|i| i.mnemonic() == Mnemonic::Xend));
    assert!(insns.iter().any(|i| i.mnemonic() == Mnemonic::Cpuid));
    // The abort handler is inside the runtime and is followed by the FIFO replay path.
    let abort = xbegin.near_branch_target();
    assert!(abort > xbegin.ip() && abort < rt.code_addr + rt.code_len);
    // Every data reference (rip-relative lea) points into the data area.
    for i in insns.iter().filter(|i| i.is_ip_rel_memory_operand()) {
        let t = i.ip_rel_memory_address();
        assert!(
            t >= rt.data_addr && t < rt.data_addr + rt.data_len,
            "{i} -> {t:#x}"
        );
    }
    for h in rt
        .load
        .iter()
        .chain(&rt.store)
        .chain([&rt.flush, &rt.backedge, &rt.enter])
    {
        assert!(
            insns.iter().any(|i| i.ip() == *h),
            "helper {h:#x} not an instruction start"
        );
    }
    // Lock-free claim of a thread slot.
    assert!(insns
        .iter()
        .any(|i| i.mnemonic() == Mnemonic::Cmpxchg && i.has_lock_prefix()));
    let _ = RuntimeConfig::default();
}
