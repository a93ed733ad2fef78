//! The helper path: each access calls an out-of-line helper that finds the thread's state
//! itself. Used when no register is free to hold the state for the whole region, and for
//! accesses the inline path cannot take.

use super::refusal::RefusalReason;
use super::rewrite::{enc, sized, Emitter, RED_ZONE, SCRATCH};
use super::ssb_runtime::size_index;
use iced_x86::{Code, Encoder, Instruction, MemoryOperand, OpKind, Register};

impl Emitter<'_> {
    pub(super) fn emit_ssb(
        &mut self,
        i: &Instruction,
        op: u32,
        size: u32,
        read: bool,
        write: bool,
        label: u64,
    ) -> Result<(), RefusalReason> {
        let unsupported = |why| RefusalReason::UnsupportedInstruction {
            pc: i.ip(),
            text: i.to_string(),
            why,
        };
        let base = i.memory_base();
        if base != Register::None && base != Register::RIP && !base.is_gpr64() {
            return Err(unsupported("32-bit address size"));
        }
        let used = self.used_regs(i);
        let mut chosen = None;
        let mut encoder = Encoder::new(64);
        for &t in SCRATCH.iter().filter(|t| !used.contains(t)) {
            let mut ii = *i;
            ii.set_op_kind(op, OpKind::Register);
            ii.set_op_register(op, sized(t, size));
            ii.set_segment_prefix(Register::None);
            ii.set_memory_base(Register::None);
            ii.set_memory_index(Register::None);
            ii.set_memory_displacement64(0);
            ii.set_memory_displ_size(0);
            if encoder.encode(&ii, 0).is_ok() {
                chosen = Some((t, ii));
                break;
            }
        }
        let (t, mut body) = chosen
            .ok_or_else(|| unsupported("no scratch register can replace the memory operand"))?;
        body.set_ip(0);
        let mut displ = i.memory_displacement64() as i64;
        if base == Register::RSP {
            displ += RED_ZONE + 8;
        }
        let mem = if base == Register::RIP {
            MemoryOperand::with_base_displ(Register::RIP, i.memory_displacement64() as i64)
        } else {
            MemoryOperand::new(
                base,
                i.memory_index(),
                i.memory_index_scale(),
                displ,
                // iced in 64-bit mode: 1 = disp8 if it fits, 8 = sign-extended disp32.
                if base != Register::None && i8::try_from(displ).is_ok() {
                    1
                } else {
                    8
                },
                false,
                Register::None,
            )
        };
        let down = self.lea_rsp(-RED_ZONE)?;
        self.push_at(down, label);
        self.push(Instruction::with1(Code::Push_r64, t).map_err(enc)?);
        self.push(Instruction::with2(Code::Lea_r64_m, t, mem).map_err(enc)?);
        self.push(Instruction::with1(Code::Push_r64, t).map_err(enc)?);
        self.push(Instruction::with1(Code::Push_r64, t).map_err(enc)?);
        let slot = MemoryOperand::with_base(Register::RSP);
        if read {
            let c = self.call(self.rt.load[size_index(size)]);
            self.push(c);
            self.push(Instruction::with2(Code::Mov_r64_rm64, t, slot).map_err(enc)?);
        }
        self.push(body);
        if write {
            self.push(Instruction::with2(Code::Mov_rm64_r64, slot, t).map_err(enc)?);
            let c = self.call(self.rt.store[size_index(size)]);
            self.push(c);
        }
        let up = self.lea_rsp(16)?;
        self.push(up);
        self.push(Instruction::with1(Code::Pop_r64, t).map_err(enc)?);
        let up = self.lea_rsp(RED_ZONE)?;
        self.push(up);
        Ok(())
    }
}
