//! AMD IBS op sampling through the `ibs_op` PMU. IBS tags one micro-op every `period` ops
//! and reports its linear address and, since Linux 6.1, a kernel-filled `data_src` (where the
//! load was served from; a hit in another core's cache in Modified state is HITM, one in
//! Owned state a forward). Zen 3's IBS reports the data source unreliably (AMD erratum; the
//! kernel fills `data_src` only from what the hardware says), so laser refuses it there rather
//! than report contention that is not there.

use perf_event_open_sys::bindings::perf_event_attr;

use crate::attr::{self, Binding};
use crate::pmu::cpuinfo::{CpuId, Zen};
use crate::pmu::sysfs::{Pmu, Term};
use crate::pmu::PmuError;

/// One op in this many is tagged. IBS ignores the low 4 bits of the period (the hardware
/// counts in units of 16), so it is a multiple of 16 rather than a prime; ≤ 3·10⁴ records/s
/// per core at 3·10⁹ ops/s.
pub const DEFAULT_OP_PERIOD: u64 = 100_000;

/// The IBS op event for this machine, or why not.
pub fn plan(
    pmus: &[Pmu],
    cpu: Option<&CpuId>,
    binding: Binding,
    period: u64,
) -> Result<perf_event_attr, PmuError> {
    let p = pmus
        .iter()
        .find(|p| p.name == "ibs_op")
        .ok_or(PmuError::NoIbsOp)?;
    if let Some(c) = cpu {
        if c.zen() == Some(Zen::Zen3) {
            return Err(PmuError::Refused(format!(
                "IBS on Zen 3 ({}, family {:#x} model {:#x}) reports the data source of \
                 loads unreliably, so HITM cannot be told from a local hit — use --backend \
                 soft",
                c.model_name, c.family, c.model
            )));
        }
    }
    // Count dispatched ops, not cycles, where the PMU can (`cnt_ctl`): samples then follow
    // instructions, like PEBS's, instead of favouring long-latency ones.
    let terms: Vec<Term> = p
        .formats
        .contains_key("cnt_ctl")
        .then(|| Term {
            name: "cnt_ctl".into(),
            value: 1,
        })
        .into_iter()
        .collect();
    let enc = p.encode_terms(&terms)?;
    let period = (period.max(0x10)) & !0xf;
    let mut a = attr::memory(
        binding,
        p.type_,
        enc.config,
        enc.config1,
        enc.config2,
        period,
    );
    // IBS filters no privilege level in hardware; kernels before 6.x refuse exclude_* on
    // ibs_op with EINVAL. Kernel IPs are dropped by the detector's filter instead.
    a.set_exclude_kernel(0);
    a.set_exclude_hv(0);
    Ok(a)
}
