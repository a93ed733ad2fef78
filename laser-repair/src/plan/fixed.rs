//! Fixed-address regions: when every store of the region writes `[base + index*scale + disp]`
//! with base and index registers no region instruction writes, each store always writes the
//! same bytes during one pass through the region (every exit flushes). Such a store's
//! *location* gets a slot in the thread's state holding where its youngest log entry is, so
//!
//! - a load of exactly that location forwards from that entry (no summary, no byte lanes);
//! - the tail-merge test is "is this location's youngest entry the tail?" (one compare);
//! - any other load checks its bytes against each group's range (locations sharing base and
//!   index registers): no overlap reads memory, an overlap calls the helper (log scan).
//!
//! ```text
//!   linear_regression: group rdx, range [rdx+0x10, rdx+0x38)
//!     SX  [rdx+0x10] slot 0   SXX [rdx+0x20] slot 1   SY [rdx+0x18] slot 2 ...
//!     load  [rdx+0x10]: c = slot0; c < 32 ? read memory : value of entry c/32 - 1
//!     load  [rdi]     : [rdi, rdi+1) against [rdx+0x10, rdx+0x38): one lea/sub/cmp
//!     store [rdx+0x10]: tail is slot0's entry ? merge : append, slot0 = new entry
//! ```
//!
//! A slot holds `(i + 1) * 32` for entry `i` of the current flush period, or 1 ("none": odd,
//! so it never equals a tail offset). `ssb_enter` and every flush reset the slots to 1.
//! Forwarding from the slot's entry is right because no other location of the group
//! overlaps it (checked statically; otherwise such loads always take the helper) and no
//! other group overlaps it (checked at run time by the range tests).

use super::classify::Treatment;
use super::insn::{br, i2, mem, mi, mr, ri, rm};
use super::refusal::RefusalReason;
use super::rewrite::sized;
use super::ssb_layout::{fixed_slots_offset, MAX_FIXED_SLOTS, ST_COUNT, ST_ENTRIES, ST_LIMIT};
use iced_x86::{Code, Instruction, InstructionInfoFactory, MemoryOperand, OpAccess, Register};
use std::collections::HashMap;

/// Range tests per load are paid on every access: more groups than this is not worth it.
const MAX_GROUPS: usize = 4;

/// Locations sharing base and index registers, and the bytes `[lo, hi)` (displacements)
/// their stores cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    pub base: Register,
    pub index: Register,
    pub scale: u32,
    pub lo: i64,
    pub hi: i64,
}

/// How one region instruction's memory operand is served in a fixed region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// Own group, if the address is fixed.
    pub group: Option<usize>,
    /// The location's slot (stores; loads of exactly a store location).
    pub slot: Option<u32>,
    /// Reads may forward from the slot's entry (no other location of the group overlaps).
    pub forward: bool,
    /// Reads overlap a location of their own group partially: always the helper.
    pub helper: bool,
}

#[derive(Debug, Clone, Default)]
pub struct Fixed {
    pub groups: Vec<Group>,
    pub by_insn: HashMap<usize, Access>,
}

type Loc = (Register, Register, u32, i64, u32);

fn loc_of(i: &Instruction, size: u32) -> Option<Loc> {
    let (b, x) = (i.memory_base(), i.memory_index());
    let ok = |r: Register| r == Register::None || (r.is_gpr64() && r != Register::RSP);
    if !b.is_gpr64() || b == Register::RSP || !ok(x) || i.segment_prefix() != Register::None {
        return None;
    }
    let s = if x == Register::None {
        1
    } else {
        i.memory_index_scale()
    };
    Some((b, x, s, i.memory_displacement64() as i64, size))
}

/// Plans a fixed region, or `None` when some store's address moves within the region (or
/// there are too many locations or groups).
pub fn analyze(insns: &[Instruction], tr: &[Treatment], region_insns: &[usize]) -> Option<Fixed> {
    let mut f = InstructionInfoFactory::new();
    let mut written = 0u64;
    for &k in region_insns {
        for r in f.info(&insns[k]).used_registers() {
            if matches!(
                r.access(),
                OpAccess::Write
                    | OpAccess::CondWrite
                    | OpAccess::ReadWrite
                    | OpAccess::ReadCondWrite
            ) {
                let full = r.register().full_register();
                if full.is_gpr64() {
                    written |= 1 << (full.number() - Register::RAX.number());
                }
            }
        }
    }
    let moves = |r: Register| {
        r != Register::None && written & (1 << (r.number() - Register::RAX.number())) != 0
    };
    let mut locs: Vec<Loc> = Vec::new();
    for &k in region_insns {
        if let Treatment::Ssb {
            size, write: true, ..
        } = tr[k]
        {
            let l = loc_of(&insns[k], size)?;
            if moves(l.0) || moves(l.1) {
                return None;
            }
            if !locs.contains(&l) {
                locs.push(l);
            }
        }
    }
    if locs.is_empty() || locs.len() > MAX_FIXED_SLOTS as usize {
        return None;
    }
    let mut groups: Vec<Group> = Vec::new();
    for &(base, index, scale, d, size) in &locs {
        let hi = d + i64::from(size);
        match groups
            .iter_mut()
            .find(|g| (g.base, g.index, g.scale) == (base, index, scale))
        {
            Some(g) => {
                g.lo = g.lo.min(d);
                g.hi = g.hi.max(hi);
            }
            None => groups.push(Group {
                base,
                index,
                scale,
                lo: d,
                hi,
            }),
        }
    }
    if groups.len() > MAX_GROUPS || groups.iter().any(|g| g.hi - g.lo > 1 << 20) {
        return None;
    }
    let overlaps = |a: &Loc, b: &Loc| {
        (a.0, a.1, a.2) == (b.0, b.1, b.2)
            && a.3 < b.3 + i64::from(b.4)
            && b.3 < a.3 + i64::from(a.4)
    };
    let mut by_insn = HashMap::new();
    for &k in region_insns {
        let Treatment::Ssb { size, .. } = tr[k] else {
            continue;
        };
        let i = &insns[k];
        let l = loc_of(i, size).filter(|l| !moves(l.0) && !moves(l.1));
        let acc = match l {
            None => Access {
                group: None,
                slot: None,
                forward: false,
                helper: false,
            },
            Some(l) => {
                let group = groups
                    .iter()
                    .position(|g| (g.base, g.index, g.scale) == (l.0, l.1, l.2));
                let slot = locs.iter().position(|x| *x == l).map(|s| s as u32);
                let others = locs.iter().filter(|x| **x != l && overlaps(x, &l)).count();
                Access {
                    group,
                    slot,
                    forward: slot.is_some() && others == 0,
                    helper: others > 0 || (slot.is_none() && locs.iter().any(|x| overlaps(x, &l))),
                }
            }
        };
        by_insn.insert(k, acc);
    }
    Some(Fixed { groups, by_insn })
}

/// Registers and labels of one access's fixed-region code.
pub(super) struct FixedRegs {
    pub(super) rs: Register,
    pub(super) a: Register,
    pub(super) c: Register,
    pub(super) m: Register,
    pub(super) v: Register,
    pub(super) slots: i64,
}

impl FixedRegs {
    fn slot(&self, s: u32) -> MemoryOperand {
        mem(self.rs, Register::None, self.slots + 8 * i64::from(s))
    }

    fn entry(&self, d: i32) -> MemoryOperand {
        mem(self.rs, self.c, i64::from(ST_ENTRIES + d))
    }

    /// Range tests of a `size`-byte load at `a` against every group but `skip`: an overlap
    /// goes to `helper`. `[a, a+size)` meets `[B+lo, B+hi)` iff
    /// `a + size - 1 - lo - B` (unsigned) `< hi - lo + size - 1`.
    pub(super) fn range_tests(
        &self,
        groups: &[Group],
        skip: Option<usize>,
        size: u32,
        helper: u64,
    ) -> Result<Vec<Instruction>, RefusalReason> {
        let mut out = Vec::new();
        for (n, g) in groups.iter().enumerate() {
            if Some(n) == skip {
                continue;
            }
            let k = i64::from(size) - 1 - g.lo;
            let w = (g.hi - g.lo + i64::from(size) - 1) as i32;
            out.push(rm(Code::Lea_r64_m, self.c, mem(self.a, Register::None, k))?);
            if g.index == Register::None {
                out.push(i2(Code::Sub_r64_rm64, self.c, g.base)?);
            } else {
                out.push(rm(
                    Code::Lea_r64_m,
                    self.m,
                    MemoryOperand::new(g.base, g.index, g.scale, 0, 0, false, Register::None),
                )?);
                out.push(i2(Code::Sub_r64_rm64, self.c, self.m)?);
            }
            out.push(ri(Code::Cmp_rm64_imm32, self.c, w)?);
            out.push(br(Code::Jb_rel32_64, helper)?);
        }
        Ok(out)
    }

    /// `v` = the slot's youngest entry's value, or jump to `direct` when it has none.
    pub(super) fn forward(
        &self,
        slot: u32,
        direct: u64,
        back: u64,
    ) -> Result<Vec<Instruction>, RefusalReason> {
        Ok(vec![
            rm(Code::Mov_r64_rm64, self.c, self.slot(slot))?,
            ri(Code::Cmp_rm64_imm8, self.c, 32)?,
            br(Code::Jb_rel32_64, direct)?,
            rm(Code::Mov_r64_rm64, self.v, self.entry(-16))?,
            br(Code::Jmp_rel32_64, back)?,
        ])
    }

    /// Hot store of `v` (`size` bytes at `a`) to location `slot`: merge into the tail entry
    /// if it is this location's, else append (`full` when the log is full: flush, then come
    /// back to `retry`, the first instruction). Returns (hot, merge-and-done label users).
    pub(super) fn store(
        &self,
        slot: u32,
        size: u32,
        labels: &StoreLabels,
    ) -> Result<Vec<Instruction>, RefusalReason> {
        let count = mem(self.rs, Register::None, ST_COUNT.into());
        let mut first = rm(Code::Mov_r64_rm64, self.c, count)?;
        first.set_ip(labels.retry);
        let mut merge = mr(Code::Mov_rm64_r64, self.entry(-16), self.v)?;
        merge.set_ip(labels.merge);
        Ok(vec![
            first,
            ri(Code::Shl_rm64_imm8, self.c, 5)?,
            rm(Code::Cmp_r64_rm64, self.c, self.slot(slot))?,
            br(Code::Je_rel32_64, labels.merge)?,
            rm(
                Code::Cmp_r64_rm64,
                self.c,
                mem(self.rs, Register::None, ST_LIMIT.into()),
            )?,
            br(Code::Jae_rel32_64, labels.full)?,
            mr(Code::Mov_rm64_r64, self.entry(0), self.a)?,
            mi(Code::Mov_rm64_imm32, self.entry(8), size as i32)?,
            mr(Code::Mov_rm64_r64, self.entry(16), self.v)?,
            ri(Code::Add_rm64_imm8, self.c, 32)?,
            mr(Code::Mov_rm64_r64, self.slot(slot), self.c)?,
            mi(Code::Add_rm64_imm8, count, 1)?,
            br(Code::Jmp_rel32_64, labels.back)?,
            merge,
        ])
    }
}

pub(super) struct StoreLabels {
    pub(super) retry: u64,
    pub(super) merge: u64,
    pub(super) full: u64,
    pub(super) back: u64,
}

/// `[rs + off]` of slot 0, for the runtime's resets.
pub fn slots_offset(cfg: &super::ssb_layout::RuntimeConfig) -> i64 {
    i64::from(fixed_slots_offset(cfg))
}

/// The direct read of `size` bytes at `a` into `v` (zero-extended, as the lanes path does).
pub(super) fn direct_load(
    a: Register,
    v: Register,
    size: u32,
) -> Result<Instruction, RefusalReason> {
    let am = MemoryOperand::with_base(a);
    match size {
        1 => rm(Code::Movzx_r32_rm8, sized(v, 4), am),
        2 => rm(Code::Movzx_r32_rm16, sized(v, 4), am),
        4 => rm(Code::Mov_r32_rm32, sized(v, 4), am),
        _ => rm(Code::Mov_r64_rm64, v, am),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::code_asm::*;

    fn decode(build: impl Fn(&mut CodeAssembler)) -> Vec<Instruction> {
        let mut a = CodeAssembler::new(64).unwrap();
        build(&mut a);
        let bytes = a.assemble(0x1000).unwrap();
        iced_x86::Decoder::with_ip(64, &bytes, 0x1000, 0)
            .into_iter()
            .collect()
    }

    fn ssb(i: &Instruction) -> Treatment {
        let size = i.memory_size().size() as u32;
        let write = i.op0_kind() == iced_x86::OpKind::Memory;
        Treatment::Ssb {
            op: if write { 0 } else { 1 },
            size,
            read: !write || i.mnemonic() != iced_x86::Mnemonic::Mov,
            write,
        }
    }

    fn plan(insns: &[Instruction]) -> Option<Fixed> {
        let tr: Vec<Treatment> = insns
            .iter()
            .map(|i| {
                if i.op_count() == 2
                    && (i.op0_kind() == iced_x86::OpKind::Memory
                        || i.op1_kind() == iced_x86::OpKind::Memory)
                {
                    ssb(i)
                } else {
                    Treatment::Verbatim
                }
            })
            .collect();
        let all: Vec<usize> = (0..insns.len()).collect();
        analyze(insns, &tr, &all)
    }

    #[test]
    fn invariant_base_stores_get_slots_and_moving_loads_range_tests() {
        let insns = decode(|a| {
            a.mov(rsi, qword_ptr(rdx + 0x10)).unwrap();
            a.movzx(ecx, byte_ptr(rdi)).unwrap();
            a.add(rdi, 1).unwrap();
            a.add(rsi, rcx).unwrap();
            a.mov(qword_ptr(rdx + 0x10), rsi).unwrap();
            a.mov(qword_ptr(rdx + 0x18), rcx).unwrap();
            a.mov(eax, dword_ptr(rdx + 0x14)).unwrap();
        });
        let f = plan(&insns).expect("fixed region");
        assert_eq!(f.groups.len(), 1);
        assert_eq!((f.groups[0].lo, f.groups[0].hi), (0x10, 0x20));
        let load = f.by_insn[&0];
        assert_eq!(
            (load.slot, load.forward, load.helper),
            (Some(0), true, false)
        );
        // [rdi] moves (add rdi): no group, range tests against every group.
        assert_eq!(f.by_insn[&1].group, None);
        assert_eq!(f.by_insn[&4].slot, Some(0));
        assert_eq!(f.by_insn[&5].slot, Some(1));
        // A 4-byte load inside slot 0's bytes: a partial overlap, always the helper.
        assert!(f.by_insn[&6].helper);
    }

    #[test]
    fn a_store_through_a_moving_base_is_not_fixed() {
        let insns = decode(|a| {
            a.mov(qword_ptr(rdi), rsi).unwrap();
            a.add(rdi, 8).unwrap();
        });
        assert!(plan(&insns).is_none());
    }
}
