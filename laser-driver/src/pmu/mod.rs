//! Precise memory sampling on real PMUs: Intel PEBS ([`pebs`]) and AMD IBS op ([`ibs`]).
//! Everything here is built from the kernel's sysfs description of the PMUs ([`sysfs`]) and
//! `/proc/cpuinfo` text ([`cpuinfo`]), so it is tested on fixture trees of machines this
//! project does not have.

pub mod cpuinfo;
pub mod ibs;
pub mod live;
pub mod pebs;
pub mod sysfs;

pub use sysfs::{DirTree, Pmu, SysfsTree};

/// Why a PMU description or plan could not be used. Messages name the file or event involved.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum PmuError {
    #[error("unreadable PMU format {0:?} (expected e.g. \"config1:0-15\")")]
    BadFormat(String),
    #[error("unreadable PMU event {0:?} (expected e.g. \"event=0xcd,umask=0x1,ldlat=3\")")]
    BadEvent(String),
    #[error("PMU {0}: unreadable type {1:?}")]
    BadType(String, String),
    #[error("PMU {pmu} has no event {event} (no {dir}/{pmu}/events/{event})", dir = sysfs::PMU_DIR)]
    NoEvent { pmu: String, event: String },
    #[error("PMU {pmu} has no format for term {term} (no {dir}/{pmu}/format/{term})", dir = sysfs::PMU_DIR)]
    NoFormat { pmu: String, term: String },
    #[error("value {value} of term {term} does not fit its {width}-bit format")]
    TermTooWide {
        term: String,
        value: u64,
        width: u32,
    },
    #[error("no core PMU: neither {dir}/cpu nor cpu_core/cpu_atom exist (virtual machine without a PMU?)", dir = sysfs::PMU_DIR)]
    NoCorePmu,
    #[error("no IBS: {dir}/ibs_op does not exist (not an AMD CPU, or a virtual machine that does not pass IBS through)", dir = sysfs::PMU_DIR)]
    NoIbsOp,
    #[error("{0}")]
    Refused(String),
}
