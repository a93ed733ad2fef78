//! SSE/AVX memory operands (`vector` accesses of `classify`): 1 to 32 bytes that no
//! general register can stand in for. The instruction runs unchanged except that its memory
//! operand becomes the thread's 32-byte scratch area (`[rs + scratch]`, `ssb_layout`); the
//! bytes move between the scratch area and the SSB in pieces of 8 bytes (or the whole
//! operand when it is smaller), each an ordinary buffered access through the helpers.
//!
//! ```text
//!   movdqu xmm1,[rdi+16]          paddq xmm0,[rdi]              movups [rdi],xmm0
//!   lea rsp,[rsp-128]; push T; lea T,[ea]
//!   read:  push T; push T; call ssb_load8; pop [rs+scr+8j]; lea rsp,[rsp+8]; lea T,[T+8]
//!   the instruction on [rs+scr]
//!   write: push T; push [rs+scr+8j]; call ssb_store8; lea rsp,[rsp+16]; lea T,[T+8]
//!   pop T; lea rsp,[rsp+128]
//! ```
//!
//! Why this keeps TSO: a load piece reads the youngest log entry of its 8 bytes or memory
//! (flushing first on a partial overlap), exactly as a `mov` would; store pieces are appended
//! in address order, so a flush writes them in program order, back to back. The x86 memory
//! model lets an access wider than 8 bytes be performed as several accesses (SDM vol. 3,
//! 9.1.1), with one exception this scheme does not keep: on CPUs with AVX, an *aligned*
//! 16-byte `movaps`/`movdqa`/`vmovdqa` (and friends) is single-copy atomic, while its pieces
//! here can be seen apart by another thread during a flush. None of lea/push/pop/call/mov
//! touch the flags and the helpers preserve them, so flag-reading and flag-writing vector
//! instructions (`ptest`, `comisd`, `pcmpestri`) see and leave the original flags.
//!
//! The scratch area is 32-aligned, so `movaps`/`movdqa` on an address that is not 16-aligned
//! no longer raise #GP: the rewritten code is more permissive than the original there.
//!
//! Only on the inline path (a state register holds the scratch area's base); the helper-only
//! path refuses vector operands. In a fixed-address region a vector store would append
//! entries the slots do not know about, so such regions are rewritten the general way
//! (`rewrite.rs`); vector loads there are fine (the helper scans the whole log).

use super::insn::mem;
use super::refusal::RefusalReason;
use super::rewrite::{enc, Emitter, RED_ZONE, SCRATCH};
use super::ssb_layout::{scratch_offset, size_index};
use iced_x86::{Code, Encoder, Instruction, MemoryOperand, Register};
use std::collections::HashSet;

/// Bytes per piece: the whole operand up to 8 bytes, else 8-byte words.
pub fn piece_size(size: u32) -> u32 {
    size.min(8)
}

impl Emitter<'_> {
    /// Emits the scratch-area sequence for instruction `i` (module doc).
    pub(super) fn emit_wide(
        &mut self,
        i: &Instruction,
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
        let Some(rs) = self.rs else {
            return Err(unsupported(
                "SSE/AVX memory operand, and no register is free to hold the thread state \
                 (its scratch area)",
            ));
        };
        let base = i.memory_base();
        if base != Register::None && base != Register::RIP && !base.is_gpr64() {
            return Err(unsupported("32-bit address size"));
        }
        let scratch = i64::from(scratch_offset(&self.rt.config));
        let used: HashSet<Register> = self
            .info
            .info(i)
            .used_registers()
            .iter()
            .map(|r| r.register().full_register())
            .collect();
        let t = SCRATCH
            .iter()
            .copied()
            .find(|t| !used.contains(t) && Some(*t) != self.rs && Some(*t) != self.count_reg)
            .ok_or_else(|| unsupported("no scratch register for the address"))?;
        // The instruction itself, on the scratch area.
        let mut body = *i;
        body.set_ip(0);
        body.set_segment_prefix(Register::None);
        body.set_memory_base(rs);
        body.set_memory_index(Register::None);
        body.set_memory_index_scale(1);
        body.set_memory_displacement64(scratch as u64);
        body.set_memory_displ_size(if i8::try_from(scratch).is_ok() { 1 } else { 8 });
        Encoder::new(64)
            .encode(&body, 0)
            .map_err(|_| unsupported("the instruction does not encode on the scratch area"))?;
        let ea = if base == Register::RIP {
            MemoryOperand::with_base_displ(Register::RIP, i.memory_displacement64() as i64)
        } else {
            let mut d = i.memory_displacement64() as i64;
            if base == Register::RSP {
                // Below the red zone, with T pushed.
                d += RED_ZONE + 8;
            }
            MemoryOperand::new(
                base,
                i.memory_index(),
                i.memory_index_scale(),
                d,
                if base != Register::None && i8::try_from(d).is_ok() {
                    1
                } else {
                    8
                },
                false,
                Register::None,
            )
        };
        let piece = piece_size(size);
        let pieces = size / piece;
        let step = |e: &mut Self, d: i64| -> Result<(), RefusalReason> {
            let ins =
                Instruction::with2(Code::Lea_r64_m, t, mem(t, Register::None, d)).map_err(enc)?;
            e.push(ins);
            Ok(())
        };
        let down = self.lea_rsp(-RED_ZONE)?;
        self.push_at(down, label);
        self.push(Instruction::with1(Code::Push_r64, t).map_err(enc)?);
        self.push(Instruction::with2(Code::Lea_r64_m, t, ea).map_err(enc)?);
        let slot = |j: u32| mem(rs, Register::None, scratch + i64::from(j * piece));
        let (sync_out, sync_in) = self.count_sync()?;
        if read {
            for j in 0..pieces {
                if j > 0 {
                    step(self, i64::from(piece))?;
                }
                sync_out.iter().for_each(|&s| self.push(s));
                self.push(Instruction::with1(Code::Push_r64, t).map_err(enc)?);
                self.push(Instruction::with1(Code::Push_r64, t).map_err(enc)?);
                let c = self.call(self.rt.load[size_index(piece)]);
                self.push(c);
                self.push(Instruction::with1(Code::Pop_rm64, slot(j)).map_err(enc)?);
                let up = self.lea_rsp(8)?;
                self.push(up);
                sync_in.iter().for_each(|&s| self.push(s));
            }
        }
        self.push(body);
        if write {
            if read && pieces > 1 {
                step(self, -i64::from((pieces - 1) * piece))?;
            }
            for j in 0..pieces {
                if j > 0 {
                    step(self, i64::from(piece))?;
                }
                sync_out.iter().for_each(|&s| self.push(s));
                self.push(Instruction::with1(Code::Push_r64, t).map_err(enc)?);
                self.push(Instruction::with1(Code::Push_rm64, slot(j)).map_err(enc)?);
                let c = self.call(self.rt.store[size_index(piece)]);
                self.push(c);
                let up = self.lea_rsp(16)?;
                self.push(up);
                sync_in.iter().for_each(|&s| self.push(s));
            }
        }
        self.push(Instruction::with1(Code::Pop_r64, t).map_err(enc)?);
        let up = self.lea_rsp(RED_ZONE)?;
        self.push(up);
        Ok(())
    }
}
