//! Tiny constructors for the instructions the fast path emits (iced `Instruction::with*`
//! with the error mapped to a refusal), and the flag save/restore pair.

use super::refusal::RefusalReason;
use super::rewrite::enc;
use iced_x86::{Code, Instruction, MemoryOperand, Register};

pub(super) fn mem(base: Register, index: Register, displ: i64) -> MemoryOperand {
    let ds = if i8::try_from(displ).is_ok() { 1 } else { 8 };
    MemoryOperand::new(base, index, 1, displ, ds, false, Register::None)
}

pub(super) fn i2(code: Code, a: Register, b: Register) -> Result<Instruction, RefusalReason> {
    Instruction::with2(code, a, b).map_err(enc)
}

pub(super) fn rm(code: Code, a: Register, m: MemoryOperand) -> Result<Instruction, RefusalReason> {
    Instruction::with2(code, a, m).map_err(enc)
}

pub(super) fn mr(code: Code, m: MemoryOperand, a: Register) -> Result<Instruction, RefusalReason> {
    Instruction::with2(code, m, a).map_err(enc)
}

pub(super) fn mi(code: Code, m: MemoryOperand, imm: i32) -> Result<Instruction, RefusalReason> {
    Instruction::with2(code, m, imm).map_err(enc)
}

pub(super) fn ri(code: Code, a: Register, imm: i32) -> Result<Instruction, RefusalReason> {
    Instruction::with2(code, a, imm).map_err(enc)
}

pub(super) fn br(code: Code, target: u64) -> Result<Instruction, RefusalReason> {
    Instruction::with_branch(code, target).map_err(enc)
}

/// `seto al; lahf` / `add al,0x7f; sahf`: save and restore the six status flags in rax.
pub(super) fn save_flags() -> Result<[Instruction; 2], RefusalReason> {
    Ok([
        Instruction::with1(Code::Seto_rm8, Register::AL).map_err(enc)?,
        Instruction::with(Code::Lahf),
    ])
}

pub(super) fn restore_flags() -> Result<[Instruction; 2], RefusalReason> {
    Ok([
        ri(Code::Add_AL_imm8, Register::AL, 0x7f)?,
        Instruction::with(Code::Sahf),
    ])
}
