//! Values of the stack slots that unoptimised code reloads its pointers from, learned from
//! timer samples, so an access that overwrote its own pointer is still placed.
//!
//! At -O0 gcc keeps every variable in the frame and reloads it before each use, and a load
//! through a pointer often writes the pointer's own register:
//! ```text
//!   mov -0x10(%rbp),%rax      rax = args            (the slot holds the struct pointer)
//!   mov 0x8(%rax),%rax        rax = args->points    ◀ the access: its base is gone after it
//!   mov -0x4(%rbp),%ecx       ◀ sampled (one instruction of skid)
//! ```
//! Most samples of such a loop land one instruction past the access (`skid`), where `rax`
//! no longer holds `args`, so the access cannot be placed from the sampled registers: Phoenix
//! linear_regression at -O0 had 340–680 samples of the reading thread there and 2–30 on the
//! load itself, and the runs with 2–4 missed its false sharing altogether (3 of 8).
//!
//! The same thread's other samples say what the slot holds: a sample right after `mov
//! d(%rbp),%r` (its only way in, so it ran just before) has the slot's value in `r` and its
//! address in `rbp + d`. A slot's value is used only once two samples agree on it and none has
//! ever disagreed: a slot that moves (`p++` stored back at -O0) or is reused by another call
//! with other contents is never used again, so a stale pointer is not guessed.

use hashbrown::HashMap;
use laser_driver::{Reg, UserRegs};

use crate::decode::classify::{Insn, MemOperand, Segment};
use crate::decode::effaddr::effective_address;

/// Slots remembered at most; past this the table starts over (a deep recursion at -O0 must
/// not grow it without bound; the slots of a hot loop are learned again within a few samples).
const MAX_SLOTS: usize = 1 << 14;

/// Samples that must agree on a slot's value before it is used.
const AGREEING: u32 = 2;

#[derive(Clone, Copy, Debug)]
struct Slot {
    value: u64,
    agreed: u32,
    /// Two samples saw different values: never used.
    moves: bool,
}

/// Stack slot address → what samples have seen in it.
#[derive(Clone, Debug, Default)]
pub struct FrameSlots {
    slots: HashMap<u64, Slot>,
}

/// `insn` is `mov d(%rbp),%r` with `r` not `rbp`: (r, d).
fn frame_load(insn: &Insn) -> Option<(Reg, &MemOperand)> {
    let r = insn.loads_reg?;
    let m = insn.mem().first()?;
    (insn.n_mem == 1
        && r != Reg::Bp
        && m.base == Some(Reg::Bp)
        && m.index.is_none()
        && !m.rip_relative
        && !m.addr32
        && m.segment == Segment::Flat)
        .then_some((r, m))
}

impl FrameSlots {
    /// A timer sample whose IP is reached only from `prev` (it falls through and the IP is no
    /// jump target): if `prev` reloaded a register from a frame slot, the sample shows the
    /// slot's value.
    pub fn learn_after(&mut self, prev: &Insn, regs: &UserRegs) {
        let Some((r, m)) = frame_load(prev) else {
            return;
        };
        let (Ok(slot), Some(value)) = (effective_address(m, regs), regs.get(r)) else {
            return;
        };
        if self.slots.len() >= MAX_SLOTS && !self.slots.contains_key(&slot) {
            self.slots.clear();
        }
        let e = self.slots.entry(slot).or_insert(Slot {
            value,
            agreed: 0,
            moves: false,
        });
        if e.value == value {
            e.agreed = e.agreed.saturating_add(1);
        } else {
            e.moves = true;
        }
    }

    /// The slot's value, once [`AGREEING`] samples saw it and none saw another.
    pub fn value(&self, slot: u64) -> Option<u64> {
        self.slots
            .get(&slot)
            .filter(|s| !s.moves && s.agreed >= AGREEING)
            .map(|s| s.value)
    }

    /// The address of `access`'s operand `m`, when the access overwrote its one address
    /// register and `feeder` (the instruction that ran just before it) had loaded that register
    /// from a frame slot whose value is known. `regs` are the registers right after `access`.
    pub fn address_via_slot(
        &self,
        feeder: &Insn,
        access: &Insn,
        m: &MemOperand,
        regs: &UserRegs,
    ) -> Option<u64> {
        let (r, fm) = frame_load(feeder)?;
        let lost = access.writes_regs & m.address_regs();
        if lost != 1 << r as u32 || access.writes_regs & (1 << Reg::Bp as u32) != 0 {
            return None;
        }
        let value = self.value(effective_address(fm, regs).ok()?)?;
        let mut before = *regs;
        before.set(r, value);
        effective_address(m, &before).ok()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::classify::Classifier;

    fn insn(pc: u64, bytes: &[u8]) -> Insn {
        Classifier::new().classify(pc, bytes).expect("decodes")
    }

    // From phx_linear_regression_O0's loop (objdump):
    //   mov -0x10(%rbp),%rax   48 8b 45 f0
    //   mov 0x8(%rax),%rax     48 8b 40 08
    const RELOAD: [u8; 4] = [0x48, 0x8b, 0x45, 0xf0];
    const THROUGH: [u8; 4] = [0x48, 0x8b, 0x40, 0x08];
    const RBP: u64 = 0x7ffd_0000_1000;
    const ARGS: u64 = 0x5555_0000_2070;

    fn regs(rax: u64) -> UserRegs {
        let mut r = UserRegs::default();
        r.set(Reg::Bp, RBP);
        r.set(Reg::Ax, rax);
        r
    }

    #[test]
    fn a_pointer_reloaded_from_its_slot_places_the_access_that_overwrote_it() {
        let reload = insn(0x1305, &RELOAD);
        let through = insn(0x1309, &THROUGH);
        assert_eq!(reload.loads_reg, Some(Reg::Ax));
        let mut slots = FrameSlots::default();
        let m = through.mem()[0];
        // After the load, rax holds args->points: nothing known about the slot yet.
        let after = regs(0x7f00_dead_0000);
        assert_eq!(slots.address_via_slot(&reload, &through, &m, &after), None);
        // One sample right after the reload is not enough; two that agree are.
        slots.learn_after(&reload, &regs(ARGS));
        assert_eq!(slots.address_via_slot(&reload, &through, &m, &after), None);
        slots.learn_after(&reload, &regs(ARGS));
        assert_eq!(
            slots.address_via_slot(&reload, &through, &m, &after),
            Some(ARGS + 8)
        );
    }

    #[test]
    fn a_slot_seen_with_two_values_is_never_used() {
        let reload = insn(0x1305, &RELOAD);
        let through = insn(0x1309, &THROUGH);
        let m = through.mem()[0];
        let mut slots = FrameSlots::default();
        slots.learn_after(&reload, &regs(ARGS));
        slots.learn_after(&reload, &regs(ARGS));
        slots.learn_after(&reload, &regs(ARGS + 0x40)); // `p++` stored back
        slots.learn_after(&reload, &regs(ARGS + 0x40));
        slots.learn_after(&reload, &regs(ARGS + 0x40));
        assert_eq!(slots.value(RBP - 0x10), None);
        assert_eq!(
            slots.address_via_slot(&reload, &through, &m, &regs(0)),
            None
        );
    }

    #[test]
    fn only_a_frame_reload_feeds_and_only_the_lost_register_is_rebuilt() {
        let mut slots = FrameSlots::default();
        // mov 0x8(%rax),%rax is not a frame reload: it teaches nothing.
        let through = insn(0x1309, &THROUGH);
        slots.learn_after(&through, &regs(ARGS));
        slots.learn_after(&through, &regs(ARGS));
        assert_eq!(slots.len(), 0);
        // mov -0x10(%rbp),%rdx (48 8b 55 f0) feeds rdx, but the access lost rax.
        let reload_rdx = insn(0x1305, &[0x48, 0x8b, 0x55, 0xf0]);
        assert_eq!(reload_rdx.loads_reg, Some(Reg::Dx));
        let mut r = regs(0);
        r.set(Reg::Dx, ARGS);
        slots.learn_after(&reload_rdx, &r);
        slots.learn_after(&reload_rdx, &r);
        assert_eq!(slots.value(RBP - 0x10), Some(ARGS));
        let m = through.mem()[0];
        assert_eq!(slots.address_via_slot(&reload_rdx, &through, &m, &r), None);
        // A 32-bit reload (mov -0x4(%rbp),%eax: 8b 45 fc) is no pointer.
        assert_eq!(insn(0x1300, &[0x8b, 0x45, 0xfc]).loads_reg, None);
    }
}
