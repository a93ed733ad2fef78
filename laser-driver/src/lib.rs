//! laser-driver: the only code in laser that calls `perf_event_open` or maps ring buffers.
//! Every backend (and the recording file) produces the same [`Event`] stream.
//!
//! Live use: [`probe::probe`] picks a backend, [`Session::launch`] / [`Session::attach`] start
//! observing, [`Session::poll`] delivers [`Event`]s until the target exits.

pub mod datasrc;
pub mod event;
pub mod trace;

pub mod attr;
pub mod company;
pub mod decode;
pub mod duty;
pub mod error;
pub mod exec_ranges;
pub mod import;
pub mod launch;
pub mod mmap_ring;
pub mod peers;
pub mod pmu;
pub mod probe;
pub mod procinfo;
pub mod ring;
pub mod session;
pub mod switches;
pub mod sys;
pub mod threads;
pub mod trap_guard;
pub mod watch;

pub use attr::WatchKind;
pub use duty::{CostModel, DutyCycle, WatchStats};
pub use error::DriverError;
pub use event::{
    BackendKind, Callers, Event, Mmap, Reg, Sample, StreamStats, UserRegs, MAX_CALLERS, NUM_REGS,
    SOFT_REGS_MASK,
};
pub use launch::ExitStatus;
pub use session::{
    AttrInfo, Config, HeaderInfo, Session, Status, CHURN_MEMORY, CHURN_POLL, DEFAULT_BUFFER_PAGES,
    DEFAULT_SOFT_FREQ,
};
pub use watch::{Unwatched, WatchSpec, Watcher, MAX_WATCHES};
