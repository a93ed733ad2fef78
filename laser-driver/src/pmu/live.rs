//! Opening the planned PEBS / IBS events for a live session: per CPU (launch) or per thread
//! (attach), each event's records sent into the ring of that CPU's or thread's tracking event
//! (`PERF_EVENT_IOC_SET_OUTPUT`), its id registered with the decoder with its sample layout.
//!
//! Nothing here can run on the machines this project has (no PMU): the planning is tested on
//! fixture sysfs trees (`tests/pmu_fixtures.rs`), the decoding of these samples on crafted
//! records (`decode_tests.rs`) and recordings (`tests/perf_import.rs`); the opening itself is
//! covered by `tests/live.rs`'s hardware test, ignored unless PEBS is present.

use std::os::fd::{AsRawFd, OwnedFd};

use perf_event_open_sys::bindings::perf_event_attr;

use crate::attr::{Binding, MEM_SAMPLE_TYPE};
use crate::decode::Decoder;
use crate::error::DriverError;
use crate::event::BackendKind;
use crate::pmu::cpuinfo::CpuId;
use crate::pmu::ibs;
use crate::pmu::pebs::{self, CorePlan, PebsOptions};
use crate::pmu::sysfs::{self, DirTree, SysfsTree};
use crate::sys;

/// The events of a precise session, planned once.
#[derive(Clone, Debug)]
pub enum PrecisePlan {
    /// Per core PMU: its plan and, on hybrid parts, the CPUs it covers (`<pmu>/cpus`).
    Pebs(Vec<(CorePlan, Option<Vec<u32>>)>),
    Ibs(perf_event_attr),
}

impl PrecisePlan {
    /// Plans `backend`'s events from `tree` and `/proc/cpuinfo` text; the error says what
    /// is missing, for `--backend pebs|ibs` to stop before anything runs.
    pub fn new(
        backend: BackendKind,
        binding: Binding,
        tree: &dyn SysfsTree,
        cpuinfo: &str,
    ) -> Result<PrecisePlan, DriverError> {
        let unavailable = |e: String| DriverError::BackendUnavailable {
            backend,
            reason: format!("{e} — use --backend soft"),
        };
        let pmus = sysfs::read_all(tree).map_err(|e| unavailable(e.to_string()))?;
        match backend {
            BackendKind::Pebs => {
                let opts = PebsOptions {
                    binding,
                    ..PebsOptions::default()
                };
                let plans =
                    pebs::plan(&pmus, &opts).map_err(|e| unavailable(format!("no PEBS: {e}")))?;
                Ok(PrecisePlan::Pebs(
                    plans
                        .into_iter()
                        .map(|p| {
                            let cpus = tree
                                .read(&format!("{}/cpus", p.pmu))
                                .and_then(|t| sys::parse_cpu_list(&t));
                            (p, cpus)
                        })
                        .collect(),
                ))
            }
            BackendKind::Ibs => ibs::plan(
                &pmus,
                CpuId::parse(cpuinfo).as_ref(),
                binding,
                ibs::DEFAULT_OP_PERIOD,
            )
            .map(PrecisePlan::Ibs)
            .map_err(|e| unavailable(format!("no IBS: {e}"))),
            other => Err(unavailable(format!("{other} is not a precise backend"))),
        }
    }

    /// [`PrecisePlan::new`] on this machine.
    pub fn system(backend: BackendKind, binding: Binding) -> Result<PrecisePlan, DriverError> {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        PrecisePlan::new(backend, binding, &DirTree::system(), &cpuinfo)
    }

    /// Every attr opened, for recording headers.
    pub fn attrs(&self) -> Vec<perf_event_attr> {
        match self {
            PrecisePlan::Ibs(a) => vec![*a],
            PrecisePlan::Pebs(plans) => plans
                .iter()
                .flat_map(|(p, _)| p.aux_leader.into_iter().chain([p.load]).chain(p.store))
                .collect(),
        }
    }

    /// Opens the events for `pid` on `cpu` (-1: per thread), sends their records into
    /// `ring_owner`'s ring and registers their ids. Returns the descriptors to keep open.
    pub fn open(
        &self,
        pid: i32,
        cpu: i32,
        ring_owner: &OwnedFd,
        decoder: &mut Decoder,
    ) -> Result<Vec<OwnedFd>, DriverError> {
        let mut fds = Vec::new();
        let sampling = |fd: OwnedFd, backend, decoder: &mut Decoder| {
            sys::set_output(&fd, ring_owner.as_raw_fd())?;
            decoder.add_precise(sys::event_id(&fd)?, backend, MEM_SAMPLE_TYPE);
            Ok::<OwnedFd, DriverError>(fd)
        };
        match self {
            PrecisePlan::Ibs(a) => {
                let what = format!("ibs_op sampling on pid {pid} cpu {cpu}");
                let fd = sys::open(a, pid, cpu, &what)?;
                fds.push(sampling(fd, BackendKind::Ibs, decoder)?);
            }
            PrecisePlan::Pebs(plans) => {
                for (p, cpus) in plans {
                    // On a hybrid part a CPU belongs to one core PMU; per-thread events are
                    // opened on every one (the kernel runs whichever matches the core).
                    if cpu >= 0 && cpus.as_ref().is_some_and(|c| !c.contains(&(cpu as u32))) {
                        continue;
                    }
                    let group = match &p.aux_leader {
                        Some(a) => {
                            let what = format!("{}/mem-loads-aux/ on pid {pid} cpu {cpu}", p.pmu);
                            Some(sys::open(a, pid, cpu, &what)?)
                        }
                        None => None,
                    };
                    let what = format!("{}/mem-loads/ on pid {pid} cpu {cpu}", p.pmu);
                    let (load, _) = open_precise(&p.load, p.precise_start, |a| {
                        sys::open_in_group(a, pid, cpu, group.as_ref(), &what)
                    })?;
                    fds.extend(group);
                    fds.push(sampling(load, BackendKind::Pebs, decoder)?);
                    if let Some(st) = &p.store {
                        let what = format!("{}/mem-stores/ on pid {pid} cpu {cpu}", p.pmu);
                        let (store, _) =
                            open_precise(st, p.precise_start, |a| sys::open(a, pid, cpu, &what))?;
                        fds.push(sampling(store, BackendKind::Pebs, decoder)?);
                    }
                }
            }
        }
        Ok(fds)
    }
}

fn open_precise(
    attr: &perf_event_attr,
    start: u8,
    open: impl FnMut(&perf_event_attr) -> Result<OwnedFd, DriverError>,
) -> Result<(OwnedFd, u8), DriverError> {
    pebs::open_precise(attr, start, open, |e| match e {
        DriverError::Open { source, .. } => {
            source.raw_os_error().is_some_and(pebs::precise_retry_errno)
        }
        _ => false,
    })
}
