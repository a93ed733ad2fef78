//! laser-driver: the only code in laser that calls `perf_event_open` or maps ring buffers.
//! Every backend (and the recording file) produces the same [`Event`] stream.

pub mod event;

pub mod attr;
pub mod decode;
pub mod error;
pub mod mmap_ring;
pub mod ring;
pub mod sys;

pub use error::DriverError;
pub use event::{
    BackendKind, Event, Mmap, Reg, Sample, StreamStats, UserRegs, NUM_REGS, SOFT_REGS_MASK,
};
