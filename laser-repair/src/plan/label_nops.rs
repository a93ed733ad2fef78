//! Label-carrying `nop`s out of the rewritten code: sequences put a `nop` where a label has no
//! instruction of its own; executing it costs a decode slot on every pass.

use iced_x86::{Code, Instruction};
use std::collections::HashMap;

/// Removes the `nop`s that only carry a label (the sequences put one where a label has no
/// instruction of its own): the label moves to the next instruction, or branches to it are
/// retargeted to the next instruction's label. Jumping to a nop and jumping to the
/// instruction after it are the same. Returns the new index of every old index (a removed
/// nop maps to the instruction that replaced it).
pub(super) fn drop_label_nops(out: &mut Vec<Instruction>) -> Vec<usize> {
    let n = out.len();
    let mut alias: HashMap<u64, u64> = HashMap::new();
    let mut keep = vec![true; n];
    let mut next_kept: Option<usize> = None;
    for j in (0..n).rev() {
        let ip = out[j].ip();
        if out[j].code() == Code::Nopd && ip != 0 {
            if let Some(t) = next_kept {
                if out[t].ip() == 0 {
                    out[t].set_ip(ip);
                } else {
                    alias.insert(ip, out[t].ip());
                }
                keep[j] = false;
                continue;
            }
        }
        next_kept = Some(j);
    }
    for ins in out.iter_mut() {
        if ins.op0_kind() == iced_x86::OpKind::NearBranch64 {
            if let Some(&t) = alias.get(&ins.near_branch_target()) {
                ins.set_near_branch64(t);
            }
        }
        if ins.is_ip_rel_memory_operand() {
            if let Some(&t) = alias.get(&ins.memory_displacement64()) {
                ins.set_memory_displacement64(t);
            }
        }
    }
    let mut remap = vec![0; n];
    let mut kept = 0;
    // Backwards, so a removed nop maps to the next kept instruction's new index.
    let total = keep.iter().filter(|&&k| k).count();
    let mut next_new = total;
    for j in (0..n).rev() {
        if keep[j] {
            next_new -= 1;
            remap[j] = next_new;
        } else {
            remap[j] = next_new;
        }
    }
    let mut j = 0;
    out.retain(|_| {
        let k = keep[j];
        j += 1;
        kept += usize::from(k);
        k
    });
    debug_assert_eq!(kept, total);
    remap
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::Register;

    fn nop(l: u64) -> Instruction {
        let mut i = Instruction::with(Code::Nopd);
        i.set_ip(l);
        i
    }

    #[test]
    fn label_moves_to_next_instruction_or_branches_retarget() {
        let mov = Instruction::with2(Code::Mov_r64_rm64, Register::RAX, Register::RCX).unwrap();
        let mut labelled = mov;
        labelled.set_ip(7);
        let jmp = |t: u64| Instruction::with_branch(Code::Jmp_rel32_64, t).unwrap();
        // 0: nop@5  1: mov  2: nop@6  3: mov@7  4: jmp 5  5: jmp 6  6: nop@8 (last: kept)
        let mut out = vec![nop(5), mov, nop(6), labelled, jmp(5), jmp(6), nop(8)];
        let remap = drop_label_nops(&mut out);
        assert_eq!(out.len(), 5);
        assert_eq!(out[0].ip(), 5, "the unlabelled mov took label 5");
        assert_eq!(out[1].ip(), 7);
        assert_eq!(out[2].near_branch_target(), 5);
        assert_eq!(out[3].near_branch_target(), 7, "label 6 aliased to 7");
        assert_eq!(out[4].code(), Code::Nopd);
        assert_eq!(remap, vec![0, 0, 1, 1, 2, 3, 4]);
    }
}
