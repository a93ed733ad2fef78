//! The byte-lane index in generated code: the cold half of the fast path (a load whose
//! word is in the log, a store that does not merge into the tail). Layout and invariants:
//! `ssb_layout.rs` (`INDEX_SLOTS`).

use super::insn::{br, i2, mem, mi, mr, ri, rm};
use super::refusal::RefusalReason;
use super::rewrite::{enc, sized};
use super::ssb_layout::{LANE_PERIOD, ST_COUNT, ST_ENTRIES, ST_FLUSHES, ST_LIMIT, ST_SUMMARY};
use iced_x86::{Code, Instruction, MemoryOperand, Register};

/// The state register and where its byte-lane index starts.
pub(super) struct Lanes {
    pub(super) rs: Register,
    pub(super) base: i64,
}

/// Scratch registers of one access: address, temporaries, value.
pub(super) struct Regs {
    pub(super) a: Register,
    pub(super) c: Register,
    pub(super) m: Register,
    pub(super) v: Register,
}

pub(super) struct LoadLabels {
    pub(super) helper: u64,
    pub(super) direct: u64,
    pub(super) other_word: u64,
    pub(super) back: u64,
}

pub(super) struct StoreLabels {
    pub(super) helper: u64,
    pub(super) fresh: u64,
    pub(super) claim: u64,
    pub(super) set: u64,
    pub(super) back: u64,
}

impl Lanes {
    /// `[rs + off + INDEX + extra]`, `off` a register holding a slot (or slot + byte) offset.
    fn slot(&self, off: Register, extra: i64) -> MemoryOperand {
        MemoryOperand::new(self.rs, off, 1, self.base + extra, 8, false, Register::None)
    }

    /// `[rs + c + ST_ENTRIES + disp]`: with c = count * 32, disp -32 is the tail entry.
    fn entry(&self, c: Register, disp: i32) -> MemoryOperand {
        mem(self.rs, c, i64::from(ST_ENTRIES + disp))
    }

    /// Load of `size` bytes at `a` whose word's summary bit is set. The byte lanes name the
    /// youngest entry touching each byte: no entry -> read memory (`l.direct`); one entry with
    /// the same address and size covering every byte -> forward it; anything else (two words,
    /// unknown lanes, partial overlap) -> the helper.
    pub(super) fn cold_load(
        &self,
        r: &Regs,
        size: u32,
        l: &LoadLabels,
    ) -> Result<Vec<Instruction>, RefusalReason> {
        let (a, c, m, v) = (r.a, r.c, r.m, r.v);
        // Cold: the byte-lane index names, for each byte of the load, the youngest log
        // entry touching it. No entry -> read memory; one entry with the same address and
        // size covering every byte -> forward it; anything else -> the helper.
        let mut cold = Vec::new();
        if size > 1 {
            cold.push(rm(
                Code::Lea_r64_m,
                m,
                mem(a, Register::None, i64::from(size) - 1),
            )?);
            cold.push(i2(Code::Xor_r64_rm64, m, a)?);
            cold.push(ri(Code::Cmp_rm64_imm8, m, 8)?);
            cold.push(br(Code::Jae_rel32_64, l.helper)?);
        }
        cold.extend([
            i2(Code::Mov_r64_rm64, c, a)?,
            ri(Code::Shr_rm64_imm8, c, 3)?,
            i2(Code::Mov_r64_rm64, m, c)?,
            ri(Code::And_rm64_imm8, m, 63)?,
            ri(Code::Shl_rm64_imm8, m, 5)?,
            mr(Code::Cmp_rm64_r64, self.slot(m, 8), c)?,
            br(Code::Jne_rel32_64, l.other_word)?,
            i2(Code::Mov_r64_rm64, c, a)?,
            ri(Code::And_rm64_imm8, c, 7)?,
            i2(Code::Add_r64_rm64, c, m)?,
            match size {
                1 => rm(Code::Movzx_r32_rm8, sized(v, 4), self.slot(c, 0))?,
                2 => rm(Code::Movzx_r32_rm16, sized(v, 4), self.slot(c, 0))?,
                4 => rm(Code::Mov_r32_rm32, sized(v, 4), self.slot(c, 0))?,
                _ => rm(Code::Mov_r64_rm64, v, self.slot(c, 0))?,
            },
            i2(Code::Test_rm64_r64, v, v)?,
            br(Code::Je_rel32_64, l.direct)?,
            i2(Code::Movzx_r32_rm8, sized(c, 4), sized(v, 1))?,
        ]);
        // 0xff marks "unknown" (slot shared with another word this period).
        cold.push(ri(Code::Cmp_rm32_imm32, sized(c, 4), 0xff)?);
        cold.push(br(Code::Je_rel32_64, l.helper)?);
        if size > 1 {
            let rep = if size == 2 { 0x0101 } else { 0x0101_0101 };
            cold.push(
                Instruction::with3(Code::Imul_r32_rm32_imm32, sized(m, 4), sized(c, 4), rep)
                    .map_err(enc)?,
            );
            cold.push(i2(Code::Cmp_r32_rm32, sized(v, 4), sized(m, 4))?);
            cold.push(br(Code::Jne_rel32_64, l.helper)?);
            if size == 8 {
                cold.push(ri(Code::Shr_rm64_imm8, v, 32)?);
                cold.push(i2(Code::Cmp_r32_rm32, sized(v, 4), sized(m, 4))?);
                cold.push(br(Code::Jne_rel32_64, l.helper)?);
            }
        }
        // Lanes hold `(i mod LANE_PERIOD) + 1`: the candidate is the youngest entry with that
        // residue, `count - ((count - lane) mod LANE_PERIOD) - 1`. If it has the load's exact
        // address and size it is the youngest entry touching these bytes (the real youngest
        // has the same residue and is not younger than the candidate, which touches them);
        // else (the youngest is a period or more older) the helper scans.
        let count = mem(self.rs, Register::None, ST_COUNT.into());
        let ent = |d: i32| self.entry(m, d);
        cold.extend([
            rm(Code::Mov_r64_rm64, m, count)?,
            i2(Code::Sub_r64_rm64, m, c)?,
            ri(Code::And_rm64_imm8, m, LANE_PERIOD as i32 - 1)?,
            Instruction::with1(Code::Neg_rm64, m).map_err(enc)?,
            rm(Code::Add_r64_rm64, m, count)?,
            ri(Code::Shl_rm64_imm8, m, 5)?,
            mi(Code::Cmp_rm64_imm8, ent(-24), size as i32)?,
            br(Code::Jne_rel32_64, l.helper)?,
            mr(Code::Cmp_rm64_r64, ent(-32), a)?,
            br(Code::Jne_rel32_64, l.helper)?,
            rm(Code::Mov_r64_rm64, v, ent(-16))?,
            br(Code::Jmp_rel32_64, l.back)?,
        ]);
        // The slot belongs to another word this period. Uncontested (no word ever lost
        // it this period), so this word has no entry: read memory.
        let mut ow = mi(Code::Cmp_rm64_imm8, self.slot(m, 24), 0)?;
        ow.set_ip(l.other_word);
        cold.extend([
            ow,
            br(Code::Je_rel32_64, l.direct)?,
            br(Code::Jmp_rel32_64, l.helper)?,
        ]);
        Ok(cold)
    }

    /// Appends `(a, size, v)` to the log inline when there is room and the entry stays within
    /// one 8-byte word (else `l.helper`): entry, count, summary bit, and the word's lane slot
    /// (claimed for this flush period if needed). On entry `c` = count * 32.
    pub(super) fn inline_append(
        &self,
        r: &Regs,
        size: u32,
        l: &StoreLabels,
    ) -> Result<Vec<Instruction>, RefusalReason> {
        let (a, c, m, v) = (r.a, r.c, r.m, r.v);
        let rs = self.rs;
        let entry = |d: i32| self.entry(c, d);
        let mut append = vec![
            rm(
                Code::Cmp_r64_rm64,
                c,
                mem(rs, Register::None, ST_LIMIT.into()),
            )?,
            br(Code::Jae_rel32_64, l.helper)?,
        ];
        if size > 1 {
            append.push(rm(
                Code::Lea_r64_m,
                m,
                mem(a, Register::None, i64::from(size) - 1),
            )?);
            append.push(i2(Code::Xor_r64_rm64, m, a)?);
            append.push(ri(Code::Cmp_rm64_imm8, m, 8)?);
            append.push(br(Code::Jae_rel32_64, l.helper)?);
        }
        append.extend([
            mr(Code::Mov_rm64_r64, entry(0), a)?,
            mi(Code::Mov_rm64_imm32, entry(8), size as i32)?,
            mr(Code::Mov_rm64_r64, entry(16), v)?,
            mi(
                Code::Add_rm64_imm8,
                mem(rs, Register::None, ST_COUNT.into()),
                1,
            )?,
            rm(
                Code::Mov_r64_rm64,
                m,
                mem(rs, Register::None, ST_SUMMARY.into()),
            )?,
            i2(Code::Mov_r64_rm64, c, a)?,
            ri(Code::Shr_rm64_imm8, c, 3)?,
            i2(Code::Bts_rm64_r64, m, c)?,
            mr(
                Code::Mov_rm64_r64,
                mem(rs, Register::None, ST_SUMMARY.into()),
                m,
            )?,
            // Lane slot of word c: claim it for this word and flush period if needed. Only c
            // and m are clobbered: v may be the instruction's own source register.
            i2(Code::Mov_r64_rm64, m, c)?,
            ri(Code::And_rm64_imm8, m, 63)?,
            ri(Code::Shl_rm64_imm8, m, 5)?,
            rm(
                Code::Mov_r64_rm64,
                c,
                mem(rs, Register::None, ST_FLUSHES.into()),
            )?,
            mr(Code::Cmp_rm64_r64, self.slot(m, 16), c)?,
            br(Code::Jne_rel32_64, l.fresh)?,
            i2(Code::Mov_r64_rm64, c, a)?,
            ri(Code::Shr_rm64_imm8, c, 3)?,
            mr(Code::Cmp_rm64_r64, self.slot(m, 8), c)?,
            br(Code::Je_rel32_64, l.set)?,
            // Taken over from another word this period: lanes unknown, slot contested.
            mi(Code::Mov_rm64_imm32, self.slot(m, 0), -1)?,
            mi(Code::Mov_rm64_imm32, self.slot(m, 24), 1)?,
            br(Code::Jmp_rel32_64, l.claim)?,
        ]);
        let mut f = mi(Code::Mov_rm64_imm32, self.slot(m, 0), 0)?;
        f.set_ip(l.fresh);
        append.push(f);
        append.push(mi(Code::Mov_rm64_imm32, self.slot(m, 24), 0)?);
        let mut cl = i2(Code::Mov_r64_rm64, c, a)?;
        cl.set_ip(l.claim);
        append.extend([
            cl,
            ri(Code::Shr_rm64_imm8, c, 3)?,
            mr(Code::Mov_rm64_r64, self.slot(m, 8), c)?,
            rm(
                Code::Mov_r64_rm64,
                c,
                mem(rs, Register::None, ST_FLUSHES.into()),
            )?,
            mr(Code::Mov_rm64_r64, self.slot(m, 16), c)?,
        ]);
        let mut st = i2(Code::Mov_r64_rm64, c, a)?;
        st.set_ip(l.set);
        append.push(st);
        append.extend([
            ri(Code::And_rm64_imm8, c, 7)?,
            i2(Code::Add_r64_rm64, c, m)?,
            rm(
                Code::Mov_r64_rm64,
                m,
                mem(rs, Register::None, ST_COUNT.into()),
            )?,
            // Lane value of entry i = count - 1: (i mod LANE_PERIOD) + 1.
            Instruction::with1(Code::Dec_rm32, sized(m, 4)).map_err(enc)?,
            ri(Code::And_rm32_imm8, sized(m, 4), LANE_PERIOD as i32 - 1)?,
            Instruction::with1(Code::Inc_rm32, sized(m, 4)).map_err(enc)?,
        ]);
        match size {
            1 => append.push(mr(Code::Mov_rm8_r8, self.slot(c, 0), sized(m, 1))?),
            2 => {
                append.push(
                    Instruction::with3(Code::Imul_r32_rm32_imm32, sized(m, 4), sized(m, 4), 0x0101)
                        .map_err(enc)?,
                );
                append.push(mr(Code::Mov_rm16_r16, self.slot(c, 0), sized(m, 2))?);
            }
            _ => {
                append.push(
                    Instruction::with3(
                        Code::Imul_r32_rm32_imm32,
                        sized(m, 4),
                        sized(m, 4),
                        0x0101_0101,
                    )
                    .map_err(enc)?,
                );
                append.push(mr(Code::Mov_rm32_r32, self.slot(c, 0), sized(m, 4))?);
                if size == 8 {
                    append.push(mr(Code::Mov_rm32_r32, self.slot(c, 4), sized(m, 4))?);
                }
            }
        }
        append.push(br(Code::Jmp_rel32_64, l.back)?);
        Ok(append)
    }
}
