//! The walk back from a sampled IP, on assembled code: each test draws its code and says which
//! instruction is sampled (◀).

use super::*;
use crate::decode::access::{resolve, Access, Accesses};
use crate::decode::code::MemoryCode;
use crate::decode::frame_slots::FrameSlots;
use crate::decode::pccache::PcCache;
use iced_x86::code_asm::*;
use laser_driver::{BackendKind, Sample};

const F: u64 = 0x40_1000;
const ZF: u64 = 1 << 6;
const CF: u64 = 1;

fn assemble(a: &mut CodeAssembler) -> (MemoryCode, Vec<u64>) {
    let bytes = a.assemble(F).unwrap();
    let pcs = crate::test_util::starts(F, &bytes);
    let mut m = MemoryCode::new();
    m.add_function(F, bytes);
    (m, pcs)
}

fn sample(ip: u64, regs: &[(Reg, u64)]) -> Sample {
    let mut r = UserRegs::default();
    for &(k, v) in regs {
        r.set(k, v);
    }
    Sample {
        backend: BackendKind::Soft,
        pid: 1,
        tid: 7,
        cpu: 0,
        time: 1,
        ip,
        addr: None,
        data_src: None,
        weight: 1,
        regs: Some(r),
        watch_slot: None,
        callers: Default::default(),
    }
}

/// The accesses a sample resolves to, as (pc, addr, op), and the drop reason if none.
fn accesses(m: &MemoryCode, s: &Sample) -> Vec<(u64, u64, Op)> {
    let mut c = PcCache::new();
    let info = c.get(s.ip, m);
    let mut out = Accesses::default();
    let _ = resolve(
        s,
        &info,
        c.skid_paths(&info),
        &FrameSlots::default(),
        &mut out,
    );
    out.iter().map(|a: &Access| (a.pc, a.addr, a.op)).collect()
}

/// `for (n = 1000; --n; ) { work; A[1] = 1; }` with the store right before the `jmp` back:
/// ```text
///  i0:  mov ecx,1000          entry: sets the counter (Set 1000)
///  i1:  dec rcx          ◀    loop head: preds = i0 (fall-through), i6 (jmp)
///  i2:  jz done
///  i3:  imul rdx,rdx
///  i4:  mov dword [rdi+4],1   the store, never the sampled IP
///  i5:  jmp top
///  i6:  ret
/// ```
/// With rcx ≠ 1000 at the sample the entry path is impossible (nothing between i0 and the IP
/// moves rcx but by constants), so the only path is the back edge, and the store is the access.
#[test]
fn a_sample_at_the_loop_head_is_the_store_before_the_jmp_back() {
    let mut a = CodeAssembler::new(64).unwrap();
    let mut top = a.create_label();
    let mut done = a.create_label();
    a.mov(ecx, 1000).unwrap();
    a.set_label(&mut top).unwrap();
    a.dec(rcx).unwrap();
    a.jz(done).unwrap();
    a.imul_2(rdx, rdx).unwrap();
    a.mov(dword_ptr(rdi + 4), 1).unwrap();
    a.jmp(top).unwrap();
    a.set_label(&mut done).unwrap();
    a.ret().unwrap();
    let (m, pcs) = assemble(&mut a);
    let store = (pcs[4], 0x60_0004, Op::Store);
    let regs = |n: u64| [(Reg::Cx, n), (Reg::Di, 0x60_0000), (Reg::Flags, 0x202)];
    assert_eq!(accesses(&m, &sample(pcs[1], &regs(500))), vec![store]);
    // At the jmp itself: the store is the instruction before it.
    assert_eq!(accesses(&m, &sample(pcs[5], &regs(500))), vec![store]);
    // At `jz`, one past the head: `dec` is undone (rcx was 501 before it), still not 1000.
    assert_eq!(accesses(&m, &sample(pcs[2], &regs(500))), vec![store]);
    // rcx = 1000 at the head: this may be the first iteration, entered from i0: no answer.
    assert_eq!(accesses(&m, &sample(pcs[1], &regs(1000))), vec![]);
    // At `jz` with rcx = 999: `dec` made it so from 1000 — again possibly the entry.
    assert_eq!(accesses(&m, &sample(pcs[2], &regs(999))), vec![]);
    // Without rcx in the sample nothing rules the entry out.
    assert_eq!(
        accesses(&m, &sample(pcs[1], &[(Reg::Di, 0x60_0000)])),
        vec![]
    );
}

/// A pointer walking down an array (`while (p != end) sum += *p--;` at -O2):
/// ```text
///  i0: mov rcx,[rax]      the load
///  i1: sub rax,8          ◀ 85% of samples in the field
///  i2: add rdx,rcx        ◀ rax has moved since the load
///  i3: cmp rax,rsi        ◀
///  i4: jne i0
/// ```
/// Rule: an instruction on the path that writes an address register by a known constant
/// (`add/sub $k`, `inc`, `dec`, `lea k(%r),%r` on a 64-bit register) is undone — the load
/// read `rax + 8`; any other write of an address register loses the address, and the walk
/// attributes nothing (it does not go further back to an older access either).
#[test]
fn a_load_whose_pointer_moved_by_a_constant_is_recovered() {
    let mut a = CodeAssembler::new(64).unwrap();
    let mut top = a.create_label();
    a.set_label(&mut top).unwrap();
    a.mov(rcx, qword_ptr(rax)).unwrap();
    a.sub(rax, 8).unwrap();
    a.add(rdx, rcx).unwrap();
    a.cmp(rax, rsi).unwrap();
    a.jne(top).unwrap();
    a.ret().unwrap();
    let (m, pcs) = assemble(&mut a);
    let regs = [
        (Reg::Ax, 0x60_0100),
        (Reg::Si, 0x60_0000),
        (Reg::Flags, 0x202),
    ];
    // Sampled at `sub` (not run yet): rax is still the load's address.
    assert_eq!(
        accesses(&m, &sample(pcs[1], &regs)),
        vec![(pcs[0], 0x60_0100, Op::Load)]
    );
    // After it: the load read rax + 8.
    let load = (pcs[0], 0x60_0108, Op::Load);
    for ip in [pcs[2], pcs[3], pcs[4]] {
        assert_eq!(accesses(&m, &sample(ip, &regs)), vec![load], "ip {ip:#x}");
    }
    // At the load itself (the loop head, also the function entry): only the load at the IP.
    assert_eq!(
        accesses(&m, &sample(pcs[0], &regs)),
        vec![(pcs[0], 0x60_0100, Op::Load)]
    );
}

/// ```text
///  i0: mov rcx,[rax]
///  i1: imul rax,rdx       rax now unknown
///  i2: nop          ◀     → nothing (and not an older access either)
/// ```
#[test]
fn an_unknown_write_of_the_address_register_loses_the_access() {
    let mut a = CodeAssembler::new(64).unwrap();
    a.mov(qword_ptr(rsi), rbx).unwrap();
    a.mov(rcx, qword_ptr(rax)).unwrap();
    a.imul_2(rax, rdx).unwrap();
    a.nop().unwrap();
    a.ret().unwrap();
    let (m, pcs) = assemble(&mut a);
    let s = sample(pcs[3], &[(Reg::Ax, 0x60_0000), (Reg::Si, 0x70_0000)]);
    assert_eq!(accesses(&m, &s), vec![]);
}

/// A join whose two predecessors the sampled flags tell apart:
/// ```text
///  i0: cmp rax,rbx          sets CF
///  i1: mov [rsi],rax        store X (flags untouched)
///  i2: jb join              taken when CF=1
///  i3: mov [rdi],rdx        store Y (reached when CF=0)
///  join: nop          ◀     preds: i3 (fall-through), i2 (taken)
/// ```
#[test]
fn a_join_is_decided_by_the_sampled_flags() {
    let mut a = CodeAssembler::new(64).unwrap();
    let mut join = a.create_label();
    a.cmp(rax, rbx).unwrap();
    a.mov(qword_ptr(rsi), rax).unwrap();
    a.jb(join).unwrap();
    a.mov(qword_ptr(rdi), rdx).unwrap();
    a.set_label(&mut join).unwrap();
    a.nop().unwrap();
    a.ret().unwrap();
    let (m, pcs) = assemble(&mut a);
    let regs = |flags| {
        let mut v = vec![(Reg::Si, 0x60_0000), (Reg::Di, 0x60_0040)];
        if let Some(f) = flags {
            v.push((Reg::Flags, f));
        }
        v
    };
    assert_eq!(
        accesses(&m, &sample(pcs[4], &regs(Some(0x202 | CF)))),
        vec![(pcs[1], 0x60_0000, Op::Store)],
        "CF=1: jumped from i2, store X ran last"
    );
    assert_eq!(
        accesses(&m, &sample(pcs[4], &regs(Some(0x202)))),
        vec![(pcs[3], 0x60_0040, Op::Store)],
        "CF=0: fell through store Y"
    );
    assert_eq!(
        accesses(&m, &sample(pcs[4], &regs(None))),
        vec![],
        "no flags: either"
    );
}

/// Two ways into a join with flags overwritten on both: the sample cannot tell which store ran.
/// ```text
///  i0: test rbx,rbx
///  i1: jnz b
///  i2: mov [rdi],rax
///  i3: add rdx,1            writes flags
///  i4: jmp join
///  b:  mov [rsi],rax
///  i6: add rdx,1            writes flags
///  join: nop          ◀     preds: i6 (fall-through), i4 (jmp): both feasible → nothing
/// ```
#[test]
fn an_ambiguous_join_is_not_attributed() {
    let mut a = CodeAssembler::new(64).unwrap();
    let mut b = a.create_label();
    let mut join = a.create_label();
    a.test(rbx, rbx).unwrap();
    a.jnz(b).unwrap();
    a.mov(qword_ptr(rdi), rax).unwrap();
    a.add(rdx, 1).unwrap();
    a.jmp(join).unwrap();
    a.set_label(&mut b).unwrap();
    a.mov(qword_ptr(rsi), rax).unwrap();
    a.add(rdx, 1).unwrap();
    a.set_label(&mut join).unwrap();
    a.nop().unwrap();
    a.ret().unwrap();
    let (m, pcs) = assemble(&mut a);
    for flags in [0x202, 0x202 | ZF] {
        let s = sample(
            pcs[7],
            &[
                (Reg::Si, 0x60_0000),
                (Reg::Di, 0x60_0040),
                (Reg::Flags, flags),
            ],
        );
        assert_eq!(accesses(&m, &s), vec![], "flags {flags:#x}");
    }
    // One instruction into either arm the path is unique again.
    let s = sample(pcs[3], &[(Reg::Di, 0x60_0040)]);
    assert_eq!(accesses(&m, &s), vec![(pcs[2], 0x60_0040, Op::Store)]);
}

/// Beyond [`MAX_SKID`] non-memory instructions the walk gives up.
#[test]
fn the_walk_is_bounded() {
    for gap in [MAX_SKID - 1, MAX_SKID] {
        let mut a = CodeAssembler::new(64).unwrap();
        a.mov(qword_ptr(rdi), rax).unwrap();
        for _ in 0..gap {
            a.add(rdx, rcx).unwrap();
        }
        a.nop().unwrap();
        a.ret().unwrap();
        let (m, pcs) = assemble(&mut a);
        let got = accesses(&m, &sample(pcs[gap + 1], &[(Reg::Di, 0x60_0000)]));
        // The store is `gap + 1` instructions back from the sampled nop.
        if gap < MAX_SKID {
            assert_eq!(got, vec![(pcs[0], 0x60_0000, Op::Store)], "gap {gap}");
        } else {
            assert_eq!(got, vec![], "gap {gap}");
        }
    }
}

/// A walk landing on a stack slot counts it as stack; the access through the pointer loaded
/// from that slot is an ordinary one.
/// ```text
///  i0: mov rax,[rsp+8]      stack
///  i1: add rdx,1      ◀     → stack (dropped as such)
///  i2: mov rcx,[rax]        through the loaded pointer
///  i3: add rdx,1      ◀     → the load at [rax]
/// ```
#[test]
fn stack_slots_stay_stack_and_pointers_from_them_do_not() {
    let mut a = CodeAssembler::new(64).unwrap();
    a.mov(rax, qword_ptr(rsp + 8)).unwrap();
    a.add(rdx, 1).unwrap();
    a.mov(rcx, qword_ptr(rax)).unwrap();
    a.add(rdx, 1).unwrap();
    a.ret().unwrap();
    let (m, pcs) = assemble(&mut a);
    let regs = [(Reg::Sp, 0x7fff_0000), (Reg::Ax, 0x60_0000)];
    let mut c = PcCache::new();
    let info = c.get(pcs[1], &m);
    let mut out = Accesses::default();
    let r = resolve(
        &sample(pcs[1], &regs),
        &info,
        c.skid_paths(&info),
        &FrameSlots::default(),
        &mut out,
    );
    assert_eq!(r, Err(crate::decode::access::DropReason::Stack));
    assert_eq!(
        accesses(&m, &sample(pcs[3], &regs)),
        vec![(pcs[2], 0x60_0000, Op::Load)]
    );
}

/// A sample right after a call returns: the callee's `ret` ran before it, not the instruction
/// before the call.
#[test]
fn after_a_call_nothing_is_attributed() {
    let mut a = CodeAssembler::new(64).unwrap();
    a.mov(qword_ptr(rdi), rax).unwrap();
    a.call(0x50_0000u64).unwrap();
    a.nop().unwrap();
    a.ret().unwrap();
    let (m, pcs) = assemble(&mut a);
    assert_eq!(
        accesses(&m, &sample(pcs[2], &[(Reg::Di, 0x60_0000)])),
        vec![]
    );
}

/// The paths of a straight-line PC need no look at the sample: one answer, cached.
#[test]
fn straight_line_paths_are_fixed() {
    let mut a = CodeAssembler::new(64).unwrap();
    a.nop().unwrap();
    a.mov(qword_ptr(rdi), rax).unwrap();
    a.add(rdx, 1).unwrap();
    a.nop().unwrap();
    a.ret().unwrap();
    let (m, pcs) = assemble(&mut a);
    let mut c = PcCache::new();
    let info = c.get(pcs[3], &m);
    let p = c.skid_paths(&info).unwrap();
    assert!(p.fixed.is_some());
    assert_eq!(p.resolve(&UserRegs::default()).unwrap().insn.pc, pcs[1]);
}
