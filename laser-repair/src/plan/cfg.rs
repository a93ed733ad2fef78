//! Control-flow graph of the function that holds the contending PCs.
//!
//! Decoding is a linear sweep over `[start, end)`: compilers do not put data inside x86-64
//! functions, and every decoded branch target is checked to land on an instruction boundary,
//! so a wrong sweep shows up as a refusal rather than a bad rewrite.

use super::refusal::RefusalReason;
use super::source::{read_range, CodeSource};
use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction};
use std::collections::{BTreeSet, HashMap};

/// A basic block: instructions `insns` of [`Cfg::insns`], covering `[start, end)`.
#[derive(Debug, Clone)]
pub struct Block {
    pub start: u64,
    pub end: u64,
    pub insns: std::ops::Range<usize>,
    /// Successor blocks inside the function (indices into [`Cfg::blocks`]).
    pub succs: Vec<usize>,
    pub preds: Vec<usize>,
    /// Direct branch targets outside the function (tail calls, jumps to cold parts).
    pub external_succs: Vec<u64>,
}

#[derive(Debug, Clone)]
pub struct Cfg {
    pub start: u64,
    pub end: u64,
    pub insns: Vec<Instruction>,
    pub blocks: Vec<Block>,
    /// Edges `(from, to)` whose target starts at or before the source block: every cycle in
    /// the CFG contains one, which is what the back-edge flush counter relies on.
    pub back_edges: Vec<(usize, usize)>,
}

impl Cfg {
    /// Decodes `[start, end)` and splits it into blocks.
    pub fn build(src: &dyn CodeSource, start: u64, end: u64) -> Result<Cfg, RefusalReason> {
        let bytes = read_range(src, start, end)
            .ok_or(RefusalReason::CodeUnreadable { addr: start, end })?;
        let insns = decode_all(&bytes, start)?;
        Ok(Self::from_insns(start, end, insns))
    }

    fn from_insns(start: u64, end: u64, insns: Vec<Instruction>) -> Cfg {
        let boundaries: BTreeSet<u64> = insns.iter().map(|i| i.ip()).collect();
        let mut leaders = BTreeSet::new();
        leaders.insert(start);
        for i in &insns {
            match i.flow_control() {
                FlowControl::Next | FlowControl::Call | FlowControl::IndirectCall => {}
                fc => {
                    if matches!(
                        fc,
                        FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
                    ) {
                        let t = i.near_branch_target();
                        if boundaries.contains(&t) {
                            leaders.insert(t);
                        }
                    }
                    if i.next_ip() < end {
                        leaders.insert(i.next_ip());
                    }
                }
            }
        }
        let mut blocks: Vec<Block> = Vec::new();
        let mut first = 0usize;
        for (k, i) in insns.iter().enumerate() {
            let last = k + 1 == insns.len() || leaders.contains(&i.next_ip());
            if last {
                blocks.push(Block {
                    start: insns[first].ip(),
                    end: i.next_ip(),
                    insns: first..k + 1,
                    succs: Vec::new(),
                    preds: Vec::new(),
                    external_succs: Vec::new(),
                });
                first = k + 1;
            }
        }
        let by_start: HashMap<u64, usize> = blocks
            .iter()
            .enumerate()
            .map(|(n, b)| (b.start, n))
            .collect();
        let mut back_edges = Vec::new();
        for b in 0..blocks.len() {
            let last = insns[blocks[b].insns.end - 1];
            let mut targets = Vec::new();
            match last.flow_control() {
                FlowControl::ConditionalBranch => {
                    targets.push(last.near_branch_target());
                    targets.push(last.next_ip());
                }
                FlowControl::UnconditionalBranch => targets.push(last.near_branch_target()),
                FlowControl::Next | FlowControl::Call | FlowControl::IndirectCall => {
                    targets.push(last.next_ip())
                }
                // Returns, indirect jumps, traps: no static successor.
                _ => {}
            }
            for t in targets {
                match by_start.get(&t) {
                    Some(&s) => {
                        if !blocks[b].succs.contains(&s) {
                            blocks[b].succs.push(s);
                            blocks[s].preds.push(b);
                            if blocks[s].start <= blocks[b].start {
                                back_edges.push((b, s));
                            }
                        }
                    }
                    None => blocks[b].external_succs.push(t),
                }
            }
        }
        Cfg {
            start,
            end,
            insns,
            blocks,
            back_edges,
        }
    }

    /// Index of the block holding instruction address `pc`, if `pc` is an instruction start.
    pub fn block_of(&self, pc: u64) -> Option<usize> {
        let b = self.blocks.partition_point(|b| b.end <= pc);
        let blk = self.blocks.get(b)?;
        (blk.start <= pc && self.insns[blk.insns.clone()].iter().any(|i| i.ip() == pc)).then_some(b)
    }

    /// Blocks of the innermost natural loop holding block `b` (by back-edge `u -> h`: `h`
    /// plus everything that reaches `u` without passing `h`), or `None` when `b` is in no loop.
    pub fn innermost_loop(&self, b: usize) -> Option<BTreeSet<usize>> {
        self.back_edges
            .iter()
            .map(|&(u, h)| self.natural_loop(u, h))
            .filter(|body| body.contains(&b))
            .min_by_key(|body| body.len())
    }

    /// The blocks of the cycle through back-edge `u -> h`: those that reach `u` without
    /// passing `h` and that `h` reaches. The second condition matters where `h` is not the
    /// loop's only way in: gcc -O0 enters a `for` loop by a jump to its condition at the
    /// bottom, so the edge into the body's first block (the back-edge by address) has a
    /// source the function's entry block also reaches; walking predecessors alone took the
    /// prologue into the loop.
    ///
    /// ```text
    ///   entry: push rbp ... jmp cond        body (h): ... (falls into cond)
    ///   cond (u): cmp; jl body    <- u -> h is the back-edge; entry reaches u, not from h
    /// ```
    fn natural_loop(&self, u: usize, h: usize) -> BTreeSet<usize> {
        let mut body = BTreeSet::from([h]);
        let mut stack = vec![u];
        while let Some(n) = stack.pop() {
            if body.insert(n) {
                stack.extend(self.blocks[n].preds.iter().copied());
            }
        }
        let mut reached = BTreeSet::from([h]);
        let mut stack = vec![h];
        while let Some(n) = stack.pop() {
            for &s in &self.blocks[n].succs {
                if body.contains(&s) && reached.insert(s) {
                    stack.push(s);
                }
            }
        }
        reached
    }
}

fn decode_all(bytes: &[u8], ip: u64) -> Result<Vec<Instruction>, RefusalReason> {
    let mut dec = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE);
    let mut out = Vec::new();
    while dec.can_decode() {
        let i = dec.decode();
        if i.is_invalid() {
            return Err(RefusalReason::Undecodable { pc: i.ip() });
        }
        out.push(i);
    }
    Ok(out)
}

const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// Guesses the bounds of the function holding `pc` when no symbol is known, looking at most
/// `limit` bytes either side.
///
/// Start: the nearest `endbr64` before `pc` (gcc/clang put one at every function entry with
/// CET enabled), else the earliest point after a `ret`/`int3` byte from which a linear decode
/// lands exactly on `pc`. End: the first `ret`/`jmp`/`ud2` at or after `pc` that no decoded
/// branch jumps past.
pub fn guess_function_bounds(
    src: &dyn CodeSource,
    pc: u64,
    limit: u64,
) -> Result<(u64, u64), RefusalReason> {
    let lo = pc.saturating_sub(limit);
    let mut back = vec![0u8; usize::try_from(pc - lo).unwrap_or(0)];
    // Shrink the window until it is fully readable (the function may start a page in).
    let mut lo_ok = lo;
    while src.read_code(lo_ok, &mut back[(lo_ok - lo) as usize..]) != (pc - lo_ok) as usize {
        lo_ok = (lo_ok | 0xfff) + 1;
        if lo_ok > pc {
            return Err(RefusalReason::CodeUnreadable { addr: lo, end: pc });
        }
    }
    let back = &back[(lo_ok - lo) as usize..];
    let reaches_pc = |s: u64| -> bool {
        let off = (s - lo_ok) as usize;
        let mut dec = Decoder::with_ip(64, &back[off..], s, DecoderOptions::NONE);
        while dec.can_decode() {
            let i = dec.decode();
            if i.is_invalid() {
                return false;
            }
        }
        dec.ip() == pc
    };
    let endbr = (0..back.len().saturating_sub(3))
        .rev()
        .find(|&o| back[o..o + 4] == ENDBR64 && reaches_pc(lo_ok + o as u64));
    let start = match endbr {
        Some(o) => lo_ok + o as u64,
        None => (1..=back.len())
            .find(|&o| {
                matches!(back[o - 1], 0xc3 | 0xcc)
                    && (o == back.len() || reaches_pc(lo_ok + o as u64))
            })
            // Skip int3/nop padding: the function starts after it.
            .map(|o| {
                o + back[o..]
                    .iter()
                    .take_while(|&&b| matches!(b, 0xcc | 0x90))
                    .count()
            })
            .map(|o| lo_ok + o as u64)
            .ok_or(RefusalReason::NoFunctionFound {
                pc,
                scanned: pc - lo_ok,
            })?,
    };
    // Forward: decode until a terminator past every branch target seen.
    let mut fwd = vec![0u8; limit as usize];
    let n = src.read_code(pc, &mut fwd);
    let mut dec = Decoder::with_ip(64, &fwd[..n], pc, DecoderOptions::NONE);
    let mut furthest = pc;
    // Branch targets seen between start and pc count too.
    let mut d0 = Decoder::with_ip(
        64,
        &back[(start - lo_ok) as usize..],
        start,
        DecoderOptions::NONE,
    );
    for i in &mut d0 {
        if matches!(
            i.flow_control(),
            FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
        ) {
            let t = i.near_branch_target();
            if t >= pc && t < pc + limit {
                furthest = furthest.max(t);
            }
        }
    }
    while dec.can_decode() {
        let i = dec.decode();
        if i.is_invalid() {
            break;
        }
        let fc = i.flow_control();
        if matches!(
            fc,
            FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
        ) {
            let t = i.near_branch_target();
            if t > i.ip() && t < pc + limit {
                furthest = furthest.max(t);
            }
        }
        let terminal = matches!(
            fc,
            FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch
        ) || i.mnemonic() == iced_x86::Mnemonic::Ud2;
        if terminal && i.ip() >= furthest {
            return Ok((start, i.next_ip()));
        }
    }
    Err(RefusalReason::NoFunctionFound { pc, scanned: limit })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::source::CodeBytes;
    use iced_x86::code_asm::*;

    const BASE: u64 = 0x40_1000;

    fn asm(build: impl FnOnce(&mut CodeAssembler)) -> Vec<u8> {
        let mut a = CodeAssembler::new(64).unwrap();
        build(&mut a);
        a.assemble(BASE).unwrap()
    }

    /// ```text
    /// outer: mov [rdi],rax        B0
    /// inner: add rax,1            B1  <-+
    ///        cmp rax,rcx              |  inner loop
    ///        jb inner             ----+
    ///        dec rsi              B2
    ///        jnz outer            -> B0 (outer loop)
    ///        ret                  B3
    /// ```
    #[test]
    fn nested_loops_blocks_back_edges_and_innermost_loop() {
        let code = asm(|a| {
            let mut outer = a.create_label();
            let mut inner = a.create_label();
            a.set_label(&mut outer).unwrap();
            a.mov(qword_ptr(rdi), rax).unwrap();
            a.set_label(&mut inner).unwrap();
            a.add(rax, 1).unwrap();
            a.cmp(rax, rcx).unwrap();
            a.jb(inner).unwrap();
            a.dec(rsi).unwrap();
            a.jnz(outer).unwrap();
            a.ret().unwrap();
        });
        let src = CodeBytes {
            base: BASE,
            bytes: &code,
        };
        let g = Cfg::build(&src, BASE, BASE + code.len() as u64).unwrap();
        assert_eq!(g.blocks.len(), 4);
        assert_eq!(g.blocks[1].succs, vec![1, 2]);
        let mut be = g.back_edges.clone();
        be.sort();
        assert_eq!(be, vec![(1, 1), (2, 0)]);
        assert_eq!(g.innermost_loop(1), Some(BTreeSet::from([1])));
        assert_eq!(g.innermost_loop(0), Some(BTreeSet::from([0, 1, 2])));
        assert_eq!(g.innermost_loop(3), None);
        assert_eq!(g.block_of(BASE), Some(0));
        assert_eq!(g.block_of(BASE + 1), None, "not an instruction start");
    }

    #[test]
    fn undecodable_bytes_are_reported() {
        let code = [0x48, 0x89, 0x07, 0x0f, 0xff];
        let src = CodeBytes {
            base: BASE,
            bytes: &code,
        };
        let err = Cfg::build(&src, BASE, BASE + code.len() as u64).unwrap_err();
        assert_eq!(err, RefusalReason::Undecodable { pc: BASE + 3 });
    }

    /// Without endbr64 the start is found after the previous function's ret/int3 padding.
    #[test]
    fn bounds_from_padding_when_no_endbr() {
        let code = asm(|a| {
            a.mov(eax, 1).unwrap();
            a.ret().unwrap();
            a.int3().unwrap();
            a.int3().unwrap();
            let mut top = a.create_label();
            let mut out = a.create_label();
            a.set_label(&mut top).unwrap();
            a.test(rsi, rsi).unwrap();
            a.je(out).unwrap();
            a.mov(qword_ptr(rdi), rsi).unwrap();
            a.dec(rsi).unwrap();
            a.jmp(top).unwrap();
            a.set_label(&mut out).unwrap();
            a.ret().unwrap();
            a.int3().unwrap();
            a.nop().unwrap();
        });
        let src = CodeBytes {
            base: BASE,
            bytes: &code,
        };
        let ips: Vec<u64> = Decoder::with_ip(64, &code, BASE, 0)
            .into_iter()
            .map(|i| i.ip())
            .collect();
        let (start, end) = guess_function_bounds(&src, ips[6], 4096).unwrap();
        assert_eq!(start, ips[4]);
        // The backward `jmp top` is not the end: `je out` jumps past it.
        assert_eq!(end, ips[9] + 1);
    }
}
