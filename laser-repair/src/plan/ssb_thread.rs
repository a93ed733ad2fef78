//! Per-thread state lookup in the generated runtime: hashing the thread pointer, the
//! lock-free claim of a slot, the entry-trampoline helper, and the one-time CPUID probe.

use super::ssb_layout::{ENTRY_SIZE, KILL_OFF, MODE_OFF, ST_BACKEDGES, ST_LIMIT, ST_SAVED_RS};
use super::ssb_runtime::{Gen, ADDR_SLOT, R, VALUE_SLOT};
use iced_x86::code_asm::*;
use iced_x86::Register;

impl Gen {
    /// Entry trampoline helper. Slots: `[rsp+8]` = address of the trampoline's native
    /// continuation, `[rsp+16]` = the state register's original value. With a state: save
    /// that value in the state and put the state pointer in its slot. Without one (no slot
    /// free, or `%fs:0` == 0): return to the native continuation instead, which runs an
    /// uninstrumented copy of the region (no log, so native TSO behaviour). With the kill
    /// switch set ([`KILL_OFF`]), every thread takes the native continuation.
    pub(super) fn enter_helper(&mut self, get_state: CodeLabel) -> R {
        let mut bypass = self.a.create_label();
        let mut native = self.a.create_label();
        let mut done = self.a.create_label();
        self.prologue()?;
        // Kill switch set (the repair lost its trial): every entry runs the native copy.
        let kill = self.mode_addr - MODE_OFF + KILL_OFF;
        self.lea_abs(Register::RAX, kill)?;
        let a = &mut self.a;
        a.cmp(qword_ptr(rax), 0)?;
        a.jne(native)?;
        a.call(get_state)?;
        a.test(rcx, rcx)?;
        a.jz(bypass)?;
        a.mov(rax, qword_ptr(rsp + ADDR_SLOT))?;
        a.mov(qword_ptr(rcx + ST_SAVED_RS), rax)?;
        a.mov(qword_ptr(rsp + ADDR_SLOT), rcx)?;
        a.jmp(done)?;
        a.set_label(&mut bypass)?;
        let no_slot = self.no_slot_addr;
        self.lea_abs(Register::RAX, no_slot)?;
        let a = &mut self.a;
        // ATOMICS: statistics shared by slot-less threads; lock keeps the count exact.
        a.lock().inc(qword_ptr(rax))?;
        a.set_label(&mut native)?;
        a.mov(rax, qword_ptr(rsp + VALUE_SLOT))?;
        // Our own return address sits just below the caller's slots.
        a.mov(qword_ptr(rsp + (VALUE_SLOT - 8)), rax)?;
        a.set_label(&mut done)?;
        self.epilogue()
    }

    /// rcx = this thread's state, or 0 (no slot: bypass). Clobbers rax, rdx, r8, r9, flags.
    pub(super) fn get_state(&mut self, detect: CodeLabel) -> R {
        let mut probe = self.a.create_label();
        let mut next = self.a.create_label();
        let mut claim = self.a.create_label();
        let mut found = self.a.create_label();
        let mut none = self.a.create_label();
        let mask = (self.cfg.thread_slots - 1) as i32;
        let slots = self.cfg.thread_slots as i32;
        let (keys, states, ssize) = (self.keys_addr, self.states_addr, self.state_size);
        let a = &mut self.a;
        a.mov(rax, qword_ptr(0u64).fs())?;
        a.test(rax, rax)?;
        a.jz(none)?;
        // Hash: TCBs sit at the top of page-aligned thread stacks, so mix bits above 12.
        a.mov(rcx, rax)?;
        a.shr(rcx, 12)?;
        a.mov(rdx, rax)?;
        a.shr(rdx, 23)?;
        a.xor(rcx, rdx)?;
        a.and(ecx, mask)?;
        self.lea_abs(Register::RDX, keys)?;
        let a = &mut self.a;
        a.mov(r8d, slots)?;
        a.set_label(&mut probe)?;
        a.cmp(qword_ptr(rdx + rcx * 8), rax)?;
        a.je(found)?;
        a.cmp(qword_ptr(rdx + rcx * 8), 0)?;
        a.je(claim)?;
        a.set_label(&mut next)?;
        a.inc(ecx)?;
        a.and(ecx, mask)?;
        a.dec(r8d)?;
        a.jnz(probe)?;
        a.set_label(&mut none)?;
        a.xor(ecx, ecx)?;
        a.ret()?;
        a.set_label(&mut claim)?;
        a.mov(r9, rax)?;
        a.xor(eax, eax)?;
        // ATOMICS: cmpxchg claims the free key against other new threads; the state block is
        // private to the winner afterwards, so no ordering beyond the lock is needed.
        a.lock().cmpxchg(qword_ptr(rdx + rcx * 8), r9)?;
        a.mov(rax, r9)?;
        // Lost the race: the slot now holds another thread's key; the probe moves on.
        a.jne(probe)?;
        a.call(detect)?;
        // A state claimed for the first time: its fixed slots must read "none" (a zero slot
        // would look like the tail of an empty log) and its back-edge budget be full. Every
        // flush keeps both so afterwards.
        a.imul_3(rcx, rcx, ssize as i32)?;
        self.lea_abs(Register::RDX, states)?;
        self.a.add(rcx, rdx)?;
        self.reset_fixed_slots()?;
        let backedges = self.cfg.backedges_per_flush as i32;
        let limit = (ENTRY_SIZE * u64::from(self.cfg.log_capacity)) as i32;
        let a = &mut self.a;
        a.mov(qword_ptr(rcx + ST_BACKEDGES), backedges - 1)?;
        a.mov(qword_ptr(rcx + ST_LIMIT), limit)?;
        a.ret()?;
        a.set_label(&mut found)?;
        a.imul_3(rcx, rcx, ssize as i32)?;
        self.lea_abs(Register::RDX, states)?;
        let a = &mut self.a;
        a.add(rcx, rdx)?;
        a.mov(qword_ptr(rcx + ST_LIMIT), limit)?;
        a.ret()
    }

    /// Sets the mode word once: 2 if CPUID.(EAX=7,ECX=0):EBX bit 11 (RTM) and not EDX bit 11
    /// (RTM_ALWAYS_ABORT), else 1. Preserves
    /// all registers (flags clobbered; callers have saved them).
    pub(super) fn detect_mode(&mut self) -> R {
        let mut set = self.a.create_label();
        let mut out = self.a.create_label();
        let mode = self.mode_addr;
        let a = &mut self.a;
        a.push(rax)?;
        a.push(rbx)?;
        a.push(rcx)?;
        a.push(rdx)?;
        a.push(rsi)?;
        a.mov(esi, 1)?;
        a.xor(eax, eax)?;
        a.cpuid()?;
        a.cmp(eax, 7)?;
        a.jb(set)?;
        a.mov(eax, 7)?;
        a.xor(ecx, ecx)?;
        a.cpuid()?;
        a.bt(ebx, 11)?;
        a.jnc(set)?;
        // RTM_ALWAYS_ABORT (EDX bit 11): RTM enumerated but every xbegin aborts.
        a.bt(edx, 11)?;
        a.jc(set)?;
        a.mov(esi, 2)?;
        a.set_label(&mut set)?;
        self.lea_abs(Register::RAX, mode)?;
        let a = &mut self.a;
        a.cmp(qword_ptr(rax), 0)?;
        a.jne(out)?;
        a.mov(qword_ptr(rax), rsi)?;
        a.set_label(&mut out)?;
        a.pop(rsi)?;
        a.pop(rdx)?;
        a.pop(rcx)?;
        a.pop(rbx)?;
        a.pop(rax)?;
        a.ret()
    }
}
