//! Effective addresses from sampled registers.
//!
//! ```text
//!   addr = base + index * scale + disp        (wrapping, 64-bit; truncated with addr32)
//!   rip-relative: disp is already next_ip + disp32 (iced folds it in)
//!   %fs: / %gs:   base is the thread pointer, not in a sample  → thread-local, not computable
//! ```

use laser_driver::UserRegs;

use crate::decode::classify::{MemOperand, Segment};

/// Why an address could not be computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoAddr {
    /// `%fs`/`%gs`-relative: thread-local storage.
    ThreadLocal,
    /// A base or index register was not in the sample's register mask.
    MissingRegister,
}

/// The address `m` touches given the registers `regs` (which must be the values the operand's
/// base and index registers had when the access executed).
pub fn effective_address(m: &MemOperand, regs: &UserRegs) -> Result<u64, NoAddr> {
    if m.segment != Segment::Flat {
        return Err(NoAddr::ThreadLocal);
    }
    let mut a = m.disp;
    if let Some(b) = m.base {
        a = a.wrapping_add(regs.get(b).ok_or(NoAddr::MissingRegister)?);
    }
    if let Some(i) = m.index {
        let v = regs.get(i).ok_or(NoAddr::MissingRegister)?;
        a = a.wrapping_add(v.wrapping_mul(m.scale as u64));
    }
    if m.addr32 {
        a &= 0xffff_ffff;
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::classify::Classifier;
    use iced_x86::code_asm::*;
    use laser_driver::Reg;

    fn operand(f: impl FnOnce(&mut CodeAssembler) -> Result<(), IcedError>) -> MemOperand {
        let mut a = CodeAssembler::new(64).unwrap();
        f(&mut a).unwrap();
        let bytes = a.assemble(0x1000).unwrap();
        Classifier::new().classify(0x1000, &bytes).unwrap().mem[0]
    }

    fn regs(pairs: &[(Reg, u64)]) -> UserRegs {
        let mut r = UserRegs::default();
        for &(k, v) in pairs {
            r.set(k, v);
        }
        r
    }

    #[test]
    fn base_index_scale_disp() {
        let m = operand(|a| a.mov(qword_ptr(rbx + r12 * 8 + 0x20), rcx));
        let r = regs(&[(Reg::Bx, 0x7000_0000), (Reg::R12, 3)]);
        assert_eq!(effective_address(&m, &r), Ok(0x7000_0000 + 24 + 0x20));
    }

    #[test]
    fn negative_displacement_wraps() {
        let m = operand(|a| a.mov(eax, dword_ptr(rbp - 4)));
        let r = regs(&[(Reg::Bp, 0x1000)]);
        assert_eq!(effective_address(&m, &r), Ok(0xffc));
    }

    #[test]
    fn rip_relative_needs_no_registers() {
        let m = operand(|a| {
            let mut l = a.create_label();
            a.mov(rax, qword_ptr(l))?;
            a.set_label(&mut l)?;
            a.dq(&[0])
        });
        assert!(m.rip_relative);
        // The load is 7 bytes long; the label is right after it.
        assert_eq!(effective_address(&m, &UserRegs::default()), Ok(0x1000 + 7));
    }

    #[test]
    fn missing_register_and_tls() {
        let m = operand(|a| a.mov(rax, qword_ptr(rcx)));
        assert_eq!(
            effective_address(&m, &regs(&[(Reg::Dx, 1)])),
            Err(NoAddr::MissingRegister)
        );
        let t = operand(|a| a.mov(rax, qword_ptr(rcx).gs()));
        assert_eq!(
            effective_address(&t, &regs(&[(Reg::Cx, 1)])),
            Err(NoAddr::ThreadLocal)
        );
    }

    #[test]
    fn addr32_truncates() {
        let m = operand(|a| a.mov(eax, dword_ptr(ecx + 8)));
        assert!(m.addr32);
        assert_eq!(
            effective_address(&m, &regs(&[(Reg::Cx, 0x1_ffff_fffc)])),
            Ok(0x4)
        );
    }
}
