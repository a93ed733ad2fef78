//! Which typed object an instruction's memory operand points into: the operand's base register
//! matched against DWARF variables at the PC, and when no variable holds it there, a walk back
//! through the function over the instructions that produced it (perf's data-type profiling
//! does the same, forwards, in `annotate-data.c`).
//!
//! ```text
//!   -O0:  mov  -0x18(%rbp),%rax      ; rax ← the stack slot of `args` (DW_OP_fbreg -40)
//!         mov  0x8(%rax),%rdx        ; access [rax+8]: rax holds `args`, so args->SX
//!
//!   -O2:  mov  0x10(%rdi),%rbx       ; rbx ← pointer member at 0x10 of *rdi (rdi = `s`)
//!         lea  0x40(%rbx),%rax       ; rax = rbx + 0x40
//!         lock addq $1,0x8(%rax)     ; access [rax+8] = *(s->stats) at 0x48
//! ```
//!
//! Walking back, `mov R,S` moves the question to S, `lea R,[S+k]` and `add R,k` add k to the
//! offset, a load from a stack slot with no variable goes on from the store that spilled it,
//! and a load `mov R,[B+k]` asks for the type of B and takes the pointer member at k. A call
//! ends the walk for a caller-saved register; any other write to the register ends it too.
//! The walk follows fall-through, and past an unconditional jump the branch that targets the
//! instruction: it is linear, so a value that differs between two paths into a join gets the
//! type of the path walked (the same approximation perf makes at basic-block joins).
//!
//! The DWARF side is behind [`Oracle`], so the walk is tested on hand-made code and facts.

use iced_x86::{FlowControl, Instruction, Mnemonic, OpKind, Register};

use crate::naming::scope_vars::{DwReg, RBP, RSP};

/// Instructions walked back at most from one access.
const MAX_STEPS: usize = 96;
/// Nested pointer loads followed (`a->b->c->d`).
const MAX_DEPTH: u32 = 4;

/// How the object's storage is named: `Var("acc")` is the object itself, `Deref("args")` the
/// object a pointer expression points at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PlaceName {
    Var(String),
    Deref(String),
}

/// How a place was found, for the report's coverage figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum How {
    /// A variable's location at the access PC is the base register.
    Variable,
    /// Found walking back over moves, offsets, spills or pointer loads.
    Tracked,
    /// The operand addresses a variable in the frame (a local struct or array).
    Stack,
    /// The operand addresses a global (RIP-relative or absolute).
    Global,
}

/// An object of a known type and an offset into it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    /// Type id in the caller's type table.
    pub(crate) ty: usize,
    pub(crate) name: PlaceName,
    /// Byte offset into the object (before normalizing into one element of an array).
    pub(crate) offset: i64,
    /// An index register or register addition moved the pointer by an unknown amount: the
    /// offset is known only modulo the element size.
    pub(crate) indexed: bool,
    pub(crate) how: How,
}

/// Why an access was left untyped. The strings are what the report's coverage counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Untyped {
    NoMemoryOperand,
    NoVariable,
    Clobbered,
    NotAPointer,
    StackNoVariable,
    GlobalNoVariable,
    NoPredecessor,
}

impl Untyped {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Untyped::NoMemoryOperand => "no memory operand",
            Untyped::NoVariable => "no variable holds the base register",
            Untyped::Clobbered => "base register computed, not moved or offset",
            Untyped::NotAPointer => "loaded value is not a pointer member",
            Untyped::StackNoVariable => "stack slot with no variable",
            Untyped::GlobalNoVariable => "global with no DWARF variable",
            Untyped::NoPredecessor => "walk reached the function start",
        }
    }
}

/// What the walk needs from DWARF.
pub(crate) trait Oracle {
    /// The object a pointer variable held in `reg` at `pc` points at (offset: register value
    /// minus the pointer's value).
    fn reg_pointer(&mut self, pc: u64, reg: DwReg) -> Option<Place>;
    /// The variable stored in memory covering `reg + disp` at `pc`, with the offset into it.
    fn frame_object(&mut self, pc: u64, reg: DwReg, disp: i64) -> Option<Place>;
    /// The global covering `addr`, with the offset into it.
    fn global_object(&mut self, addr: u64) -> Option<Place>;
    /// The object the pointer stored at `place` points at.
    fn load_pointer(&mut self, place: &Place) -> Option<Place>;
    /// A library type (every member reserved for the implementation: `std::atomic`'s
    /// `__atomic_base`, `pthread_mutex_t`): the walk goes on for the program's own type
    /// around it and keeps this one only if there is none.
    fn is_library(&mut self, place: &Place) -> bool;
}

/// x86-64 DWARF register number of a 64-bit general-purpose register.
pub(crate) fn dwarf_reg(r: Register) -> Option<DwReg> {
    Some(match r {
        Register::RAX => 0,
        Register::RDX => 1,
        Register::RCX => 2,
        Register::RBX => 3,
        Register::RSI => 4,
        Register::RDI => 5,
        Register::RBP => 6,
        Register::RSP => 7,
        Register::R8 => 8,
        Register::R9 => 9,
        Register::R10 => 10,
        Register::R11 => 11,
        Register::R12 => 12,
        Register::R13 => 13,
        Register::R14 => 14,
        Register::R15 => 15,
        _ => return None,
    })
}

/// Registers a call may change (System V): rax, rdx, rcx, rsi, rdi, r8–r11.
fn caller_saved(r: DwReg) -> bool {
    matches!(r, 0 | 1 | 2 | 4 | 5 | 8..=11)
}

/// The memory operand of `ins`, if it has one.
fn memory_operand(ins: &Instruction) -> Option<()> {
    (0..ins.op_count())
        .any(|i| ins.op_kind(i) == OpKind::Memory)
        .then_some(())
}

/// The typed place the memory operand of `insns[at]` addresses.
pub(crate) fn type_access(
    insns: &[Instruction],
    at: usize,
    oracle: &mut dyn Oracle,
) -> Result<Place, Untyped> {
    memory_operand(&insns[at]).ok_or(Untyped::NoMemoryOperand)?;
    operand_place(insns, at, oracle, 0)
}

/// The place the memory operand of `insns[at]` addresses (the operand must exist).
fn operand_place(
    insns: &[Instruction],
    at: usize,
    oracle: &mut dyn Oracle,
    depth: u32,
) -> Result<Place, Untyped> {
    let ins = &insns[at];
    let disp = ins.memory_displacement64() as i64;
    let indexed = ins.memory_index() != Register::None;
    if ins.is_ip_rel_memory_operand() {
        let mut p = oracle
            .global_object(ins.ip_rel_memory_address())
            .ok_or(Untyped::GlobalNoVariable)?;
        p.indexed |= indexed;
        return Ok(p);
    }
    let Some(base) = dwarf_reg(ins.memory_base()) else {
        // No base: an absolute address (non-PIE global), maybe indexed.
        if ins.memory_base() == Register::None {
            let mut p = oracle
                .global_object(disp as u64)
                .ok_or(Untyped::GlobalNoVariable)?;
            p.indexed |= indexed;
            return Ok(p);
        }
        return Err(Untyped::NoVariable);
    };
    if base == RSP || base == RBP {
        if let Some(mut p) = oracle.frame_object(ins.ip(), base, disp) {
            p.indexed |= indexed;
            return Ok(p);
        }
        if base == RSP {
            return Err(Untyped::StackNoVariable);
        }
        // rbp is a general register in code built without a frame pointer: walk on.
    }
    track(insns, at, base, disp, indexed, oracle, depth)
}

/// The place `reg` + `off` points at, just before `insns[at]` executes.
fn track(
    insns: &[Instruction],
    at: usize,
    mut reg: DwReg,
    mut off: i64,
    mut indexed: bool,
    oracle: &mut dyn Oracle,
    depth: u32,
) -> Result<Place, Untyped> {
    if depth > MAX_DEPTH {
        return Err(Untyped::NoVariable);
    }
    let mut j = at;
    let mut walk = Walk::new();
    let mut fallback: Option<Place> = None;
    let mut moved = false;
    let finish = |mut p: Place, off: i64, indexed: bool, moved: bool| {
        p.offset += off;
        p.indexed |= indexed;
        if moved && p.how == How::Variable {
            p.how = How::Tracked;
        }
        p
    };
    for _ in 0..MAX_STEPS {
        if let Some(p) = oracle.reg_pointer(insns[j].ip(), reg) {
            let p = finish(p, off, indexed, moved);
            if !oracle.is_library(&p) {
                return Ok(p);
            }
            fallback.get_or_insert(p);
        }
        // Entering a loop backwards: a pointer the loop body advances (`add %r8,%rax` before
        // the back edge) points at an element chosen at run time, whatever the entry path
        // set it to.
        indexed |= loop_advances(insns, j, reg);
        let Some(prev) = walk.back(insns, j) else {
            return fallback.ok_or(Untyped::NoPredecessor);
        };
        j = prev;
        moved = true;
        let ins = &insns[j];
        if ins.flow_control() == FlowControl::Call {
            if caller_saved(reg) {
                return fallback.ok_or(Untyped::Clobbered);
            }
            continue;
        }
        if !writes(ins, reg) {
            continue;
        }
        let op0 = ins.op0_kind();
        let op1 = if ins.op_count() > 1 {
            ins.op1_kind()
        } else {
            OpKind::Register
        };
        match (ins.mnemonic(), op1) {
            (Mnemonic::Mov, OpKind::Register) if op0 == OpKind::Register => {
                match dwarf_reg(ins.op1_register()) {
                    Some(src) => reg = src,
                    None => return fallback.ok_or(Untyped::Clobbered),
                }
            }
            (Mnemonic::Mov, OpKind::Memory) => {
                // A spill reload: the slot may hold no variable, only what a store put there.
                let base = dwarf_reg(ins.memory_base());
                if let (Some(b @ (RBP | RSP)), false) = (base, ins.is_ip_rel_memory_operand()) {
                    let disp = ins.memory_displacement64() as i64;
                    if oracle.frame_object(ins.ip(), b, disp).is_none() {
                        match spill(insns, j, b, disp) {
                            Some((k, src)) => {
                                j = k;
                                reg = src;
                                continue;
                            }
                            // Without a frame pointer rbp is a general register (gcc -O2
                            // keeps an OpenMP region's `.omp_data_i` there): a load through
                            // it is a pointer load like any other, as in `operand_place`.
                            None if b == RBP => {}
                            None => return fallback.ok_or(Untyped::StackNoVariable),
                        }
                    }
                }
                let from = match operand_place(insns, j, oracle, depth + 1) {
                    Ok(p) => p,
                    Err(e) => return fallback.ok_or(e),
                };
                return match oracle.load_pointer(&from) {
                    Some(p) => Ok(finish(p, off, indexed, true)),
                    None => fallback.ok_or(Untyped::NotAPointer),
                };
            }
            (Mnemonic::Lea, OpKind::Memory) => {
                let disp = ins.memory_displacement64() as i64;
                indexed |= ins.memory_index() != Register::None;
                if ins.is_ip_rel_memory_operand() {
                    return match oracle.global_object(ins.ip_rel_memory_address()) {
                        Some(p) => Ok(finish(p, off, indexed, true)),
                        None => fallback.ok_or(Untyped::GlobalNoVariable),
                    };
                }
                match dwarf_reg(ins.memory_base()) {
                    Some(b @ (RBP | RSP)) => {
                        // `lea R,[rbp-0x40]`: the address of a local object.
                        return match oracle.frame_object(ins.ip(), b, disp) {
                            Some(p) => Ok(finish(p, off, indexed, true)),
                            None => fallback.ok_or(Untyped::StackNoVariable),
                        };
                    }
                    Some(b) => {
                        reg = b;
                        off += disp;
                    }
                    None if ins.memory_base() == Register::None => {
                        return match oracle.global_object(disp as u64) {
                            Some(p) => Ok(finish(p, off, indexed, true)),
                            None => fallback.ok_or(Untyped::GlobalNoVariable),
                        };
                    }
                    None => return fallback.ok_or(Untyped::Clobbered),
                }
            }
            (Mnemonic::Add | Mnemonic::Sub, k) if op0 == OpKind::Register => {
                let sign = if ins.mnemonic() == Mnemonic::Add {
                    1
                } else {
                    -1
                };
                match k {
                    OpKind::Immediate8to64 | OpKind::Immediate32to64 | OpKind::Immediate8 => {
                        off += sign * ins.immediate(1) as i64;
                    }
                    // pointer + index: the element is unknown, the type is not. Which of
                    // the two is the pointer shows only further back: try both.
                    OpKind::Register if sign == 1 => {
                        let other = dwarf_reg(ins.op1_register());
                        let first = track(insns, j, reg, off, true, oracle, depth + 1);
                        return match (first, other) {
                            (Ok(p), _) => Ok(finish(p, 0, true, true)),
                            (Err(e), Some(o)) => track(insns, j, o, off, true, oracle, depth + 1)
                                .map(|p| finish(p, 0, true, true))
                                .or_else(|_| fallback.ok_or(e)),
                            (Err(e), None) => fallback.ok_or(e),
                        };
                    }
                    // `add R,[mem]`: a pointer loaded from memory plus R as the index
                    // (`add use_len(%rip),%rax`), or R the pointer plus an index from memory.
                    OpKind::Memory if sign == 1 => {
                        let loaded = operand_place(insns, j, oracle, depth + 1)
                            .ok()
                            .and_then(|from| oracle.load_pointer(&from));
                        if let Some(p) = loaded {
                            return Ok(finish(p, off, true, true));
                        }
                        indexed = true;
                    }
                    _ => return fallback.ok_or(Untyped::Clobbered),
                }
            }
            _ => return fallback.ok_or(Untyped::Clobbered),
        }
    }
    fallback.ok_or(Untyped::NoVariable)
}

/// Whether `ins` writes any part of 64-bit register `reg`.
fn writes(ins: &Instruction, reg: DwReg) -> bool {
    let mut factory = iced_x86::InstructionInfoFactory::new();
    let info = factory.info(ins);
    info.used_registers().iter().any(|u| {
        dwarf_reg(u.register().full_register()) == Some(reg)
            && !matches!(
                u.access(),
                iced_x86::OpAccess::Read | iced_x86::OpAccess::CondRead | iced_x86::OpAccess::None
            )
    })
}

/// Whether `insns[j]` is a loop head (a later branch jumps back to it) whose body adds to or
/// subtracts from `reg`.
fn loop_advances(insns: &[Instruction], j: usize, reg: DwReg) -> bool {
    let head = insns[j].ip();
    let Some(back) = insns[j..].iter().rposition(|i| {
        matches!(
            i.flow_control(),
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch
        ) && i.near_branch_target() == head
    }) else {
        return false;
    };
    insns[j..=j + back].iter().any(|i| {
        matches!(
            i.mnemonic(),
            Mnemonic::Add | Mnemonic::Sub | Mnemonic::Lea | Mnemonic::Inc | Mnemonic::Dec
        ) && writes(i, reg)
    })
}

/// The store `mov [base+disp], S` before `insns[at]` that filled a stack slot, and S.
fn spill(insns: &[Instruction], at: usize, base: DwReg, disp: i64) -> Option<(usize, DwReg)> {
    let mut j = at;
    let mut walk = Walk::new();
    for _ in 0..MAX_STEPS {
        j = walk.back(insns, j)?;
        let ins = &insns[j];
        // The slot's base moved (push, sub rsp): offsets no longer compare. A call gives
        // rsp back as it was.
        if writes(ins, base) && ins.flow_control() != FlowControl::Call {
            return None;
        }
        if ins.mnemonic() == Mnemonic::Mov
            && ins.op0_kind() == OpKind::Memory
            && ins.op1_kind() == OpKind::Register
            && dwarf_reg(ins.memory_base()) == Some(base)
            && ins.memory_index() == Register::None
            && ins.memory_displacement64() as i64 == disp
        {
            return Some((j, dwarf_reg(ins.op1_register())?));
        }
    }
    None
}

/// Alignment padding: `nop`, and `xchg ax,ax` (the 2-byte `66 90` nop as decoded).
fn is_padding(i: &Instruction) -> bool {
    i.mnemonic() == Mnemonic::Nop
        || (i.mnemonic() == Mnemonic::Xchg
            && i.op_count() == 2
            && i.op0_kind() == OpKind::Register
            && i.op1_kind() == OpKind::Register
            && i.op0_register() == i.op1_register())
}

/// Walks backwards from instruction to instruction, choosing among the ways into each: the
/// one before it in memory unless that one never falls through (jmp, ret; alignment padding
/// after them is never executed on the way in), and every branch targeting it. Of those, the
/// one visited least so far: a walk that came round a loop once takes the loop's entry next
/// time instead of going round again.
struct Walk {
    visits: std::collections::HashMap<usize, u32>,
}

impl Walk {
    fn new() -> Walk {
        Walk {
            visits: std::collections::HashMap::new(),
        }
    }

    fn back(&mut self, insns: &[Instruction], j: usize) -> Option<usize> {
        let here = insns[j].ip();
        let mut k = j;
        while k > 0 && is_padding(&insns[k - 1]) {
            k -= 1;
        }
        let falls = k > 0
            && !matches!(
                insns[k - 1].flow_control(),
                FlowControl::UnconditionalBranch
                    | FlowControl::IndirectBranch
                    | FlowControl::Return
                    | FlowControl::Interrupt
                    | FlowControl::Exception
            );
        let mut ways: Vec<usize> = Vec::new();
        if falls {
            ways.push(j - 1);
        }
        // Branches before it first (nearest first), then back edges after it.
        let targets = |i: &Instruction| {
            matches!(
                i.flow_control(),
                FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch
            ) && i.near_branch_target() == here
        };
        ways.extend((0..j).rev().filter(|&i| targets(&insns[i])));
        ways.extend((j + 1..insns.len()).filter(|&i| targets(&insns[i])));
        let next = *ways
            .iter()
            .min_by_key(|&&w| self.visits.get(&w).copied().unwrap_or(0))?;
        *self.visits.entry(next).or_default() += 1;
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::code_asm::*;

    /// Facts: `args` (pointer to type 1) is in rdi at the first instruction only; the stack
    /// slot rbp-0x18 holds the variable `p` (pointer to type 1); type 1's member at 16 is a
    /// pointer to type 2.
    struct Facts {
        entry: u64,
    }

    fn place(ty: usize, name: PlaceName, offset: i64, how: How) -> Place {
        Place {
            ty,
            name,
            offset,
            indexed: false,
            how,
        }
    }

    impl Oracle for Facts {
        fn reg_pointer(&mut self, pc: u64, reg: DwReg) -> Option<Place> {
            (pc == self.entry && reg == 5)
                .then(|| place(1, PlaceName::Deref("args".into()), 0, How::Variable))
        }
        fn frame_object(&mut self, _pc: u64, reg: DwReg, disp: i64) -> Option<Place> {
            // `p` is an 8-byte pointer variable at rbp-0x18.
            (reg == RBP && (-0x18..-0x10).contains(&disp))
                .then(|| place(9, PlaceName::Var("p".into()), disp + 0x18, How::Stack))
        }
        fn global_object(&mut self, _addr: u64) -> Option<Place> {
            None
        }
        fn load_pointer(&mut self, from: &Place) -> Option<Place> {
            match (&from.name, from.ty, from.offset) {
                (PlaceName::Var(v), 9, 0) => {
                    Some(place(1, PlaceName::Deref(v.clone()), 0, How::Tracked))
                }
                (PlaceName::Deref(v), 1, 16) => Some(place(
                    2,
                    PlaceName::Deref(format!("{v}->next")),
                    0,
                    How::Tracked,
                )),
                _ => None,
            }
        }
        fn is_library(&mut self, _p: &Place) -> bool {
            false
        }
    }

    fn assemble(f: impl FnOnce(&mut CodeAssembler)) -> Vec<Instruction> {
        let mut a = CodeAssembler::new(64).unwrap();
        f(&mut a);
        let bytes = a.assemble(0x1000).unwrap();
        let mut d = iced_x86::Decoder::with_ip(64, &bytes, 0x1000, 0);
        let mut v = Vec::new();
        while d.can_decode() {
            v.push(d.decode());
        }
        v
    }

    #[test]
    fn moves_offsets_spills_and_pointer_loads_are_followed() {
        // rdi = args; rax = rdi; rax += 8; lea rcx,[rax+4]; store [rcx+2]  → args at 14.
        let insns = assemble(|a| {
            a.mov(rax, rdi).unwrap();
            a.add(rax, 8).unwrap();
            a.lea(rcx, ptr(rax + 4)).unwrap();
            a.mov(dword_ptr(rcx + 2), 1).unwrap();
        });
        let mut facts = Facts { entry: 0x1000 };
        let p = type_access(&insns, 3, &mut facts).unwrap();
        assert_eq!(p.name, PlaceName::Deref("args".into()));
        assert_eq!((p.ty, p.offset, p.how), (1, 14, How::Tracked));

        // Spilled to a slot no variable describes, reloaded, then args->next->[8].
        let insns = assemble(|a| {
            a.mov(qword_ptr(rbp - 0x30), rdi).unwrap();
            a.call(0x2000u64).unwrap();
            a.mov(rdx, qword_ptr(rbp - 0x30)).unwrap();
            a.mov(rax, qword_ptr(rdx + 16)).unwrap();
            a.mov(qword_ptr(rax + 8), rcx).unwrap();
        });
        let p = type_access(&insns, 4, &mut facts).unwrap();
        assert_eq!(p.name, PlaceName::Deref("args->next".into()));
        assert_eq!((p.ty, p.offset), (2, 8));

        // -O0: the pointer is reloaded from its variable's own slot.
        let insns = assemble(|a| {
            a.mov(rax, qword_ptr(rbp - 0x18)).unwrap();
            a.mov(qword_ptr(rax + rdx * 8 + 24), rcx).unwrap();
        });
        let p = type_access(&insns, 1, &mut facts).unwrap();
        assert_eq!(p.name, PlaceName::Deref("p".into()));
        assert_eq!((p.ty, p.offset, p.indexed), (1, 24, true));
    }

    #[test]
    fn a_pointer_loaded_into_an_add_and_a_spill_across_a_call_are_followed() {
        // rax = idx*4 + [rbp-0x18] (the pointer `p`); spilled to 0x10(%rsp) across a call;
        // reloaded; access [rax].
        let insns = assemble(|a| {
            a.lea(rax, ptr(rcx * 4)).unwrap();
            a.add(rax, qword_ptr(rbp - 0x18)).unwrap();
            a.mov(qword_ptr(rsp + 0x10), rax).unwrap();
            a.call(0x2000u64).unwrap();
            a.mov(rax, qword_ptr(rsp + 0x10)).unwrap();
            a.mov(eax, dword_ptr(rax)).unwrap();
        });
        let mut facts = Facts { entry: 0x1000 };
        let p = type_access(&insns, 5, &mut facts).unwrap();
        assert_eq!(p.name, PlaceName::Deref("p".into()));
        assert_eq!((p.ty, p.offset, p.indexed), (1, 0, true));
    }

    #[test]
    fn calls_and_computations_end_the_walk() {
        let mut facts = Facts { entry: 0x1000 };
        // rax is caller-saved: after the call it is not args any more.
        let insns = assemble(|a| {
            a.mov(rax, rdi).unwrap();
            a.call(0x2000u64).unwrap();
            a.mov(qword_ptr(rax), rcx).unwrap();
        });
        assert_eq!(type_access(&insns, 2, &mut facts), Err(Untyped::Clobbered));
        // A multiplication is not pointer arithmetic the walk understands.
        let insns = assemble(|a| {
            a.mov(rax, rdi).unwrap();
            a.imul_3(rax, rax, 3).unwrap();
            a.mov(qword_ptr(rax), rcx).unwrap();
        });
        assert_eq!(type_access(&insns, 2, &mut facts), Err(Untyped::Clobbered));
        let insns = assemble(|a| {
            a.nop().unwrap();
        });
        assert_eq!(
            type_access(&insns, 0, &mut facts),
            Err(Untyped::NoMemoryOperand)
        );
    }

    #[test]
    fn a_pointer_a_loop_advances_points_at_an_unknown_element() {
        // rax = args; L: store [rax+8]; rax += 24; jne L
        let insns = assemble(|a| {
            let mut l = a.create_label();
            a.mov(rax, rdi).unwrap();
            a.set_label(&mut l).unwrap();
            a.mov(qword_ptr(rax + 8), rcx).unwrap();
            a.add(rax, 24).unwrap();
            a.cmp(rax, rdx).unwrap();
            a.jne(l).unwrap();
        });
        let mut facts = Facts { entry: 0x1000 };
        let p = type_access(&insns, 1, &mut facts).unwrap();
        assert_eq!((p.ty, p.offset, p.indexed), (1, 8, true));
    }

    #[test]
    fn a_loop_walked_round_once_is_left_by_its_entry() {
        // 0 mov rax,rdi; 1 jmp L2; L1: 2 add rcx,1; L2: 3 cmp; 4 je L1; 5 store [rax+8]
        let insns = assemble(|a| {
            let mut l1 = a.create_label();
            let mut l2 = a.create_label();
            a.mov(rax, rdi).unwrap();
            a.jmp(l2).unwrap();
            a.set_label(&mut l1).unwrap();
            a.add(rcx, 1).unwrap();
            a.set_label(&mut l2).unwrap();
            a.cmp(rcx, rdx).unwrap();
            a.je(l1).unwrap();
            a.mov(qword_ptr(rax + 8), rcx).unwrap();
        });
        let mut facts = Facts { entry: 0x1000 };
        let p = type_access(&insns, 5, &mut facts).unwrap();
        assert_eq!((p.ty, p.offset, p.indexed), (1, 8, false));
    }

    #[test]
    fn an_unconditional_jump_is_walked_back_through_its_branch() {
        // 0: mov rax,rdi; 1: jmp L; 2: ud2 (dead); L: 3: mov [rax+4],ecx
        let insns = assemble(|a| {
            let mut l = a.create_label();
            a.mov(rax, rdi).unwrap();
            a.jmp(l).unwrap();
            a.ud2().unwrap();
            a.set_label(&mut l).unwrap();
            a.mov(dword_ptr(rax + 4), ecx).unwrap();
        });
        let mut facts = Facts { entry: 0x1000 };
        let p = type_access(&insns, 3, &mut facts).unwrap();
        assert_eq!((p.ty, p.offset), (1, 4));
        // Alignment padding after a `ret` is not a way in: the branch to the target is.
        let insns = assemble(|a| {
            let mut l = a.create_label();
            a.mov(rax, rdi).unwrap();
            a.test(rsi, rsi).unwrap();
            a.jne(l).unwrap();
            a.ret().unwrap();
            a.nop().unwrap();
            a.set_label(&mut l).unwrap();
            a.mov(dword_ptr(rax + 8), ecx).unwrap();
        });
        let p = type_access(&insns, 5, &mut facts).unwrap();
        assert_eq!((p.ty, p.offset), (1, 8));
    }
}
