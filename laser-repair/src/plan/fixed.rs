//! Fixed-address regions: when every store of the region writes `[base + index*scale + disp]`
//! with base and index registers no region instruction writes (or `[rip + disp]`, a global),
//! each store always writes the
//! same bytes during one pass through the region (every exit flushes). An SSE/AVX store
//! counts as its 8-byte pieces (`wide.rs`), each a location keyed by [`piece_key`]; a vector
//! load's pieces are loads like any other. Such a store's
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
//!     load  [rdx+0x10]: c = slot0; c < 8 ? read memory : value of entry c/8 - 1
//!     load  [rdi]     : [rdi, rdi+1) against [rdx+0x10, rdx+0x38): one lea/sub/cmp
//!     store [rdx+0x10]: tail is slot0's entry ? merge : append, slot0 = new entry
//! ```
//!
//! The log's entry count lives in a register `rc` (the first reserved register; written to
//! the state before and read back after every helper call). A slot holds `(i + 1) * 8` for
//! entry `i` of the current flush period (entry address `rs + slot*4 + ENTRIES - 32`), or 1
//! ("none": never a multiple of 8); claiming a state and every flush reset the slots to 1. Each
//! slot has a shadow: the value of its youngest entry, written with it, so a forwarding
//! load is `cmp [slot],8; jb memory; mov v,[shadow]` and does not wait for the slot.
//! Forwarding from the slot's entry is right because no other location of the group
//! overlaps it (checked statically; otherwise such loads always take the helper) and no
//! other group overlaps it (checked at run time by the range tests). In a single-block
//! loop the slot test becomes `cmp rc,d` (see `single_block_distances`) and the value is read
//! from the entry itself, `d` appends back: such a region's stores write neither slot nor
//! shadow, three words per buffered store (address, size, value). Code generation:
//! `fixed_emit.rs`.

use super::cfg::Cfg;
use super::classify::Treatment;
use super::frame::{self, Frame};
use super::region::Region;
use super::ssb_layout::MAX_FIXED_SLOTS;
use super::wide::{piece_size, pieces};
use iced_x86::{Instruction, InstructionInfoFactory, OpAccess, Register};
use std::collections::HashMap;

/// Range tests per load are paid on every access: more groups than this is not worth it.
const MAX_GROUPS: usize = 4;

/// What a location's address is relative to: a register no region instruction writes, or
/// the value of a frame slot `[rbp + d]` that a register is reloaded from before each access
/// (`frame.rs`: the -O0 pattern; the slot is stored by nothing in the region).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Base {
    Reg(Register),
    Slot(i64),
}

impl Base {
    pub fn is_rip(self) -> bool {
        self == Base::Reg(Register::RIP)
    }
}

/// Locations sharing base and index registers, and the bytes `[lo, hi)` (displacements)
/// their stores cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    pub base: Base,
    pub index: Register,
    pub scale: u32,
    pub lo: i64,
    pub hi: i64,
}

/// How one region instruction's memory operand is served in a fixed region. The default is
/// an access with no fixed location: range-tested against the store groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Access {
    /// Own group, if the address is fixed.
    pub group: Option<usize>,
    /// The location's slot (stores; loads of exactly a store location).
    pub slot: Option<u32>,
    /// Reads may forward from the slot's entry (no other location of the group overlaps).
    pub forward: bool,
    /// Reads overlap a location of their own group partially: always the helper.
    pub helper: bool,
    /// Stores: test for a tail merge (the same location may have stored just before).
    /// Skipping it is always correct (appending is); it only costs log room.
    pub merge: bool,
    /// Forwarding loads of a single-block loop: the location has an entry this flush period
    /// iff the count register is at least this (the last `d` appends are always the same
    /// stores, the location's among them).
    pub distance: Option<u32>,
}

#[derive(Debug, Clone, Default)]
pub struct Fixed {
    pub groups: Vec<Group>,
    pub by_insn: HashMap<usize, Access>,
    /// Most stores on any path through the region that crosses no back-edge: with at least
    /// this much room in the log at every entry and back-edge (count 0 after a flush), stores
    /// need no full-log test.
    pub max_path_stores: u32,
    /// Every forwarding load has a `distance`: stores need not write their slots.
    pub slotless: bool,
    /// The region's frame accesses (`frame.rs`), which run verbatim: every entry then checks
    /// that no group's bytes meet the frame's, else the thread runs the native copy.
    pub frame: Option<Frame>,
}

type Loc = (Base, Register, u32, i64, u32);

/// `by_insn` key of piece `j` of vector instruction `k` (`wide.rs`): each piece of a vector
/// access is an access of its own (a store piece is a store location).
pub fn piece_key(k: usize, j: u32) -> usize {
    usize::MAX / 2 + k * 4 + j as usize
}

/// The accesses of instruction `k` as `(by_insn key, location)`: one for a GPR operand, one
/// per piece for a vector operand. `None` inside: no fixed location.
fn accesses_of(
    k: usize,
    i: &Instruction,
    size: u32,
    vector: bool,
    base: &dyn Fn(Register) -> Option<Base>,
) -> Vec<(usize, Option<Loc>)> {
    if !vector {
        return vec![(k, loc_of(i, size, base))];
    }
    let p = piece_size(size);
    (0..pieces(size))
        .map(|j| {
            let l = loc_of(i, p, base).map(|mut l| {
                l.3 = l.3.wrapping_add(i64::from(j * p));
                l
            });
            (piece_key(k, j), l)
        })
        .collect()
}

/// The location of `i`'s operand; `base` says what a base register stands for at `i`
/// (itself when the region never writes it, a frame slot's value, or `None`: it moves).
fn loc_of(i: &Instruction, size: u32, base: &dyn Fn(Register) -> Option<Base>) -> Option<Loc> {
    let (b, x) = (i.memory_base(), i.memory_index());
    let ok = |r: Register| r == Register::None || (r.is_gpr64() && r != Register::RSP);
    if i.segment_prefix() != Register::None || !ok(x) {
        return None;
    }
    // rip-relative: an absolute address (iced's displacement is the target).
    if b == Register::RIP && x == Register::None {
        return Some((Base::Reg(b), x, 1, i.memory_displacement64() as i64, size));
    }
    if !b.is_gpr64() || b == Register::RSP {
        return None;
    }
    let s = if x == Register::None {
        1
    } else {
        // An index must be a register the region never writes.
        if base(x) != Some(Base::Reg(x)) {
            return None;
        }
        i.memory_index_scale()
    };
    Some((base(b)?, x, s, i.memory_displacement64() as i64, size))
}

/// Plans a fixed region, or `None` when some store's address moves within the region (or
/// there are too many locations or groups).
pub fn analyze(cfg: &Cfg, tr: &[Treatment], region: &Region) -> Option<Fixed> {
    let insns = &cfg.insns;
    let region_insns: Vec<usize> = region
        .blocks
        .iter()
        .flat_map(|&b| cfg.blocks[b].insns.clone())
        .collect();
    let frame = frame::analyze(cfg, tr, &region_insns);
    let block_of = |k: usize| {
        region
            .blocks
            .iter()
            .map(|&b| cfg.blocks[b].insns.clone())
            .find(|r| r.contains(&k))
    };
    let derived = |k: usize, r: Register| -> Option<i64> {
        frame::derived_slot(cfg, tr, frame.as_ref()?, block_of(k)?, k, r)
    };
    let no_bypass = std::collections::HashSet::new();
    let bypass = frame.as_ref().map_or(&no_bypass, |f| &f.bypass);
    let mut fixed = analyze_insns(insns, tr, &region_insns, bypass, &derived)?;
    fixed.frame = frame.clone();
    // Longest store count over forward edges (a back-edge targets a block starting at or
    // before its source, as the rewriter's stubs define it); blocks are in address order.
    let mut best: HashMap<usize, u32> = HashMap::new();
    for &b in &region.blocks {
        let blk = &cfg.blocks[b];
        let own = blk
            .insns
            .clone()
            .filter(|k| !bypass.contains(k))
            .map(|k| tr[k].log_entries())
            .sum::<u32>();
        let from = blk
            .preds
            .iter()
            .filter(|&&p| region.contains_block(p) && cfg.blocks[p].start < blk.start)
            .filter_map(|p| best.get(p))
            .max()
            .copied()
            .unwrap_or(0);
        best.insert(b, from + own);
    }
    fixed.max_path_stores = best.values().max().copied().unwrap_or(0);
    // Merge tests: only where the previous store of the block is the same location, or the
    // region has one location (counter loops, where every store merges).
    let locs = fixed
        .by_insn
        .values()
        .filter_map(|a| a.slot)
        .max()
        .map_or(0, |m| m + 1);
    for &b in &region.blocks {
        let mut prev: Option<u32> = None;
        for k in cfg.blocks[b].insns.clone() {
            let keys: Vec<usize> = match tr[k] {
                Treatment::Ssb {
                    write: true,
                    vector: true,
                    size,
                    ..
                } => (0..pieces(size)).map(|j| piece_key(k, j)).collect(),
                Treatment::Ssb { write: true, .. } => vec![k],
                _ => continue,
            };
            for key in keys {
                if let Some(acc) = fixed.by_insn.get_mut(&key) {
                    acc.merge = locs == 1 || (prev.is_some() && prev == acc.slot);
                    prev = acc.slot;
                }
            }
        }
    }
    single_block_distances(cfg, tr, region, &mut fixed);
    Some(fixed)
}

/// A region of one block that branches back to itself, with no flush point and no merge
/// test: every iteration appends the same stores in the same order, and the count register
/// counts appends since the last flush (entries mid-block start at 0). So a location stored
/// `d` appends before a load (this iteration or the previous one) has an entry iff
/// `rc >= d`: the load tests a register instead of the slot, and stores skip the slot.
///
/// A chain of blocks that fall into one another and whose last block branches back to the
/// first (gcc -O0's `for`: body, then the condition at the bottom) is one such block: the
/// instructions are taken in chain order.
fn single_block_distances(cfg: &Cfg, tr: &[Treatment], region: &Region, fixed: &mut Fixed) {
    let Some(chain) = fall_through_chain(cfg, region) else {
        return;
    };
    let head = cfg.blocks[chain[0]].start;
    let ks: Vec<usize> = chain
        .iter()
        .flat_map(|&b| cfg.blocks[b].insns.clone())
        .collect();
    let Some(&last) = ks.last() else { return };
    // (Vector accesses keep their slots: their pieces are not in the store list below.)
    let straight = ks.iter().all(|&k| {
        matches!(
            tr[k],
            Treatment::Verbatim | Treatment::Ssb { vector: false, .. } | Treatment::DirectBranch
        )
    });
    let loops = tr[last] == Treatment::DirectBranch && cfg.insns[last].near_branch_target() == head;
    // Only the last instruction may branch: every other block falls into the next one.
    let branches = ks
        .iter()
        .filter(|&&k| tr[k] == Treatment::DirectBranch)
        .count();
    let merges = ks
        .iter()
        .filter(|&&k| tr[k].is_store())
        .filter_map(|k| fixed.by_insn.get(k))
        .any(|a| a.merge);
    if !straight || !loops || merges || branches != 1 {
        return;
    }
    // (position in the block, slot) of every store, in order.
    let stores: Vec<(usize, u32)> = ks
        .iter()
        .enumerate()
        .filter(|&(_, &k)| tr[k].is_store())
        .filter_map(|(p, k)| fixed.by_insn.get(k).and_then(|a| a.slot).map(|s| (p, s)))
        .collect();
    let mut all = true;
    for (p, &k) in ks.iter().enumerate() {
        let Treatment::Ssb { read: true, .. } = tr[k] else {
            continue;
        };
        let Some(acc) = fixed.by_insn.get_mut(&k) else {
            continue;
        };
        let (true, Some(x)) = (acc.forward, acc.slot) else {
            continue;
        };
        let before = |q: usize| stores.iter().filter(|&&(sp, _)| sp >= q && sp < p).count();
        // This iteration (a store strictly before the load), else the previous one (an RMW
        // at p stores after it reads, so its own store counts as the previous iteration's).
        let d = match stores.iter().rev().find(|&&(sp, s)| sp < p && s == x) {
            Some(&(q, _)) => before(q),
            None => match stores.iter().rev().find(|&&(_, s)| s == x) {
                Some(&(q, _)) => stores.iter().filter(|&&(sp, _)| sp >= q).count() + before(0),
                None => {
                    all = false;
                    continue;
                }
            },
        };
        acc.distance = Some(d as u32);
    }
    fixed.slotless = all;
}

/// `bypass`: frame accesses, left out (they run verbatim); `derived(k, r)`: the frame slot
/// register `r` holds at instruction `k`, if it was reloaded from an unchanged one.
/// The region's blocks in the order control passes through them when each falls into the
/// next (block `i` ends where block `i + 1` starts, in address order), or `None`.
fn fall_through_chain(cfg: &Cfg, region: &Region) -> Option<Vec<usize>> {
    let blocks = &region.blocks;
    let first = *blocks.first()?;
    let mut chain = vec![first];
    for w in blocks.windows(2) {
        if cfg.blocks[w[0]].end != cfg.blocks[w[1]].start {
            return None;
        }
        chain.push(w[1]);
    }
    Some(chain)
}

fn analyze_insns(
    insns: &[Instruction],
    tr: &[Treatment],
    region_insns: &[usize],
    bypass: &std::collections::HashSet<usize>,
    derived: &dyn Fn(usize, Register) -> Option<i64>,
) -> Option<Fixed> {
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
    let moves =
        |r: Register| r.is_gpr64() && written & (1 << (r.number() - Register::RAX.number())) != 0;
    let base_at = |k: usize| {
        move |r: Register| -> Option<Base> {
            if !moves(r) {
                Some(Base::Reg(r))
            } else {
                derived(k, r).map(Base::Slot)
            }
        }
    };
    let mut locs: Vec<Loc> = Vec::new();
    for &k in region_insns {
        if bypass.contains(&k) {
            continue;
        }
        if let Treatment::Ssb {
            size,
            write: true,
            vector,
            ..
        } = tr[k]
        {
            for (_, l) in accesses_of(k, &insns[k], size, vector, &base_at(k)) {
                let l = l?;
                if !locs.contains(&l) {
                    locs.push(l);
                }
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
    let access = |l: Option<Loc>| match l {
        None => Access::default(),
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
                merge: true,
                distance: None,
            }
        }
    };
    let mut by_insn = HashMap::new();
    for &k in region_insns {
        let Treatment::Ssb { size, vector, .. } = tr[k] else {
            continue;
        };
        if bypass.contains(&k) {
            continue;
        }
        for (key, l) in accesses_of(k, &insns[k], size, vector, &base_at(k)) {
            by_insn.insert(key, access(l));
        }
    }
    Some(Fixed {
        groups,
        by_insn,
        max_path_stores: u32::MAX,
        slotless: false,
        frame: None,
    })
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
            vector: false,
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
        analyze_insns(insns, &tr, &all, &Default::default(), &|_, _| None)
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
