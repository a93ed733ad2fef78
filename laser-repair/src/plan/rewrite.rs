//! Code generation for the region: every memory access through the SSB helpers, flushes at
//! flush points and exits, a back-edge counter on every backward edge.
//!
//! Each original instruction becomes a sequence that starts at a label; in-region branches
//! are retargeted to labels, never to original addresses, so an exit jump to an original
//! address inside the region (a `call` executed in the original code) is not captured by the
//! block encoder's relocation. Labels are small fake IPs (below 64 KiB, where Linux never maps
//! code: `vm.mmap_min_addr`).
//!
//! One access `add [rbx+8], eax` becomes (T = a scratch register `add` does not use):
//! ```text
//!   lea rsp,[rsp-128]     ; skip the red zone
//!   push T                ; spill T
//!   lea T,[rbx+8]         ; effective address (rsp-based: displacement + 136)
//!   push T ; push T       ; address slot, value slot
//!   call ssb_load4        ; value slot <- youngest log entry or memory
//!   mov T,[rsp]
//!   add T32, eax          ; the original instruction on T: same flags
//!   mov [rsp],T
//!   call ssb_store4       ; tail-merge or append
//!   lea rsp,[rsp+16] ; pop T ; lea rsp,[rsp+128]
//! ```
//! None of lea/push/pop/mov/call changes the flags and the helpers preserve them.

use super::cfg::Cfg;
use super::classify::Treatment;
use super::fastpath::{pick_reserved, pick_state_register};
use super::fixed::{self, Fixed};
use super::label_nops::drop_label_nops;
use super::liveness::{Liveness, FLAGS};
use super::native_copy::emit_native_copy;
use super::refusal::RefusalReason;
use super::region::Region;
use super::ssb_runtime::{iters_offset, saved_regs_offset, RuntimeInfo, ST_COUNT, ST_SAVED_RS};
use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, FlowControl, Instruction, InstructionBlock,
    InstructionInfoFactory, MemoryOperand, Register,
};
use std::collections::{HashMap, HashSet};

pub(super) const RED_ZONE: i64 = 128;
const LABEL_LIMIT: u64 = 0x1_0000;

/// Scratch registers in order of preference (no REX-only byte registers first is not needed:
/// the encoder check below rejects any pairing that cannot be encoded).
pub(super) const SCRATCH: [Register; 14] = [
    Register::RDI,
    Register::RSI,
    Register::R11,
    Register::R10,
    Register::R9,
    Register::R8,
    Register::RDX,
    Register::RCX,
    Register::RAX,
    Register::RBX,
    Register::R12,
    Register::R13,
    Register::R14,
    Register::R15,
];

pub struct Rewritten {
    pub code: Vec<u8>,
    /// Original instruction address -> where a thread there continues in the code cache
    /// (its trampoline in fast mode, its sequence otherwise).
    pub pc_map: Vec<(u64, u64)>,
    /// The register holding the SSB state in the region (fast path), if any.
    pub state_register: Option<Register>,
    /// Safe points for undo: `(pc in the cache, where to continue)`.
    pub undo_map: Vec<(u64, u64)>,
    /// Store locations of a fixed-address region, 0 if the region is not one.
    pub fixed_locations: usize,
}

pub(super) struct Emitter<'a> {
    pub(super) out: Vec<Instruction>,
    /// Rarely executed code (helper calls of the fast path), appended after everything.
    pub(super) cold: Vec<Instruction>,
    /// Register holding the thread's SSB state in the region (fast path), if one is free.
    pub(super) rs: Option<Register>,
    /// Scratch registers reserved for the whole region (saved/restored like `rs`).
    pub(super) reserved: Vec<Register>,
    /// The fixed-address plan (`fixed.rs`), when the region qualifies (fast path only).
    pub(super) fixed: Option<Fixed>,
    /// Fixed regions: the register holding the log's entry count (a reserved register;
    /// `ST_COUNT` in memory is written before and read after every helper call).
    pub(super) count_reg: Option<Register>,
    /// `PlanOptions::count_only`: accesses verbatim, back-edges still counted.
    pub(super) count_only: bool,
    pub(super) live: Option<&'a Liveness>,
    /// Set while `emit_ssb_fast` emits one piece of a vector access (`wide.rs`).
    pub(super) piece: Option<super::wide::Piece>,
    /// Direct calls under an entry jmp: the region leaves through an imitation of the call
    /// ([`Self::exit_at_call`]), since their original bytes are the jmp now.
    pub(super) imitate: Vec<u64>,
    /// For each original instruction address: index in `out` of its first instruction.
    pub(super) first: Vec<(u64, usize)>,
    labels: HashMap<u64, u64>,
    /// Labels of the uninstrumented copy (fast mode only), by original address.
    native: HashMap<u64, u64>,
    next_label: u64,
    pub(super) rt: &'a RuntimeInfo,
    pub(super) info: InstructionInfoFactory,
}

pub(super) fn enc(e: iced_x86::IcedError) -> RefusalReason {
    RefusalReason::Encoding(e.to_string())
}

pub(super) fn sized(r: Register, size: u32) -> Register {
    use Register::*;
    const R64: [Register; 16] = [
        RAX, RCX, RDX, RBX, RSP, RBP, RSI, RDI, R8, R9, R10, R11, R12, R13, R14, R15,
    ];
    const R32: [Register; 16] = [
        EAX, ECX, EDX, EBX, ESP, EBP, ESI, EDI, R8D, R9D, R10D, R11D, R12D, R13D, R14D, R15D,
    ];
    const R16: [Register; 16] = [
        AX, CX, DX, BX, SP, BP, SI, DI, R8W, R9W, R10W, R11W, R12W, R13W, R14W, R15W,
    ];
    const R8B: [Register; 16] = [
        AL, CL, DL, BL, SPL, BPL, SIL, DIL, R8L, R9L, R10L, R11L, R12L, R13L, R14L, R15L,
    ];
    let n = R64.iter().position(|&x| x == r).unwrap_or(0);
    match size {
        1 => R8B[n],
        2 => R16[n],
        4 => R32[n],
        _ => R64[n],
    }
}

impl<'a> Emitter<'a> {
    /// The 64-bit registers `i` reads or writes (a scratch register must be none of them).
    pub(super) fn used_regs(&mut self, i: &Instruction) -> std::collections::HashSet<Register> {
        self.info
            .info(i)
            .used_registers()
            .iter()
            .map(|r| r.register().full_register())
            .collect()
    }

    pub(super) fn label(&mut self) -> u64 {
        self.next_label += 1;
        self.next_label
    }

    pub(super) fn orig_label(&mut self, ip: u64) -> u64 {
        if let Some(&l) = self.labels.get(&ip) {
            return l;
        }
        let l = self.label();
        self.labels.insert(ip, l);
        l
    }

    pub(super) fn native_label(&mut self, ip: u64) -> u64 {
        if let Some(&l) = self.native.get(&ip) {
            return l;
        }
        let l = self.label();
        self.native.insert(ip, l);
        l
    }

    /// `mov rs,[rs+saved]` before leaving the region (fast mode): callers may rely on the
    /// register's value. No flags touched.
    fn restore_rs(&mut self) -> Result<(), RefusalReason> {
        for i in self.restore_rs_seq()? {
            self.push(i);
        }
        Ok(())
    }

    /// Count-only plans (fast path): the reserved register that counts back-edges down
    /// from `backedges_per_flush` (accesses are verbatim, so no reserved register is
    /// otherwise in use): no memory read-modify-write per iteration, so the trial's native
    /// baseline stays close to the untouched loop.
    pub(super) fn trial_reg(&self) -> Option<Register> {
        self.rs?;
        self.count_only
            .then(|| self.reserved.first().copied())
            .flatten()
    }

    /// At an exit of a count-only region: add the back-edges of the unfinished period to
    /// the counter (`period - countdown`). pushfq/popfq below the red zone: flags may be
    /// live here, and exits are rare next to iterations.
    fn trial_count_flush(&self, rs: Register) -> Result<Vec<Instruction>, RefusalReason> {
        let Some(tc) = self.trial_reg() else {
            return Ok(Vec::new());
        };
        let period = self.rt.config.backedges_per_flush as i32;
        let iters = MemoryOperand::with_base_displ(rs, i64::from(iters_offset(&self.rt.config)));
        Ok(vec![
            self.lea_rsp_at(-RED_ZONE)?,
            Instruction::with(Code::Pushfq),
            Instruction::with1(Code::Neg_rm64, tc).map_err(enc)?,
            Instruction::with2(Code::Add_rm64_imm32, tc, period).map_err(enc)?,
            Instruction::with2(Code::Add_rm64_r64, iters, tc).map_err(enc)?,
            Instruction::with(Code::Popfq),
            self.lea_rsp_at(RED_ZONE)?,
        ])
    }

    fn lea_rsp_at(&self, delta: i64) -> Result<Instruction, RefusalReason> {
        Instruction::with2(
            Code::Lea_r64_m,
            Register::RSP,
            MemoryOperand::with_base_displ(Register::RSP, delta),
        )
        .map_err(enc)
    }

    /// The instructions of [`Self::restore_rs`], for code emitted out of line.
    pub(super) fn restore_rs_seq(&self) -> Result<Vec<Instruction>, RefusalReason> {
        let mut out = Vec::new();
        if let Some(rs) = self.rs {
            out.extend(self.trial_count_flush(rs)?);
            let base = i64::from(saved_regs_offset(&self.rt.config));
            for (k, &r) in self.reserved.iter().enumerate() {
                let m = MemoryOperand::with_base_displ(rs, base + 8 * k as i64);
                out.push(Instruction::with2(Code::Mov_r64_rm64, r, m).map_err(enc)?);
            }
            let m = MemoryOperand::with_base_displ(rs, i64::from(ST_SAVED_RS));
            out.push(Instruction::with2(Code::Mov_r64_rm64, rs, m).map_err(enc)?);
        }
        Ok(out)
    }

    /// After the trampoline loaded the state: save the reserved registers in it.
    fn save_reserved(&mut self, rs: Register) -> Result<(), RefusalReason> {
        let base = i64::from(saved_regs_offset(&self.rt.config));
        for (k, &r) in self.reserved.clone().iter().enumerate() {
            let m = MemoryOperand::with_base_displ(rs, base + 8 * k as i64);
            self.push(Instruction::with2(Code::Mov_rm64_r64, m, r).map_err(enc)?);
        }
        Ok(())
    }

    /// Whether instruction `k` is a frame access that runs verbatim (`frame.rs`).
    pub(super) fn bypasses(&self, k: usize) -> bool {
        self.fixed
            .as_ref()
            .and_then(|f| f.frame.as_ref())
            .is_some_and(|fr| fr.bypass.contains(&k))
    }

    /// In a trampoline of a region whose frame accesses run verbatim, after the state is
    /// loaded: if the bytes of any store group (its base's value now; a slot's value for a
    /// derived base) meet the frame's `[rbp+lo, rbp+hi)`, the buffered stores could hide a
    /// local from the thread's own verbatim loads (or change a slot a base is reloaded
    /// from): restore the registers and run the uninstrumented copy instead (`frame.rs`).
    /// Each group: `[B+lo, B+hi)` meets `[F+flo, F+fhi)` iff `B+hi-1-(F+flo)` is below
    /// `(fhi-flo)+(hi-lo)-1`, unsigned.
    fn frame_check(&mut self, rs: Register, ip: u64) -> Result<(), RefusalReason> {
        let Some((groups, frame)) = self
            .fixed
            .as_ref()
            .and_then(|f| Some((f.groups.clone(), f.frame.clone()?)))
        else {
            return Ok(());
        };
        let a = [
            Register::RAX,
            Register::RCX,
            Register::RDX,
            Register::RSI,
            Register::RDI,
        ]
        .into_iter()
        .find(|&r| r != rs && !self.reserved.contains(&r) && groups.iter().all(|g| g.index != r))
        .ok_or_else(|| RefusalReason::Encoding("no scratch register for the frame check".into()))?;
        let bad = self.label();
        let ok = self.label();
        let mut seq = vec![
            Instruction::with(Code::Pushfq),
            Instruction::with1(Code::Push_r64, a).map_err(enc)?,
        ];
        // `a`'s own value is at [rsp] (a base or index may be `a`).
        let orig = |r: Register| -> Result<Instruction, RefusalReason> {
            if r == a {
                Instruction::with2(
                    Code::Mov_r64_rm64,
                    a,
                    MemoryOperand::with_base_displ(Register::RSP, 0),
                )
                .map_err(enc)
            } else {
                Instruction::with2(Code::Mov_r64_rm64, a, r).map_err(enc)
            }
        };
        for g in groups.iter().filter(|g| !g.base.is_rip()) {
            match g.base {
                fixed::Base::Reg(r) => seq.push(orig(r)?),
                fixed::Base::Slot(d) => seq.push(
                    Instruction::with2(
                        Code::Mov_r64_rm64,
                        a,
                        MemoryOperand::with_base_displ(Register::RBP, d),
                    )
                    .map_err(enc)?,
                ),
            }
            if g.index != Register::None {
                // a += index * scale (the index is not `a`, by the choice of `a`).
                let x = MemoryOperand::new(a, g.index, g.scale, 0, 0, false, Register::None);
                seq.push(Instruction::with2(Code::Lea_r64_m, a, x).map_err(enc)?);
            }
            let w = (frame.hi - frame.lo) + (g.hi - g.lo) - 1;
            let disp = g.hi - 1 - frame.lo;
            let (Ok(w), Ok(_)) = (i32::try_from(w), i32::try_from(disp)) else {
                return Err(RefusalReason::Encoding("frame check: group too far".into()));
            };
            seq.push(
                Instruction::with2(Code::Lea_r64_m, a, MemoryOperand::with_base_displ(a, disp))
                    .map_err(enc)?,
            );
            seq.push(Instruction::with2(Code::Sub_rm64_r64, a, Register::RBP).map_err(enc)?);
            seq.push(Instruction::with2(Code::Cmp_rm64_imm32, a, w).map_err(enc)?);
            seq.push(Instruction::with_branch(Code::Jb_rel32_64, bad).map_err(enc)?);
        }
        seq.push(Instruction::with1(Code::Pop_r64, a).map_err(enc)?);
        seq.push(Instruction::with(Code::Popfq));
        seq.push(Instruction::with_branch(Code::Jmp_rel32_64, ok).map_err(enc)?);
        for i in seq {
            self.push(i);
        }
        // The frame is in reach of the buffer: back to the thread's own registers, native copy.
        let mut b = Instruction::with1(Code::Pop_r64, a).map_err(enc)?;
        b.set_ip(bad);
        self.push(b);
        self.push(Instruction::with(Code::Popfq));
        for i in self.restore_rs_seq()? {
            self.push(i);
        }
        let up = self.lea_rsp(RED_ZONE)?;
        self.push(up);
        let l = self.native_label(ip);
        let j = self.jmp(l)?;
        self.push(j);
        let mut n = Instruction::with(Code::Nopd);
        n.set_ip(ok);
        self.push(n);
        Ok(())
    }

    pub(super) fn push(&mut self, i: Instruction) {
        self.out.push(i);
    }

    pub(super) fn push_at(&mut self, mut i: Instruction, label: u64) {
        i.set_ip(label);
        self.out.push(i);
    }

    /// Leaves the region at the original call `i` (the first instruction emitted gets
    /// `label`). A call under an entry jmp cannot be jumped to, its bytes being the jmp now: it
    /// is imitated, pushing the return address the original pushes (the instruction after it,
    /// past the jmp, so the callee returns into original code) and jumping to the callee. No
    /// flags or registers change; the stack below the return address is scratch at a call.
    pub(super) fn exit_at_call(
        &mut self,
        i: &Instruction,
        label: Option<u64>,
    ) -> Result<(), RefusalReason> {
        let mut seq = Vec::new();
        if self.imitate.contains(&i.ip()) {
            let rax = Register::RAX;
            seq.push(self.lea_rsp(-8)?);
            seq.push(Instruction::with1(Code::Push_r64, rax).map_err(enc)?);
            seq.push(Instruction::with2(Code::Mov_r64_imm64, rax, i.next_ip()).map_err(enc)?);
            seq.push(
                Instruction::with2(
                    Code::Mov_rm64_r64,
                    MemoryOperand::with_base_displ(Register::RSP, 8),
                    rax,
                )
                .map_err(enc)?,
            );
            seq.push(Instruction::with1(Code::Pop_r64, rax).map_err(enc)?);
            seq.push(self.jmp(i.near_branch_target())?);
        } else {
            seq.push(self.jmp(i.ip())?);
        }
        for (n, c) in seq.into_iter().enumerate() {
            match label {
                Some(l) if n == 0 => self.push_at(c, l),
                _ => self.push(c),
            }
        }
        Ok(())
    }

    pub(super) fn lea_rsp(&mut self, delta: i64) -> Result<Instruction, RefusalReason> {
        Instruction::with2(
            Code::Lea_r64_m,
            Register::RSP,
            MemoryOperand::with_base_displ(Register::RSP, delta),
        )
        .map_err(enc)
    }

    pub(super) fn call(&mut self, target: u64) -> Instruction {
        Instruction::with_branch(Code::Call_rel32_64, target).unwrap_or_default()
    }

    /// `lea rsp,[rsp-128]; call helper; lea rsp,[rsp+128]`, the first carrying `label`.
    pub(super) fn helper_call(
        &mut self,
        helper: u64,
        label: Option<u64>,
    ) -> Result<(), RefusalReason> {
        let down = self.lea_rsp(-RED_ZONE)?;
        let sync = self.count_sync()?;
        let mut first = true;
        for i in sync.0.into_iter().chain([down]) {
            match (first, label) {
                (true, Some(l)) => self.push_at(i, l),
                _ => self.push(i),
            }
            first = false;
        }
        let c = self.call(helper);
        self.push(c);
        let up = self.lea_rsp(RED_ZONE)?;
        self.push(up);
        for i in sync.1 {
            self.push(i);
        }
        Ok(())
    }

    /// Fixed regions: `mov [rs+count],rc` before a helper call and `mov rc,[rs+count]`
    /// after it (helpers read, and flushes reset, the count in memory). No flags touched.
    pub(super) fn count_sync(&self) -> Result<(Vec<Instruction>, Vec<Instruction>), RefusalReason> {
        match (self.rs, self.count_reg) {
            (Some(rs), Some(rc)) => {
                let m = MemoryOperand::with_base_displ(rs, i64::from(ST_COUNT));
                Ok((
                    vec![Instruction::with2(Code::Mov_rm64_r64, m, rc).map_err(enc)?],
                    vec![Instruction::with2(Code::Mov_r64_rm64, rc, m).map_err(enc)?],
                ))
            }
            _ => Ok((Vec::new(), Vec::new())),
        }
    }

    pub(super) fn jmp(&mut self, target: u64) -> Result<Instruction, RefusalReason> {
        Instruction::with_branch(Code::Jmp_rel32_64, target).map_err(enc)
    }
}

/// Generates the region's code for address `addr`.
/// Identity of a memory operand expression (base, index, scale, displacement, size).
fn operand_key(i: &Instruction) -> (Register, Register, u32, u64, usize) {
    (
        i.memory_base(),
        i.memory_index(),
        i.memory_index_scale(),
        i.memory_displacement64(),
        i.memory_size().size(),
    )
}

/// `count_only` (`PlanOptions::count_only`): memory accesses stay verbatim (no log), the
/// rest (state register, trampolines, back-edge counting, exits) is generated as usual.
#[allow(clippy::too_many_arguments)]
pub fn rewrite(
    cfg: &Cfg,
    tr: &[Treatment],
    region: &Region,
    live: &Liveness,
    rt: &RuntimeInfo,
    addr: u64,
    fast: bool,
    count_only: bool,
    imitate: &[u64],
) -> Result<Rewritten, RefusalReason> {
    // A fixed region needs every store on the fast path (a helper store would append an
    // entry no slot knows about): if one cannot be, rewrite the region the general way.
    let fixed_first = !count_only;
    match rewrite_with(
        cfg,
        tr,
        region,
        live,
        rt,
        addr,
        fast,
        fixed_first,
        count_only,
        imitate,
    )? {
        Some(rw) => Ok(rw),
        None => rewrite_with(
            cfg, tr, region, live, rt, addr, fast, false, count_only, imitate,
        )?
        .ok_or_else(|| RefusalReason::Encoding("region rewrite fell back twice".into())),
    }
}

#[allow(clippy::too_many_arguments)]
fn rewrite_with(
    cfg: &Cfg,
    tr: &[Treatment],
    region: &Region,
    live: &Liveness,
    rt: &RuntimeInfo,
    addr: u64,
    fast: bool,
    fixed_allowed: bool,
    count_only: bool,
    imitate: &[u64],
) -> Result<Option<Rewritten>, RefusalReason> {
    if cfg.start < LABEL_LIMIT {
        return Err(RefusalReason::Encoding(format!(
            "code at {:#x} collides with label space",
            cfg.start
        )));
    }
    let region_insns: Vec<usize> = region
        .blocks
        .iter()
        .flat_map(|&b| cfg.blocks[b].insns.clone())
        .collect();
    let rs = if fast {
        pick_state_register(&live.mentioned, &region_insns)
    } else {
        None
    };
    let reserved = match rs {
        Some(rs) => pick_reserved(&live.mentioned, &region_insns, rs),
        None => Vec::new(),
    };
    // A fixed region keeps the log's entry count in the first reserved register.
    let fixed = match (rs, reserved.first()) {
        (Some(_), Some(_)) if fixed_allowed && !rt.config.merge_any_entry_broken => {
            fixed::analyze(cfg, tr, region)
        }
        _ => None,
    };
    let count_reg = fixed.as_ref().and(reserved.first().copied());
    let mut e = Emitter {
        reserved,
        fixed,
        count_reg,
        count_only,
        cold: Vec::new(),
        rs,
        live: Some(live),
        piece: None,
        imitate: imitate.to_vec(),
        out: Vec::new(),
        first: Vec::new(),
        labels: HashMap::new(),
        native: HashMap::new(),
        next_label: 0,
        rt,
        info: InstructionInfoFactory::new(),
    };
    let store_operands: HashSet<_> = region_insns
        .iter()
        .filter(|&&k| matches!(tr[k], Treatment::Ssb { write: true, .. }))
        .map(|&k| operand_key(&cfg.insns[k]))
        .collect();
    // Stubs are emitted after the blocks: (label, kind, target original address).
    let mut stubs: Vec<(u64, bool, u64)> = Vec::new();
    let in_region = |ip: u64| -> Option<usize> {
        region
            .blocks
            .iter()
            .copied()
            .find(|&b| cfg.blocks[b].start == ip)
    };
    for (pos, &b) in region.blocks.iter().enumerate() {
        let blk = &cfg.blocks[b];
        let mut falls_through = true;
        for k in blk.insns.clone() {
            let i = cfg.insns[k];
            let label = e.orig_label(i.ip());
            e.first.push((i.ip(), e.out.len()));
            falls_through = true;
            match tr[k] {
                Treatment::Verbatim => e.push_at(i, label),
                Treatment::Ssb { .. } if count_only => e.push_at(i, label),
                // A frame access of a fixed region: the thread's own local (`frame.rs`).
                Treatment::Ssb { .. } if e.bypasses(k) => e.push_at(i, label),
                Treatment::Ssb {
                    size,
                    read,
                    write,
                    vector: true,
                    ..
                } => {
                    if !e.emit_wide(k, &i, size, read, write, label)? {
                        // A fixed region's store piece could not take the fast path.
                        return Ok(None);
                    }
                }
                Treatment::Ssb {
                    op,
                    size,
                    read,
                    write,
                    vector: false,
                } => {
                    let forward_first = read && store_operands.contains(&operand_key(&i));
                    if !e.emit_ssb_fast(k, &i, op, size, read, write, label, forward_first)? {
                        if e.fixed.is_some() {
                            return Ok(None);
                        }
                        e.emit_ssb(&i, op, size, read, write, label)?
                    }
                }
                Treatment::FlushBefore => {
                    e.helper_call(rt.flush, Some(label))?;
                    if i.flow_control() == FlowControl::Return {
                        e.restore_rs()?;
                    }
                    let mut c = i;
                    c.set_ip(0);
                    e.push(c);
                    falls_through = i.flow_control() != FlowControl::Return;
                }
                Treatment::ExitToOriginal => {
                    e.helper_call(rt.flush, Some(label))?;
                    e.restore_rs()?;
                    e.exit_at_call(&i, None)?;
                    falls_through = false;
                }
                Treatment::DirectBranch => {
                    let t = i.near_branch_target();
                    let new_target = match in_region(t) {
                        Some(tb) if cfg.blocks[tb].start <= blk.start => {
                            let l = e.label();
                            stubs.push((l, true, t));
                            l
                        }
                        Some(_) => e.orig_label(t),
                        None => {
                            let l = e.label();
                            stubs.push((l, false, t));
                            l
                        }
                    };
                    let mut c = i;
                    c.set_near_branch64(new_target);
                    e.push_at(c, label);
                    falls_through = i.flow_control() == FlowControl::ConditionalBranch;
                }
                Treatment::IndirectJump | Treatment::Unsupported(_) => {
                    return Err(RefusalReason::UnsupportedInstruction {
                        pc: i.ip(),
                        text: i.to_string(),
                        why: "not rewritable",
                    })
                }
            }
        }
        if falls_through {
            let next = blk.end;
            let next_is_emitted_next = region
                .blocks
                .get(pos + 1)
                .is_some_and(|&nb| cfg.blocks[nb].start == next);
            if !next_is_emitted_next {
                if in_region(next).is_some() {
                    let l = e.orig_label(next);
                    let j = e.jmp(l)?;
                    e.push(j);
                } else {
                    e.helper_call(rt.flush, None)?;
                    e.restore_rs()?;
                    let j = e.jmp(next)?;
                    e.push(j);
                }
            }
        }
    }
    for (label, backedge, target) in stubs {
        if backedge {
            let l = e.orig_label(target);
            let tk = cfg.insns.iter().position(|i| i.ip() == target).unwrap_or(0);
            let flags_live = live.live_in[tk] & FLAGS != 0;
            let rax_live = live.live_in[tk] & 1 != 0;
            if !e.emit_backedge_fast(label, l, target, flags_live, rax_live)? {
                e.helper_call(rt.backedge, Some(label))?;
                let j = e.jmp(l)?;
                e.push(j);
            }
        } else {
            e.helper_call(rt.flush, Some(label))?;
            e.restore_rs()?;
            let j = e.jmp(target)?;
            e.push(j);
        }
    }
    // Trampolines: every way into the region from outside goes through one. With a state,
    // `ssb_enter` saves the state register's value and loads the state pointer; without one it
    // returns to the native continuation, into an uninstrumented copy of the region.
    let mut entry_idx: Vec<usize> = e.first.iter().map(|&(_, idx)| idx).collect();
    let mut native_idx: Vec<usize> = Vec::new();
    if let Some(rs) = e.rs {
        let firsts = e.first.clone();
        for (n, &(ip, _)) in firsts.iter().enumerate() {
            entry_idx[n] = e.out.len();
            let native_cont = e.label();
            let down = e.lea_rsp(-RED_ZONE)?;
            e.push(down);
            e.push(Instruction::with1(Code::Push_r64, rs).map_err(enc)?);
            e.push(
                Instruction::with2(
                    Code::Lea_r64_m,
                    rs,
                    MemoryOperand::with_base_displ(Register::RIP, native_cont as i64),
                )
                .map_err(enc)?,
            );
            e.push(Instruction::with1(Code::Push_r64, rs).map_err(enc)?);
            let c = e.call(rt.enter);
            e.push(c);
            for native in [false, true] {
                let drop = e.lea_rsp(8)?;
                if native {
                    e.push_at(drop, native_cont);
                } else {
                    e.push(drop);
                }
                e.push(Instruction::with1(Code::Pop_r64, rs).map_err(enc)?);
                if !native {
                    e.save_reserved(rs)?;
                    if let Some(tc) = e.trial_reg() {
                        let period = rt.config.backedges_per_flush as i32;
                        e.push(Instruction::with2(Code::Mov_rm64_imm32, tc, period).map_err(enc)?);
                    }
                    // The log is empty on entry: the count register starts from memory (0).
                    let load = e.count_sync()?.1;
                    for i in load {
                        e.push(i);
                    }
                    e.frame_check(rs, ip)?;
                }
                let up = e.lea_rsp(RED_ZONE)?;
                e.push(up);
                let l = if native {
                    e.native_label(ip)
                } else {
                    e.orig_label(ip)
                };
                let j = e.jmp(l)?;
                e.push(j);
            }
        }
        native_idx = emit_native_copy(&mut e, cfg, tr, region)?;
    }
    // Undo stubs: a thread stopped at the start of an instruction's sequence leaves through
    // here (flush its log, continue at the original instruction).
    let mut undo_idx = Vec::with_capacity(e.first.len());
    for &(ip, _) in &e.first.clone() {
        undo_idx.push(e.out.len());
        e.helper_call(rt.flush, None)?;
        e.restore_rs()?;
        let j = e.jmp(ip)?;
        e.push(j);
    }
    let cold = std::mem::take(&mut e.cold);
    e.out.extend(cold);
    if e.next_label >= LABEL_LIMIT {
        return Err(RefusalReason::Encoding(format!(
            "{} labels exceed the label space",
            e.next_label
        )));
    }
    let remap = drop_label_nops(&mut e.out);
    let entry_idx: Vec<usize> = entry_idx.iter().map(|&i| remap[i]).collect();
    let native_idx: Vec<usize> = native_idx.iter().map(|&i| remap[i]).collect();
    let undo_idx: Vec<usize> = undo_idx.iter().map(|&i| remap[i]).collect();
    for f in &mut e.first {
        f.1 = remap[f.1];
    }
    let res = BlockEncoder::encode(
        64,
        InstructionBlock::new(&e.out, addr),
        BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS,
    )
    .map_err(enc)?;
    let pc_map = e
        .first
        .iter()
        .zip(&entry_idx)
        .map(|(&(ip, _), &idx)| (ip, addr + u64::from(res.new_instruction_offsets[idx])))
        .collect();
    let at = |idx: usize| addr + u64::from(res.new_instruction_offsets[idx]);
    let mut undo_map: Vec<(u64, u64)> = Vec::new();
    for (n, &(ip, first)) in e.first.iter().enumerate() {
        undo_map.push((at(first), at(undo_idx[n])));
        if e.rs.is_some() {
            // A thread at a trampoline or in the native copy has not touched the SSB (and
            // its state register holds its own value): straight back.
            undo_map.push((at(entry_idx[n]), ip));
            undo_map.push((at(native_idx[n]), ip));
        }
    }
    let fixed_locations = e.fixed.as_ref().map_or(0, |f| {
        f.by_insn
            .values()
            .filter_map(|a| a.slot)
            .max()
            .map_or(0, |m| m as usize + 1)
    });
    Ok(Some(Rewritten {
        fixed_locations,
        code: res.code_buffer,
        pc_map,
        state_register: rs,
        undo_map,
    }))
}
