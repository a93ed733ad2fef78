//! The stack frame of an unoptimised (`-O0`) function: which accesses of a region are the
//! thread's own locals (they bypass the store buffer), and which registers only ever hold a
//! value reloaded from an unchanged local (their addresses are fixed, `fixed.rs`).
//!
//! ```text
//!   push rbp; mov rbp,rsp          rbp is the frame pointer: written nowhere else
//!   loop:                          (pop rbp / leave at the exits)
//!     mov rax,[rbp-0x10]           rax := args (the slot is stored by no region instruction)
//!     mov rdx,[rax+0x18]           [args+0x18]: a fixed location, though rax is rewritten
//!     ...                          every iteration
//!     mov rax,[rbp-0x10]
//!     mov [rax+0x18],rdx
//!     add dword [rbp-4],1          a local: bypasses the buffer
//! ```
//!
//! Thread-privacy rule (DESIGN, "Stack accesses ... may bypass the SSB only under a stated
//! thread-privacy rule"): `[rbp - d]` in a function whose prologue set rbp from rsp and that
//! writes rbp nowhere else is a local of the running thread's own frame, and no other thread
//! accesses it while the loop runs. (A program that hands the address of a local to another
//! thread and has both access it during this loop breaks the rule; such a local is a
//! shared variable in a frame, which -O0 code of the programs here does not have in its
//! loops.) Under that rule, reordering the thread's own frame accesses with its buffered
//! stores is invisible to other threads; for the thread itself the buffered stores must never
//! touch the frame, which the entry of the region checks at run time
//! ([`Frame`]: every store group's bytes against the frame's bytes; on overlap the thread runs
//! the uninstrumented copy of the region). So a frame slot no region instruction stores to
//! keeps its value for the whole pass, and a register loaded from it in the same block holds
//! the same value at every access: a derived base.

use super::cfg::Cfg;
use super::classify::Treatment;
use iced_x86::{Code, Instruction, InstructionInfoFactory, OpAccess, Register};
use std::collections::HashSet;

/// The frame accesses of a region: bypassed, and the bytes `[rbp+lo, rbp+hi)` they cover.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Frame {
    pub bypass: HashSet<usize>,
    pub lo: i64,
    pub hi: i64,
}

/// Whether rbp is this function's frame pointer: the function starts `[endbr64] push rbp;
/// mov rbp,rsp` and every other write of rbp is `pop rbp` or `leave` (an epilogue).
pub fn rbp_is_frame_pointer(cfg: &Cfg) -> bool {
    let mut it = cfg
        .insns
        .iter()
        .filter(|i| i.code() != Code::Endbr64)
        .take(2);
    let (Some(push), Some(mov)) = (it.next(), it.next()) else {
        return false;
    };
    if push.code() != Code::Push_r64 || push.op0_register() != Register::RBP {
        return false;
    }
    let is_mov = matches!(mov.code(), Code::Mov_r64_rm64 | Code::Mov_rm64_r64)
        && mov.op0_register() == Register::RBP
        && mov.op1_register() == Register::RSP;
    if !is_mov {
        return false;
    }
    let mut f = InstructionInfoFactory::new();
    cfg.insns
        .iter()
        .skip_while(|i| i.ip() <= mov.ip())
        .all(|i| {
            let epilogue = matches!(i.code(), Code::Leaveq | Code::Pop_r64);
            epilogue
                || !f.info(i).used_registers().iter().any(|r| {
                    r.register().full_register() == Register::RBP
                        && !matches!(r.access(), OpAccess::Read | OpAccess::CondRead)
                })
        })
}

/// A frame access: `[rbp + d]`, `d < 0`, no index, no segment.
fn frame_disp(i: &Instruction) -> Option<i64> {
    let d = i.memory_displacement64() as i64;
    (i.memory_base() == Register::RBP
        && i.memory_index() == Register::None
        && i.segment_prefix() == Register::None
        && d < 0)
        .then_some(d)
}

/// The region's frame accesses, or `None` when rbp is not provably the frame pointer or a
/// buffered access uses rbp some other way (positive displacement: the caller's frame).
pub fn analyze(cfg: &Cfg, tr: &[Treatment], region_insns: &[usize]) -> Option<Frame> {
    if !rbp_is_frame_pointer(cfg) {
        return None;
    }
    // An epilogue inside the region (`leave`, `pop rbp`) would move the frame under it.
    let mut f = InstructionInfoFactory::new();
    let moves_rbp = region_insns.iter().any(|&k| {
        f.info(&cfg.insns[k]).used_registers().iter().any(|r| {
            r.register().full_register() == Register::RBP
                && !matches!(r.access(), OpAccess::Read | OpAccess::CondRead)
        })
    });
    if moves_rbp {
        return None;
    }
    let mut frame = Frame {
        bypass: HashSet::new(),
        lo: i64::MAX,
        hi: i64::MIN,
    };
    for &k in region_insns {
        let Treatment::Ssb { size, vector, .. } = tr[k] else {
            continue;
        };
        let i = &cfg.insns[k];
        let uses_rbp = i.memory_base() == Register::RBP || i.memory_index() == Register::RBP;
        match frame_disp(i) {
            Some(d) if !vector => {
                frame.bypass.insert(k);
                frame.lo = frame.lo.min(d);
                frame.hi = frame.hi.max(d + i64::from(size));
            }
            _ if uses_rbp => return None,
            _ => {}
        }
    }
    (!frame.bypass.is_empty()).then_some(frame)
}

/// The frame slot `register` was last loaded from before instruction `k` of its block, when
/// that load is `mov r64,[rbp-d]` with nothing writing the register in between and no
/// frame store of the region touching the slot: the register then holds the slot's value,
/// unchanged for the whole pass (module doc).
pub fn derived_slot(
    cfg: &Cfg,
    tr: &[Treatment],
    frame: &Frame,
    block_insns: std::ops::Range<usize>,
    k: usize,
    register: Register,
) -> Option<i64> {
    let mut f = InstructionInfoFactory::new();
    for j in (block_insns.start..k).rev() {
        let i = &cfg.insns[j];
        let writes = f.info(i).used_registers().iter().any(|r| {
            r.register().full_register() == register
                && !matches!(r.access(), OpAccess::Read | OpAccess::CondRead)
        });
        if !writes {
            continue;
        }
        if i.code() != Code::Mov_r64_rm64 || i.op0_register() != register {
            return None;
        }
        let d = frame_disp(i)?;
        let stored = frame.bypass.iter().any(|&s| {
            let st = &cfg.insns[s];
            match (tr[s], frame_disp(st)) {
                (
                    Treatment::Ssb {
                        write: true, size, ..
                    },
                    Some(sd),
                ) => sd < d + 8 && d < sd + i64::from(size),
                _ => false,
            }
        });
        return (!stored).then_some(d);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::source::CodeBytes;
    use iced_x86::code_asm::*;

    fn cfg_of(build: impl Fn(&mut CodeAssembler)) -> Cfg {
        let mut a = CodeAssembler::new(64).unwrap();
        build(&mut a);
        let bytes = a.assemble(0x1000).unwrap();
        let end = 0x1000 + bytes.len() as u64;
        let src = CodeBytes {
            base: 0x1000,
            bytes: &bytes,
        };
        Cfg::build(&src, 0x1000, end).unwrap()
    }

    #[test]
    fn prologue_makes_rbp_the_frame_pointer_and_a_write_elsewhere_does_not() {
        let ok = cfg_of(|a| {
            a.push(rbp).unwrap();
            a.mov(rbp, rsp).unwrap();
            a.mov(rax, qword_ptr(rbp - 0x10)).unwrap();
            a.pop(rbp).unwrap();
            a.ret().unwrap();
        });
        assert!(rbp_is_frame_pointer(&ok));
        let bad = cfg_of(|a| {
            a.push(rbp).unwrap();
            a.mov(rbp, rsp).unwrap();
            a.mov(rbp, rdi).unwrap();
            a.ret().unwrap();
        });
        assert!(!rbp_is_frame_pointer(&bad));
        let no_prologue = cfg_of(|a| {
            a.mov(rax, qword_ptr(rbp - 0x10)).unwrap();
            a.ret().unwrap();
        });
        assert!(!rbp_is_frame_pointer(&no_prologue));
    }
}
