//! Intel PEBS memory sampling, planned from sysfs: per core PMU (one on most parts, `cpu_core`
//! and `cpu_atom` on hybrid ones), a load-latency event whose samples carry `data_src` (the
//! snoop result: HITM is contention), optionally a store event for the byte layout, and — on
//! cores that require it (Sapphire Rapids, Alder Lake's P-cores) — the `mem-loads-aux` group
//! leader:
//!
//! ```text
//!  cpu_core (type 4)                           cpu_atom (type 10)
//!  ┌ leader: mem-loads-aux  (counting) ┐       ┌ mem-loads,ldlat=30  precise, period P ┐
//!  └ member: mem-loads,ldlat=30 P     ┘       └───────────────────────────────────────┘
//!  mem-stores  precise, period S              mem-stores  precise, period S
//! ```
//!
//! Nothing about the encodings is hard-coded: `event`/`umask`/`ldlat` come from each PMU's
//! `events/` strings and land where its `format/` files say (`ldlat` is `config1:0-15` on
//! every Intel core so far, but it is read, not assumed).

use perf_event_open_sys::bindings::perf_event_attr;

use crate::attr::{self, Binding};
use crate::pmu::sysfs::{Pmu, Term};
use crate::pmu::PmuError;

/// perf c2c's default load-latency threshold (cycles): loads slower than an L1/L2 hit, which
/// includes every cache-to-cache transfer.
pub const DEFAULT_LDLAT: u64 = 30;

/// Loads sampled: one in this many qualifying (≥ ldlat) loads. A prime, as in the LASER paper
/// (it sampled its HITM event every 19th), so the period does not alias with loop trip counts.
/// The paper's event fired only on HITM; `mem-loads` fires on every slow load, so the period
/// is larger: records/s per core = qualifying loads/s ÷ period, ≤ 2·10⁴ at 2·10⁷ slow loads/s
/// (a memory-bound core), ~2 MB/s of ring traffic.
pub const DEFAULT_LOAD_PERIOD: u64 = 1009;

/// Stores sampled: every store qualifies, so a larger prime (≤ 10⁵ records/s at 10⁹ stores/s).
pub const DEFAULT_STORE_PERIOD: u64 = 10007;

/// Most precise `precise_ip` asked for first (3 = zero skid); lowered on EINVAL/EOPNOTSUPP.
pub const MAX_PRECISE: u8 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PebsOptions {
    pub binding: Binding,
    pub ldlat: u64,
    pub load_period: u64,
    /// `None`: no store sampling (loads only, as `perf mem record -t load`).
    pub store_period: Option<u64>,
}

impl Default for PebsOptions {
    fn default() -> Self {
        PebsOptions {
            binding: Binding::Launch,
            ldlat: DEFAULT_LDLAT,
            load_period: DEFAULT_LOAD_PERIOD,
            store_period: Some(DEFAULT_STORE_PERIOD),
        }
    }
}

/// The events to open on one core PMU.
#[derive(Clone, Debug)]
pub struct CorePlan {
    /// `cpu`, `cpu_core` or `cpu_atom`.
    pub pmu: String,
    pub pmu_name: Option<String>,
    /// The first `precise_ip` to try (3, or the PMU's `caps/max_precise` if lower).
    pub precise_start: u8,
    /// `mem-loads-aux`, when the PMU has it: the load event must be opened as its group member.
    pub aux_leader: Option<perf_event_attr>,
    pub load: perf_event_attr,
    pub store: Option<perf_event_attr>,
}

/// Core PMUs in the order to open them: `cpu`, or the hybrid `cpu_core` then `cpu_atom`.
pub fn core_pmus(pmus: &[Pmu]) -> Vec<&Pmu> {
    let by = |n: &str| pmus.iter().find(|p| p.name == n);
    match by("cpu") {
        Some(p) => vec![p],
        None => ["cpu_core", "cpu_atom"]
            .into_iter()
            .filter_map(by)
            .collect(),
    }
}

/// Plans PEBS events on every core PMU. Fails, naming what is missing, when there is no core
/// PMU or one of them has no `mem-loads` event (a hybrid part with one core type lacking it
/// would sample only where threads happen to run: refused rather than half done).
pub fn plan(pmus: &[Pmu], opts: &PebsOptions) -> Result<Vec<CorePlan>, PmuError> {
    let cores = core_pmus(pmus);
    if cores.is_empty() {
        return Err(PmuError::NoCorePmu);
    }
    cores.into_iter().map(|p| plan_one(p, opts)).collect()
}

fn plan_one(p: &Pmu, opts: &PebsOptions) -> Result<CorePlan, PmuError> {
    let ldlat = Term {
        name: "ldlat".into(),
        value: opts.ldlat,
    };
    let enc = p.encode("mem-loads", &[ldlat])?;
    let precise_start = p
        .max_precise
        .map_or(MAX_PRECISE, |m| m.clamp(1, MAX_PRECISE));
    let mut load = attr::memory(
        opts.binding,
        p.type_,
        enc.config,
        enc.config1,
        enc.config2,
        opts.load_period,
    );
    load.set_precise_ip(precise_start.into());
    let aux_leader = if p.events.contains_key("mem-loads-aux") {
        let e = p.encode("mem-loads-aux", &[])?;
        let mut a = attr::memory(opts.binding, p.type_, e.config, e.config1, e.config2, 0);
        // The group is enabled through its leader (at exec for launches); a member opened
        // disabled would stay off.
        load.set_disabled(0);
        load.set_enable_on_exec(0);
        a.set_precise_ip(0);
        Some(a)
    } else {
        None
    };
    let store = match opts.store_period {
        Some(period) if p.events.contains_key("mem-stores") => {
            let e = p.encode("mem-stores", &[])?;
            let mut s = attr::memory(
                opts.binding,
                p.type_,
                e.config,
                e.config1,
                e.config2,
                period,
            );
            s.set_precise_ip(precise_start.into());
            Some(s)
        }
        _ => None,
    };
    Ok(CorePlan {
        pmu: p.name.clone(),
        pmu_name: p.pmu_name.clone(),
        precise_start,
        aux_leader,
        load,
        store,
    })
}

/// Opens `attr` with `open`, trying `precise_ip` from `start` down to 1 while the kernel
/// refuses the precision (EINVAL, EOPNOTSUPP): PEBS generations differ in how much skid they
/// can remove, and the kernel says only "invalid". Precision 0 is not tried: without PEBS a
/// load event carries no `data_src`. Returns the handle and the precision that worked, or the
/// last error.
pub fn open_precise<T, E>(
    attr: &perf_event_attr,
    start: u8,
    mut open: impl FnMut(&perf_event_attr) -> Result<T, E>,
    retry: impl Fn(&E) -> bool,
) -> Result<(T, u8), E> {
    let mut a = *attr;
    let mut p = start.clamp(1, MAX_PRECISE);
    loop {
        a.set_precise_ip(p.into());
        match open(&a) {
            Ok(t) => return Ok((t, p)),
            Err(e) if p > 1 && retry(&e) => p -= 1,
            Err(e) => return Err(e),
        }
    }
}

/// Whether an errno from `perf_event_open` means "try less precision".
pub fn precise_retry_errno(errno: i32) -> bool {
    errno == libc::EINVAL || errno == libc::EOPNOTSUPP
}
