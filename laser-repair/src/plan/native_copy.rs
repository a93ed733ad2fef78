//! The uninstrumented copy of the region, where threads without SSB state run.

use super::cfg::Cfg;
use super::classify::Treatment;
use super::refusal::RefusalReason;
use super::region::Region;
use super::rewrite::Emitter;
use iced_x86::FlowControl;
use std::collections::HashMap;

/// The region once more, uninstrumented: for threads without SSB state. Branches stay inside
/// the copy or go straight to original code; nothing is flushed (such a thread has no log).
/// Returns, for each entry of `e.first`, the index of its instruction in the copy.
pub(super) fn emit_native_copy(
    e: &mut Emitter<'_>,
    cfg: &Cfg,
    tr: &[Treatment],
    region: &Region,
) -> Result<Vec<usize>, RefusalReason> {
    let in_region = |ip: u64| region.blocks.iter().any(|&b| cfg.blocks[b].start == ip);
    let mut at: HashMap<u64, usize> = HashMap::new();
    for (pos, &b) in region.blocks.iter().enumerate() {
        let blk = &cfg.blocks[b];
        let mut falls_through = true;
        for k in blk.insns.clone() {
            let i = cfg.insns[k];
            let label = e.native_label(i.ip());
            at.insert(i.ip(), e.out.len());
            let mut c = i;
            match tr[k] {
                Treatment::DirectBranch => {
                    let t = i.near_branch_target();
                    let nt = if in_region(t) { e.native_label(t) } else { t };
                    c.set_near_branch64(nt);
                    falls_through = i.flow_control() == FlowControl::ConditionalBranch;
                }
                Treatment::ExitToOriginal => {
                    e.exit_at_call(&i, Some(label))?;
                    falls_through = false;
                    continue;
                }
                _ => falls_through = i.flow_control() != FlowControl::Return,
            }
            e.push_at(c, label);
        }
        if falls_through {
            let next = blk.end;
            let next_is_emitted_next = region
                .blocks
                .get(pos + 1)
                .is_some_and(|&nb| cfg.blocks[nb].start == next);
            if !next_is_emitted_next {
                let t = if in_region(next) {
                    e.native_label(next)
                } else {
                    next
                };
                let j = e.jmp(t)?;
                e.push(j);
            }
        }
    }
    Ok(e.first
        .iter()
        .map(|&(ip, _)| at.get(&ip).copied().unwrap_or(0))
        .collect())
}
