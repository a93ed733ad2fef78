//! SSE/AVX memory operands (`vector` accesses of `classify`): 1 to 32 bytes that no
//! general register can stand in for. The instruction runs unchanged except that its memory
//! operand becomes the thread's 32-byte scratch area (`[rs + scratch]`, `ssb_layout`); the
//! bytes move between the scratch area and the SSB in pieces of 8 bytes (or the whole
//! operand when it is smaller), each an ordinary buffered access: the inline fast path (or
//! the fixed-region path) of a synthetic `mov` of the piece, whose value register V is
//! copied to or from the scratch area instead of running the `mov`.
//!
//! ```text
//!   movdqu xmm1,[rdi+16]   →  piece [rdi+16] → V; mov [rs+scr],V
//!                             piece [rdi+24] → V; mov [rs+scr+8],V
//!                             movdqu xmm1,[rs+scr]
//!   movups [rdi],xmm0      →  movups [rs+scr],xmm0
//!                             mov V,[rs+scr];   V → piece [rdi]
//!                             mov V,[rs+scr+8]; V → piece [rdi+8]
//! ```
//!
//! A piece the fast path cannot take (no free registers) calls the helpers instead
//! (`push addr; push value; call ssb_load8/ssb_store8`), except a store piece of a
//! fixed-address region, which must go through its slot: that region is then rewritten the
//! general way. In fixed regions each store piece is a store location of its own
//! (`fixed.rs`, keyed by [`piece_key`]).
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
//! path refuses vector operands.

use super::fixed::piece_key;
use super::insn::{mem, rm};
use super::refusal::RefusalReason;
use super::rewrite::{enc, Emitter, RED_ZONE, SCRATCH};
use super::ssb_layout::{scratch_offset, size_index};
use iced_x86::{Code, Encoder, Instruction, MemoryOperand, Register};

/// Bytes per piece: the whole operand up to 8 bytes, else 8-byte words.
pub fn piece_size(size: u32) -> u32 {
    size.min(8)
}

/// Pieces of a vector operand of `size` bytes.
pub fn pieces(size: u32) -> u32 {
    size / piece_size(size)
}

/// One piece being emitted by `emit_ssb_fast`: where its bytes sit in the scratch area.
#[derive(Debug, Clone, Copy)]
pub struct Piece {
    /// `Fixed::by_insn` key of the piece.
    pub key: usize,
    /// Displacement of the piece's bytes from the state register.
    pub scratch: i64,
    pub size: u32,
    /// A load piece (V → scratch after the load) or a store piece (scratch → V before it).
    pub read: bool,
}

impl Piece {
    /// The instruction standing in for the synthetic `mov`: V to the scratch area, or the
    /// piece's bytes zero-extended into V (log values carry no garbage above their size).
    pub(super) fn body(
        &self,
        rs: Option<Register>,
        v: Register,
    ) -> Result<Instruction, RefusalReason> {
        let rs = rs.ok_or_else(|| RefusalReason::Encoding("vector piece without state".into()))?;
        let at = mem(rs, Register::None, self.scratch);
        if self.read {
            return Instruction::with2(Code::Mov_rm64_r64, at, v).map_err(enc);
        }
        let v32 = super::rewrite::sized(v, 4);
        match self.size {
            1 => rm(Code::Movzx_r32_rm8, v32, at),
            2 => rm(Code::Movzx_r32_rm16, v32, at),
            4 => rm(Code::Mov_r32_rm32, v32, at),
            _ => rm(Code::Mov_r64_rm64, v, at),
        }
    }
}

impl Emitter<'_> {
    /// Emits the scratch-area sequence for instruction `k` (module doc). `Ok(false)`: a
    /// store piece of a fixed region could not take the fast path (rewrite generally).
    pub(super) fn emit_wide(
        &mut self,
        k: usize,
        i: &Instruction,
        size: u32,
        read: bool,
        write: bool,
        label: u64,
    ) -> Result<bool, RefusalReason> {
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
        if i.memory_index() == Register::RSP {
            return Err(unsupported("rsp as an index register"));
        }
        let scratch = i64::from(scratch_offset(&self.rt.config));
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
        let p = piece_size(size);
        let mut first = Some(label);
        for j in (0..pieces(size)).filter(|_| read) {
            let l = first.take().unwrap_or_else(|| self.label());
            self.emit_piece(k, i, j, p, false, l)?;
        }
        match first.take() {
            Some(l) => self.push_at(body, l),
            None => self.push(body),
        }
        for j in (0..pieces(size)).filter(|_| write) {
            let l = self.label();
            if !self.emit_piece(k, i, j, p, true, l)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Piece `j` (`p` bytes at the operand's address + `j * p`): the fast path of a synthetic
    /// `mov`, else the helpers. `Ok(false)`: a fixed region's store piece that needs the
    /// fast path did not get it.
    fn emit_piece(
        &mut self,
        k: usize,
        i: &Instruction,
        j: u32,
        p: u32,
        write: bool,
        label: u64,
    ) -> Result<bool, RefusalReason> {
        let off = i64::from(j * p);
        let syn = synthetic_mov(i, off, p, write)?;
        let scratch = i64::from(scratch_offset(&self.rt.config)) + off;
        self.piece = Some(Piece {
            key: piece_key(k, j),
            scratch,
            size: p,
            read: !write,
        });
        let op = u32::from(!write);
        let fast = self.emit_ssb_fast(k, &syn, op, p, !write, write, label, false);
        self.piece = None;
        if fast? {
            return Ok(true);
        }
        if write && self.fixed.is_some() {
            return Ok(false);
        }
        self.emit_helper_piece(i, &syn, p, scratch, write, label)?;
        Ok(true)
    }

    /// `lea rsp,[rsp-128]; push T; lea T,[ea]; push T; push T/[scr]; call helper; …`.
    fn emit_helper_piece(
        &mut self,
        i: &Instruction,
        syn: &Instruction,
        p: u32,
        scratch: i64,
        write: bool,
        label: u64,
    ) -> Result<(), RefusalReason> {
        let rs = self
            .rs
            .ok_or_else(|| RefusalReason::Encoding("vector piece without state".into()))?;
        let used = self.used_regs(i);
        let t = SCRATCH
            .iter()
            .copied()
            .find(|t| !used.contains(t) && Some(*t) != self.rs && Some(*t) != self.count_reg)
            .ok_or_else(|| RefusalReason::UnsupportedInstruction {
                pc: i.ip(),
                text: i.to_string(),
                why: "no scratch register for the address",
            })?;
        let base = syn.memory_base();
        let ea = if base == Register::RIP {
            MemoryOperand::with_base_displ(Register::RIP, syn.memory_displacement64() as i64)
        } else {
            let mut d = syn.memory_displacement64() as i64;
            if base == Register::RSP {
                // Below the red zone, with T pushed.
                d += RED_ZONE + 8;
            }
            MemoryOperand::new(
                base,
                syn.memory_index(),
                syn.memory_index_scale(),
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
        let slot = mem(rs, Register::None, scratch);
        let (sync_out, sync_in) = self.count_sync()?;
        let down = self.lea_rsp(-RED_ZONE)?;
        self.push_at(down, label);
        self.push(Instruction::with1(Code::Push_r64, t).map_err(enc)?);
        self.push(Instruction::with2(Code::Lea_r64_m, t, ea).map_err(enc)?);
        sync_out.iter().for_each(|&s| self.push(s));
        self.push(Instruction::with1(Code::Push_r64, t).map_err(enc)?);
        if write {
            self.push(Instruction::with1(Code::Push_rm64, slot).map_err(enc)?);
            let c = self.call(self.rt.store[size_index(p)]);
            self.push(c);
            let up = self.lea_rsp(16)?;
            self.push(up);
        } else {
            self.push(Instruction::with1(Code::Push_r64, t).map_err(enc)?);
            let c = self.call(self.rt.load[size_index(p)]);
            self.push(c);
            self.push(Instruction::with1(Code::Pop_rm64, slot).map_err(enc)?);
            let up = self.lea_rsp(8)?;
            self.push(up);
        }
        sync_in.iter().for_each(|&s| self.push(s));
        self.push(Instruction::with1(Code::Pop_r64, t).map_err(enc)?);
        let up = self.lea_rsp(RED_ZONE)?;
        self.push(up);
        Ok(())
    }
}

/// `mov rax/eax/ax/al, [ea + off]` (load) or `mov [ea + off], …` (store) of `p` bytes, with
/// the vector instruction's address: what `emit_ssb_fast` needs to know about a piece.
fn synthetic_mov(
    i: &Instruction,
    off: i64,
    p: u32,
    write: bool,
) -> Result<Instruction, RefusalReason> {
    let base = i.memory_base();
    let d = (i.memory_displacement64() as i64).wrapping_add(off);
    let m = if base == Register::RIP {
        MemoryOperand::with_base_displ(Register::RIP, d)
    } else {
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
    let (code, r) = match (p, write) {
        (1, false) => (Code::Mov_r8_rm8, Register::AL),
        (2, false) => (Code::Mov_r16_rm16, Register::AX),
        (4, false) => (Code::Mov_r32_rm32, Register::EAX),
        (_, false) => (Code::Mov_r64_rm64, Register::RAX),
        (1, true) => (Code::Mov_rm8_r8, Register::AL),
        (2, true) => (Code::Mov_rm16_r16, Register::AX),
        (4, true) => (Code::Mov_rm32_r32, Register::EAX),
        (_, true) => (Code::Mov_rm64_r64, Register::RAX),
    };
    let mut syn = if write {
        Instruction::with2(code, m, r)
    } else {
        Instruction::with2(code, r, m)
    }
    .map_err(enc)?;
    syn.set_ip(i.ip());
    Ok(syn)
}
