//! Decode each PC once: the instruction at the PC and, found by a linear sweep of the enclosing
//! function, the instruction that ends at it (the one a watchpoint trap refers to), and the
//! control-flow paths into the PC that a skidded timer sample can have come by
//! ([`crate::decode::skid`], built from the same sweep).
//!
//! ```text
//!   function start ─▶ i0 │ i1 │ i2 │ pc │ …      linear sweep: instruction starts
//!                                └─ prev(pc) = i2, if i2 falls through to pc
//! ```
//!
//! `prev` is only kept when it is the unique way execution reaches `pc` by fall-through: when
//! `pc` is also the target of a direct branch in the function (a loop head, a join), the
//! instruction executed just before the sample may have been the branch, and registers may
//! have changed since `i2` ran, so its address would not be exact. Indirect jumps into `pc`
//! cannot be seen; that residual risk is the linear sweep's.

use hashbrown::HashMap;
use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind};

use crate::decode::classify::{Classifier, Insn};
use crate::decode::code::CodeSource;
use crate::decode::skid::{FunctionFlow, SkidPaths};

/// Longest function swept (bytes); larger ones are assumed to be mis-sized symbols.
const MAX_SWEEP: u64 = 1 << 20;

/// Most direct callers of a function two threads were sampled in that are looked at for
/// atomic updates ([`PcCache::atomic_globals`]): a helper called from a few places (glibc's
/// `random_r`, from `__random`) is often called with a lock its caller holds, and a leaf
/// computation's caller is where the program calls the library; a function called from
/// everywhere (`memcpy`) says nothing about any one caller.
const MAX_CALLERS_LOOKED_AT: usize = 4;

/// Most direct callees of one function that are looked at for atomic updates, two levels
/// down from a function two threads were sampled in or its callers (through the PLT: the
/// program's `rand()` is glibc's `rand`, which calls `__random`, which takes the lock).
const MAX_CALLEES_LOOKED_AT: usize = 8;

/// Everything known about one PC.
#[derive(Clone, Copy, Debug, Default)]
pub struct PcInfo {
    /// The instruction at the PC (`None`: no code there or undecodable).
    pub at: Option<Insn>,
    /// The instruction ending at the PC that falls through to it.
    pub prev: Option<Insn>,
    /// Whether `pc` is the target of a direct branch inside its function.
    pub join: bool,
    /// The PC lies in vdso/vvar/vsyscall (decided by the caller at first sight).
    pub special: bool,
    /// The PC lies in a shared library's code (decided by the caller at first sight).
    pub library: bool,
    /// The paths a skidded timer sample at this PC can have come by
    /// ([`PcCache::skid_paths`]); 0: none known (no function around the PC, or not an
    /// instruction boundary).
    skid: u32,
    /// The function around the PC, an index + 1 into the cache's functions (0: none known):
    /// which threads it was sampled in ([`PcCache::lookup_sampled`]).
    pub func: u32,
}

/// What the caller of [`PcCache::get_with`] knows about where a new PC lies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Where {
    pub special: bool,
    pub library: bool,
}

struct Sweep {
    starts: Vec<u64>,
    targets: Vec<u64>,
    /// (target, branch pc, branch next ip, condition) of every direct branch, by target.
    branches: Vec<(u64, u64, u64, Option<iced_x86::ConditionCode>)>,
}

/// A function samples landed in, and the first thread they were taken in.
#[derive(Clone, Copy, Debug)]
struct Func {
    start: u64,
    end: u64,
    /// The first thread sampled in it (0: none yet).
    tid: u32,
    /// A second thread was sampled in it: its atomic updates were looked for.
    scanned: bool,
}

/// Entries of [`PcCache::front`] (a power of two).
const FRONT: usize = 1024;

/// Per-PC decode cache (hashbrown: the hot path is one lookup per sample).
pub struct PcCache {
    /// PC → index in `infos` (a small value keeps the per-sample probe compact).
    pcs: HashMap<u64, u32>,
    infos: Vec<PcInfo>,
    /// Direct-mapped by PC in front of `pcs`: a program's samples fall on a few hot loops,
    /// and one compare beats hashing the PC (`u64::MAX`: empty).
    front: Box<[(u64, u32); FRONT]>,
    sweeps: HashMap<u64, Sweep>,
    /// Skid paths of the PCs decoded so far; `PcInfo::skid` is an index + 1.
    skids: Vec<SkidPaths>,
    classifier: Classifier,
    buf: Vec<u8>,
    /// Functions PCs were decoded in, by start ([`PcInfo::func`]).
    funcs: Vec<Func>,
    func_index: HashMap<u64, u32>,
    /// `(address, bytes)` of the words updated atomically at a fixed address
    /// ([`atomic_global`]) near code two threads were sampled in, in the order found, once each.
    atomics: Vec<(u64, u32)>,
    /// Functions looked at for atomic updates, with the call depth they were looked at to.
    scanned: HashMap<u64, u32>,
    /// Call targets resolved ([`CodeSource::call_target`]: a PLT stub's costs a look at the
    /// file's dynamic relocations and symbols).
    call_targets: HashMap<u64, Option<u64>>,
}

impl Default for PcCache {
    fn default() -> Self {
        Self::new()
    }
}

impl PcCache {
    pub fn new() -> Self {
        Self {
            pcs: HashMap::new(),
            infos: Vec::new(),
            front: Box::new([(u64::MAX, 0); FRONT]),
            sweeps: HashMap::new(),
            skids: Vec::new(),
            classifier: Classifier::new(),
            buf: Vec::new(),
            funcs: Vec::new(),
            func_index: HashMap::new(),
            atomics: Vec::new(),
            scanned: HashMap::new(),
            call_targets: HashMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.pcs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pcs.is_empty()
    }

    /// Forget everything (after `exec`, code at the same addresses is different).
    pub fn clear(&mut self) {
        self.pcs.clear();
        self.infos.clear();
        self.front.fill((u64::MAX, 0));
        self.sweeps.clear();
        self.skids.clear();
        self.funcs.clear();
        self.func_index.clear();
        self.atomics.clear();
        self.scanned.clear();
        self.call_targets.clear();
    }

    /// The words updated with atomic instructions at fixed (RIP-relative) addresses near code
    /// that two threads were sampled in ([`PcCache::lookup_sampled`]): by the function, by its
    /// direct callers where it has few (`MAX_CALLERS_LOOKED_AT`), and by what either calls,
    /// two levels down (`MAX_CALLEES_LOOKED_AT`). Lock words and shared counters of the
    /// program and of its libraries, found without a sample on the access itself: glibc's
    /// `rand()` takes a lock in `libc.so`'s data, and a program that calls it between long
    /// computations is sampled in the computation, hardly ever in `rand`.
    pub fn atomic_globals(&self) -> &[(u64, u32)] {
        &self.atomics
    }

    /// The paths by which execution can have reached `info`'s PC (see [`crate::decode::skid`]).
    #[inline]
    pub fn skid_paths(&self, info: &PcInfo) -> Option<&SkidPaths> {
        info.skid
            .checked_sub(1)
            .and_then(|i| self.skids.get(i as usize))
    }

    /// The decoded facts for `pc`, decoding on first sight.
    #[inline]
    pub fn get<C: CodeSource + ?Sized>(&mut self, pc: u64, code: &C) -> PcInfo {
        self.get_with(pc, code, Where::default)
    }

    /// As [`Self::get`]; on first sight `place` says whether the PC is in kernel-provided
    /// pages (then it is not decoded) or in a shared library.
    #[inline]
    pub fn get_with<C: CodeSource + ?Sized>(
        &mut self,
        pc: u64,
        code: &C,
        place: impl FnOnce() -> Where,
    ) -> PcInfo {
        *self.lookup_with(pc, code, place).0
    }

    /// As [`Self::get_with`], borrowed, with the PC's skid paths: the per-sample path (a
    /// `PcInfo` is ~200 bytes, and copying it out was a tenth of the replay's instructions).
    #[inline]
    pub fn lookup_with<C: CodeSource + ?Sized>(
        &mut self,
        pc: u64,
        code: &C,
        place: impl FnOnce() -> Where,
    ) -> (&PcInfo, Option<&SkidPaths>) {
        self.lookup_sampled(pc, 0, code, place)
    }

    /// As [`Self::lookup_with`], for a sample taken in thread `tid`: the second thread sampled
    /// in a function has the code around it looked at for atomic updates
    /// ([`Self::atomic_globals`]).
    #[inline]
    pub fn lookup_sampled<C: CodeSource + ?Sized>(
        &mut self,
        pc: u64,
        tid: u32,
        code: &C,
        place: impl FnOnce() -> Where,
    ) -> (&PcInfo, Option<&SkidPaths>) {
        let slot = (pc ^ (pc >> 9)) as usize % FRONT;
        let i = match self.front[slot] {
            (p, i) if p == pc => i as usize,
            _ => {
                let i = match self.pcs.get(&pc) {
                    Some(&i) => i as usize,
                    None => {
                        let info = self.first_sight(pc, code, place);
                        self.infos.push(info);
                        self.pcs.insert(pc, (self.infos.len() - 1) as u32);
                        self.infos.len() - 1
                    }
                };
                self.front[slot] = (pc, i as u32);
                i
            }
        };
        if tid != 0 {
            self.note_thread(self.infos[i].func, tid, code);
        }
        let info = &self.infos[i];
        (info, self.skid_paths(info))
    }

    #[cold]
    fn first_sight<C: CodeSource + ?Sized>(
        &mut self,
        pc: u64,
        code: &C,
        place: impl FnOnce() -> Where,
    ) -> PcInfo {
        let w = place();
        if w.special {
            PcInfo {
                special: true,
                ..PcInfo::default()
            }
        } else {
            PcInfo {
                library: w.library,
                ..self.decode(pc, code)
            }
        }
    }

    fn decode<C: CodeSource + ?Sized>(&mut self, pc: u64, code: &C) -> PcInfo {
        let mut b = [0u8; 16];
        let n = code.read_code(pc, &mut b);
        let at = self.classifier.classify(pc, &b[..n]);
        let mut info = PcInfo {
            at,
            ..PcInfo::default()
        };
        let Some((fs, fe)) = code.function_bounds(pc.wrapping_sub(1)) else {
            return info;
        };
        if pc == fe && code.function_bounds(pc).is_some_and(|(s, _)| s == pc) {
            // `pc` starts the next function: it is entered by calls and jumps, never by
            // falling off the end of the one before.
            info.join = true;
            return info;
        }
        info.func = match self.func_index.get(&fs) {
            Some(&i) => i,
            None => {
                self.funcs.push(Func {
                    start: fs,
                    end: fe,
                    tid: 0,
                    scanned: false,
                });
                let i = self.funcs.len() as u32;
                self.func_index.insert(fs, i);
                i
            }
        };
        if !self.sweeps.contains_key(&fs) {
            let s = self.sweep(fs, fe, code);
            self.sweeps.insert(fs, s);
        }
        let s = &self.sweeps[&fs];
        info.join = s.targets.binary_search(&pc).is_ok();
        let i = s.starts.partition_point(|&x| x < pc);
        // pc must itself be an instruction boundary (or the function's end, for a trap after
        // its last instruction) and have a predecessor.
        let on_boundary = s.starts.get(i) == Some(&pc) || pc == fe;
        if on_boundary && i > 0 {
            let p = s.starts[i - 1];
            let n = code.read_code(p, &mut b);
            if let Some(prev) = self.classifier.classify(p, &b[..n]) {
                if prev.falls_through && prev.next_ip() == pc {
                    info.prev = Some(prev);
                }
            }
        }
        if s.starts.get(i) == Some(&pc) {
            let flow = FunctionFlow {
                start: fs,
                end: fe,
                starts: &s.starts,
                branches: &s.branches,
            };
            let classifier = &mut self.classifier;
            let mut paths = crate::decode::skid::build(pc, &flow, |p| {
                let n = code.read_code(p, &mut b);
                classifier.classify(p, &b[..n])
            });
            // The feeder of `prev`: the one instruction that runs right before it.
            let into_prev = info
                .prev
                .map(|x| x.pc)
                .filter(|&x| x != fs && s.targets.binary_search(&x).is_err());
            if let (Some(x), true) = (into_prev, i >= 2) {
                let d = s.starts[i - 2];
                let n = code.read_code(d, &mut b);
                paths.feeder = self
                    .classifier
                    .classify(d, &b[..n])
                    .filter(|f| f.falls_through && f.next_ip() == x);
            }
            self.skids.push(paths);
            info.skid = self.skids.len() as u32;
        }
        info
    }

    /// A sample of thread `tid` was taken in the function `func` ([`PcInfo::func`]). The second
    /// thread sampled there has the code around it looked at for atomic updates
    /// ([`PcCache::atomic_globals`]): code one thread runs cannot contend, and a program's
    /// start-up (Phoenix kmeans draws its points with `rand()` in the main thread alone) would
    /// otherwise give the survey words no other thread updates.
    #[inline]
    fn note_thread<C: CodeSource + ?Sized>(&mut self, func: u32, tid: u32, code: &C) {
        let Some(f) = func
            .checked_sub(1)
            .and_then(|i| self.funcs.get_mut(i as usize))
        else {
            return;
        };
        if f.scanned || f.tid == tid || tid == 0 {
            return;
        }
        if f.tid == 0 {
            f.tid = tid;
            return;
        }
        f.scanned = true;
        let (start, end) = (f.start, f.end);
        self.scan(start, end, 2, code);
        self.look_at_callers(start, code);
    }

    /// Notes the atomic updates of the functions that call `start` directly, when they are few,
    /// and two levels of their callees: a program whose samples land in a leaf function
    /// (the long computation) calls `rand()` from the function that calls the leaf.
    fn look_at_callers<C: CodeSource + ?Sized>(&mut self, start: u64, code: &C) {
        let sites = code.direct_callers(start);
        if sites.len() > MAX_CALLERS_LOOKED_AT {
            return;
        }
        for site in sites {
            if let Some((cs, ce)) = code.function_bounds(site) {
                self.scan(cs, ce, 2, code);
            }
        }
    }

    /// Notes the atomic updates of the functions called at `targets` (PLT stubs resolved),
    /// and `depth` levels of their callees. A call into another file through its PLT costs
    /// no level: a library's exported function is often a thin wrapper of the one that does
    /// the work (glibc's `rand` of `__random`), and a program that calls `rand()` from a
    /// helper beside its computation reaches the lock three calls down from the
    /// computation's caller.
    fn look_at_callees<C: CodeSource + ?Sized>(&mut self, targets: &[u64], depth: u32, code: &C) {
        for &t in targets.iter().take(MAX_CALLEES_LOOKED_AT) {
            let target = *self
                .call_targets
                .entry(t)
                .or_insert_with(|| code.call_target(t));
            let Some((cs, ce)) = target.and_then(|f| code.function_bounds(f)) else {
                continue;
            };
            let through_plt = target != Some(t);
            self.scan(cs, ce, depth + u32::from(through_plt), code);
        }
    }

    /// Notes the atomic updates of the function `[start, end)`, and `depth` levels of its
    /// callees (again only to look deeper than before).
    fn scan<C: CodeSource + ?Sized>(&mut self, start: u64, end: u64, depth: u32, code: &C) {
        if self.scanned.get(&start).is_some_and(|&d| d >= depth) {
            return;
        }
        self.scanned.insert(start, depth);
        let buf = self.function_code(start, end, code);
        let mut d = Decoder::with_ip(64, &buf, start, DecoderOptions::NONE);
        let mut callees = Vec::new();
        while d.can_decode() {
            let ins = d.decode();
            if ins.is_invalid() {
                break;
            }
            self.note_atomic(&ins);
            if let Some(t) = direct_call(&ins) {
                if !callees.contains(&t) {
                    callees.push(t);
                }
            }
        }
        self.buf = buf;
        if depth > 0 {
            self.look_at_callees(&callees, depth - 1, code);
        }
    }

    fn note_atomic(&mut self, ins: &Instruction) {
        if let Some(w) = atomic_global(ins).filter(|w| !self.atomics.contains(w)) {
            self.atomics.push(w);
        }
    }

    /// The code of the function `[start, end)` (at most [`MAX_SWEEP`] bytes, as far as it is
    /// known), in the cache's buffer, which the caller hands back (`self.buf = …`).
    fn function_code<C: CodeSource + ?Sized>(&mut self, start: u64, end: u64, code: &C) -> Vec<u8> {
        let len = end.saturating_sub(start).min(MAX_SWEEP) as usize;
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(len, 0);
        let n = code.read_code(start, &mut buf);
        buf.truncate(n);
        buf
    }

    fn sweep<C: CodeSource + ?Sized>(&mut self, start: u64, end: u64, code: &C) -> Sweep {
        let buf = self.function_code(start, end, code);
        let mut d = Decoder::with_ip(64, &buf, start, DecoderOptions::NONE);
        let mut starts = Vec::new();
        let mut targets = Vec::new();
        let mut branches = Vec::new();
        while d.can_decode() {
            let ins = d.decode();
            if ins.is_invalid() {
                break; // data or padding: later boundaries are unreliable
            }
            starts.push(ins.ip());
            let c = self.classifier.classify_decoded(&ins);
            if let Some(t) = c.branch_target {
                if t >= start && t < end {
                    targets.push(t);
                    branches.push((t, c.pc, c.next_ip(), c.branch_cond));
                }
            }
        }
        self.buf = buf;
        targets.sort_unstable();
        targets.dedup();
        branches.sort_unstable_by_key(|b| (b.0, b.1));
        Sweep {
            starts,
            targets,
            branches,
        }
    }
}

/// The target of a direct `call` (a PLT stub, for a call into another file).
fn direct_call(ins: &Instruction) -> Option<u64> {
    (ins.flow_control() == FlowControl::Call && ins.op0_kind() == OpKind::NearBranch64)
        .then(|| ins.near_branch_target())
}

/// The word an atomic read-modify-write (a `lock`-prefixed instruction, or `xchg` with
/// memory, which locks without the prefix) updates at a RIP-relative address, with its size.
fn atomic_global(ins: &Instruction) -> Option<(u64, u32)> {
    let locked = ins.has_lock_prefix() || ins.mnemonic() == Mnemonic::Xchg;
    let memory = (0..ins.op_count()).any(|i| ins.op_kind(i) == OpKind::Memory);
    if !(locked && memory && ins.is_ip_rel_memory_operand()) {
        return None;
    }
    let size = ins.memory_size().size() as u32;
    (size > 0).then(|| (ins.ip_rel_memory_address(), size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::code::MemoryCode;
    use crate::model::findings::Op;
    use iced_x86::code_asm::*;

    const F: u64 = 0x40_1000;

    /// ```text
    ///  F+0:  mov rsi,[rcx]       ; i0
    ///  top:  mov rdx,[rcx]       ; i1  (branch target)
    ///        add rdx,1           ; i2
    ///        mov [rcx],rdx       ; i3
    ///        dec rax             ; i4
    ///        jnz top             ; i5
    ///        ret
    /// ```
    fn code() -> (MemoryCode, Vec<u64>) {
        let mut a = CodeAssembler::new(64).unwrap();
        let mut top = a.create_label();
        a.mov(rsi, qword_ptr(rcx)).unwrap();
        a.set_label(&mut top).unwrap();
        a.mov(rdx, qword_ptr(rcx)).unwrap();
        a.add(rdx, 1).unwrap();
        a.mov(qword_ptr(rcx), rdx).unwrap();
        a.dec(rax).unwrap();
        a.jnz(top).unwrap();
        a.ret().unwrap();
        let bytes = a.assemble(F).unwrap();
        let offs = crate::test_util::starts(F, &bytes);
        let mut m = MemoryCode::new();
        m.add_function(F, bytes);
        (m, offs)
    }

    #[test]
    fn prev_found_by_sweep() {
        let (m, pcs) = code();
        let mut c = PcCache::new();
        let at_add = c.get(pcs[2], &m);
        assert_eq!(
            at_add.at.unwrap().mem().len(),
            0,
            "add rdx,1 has no memory operand"
        );
        let prev = at_add.prev.expect("the load before add");
        assert_eq!(prev.pc, pcs[1]);
        assert_eq!(prev.mem[0].op, Op::Load);
        assert!(!at_add.join);
        assert_eq!(c.len(), 1);
        // Cached: the same answer without decoding again.
        assert_eq!(c.get(pcs[2], &m).prev.unwrap().pc, pcs[1]);
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn loop_head_is_a_join_and_branches_do_not_fall_through() {
        let (m, pcs) = code();
        let mut c = PcCache::new();
        let head = c.get(pcs[1], &m);
        assert!(head.join, "jnz targets it");
        // After `ret` (end of function) there is no fall-through predecessor.
        let after_ret = c.get(pcs[6] + 1, &m);
        assert!(after_ret.prev.is_none());
        // `jnz` falls through to `ret`.
        assert_eq!(c.get(pcs[6], &m).prev.unwrap().pc, pcs[5]);
    }

    /// `if (odd) skip; store;` as compilers and the asm-tests' branchy bodies emit it:
    /// ```text
    ///  top:  test bl,1            ; sets ZF
    ///        jnz skip             ; the only jump into `skip`
    ///        mov [r12],r14        ; prev of `skip`, leaves flags alone
    ///  skip: add r14,r15          ; join: sampled here after skid
    ///        dec r13
    ///        jnz top
    ///        ret
    /// ```
    fn guarded(store_writes_flags: bool, second_jump: bool) -> (MemoryCode, Vec<u64>) {
        let mut a = CodeAssembler::new(64).unwrap();
        let mut top = a.create_label();
        let mut skip = a.create_label();
        a.set_label(&mut top).unwrap();
        a.test(bl, 1).unwrap();
        a.jnz(skip).unwrap();
        if store_writes_flags {
            a.add(qword_ptr(r12), r14).unwrap();
        } else {
            a.mov(qword_ptr(r12), r14).unwrap();
        }
        a.set_label(&mut skip).unwrap();
        a.add(r14, r15).unwrap();
        a.dec(r13).unwrap();
        a.jnz(top).unwrap();
        if second_jump {
            a.jmp(skip).unwrap();
        }
        a.ret().unwrap();
        let bytes = a.assemble(F).unwrap();
        let offs = crate::test_util::starts(F, &bytes);
        let mut m = MemoryCode::new();
        m.add_function(F, bytes);
        (m, offs)
    }

    /// The store the skid walk attributes at `skip`, under flags `flags`.
    fn skipped_store(m: &MemoryCode, pcs: &[u64], flags: Option<u64>) -> Option<u64> {
        let mut c = PcCache::new();
        let info = c.get(pcs[3], m);
        let mut r = laser_driver::UserRegs::default();
        if let Some(f) = flags {
            r.set(laser_driver::Reg::Flags, f);
        }
        c.skid_paths(&info)?.resolve(&r).map(|s| s.insn.pc)
    }

    const ZF: u64 = 1 << 6;

    #[test]
    fn a_join_after_a_jcc_over_a_flag_neutral_store_is_decided_by_the_flags() {
        let (m, pcs) = guarded(false, false);
        let skip = PcCache::new().get(pcs[3], &m);
        assert!(skip.join);
        assert_eq!(skip.prev.unwrap().pc, pcs[2]);
        assert_eq!(
            skipped_store(&m, &pcs, Some(ZF)),
            Some(pcs[2]),
            "jnz fell through"
        );
        assert_eq!(skipped_store(&m, &pcs, Some(0)), None, "jnz jumped over it");
        assert_eq!(skipped_store(&m, &pcs, None), None, "no flags: either");
    }

    #[test]
    fn the_flags_cannot_decide_when_the_store_writes_them_or_a_second_jump_arrives() {
        // `add [m]` sets flags: the jump's flags are gone once it ran. Taken (ZF=0) is still
        // possible as far as the sample can tell, so nothing; not taken (ZF=1) must be the
        // store.
        let (m, pcs) = guarded(true, false);
        assert_eq!(skipped_store(&m, &pcs, Some(0)), None);
        assert_eq!(skipped_store(&m, &pcs, Some(ZF)), Some(pcs[2]));
        // The `jmp skip` after the loop is a third way in, with nothing to rule it out.
        let (m, pcs) = guarded(false, true);
        assert_eq!(skipped_store(&m, &pcs, Some(ZF)), None);
    }

    #[test]
    fn mid_instruction_pc_has_no_prev() {
        let (m, pcs) = code();
        let mut c = PcCache::new();
        let p = c.get(pcs[3] + 1, &m);
        assert!(p.prev.is_none());
    }

    #[test]
    fn function_start_has_no_prev_from_the_function_before() {
        let mut m = MemoryCode::new();
        m.add_function(0x1000, vec![0x48, 0x89, 0x07]); // mov [rdi],rax (no ret: falls off)
        m.add_function(0x1003, vec![0x90, 0xc3]); // nop; ret
        let mut c = PcCache::new();
        let p = c.get(0x1003, &m);
        assert!(p.prev.is_none() && p.join);
        // Inside the second function the sweep works as usual.
        assert_eq!(c.get(0x1004, &m).prev.map(|i| i.pc), Some(0x1003));
    }

    #[test]
    fn unknown_code() {
        let m = MemoryCode::new();
        let mut c = PcCache::new();
        let p = c.get(0x1234, &m);
        assert!(p.at.is_none() && p.prev.is_none());
    }
}
