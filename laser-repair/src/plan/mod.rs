//! `plan`: the pure half of the repair. Code bytes and addresses in; the bytes of a code cache
//! (SSB runtime + rewritten region), a patch list and a pc map out. No process needed: the
//! only input seam is [`CodeSource`].
//!
//! Pipeline: [`cfg`](mod@cfg) (decode the function, blocks, back-edges, natural loops) →
//! [`classify`] (what to do with each instruction) → [`region`] (innermost loop around each
//! contending PC; refusals; stores-per-flush estimate) → [`liveness`] (GPRs and each status
//! flag) → [`rewrite`] + [`fastpath`] (code generation) and [`ssb_runtime`] (helpers).
//!
//! What the rewriter handles:
//! - every instruction with one explicit memory operand of 1, 2, 4 or 8 bytes that has a
//!   general-register form (mov, movzx/movsx/movsxd, ALU ops and RMW, cmp/test, imul, shifts,
//!   setcc, cmov, inc/dec/neg/not, cvtsi2sd-style GPR sources, …), any addressing mode
//!   including rip-relative and rsp-based;
//! - SSE/AVX memory operands of 1 to 32 bytes (legacy SSE and VEX: `movdqu/movaps/movups`,
//!   `vmovdqu ymm`, `movsd/movss/movq/movhps`, ALU ops with a memory source such as
//!   `paddd`/`addps`/`ptest`, `pextrb`/`pinsrw`, …; [`wide`](mod@wide)): the instruction
//!   runs on a 32-byte scratch area in the thread state, its bytes moved between there and
//!   the SSB in 8-byte pieces, each the inline (or fixed-region) sequence of an 8-byte
//!   `mov` (loads forward per piece; stores append their pieces in address order). Inline
//!   path only (the state register addresses the scratch area). Two
//!   semantic differences: `movaps`/`movdqa` on an address that is not 16-aligned no longer
//!   fault, and an aligned 16-byte access (single-copy atomic on AVX CPUs) can be seen
//!   split into its 8-byte pieces by another thread during a flush;
//! - flush-then-execute for locked and implicitly locked instructions (xchg, and xadd/cmpxchg
//!   with memory), fences, `pause`, syscalls, cpuid/rdtsc, clflush, non-temporal stores,
//!   push/pop/leave and string instructions (implicit accesses), `%fs`/`%gs` accesses, `ret`;
//! - calls leave the region (flush, continue at the original call), so return addresses on
//!   stacks always point into original code.
//!
//! Refused ([`RefusalReason`]): x87, MMX, EVEX (AVX-512) memory operands, gathers and masked
//! vector moves, SSE/AVX operands when no register is free for the state, bit-string `bt*` with a register offset, conditional memory writes, instructions using rsp
//! as data, 32-bit address size, indirect jumps and transactional instructions in the
//! region, entry blocks shorter than the 5-byte jmp, indirect calls under the entry jmp (a direct
//! one there is imitated: push its return address, jump to the callee), a code cache
//! out of rel32 reach, and regions estimated to store too little per flush.
//!
//! Two code paths. When a register is mentioned by no instruction of the region (r11 first),
//! it holds the thread's SSB state ([`RepairPlan::state_register`]): entry trampolines save
//! its value and load the state, every exit restores it, and accesses run inline: a summary
//! bitmap and a byte-lane index answer "is this load in the log?" without scanning, the tail
//! merge and the append are inline, and only rare cases (full log, two-word entries, partial
//! overlaps) call the helpers. A thread that gets no state slot runs an uninstrumented copy
//! of the region. Otherwise every access calls a helper that finds the state via `%fs:0`.
//! Scratch registers come from liveness; live ones are spilled on the stack below the red
//! zone (`lea rsp,[rsp-128]` first: the stack is thread-private and the red zone untouched);
//! flags are saved with `seto/lahf … add/sahf` only where liveness says they are live.
//!
//! Fixed-address regions ([`fixed`]): when every store of the region goes through base and
//! index registers the region never writes, or through a register reloaded in the same block
//! from a frame slot no region instruction stores to (-O0 code, [`frame`]: the frame's own
//! `[rbp-d]` accesses then run verbatim and each entry checks that no store group can reach
//! the frame), each store location (each 8-byte piece of an SSE/AVX store) gets a slot naming its
//! youngest entry and a shadow of its value, the entry count lives in a reserved register,
//! and the summary/byte lanes are not used: a load of a store location is
//! `cmp [slot],8; jb memory; mov v,[shadow]`, any other load range-tests the store groups
//! and runs the original instruction, a store is 7 flag-free instructions, and back-edges
//! keep room in the log for a path's stores (no full-log test per store).
//!
//! Cost (`plan_lreg` bench, in-process, CPU time per thread on this loaded 2-vCPU VM): the
//! linear-regression loop (5 load+add+store on one struct, 2 byte loads per iteration) runs
//! ~10 ns per iteration repaired (general path before fixed regions: ~40-180 ns), against
//! ~2 ns padded and ~21 ns for the contended original on a quiet machine. A tight loop with
//! no contention (2 stores per iteration) runs several times slower repaired: the repair
//! only pays where lines really bounce.
//!
//! Trial support (measure, then keep or undo; `laser repair` runs it by default): every
//! loop back-edge taken in the rewritten region adds 1 to the thread's iteration counter
//! ([`ssb_layout::iters_offset`]; one memory add per iteration on the inline, fixed and
//! helper paths; the countdown to the next forced flush cannot serve, it only ticks while
//! the log is non-empty). laser sums it over the state slots from outside, once for a
//! [`PlanOptions::count_only`] plan of the same region (accesses verbatim: the native rate
//! with the same counter) and once for the repair. The count-only plan counts down in a
//! spare reserved register (accesses are verbatim, so reserved registers are free) and adds
//! whole periods to the memory counter, the rest at exits; at each period's end it polls the
//! kill switch. Its cost over the untouched loop is the back-edge stub's extra taken branch
//! and a register `dec` (`plan_trial` bench, one thread: 2.0x on a 1-cycle loop, none
//! measurable on a 3-cycle one); without a spare register it falls back to the memory
//! counter and countdown (one or two read-modify-writes per iteration: 2.3x on the 1-cycle
//! loop). The comparison is repair vs count-only, a little below the untouched loop.
//!
//! A repair that loses sets the kill switch ([`ssb_layout::KILL_OFF`]; laser sets it on the
//! count-only plan too before undoing it): `ssb_enter` then sends every entering thread to the
//! uninstrumented copy, and the every-N back-edge flush (inline and fixed paths) leaves for
//! the copy's loop header, so the slow code stops within `backedges_per_flush` iterations
//! with no pause; the undo that follows finds threads at the copy's dense safe points. On
//! the helper path (no state register, no copy) the switch does nothing: undo alone ends it.
//!
//! Known limits: a signal handler running on a thread stopped inside the region does not see
//! that thread's buffered stores (and must not itself enter the region); a store to an
//! invalid address faults at the flush, not at the store; code outside the function jumping
//! into the bytes under an entry jmp (other than its first byte) is not detected; thread state
//! keys on `%fs:0` (glibc/musl TCB self-pointer), and threads with `%fs:0 == 0` or beyond the
//! slot pool run natively (correct, unbuffered); liveness assumes the SysV ABI at calls and
//! returns only for choosing scratch registers and flag saves (the state register is saved
//! and restored regardless).

pub mod cfg;
pub mod classify;
pub mod fastpath;
pub mod fixed;
mod fixed_emit;
pub mod frame;
pub mod helper_path;
pub mod insn;
mod label_nops;
pub mod lanes;
pub mod liveness;
pub mod native_copy;
pub mod refusal;
pub mod region;
pub mod rewrite;
pub mod source;
pub mod ssb_layout;
pub mod ssb_runtime;
pub mod ssb_thread;
pub mod wide;

pub use refusal::{Refusal, RefusalReason};
pub use region::Region;
pub use source::{CodeBytes, CodeSource};
pub use ssb_runtime::{RuntimeConfig, RuntimeInfo, SsbMode};

/// What to repair and where the code cache will live.
#[derive(Clone, Copy)]
pub struct PlanRequest<'a> {
    pub code: &'a dyn CodeSource,
    /// `[start, end)` of the enclosing function from ELF symbols, if known; otherwise the
    /// planner scans (see [`cfg::guess_function_bounds`]).
    pub function: Option<(u64, u64)>,
    pub contending_pcs: &'a [u64],
    /// Page-aligned address of the mapping the tracee will create, within ±2 GiB of the code.
    /// Layout: `[cache_addr, +data_len)` RW zero-filled data, then the code (RX).
    pub cache_addr: u64,
    pub options: PlanOptions,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanOptions {
    pub runtime: RuntimeConfig,
    /// Refuse regions whose estimated stores per flush are below this (flushes cost a
    /// helper call and a line transfer each; one store per flush is slower than native).
    pub min_stores_per_flush: f64,
    /// Bytes to scan either side of a PC when no function bounds are given.
    pub scan_limit: u64,
    /// Use the inline fast path when a register is free for the state pointer (else every
    /// access calls a helper). Off only to test the helper path on its own.
    pub inline_fast_path: bool,
    /// Refuse regions that are not fixed-address ones (`fixed.rs`): where store addresses
    /// change inside the loop every access pays a log lookup, and histogram's repaired loop
    /// measured 3x slower than the contended original (benchmarks/RESULTS.md, section (c)).
    /// Off by default so the general path stays reachable for tests and forced repairs;
    /// `laser repair` turns it on with its profitability floor.
    pub refuse_general_path: bool,
    /// Plan the same region but emit every buffered access verbatim (no log): the trial's
    /// baseline, the loop at native speed with the same trampolines, state register and
    /// back-edge counter as the repair (see "Trial" above). Implies no fixed-address path.
    pub count_only: bool,
}

/// Code bytes reserved after the runtime's data in a cache mapping (helpers take ~10 KiB; the
/// rest is for the rewritten region, which grows ~20x over the original instructions).
pub const CODE_RESERVATION: u64 = 256 * 1024;

impl PlanOptions {
    /// Bytes the tracee should map at `cache_addr` before planning: the runtime's data plus
    /// [`CODE_RESERVATION`]. [`plan`] refuses a region whose code would not fit.
    pub fn cache_reservation(&self) -> u64 {
        ssb_layout::data_len(&self.runtime) + CODE_RESERVATION
    }
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            runtime: RuntimeConfig::default(),
            min_stores_per_flush: 4.0,
            scan_limit: 16 * 1024,
            inline_fast_path: true,
            refuse_general_path: false,
            count_only: false,
        }
    }
}

/// Bytes to write into the target, and what they replace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Patch {
    pub addr: u64,
    pub old_bytes: Vec<u8>,
    pub new_bytes: Vec<u8>,
}

/// The code cache image: `data_len` zero bytes (RW) followed by `code` (RX) at `code_addr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeCache {
    pub addr: u64,
    pub data_len: u64,
    pub code_addr: u64,
    pub code: Vec<u8>,
}

impl CodeCache {
    /// Total bytes to map at `addr`, rounded to pages.
    pub fn map_len(&self) -> u64 {
        (self.data_len + self.code.len() as u64).div_ceil(4096) * 4096
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct RepairPlan {
    pub function: (u64, u64),
    pub region: Region,
    pub cache: CodeCache,
    /// Entry jumps; apply after the cache is mapped and written, undo by writing `old_bytes`.
    pub patches: Vec<Patch>,
    /// `(old_pc, new_pc)` for every instruction of the region: a thread stopped at `old_pc`
    /// continues correctly at `new_pc` (its log is empty: it has not used the SSB yet).
    pub pc_map: Vec<(u64, u64)>,
    pub runtime: RuntimeInfo,
    /// Undo safe points: `(pc in the code cache, pc to continue at)`. A thread stopped at such
    /// a pc (the start of an instruction's rewritten sequence, or an entry trampoline) can be
    /// moved to the second pc: for a sequence start that is a stub in the cache that flushes
    /// the thread's log and jumps to the original instruction; for a trampoline it is the
    /// original instruction itself. A thread stopped elsewhere in the cache (inside a
    /// sequence, a stub or a helper) must first be single-stepped to one of these pcs.
    pub undo_map: Vec<(u64, u64)>,
    /// Register that holds the thread's SSB state inside the region (inline fast path), or
    /// `None` when every access calls a helper.
    pub state_register: Option<iced_x86::Register>,
    /// Store locations of a fixed-address region (`fixed.rs`: loop-invariant store
    /// addresses, served by per-location slots), or 0 when the region is not one.
    pub fixed_locations: usize,
}

impl RepairPlan {
    /// Where a thread stopped at `pc` must continue, if `pc` is inside the region.
    pub fn map_pc(&self, pc: u64) -> Option<u64> {
        self.pc_map.iter().find(|&&(o, _)| o == pc).map(|&(_, n)| n)
    }
}

const JMP_LEN: u64 = 5;

/// Plans the repair of the code around `req.contending_pcs`.
pub fn plan(req: &PlanRequest<'_>) -> Result<RepairPlan, Refusal> {
    let first_pc = *req
        .contending_pcs
        .first()
        .ok_or(RefusalReason::NoContendingPcs)?;
    let (start, end) = match req.function {
        Some(b) => b,
        None => cfg::guess_function_bounds(req.code, first_pc, req.options.scan_limit)?,
    };
    // rel32 reach from both ends of the function to both ends of a (generous) cache.
    const REACH: u64 = (1 << 31) - (64 << 20);
    if req.cache_addr.abs_diff(start) > REACH || req.cache_addr.abs_diff(end) > REACH {
        return Err(RefusalReason::CacheOutOfReach {
            pc: start,
            cache: req.cache_addr,
        }
        .into());
    }
    let g = cfg::Cfg::build(req.code, start, end)?;
    let tr = region::treatments(&g);
    let rt_cfg = req.options.runtime;
    let region = region::select(
        &g,
        &tr,
        req.contending_pcs,
        rt_cfg.backedges_per_flush,
        req.options.min_stores_per_flush,
    )?;
    for &b in &region.entries {
        let blk = &g.blocks[b];
        if blk.end - blk.start < JMP_LEN {
            return Err(RefusalReason::EntryTooShort {
                pc: blk.start,
                len: blk.end - blk.start,
            }
            .into());
        }
    }
    let (rt_code, rt) = ssb_runtime::generate(req.cache_addr, &rt_cfg)?;
    let region_addr = (rt.code_addr + rt.code_len).div_ceil(16) * 16;
    let live = liveness::analyze(&g, &tr);
    // Calls under an entry jmp: direct ones are imitated in the cache (`exit_at_call`); an
    // indirect one would need its operand re-evaluated with a pushed return address: refused.
    let mut imitate = Vec::new();
    for &b in &region.entries {
        let blk = &g.blocks[b];
        let end = cover_end(&g, blk);
        for k in blk.insns.clone() {
            let i = &g.insns[k];
            if i.ip() < end && tr[k] == classify::Treatment::ExitToOriginal {
                if i.flow_control() != iced_x86::FlowControl::Call {
                    return Err(RefusalReason::CallUnderPatch {
                        pc: i.ip(),
                        entry: blk.start,
                    }
                    .into());
                }
                imitate.push(i.ip());
            }
        }
    }
    let rw = rewrite::rewrite(
        &g,
        &tr,
        &region,
        &live,
        &rt,
        region_addr,
        req.options.inline_fast_path,
        req.options.count_only,
        &imitate,
    )?;
    if req.options.refuse_general_path && rw.fixed_locations == 0 && !req.options.count_only {
        return Err(RefusalReason::GeneralPath.into());
    }
    let mut code = rt_code;
    code.resize((region_addr - rt.code_addr) as usize, 0xcc);
    code.extend_from_slice(&rw.code);
    let need = rt.data_len + code.len() as u64;
    let have = req.options.cache_reservation();
    if need > have {
        return Err(RefusalReason::CacheTooSmall { need, have }.into());
    }
    let mut patches = Vec::new();
    for &b in &region.entries {
        let blk = &g.blocks[b];
        let target = rw
            .pc_map
            .iter()
            .find(|&&(o, _)| o == blk.start)
            .map(|&(_, n)| n)
            .unwrap_or(region_addr);
        let rel = target as i64 - (blk.start + JMP_LEN) as i64;
        let rel = i32::try_from(rel).map_err(|_| RefusalReason::CacheOutOfReach {
            pc: blk.start,
            cache: req.cache_addr,
        })?;
        let cover_end = cover_end(&g, blk);
        let old_bytes = source::read_range(req.code, blk.start, cover_end).ok_or(
            RefusalReason::CodeUnreadable {
                addr: blk.start,
                end: cover_end,
            },
        )?;
        let mut new_bytes = vec![0xe9];
        new_bytes.extend_from_slice(&rel.to_le_bytes());
        new_bytes.resize(old_bytes.len(), 0xcc);
        patches.push(Patch {
            addr: blk.start,
            old_bytes,
            new_bytes,
        });
    }
    Ok(RepairPlan {
        function: (start, end),
        region,
        cache: CodeCache {
            addr: req.cache_addr,
            data_len: rt.data_len,
            code_addr: rt.code_addr,
            code,
        },
        patches,
        pc_map: rw.pc_map,
        runtime: rt,
        state_register: rw.state_register,
        undo_map: rw.undo_map,
        fixed_locations: rw.fixed_locations,
    })
}

/// End of the bytes an entry patch covers: the 5-byte jmp, then up to the next instruction
/// boundary (those bytes become int3), so no instruction is cut in two.
fn cover_end(g: &cfg::Cfg, blk: &cfg::Block) -> u64 {
    g.insns[blk.insns.clone()]
        .iter()
        .map(|i| i.next_ip())
        .find(|&e| e >= blk.start + JMP_LEN)
        .unwrap_or(blk.end)
}
