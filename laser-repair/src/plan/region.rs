//! Which blocks to rewrite, and whether rewriting them is safe and worth it.
//!
//! Region = for every contending PC, the innermost natural loop holding it (or just its block
//! when it is in no loop). A loop is what makes the SSB pay: with no flush point inside, a
//! thread buffers `backedges_per_flush` iterations of stores and the contended line changes
//! owner once per flush instead of once per store.

use super::cfg::Cfg;
use super::classify::{classify, Treatment};
use super::refusal::RefusalReason;
use iced_x86::InstructionInfoFactory;
use std::collections::BTreeSet;

#[derive(Debug, Clone, PartialEq)]
pub struct Region {
    /// Block indices into the CFG, in address order.
    pub blocks: Vec<usize>,
    /// Blocks entered from outside the region (or the function entry): these get the jmp.
    pub entries: Vec<usize>,
    /// Address ranges `[start, end)` of the region's blocks.
    pub ranges: Vec<(u64, u64)>,
    pub is_loop: bool,
    /// Static counts over the region's instructions.
    pub stores: u32,
    pub loads: u32,
    pub flush_points: u32,
    pub estimated_stores_per_flush: f64,
}

impl Region {
    pub fn contains_block(&self, b: usize) -> bool {
        self.blocks.binary_search(&b).is_ok()
    }
}

/// Treatment of every instruction of the CFG (index-aligned with `cfg.insns`).
pub fn treatments(cfg: &Cfg) -> Vec<Treatment> {
    let mut f = InstructionInfoFactory::new();
    cfg.insns.iter().map(|i| classify(i, &mut f)).collect()
}

pub fn select(
    cfg: &Cfg,
    tr: &[Treatment],
    pcs: &[u64],
    backedges_per_flush: u32,
    min_stores_per_flush: f64,
) -> Result<Region, RefusalReason> {
    if pcs.is_empty() {
        return Err(RefusalReason::NoContendingPcs);
    }
    let mut set = BTreeSet::new();
    let mut is_loop = true;
    for &pc in pcs {
        let b = cfg.block_of(pc).ok_or(RefusalReason::PcNotOnInstruction {
            pc,
            start: cfg.start,
            end: cfg.end,
        })?;
        match cfg.innermost_loop(b) {
            Some(body) => set.extend(body),
            None => {
                is_loop = false;
                set.insert(b);
            }
        }
    }
    let blocks: Vec<usize> = set.into_iter().collect();
    let (mut stores, mut loads, mut flush_points) = (0u32, 0u32, 0u32);
    for &b in &blocks {
        for k in cfg.blocks[b].insns.clone() {
            let i = &cfg.insns[k];
            match tr[k] {
                Treatment::Unsupported(why) => {
                    return Err(RefusalReason::UnsupportedInstruction {
                        pc: i.ip(),
                        text: i.to_string(),
                        why,
                    })
                }
                Treatment::IndirectJump => {
                    return Err(RefusalReason::IndirectJump {
                        pc: i.ip(),
                        text: i.to_string(),
                    })
                }
                Treatment::Ssb { read, write, .. } => {
                    stores += u32::from(write);
                    loads += u32::from(read);
                }
                Treatment::FlushBefore | Treatment::ExitToOriginal => flush_points += 1,
                Treatment::Verbatim | Treatment::DirectBranch => {}
            }
        }
    }
    let entries: Vec<usize> = blocks
        .iter()
        .copied()
        .filter(|&b| {
            cfg.blocks[b].start == cfg.start
                || cfg.blocks[b]
                    .preds
                    .iter()
                    .any(|p| blocks.binary_search(p).is_err())
        })
        .collect();
    // A region nobody can enter is a region threads only reach through the pc map (e.g. the
    // loop is the function's whole body but reached by a tail jump from elsewhere): patch
    // its first block so new arrivals are redirected too.
    let entries = if entries.is_empty() {
        vec![blocks[0]]
    } else {
        entries
    };
    let estimated = if !is_loop {
        f64::from(stores)
    } else if flush_points == 0 {
        f64::from(stores) * f64::from(backedges_per_flush)
    } else {
        f64::from(stores) / f64::from(flush_points)
    };
    if estimated < min_stores_per_flush {
        return Err(RefusalReason::TooFewStoresPerFlush {
            estimated,
            minimum: min_stores_per_flush,
        });
    }
    let ranges = blocks
        .iter()
        .map(|&b| (cfg.blocks[b].start, cfg.blocks[b].end))
        .collect();
    Ok(Region {
        blocks,
        entries,
        ranges,
        is_loop,
        stores,
        loads,
        flush_points,
        estimated_stores_per_flush: estimated,
    })
}
