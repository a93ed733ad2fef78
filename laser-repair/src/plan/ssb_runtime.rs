//! The SSB runtime: position-dependent-free machine code generated with iced-x86 `code_asm`,
//! living in the code cache next to the rewritten region.
//!
//! ```text
//!  cache base ─┬─ data (RW, zero-filled by mmap) ───────────────────────────────────────┐
//!              │ +0  mode word: 0 not yet probed, 1 FIFO, 2 RTM (CPUID at run time)
//!              │ +8  bypasses by threads that got no slot (helper stores, native-copy entries)
//!              │ +64 keys[slots]: thread pointer (%fs:0) owning each slot, 0 = free
//!              │ states[slots]: count | back-edges | flushes | stores | saved state register
//!              │                | sentinel size | limit | summary
//!              │                | log[capacity] of { addr, size, value, _ } (32 bytes)
//!              │                | byte-lane index[64] of { lanes, word, period, contested }
//!  code ───────┴─ helpers (RX): ssb_load{1,2,4,8} ssb_store{1,2,4,8} ssb_flush
//!                 ssb_backedge ssb_enter, then the rewritten region (hot code, exit and
//!                 back-edge stubs, entry trampolines, the uninstrumented copy, undo stubs,
//!                 cold code)
//! ```
//!
//! Per-thread state: a thread finds its slot by hashing its thread pointer (`%fs:0`, the TCB
//! self-pointer of glibc and musl) and probing `keys`; a thread seen for the first time claims
//! a free key with `lock cmpxchg`, so threads created after the repair work. Slots are never
//! released: a thread only leaves the region through a flush, so a dead thread's log is empty
//! and a later thread whose TCB reuses the address inherits an empty log. A thread that finds
//! no slot (pool full, or `%fs:0` == 0) accesses memory directly: with no log, direct accesses
//! are exactly native TSO behaviour, so correctness never depends on getting a slot.
//!
//! Helper ABI (all helpers preserve every register and the flags they don't return):
//! the caller has moved rsp below the red zone, then pushed `addr` and `value` slots:
//! `[rsp+8]` = value (in for stores, out for loads), `[rsp+16]` = address.

pub use super::ssb_layout::*;

use super::refusal::RefusalReason;
use iced_x86::code_asm::*;
use iced_x86::{BlockEncoderOptions, Code, Instruction, MemoryOperand, Register};

/// Generates the runtime for a cache mapping at `cache_addr`; returns its code (to be placed at
/// `info.code_addr`) and the addresses.
pub fn generate(
    cache_addr: u64,
    cfg: &RuntimeConfig,
) -> Result<(Vec<u8>, RuntimeInfo), RefusalReason> {
    if !cfg.thread_slots.is_power_of_two()
        || !(1..=MAX_LOG_CAPACITY).contains(&cfg.log_capacity)
        || cfg.backedges_per_flush == 0
    {
        return Err(RefusalReason::Encoding(format!(
            "bad runtime config: {} slots (power of two needed), log {} entries (1..={}), {} back-edges per flush",
            cfg.thread_slots, cfg.log_capacity, MAX_LOG_CAPACITY, cfg.backedges_per_flush
        )));
    }
    let dlen = data_len(cfg);
    let states_addr = cache_addr + states_offset(cfg);
    let mut g = Gen {
        a: CodeAssembler::new(64).map_err(enc)?,
        cfg: *cfg,
        mode_addr: cache_addr + MODE_OFF,
        no_slot_addr: cache_addr + NO_SLOT_OFF,
        keys_addr: cache_addr + KEYS_OFF,
        flush_lock_addr: cache_addr + flush_lock_offset(cfg),
        states_addr,
        state_size: state_size(cfg),
    };
    let code_addr = cache_addr + dlen;
    let labels = g.emit().map_err(enc)?;
    let res =
        g.a.assemble_options(
            code_addr,
            BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS,
        )
        .map_err(enc)?;
    let ip = |l: &CodeLabel| res.label_ip(l).map_err(enc);
    let info = RuntimeInfo {
        config: *cfg,
        data_addr: cache_addr,
        data_len: dlen,
        code_addr,
        code_len: res.inner.code_buffer.len() as u64,
        load: [
            ip(&labels.load[0])?,
            ip(&labels.load[1])?,
            ip(&labels.load[2])?,
            ip(&labels.load[3])?,
        ],
        store: [
            ip(&labels.store[0])?,
            ip(&labels.store[1])?,
            ip(&labels.store[2])?,
            ip(&labels.store[3])?,
        ],
        flush: ip(&labels.flush)?,
        backedge: ip(&labels.backedge)?,
        enter: ip(&labels.enter)?,
        mode_addr: g.mode_addr,
        no_slot_addr: g.no_slot_addr,
        keys_addr: g.keys_addr,
        states_addr,
        state_size: g.state_size,
    };
    Ok((res.inner.code_buffer, info))
}

fn enc(e: iced_x86::IcedError) -> RefusalReason {
    RefusalReason::Encoding(e.to_string())
}

struct Labels {
    load: [CodeLabel; 4],
    store: [CodeLabel; 4],
    flush: CodeLabel,
    backedge: CodeLabel,
    enter: CodeLabel,
}

pub(super) struct Gen {
    pub(super) a: CodeAssembler,
    pub(super) cfg: RuntimeConfig,
    pub(super) mode_addr: u64,
    pub(super) no_slot_addr: u64,
    pub(super) keys_addr: u64,
    pub(super) states_addr: u64,
    pub(super) flush_lock_addr: u64,
    pub(super) state_size: u64,
}

pub(super) type R = Result<(), iced_x86::IcedError>;

/// Pauses a flushing thread waits for another thread's replay before replaying anyway.
const FLUSH_LOCK_SPINS: i32 = 2048;

/// Offsets of the caller's slots once a helper has pushed its 6 registers and the flags.
pub(super) const VALUE_SLOT: i32 = 64;
pub(super) const ADDR_SLOT: i32 = 72;

impl Gen {
    /// `lea reg, [rip + (addr - next_ip)]`: the block encoder turns the absolute displacement
    /// into a rip-relative one, keeping the runtime position independent of its data.
    pub(super) fn lea_abs(&mut self, reg: Register, addr: u64) -> R {
        let i = Instruction::with2(
            Code::Lea_r64_m,
            reg,
            MemoryOperand::with_base_displ(Register::RIP, addr as i64),
        )?;
        self.a.add_instruction(i)
    }

    fn emit(&mut self) -> Result<Labels, iced_x86::IcedError> {
        let mut get_state = self.a.create_label();
        let mut flush_state = self.a.create_label();
        let mut replay = self.a.create_label();
        let mut detect = self.a.create_label();
        let mut labels = Labels {
            load: [
                self.a.create_label(),
                self.a.create_label(),
                self.a.create_label(),
                self.a.create_label(),
            ],
            store: [
                self.a.create_label(),
                self.a.create_label(),
                self.a.create_label(),
                self.a.create_label(),
            ],
            flush: self.a.create_label(),
            backedge: self.a.create_label(),
            enter: self.a.create_label(),
        };
        for (k, size) in [1u32, 2, 4, 8].into_iter().enumerate() {
            self.a.set_label(&mut labels.load[k])?;
            self.load_helper(size, get_state, flush_state)?;
            self.a.set_label(&mut labels.store[k])?;
            self.store_helper(size, get_state, flush_state)?;
        }
        self.a.set_label(&mut labels.flush)?;
        self.flush_helper(get_state, flush_state)?;
        self.a.set_label(&mut labels.backedge)?;
        self.backedge_helper(get_state, flush_state)?;
        self.a.set_label(&mut labels.enter)?;
        self.enter_helper(get_state)?;
        self.a.set_label(&mut get_state)?;
        self.get_state(detect)?;
        self.a.set_label(&mut flush_state)?;
        self.flush_state(replay)?;
        self.a.set_label(&mut replay)?;
        self.replay()?;
        self.a.set_label(&mut detect)?;
        self.detect_mode()?;
        Ok(labels)
    }

    /// Saves the registers helpers use and the flags (`seto al; lahf`: ~1 ns, vs ~8 ns for
    /// pushfq/popfq here).
    pub(super) fn prologue(&mut self) -> R {
        let a = &mut self.a;
        a.push(rax)?;
        a.push(rcx)?;
        a.push(rdx)?;
        a.push(r8)?;
        a.push(r9)?;
        a.push(r10)?;
        a.seto(al)?;
        a.lahf()?;
        a.push(rax)
    }

    pub(super) fn epilogue(&mut self) -> R {
        let a = &mut self.a;
        a.pop(rax)?;
        // al = 1 if OF was set: 1 + 0x7f overflows and sets OF again; sahf restores the rest.
        a.add(al, 0x7f)?;
        a.sahf()?;
        a.pop(r10)?;
        a.pop(r9)?;
        a.pop(r8)?;
        a.pop(rdx)?;
        a.pop(rcx)?;
        a.pop(rax)?;
        a.ret()
    }

    /// r9 = zero-extended `size` bytes at [r8].
    fn load_direct(&mut self, size: u32) -> R {
        let a = &mut self.a;
        match size {
            1 => a.movzx(r9d, byte_ptr(r8)),
            2 => a.movzx(r9d, word_ptr(r8)),
            4 => a.mov(r9d, dword_ptr(r8)),
            _ => a.mov(r9, qword_ptr(r8)),
        }
    }

    fn store_direct(&mut self, size: u32) -> R {
        let a = &mut self.a;
        match size {
            1 => a.mov(byte_ptr(r8), r9b),
            2 => a.mov(word_ptr(r8), r9w),
            4 => a.mov(dword_ptr(r8), r9d),
            _ => a.mov(qword_ptr(r8), r9),
        }
    }

    /// Load: the youngest log entry overlapping `[A, A+size)` answers if it is the same
    /// address and size; any other overlap flushes and reads memory; no overlap reads memory.
    fn load_helper(&mut self, size: u32, get_state: CodeLabel, flush_state: CodeLabel) -> R {
        let mut scan = self.a.create_label();
        let mut not_same = self.a.create_label();
        let mut partial = self.a.create_label();
        let mut direct = self.a.create_label();
        let mut done = self.a.create_label();
        self.prologue()?;
        let a = &mut self.a;
        a.call(get_state)?;
        a.mov(r8, qword_ptr(rsp + ADDR_SLOT))?;
        a.test(rcx, rcx)?;
        a.jz(direct)?;
        a.mov(rdx, qword_ptr(rcx + ST_COUNT))?;
        a.mov(rax, rdx)?;
        a.shl(rax, 5)?;
        a.lea(rax, qword_ptr(rcx + rax + ST_ENTRIES))?;
        a.set_label(&mut scan)?;
        a.test(rdx, rdx)?;
        a.jz(direct)?;
        a.sub(rax, ENTRY_SIZE as i32)?;
        a.dec(rdx)?;
        a.mov(r9, qword_ptr(rax))?;
        a.cmp(r9, r8)?;
        a.jne(not_same)?;
        a.cmp(qword_ptr(rax + 8), size as i32)?;
        a.jne(partial)?;
        a.mov(r9, qword_ptr(rax + 16))?;
        a.mov(qword_ptr(rsp + VALUE_SLOT), r9)?;
        a.jmp(done)?;
        a.set_label(&mut not_same)?;
        a.lea(r10, qword_ptr(r8 + size as i32))?;
        a.cmp(r9, r10)?;
        a.jae(scan)?;
        a.add(r9, qword_ptr(rax + 8))?;
        a.cmp(r8, r9)?;
        a.jae(scan)?;
        a.set_label(&mut partial)?;
        a.call(flush_state)?;
        a.set_label(&mut direct)?;
        self.load_direct(size)?;
        let a = &mut self.a;
        a.mov(qword_ptr(rsp + VALUE_SLOT), r9)?;
        a.set_label(&mut done)?;
        self.epilogue()
    }

    /// Store: merge into the tail entry if it has the same address and size (the only merge
    /// TSO allows), else append, flushing first when the log is full.
    fn store_helper(&mut self, size: u32, get_state: CodeLabel, flush_state: CodeLabel) -> R {
        let mut append = self.a.create_label();
        let mut room = self.a.create_label();
        let mut direct = self.a.create_label();
        let mut done = self.a.create_label();
        self.prologue()?;
        let cap = self.cfg.log_capacity as i32;
        let index = index_offset(&self.cfg);
        let a = &mut self.a;
        a.call(get_state)?;
        a.mov(r8, qword_ptr(rsp + ADDR_SLOT))?;
        a.mov(r9, qword_ptr(rsp + VALUE_SLOT))?;
        match size {
            1 => a.movzx(r9d, r9b)?,
            2 => a.movzx(r9d, r9w)?,
            4 => a.mov(r9d, r9d)?,
            _ => {}
        }
        a.test(rcx, rcx)?;
        a.jz(direct)?;
        a.inc(qword_ptr(rcx + ST_STORES))?;
        a.mov(rdx, qword_ptr(rcx + ST_COUNT))?;
        a.test(rdx, rdx)?;
        a.jz(append)?;
        a.mov(rax, rdx)?;
        a.shl(rax, 5)?;
        a.lea(rax, qword_ptr(rcx + rax + (ST_ENTRIES - ENTRY_SIZE as i32)))?;
        if self.cfg.merge_any_entry_broken {
            // Deliberately wrong (TSO-violating) merge into ANY matching entry: only for
            // showing that the litmus tests catch it.
            let mut scan = a.create_label();
            let mut next = a.create_label();
            a.mov(r10, rdx)?;
            a.set_label(&mut scan)?;
            a.cmp(qword_ptr(rax), r8)?;
            a.jne(next)?;
            a.cmp(qword_ptr(rax + 8), size as i32)?;
            a.jne(next)?;
            a.mov(qword_ptr(rax + 16), r9)?;
            a.jmp(done)?;
            a.set_label(&mut next)?;
            a.sub(rax, ENTRY_SIZE as i32)?;
            a.dec(r10)?;
            a.jnz(scan)?;
            a.jmp(append)?;
        }
        a.cmp(qword_ptr(rax), r8)?;
        a.jne(append)?;
        a.cmp(qword_ptr(rax + 8), size as i32)?;
        a.jne(append)?;
        a.mov(qword_ptr(rax + 16), r9)?;
        a.jmp(done)?;
        a.set_label(&mut append)?;
        a.cmp(rdx, cap)?;
        a.jb(room)?;
        a.call(flush_state)?;
        a.xor(edx, edx)?;
        a.set_label(&mut room)?;
        a.mov(rax, rdx)?;
        a.shl(rax, 5)?;
        a.lea(rax, qword_ptr(rcx + rax + ST_ENTRIES))?;
        a.mov(qword_ptr(rax), r8)?;
        a.mov(qword_ptr(rax + 8), size as i32)?;
        a.mov(qword_ptr(rax + 16), r9)?;
        a.inc(rdx)?;
        a.mov(qword_ptr(rcx + ST_COUNT), rdx)?;
        // dl below is the byte lanes' value for entry rdx - 1: its residue + 1.
        a.dec(edx)?;
        a.and(edx, LANE_PERIOD as i32 - 1)?;
        a.inc(edx)?;
        // Mark the first and last word the entry touches.
        a.mov(r10, qword_ptr(rcx + ST_SUMMARY))?;
        a.mov(rax, r8)?;
        a.shr(rax, 3)?;
        a.bts(r10, rax)?;
        a.lea(rax, qword_ptr(r8 + (size as i32 - 1)))?;
        a.shr(rax, 3)?;
        a.bts(r10, rax)?;
        a.mov(qword_ptr(rcx + ST_SUMMARY), r10)?;
        // Byte lanes (layout doc): for each byte of the entry, claim its word's slot for
        // this flush period if needed, then set the byte's lane to rdx (entry index + 1).
        a.mov(r9, qword_ptr(rcx + ST_FLUSHES))?;
        for j in 0..size as i32 {
            let mut fresh = a.create_label();
            let mut claim = a.create_label();
            let mut set = a.create_label();
            a.lea(rax, qword_ptr(r8 + j))?;
            a.shr(rax, 3)?;
            a.mov(r10, rax)?;
            a.and(r10d, 63)?;
            a.shl(r10, 5)?;
            a.cmp(qword_ptr(rcx + r10 + (index + 16)), r9)?;
            a.jne(fresh)?;
            a.cmp(qword_ptr(rcx + r10 + (index + 8)), rax)?;
            a.je(set)?;
            a.mov(qword_ptr(rcx + r10 + index), -1)?;
            a.mov(qword_ptr(rcx + r10 + (index + 24)), 1)?;
            a.jmp(claim)?;
            a.set_label(&mut fresh)?;
            a.mov(qword_ptr(rcx + r10 + index), 0)?;
            a.mov(qword_ptr(rcx + r10 + (index + 24)), 0)?;
            a.set_label(&mut claim)?;
            a.mov(qword_ptr(rcx + r10 + (index + 8)), rax)?;
            a.mov(qword_ptr(rcx + r10 + (index + 16)), r9)?;
            a.set_label(&mut set)?;
            a.lea(rax, qword_ptr(r8 + j))?;
            a.and(eax, 7)?;
            a.add(rax, r10)?;
            a.mov(byte_ptr(rcx + rax + index), dl)?;
        }
        a.jmp(done)?;
        a.set_label(&mut direct)?;
        self.store_direct(size)?;
        let no_slot = self.no_slot_addr;
        self.lea_abs(Register::RAX, no_slot)?;
        let a = &mut self.a;
        // ATOMICS: a statistics counter shared by slot-less threads; lock keeps counts exact.
        a.lock().inc(qword_ptr(rax))?;
        a.set_label(&mut done)?;
        self.epilogue()
    }

    fn flush_helper(&mut self, get_state: CodeLabel, flush_state: CodeLabel) -> R {
        let mut done = self.a.create_label();
        self.prologue()?;
        let a = &mut self.a;
        a.call(get_state)?;
        a.test(rcx, rcx)?;
        a.jz(done)?;
        a.cmp(qword_ptr(rcx + ST_COUNT), 0)?;
        a.je(done)?;
        a.call(flush_state)?;
        a.set_label(&mut done)?;
        self.epilogue()
    }

    fn backedge_helper(&mut self, get_state: CodeLabel, flush_state: CodeLabel) -> R {
        let mut done = self.a.create_label();
        let iters = iters_offset(&self.cfg);
        self.prologue()?;
        let a = &mut self.a;
        a.call(get_state)?;
        a.test(rcx, rcx)?;
        a.jz(done)?;
        // The trial's progress counter (`iters_offset`).
        a.add(qword_ptr(rcx + iters), 1)?;
        a.sub(qword_ptr(rcx + ST_BACKEDGES), 1)?;
        a.jae(done)?;
        a.call(flush_state)?;
        a.set_label(&mut done)?;
        self.epilogue()
    }

    /// Drains the log of state rcx in program order, then empties it.
    ///
    /// Why the RTM path publishes the FIFO log rather than a coalescing buffer that merges
    /// into any entry: a coalesced buffer has no TSO-correct non-atomic replay (after
    /// `W x=1; W y=1; W x=2` merged into `[x=2, y=1]`, writing x first exposes x=2 without
    /// y=1, writing y first exposes y=1 without x=1), so its only fallback on persistent
    /// aborts would be retrying forever. Publishing the FIFO atomically keeps the in-order
    /// replay as a correct fallback; it gives up only the entry savings of coalescing. Clobbers rax, rdx, r10
    /// and flags; preserves r8/r9 (the callers' address and value). In RTM mode the whole log is written inside one transaction (other
    /// threads see all of it or none); after `rtm_retries` aborts the same log is replayed in
    /// order without a transaction, which is always TSO-correct because the log is a FIFO with
    /// tail-only merging.
    fn flush_state(&mut self, replay: CodeLabel) -> R {
        let mut fifo = self.a.create_label();
        let mut retry = self.a.create_label();
        let mut aborted = self.a.create_label();
        let mut done = self.a.create_label();
        let mode = self.mode_addr;
        let retries = self.cfg.rtm_retries.max(1) as i32;
        let backedges = self.cfg.backedges_per_flush as i32;
        self.a.push(r8)?;
        self.a.push(r9)?;
        self.lea_abs(Register::RAX, mode)?;
        let a = &mut self.a;
        a.cmp(qword_ptr(rax), 2)?;
        a.jne(fifo)?;
        a.mov(r10d, retries)?;
        a.set_label(&mut retry)?;
        a.xbegin(aborted)?;
        a.call(replay)?;
        a.xend()?;
        a.jmp(done)?;
        a.set_label(&mut aborted)?;
        a.dec(r10d)?;
        a.jnz(retry)?;
        a.set_label(&mut fifo)?;
        if !self.cfg.flush_lock {
            a.call(replay)?;
            a.jmp(done)?;
        }
        let lock = self.flush_lock_addr;
        self.lea_abs(Register::RAX, lock)?;
        let mut acquire = self.a.create_label();
        let mut held = self.a.create_label();
        let mut ordered = self.a.create_label();
        let mut got = self.a.create_label();
        let mut unlocked = self.a.create_label();
        let a = &mut self.a;
        // The lines this log spans, roughly: those of its first and last entries (r8..=r9).
        // The holder publishes its own (lock word `lo*2+1`, the word after it `hi`); a
        // thread whose lines are disjoint from the holder's replays without waiting: the
        // lock only exists so two replays into one line do not bounce it on every store.
        // (Measured on Phoenix linear_regression -O0, where each thread replays into a line
        // of its own: ~11% of the repaired loop's CPU samples were this spin before.)
        a.mov(rdx, qword_ptr(rcx + ST_ENTRIES))?;
        a.mov(r10, qword_ptr(rcx + ST_COUNT))?;
        a.shl(r10, 5)?;
        a.mov(r10, qword_ptr(rcx + r10 + (ST_ENTRIES - ENTRY_SIZE as i32)))?;
        a.shr(rdx, 6)?;
        a.shr(r10, 6)?;
        a.cmp(rdx, r10)?;
        a.jbe(ordered)?;
        a.xchg(rdx, r10)?;
        a.set_label(&mut ordered)?;
        a.mov(r8, rdx)?;
        a.mov(r9, r10)?;
        a.mov(r10d, FLUSH_LOCK_SPINS)?;
        a.set_label(&mut acquire)?;
        a.mov(rdx, qword_ptr(rax))?;
        a.test(rdx, rdx)?;
        a.jnz(held)?;
        a.lea(rdx, qword_ptr(r8 + r8 + 1))?;
        // ATOMICS: xchg (implicitly locked) takes the flush lock; it orders nothing the
        // replay relies on (the log is private; its stores stay in program order anyway).
        // The published lines are read racily by waiters: a stale pair only makes a waiter
        // wait or not, never changes what is replayed.
        a.xchg(qword_ptr(rax), rdx)?;
        a.test(rdx, rdx)?;
        a.jz(got)?;
        a.set_label(&mut held)?;
        // rdx: the holder's word. Disjoint lines (holder lo > own hi, or holder hi < own lo):
        // replay now.
        a.shr(rdx, 1)?;
        a.cmp(rdx, r9)?;
        a.ja(unlocked)?;
        a.mov(rdx, qword_ptr(rax + 8))?;
        a.cmp(rdx, r8)?;
        a.jb(unlocked)?;
        a.pause()?;
        a.dec(r10d)?;
        a.jz(unlocked)?;
        a.jmp(acquire)?;
        a.set_label(&mut got)?;
        a.mov(qword_ptr(rax + 8), r9)?;
        a.push(rax)?;
        a.call(replay)?;
        a.pop(rax)?;
        // ATOMICS: a plain store releases the lock (x86-TSO: after the replay's stores).
        a.mov(qword_ptr(rax), 0)?;
        a.jmp(done)?;
        // Waited long enough (the holder may be descheduled): replay without the lock.
        a.set_label(&mut unlocked)?;
        a.call(replay)?;
        a.set_label(&mut done)?;
        a.mov(qword_ptr(rcx + ST_COUNT), 0)?;
        // Back-edges left: the n-th back-edge from now finds 0 and flushes (a fresh state's
        // 0 flushes at its first back-edge).
        a.mov(qword_ptr(rcx + ST_BACKEDGES), backedges - 1)?;
        a.mov(qword_ptr(rcx + ST_SUMMARY), 0)?;
        a.inc(qword_ptr(rcx + ST_FLUSHES))?;
        self.reset_fixed_slots()?;
        let a = &mut self.a;
        a.pop(r9)?;
        a.pop(r8)?;
        a.ret()
    }

    /// Empties the fixed-location slots of state rcx (the log they point into is empty).
    pub(super) fn reset_fixed_slots(&mut self) -> R {
        let base = fixed_slots_offset(&self.cfg);
        for s in 0..MAX_FIXED_SLOTS as i32 {
            self.a
                .mov(qword_ptr(rcx + (base + 8 * s)), FIXED_SLOT_EMPTY)?;
        }
        Ok(())
    }

    /// Writes every entry of state rcx, oldest first. Clobbers rax, rdx, r8, r9, flags.
    /// The 8-byte case falls through (the common size of contended counters and sums).
    fn replay(&mut self) -> R {
        let a = &mut self.a;
        let mut lp = a.create_label();
        let mut end = a.create_label();
        let mut small = a.create_label();
        let mut w4 = a.create_label();
        let mut w2 = a.create_label();
        let mut next = a.create_label();
        a.mov(rdx, qword_ptr(rcx + ST_COUNT))?;
        a.lea(rax, qword_ptr(rcx + ST_ENTRIES))?;
        a.shl(rdx, 5)?;
        a.jz(end)?;
        // rdx = end of the log.
        a.add(rdx, rax)?;
        a.set_label(&mut lp)?;
        a.mov(r8, qword_ptr(rax))?;
        a.mov(r9, qword_ptr(rax + 16))?;
        a.cmp(qword_ptr(rax + 8), 8)?;
        a.jne(small)?;
        a.mov(qword_ptr(r8), r9)?;
        a.set_label(&mut next)?;
        a.add(rax, ENTRY_SIZE as i32)?;
        a.cmp(rax, rdx)?;
        a.jb(lp)?;
        a.jmp(end)?;
        a.set_label(&mut small)?;
        a.cmp(qword_ptr(rax + 8), 2)?;
        a.ja(w4)?;
        a.je(w2)?;
        a.mov(byte_ptr(r8), r9b)?;
        a.jmp(next)?;
        a.set_label(&mut w2)?;
        a.mov(word_ptr(r8), r9w)?;
        a.jmp(next)?;
        a.set_label(&mut w4)?;
        a.mov(dword_ptr(r8), r9d)?;
        a.jmp(next)?;
        a.set_label(&mut end)?;
        a.ret()
    }
}
