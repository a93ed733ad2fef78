//! Register and flag liveness over the function's CFG, so instrumentation clobbers only what
//! is dead and saves flags only where they are live.
//!
//! A set is a bitmask: bits 0..16 are RAX..R15 (iced order), bits 16..22 the six status
//! flags OF SF ZF AF CF PF (iced's `RflagsBits` order), tracked one by one so that `dec`
//! (which keeps CF) does not make every flag live. Unknown
//! successors (indirect jumps, jumps out of the function) make everything live; calls and
//! returns keep every register live but not the flags (see `call_live`).

use super::cfg::Cfg;
use super::classify::Treatment;
use iced_x86::{FlowControl, Instruction, InstructionInfoFactory, OpAccess, Register, RflagsBits};

pub type RegSet = u32;
pub const FLAGS: RegSet = 0x3f << 16;
pub const ALL: RegSet = (1 << 22) - 1;
const STATUS: u32 = RflagsBits::OF
    | RflagsBits::SF
    | RflagsBits::ZF
    | RflagsBits::AF
    | RflagsBits::CF
    | RflagsBits::PF;

/// Bit of a 64-bit GPR (`None` for anything else).
pub fn bit(r: Register) -> Option<RegSet> {
    let f = r.full_register();
    (f.is_gpr64()).then(|| 1 << (f.number() - Register::RAX.number()))
}

/// The GPR whose bit is `n`.
pub fn gpr(n: u32) -> Register {
    const R64: [Register; 16] = [
        Register::RAX,
        Register::RCX,
        Register::RDX,
        Register::RBX,
        Register::RSP,
        Register::RBP,
        Register::RSI,
        Register::RDI,
        Register::R8,
        Register::R9,
        Register::R10,
        Register::R11,
        Register::R12,
        Register::R13,
        Register::R14,
        Register::R15,
    ];
    R64[n as usize & 15]
}

pub fn mask(regs: &[Register]) -> RegSet {
    regs.iter().filter_map(|&r| bit(r)).fold(0, |a, b| a | b)
}

/// (use, def, every register mentioned) of one instruction.
pub fn use_def(i: &Instruction, f: &mut InstructionInfoFactory) -> (RegSet, RegSet, RegSet) {
    let (mut u, mut d, mut m) = (0, 0, 0);
    for r in f.info(i).used_registers() {
        let Some(b) = bit(r.register()) else { continue };
        m |= b;
        let full_width = r.register().size() >= 4;
        match r.access() {
            OpAccess::Write if full_width => d |= b,
            // Partial and conditional writes keep the rest of the old value: a use.
            OpAccess::Write | OpAccess::CondWrite => u |= b,
            _ => u |= b,
        }
    }
    u |= (i.rflags_read() & STATUS) << 16;
    d |= (i.rflags_modified() & STATUS) << 16;
    (u, d, m)
}

pub struct Liveness {
    /// Live before / after each instruction of `cfg.insns`.
    pub live_in: Vec<RegSet>,
    pub live_out: Vec<RegSet>,
    /// Registers each instruction mentions at all (operands, address, implicit).
    pub mentioned: Vec<RegSet>,
}

/// At a call or a return every register counts as live, flags excepted: a caller may rely
/// on any register its callee does not write (gcc `-fipa-ra` does, for callees it can see;
/// hand-written asm may), and the callee may read any. Only the flags are clobbered by every
/// call under every convention compilers use.
fn call_live() -> RegSet {
    ALL & !FLAGS
}

fn ret_live() -> RegSet {
    ALL & !FLAGS
}

pub fn analyze(cfg: &Cfg, tr: &[Treatment]) -> Liveness {
    let mut f = InstructionInfoFactory::new();
    let ud: Vec<_> = cfg.insns.iter().map(|i| use_def(i, &mut f)).collect();
    // Transfer through one instruction: the fixed rules first.
    let step = |k: usize, out: RegSet| -> RegSet {
        let i = &cfg.insns[k];
        match i.flow_control() {
            FlowControl::Call | FlowControl::IndirectCall => return call_live() | ud[k].0,
            FlowControl::Return => return ret_live(),
            FlowControl::IndirectBranch | FlowControl::Interrupt => return ALL,
            _ => {}
        }
        if tr[k] == Treatment::ExitToOriginal {
            return ALL;
        }
        let (u, d, _) = ud[k];
        (out & !d) | u
    };
    let nb = cfg.blocks.len();
    let mut block_in = vec![0 as RegSet; nb];
    let block_out = |b: usize, block_in: &[RegSet]| -> RegSet {
        let blk = &cfg.blocks[b];
        let mut out = blk.succs.iter().fold(0, |a, &s| a | block_in[s]);
        if !blk.external_succs.is_empty() {
            out = ALL;
        }
        out
    };
    let mut changed = true;
    while changed {
        changed = false;
        for b in (0..nb).rev() {
            let mut live = block_out(b, &block_in);
            for k in cfg.blocks[b].insns.clone().rev() {
                live = step(k, live);
            }
            if live != block_in[b] {
                block_in[b] = live;
                changed = true;
            }
        }
    }
    let n = cfg.insns.len();
    let (mut live_in, mut live_out) = (vec![ALL; n], vec![ALL; n]);
    for b in 0..nb {
        let mut live = block_out(b, &block_in);
        for k in cfg.blocks[b].insns.clone().rev() {
            live_out[k] = live;
            live = step(k, live);
            live_in[k] = live;
        }
    }
    Liveness {
        live_in,
        live_out,
        mentioned: ud.iter().map(|x| x.2).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::source::CodeBytes;

    #[test]
    fn loop_liveness() {
        // top: mov rax,[rdi]; add rax,1; mov [rdi],rax; dec rsi; jnz top; ret
        let code = [
            0x48, 0x8b, 0x07, 0x48, 0x83, 0xc0, 0x01, 0x48, 0x89, 0x07, 0x48, 0xff, 0xce, 0x75,
            0xf1, 0xc3,
        ];
        let src = CodeBytes {
            base: 0x40_0000,
            bytes: &code,
        };
        let cfg = Cfg::build(&src, 0x40_0000, 0x40_0000 + code.len() as u64).unwrap();
        let tr = crate::plan::region::treatments(&cfg);
        let l = analyze(&cfg, &tr);
        let rax = mask(&[Register::RAX]);
        let rdi = mask(&[Register::RDI]);
        let r11 = mask(&[Register::R11]);
        // Before `mov rax,[rdi]`: rax dead (redefined), rdi live, flags dead (`add` defines
        // them all).
        assert_eq!(l.live_in[0] & rax, 0);
        assert_ne!(l.live_in[0] & rdi, 0);
        assert_eq!(l.live_in[0] & FLAGS, 0);
        // After `dec rsi`, jnz reads ZF; CF, which dec keeps, is dead at the store before it.
        assert_ne!(l.live_out[3] & FLAGS, 0);
        assert_eq!(l.live_out[2] & FLAGS, 0);
        // r11 is never written in the function, so a caller may rely on it: live throughout.
        assert!(l.live_in.iter().all(|s| s & r11 != 0));
    }
}
