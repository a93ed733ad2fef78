//! The store that writes back what a load read: `x[i] = x[i]*a + …` compiles (SSE, -O2) to
//! a load, arithmetic and a store to the same address expression.
//!
//! ```text
//!   1750: movsd (%rdi,%rax,1),%xmm0     ◀ load   (samples charge contention here)
//!   1755: movsd (%rsi,%rax,1),%xmm1
//!   …     mulsd/addsd
//!   1766: movsd %xmm0,(%rdi,%rax,1)     ◀ store, same operand, rdi and rax unchanged
//! ```
//! A code window on the load sees each thread's reads; the line two threads *store* to, which
//! is what a front window follows, shows only at the store. So when timer samples pick a load
//! for a code window, the window watches this store instead.

use crate::decode::classify::{Classifier, MemOperand};
use crate::decode::code::CodeSource;

/// Instructions looked at after the load: a loop body's arithmetic between a load and its
/// store is a few instructions.
const LOOK_AHEAD: usize = 12;

/// The PC of the store to the same address as the load at `pc`, in the straight-line code that
/// follows it with that address's registers unchanged; `None` if `pc` is not a load of one
/// non-stack operand or no such store comes before a branch.
pub fn store_after_load<C: CodeSource + ?Sized>(code: &C, pc: u64) -> Option<u64> {
    let mut c = Classifier::new();
    let mut b = [0u8; 16];
    let insn = |c: &mut Classifier, b: &mut [u8; 16], at: u64| {
        let n = code.read_code(at, b);
        c.classify(at, &b[..n])
    };
    let load = insn(&mut c, &mut b, pc)?;
    let [m] = load.mem() else {
        return None;
    };
    if m.op.writes() || m.is_stack() || load.writes_regs & m.address_regs() != 0 {
        return None;
    }
    let same = |x: &MemOperand| {
        (x.base, x.index, x.scale, x.disp, x.size, x.segment)
            == (m.base, m.index, m.scale, m.disp, m.size, m.segment)
    };
    let mut at = load.next_ip();
    for _ in 0..LOOK_AHEAD {
        let x = insn(&mut c, &mut b, at)?;
        if x.mem().iter().any(|o| o.op.writes() && same(o)) {
            return Some(x.pc);
        }
        if x.writes_regs & m.address_regs() != 0 || !x.falls_through || x.branch_target.is_some() {
            return None;
        }
        at = x.next_ip();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::code::MemoryCode;

    const AT: u64 = 0x1750;

    fn code(bytes: &[u8]) -> MemoryCode {
        let mut c = MemoryCode::new();
        c.add(AT, bytes.to_vec());
        c
    }

    /// block_edges' `sweep` loop (gcc -O2), from 0x1750.
    const SWEEP: [u8; 36] = [
        0xf2, 0x0f, 0x10, 0x04, 0x07, // movsd (%rdi,%rax,1),%xmm0
        0xf2, 0x0f, 0x10, 0x0c, 0x06, // movsd (%rsi,%rax,1),%xmm1
        0xf2, 0x0f, 0x59, 0xc3, // mulsd %xmm3,%xmm0
        0xf2, 0x0f, 0x59, 0xca, // mulsd %xmm2,%xmm1
        0xf2, 0x0f, 0x58, 0xc1, // addsd %xmm1,%xmm0
        0xf2, 0x0f, 0x11, 0x04, 0x07, // movsd %xmm0,(%rdi,%rax,1)
        0x48, 0x83, 0xc0, 0x08, // add $8,%rax
        0x48, 0x39, 0xc2, // cmp %rax,%rdx
        0x75, 0xdc, // jne 0x1750
    ];

    #[test]
    fn the_load_of_a_read_modify_write_pairs_with_its_store() {
        let c = code(&SWEEP);
        assert_eq!(store_after_load(&c, AT), Some(0x1766));
        // The other load (`above[j]`) is never stored to.
        assert_eq!(store_after_load(&c, AT + 5), None);
        // A store is not a load.
        assert_eq!(store_after_load(&c, 0x1766), None);
    }

    #[test]
    fn no_pair_once_the_address_register_moves() {
        // movsd (%rdi,%rax,1),%xmm0; add $8,%rax; movsd %xmm0,(%rdi,%rax,1): the next element.
        let c = code(&[
            0xf2, 0x0f, 0x10, 0x04, 0x07, 0x48, 0x83, 0xc0, 0x08, 0xf2, 0x0f, 0x11, 0x04, 0x07,
        ]);
        assert_eq!(store_after_load(&c, AT), None);
    }
}
