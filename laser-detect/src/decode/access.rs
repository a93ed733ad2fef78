//! From one sample to the memory accesses it proves, per backend.
//!
//! - `soft` (timer, registers): the instruction AT the sampled IP has not executed; its address
//!   is exact from the registers. Timer samples skid, so the instruction BEFORE the IP (the one
//!   that just retired) is also used when its address registers survived its execution:
//!   ```text
//!     mov (%rcx),%rsi    ◀ prev: executed, rcx unchanged → address exact  ✓
//!     add $1,%rsi        ◀ sampled IP (no memory operand)
//!     mov (%rax),%rax    ◀ prev of the next IP: overwrote rax → address lost  ✗
//!   ```
//!   Both are real accesses by that thread at (about) the sample time. The access the sample
//!   skidded past is found by walking back along the control flow, not the address order
//!   ([`crate::decode::skid`]): past `jmp`s to a loop head, over non-memory instructions, undoing
//!   constant steps of the address registers; not across joins the sample cannot decide.
//! - `watch`: the IP is the instruction after the access (traps fire after retirement), so op,
//!   size and the address come from the previous instruction and the trap's registers; `addr`
//!   is only the watched word (see `watch` for when the bytes are not known).
//! - `pebs`/`ibs`: `addr` and `data_src` given at the precise IP; load/store from the
//!   `mem_op` field of `data_src` (bits 0–4: 0x2 load, 0x4 store), size from decoding the IP.

use laser_driver::{BackendKind, Sample};

use crate::decode::classify::{Insn, MemOperand, RegEffect, Segment};
use crate::decode::effaddr::{effective_address, NoAddr};
use crate::decode::frame_slots::FrameSlots;
use crate::decode::pccache::PcInfo;
use crate::decode::skid::SkidPaths;
use crate::model::findings::Op;
use laser_driver::Reg;

/// One memory access by one thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    pub tid: u32,
    pub time: u64,
    pub pc: u64,
    pub addr: u64,
    pub size: u8,
    pub op: Op,
    /// Events this access stands for (see `detector` on weights).
    pub weight: u64,
}

/// Why a sample (or one of its operands) yielded no access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Undecodable or unknown code at the PC.
    Undecodable,
    /// The instructions touch no memory (arithmetic, branches).
    NoMemory,
    /// Stack-pointer-relative or in a stack mapping.
    Stack,
    /// `%fs`/`%gs`-relative: thread-local.
    ThreadLocal,
    /// A needed register is missing from the sample.
    MissingRegs,
    /// A watch hit by an access narrower than the watched word that overwrote its own address
    /// registers: which bytes it touched is unknown.
    WatchBytesUnknown,
}

/// Fixed-capacity output (no allocation per sample): at most two operands at the IP and two
/// before it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Accesses {
    buf: [Option<Access>; 4],
    n: usize,
    /// Operands skipped as stack / TLS / missing registers (for the filter statistics).
    pub stack: u8,
    pub tls: u8,
    pub missing: u8,
    /// Watch hits whose bytes are not known (see `watch`).
    pub watch_unknown: u8,
}

impl Accesses {
    pub fn clear(&mut self) {
        // The slots at and past `n` are never read: leave them (this runs on every sample).
        self.n = 0;
        self.stack = 0;
        self.tls = 0;
        self.missing = 0;
        self.watch_unknown = 0;
    }
    fn push(&mut self, a: Access) {
        if self.n < self.buf.len() {
            self.buf[self.n] = Some(a);
            self.n += 1;
        }
    }
    pub fn len(&self) -> usize {
        self.n
    }
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
    pub fn iter(&self) -> impl Iterator<Item = &Access> {
        self.buf[..self.n].iter().flatten()
    }
}

const MEM_OP_LOAD: u64 = 0x2;
const MEM_OP_STORE: u64 = 0x4;

/// Load or store from a `perf_mem_data_src` word (`mem_op`, bits 0–4).
pub fn op_from_data_src(data_src: u64) -> Option<Op> {
    let mem_op = data_src & 0x1f;
    match (mem_op & MEM_OP_LOAD != 0, mem_op & MEM_OP_STORE != 0) {
        (true, true) => Some(Op::Rmw),
        (true, false) => Some(Op::Load),
        (false, true) => Some(Op::Store),
        _ => None,
    }
}

/// Resolve a sample into accesses. `info` is the decode of `s.ip`, `skid` the paths into it
/// ([`crate::decode::pccache::PcCache::skid_paths`]), `slots` what the samples so far have
/// shown of the stack slots pointers are reloaded from. Returns the reason when nothing was
/// produced.
pub fn resolve(
    s: &Sample,
    info: &PcInfo,
    skid: Option<&SkidPaths>,
    slots: &FrameSlots,
    out: &mut Accesses,
) -> Result<(), DropReason> {
    out.clear();
    match s.backend {
        BackendKind::Soft => soft(s, info, skid, slots, out),
        BackendKind::Watch if is_code_hit(s) => code_hit(s, info, out),
        BackendKind::Watch => watch(s, info, skid.and_then(|p| p.feeder.as_ref()), out),
        BackendKind::Pebs | BackendKind::Ibs => precise(s, info, out),
    }
    if !out.is_empty() {
        return Ok(());
    }
    Err(if out.stack > 0 {
        DropReason::Stack
    } else if out.tls > 0 {
        DropReason::ThreadLocal
    } else if out.missing > 0 {
        DropReason::MissingRegs
    } else if out.watch_unknown > 0 {
        DropReason::WatchBytesUnknown
    } else if info.at.is_none() && info.prev.is_none() {
        DropReason::Undecodable
    } else {
        DropReason::NoMemory
    })
}

fn push_operand(
    s: &Sample,
    pc: u64,
    m: &MemOperand,
    addr: Result<u64, NoAddr>,
    out: &mut Accesses,
) {
    if m.is_stack() {
        out.stack += 1;
        return;
    }
    match addr {
        Ok(addr) => out.push(Access {
            tid: s.tid,
            time: s.time,
            pc,
            addr,
            size: m.size,
            op: m.op,
            // A timer sample says nothing about how many memory events it stands for: each
            // resolved access counts once (see `detector` on why the counts are lower bounds).
            weight: if s.backend == BackendKind::Soft {
                1
            } else {
                s.weight.max(1)
            },
        }),
        Err(NoAddr::ThreadLocal) => out.tls += 1,
        Err(NoAddr::MissingRegister) => out.missing += 1,
    }
}

fn soft(
    s: &Sample,
    info: &PcInfo,
    skid: Option<&SkidPaths>,
    slots: &FrameSlots,
    out: &mut Accesses,
) {
    let Some(regs) = s.regs.as_ref() else {
        out.missing += 1;
        return;
    };
    if let Some(at) = &info.at {
        for m in at.mem() {
            push_operand(s, at.pc, m, effective_address(m, regs), out);
        }
    }
    // The access the sample skidded past, when the control flow back from the IP leads to one
    // access under this sample's flags and registers (see `skid`).
    let Some(paths) = skid else {
        return;
    };
    let Some(hit) = paths.resolve(regs) else {
        return;
    };
    // Right after the access (it is the instruction before the IP), a pointer it overwrote
    // may be known from the frame slot its feeder reloaded it from (`frame_slots`).
    let feeder = paths
        .feeder
        .as_ref()
        .filter(|_| info.prev.is_some_and(|p| p.pc == hit.insn.pc));
    for (i, m) in hit.insn.mem().iter().enumerate() {
        if let Some(addr) = hit.address(i, regs) {
            push_operand(s, hit.insn.pc, m, addr, out);
        } else if let Some(a) = feeder.and_then(|f| slots.address_via_slot(f, &hit.insn, m, regs)) {
            push_operand(s, hit.insn.pc, m, Ok(a), out);
        }
    }
}

/// The operand of `insn` that a hardware-given `addr` most likely belongs to: the one whose
/// computable address matches, else the first non-stack operand.
fn pick_operand<'a>(insn: &'a Insn, s: &Sample, addr: u64) -> Option<&'a MemOperand> {
    let ops = insn.mem();
    if let Some(regs) = s.regs.as_ref() {
        let hit = ops.iter().find(|m| {
            effective_address(m, regs)
                .is_ok_and(|a| a <= addr && addr < a.wrapping_add(m.size as u64))
        });
        if hit.is_some() {
            return hit;
        }
    }
    ops.iter()
        .find(|m| !m.is_stack() && m.segment == Segment::Flat)
        .or(ops.first())
}

/// Whether `s` is a code window's trap: an instruction breakpoint reports the instruction's
/// own address as the watched address (a data watchpoint reports the watched word, which is
/// never the code that touched it).
pub fn is_code_hit(s: &Sample) -> bool {
    s.backend == BackendKind::Watch && s.addr == Some(s.ip)
}

/// A code window's trap comes *before* the instruction at the IP runs (an instruction
/// breakpoint is a fault): the registers are those it will use, so every memory operand's
/// address is exact, whatever it points at.
fn code_hit(s: &Sample, info: &PcInfo, out: &mut Accesses) {
    let (Some(regs), Some(at)) = (s.regs.as_ref(), info.at.as_ref()) else {
        out.missing += 1;
        return;
    };
    for m in at.mem() {
        push_operand(s, at.pc, m, effective_address(m, regs), out);
    }
}

/// Watched words are at most 8 bytes (the watch backend arms 8-byte words).
const WATCH_LEN: u64 = 8;

/// A watch hit's bytes come from the instruction and its registers, never from the watched
/// range: the kernel reports the watched word's start, and an 8-byte word can hold two
/// threads' 4-byte counters.
/// ```text
///   watched word  W ──────────────┐
///                 │ t0: [W, W+4)  │ t1: [W+4, W+8)     a hit by t1 is (W+4, 4), not (W, 4)
/// ```
/// - the operand's address registers survived the access (`movl %eax,4(%rdi)`): the address
///   is recomputed from the trap's registers — exact;
/// - they did not (`movl 4(%rax),%eax`), but the one instruction that ran before the access
///   made the pointer from registers the access left alone (`lea 4(%r12),%rax`, `mov %r12,%rax`):
///   the pointer is rebuilt from those — exact;
/// - else, if the operand covers the whole watched word (8 bytes or more): the bytes are the
///   watched word (the part of the access the trap proves);
/// - they did not and the operand is narrower: which bytes of the word it touched is unknown;
///   the hit is dropped ([`DropReason::WatchBytesUnknown`]) rather than guessed.
fn watch(s: &Sample, info: &PcInfo, feeder: Option<&Insn>, out: &mut Accesses) {
    let (Some(addr), Some(prev)) = (s.addr, info.prev.as_ref()) else {
        return;
    };
    if let Some(regs) = s.regs.as_ref() {
        for m in prev.mem() {
            let rebuilt;
            let regs = if prev.address_survives(m) {
                regs
            } else if let Some(r) = feeder.and_then(|f| rebuild_pointer(f, prev, m, regs)) {
                rebuilt = r;
                &rebuilt
            } else {
                continue;
            };
            if let Ok(a) = effective_address(m, regs) {
                if a < addr.wrapping_add(WATCH_LEN) && addr < a.wrapping_add(m.size as u64) {
                    push_operand(s, prev.pc, m, Ok(a), out);
                    return;
                }
            }
        }
    }
    let Some(m) = pick_operand(prev, s, addr) else {
        return;
    };
    if (m.size as u64) < WATCH_LEN {
        out.watch_unknown += 1;
        return;
    }
    let word = MemOperand {
        size: WATCH_LEN as u8,
        ..*m
    };
    push_operand(s, prev.pc, &word, Ok(addr), out);
}

/// The registers at `access` with the one address register it overwrote rebuilt from how
/// `feeder` (the instruction right before it) made it, when the access left the feeder's
/// inputs alone.
fn rebuild_pointer(
    feeder: &Insn,
    access: &Insn,
    m: &MemOperand,
    regs: &laser_driver::UserRegs,
) -> Option<laser_driver::UserRegs> {
    let Some((
        dst,
        RegEffect::Sum {
            base,
            index,
            scale,
            disp,
        },
    )) = feeder.reg_effect
    else {
        return None;
    };
    let lost = access.writes_regs & m.address_regs();
    let inputs = base.map_or(0, |r| 1u32 << r as u32) | index.map_or(0, |r| 1u32 << r as u32);
    if lost != 1 << dst as u32 || access.writes_regs & inputs != 0 {
        return None;
    }
    let get = |r: Option<Reg>| r.map_or(Some(0), |r| regs.get(r));
    let v = get(base)?
        .wrapping_add(get(index)?.wrapping_mul(scale as u64))
        .wrapping_add(disp);
    let mut out = *regs;
    out.set(dst, v);
    Some(out)
}

/// What a precise sample's `data_src` makes of it, as `perf c2c` counts (`c2c_decode_stats`):
/// a load that found the line modified in another core (HITM) or, where the hardware reports
/// transfers rather than HITM (AMD IBS), took it from a peer cache, is a contention event with
/// the sample's weight; any other load (an L1 hit, a forwarded clean line) is not, and is
/// dropped — it would otherwise pair with the last writer and count a transfer the hardware
/// says did not happen. Stores carry no snoop result (Intel) so they count nothing (weight 0)
/// but still tell the line model who writes which bytes: the next HITM load from another
/// thread pairs with them, which gives the report its byte map and writers. `None`: no
/// `data_src`, or one naming no level (decoded op and sample weight used as they are).
fn precise_weight(s: &Sample) -> Option<Option<u64>> {
    let ds = laser_driver::datasrc::DataSrc::decode(s.data_src?);
    if !ds.names_a_level() {
        return None; // only the op is known: decoded op and sample weight as they are
    }
    Some(if ds.is_store() {
        Some(0)
    } else if ds.is_load() && !ds.is_hitm() {
        None
    } else {
        Some(s.weight.max(1))
    })
}

fn precise(s: &Sample, info: &PcInfo, out: &mut Accesses) {
    let Some(addr) = s.addr else {
        return;
    };
    let weight = match precise_weight(s) {
        Some(Some(w)) => w,
        Some(None) => return,
        None => s.weight.max(1),
    };
    let decoded = info.at.as_ref().and_then(|i| pick_operand(i, s, addr));
    let op = match (decoded.map(|m| m.op), s.data_src.and_then(op_from_data_src)) {
        // Decoding knows RMW; the PMU reports an RMW as its load or its store half.
        (Some(Op::Rmw), _) => Op::Rmw,
        (_, Some(op)) => op,
        (Some(op), None) => op,
        (None, None) => return,
    };
    let size = decoded.map_or(8, |m| m.size);
    let m = MemOperand {
        op,
        size,
        ..decoded
            .copied()
            .unwrap_or(crate::decode::classify::EMPTY_MEM)
    };
    if m.is_stack() {
        out.stack += 1;
        return;
    }
    out.push(Access {
        tid: s.tid,
        time: s.time,
        pc: s.ip,
        addr,
        size,
        op,
        weight,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::code::MemoryCode;
    use crate::decode::pccache::PcCache;
    use iced_x86::code_asm::*;
    use laser_driver::{Reg, UserRegs};

    const F: u64 = 0x40_1000;

    /// ```text
    ///  i0: mov rsi,[rcx]     load, rcx survives
    ///  i1: add rsi,1         no memory
    ///  i2: mov [rcx+8],rsi   store
    ///  i3: mov rax,[rax]     load that overwrites its base
    ///  i4: nop
    ///  i5: mov rdx,fs:[0x28] TLS
    ///  i6: push rbx          stack
    ///  i7: nop
    ///  i8: ret
    /// ```
    fn setup() -> (MemoryCode, Vec<u64>) {
        let mut a = CodeAssembler::new(64).unwrap();
        a.mov(rsi, qword_ptr(rcx)).unwrap();
        a.add(rsi, 1).unwrap();
        a.mov(qword_ptr(rcx + 8), rsi).unwrap();
        a.mov(rax, qword_ptr(rax)).unwrap();
        a.nop().unwrap();
        a.mov(rdx, qword_ptr(0x28).fs()).unwrap();
        a.push(rbx).unwrap();
        a.nop().unwrap();
        a.ret().unwrap();
        let bytes = a.assemble(F).unwrap();
        let offs = crate::test_util::starts(F, &bytes);
        let mut m = MemoryCode::new();
        m.add_function(F, bytes);
        (m, offs)
    }

    fn soft_sample(ip: u64) -> Sample {
        let mut r = UserRegs::default();
        r.set(Reg::Cx, 0x60_0000);
        r.set(Reg::Ax, 0x70_0000);
        r.set(Reg::Bx, 0);
        r.set(Reg::Si, 5);
        r.set(Reg::Sp, 0x7fff_0000);
        Sample {
            backend: BackendKind::Soft,
            pid: 1,
            tid: 11,
            cpu: 0,
            time: 100,
            ip,
            addr: None,
            data_src: None,
            weight: 100_000,
            regs: Some(r),
            watch_slot: None,
            callers: Default::default(),
        }
    }

    fn run(m: &MemoryCode, s: &Sample) -> (Result<(), DropReason>, Vec<Access>) {
        let mut c = PcCache::new();
        let info = c.get(s.ip, m);
        let mut out = Accesses::default();
        let r = resolve(
            s,
            &info,
            c.skid_paths(&info),
            &FrameSlots::default(),
            &mut out,
        );
        (r, out.iter().copied().collect())
    }

    /// The sampled flags decide whether a store skipped by a branch ran:
    /// ```text
    ///  test bl,1 ; jnz skip ; mov [r12],r14 ; skip: add r14,r15   ← sample here
    ///  ZF=1 (even): jnz not taken → the store ran  → access at [r12]
    ///  ZF=0 (odd):  jnz taken     → it did not     → no access
    /// ```
    #[test]
    fn soft_join_uses_the_flags_to_tell_whether_the_skipped_store_ran() {
        let mut a = CodeAssembler::new(64).unwrap();
        let mut skip = a.create_label();
        a.test(bl, 1).unwrap();
        a.jnz(skip).unwrap();
        a.mov(qword_ptr(r12), r14).unwrap();
        a.set_label(&mut skip).unwrap();
        a.add(r14, r15).unwrap();
        a.ret().unwrap();
        let bytes = a.assemble(F).unwrap();
        let pcs = crate::test_util::starts(F, &bytes);
        let mut m = MemoryCode::new();
        m.add_function(F, bytes);
        for (zf, ran) in [(true, true), (false, false)] {
            let mut s = soft_sample(pcs[3]);
            let r = s.regs.as_mut().unwrap();
            r.set(Reg::R12, 0x60_0040);
            r.set(Reg::Flags, if zf { 0x246 } else { 0x202 });
            let (_, acc) = run(&m, &s);
            let stores: Vec<_> = acc.iter().filter(|a| a.op == Op::Store).collect();
            if ran {
                assert_eq!(stores.len(), 1, "ZF=1: fell through, the store ran");
                assert_eq!((stores[0].pc, stores[0].addr), (pcs[2], 0x60_0040));
            } else {
                assert!(stores.is_empty(), "ZF=0: jumped over the store");
            }
        }
        // Without flags in the sample nothing can be said: no access from the predecessor.
        let mut s = soft_sample(pcs[3]);
        s.regs.as_mut().unwrap().mask &= !(1 << Reg::Flags as u8);
        assert!(run(&m, &s).1.iter().all(|a| a.op != Op::Store));
    }

    #[test]
    fn soft_uses_previous_load_when_its_base_survives() {
        let (m, pcs) = setup();
        let (r, v) = run(&m, &soft_sample(pcs[1]));
        assert_eq!(r, Ok(()));
        assert_eq!(v.len(), 1);
        assert_eq!(
            (v[0].pc, v[0].addr, v[0].op, v[0].size),
            (pcs[0], 0x60_0000, Op::Load, 8)
        );
        assert_eq!(
            (v[0].tid, v[0].time, v[0].weight),
            (11, 100, 1),
            "soft counts once"
        );
    }

    #[test]
    fn soft_uses_the_instruction_at_ip_and_before() {
        let (m, pcs) = setup();
        // At i2 (store [rcx+8]); before it i1 has no memory and leaves rcx alone, so the walk
        // back reaches i0's load [rcx].
        let (_, v) = run(&m, &soft_sample(pcs[2]));
        let got: Vec<_> = v.iter().map(|a| (a.pc, a.addr, a.op)).collect();
        assert_eq!(
            got,
            vec![
                (pcs[2], 0x60_0008, Op::Store),
                (pcs[0], 0x60_0000, Op::Load)
            ]
        );
        // At i3 (load [rax]), prev i2 store [rcx+8]: both.
        let (_, v) = run(&m, &soft_sample(pcs[3]));
        let got: Vec<_> = v.iter().map(|a| (a.pc, a.addr, a.op)).collect();
        assert_eq!(
            got,
            vec![
                (pcs[3], 0x70_0000, Op::Load),
                (pcs[2], 0x60_0008, Op::Store)
            ]
        );
    }

    #[test]
    fn previous_instruction_writing_its_address_register_is_not_used() {
        let (m, pcs) = setup();
        // At i4 (nop), prev i3 = mov rax,[rax]: rax now holds the loaded value, not the address.
        let (r, v) = run(&m, &soft_sample(pcs[4]));
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(r, Err(DropReason::NoMemory));
    }

    #[test]
    fn tls_and_stack_are_dropped_with_reasons() {
        let (m, pcs) = setup();
        assert_eq!(
            run(&m, &soft_sample(pcs[5])).0,
            Err(DropReason::ThreadLocal)
        );
        assert_eq!(run(&m, &soft_sample(pcs[6])).0, Err(DropReason::Stack));
        // After `push`, rsp has moved: the push's address is not recomputable (and is stack anyway).
        assert_eq!(run(&m, &soft_sample(pcs[7])).0, Err(DropReason::NoMemory));
    }

    #[test]
    fn soft_without_registers() {
        let (m, pcs) = setup();
        let mut s = soft_sample(pcs[0]);
        s.regs = None;
        assert_eq!(run(&m, &s).0, Err(DropReason::MissingRegs));
    }

    #[test]
    fn watch_decodes_the_previous_instruction() {
        let (m, pcs) = setup();
        let mut s = soft_sample(pcs[3]); // trap after the store at i2
        s.backend = BackendKind::Watch;
        s.addr = Some(0x60_0008);
        s.weight = 1;
        s.regs = None;
        let (_, v) = run(&m, &s);
        assert_eq!(v.len(), 1);
        assert_eq!(
            (v[0].pc, v[0].addr, v[0].op, v[0].size),
            (pcs[2], 0x60_0008, Op::Store, 8)
        );
    }

    /// A code window's trap is before the instruction at the IP runs: its operand is
    /// computed from the registers it is about to use (here i3, `mov rax,[rax]`, whose base
    /// a data watchpoint's trap — after it ran — could not have recovered), not the previous
    /// instruction's.
    #[test]
    fn code_hit_decodes_the_instruction_at_the_ip_with_its_registers() {
        let (m, pcs) = setup();
        let mut s = soft_sample(pcs[3]);
        s.backend = BackendKind::Watch;
        s.addr = Some(pcs[3]);
        s.weight = 1;
        assert!(is_code_hit(&s));
        let (r, v) = run(&m, &s);
        assert_eq!(r, Ok(()));
        assert_eq!(v.len(), 1);
        assert_eq!(
            (v[0].pc, v[0].addr, v[0].op, v[0].size),
            (pcs[3], 0x70_0000, Op::Load, 8)
        );
        // A data watchpoint's hit names the watched word, never the code.
        s.addr = Some(0x60_0008);
        assert!(!is_code_hit(&s));
        // No registers: nothing can be said.
        s.addr = Some(pcs[3]);
        s.regs = None;
        assert_eq!(run(&m, &s).0, Err(DropReason::MissingRegs));
    }

    #[test]
    fn watch_uses_the_exact_address_when_registers_survived() {
        let (m, pcs) = setup();
        // Trap after `mov [rcx+8],rsi` on a watchpoint at 0x60_0008 … but say the kernel
        // reported the watched word 0x60_0004 (an 8-byte watch over bytes 4..12).
        let mut s = soft_sample(pcs[3]);
        s.backend = BackendKind::Watch;
        s.addr = Some(0x60_0004);
        s.weight = 1;
        let (_, v) = run(&m, &s);
        assert_eq!((v[0].pc, v[0].addr, v[0].size), (pcs[2], 0x60_0008, 8));
        // Registers that do not reach the watched word: fall back to the reported address.
        s.regs.as_mut().unwrap().set(Reg::Cx, 0x90_0000);
        let (_, v) = run(&m, &s);
        assert_eq!(v[0].addr, 0x60_0004);
    }

    /// Two threads' 4-byte counters share one 8-byte watched word W (issue 11, class 5):
    /// ```text
    ///  i0: mov [rdi],esi      t0: rdi = W, t1: rdi = W+4    (rdi survives: exact)
    ///  i1: mov eax,[rax]      ◀ trap of i0                  (rax overwritten, origin unknown)
    ///  i2: lea rax,[rdi]      ◀ trap of i1
    ///  i3: mov eax,[rax]                                    (rax overwritten, made by i2)
    ///  i4: nop                ◀ trap of i3
    ///        W            W+4          W+8
    ///        │ t0 counter │ t1 counter │
    /// ```
    /// Every hit is pure false sharing; t1's load placed at the reported W would overlap t0's
    /// counter and call the line true sharing.
    #[test]
    fn watch_hits_on_two_counters_in_one_word_stay_false_sharing() {
        const W: u64 = 0x60_0000;
        let mut a = CodeAssembler::new(64).unwrap();
        a.mov(dword_ptr(rdi), esi).unwrap();
        a.mov(eax, dword_ptr(rax)).unwrap();
        a.lea(rax, qword_ptr(rdi)).unwrap();
        a.mov(eax, dword_ptr(rax)).unwrap();
        a.nop().unwrap();
        a.ret().unwrap();
        let bytes = a.assemble(F).unwrap();
        let pcs = crate::test_util::starts(F, &bytes);
        let mut m = MemoryCode::new();
        m.add_function(F, bytes);
        let hit = |tid: u32, time: u64, ip: u64, ptr: u64| {
            let mut s = soft_sample(ip);
            s.backend = BackendKind::Watch;
            s.tid = tid;
            s.time = time;
            s.addr = Some(W); // the kernel reports the watched word
            s.weight = 1;
            let r = s.regs.as_mut().unwrap();
            r.set(Reg::Di, ptr);
            r.set(Reg::Ax, 0x1234_5678); // the loaded value, not an address
            s
        };
        let mut est = crate::model::estimate::Estimator::new(64);
        est.begin_window(W, 0);
        for k in 0..20u64 {
            let (tid, ptr) = if k % 2 == 0 { (1, W) } else { (2, W + 4) };
            let (r, v) = run(&m, &hit(tid, 10 + k, pcs[1], ptr));
            assert_eq!(r, Ok(()));
            assert_eq!((v[0].addr, v[0].size, v[0].op), (ptr, 4, Op::Store));
            est.observe(&v[0]);
            // Each thread also reads its own counter through the pointer i2 made.
            let (_, v) = run(&m, &hit(tid, 10 + k, pcs[4], ptr));
            assert_eq!((v[0].pc, v[0].addr, v[0].size), (pcs[3], ptr, 4));
            est.observe(&v[0]);
        }
        est.end_window(W, 100);
        let e = &est.estimates()[0];
        assert!(e.false_transfers > 0, "{e:?}");
        assert_eq!(e.true_transfers, 0, "{e:?}");
        // A load through a pointer of unknown origin: which half it read is unknown, so it is
        // not counted (the watched word's start would be a guess).
        let (r, v) = run(&m, &hit(2, 50, pcs[2], W + 4));
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(r, Err(DropReason::WatchBytesUnknown));
    }

    #[test]
    fn precise_uses_data_src_and_decoded_size() {
        let (m, pcs) = setup();
        let mut s = soft_sample(pcs[0]);
        s.backend = BackendKind::Pebs;
        s.addr = Some(0x60_0000);
        s.data_src = Some(0x2 | (1 << 5));
        s.weight = 1000;
        let (_, v) = run(&m, &s);
        assert_eq!(
            (v[0].op, v[0].size, v[0].weight, v[0].pc),
            (Op::Load, 8, 1000, pcs[0])
        );
        assert_eq!(op_from_data_src(0x4), Some(Op::Store));
    }

    #[test]
    fn precise_hitm_loads_count_stores_are_layout_other_loads_drop() {
        let (m, pcs) = setup();
        let mut s = soft_sample(pcs[0]);
        s.backend = BackendKind::Pebs;
        s.addr = Some(0x60_0000);
        s.weight = 19;
        // Intel "L3 hit, snoop HITM" (pebs_data_source[0x07]).
        s.data_src = Some(0x6_0080_0842);
        let (_, v) = run(&m, &s);
        assert_eq!((v.len(), v[0].weight, v[0].op), (1, 19, Op::Load));
        // An L1 hit (OP_LOAD | HIT | L1 | snoop NONE): no transfer, no access.
        s.data_src = Some(0x2 | (0x0a << 5) | (0x02 << 19));
        let (_, v) = run(&m, &s);
        assert!(v.is_empty());
        // A forwarded load (L3 hit, snoopx FWD) is not HITM for c2c either.
        s.data_src = Some(0x2 | (0x42 << 5) | (1 << 38));
        assert!(run(&m, &s).1.is_empty());
        // A store: layout only.
        let mut st = soft_sample(pcs[2]);
        st.backend = BackendKind::Pebs;
        st.addr = Some(0x60_0008);
        st.weight = 10007;
        st.data_src = Some(0x4 | (0x0a << 5));
        let (_, v) = run(&m, &st);
        assert_eq!((v.len(), v[0].weight, v[0].op), (1, 0, Op::Store));
        assert_eq!(op_from_data_src(0x1), None);
    }
}
