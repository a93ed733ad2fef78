//! What one instruction does to memory, decoded once per PC with iced-x86.
//!
//! The detector needs, per instruction: whether it loads, stores or read-modify-writes memory,
//! how many bytes, whether it is locked, and the memory operand's shape (base, index, scale,
//! displacement, segment) so [`crate::decode::effaddr`] can recompute the address from sampled
//! registers. It also needs which general-purpose registers the instruction writes: an
//! instruction that has already executed (the one *before* a skidded timer sample) gives an
//! exact address only if it did not overwrite its own address registers.
//!
//! iced's `InstructionInfoFactory` reports implicit memory operands too (push/pop/call/ret,
//! string instructions), so `movs` yields two operands and `push` one `[rsp-8]` store.

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic,
    OpAccess, OpKind, Register,
};
use laser_driver::Reg;

use crate::model::findings::Op;

/// Segment override of a memory operand. Only `%fs`/`%gs` matter in 64-bit user code: their
/// base is the thread pointer, which a sample does not carry, so such accesses are thread-local
/// and dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Segment {
    Flat,
    Fs,
    Gs,
}

/// One memory operand of an instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemOperand {
    pub op: Op,
    /// Bytes accessed, 1..=64 (`memory_size` of the operand; vectors included).
    pub size: u8,
    pub base: Option<Reg>,
    pub index: Option<Reg>,
    pub scale: u8,
    /// Displacement; for rip-relative operands iced already folded in the next ip, so this is
    /// the absolute address and `base`/`index` are `None`.
    pub disp: u64,
    pub segment: Segment,
    pub rip_relative: bool,
    /// 32-bit address-size prefix (`addr32`): the sum is truncated to 32 bits.
    pub addr32: bool,
}

impl Insn {
    /// `rep movs` / `rep stos`: the instructions the CPU's fast-string microcode runs, which an
    /// enabled data breakpoint turns off (see [`crate::model::armed_cost`]).
    pub fn is_fast_string(&self) -> bool {
        self.rep
            && self.mem[..usize::from(self.n_mem)]
                .iter()
                .any(|m| m.op.writes())
    }
}

impl MemOperand {
    /// Registers this operand's address is computed from, as a `Reg` bit mask.
    pub fn address_regs(&self) -> u32 {
        let mut m = 0;
        if let Some(b) = self.base {
            m |= 1 << b as u32;
        }
        if let Some(i) = self.index {
            m |= 1 << i as u32;
        }
        m
    }

    /// Stack-pointer-relative (`push`, `pop`, `call`, `[rsp+8]`): always thread-private.
    pub fn is_stack(&self) -> bool {
        self.base == Some(Reg::Sp)
    }
}

/// The decoded facts the detector keeps per PC. `Copy` and small so the PC cache holds it
/// inline and a sample never allocates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    pub pc: u64,
    pub len: u8,
    /// Up to two memory operands (string moves and compares have two); `n_mem` says how many.
    pub mem: [MemOperand; 2],
    pub n_mem: u8,
    /// `lock` prefix, or `xchg` with a memory operand (implicitly locked).
    pub locked: bool,
    /// `movs`, `stos`, `lods`, `cmps`, `scas` (with or without `rep`).
    pub string: bool,
    /// `rep`/`repne` prefix on a string instruction: the address registers advance, so only the
    /// first element's address is known.
    pub rep: bool,
    /// Mask (bit N = `Reg` N) of the 64-bit registers this instruction writes.
    pub writes_regs: u32,
    /// Execution can continue at `pc + len` (false for `jmp`, `ret`, `ud2`, …). Calls are
    /// counted as not falling through: the instruction executed just before the return address
    /// is the callee's `ret`, not the call.
    pub falls_through: bool,
    /// Direct branch target, if any (for finding join points in the linear sweep).
    pub branch_target: Option<u64>,
    /// For a conditional jump (`jcc`): its condition, which sampled RFLAGS can evaluate.
    pub branch_cond: Option<iced_x86::ConditionCode>,
    /// Writes any status flag (so flags sampled after it no longer say how a jump went).
    pub writes_flags: bool,
    /// When the instruction's only register write is an invertible or constant one on a
    /// 64-bit register (see [`RegEffect`]): which register and how. A walk back from a skidded
    /// sample uses it to recover that register's earlier value from the sampled one.
    pub reg_effect: Option<(Reg, RegEffect)>,
    /// `mov m64,%r64`: the register that now holds the 8 bytes at the memory operand (the
    /// -O0 reload of a pointer from its stack slot, [`crate::decode::frame_slots`]).
    pub loads_reg: Option<Reg>,
}

/// A register write whose old value (or whose new value) is known without running the code.
///
/// ```text
///   sub $8,%rax          Add(-8)   rax_before = rax_after + 8       (invertible)
///   lea 0x10(%rdx),%rdx  Add(16)   inc / dec: Add(±1)
///   mov $5,%ecx          Set(5)    rcx_after  = 5  (32-bit writes zero-extend: still exact)
///   xor %ebx,%ebx        Set(0)
///   lea 4(%r12),%rax     Sum { r12 + 4 }  rax_after from other registers (also `mov %r12,%rax`)
/// ```
/// 32-bit `add`/`sub` are not here: they zero-extend a truncated sum, which is not invertible.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegEffect {
    /// `after = before + k` (wrapping).
    Add(u64),
    /// `after = k`.
    Set(u64),
    /// `after = base + index * scale + disp` over other registers' values (`lea`, `mov` of a
    /// 64-bit register): what a pointer the next instruction overwrites was made from.
    Sum {
        base: Option<Reg>,
        index: Option<Reg>,
        scale: u8,
        disp: u64,
    },
}

impl Insn {
    pub fn mem(&self) -> &[MemOperand] {
        &self.mem[..self.n_mem as usize]
    }

    pub fn next_ip(&self) -> u64 {
        self.pc.wrapping_add(self.len as u64)
    }

    /// Whether the instruction's first memory operand's address survives its execution: true
    /// when it wrote none of its own address registers.
    pub fn address_survives(&self, m: &MemOperand) -> bool {
        self.writes_regs & m.address_regs() == 0
    }
}

pub(crate) const EMPTY_MEM: MemOperand = MemOperand {
    op: Op::Load,
    size: 0,
    base: None,
    index: None,
    scale: 1,
    disp: 0,
    segment: Segment::Flat,
    rip_relative: false,
    addr32: false,
};

/// Map an iced register to the perf register holding its 64-bit container.
pub fn perf_reg(r: Register) -> Option<Reg> {
    Some(match r.full_register() {
        Register::RAX => Reg::Ax,
        Register::RBX => Reg::Bx,
        Register::RCX => Reg::Cx,
        Register::RDX => Reg::Dx,
        Register::RSI => Reg::Si,
        Register::RDI => Reg::Di,
        Register::RBP => Reg::Bp,
        Register::RSP => Reg::Sp,
        Register::R8 => Reg::R8,
        Register::R9 => Reg::R9,
        Register::R10 => Reg::R10,
        Register::R11 => Reg::R11,
        Register::R12 => Reg::R12,
        Register::R13 => Reg::R13,
        Register::R14 => Reg::R14,
        Register::R15 => Reg::R15,
        Register::RIP => Reg::Ip,
        _ => return None,
    })
}

fn op_of(a: OpAccess) -> Option<Op> {
    match a {
        OpAccess::Read | OpAccess::CondRead => Some(Op::Load),
        OpAccess::Write | OpAccess::CondWrite => Some(Op::Store),
        OpAccess::ReadWrite | OpAccess::ReadCondWrite => Some(Op::Rmw),
        _ => None,
    }
}

fn is_string(m: Mnemonic) -> bool {
    matches!(
        m,
        Mnemonic::Movsb
            | Mnemonic::Movsw
            | Mnemonic::Movsd
            | Mnemonic::Movsq
            | Mnemonic::Stosb
            | Mnemonic::Stosw
            | Mnemonic::Stosd
            | Mnemonic::Stosq
            | Mnemonic::Lodsb
            | Mnemonic::Lodsw
            | Mnemonic::Lodsd
            | Mnemonic::Lodsq
            | Mnemonic::Cmpsb
            | Mnemonic::Cmpsw
            | Mnemonic::Cmpsd
            | Mnemonic::Cmpsq
            | Mnemonic::Scasb
            | Mnemonic::Scasw
            | Mnemonic::Scasd
            | Mnemonic::Scasq
    )
}

/// Reusable decoding state: iced's info factory keeps scratch buffers, so one per detector.
pub struct Classifier {
    factory: InstructionInfoFactory,
}

impl Default for Classifier {
    fn default() -> Self {
        Self::new()
    }
}

impl Classifier {
    pub fn new() -> Self {
        Self {
            factory: InstructionInfoFactory::new(),
        }
    }

    /// Decode the instruction at the start of `bytes` (which lie at run-time address `pc`).
    /// `None` if the bytes are not a valid instruction.
    pub fn classify(&mut self, pc: u64, bytes: &[u8]) -> Option<Insn> {
        let mut d = Decoder::with_ip(64, bytes, pc, DecoderOptions::NONE);
        if !d.can_decode() {
            return None;
        }
        let ins = d.decode();
        if ins.is_invalid() {
            return None;
        }
        Some(self.classify_decoded(&ins))
    }

    /// Classify an already-decoded instruction (the linear sweep decodes whole functions).
    pub fn classify_decoded(&mut self, ins: &Instruction) -> Insn {
        let info = self.factory.info(ins);
        let mut out = Insn {
            pc: ins.ip(),
            len: ins.len() as u8,
            mem: [EMPTY_MEM; 2],
            n_mem: 0,
            locked: ins.has_lock_prefix(),
            string: is_string(ins.mnemonic()),
            rep: false,
            writes_regs: 0,
            falls_through: true,
            branch_target: None,
            branch_cond: None,
            writes_flags: ins.rflags_modified() != 0,
            reg_effect: reg_effect(ins),
            loads_reg: loads_reg(ins),
        };
        out.rep = out.string && (ins.has_rep_prefix() || ins.has_repne_prefix());
        for r in info.used_registers() {
            let writes = matches!(
                r.access(),
                OpAccess::Write
                    | OpAccess::CondWrite
                    | OpAccess::ReadWrite
                    | OpAccess::ReadCondWrite
            );
            if writes {
                if let Some(p) = perf_reg(r.register()) {
                    out.writes_regs |= 1 << p as u32;
                }
            }
        }
        let rip_rel = ins.is_ip_rel_memory_operand();
        for m in info.used_memory() {
            let Some(op) = op_of(m.access()) else {
                continue; // lea, nop [m], prefetch: address computed, memory untouched
            };
            if out.n_mem as usize == out.mem.len() {
                break;
            }
            let segment = match m.segment() {
                Register::FS => Segment::Fs,
                Register::GS => Segment::Gs,
                _ => Segment::Flat,
            };
            let size = m.memory_size().size().clamp(1, 64) as u8;
            out.mem[out.n_mem as usize] = MemOperand {
                op,
                size,
                base: perf_reg(m.base()),
                index: perf_reg(m.index()),
                scale: m.scale() as u8,
                disp: m.displacement(),
                segment,
                rip_relative: rip_rel && m.base() == Register::None && m.index() == Register::None,
                addr32: m.address_size() == iced_x86::CodeSize::Code32,
            };
            out.n_mem += 1;
        }
        // xchg with memory is locked by the architecture, with or without the prefix.
        if ins.mnemonic() == Mnemonic::Xchg
            && (ins.op0_kind() == OpKind::Memory || ins.op1_kind() == OpKind::Memory)
        {
            out.locked = true;
        }
        out.falls_through = matches!(
            ins.flow_control(),
            FlowControl::Next | FlowControl::ConditionalBranch | FlowControl::XbeginXabortXend
        ) && ins.code() != Code::Ud2;
        if matches!(
            ins.flow_control(),
            FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch | FlowControl::Call
        ) && matches!(
            ins.op0_kind(),
            OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
        ) {
            out.branch_target = Some(ins.near_branch_target());
            if ins.is_jcc_short_or_near() {
                out.branch_cond = Some(ins.condition_code());
            }
        }
        out
    }
}

/// The destination of a plain 64-bit load into a register (`mov m64,%r64`), not through
/// `%fs`/`%gs` (thread-local data is not the stack).
fn loads_reg(ins: &Instruction) -> Option<Reg> {
    if ins.mnemonic() != Mnemonic::Mov
        || ins.op0_kind() != OpKind::Register
        || ins.op1_kind() != OpKind::Memory
        || !ins.op0_register().is_gpr64()
        || matches!(ins.segment_prefix(), Register::FS | Register::GS)
    {
        return None;
    }
    perf_reg(ins.op0_register())
}

/// The [`RegEffect`] of `ins`, when it is one of the simple forms (register destination, no
/// memory, no other register written).
fn reg_effect(ins: &Instruction) -> Option<(Reg, RegEffect)> {
    if ins.op0_kind() != OpKind::Register || ins.has_lock_prefix() {
        return None;
    }
    let r0 = ins.op0_register();
    let (is64, is32) = (r0.is_gpr64(), r0.is_gpr32());
    let reg = perf_reg(r0)?;
    let imm1 = matches!(
        ins.op1_kind(),
        OpKind::Immediate8
            | OpKind::Immediate32
            | OpKind::Immediate64
            | OpKind::Immediate8to32
            | OpKind::Immediate8to64
            | OpKind::Immediate32to64
    );
    let same_reg =
        ins.op_count() == 2 && ins.op1_kind() == OpKind::Register && ins.op1_register() == r0;
    let effect = match ins.mnemonic() {
        // iced gives immediates sign-extended to the operand size, as the CPU applies them.
        Mnemonic::Add if is64 && imm1 => RegEffect::Add(ins.immediate(1)),
        Mnemonic::Sub if is64 && imm1 => RegEffect::Add(ins.immediate(1).wrapping_neg()),
        Mnemonic::Inc if is64 => RegEffect::Add(1),
        Mnemonic::Dec if is64 => RegEffect::Add(u64::MAX),
        Mnemonic::Lea
            if is64
                && ins.memory_base() == r0
                && ins.memory_index() == Register::None
                && !ins.is_ip_rel_memory_operand() =>
        {
            RegEffect::Add(ins.memory_displacement64())
        }
        Mnemonic::Lea
            if is64
                && !ins.is_ip_rel_memory_operand()
                && ins.memory_base() != r0
                && ins.memory_index() != r0
                && (ins.memory_base() == Register::None || ins.memory_base().is_gpr64())
                && (ins.memory_index() == Register::None || ins.memory_index().is_gpr64()) =>
        {
            RegEffect::Sum {
                base: perf_reg(ins.memory_base()),
                index: perf_reg(ins.memory_index()),
                scale: ins.memory_index_scale() as u8,
                disp: ins.memory_displacement64(),
            }
        }
        Mnemonic::Mov
            if is64
                && ins.op1_kind() == OpKind::Register
                && ins.op1_register().is_gpr64()
                && !same_reg =>
        {
            RegEffect::Sum {
                base: perf_reg(ins.op1_register()),
                index: None,
                scale: 1,
                disp: 0,
            }
        }
        Mnemonic::Mov if is64 && imm1 => RegEffect::Set(ins.immediate(1)),
        Mnemonic::Mov if is32 && imm1 => RegEffect::Set(ins.immediate(1) & 0xffff_ffff),
        Mnemonic::Xor | Mnemonic::Sub if (is64 || is32) && same_reg => RegEffect::Set(0),
        _ => return None,
    };
    Some((reg, effect))
}

/// Whether a conditional jump with condition `cc` is taken under `rflags` (x86 encoding:
/// CF bit 0, PF 2, ZF 6, SF 7, OF 11).
pub fn condition_holds(cc: iced_x86::ConditionCode, rflags: u64) -> bool {
    use iced_x86::ConditionCode as C;
    let f = |bit: u32| rflags & (1 << bit) != 0;
    let (cf, pf, zf, sf, of) = (f(0), f(2), f(6), f(7), f(11));
    match cc {
        C::None => true,
        C::o => of,
        C::no => !of,
        C::b => cf,
        C::ae => !cf,
        C::e => zf,
        C::ne => !zf,
        C::be => cf || zf,
        C::a => !cf && !zf,
        C::s => sf,
        C::ns => !sf,
        C::p => pf,
        C::np => !pf,
        C::l => sf != of,
        C::ge => sf == of,
        C::le => zf || sf != of,
        C::g => !zf && sf == of,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_evaluate_on_rflags() {
        use iced_x86::ConditionCode as C;
        const CF: u64 = 1;
        const ZF: u64 = 1 << 6;
        const SF: u64 = 1 << 7;
        const OF: u64 = 1 << 11;
        assert!(condition_holds(C::ne, 0) && !condition_holds(C::ne, ZF));
        assert!(condition_holds(C::e, ZF));
        assert!(condition_holds(C::b, CF) && !condition_holds(C::ae, CF));
        assert!(condition_holds(C::be, ZF) && !condition_holds(C::a, ZF));
        assert!(condition_holds(C::a, 0));
        assert!(condition_holds(C::l, SF) && condition_holds(C::l, OF));
        assert!(!condition_holds(C::l, SF | OF) && condition_holds(C::ge, SF | OF));
        assert!(condition_holds(C::le, ZF) && !condition_holds(C::g, ZF));
        assert!(condition_holds(C::g, 0));
        assert!(condition_holds(C::s, SF) && condition_holds(C::ns, 0));
        assert!(condition_holds(C::o, OF) && condition_holds(C::no, 0));
    }
    use iced_x86::code_asm::*;

    const BASE: u64 = 0x40_1000;

    /// Assemble one instruction at `BASE` and classify it.
    fn one(f: impl FnOnce(&mut CodeAssembler) -> Result<(), IcedError>) -> Insn {
        let mut a = CodeAssembler::new(64).unwrap();
        f(&mut a).unwrap();
        let bytes = a.assemble(BASE).unwrap();
        let mut c = Classifier::new();
        let i = c.classify(BASE, &bytes).expect("decodes");
        assert_eq!(i.len as usize, bytes.len(), "one instruction");
        i
    }

    fn bit(r: Reg) -> u32 {
        1 << r as u32
    }

    #[test]
    fn plain_load_and_store() {
        let ld = one(|a| a.mov(rsi, qword_ptr(rcx)));
        assert_eq!(ld.n_mem, 1);
        assert_eq!((ld.mem[0].op, ld.mem[0].size), (Op::Load, 8));
        assert_eq!(ld.mem[0].base, Some(Reg::Cx));
        assert_eq!(ld.writes_regs, bit(Reg::Si));
        assert!(ld.address_survives(&ld.mem[0]));

        let st = one(|a| a.mov(dword_ptr(rdi + 4), edx));
        assert_eq!(
            (st.mem[0].op, st.mem[0].size, st.mem[0].disp),
            (Op::Store, 4, 4)
        );
        assert_eq!(st.writes_regs, 0);

        let b = one(|a| a.mov(byte_ptr(rax), 1));
        assert_eq!((b.mem[0].op, b.mem[0].size), (Op::Store, 1));
    }

    #[test]
    fn load_overwriting_its_base_does_not_survive() {
        let i = one(|a| a.mov(rax, qword_ptr(rax + 8)));
        assert!(!i.address_survives(&i.mem[0]));
        // A 32-bit destination zero-extends into the whole register: still a write of rax.
        let j = one(|a| a.mov(eax, dword_ptr(rax)));
        assert!(!j.address_survives(&j.mem[0]));
    }

    #[test]
    fn read_modify_write_forms() {
        let add = one(|a| a.add(qword_ptr(rcx), rdx));
        assert_eq!((add.mem[0].op, add.locked), (Op::Rmw, false));
        let inc = one(|a| a.inc(dword_ptr(rcx)));
        assert_eq!((inc.mem[0].op, inc.mem[0].size), (Op::Rmw, 4));
        let xadd = one(|a| a.lock().xadd(qword_ptr(rcx), rax));
        assert_eq!((xadd.mem[0].op, xadd.locked), (Op::Rmw, true));
        assert_ne!(xadd.writes_regs & bit(Reg::Ax), 0);
        let cas = one(|a| a.lock().cmpxchg(qword_ptr(rdi), rsi));
        assert!(cas.locked);
        assert!(cas.mem[0].op.writes() && cas.mem[0].op.reads());
        assert_ne!(cas.writes_regs & bit(Reg::Ax), 0, "cmpxchg writes rax");
        let xchg = one(|a| a.xchg(qword_ptr(rdx), rax));
        assert_eq!(
            (xchg.mem[0].op, xchg.locked),
            (Op::Rmw, true),
            "xchg is implicitly locked"
        );
    }

    #[test]
    fn wide_and_non_temporal_forms() {
        let c16 = one(|a| a.lock().cmpxchg16b(xmmword_ptr(rsi)));
        assert_eq!(
            (c16.mem[0].op, c16.mem[0].size, c16.locked),
            (Op::Rmw, 16, true)
        );
        let nt = one(|a| a.movnti(qword_ptr(rdi), rax));
        assert_eq!((nt.mem[0].op, nt.mem[0].size), (Op::Store, 8));
        let z = one(|a| a.vmovdqu64(zmmword_ptr(rdi), zmm1));
        assert_eq!((z.mem[0].op, z.mem[0].size), (Op::Store, 64));
        let plain = one(|a| a.xadd(qword_ptr(rcx), rax));
        assert!(!plain.locked, "xadd without lock is not atomic");
        let or = one(|a| a.lock().or(dword_ptr(rdx), 1));
        assert_eq!(
            (or.mem[0].op, or.mem[0].size, or.locked),
            (Op::Rmw, 4, true)
        );
    }

    #[test]
    fn vector_sizes() {
        let a16 = one(|a| a.movdqa(xmmword_ptr(rsi), xmm0));
        assert_eq!((a16.mem[0].op, a16.mem[0].size), (Op::Store, 16));
        let u16 = one(|a| a.movdqu(xmm1, xmmword_ptr(rsi + 16)));
        assert_eq!((u16.mem[0].op, u16.mem[0].size), (Op::Load, 16));
        let y = one(|a| a.vmovdqu(ymmword_ptr(rdi), ymm2));
        assert_eq!((y.mem[0].op, y.mem[0].size), (Op::Store, 32));
    }

    #[test]
    fn rip_relative_is_absolute() {
        let mut a = CodeAssembler::new(64).unwrap();
        let mut data = a.create_label();
        a.mov(qword_ptr(data), rax).unwrap();
        a.nop().unwrap();
        a.set_label(&mut data).unwrap();
        a.dq(&[0]).unwrap();
        let bytes = a.assemble(BASE).unwrap();
        let i = Classifier::new().classify(BASE, &bytes).unwrap();
        assert!(i.mem[0].rip_relative);
        assert_eq!(i.mem[0].base, None);
        // The label sits after the 7-byte store and the 1-byte nop.
        assert_eq!(i.mem[0].disp, BASE + i.len as u64 + 1);
    }

    #[test]
    fn base_index_scale() {
        let i = one(|a| a.mov(qword_ptr(rbx + r12 * 8 + 0x20), rcx));
        let m = i.mem[0];
        assert_eq!(
            (m.base, m.index, m.scale, m.disp),
            (Some(Reg::Bx), Some(Reg::R12), 8, 0x20)
        );
        assert_eq!(m.address_regs(), bit(Reg::Bx) | bit(Reg::R12));
        let neg = one(|a| a.mov(eax, dword_ptr(rbp - 4)));
        assert_eq!(neg.mem[0].disp, (-4i64) as u64);
    }

    #[test]
    fn string_ops_have_both_operands_and_move_their_registers() {
        let m = one(|a| a.movsq());
        assert!(m.string && !m.rep);
        assert_eq!(m.n_mem, 2);
        let ops: Vec<_> = m.mem().iter().map(|o| (o.op, o.base)).collect();
        assert!(ops.contains(&(Op::Load, Some(Reg::Si))));
        assert!(ops.contains(&(Op::Store, Some(Reg::Di))));
        assert!(
            m.mem().iter().all(|o| !m.address_survives(o)),
            "rsi/rdi advance"
        );
        let r = one(|a| a.rep().stosb());
        assert!(r.string && r.rep);
        assert_eq!((r.mem[0].op, r.mem[0].base), (Op::Store, Some(Reg::Di)));
    }

    #[test]
    fn stack_operations_are_stack() {
        for i in [
            one(|a| a.push(rbx)),
            one(|a| a.pop(rbx)),
            one(|a| a.call(0x40_2000u64)),
            one(|a| a.ret()),
        ] {
            assert_eq!(i.n_mem, 1, "{i:?}");
            assert!(i.mem[0].is_stack(), "{i:?}");
        }
        let call = one(|a| a.call(0x40_2000u64));
        assert!(!call.falls_through);
        assert_eq!(call.branch_target, Some(0x40_2000));
    }

    #[test]
    fn register_effects_that_a_walk_back_can_undo() {
        let e = |f: fn(&mut CodeAssembler) -> Result<(), IcedError>| one(f).reg_effect;
        assert_eq!(
            e(|a| a.sub(rax, 8)),
            Some((Reg::Ax, RegEffect::Add(-8i64 as u64)))
        );
        assert_eq!(
            e(|a| a.add(rdx, -0x100)),
            Some((Reg::Dx, RegEffect::Add(-0x100i64 as u64)))
        );
        assert_eq!(
            e(|a| a.dec(r13)),
            Some((Reg::R13, RegEffect::Add(u64::MAX)))
        );
        assert_eq!(
            e(|a| a.lea(rsi, qword_ptr(rsi + 0x40))),
            Some((Reg::Si, RegEffect::Add(0x40)))
        );
        assert_eq!(e(|a| a.mov(ecx, 5)), Some((Reg::Cx, RegEffect::Set(5))));
        assert_eq!(
            e(|a| a.mov(rcx, -1i64)),
            Some((Reg::Cx, RegEffect::Set(u64::MAX)))
        );
        assert_eq!(
            e(|a| a.mov(ecx, -1)),
            Some((Reg::Cx, RegEffect::Set(0xffff_ffff))),
            "zero-extends"
        );
        assert_eq!(e(|a| a.xor(ebx, ebx)), Some((Reg::Bx, RegEffect::Set(0))));
        // Not invertible or not a register-only write.
        assert_eq!(e(|a| a.add(eax, 8)), None, "32-bit sum truncates");
        assert_eq!(e(|a| a.add(rax, rbx)), None);
        assert_eq!(e(|a| a.lea(rsi, qword_ptr(rsi + rcx))), None);
        assert_eq!(e(|a| a.add(qword_ptr(rax), 8)), None);
        assert_eq!(e(|a| a.xor(eax, ebx)), None);
        assert_eq!(e(|a| a.mov(eax, ebx)), None, "32-bit copy truncates");
        let rip_lea = {
            let mut a = CodeAssembler::new(64).unwrap();
            let mut l = a.create_label();
            a.lea(rsi, qword_ptr(l)).unwrap();
            a.set_label(&mut l).unwrap();
            a.nop().unwrap();
            let bytes = a.assemble(BASE).unwrap();
            Classifier::new().classify(BASE, &bytes).unwrap()
        };
        assert_eq!(
            rip_lea.reg_effect, None,
            "rip-relative: the pc, not a register"
        );
        // Made from other registers: how a pointer the next access overwrites was built.
        let sum = |base, index, scale, disp| RegEffect::Sum {
            base,
            index,
            scale,
            disp,
        };
        assert_eq!(
            e(|a| a.lea(rsi, qword_ptr(rdi + 0x40))),
            Some((Reg::Si, sum(Some(Reg::Di), None, 1, 0x40)))
        );
        assert_eq!(
            e(|a| a.lea(rax, qword_ptr(rdi + rcx * 4 - 8))),
            Some((Reg::Ax, sum(Some(Reg::Di), Some(Reg::Cx), 4, -8i64 as u64)))
        );
        assert_eq!(
            e(|a| a.mov(rax, r12)),
            Some((Reg::Ax, sum(Some(Reg::R12), None, 1, 0)))
        );
    }

    #[test]
    fn no_memory_and_tls() {
        let lea = one(|a| a.lea(rax, qword_ptr(rcx + 8)));
        assert_eq!(
            lea.n_mem, 0,
            "lea computes an address but touches no memory"
        );
        let tls = one(|a| a.mov(rax, qword_ptr(0x28).fs()));
        assert_eq!(tls.mem[0].segment, Segment::Fs);
        let jmp = one(|a| a.jmp(BASE + 0x40));
        assert!(!jmp.falls_through);
        assert_eq!(jmp.branch_target, Some(BASE + 0x40));
    }

    #[test]
    fn garbage_is_none() {
        let mut c = Classifier::new();
        assert_eq!(c.classify(0, &[]), None);
        assert_eq!(c.classify(0, &[0x0f]), None, "truncated");
    }
}
