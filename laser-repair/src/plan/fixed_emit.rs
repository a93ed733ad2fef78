//! Code generation for fixed-address regions (`fixed.rs` has the analysis and the picture):
//! one access's sequence from the registers `emit_ssb_fast` chose.

use super::fixed::Base;
use super::insn::{br, i2, mem, mi, mr, restore_flags, ri, rm, save_flags};
use super::refusal::RefusalReason;
use super::rewrite::{enc, sized, Emitter, RED_ZONE};
use super::ssb_layout::{fixed_slots_offset, size_index, MAX_FIXED_SLOTS, ST_ENTRIES};
use iced_x86::{Code, Instruction, MemoryOperand, Register};

/// One access's registers and prepared pieces, from `emit_ssb_fast`'s common setup.
pub(super) struct FixedSeq {
    pub(super) k: usize,
    pub(super) i: Instruction,
    pub(super) size: u32,
    pub(super) read: bool,
    pub(super) write: bool,
    /// Address, temporaries, value (all free or spilled).
    pub(super) a: Register,
    pub(super) c: Register,
    pub(super) m: Register,
    pub(super) v: Register,
    /// The instruction on `v` in place of its memory operand (None: a plain `mov`).
    pub(super) body: Option<Instruction>,
    /// The memory operand, rsp displacement adjusted for the spills.
    pub(super) ea: MemoryOperand,
    pub(super) flags_in: bool,
    pub(super) flags_out: bool,
    pub(super) spills: Vec<Register>,
    /// Spills and the flag save, already built.
    pub(super) prologue: Vec<Instruction>,
    pub(super) label: u64,
}

fn labelled(mut i: Instruction, l: u64) -> Instruction {
    i.set_ip(l);
    i
}

fn nop_at(l: u64) -> Instruction {
    labelled(Instruction::with(Code::Nopd), l)
}

impl Emitter<'_> {
    /// The fixed-region sequence of one access (layouts in `fixed.rs`). Hot path of a load
    /// that forwards: `cmp [slot],8; jb memory; mov v,[shadow]`, or in a slotless region
    /// `cmp rc,d; jb memory; lea c,[rc*8+8]; mov v,[entry d back]`; of a load that cannot
    /// overlap its own group: the range tests of the other groups and the original
    /// instruction; of a store: `lea a; lea c,[rc*8+8]; 3 entry writes; (mov [slot],c;
    /// mov [shadow],v, unless slotless); lea rc,[rc+1]`.
    pub(super) fn emit_fixed(&mut self, s: FixedSeq) -> Result<bool, RefusalReason> {
        let (Some(rs), Some(fixed), Some(rc)) = (self.rs, self.fixed.as_ref(), self.count_reg)
        else {
            return Ok(false);
        };
        let acc = fixed.by_insn.get(&s.k).copied().unwrap_or_default();
        let groups = fixed.groups.clone();
        let slotless = fixed.slotless;
        let full_test = fixed.max_path_stores > self.rt.config.log_capacity;
        let slots = i64::from(fixed_slots_offset(&self.rt.config));
        let slot_mem = |n: u32| mem(rs, Register::None, slots + 8 * i64::from(n));
        // The youngest value of each location, next to the slots: a forwarding load reads it
        // without waiting for the slot (the branch on the slot is predicted).
        let shadow = |n: u32| {
            mem(
                rs,
                Register::None,
                slots + 8 * i64::from(MAX_FIXED_SLOTS + n),
            )
        };
        let (a, c, m, v) = (s.a, s.c, s.m, s.v);
        // Slots and `c` below hold (i + 1) * 8 for entry i: `[rs + c*4 + ENTRIES - 32]`.
        let entry = |r: Register, d: i32| {
            MemoryOperand::new(
                rs,
                r,
                4,
                i64::from(ST_ENTRIES + d),
                8,
                false,
                Register::None,
            )
        };
        // `lea c, [rc*8 + 8]`: c for the entry the next append writes (entry `rc`).
        let count_next = MemoryOperand::new(Register::None, rc, 8, 8, 1, false, Register::None);
        let (back_load, back_store, helper_load) = (self.label(), self.label(), self.label());
        let mut hot = s.prologue;
        let mut cold: Vec<Instruction> = Vec::new();
        let mut restore_in = Vec::new();
        if s.flags_in {
            restore_in.extend(restore_flags()?);
        }
        // After the value is in v: restore the flags, run the instruction on v.
        let mut after_load: Vec<Instruction> = restore_in.clone();
        after_load.extend(s.body);
        // A read-only instruction can read memory itself when nothing in the log overlaps
        // (its operand does not involve rsp, which the spills moved).
        let rsp_free = s.i.memory_base() != Register::RSP && s.i.memory_index() != Register::RSP;
        // (A vector piece's synthetic `mov` must not run: its value goes to the scratch area.)
        let original = (s.read && !s.write && rsp_free && self.piece.is_none()).then(|| {
            let mut o = s.i;
            o.set_ip(0);
            o
        });
        let ea_k = |extra: i64| -> MemoryOperand {
            let mut e = s.ea;
            e.displacement = e.displacement.wrapping_add(extra);
            e.displ_size = if e.base != Register::None && i8::try_from(e.displacement).is_ok() {
                1
            } else {
                8
            };
            if e.base == Register::RIP {
                e.displ_size = s.ea.displ_size;
            }
            e
        };
        let mut tests = Vec::new();
        if s.read && !acc.helper {
            for (n, g) in groups.iter().enumerate() {
                if Some(n) == acc.group {
                    continue;
                }
                // [ea, ea+size) meets [B+lo, B+hi) iff ea+size-1-lo-B < hi-lo+size-1 (unsigned).
                let w = (g.hi - g.lo + i64::from(s.size) - 1) as i32;
                let base = match g.base {
                    Base::Reg(r) => r,
                    // A frame slot's value: the base registers reloaded from it may hold
                    // something else here, the slot does not (`frame.rs`). Without an
                    // index the subtraction reads the slot itself (one instruction less).
                    Base::Slot(d) if g.index == Register::None => {
                        let kk = i64::from(s.size) - 1 - g.lo;
                        tests.push(rm(Code::Lea_r64_m, c, ea_k(kk))?);
                        let slot = mem(Register::RBP, Register::None, d);
                        tests.push(rm(Code::Sub_r64_rm64, c, slot)?);
                        tests.push(ri(Code::Cmp_rm64_imm32, c, w)?);
                        tests.push(br(Code::Jb_rel32_64, helper_load)?);
                        continue;
                    }
                    Base::Slot(d) => {
                        let slot = mem(Register::RBP, Register::None, d);
                        tests.push(rm(Code::Mov_r64_rm64, m, slot)?);
                        m
                    }
                };
                if base == Register::RIP {
                    // A global group: B + lo is an absolute address, materialised rip-relative.
                    tests.push(rm(Code::Lea_r64_m, c, ea_k(i64::from(s.size) - 1))?);
                    let lo = MemoryOperand::with_base_displ(Register::RIP, g.lo);
                    tests.push(rm(Code::Lea_r64_m, m, lo)?);
                    tests.push(i2(Code::Sub_r64_rm64, c, m)?);
                    tests.push(ri(Code::Cmp_rm64_imm32, c, w)?);
                    tests.push(br(Code::Jb_rel32_64, helper_load)?);
                    continue;
                }
                let kk = i64::from(s.size) - 1 - g.lo;
                tests.push(rm(Code::Lea_r64_m, c, ea_k(kk))?);
                if g.index == Register::None {
                    tests.push(i2(Code::Sub_r64_rm64, c, base)?);
                } else {
                    let b = MemoryOperand::new(base, g.index, g.scale, 0, 0, false, Register::None);
                    tests.push(rm(Code::Lea_r64_m, m, b)?);
                    tests.push(i2(Code::Sub_r64_rm64, c, m)?);
                }
                tests.push(ri(Code::Cmp_rm64_imm32, c, w)?);
                tests.push(br(Code::Jb_rel32_64, helper_load)?);
            }
        }
        let direct_v = || -> Result<Instruction, RefusalReason> {
            match s.size {
                1 => rm(Code::Movzx_r32_rm8, sized(v, 4), s.ea),
                2 => rm(Code::Movzx_r32_rm16, sized(v, 4), s.ea),
                4 => rm(Code::Mov_r32_rm32, sized(v, 4), s.ea),
                _ => rm(Code::Mov_r64_rm64, v, s.ea),
            }
        };
        // Where the load part ends: the value in v, continuing at back_load (`after_load`),
        // or the original instruction done, continuing at back_store.
        let mut after_in_cold = false;
        if s.read {
            if acc.helper {
                hot.push(br(Code::Jmp_rel32_64, helper_load)?);
            } else if let (true, Some(slot)) = (acc.forward, acc.slot) {
                let direct = self.label();
                hot.extend(tests);
                hot.push(match acc.distance {
                    Some(d) => ri(Code::Cmp_rm64_imm32, rc, d as i32)?,
                    None => mi(Code::Cmp_rm64_imm8, slot_mem(slot), 8)?,
                });
                hot.push(br(Code::Jb_rel32_64, direct)?);
                match (acc.distance, slotless) {
                    // The location's youngest entry is `d` appends back (every store of a
                    // slotless region appends): read its value there, so stores need not
                    // write a shadow (one store fewer per buffered store).
                    (Some(d), true) => hot.extend([
                        rm(Code::Lea_r64_m, c, count_next)?,
                        rm(Code::Mov_r64_rm64, v, entry(c, -16 - 32 * d as i32))?,
                    ]),
                    _ => hot.push(rm(Code::Mov_r64_rm64, v, shadow(slot))?),
                }
                match original {
                    Some(o) => {
                        let mut part = restore_in.clone();
                        part.push(o);
                        part.push(br(Code::Jmp_rel32_64, back_store)?);
                        part[0].set_ip(direct);
                        cold.extend(part);
                    }
                    None => {
                        cold.push(labelled(direct_v()?, direct));
                        cold.push(br(Code::Jmp_rel32_64, back_load)?);
                    }
                }
            } else {
                hot.extend(tests);
                match original {
                    Some(o) => {
                        hot.extend(restore_in.clone());
                        hot.push(o);
                        after_in_cold = true;
                    }
                    None => hot.push(direct_v()?),
                }
            }
        }
        // Store part: v holds the value.
        let mut tail = Vec::new();
        if s.write {
            let slot = acc.slot.ok_or_else(|| {
                RefusalReason::Encoding(format!("store {} of a fixed region has no slot", s.i))
            })?;
            if s.flags_out {
                tail.extend(save_flags()?);
            }
            let retry = self.label();
            let merge = self.label();
            let count8 = MemoryOperand::new(Register::None, rc, 8, 0, 0, false, Register::None);
            tail.push(rm(Code::Lea_r64_m, a, s.ea)?);
            let mut tests = Vec::new();
            if acc.merge {
                // The tail entry (rc - 1) is this location's youngest: merge into it.
                tests.push(rm(Code::Lea_r64_m, c, count8)?);
                tests.push(rm(Code::Cmp_r64_rm64, c, slot_mem(slot))?);
                tests.push(br(Code::Je_rel32_64, merge)?);
            }
            if full_test {
                let full = self.label();
                let cap = self.rt.config.log_capacity as i32;
                tests.push(ri(Code::Cmp_rm64_imm32, rc, cap)?);
                tests.push(br(Code::Jae_rel32_64, full)?);
                // Log full: flush (the helper keeps every register and the flags), retry.
                let (out, back) = self.count_sync()?;
                let mut part = out;
                part.push(self.lea_rsp(-RED_ZONE)?);
                part.push(
                    Instruction::with_branch(Code::Call_rel32_64, self.rt.flush).map_err(enc)?,
                );
                part.push(self.lea_rsp(RED_ZONE)?);
                part.extend(back);
                part.push(br(Code::Jmp_rel32_64, retry)?);
                part[0].set_ip(full);
                cold.extend(part);
            }
            let mut append = vec![
                rm(Code::Lea_r64_m, c, count_next)?,
                mr(Code::Mov_rm64_r64, entry(c, -32), a)?,
                mi(Code::Mov_rm64_imm32, entry(c, -24), s.size as i32)?,
                mr(Code::Mov_rm64_r64, entry(c, -16), v)?,
            ];
            if !slotless {
                // Loads of a slotted location read its slot and its shadow; a slotless
                // region's loads read the entry itself (above).
                append.extend([
                    mr(Code::Mov_rm64_r64, slot_mem(slot), c)?,
                    mr(Code::Mov_rm64_r64, shadow(slot), v)?,
                ]);
            }
            append.push(rm(Code::Lea_r64_m, rc, mem(rc, Register::None, 1))?);
            let mut body: Vec<Instruction> = tests;
            body.append(&mut append);
            body[0].set_ip(retry);
            tail.extend(body);
            if acc.merge {
                tail.push(br(Code::Jmp_rel32_64, back_store)?);
                tail.push(labelled(mr(Code::Mov_rm64_r64, entry(c, -16), v)?, merge));
                tail.push(mr(Code::Mov_rm64_r64, shadow(slot), v)?);
            }
        }
        let mut epilogue = Vec::new();
        if s.flags_out {
            epilogue.extend(restore_flags()?);
        }
        for &r in s.spills.iter().rev() {
            epilogue.push(Instruction::with1(Code::Pop_r64, r).map_err(enc)?);
        }
        if !s.spills.is_empty() {
            epilogue.push(self.lea_rsp(RED_ZONE)?);
        }
        // The helper (log scan; flushes on a partial overlap): value into v, then back_load.
        if s.read {
            let (out, back) = self.count_sync()?;
            cold.push(labelled(rm(Code::Lea_r64_m, a, s.ea)?, helper_load));
            cold.extend(out);
            cold.extend([
                self.lea_rsp(-RED_ZONE)?,
                Instruction::with1(Code::Push_r64, a).map_err(enc)?,
                Instruction::with1(Code::Push_r64, a).map_err(enc)?,
                Instruction::with_branch(Code::Call_rel32_64, self.rt.load[size_index(s.size)])
                    .map_err(enc)?,
                Instruction::with1(Code::Pop_r64, v).map_err(enc)?,
                self.lea_rsp(RED_ZONE + 8)?,
            ]);
            cold.extend(back);
            cold.push(br(Code::Jmp_rel32_64, back_load)?);
        }
        // Assemble: hot, [back_load:] after_load, tail, [back_store:] epilogue. With the
        // original instruction in the hot path, the after_load part goes cold.
        let mut seq = hot;
        let mut load_part = after_load;
        if load_part.is_empty() {
            load_part.push(Instruction::with(Code::Nopd));
        }
        load_part[0].set_ip(back_load);
        if after_in_cold {
            cold.extend(load_part);
            cold.push(br(Code::Jmp_rel32_64, back_store)?);
        } else if s.read {
            seq.extend(load_part);
        } else {
            // A pure store: the body computes v (`mov v, imm`, …).
            seq.extend(s.body);
        }
        seq.extend(tail);
        match epilogue.first_mut() {
            Some(f) => f.set_ip(back_store),
            None => epilogue.push(nop_at(back_store)),
        }
        seq.extend(epilogue);
        let mut first = true;
        for ins in seq {
            if first && ins.ip() == 0 {
                self.push_at(ins, s.label);
            } else if first {
                self.push_at(Instruction::with(Code::Nopd), s.label);
                self.push(ins);
            } else {
                self.push(ins);
            }
            first = false;
        }
        self.cold.extend(cold);
        Ok(true)
    }
}
