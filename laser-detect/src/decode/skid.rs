//! Walk back from a timer sample's IP along the control flow to the memory access the sample
//! skidded past.
//!
//! A `cpu-clock` sample's IP is the next instruction to run; the access that was stalling is
//! often a few instructions back, and not always in address order:
//! ```text
//!   top:  imul %rdx,%rdx       ◀ sampled (jump target)     loop:  mov (%rax),%rcx
//!         …                                                       sub $8,%rax      ◀ sampled
//!         movl $1,A(%rip)      store, never sampled                cmp …            ◀ sampled
//!         jmp top              ◀ sampled                          jne loop
//! ```
//! Per PC, once, the paths that can lead to it are enumerated backwards (fall-through from the
//! instruction before, unless it is a `jmp`/`ret`/`call`; the sources of direct jumps and
//! branches to it) up to [`MAX_SKID`] instructions or the first instruction that touches
//! memory, which is the access a path attributes. Each path carries the facts about the sample
//! it needs to be the one that ran:
//! - a conditional jump on the path was taken / not taken: checkable on the sampled RFLAGS when
//!   no instruction between the jump and the IP writes flags;
//! - `mov $k,%reg` / `xor %reg,%reg` on the path set a register the rest of the path only moves
//!   by constants: the sampled register must match (this is what rules out a loop's entry path
//!   once the loop counter has moved).
//!
//! The access's address is recomputed from the sampled registers, undoing the constant steps
//! the path applied to them since (`sub $8,%rax` after `mov (%rax),%rcx`: the load read
//! `rax + 8`). If any other instruction on the path wrote an address register, or the access
//! itself did, the address is lost and the path attributes nothing (it still ends there: the
//! most recent access is the one the sample is about, not an older one).
//!
//! A sample is attributed only when every path still feasible under its flags and registers
//! ends at the same access with the same address: a join the sample cannot decide (two
//! predecessors, a function entry, a return from a call, the bound reached with no access) is
//! left alone. Indirect jumps into the code are invisible to the linear sweep; that residual
//! risk is the sweep's (see [`crate::decode::pccache`]).

use iced_x86::ConditionCode;
use laser_driver::{Reg, UserRegs};

use crate::decode::classify::{condition_holds, Insn, MemOperand, RegEffect};
use crate::model::findings::Op;

/// Most instructions walked back from the IP. Measured (benchmarks/RESULTS.md, "Timer skid"):
/// over 42,188 `cpu-clock` samples in the asm-tests' single-access loops, the sample sat on the
/// contending access itself in 3.1%, 1 instruction after it in 66.4%, 2 in 22.1%, 3 in 8.1%,
/// 4 in 0.3%, and past the loop's back edge in 0.1%. Six covers that with room for a `jmp`
/// and a loop head, and keeps the paths per PC few.
pub const MAX_SKID: usize = 6;

/// Instructions walked past the attributed access only to check that a path through it is
/// feasible (`jcc skip; store; skip:` — the store ran only if the jump fell through).
const VALIDATE: usize = 1;

/// More paths than this: the code is too branchy to say anything; retry with a walk of one
/// instruction (the instruction just before the IP, as before the walk existed).
const MAX_PATHS: usize = 32;

/// The direct control transfers of one function, from its linear sweep.
pub struct FunctionFlow<'a> {
    /// Function start and end (exclusive).
    pub start: u64,
    pub end: u64,
    /// Instruction starts, ascending.
    pub starts: &'a [u64],
    /// (target, branch pc, branch next ip, condition) of every direct branch, sorted by target.
    pub branches: &'a [(u64, u64, u64, Option<ConditionCode>)],
}

/// One fact about the sample a path needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    /// The conditional jump `cc` was (or was not) taken, on the sampled flags.
    Branch { cc: ConditionCode, taken: bool },
    /// Register `r` holds `v` in the sample.
    RegIs { r: Reg, v: u64 },
}

impl Check {
    fn holds(&self, regs: &UserRegs) -> bool {
        match *self {
            Check::Branch { cc, taken } => regs
                .get(Reg::Flags)
                .is_none_or(|f| condition_holds(cc, f) == taken),
            Check::RegIs { r, v } => regs.get(r).is_none_or(|x| x == v),
        }
    }
}

/// The access a path ends at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Skidded {
    pub insn: Insn,
    /// Per memory operand: what to add to the sampled base and index registers to get their
    /// values when the access ran; `None` when the path lost them.
    pub adjust: [Option<(u64, u64)>; 2],
}

impl Skidded {
    /// The operand's address when it ran, from the sampled registers; `None` if lost.
    pub fn address(
        &self,
        i: usize,
        regs: &UserRegs,
    ) -> Option<Result<u64, crate::decode::effaddr::NoAddr>> {
        let (b, x) = self.adjust[i]?;
        let m: &MemOperand = &self.insn.mem[i];
        Some(crate::decode::effaddr::effective_address(m, regs).map(|a| {
            let a = a
                .wrapping_add(b)
                .wrapping_add(x.wrapping_mul(m.scale as u64));
            if m.addr32 {
                a & 0xffff_ffff
            } else {
                a
            }
        }))
    }
}

#[derive(Clone, Debug)]
struct Path {
    checks: std::ops::Range<u32>,
    /// Index into `ends`, or `None`: no access on this path.
    end: Option<u16>,
}

/// Every path to one PC, with what each needs and where it ends.
#[derive(Clone, Debug, Default)]
pub struct SkidPaths {
    ends: Vec<Skidded>,
    paths: Vec<Path>,
    checks: Vec<Check>,
    /// All paths end alike: the answer needs no look at the sample.
    fixed: Option<Option<u16>>,
    /// The instruction that falls through into the one ending at this PC, when that is the
    /// only way in: for a watch trap at this PC, it may say how the access's pointer was made
    /// (`lea 4(%r12),%rax; movl (%rax),%eax`) when the access overwrote it.
    pub feeder: Option<Insn>,
}

impl SkidPaths {
    /// The access the sample with registers `regs` skidded past, if the feasible paths agree.
    #[inline]
    pub fn resolve(&self, regs: &UserRegs) -> Option<&Skidded> {
        if let Some(end) = self.fixed {
            return end.map(|i| &self.ends[i as usize]);
        }
        let mut found: Option<Option<u16>> = None;
        for p in &self.paths {
            let cs = &self.checks[p.checks.start as usize..p.checks.end as usize];
            if !cs.iter().all(|c| c.holds(regs)) {
                continue;
            }
            match found {
                Some(e) if e != p.end => return None, // two feasible paths disagree
                _ => found = Some(p.end),
            }
        }
        found.flatten().map(|i| &self.ends[i as usize])
    }

    /// Number of paths (for tests and statistics).
    pub fn len(&self) -> usize {
        self.paths.len()
    }

    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }
}

/// Register state at a point of a path, relative to the sample: `value = sampled + off[r]`
/// unless bit `r` of `lost` is set.
#[derive(Clone)]
struct State {
    off: [u64; 24],
    lost: u32,
    /// No instruction between here and the IP writes flags.
    flags_known: bool,
    checks: Vec<Check>,
    end: Option<Skidded>,
    /// Instructions walked past `end` (validation only).
    past_end: usize,
}

/// A predecessor and the branch decision (condition, taken) its edge needs, if any.
type Pred = (Insn, Option<(ConditionCode, bool)>);

struct Builder<'a, 'f, F> {
    flow: &'a FunctionFlow<'f>,
    insn: F,
    out: SkidPaths,
    overflow: bool,
    bound: usize,
}

/// Enumerate the paths into `ip` (an instruction start of `flow`'s function), walking back at
/// most `MAX_SKID` instructions. `insn` decodes the instruction at an address.
pub fn build(ip: u64, flow: &FunctionFlow, mut insn: impl FnMut(u64) -> Option<Insn>) -> SkidPaths {
    let mut b = Builder {
        flow,
        insn: &mut insn,
        out: SkidPaths::default(),
        overflow: false,
        bound: MAX_SKID,
    };
    b.run(ip);
    if b.overflow {
        b.out = SkidPaths::default();
        b.overflow = false;
        b.bound = 1;
        b.run(ip);
        if b.overflow {
            return SkidPaths {
                fixed: Some(None),
                ..SkidPaths::default()
            };
        }
    }
    let mut out = b.out;
    let first = out.paths.first().map(|p| p.end);
    if out.paths.iter().all(|p| Some(p.end) == first) {
        out.fixed = Some(first.flatten());
    }
    out
}

impl<F: FnMut(u64) -> Option<Insn>> Builder<'_, '_, F> {
    fn run(&mut self, ip: u64) {
        let s = State {
            off: [0; 24],
            lost: 0,
            flags_known: true,
            checks: Vec::new(),
            end: None,
            past_end: 0,
        };
        self.walk(ip, s, 0);
    }

    /// Close a path.
    fn finish(&mut self, s: State) {
        if self.out.paths.len() >= MAX_PATHS {
            self.overflow = true;
            return;
        }
        let end = s
            .end
            .map(|e| match self.out.ends.iter().position(|x| *x == e) {
                Some(i) => i as u16,
                None => {
                    self.out.ends.push(e);
                    (self.out.ends.len() - 1) as u16
                }
            });
        let from = self.out.checks.len() as u32;
        self.out.checks.extend_from_slice(&s.checks);
        self.out.paths.push(Path {
            checks: from..self.out.checks.len() as u32,
            end,
        });
    }

    /// The instructions that can run right before the one at `pc`, with the branch decision
    /// each edge needs. `outside`: control can also come from code the sweep cannot see (the
    /// function's callers, or a callee returning to the instruction after a call).
    fn preds(&mut self, pc: u64) -> (Vec<Pred>, bool) {
        let f = self.flow;
        let mut v = Vec::new();
        let mut outside = pc == f.start;
        let i = f.starts.partition_point(|&x| x < pc);
        if i > 0 {
            if let Some(x) = (self.insn)(f.starts[i - 1]) {
                if x.next_ip() == pc {
                    if x.falls_through {
                        let edge = match (x.branch_cond, x.branch_target) {
                            (Some(cc), Some(t)) if t != pc => Some((cc, false)),
                            _ => None,
                        };
                        v.push((x, edge));
                    } else if x.mem().iter().any(|m| m.is_stack() && m.op == Op::Store) {
                        // A call (it pushes the return address): the callee's `ret` ran just
                        // before `pc`.
                        outside = true;
                    }
                }
            }
        }
        let from = f.branches.partition_point(|b| b.0 < pc);
        for &(_, src, next, cc) in f.branches[from..].iter().take_while(|b| b.0 == pc) {
            if next == pc && cc.is_some() {
                continue; // a jcc to its own next instruction: already the fall-through edge
            }
            if let Some(x) = (self.insn)(src) {
                v.push((x, cc.map(|c| (c, true))));
            }
        }
        (v, outside)
    }

    fn walk(&mut self, pc: u64, s: State, depth: usize) {
        if self.overflow {
            return;
        }
        let done = match s.end {
            Some(_) => s.past_end >= VALIDATE,
            None => depth >= self.bound,
        };
        if done {
            return self.finish(s);
        }
        let (preds, outside) = self.preds(pc);
        if outside {
            // Feasible with nothing more known; it ends the walk here.
            self.finish(s.clone());
        }
        if preds.is_empty() && !outside {
            return self.finish(s);
        }
        for (x, edge) in preds {
            let mut n = s.clone();
            if let (Some((cc, taken)), true) = (edge, n.flags_known) {
                n.checks.push(Check::Branch { cc, taken });
            }
            if n.end.is_some() {
                n.past_end += 1;
            } else if x.n_mem > 0 {
                n.end = Some(self.access(&x, &n));
            }
            step_back(&x, &mut n);
            self.walk(x.pc, n, depth + 1);
        }
    }

    /// `x` is the most recent access on the path; state `s` is just after it ran.
    fn access(&self, x: &Insn, s: &State) -> Skidded {
        let mut adjust = [None; 2];
        for (i, m) in x.mem().iter().enumerate() {
            if !x.address_survives(m) || m.address_regs() & s.lost != 0 {
                continue;
            }
            let off = |r: Option<Reg>| r.map_or(0, |r| s.off[r as usize]);
            adjust[i] = Some((off(m.base), off(m.index)));
        }
        Skidded { insn: *x, adjust }
    }
}

/// Move state `s` from just after `x` to just before it.
fn step_back(x: &Insn, s: &mut State) {
    let mut writes = x.writes_regs & !(1 << Reg::Ip as u32);
    if let Some((r, e)) = x.reg_effect {
        let (b, i) = (1u32 << r as u32, r as usize);
        let known = s.lost & b == 0;
        match e {
            // before = after - k
            RegEffect::Add(k) => {
                writes &= !b;
                s.off[i] = s.off[i].wrapping_sub(k);
            }
            RegEffect::Set(k) if known => s.checks.push(Check::RegIs {
                r,
                v: k.wrapping_sub(s.off[i]),
            }),
            // A copy from other registers says nothing about the old value: a plain write.
            RegEffect::Set(_) | RegEffect::Sum { .. } => {}
        }
    }
    s.lost |= writes;
    if x.writes_flags {
        s.flags_known = false;
    }
}

#[cfg(test)]
mod tests;
