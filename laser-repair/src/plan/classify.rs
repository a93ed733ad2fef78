//! What the rewriter does with each instruction of a region.
//!
//! The one correctness rule behind every choice here: an instruction whose memory access does
//! *not* go through the SSB must run with an empty log. Flushing first replays every buffered
//! store in program order, so memory then holds exactly what TSO says this thread has written,
//! and the direct access (a `lock add`, a `push`, a `rep movsb`, a `%fs:` TLS read) sees and
//! leaves consistent state. Everything else with a memory operand goes through the SSB or is
//! refused.

use iced_x86::{
    Code, FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpAccess, OpCodeOperandKind,
    OpKind, Register,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Treatment {
    /// No memory access and no control transfer the rewriter must handle: copied as is
    /// (rip-relative `lea` and friends are relocated by the block encoder).
    Verbatim,
    /// One explicit memory operand (operand index `op`), routed through the SSB.
    Ssb {
        op: u32,
        size: u32,
        read: bool,
        write: bool,
        /// An SSE/AVX operand (no general-register form, or 16/32 bytes): served through the
        /// thread's scratch area in 8-byte (or smaller) pieces (`wide.rs`), not through a GPR.
        vector: bool,
    },
    /// Flush the log, then execute the instruction unchanged in the code cache.
    FlushBefore,
    /// Flush, then leave the region by jumping to this instruction in the original code
    /// (calls, returns: the return address stays in original code, so undo never has to chase
    /// code-cache addresses on thread stacks).
    ExitToOriginal,
    /// Direct `jmp`/`jcc`/`loop`/`jrcxz`: retargeted by the rewriter.
    DirectBranch,
    /// Indirect `jmp`: unknown targets, refused inside a region.
    IndirectJump,
    Unsupported(&'static str),
}

impl Treatment {
    pub fn is_store(&self) -> bool {
        matches!(self, Treatment::Ssb { write: true, .. })
    }

    /// Log entries one execution appends at most: one per store, one per piece of a vector
    /// store (`wide.rs`).
    pub fn log_entries(&self) -> u32 {
        match *self {
            Treatment::Ssb {
                write: true,
                vector: true,
                size,
                ..
            } => super::wide::pieces(size),
            Treatment::Ssb { write: true, .. } => 1,
            _ => 0,
        }
    }
}

/// Instructions that order memory or have side effects outside the thread: flush first.
fn is_flush_mnemonic(m: Mnemonic) -> bool {
    use Mnemonic::*;
    matches!(
        m,
        Mfence
            | Lfence
            | Sfence
            | Pause
            | Syscall
            | Sysenter
            | Cpuid
            | Clflush
            | Clflushopt
            | Clwb
            | Movnti
            | Movntdq
            | Movntdqa
            | Movntps
            | Movntpd
            | Movntq
            | Vmovntdq
            | Vmovntdqa
            | Vmovntps
            | Vmovntpd
            | Maskmovq
            | Maskmovdqu
            | Vmaskmovdqu
            | Xchg
            | Xadd
            | Cmpxchg
            | Cmpxchg8b
            | Cmpxchg16b
            | Rdtsc
            | Rdtscp
            | Wrfsbase
            | Wrgsbase
            | Xsave
            | Xrstor
            | Fxsave
            | Fxrstor
    )
}

pub fn classify(i: &Instruction, info: &mut InstructionInfoFactory) -> Treatment {
    match i.flow_control() {
        FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch => {
            return Treatment::DirectBranch
        }
        FlowControl::IndirectBranch => return Treatment::IndirectJump,
        // A return leaves with the caller's return address: flush and run it in the cache.
        FlowControl::Return => return Treatment::FlushBefore,
        FlowControl::Call | FlowControl::IndirectCall => return Treatment::ExitToOriginal,
        FlowControl::XbeginXabortXend => {
            return Treatment::Unsupported("transactional memory instruction")
        }
        FlowControl::Interrupt => {
            return if i.mnemonic() == Mnemonic::Syscall {
                Treatment::FlushBefore
            } else {
                Treatment::Unsupported("interrupt or trap instruction")
            }
        }
        FlowControl::Next | FlowControl::Exception => {}
    }
    let exchange = matches!(
        i.mnemonic(),
        Mnemonic::Xchg | Mnemonic::Xadd | Mnemonic::Cmpxchg
    );
    let has_mem = (0..i.op_count()).any(|k| i.op_kind(k) == OpKind::Memory);
    if i.has_lock_prefix() || (is_flush_mnemonic(i.mnemonic()) && (has_mem || !exchange)) {
        // Locked and implicitly locked (xchg with memory) instructions, fences, NT stores:
        // all need the log drained before they run (DESIGN.md, SSB rules).
        return Treatment::FlushBefore;
    }
    let mem_op = (0..i.op_count()).find(|&k| i.op_kind(k) == OpKind::Memory);
    let ii = info.info(i);
    let used_mem = ii.used_memory();
    let accesses: Vec<_> = used_mem
        .iter()
        .filter(|m| m.access() != OpAccess::NoMemAccess)
        .collect();
    if accesses.is_empty() {
        return Treatment::Verbatim;
    }
    let Some(op) = mem_op else {
        // Implicit accesses only: push/pop/leave/string instructions/xlat.
        return Treatment::FlushBefore;
    };
    if accesses.len() > 1 || i.is_string_instruction() {
        // push [m] / pop [m] / movs: an explicit and an implicit stack access.
        return Treatment::FlushBefore;
    }
    if matches!(i.memory_segment(), Register::FS | Register::GS) {
        // TLS and the stack protector canary: thread-private by construction, but a flush
        // keeps the rule simple (these are rare inside hot loops).
        return Treatment::FlushBefore;
    }
    let (read, write) = match accesses[0].access() {
        OpAccess::Read | OpAccess::CondRead => (true, false),
        OpAccess::Write => (false, true),
        OpAccess::ReadWrite => (true, true),
        _ => return Treatment::Unsupported("conditional memory write"),
    };
    if matches!(
        i.mnemonic(),
        Mnemonic::Bt | Mnemonic::Bts | Mnemonic::Btr | Mnemonic::Btc
    ) && i.op_kind(1) == OpKind::Register
    {
        return Treatment::Unsupported(
            "bit-string access with a register offset can reach outside the operand",
        );
    }
    let size = i.memory_size().size() as u32;
    let kind = i.op_code().op_kind(op);
    let gpr_ok = matches!(
        (kind, size),
        (OpCodeOperandKind::r8_or_mem, 1)
            | (OpCodeOperandKind::r16_or_mem, 2)
            | (OpCodeOperandKind::r32_or_mem, 4)
            | (OpCodeOperandKind::r64_or_mem, 8)
    );
    let vector = !gpr_ok;
    if vector {
        if let Some(why) = vector_refusal(i, size) {
            return Treatment::Unsupported(why);
        }
    }
    if i.code() == Code::INVALID
        || i.memory_base() == Register::RIP && i.memory_index() != Register::None
    {
        return Treatment::Unsupported("malformed memory operand");
    }
    let explicit_rsp = ii
        .used_registers()
        .iter()
        .any(|r| r.register().full_register() == Register::RSP)
        && i.memory_base() != Register::RSP;
    if explicit_rsp || (i.memory_base() == Register::RSP && uses_rsp_outside_address(i)) {
        return Treatment::Unsupported("uses rsp as a data operand");
    }
    Treatment::Ssb {
        op,
        size,
        read,
        write,
        vector,
    }
}

/// Why a memory operand with no general-register form cannot go through the scratch area,
/// or `None` when it can. Accepted: legacy-SSE and VEX instructions with an XMM/YMM
/// register operand and a plain (non-VSIB) operand of 1-32 bytes, whose access is
/// unconditional: running the instruction on a copy of its operand bytes is then exactly
/// the original. Anything else is refused, never guessed: x87 and MMX (no XMM operand),
/// EVEX (opmasks make writes conditional, broadcasts change the size), gathers, masked
/// moves (a masked-off lane may sit on an unmapped page the pieces would read).
fn vector_refusal(i: &Instruction, size: u32) -> Option<&'static str> {
    use iced_x86::EncodingKind;
    if !matches!(i.encoding(), EncodingKind::Legacy | EncodingKind::VEX) {
        return Some("EVEX/XOP/3DNow! memory operand");
    }
    if i.is_vsib() {
        return Some("gather (vector-indexed memory operand)");
    }
    if matches!(
        i.mnemonic(),
        Mnemonic::Vmaskmovps | Mnemonic::Vmaskmovpd | Mnemonic::Vpmaskmovd | Mnemonic::Vpmaskmovq
    ) {
        return Some("masked vector move (lanes the mask excludes may be unmapped)");
    }
    let regs: Vec<Register> = (0..i.op_count())
        .filter(|&k| i.op_kind(k) == OpKind::Register)
        .map(|k| i.op_register(k))
        .collect();
    if !regs.iter().any(|r| r.is_xmm() || r.is_ymm())
        || regs
            .iter()
            .any(|r| !(r.is_xmm() || r.is_ymm() || r.is_gpr()))
    {
        return Some(
            "memory operand has no general-register form and is not an SSE/AVX operand \
             (x87, MMX, system state)",
        );
    }
    if !matches!(size, 1 | 2 | 4 | 8 | 16 | 32) {
        return Some("SSE/AVX memory operand size other than 1, 2, 4, 8, 16 or 32 bytes");
    }
    None
}

fn uses_rsp_outside_address(i: &Instruction) -> bool {
    (0..i.op_count()).any(|k| {
        i.op_kind(k) == OpKind::Register && i.op_register(k).full_register() == Register::RSP
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions};

    fn cls(bytes: &[u8]) -> Treatment {
        let i = Decoder::with_ip(64, bytes, 0x1000, DecoderOptions::NONE).decode();
        classify(&i, &mut InstructionInfoFactory::new())
    }

    #[test]
    fn classifies_common_forms() {
        // mov rax,[rdi]
        assert_eq!(
            cls(&[0x48, 0x8b, 0x07]),
            Treatment::Ssb {
                op: 1,
                size: 8,
                read: true,
                write: false,
                vector: false
            }
        );
        // mov [rdi],eax
        assert_eq!(
            cls(&[0x89, 0x07]),
            Treatment::Ssb {
                op: 0,
                size: 4,
                read: false,
                write: true,
                vector: false
            }
        );
        // add byte [rdi],1
        assert_eq!(
            cls(&[0x80, 0x07, 0x01]),
            Treatment::Ssb {
                op: 0,
                size: 1,
                read: true,
                write: true,
                vector: false
            }
        );
        // lock add [rdi],eax
        assert_eq!(cls(&[0xf0, 0x01, 0x07]), Treatment::FlushBefore);
        // xchg [rdi],eax (implicitly locked)
        assert_eq!(cls(&[0x87, 0x07]), Treatment::FlushBefore);
        // push rax
        assert_eq!(cls(&[0x50]), Treatment::FlushBefore);
        // lea rax,[rdi+8]
        assert_eq!(cls(&[0x48, 0x8d, 0x47, 0x08]), Treatment::Verbatim);
        // jmp rax
        assert_eq!(cls(&[0xff, 0xe0]), Treatment::IndirectJump);
        // call rel32
        assert_eq!(cls(&[0xe8, 0, 0, 0, 0]), Treatment::ExitToOriginal);
        // pause
        assert_eq!(cls(&[0xf3, 0x90]), Treatment::FlushBefore);
        // mov rax, fs:[0x28]
        assert_eq!(
            cls(&[0x64, 0x48, 0x8b, 0x04, 0x25, 0x28, 0, 0, 0]),
            Treatment::FlushBefore
        );
        // bt [rdi], rax
        assert!(matches!(
            cls(&[0x48, 0x0f, 0xa3, 0x07]),
            Treatment::Unsupported(_)
        ));
    }

    fn vec(size: u32, read: bool, write: bool) -> Treatment {
        let op = u32::from(!write);
        Treatment::Ssb {
            op,
            size,
            read,
            write,
            vector: true,
        }
    }

    #[test]
    fn classifies_sse_and_avx_operands() {
        // movaps [rdi],xmm0
        assert_eq!(cls(&[0x0f, 0x29, 0x07]), vec(16, false, true));
        // movdqu xmm1,[rdi+8]
        assert_eq!(cls(&[0xf3, 0x0f, 0x6f, 0x4f, 0x08]), vec(16, true, false));
        // paddd xmm0,[rdi]
        assert_eq!(cls(&[0x66, 0x0f, 0xfe, 0x07]), vec(16, true, false));
        // vmovdqu [rdi],ymm0
        assert_eq!(cls(&[0xc5, 0xfe, 0x7f, 0x07]), vec(32, false, true));
        // vmovdqu ymm1,[rdi]
        assert_eq!(cls(&[0xc5, 0xfe, 0x6f, 0x0f]), vec(32, true, false));
        // movsd xmm0,[rdi] (8 bytes) and movss [rdi],xmm0 (4 bytes)
        assert_eq!(cls(&[0xf2, 0x0f, 0x10, 0x07]), vec(8, true, false));
        assert_eq!(cls(&[0xf3, 0x0f, 0x11, 0x07]), vec(4, false, true));
        // movd xmm0,[rdi] keeps the general-register form (movd xmm0,eax)
        assert!(matches!(
            cls(&[0x66, 0x0f, 0x6e, 0x07]),
            Treatment::Ssb {
                size: 4,
                vector: false,
                ..
            }
        ));
        // fld dword [rdi] (x87), paddd mm0,[rdi] (MMX): refused
        for bytes in [&[0xd9u8, 0x07][..], &[0x0f, 0xfe, 0x07]] {
            assert!(
                matches!(cls(bytes), Treatment::Unsupported(_)),
                "{bytes:x?}"
            );
        }
        // vpgatherdd xmm0,[rdi+xmm1*4],xmm2: refused (vector-indexed)
        assert!(matches!(
            cls(&[0xc4, 0xe2, 0x69, 0x90, 0x04, 0x8f]),
            Treatment::Unsupported(_)
        ));
        // vmovdqu32 zmm0,[rdi] (EVEX): refused
        assert!(matches!(
            cls(&[0x62, 0xf1, 0x7e, 0x48, 0x6f, 0x07]),
            Treatment::Unsupported(_)
        ));
        // vmaskmovps [rdi],ymm1,ymm0 (conditional write): refused
        assert!(matches!(
            cls(&[0xc4, 0xe2, 0x75, 0x2e, 0x07]),
            Treatment::Unsupported(_)
        ));
    }
}
