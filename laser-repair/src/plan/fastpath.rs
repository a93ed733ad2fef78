//! The inline fast path, used when some register `RS` is mentioned by no region instruction:
//! it then holds the thread's SSB state pointer for the whole region. Every entry (patched
//! entries and the pc map) goes through a trampoline where `ssb_enter` saves RS's value in the
//! state and loads the state pointer; every exit restores RS. A thread that gets no state
//! slot is sent to an uninstrumented copy of the region instead.
//!
//! Inline, with no call: a load whose words are clear in the log's summary bitmap reads
//! memory; a load matching the youngest entry forwards it; a store with the tail entry's
//! address and size merges into it; a back-edge with an empty log costs a compare. Anything
//! else jumps to cold code that calls the helpers. Scratch registers are dead ones where
//! liveness allows, else spilled below the red zone; flags are saved with `seto/lahf` only
//! where they are live.

use super::fixed_emit::FixedSeq;
use super::insn::{br, i2, mem, mi, mr, restore_flags, ri, rm, save_flags};
use super::lanes::{Lanes, LoadLabels, Regs, StoreLabels};
use super::liveness::{bit, gpr, FLAGS};
use super::refusal::RefusalReason;
use super::rewrite::{enc, sized, Emitter, RED_ZONE};
use super::ssb_layout::MAX_RESERVED;
use super::ssb_runtime::{
    index_offset, iters_offset, size_index, ST_BACKEDGES, ST_COUNT, ST_ENTRIES, ST_SUMMARY,
};
use iced_x86::{Code, Encoder, Instruction, MemoryOperand, OpKind, Register};

/// Candidate scratch registers, in preference order.
const POOL: [Register; 14] = [
    Register::R11,
    Register::R10,
    Register::R9,
    Register::R8,
    Register::RDI,
    Register::RSI,
    Register::RDX,
    Register::RCX,
    Register::RBX,
    Register::R12,
    Register::R13,
    Register::R14,
    Register::R15,
    Register::RBP,
];

impl Emitter<'_> {
    /// Emits the fast-path sequence for instruction `k`; `Ok(false)` when it cannot (the
    /// caller then uses the helper sequence).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn emit_ssb_fast(
        &mut self,
        k: usize,
        i: &Instruction,
        op: u32,
        size: u32,
        read: bool,
        write: bool,
        label: u64,
        forward_first: bool,
    ) -> Result<bool, RefusalReason> {
        let (Some(rs), Some(live)) = (self.rs, self.live) else {
            return Ok(false);
        };
        let base = i.memory_base();
        if base != Register::None && base != Register::RIP && !base.is_gpr64() {
            return Ok(false);
        }
        let mentioned = live.mentioned[k];
        // Reserved registers are free inside the region (saved at entry, restored at exits).
        let reserved_mask = self
            .reserved
            .iter()
            .filter_map(|&r| bit(r))
            .fold(0, |x, y| x | y);
        let live_now = (live.live_in[k] | live.live_out[k]) & !FLAGS & !reserved_mask;
        let flags_in = read && live.live_in[k] & FLAGS != 0;
        let flags_out = write && live.live_out[k] & FLAGS != 0;
        let need_rax = flags_in || flags_out;
        let rax = bit(Register::RAX).unwrap_or(0);
        if need_rax && mentioned & rax != 0 {
            return Ok(false);
        }
        let rs_bit = bit(rs).unwrap_or(0) | self.count_reg.and_then(bit).unwrap_or(0);
        let mut taken = mentioned | rs_bit | if need_rax { rax } else { 0 };
        let mut pool: Vec<Register> = POOL.to_vec();
        if !need_rax {
            pool.insert(0, Register::RAX);
        }
        // Dead registers first: they cost nothing.
        pool.sort_by_key(|r| bit(*r).is_some_and(|b| live_now & b != 0));
        // Reserved registers first.
        pool.sort_by_key(|r| !self.reserved.contains(r));
        // Plain `mov` loads and stores use the instruction's own register as V: the value
        // moves straight between it and the log or memory, with no copy and no spill.
        // A vector piece (`wide.rs`) moves its value between V and the scratch area: V is
        // always a scratch register, never the (synthetic) instruction's own.
        let piece = self.piece;
        let own = match i.code() {
            _ if piece.is_some() => None,
            Code::Mov_r64_rm64 | Code::Mov_r32_rm32 if read && !write && op == 1 => {
                Some(i.op0_register())
            }
            Code::Mov_rm64_r64 | Code::Mov_rm32_r32 | Code::Mov_rm16_r16 | Code::Mov_rm8_r8
                if write && !read && op == 0 =>
            {
                let r = i.op1_register();
                (!matches!(r, Register::AH | Register::CH | Register::DH | Register::BH))
                    .then_some(r)
            }
            _ => None,
        };
        // V must let the instruction encode with it in place of the memory operand.
        let mut enc64 = Encoder::new(64);
        let mut v = None;
        if let Some(r) = own {
            // A 4-byte load zero-extends; forwarded values may carry garbage above the size.
            let body = (read && size == 4)
                .then(|| {
                    i2(
                        Code::Mov_r32_rm32,
                        sized(r.full_register(), 4),
                        sized(r.full_register(), 4),
                    )
                })
                .transpose()?;
            v = Some((r.full_register(), body));
        }
        for &t in pool.iter().filter(|_| own.is_none()) {
            let b = bit(t).unwrap_or(0);
            if taken & b != 0 {
                continue;
            }
            let mut ii = *i;
            ii.set_op_kind(op, OpKind::Register);
            ii.set_op_register(op, sized(t, size));
            ii.set_segment_prefix(Register::None);
            ii.set_memory_base(Register::None);
            ii.set_memory_index(Register::None);
            ii.set_memory_displacement64(0);
            ii.set_memory_displ_size(0);
            ii.set_ip(0);
            if enc64.encode(&ii, 0).is_ok() {
                v = Some((t, Some(ii)));
                taken |= b;
                break;
            }
        }
        let Some((v, mut body)) = v else {
            return Ok(false);
        };
        if let Some(p) = piece {
            body = Some(p.body(self.rs, v)?);
        }
        let mut pick = || -> Option<Register> {
            let r = pool
                .iter()
                .copied()
                .find(|r| bit(*r).is_some_and(|b| taken & b == 0))?;
            taken |= bit(r).unwrap_or(0);
            Some(r)
        };
        let (Some(a), Some(c), Some(m)) = (pick(), pick(), pick()) else {
            return Ok(false);
        };
        let scratch: &[Register] = if own.is_some() {
            &[a, c, m]
        } else {
            &[v, a, c, m]
        };
        let mut spills: Vec<Register> = scratch
            .iter()
            .copied()
            .filter(|r| bit(*r).is_some_and(|b| live_now & b != 0))
            .collect();
        if need_rax && live_now & rax != 0 {
            spills.push(Register::RAX);
        }
        // --- hot sequence ---
        let mut first_label = Some(label);
        let mut hot: Vec<Instruction> = Vec::new();
        if !spills.is_empty() {
            hot.push(self.lea_rsp(-RED_ZONE)?);
            for &s in &spills {
                hot.push(Instruction::with1(Code::Push_r64, s).map_err(enc)?);
            }
        }
        let shift = if spills.is_empty() {
            0
        } else {
            RED_ZONE + 8 * spills.len() as i64
        };
        if flags_in {
            hot.extend(save_flags()?);
        }
        let ea = if base == Register::RIP {
            MemoryOperand::with_base_displ(Register::RIP, i.memory_displacement64() as i64)
        } else {
            let mut d = i.memory_displacement64() as i64;
            if base == Register::RSP {
                d += shift;
            }
            let ds = if base != Register::None && i8::try_from(d).is_ok() {
                1
            } else {
                8
            };
            MemoryOperand::new(
                base,
                i.memory_index(),
                i.memory_index_scale(),
                d,
                ds,
                false,
                Register::None,
            )
        };
        if self.fixed.is_some() {
            return self.emit_fixed(FixedSeq {
                k: piece.map_or(k, |p| p.key),
                i: *i,
                size,
                read,
                write,
                a,
                c,
                m,
                v,
                body,
                ea,
                flags_in,
                flags_out,
                spills,
                prologue: hot,
                label,
            });
        }
        hot.push(rm(Code::Lea_r64_m, a, ea)?);
        let back_load = self.label();
        let back_store = self.label();
        let cold_load = self.label();
        let cold_store = self.label();
        let entry = |disp: i32| mem(rs, c, i64::from(ST_ENTRIES + disp));
        let helper_load = self.label();
        if read {
            // Youngest entry first when a store in the region uses the same address
            // expression (counter++ patterns), else the summary check first.
            let youngest = |miss: u64| -> Result<Vec<Instruction>, RefusalReason> {
                Ok(vec![
                    rm(
                        Code::Mov_r64_rm64,
                        c,
                        mem(rs, Register::None, ST_COUNT.into()),
                    )?,
                    ri(Code::Shl_rm64_imm8, c, 5)?,
                    mi(Code::Cmp_rm64_imm8, entry(-24), size as i32)?,
                    br(Code::Jne_rel32_64, miss)?,
                    mr(Code::Cmp_rm64_r64, entry(-32), a)?,
                    br(Code::Jne_rel32_64, miss)?,
                    rm(Code::Mov_r64_rm64, v, entry(-16))?,
                    br(Code::Jmp_rel32_64, back_load)?,
                ])
            };
            let summary_miss = cold_load;
            let mut summary = vec![
                rm(
                    Code::Mov_r64_rm64,
                    m,
                    mem(rs, Register::None, ST_SUMMARY.into()),
                )?,
                i2(Code::Mov_r64_rm64, c, a)?,
                ri(Code::Shr_rm64_imm8, c, 3)?,
                i2(Code::Bt_rm64_r64, m, c)?,
                br(Code::Jb_rel32_64, summary_miss)?,
            ];
            if size > 1 {
                summary.push(rm(
                    Code::Lea_r64_m,
                    c,
                    mem(a, Register::None, i64::from(size) - 1),
                )?);
                summary.push(ri(Code::Shr_rm64_imm8, c, 3)?);
                summary.push(i2(Code::Bt_rm64_r64, m, c)?);
                summary.push(br(Code::Jb_rel32_64, summary_miss)?);
            }
            if forward_first {
                let sum_label = self.label();
                hot.extend(youngest(sum_label)?);
                summary[0].set_ip(sum_label);
            }
            hot.extend(summary);
            let direct_label = self.label();
            let other_word = self.label();
            let lanes = self.lane_code()?;
            let labels = LoadLabels {
                helper: helper_load,
                direct: direct_label,
                other_word,
                back: back_load,
            };
            let mut cold = lanes.cold_load(&Regs { a, c, m, v }, size, &labels)?;
            cold[0].set_ip(cold_load);
            self.cold.extend(cold);
            let am = MemoryOperand::with_base(a);
            let mut direct = match size {
                1 => rm(Code::Movzx_r32_rm8, sized(v, 4), am)?,
                2 => rm(Code::Movzx_r32_rm16, sized(v, 4), am)?,
                4 => rm(Code::Mov_r32_rm32, sized(v, 4), am)?,
                _ => rm(Code::Mov_r64_rm64, v, am)?,
            };
            direct.set_ip(direct_label);
            hot.push(direct);
        }
        let mut restore_in = Vec::new();
        if flags_in {
            restore_in.extend(restore_flags()?);
        }
        let mut tail: Vec<Instruction> = Vec::new();
        if write {
            if flags_out {
                tail.extend(save_flags()?);
            }
            tail.push(rm(
                Code::Mov_r64_rm64,
                c,
                mem(rs, Register::None, ST_COUNT.into()),
            )?);
            tail.push(ri(Code::Shl_rm64_imm8, c, 5)?);
            tail.push(mi(Code::Cmp_rm64_imm8, entry(-24), size as i32)?);
            tail.push(br(Code::Jne_rel32_64, cold_store)?);
            tail.push(mr(Code::Cmp_rm64_r64, entry(-32), a)?);
            tail.push(br(Code::Jne_rel32_64, cold_store)?);
            tail.push(mr(Code::Mov_rm64_r64, entry(-16), v)?);
        }
        let mut epilogue = Vec::new();
        if flags_out {
            epilogue.extend(restore_flags()?);
        }
        for &s in spills.iter().rev() {
            epilogue.push(Instruction::with1(Code::Pop_r64, s).map_err(enc)?);
        }
        if !spills.is_empty() {
            epilogue.push(self.lea_rsp(RED_ZONE)?);
        }
        // Emit: hot, [back_load:] restore_in, body, tail, [back_store:] epilogue.
        let mut emit = |e: &mut Self, ins: Instruction, lab: Option<u64>| {
            if ins.ip() != 0 {
                // Carries an internal label already (never the first instruction).
                e.push(ins);
                return;
            }
            match lab.or(first_label.take()) {
                Some(l) => e.push_at(ins, l),
                None => e.push(ins),
            }
        };
        for ins in hot {
            emit(self, ins, None);
        }
        // A label must sit on an instruction: the back_load label goes on the first
        // instruction after the load (restore, body).
        let mut after_load: Vec<Instruction> = restore_in;
        after_load.extend(body);
        if after_load.is_empty() {
            // The back_load label needs an instruction to sit on.
            after_load.push(Instruction::with(Code::Nopd));
        }
        for (n, ins) in after_load.into_iter().enumerate() {
            emit(self, ins, (n == 0).then_some(back_load));
        }
        for ins in tail {
            emit(self, ins, None);
        }
        let nop = Instruction::with(Code::Nopd);
        let mut ep = epilogue.into_iter();
        match ep.next() {
            Some(first) => emit(self, first, Some(back_store)),
            None => emit(self, nop, Some(back_store)),
        }
        for ins in ep {
            emit(self, ins, None);
        }
        // --- cold code ---
        if read {
            let mut call_part = vec![
                self.lea_rsp(-RED_ZONE)?,
                Instruction::with1(Code::Push_r64, a).map_err(enc)?,
                Instruction::with1(Code::Push_r64, a).map_err(enc)?,
                Instruction::with_branch(Code::Call_rel32_64, self.rt.load[size_index(size)])
                    .map_err(enc)?,
                Instruction::with1(Code::Pop_r64, v).map_err(enc)?,
                self.lea_rsp(RED_ZONE + 8)?,
                br(Code::Jmp_rel32_64, back_load)?,
            ];
            call_part[0].set_ip(helper_load);
            self.cold.extend(call_part);
        }
        if write {
            // Append inline while the log has room and the entry stays within one 8-byte
            // word. `c` = count * 32 from the tail check.
            let helper_store = self.label();
            let lanes = self.lane_code()?;
            let labels = StoreLabels {
                helper: helper_store,
                fresh: self.label(),
                claim: self.label(),
                set: self.label(),
                back: back_store,
            };
            let mut append = lanes.inline_append(&Regs { a, c, m, v }, size, &labels)?;
            if self.rt.config.merge_any_entry_broken {
                // The test-only mutation lives in the helper: always go there.
                append = vec![br(Code::Jmp_rel32_64, helper_store)?];
            }
            append[0].set_ip(cold_store);
            self.cold.extend(append);
            let mut cold = vec![
                self.lea_rsp(-RED_ZONE)?,
                Instruction::with1(Code::Push_r64, a).map_err(enc)?,
                Instruction::with1(Code::Push_r64, v).map_err(enc)?,
                Instruction::with_branch(Code::Call_rel32_64, self.rt.store[size_index(size)])
                    .map_err(enc)?,
                self.lea_rsp(RED_ZONE + 16)?,
                br(Code::Jmp_rel32_64, back_store)?,
            ];
            cold[0].set_ip(helper_store);
            self.cold.extend(cold);
        }
        Ok(true)
    }

    /// Back-edge to `target_label`: with an empty log, nothing; else count, and flush every
    /// `backedges_per_flush`. `flags_live` at the loop header decides the flag save.
    pub(super) fn emit_backedge_fast(
        &mut self,
        label: u64,
        target_label: u64,
        target_ip: u64,
        flags_live: bool,
        rax_live: bool,
    ) -> Result<bool, RefusalReason> {
        let Some(rs) = self.rs else { return Ok(false) };
        let go = self.label();
        let mut seq = Vec::new();
        let spill = flags_live && rax_live;
        if spill {
            seq.push(self.lea_rsp(-RED_ZONE)?);
            seq.push(Instruction::with1(Code::Push_r64, Register::RAX).map_err(enc)?);
        }
        if flags_live {
            seq.extend(save_flags()?);
        }
        // With nothing to restore, the common case branches straight to the loop head.
        let fast = if flags_live || spill {
            go
        } else {
            target_label
        };
        // The trial's progress counter (flags saved above if live): one add per iteration,
        // or for a count-only plan with a spare register, a register countdown that adds
        // a whole period to the counter (and the rest at exits: `trial_count_flush`).
        let iters = i64::from(iters_offset(&self.rt.config));
        let period = self.rt.config.backedges_per_flush as i32;
        let tc = self.trial_reg();
        match tc {
            Some(tc) => {
                seq.push(Instruction::with1(Code::Dec_rm64, tc).map_err(enc)?);
                seq.push(br(Code::Jne_rel32_64, fast)?);
                seq.push(mi(
                    Code::Add_rm64_imm32,
                    mem(rs, Register::None, iters),
                    period,
                )?);
                seq.push(ri(Code::Mov_rm64_imm32, tc, period)?);
            }
            None => seq.push(mi(Code::Add_rm64_imm8, mem(rs, Register::None, iters), 1)?),
        }
        // Count-only plans have no log, but keep the countdown so the kill switch below
        // is polled (and their back-edge costs what the repair's does).
        if !self.count_only {
            match self.count_reg {
                Some(rc) => seq.push(ri(Code::Cmp_rm64_imm8, rc, 0)?),
                None => seq.push(mi(
                    Code::Cmp_rm64_imm8,
                    mem(rs, Register::None, ST_COUNT.into()),
                    0,
                )?),
            }
            seq.push(br(Code::Je_rel32_64, fast)?);
        }
        let flush = self.label();
        // A fixed region's stores do not test for a full log: every iteration must start
        // with room for the most stores a path through the region makes.
        if let (Some(f), Some(rc)) = (self.fixed.as_ref(), self.count_reg) {
            let cap = self.rt.config.log_capacity;
            if f.max_path_stores <= cap {
                let room = (cap - f.max_path_stores) as i32;
                seq.push(ri(Code::Cmp_rm64_imm32, rc, room)?);
                seq.push(br(Code::Ja_rel32_64, flush)?);
            }
        }
        // Back-edges left before a forced flush: one read-modify-write, no reload.
        if tc.is_none() {
            seq.push(mi(
                Code::Sub_rm64_imm8,
                mem(rs, Register::None, ST_BACKEDGES.into()),
                1,
            )?);
            seq.push(br(Code::Jae_rel32_64, fast)?);
        }
        if self.count_only {
            // No log to flush: only restart the countdown (what a flush would do).
            if tc.is_none() {
                let m = mem(rs, Register::None, ST_BACKEDGES.into());
                seq.push(mi(Code::Mov_rm64_imm32, m, period - 1)?);
            }
        } else {
            let (sync_out, sync_in) = self.count_sync()?;
            let mut first_flush = true;
            for mut ins in sync_out.into_iter().chain([self.lea_rsp(-RED_ZONE)?]) {
                if first_flush {
                    ins.set_ip(flush);
                    first_flush = false;
                }
                seq.push(ins);
            }
            seq.push(Instruction::with_branch(Code::Call_rel32_64, self.rt.flush).map_err(enc)?);
            seq.push(self.lea_rsp(RED_ZONE)?);
            seq.extend(sync_in);
        }
        // Kill switch (`KILL_OFF`): with the log just flushed, leave for the native copy's
        // loop header instead (cold: restore flags, rax, the reserved and state registers).
        let killed = self.label();
        let kill = MemoryOperand::with_base_displ(Register::RIP, self.rt.kill_addr() as i64);
        seq.push(mi(Code::Cmp_rm64_imm8, kill, 0)?);
        seq.push(br(Code::Jne_rel32_64, killed)?);
        let mut tail = Vec::new();
        if flags_live {
            tail.extend(restore_flags()?);
        }
        if spill {
            tail.push(Instruction::with1(Code::Pop_r64, Register::RAX).map_err(enc)?);
            tail.push(self.lea_rsp(RED_ZONE)?);
        }
        let mut out = tail.clone();
        out.extend(self.restore_rs_seq()?);
        let native = self.native_label(target_ip);
        out.push(br(Code::Jmp_rel32_64, native)?);
        out[0].set_ip(killed);
        self.cold.extend(out);
        tail.push(br(Code::Jmp_rel32_64, target_label)?);
        let mut it = seq.into_iter();
        if let Some(f) = it.next() {
            self.push_at(f, label);
        }
        for ins in it {
            self.push(ins);
        }
        let mut t = tail.into_iter();
        if let Some(f) = t.next() {
            self.push_at(f, go);
        }
        for ins in t {
            self.push(ins);
        }
        Ok(true)
    }
}

impl Emitter<'_> {
    fn lane_code(&self) -> Result<Lanes, RefusalReason> {
        let rs = self
            .rs
            .ok_or_else(|| RefusalReason::Encoding("no state register".into()))?;
        Ok(Lanes {
            rs,
            base: i64::from(index_offset(&self.rt.config)),
        })
    }
}

/// Registers that may hold the state or be reserved, by bit number: caller-saved first. Never
/// rax (flag saves need AH) or rsp.
const CANDIDATES: [u32; 14] = [11, 10, 9, 8, 7, 6, 2, 1, 3, 12, 13, 14, 15, 5];

/// Up to `MAX_RESERVED` more registers no region instruction mentions (besides `rs`).
pub fn pick_reserved(mentioned: &[u32], region_insns: &[usize], rs: Register) -> Vec<Register> {
    let busy = region_insns.iter().fold(0u32, |acc, &k| acc | mentioned[k]) | bit(rs).unwrap_or(0);
    CANDIDATES
        .into_iter()
        .filter(|&n| busy & (1 << n) == 0)
        .map(gpr)
        .take(MAX_RESERVED)
        .collect()
}

/// A register no region instruction mentions, or `None`. Its value is saved at entry and
/// restored at every exit, so it need not be dead.
pub fn pick_state_register(mentioned: &[u32], region_insns: &[usize]) -> Option<Register> {
    let busy = region_insns.iter().fold(0u32, |acc, &k| acc | mentioned[k]);
    CANDIDATES
        .into_iter()
        .find(|&n| busy & (1 << n) == 0)
        .map(gpr)
}
