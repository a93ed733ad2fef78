//! laser-driver: the only code in laser that calls `perf_event_open` or maps ring buffers.
//! Every backend (and the recording file) produces the same [`Event`] stream.

pub mod datasrc;
pub mod event;
pub mod trace;

pub use event::{
    BackendKind, Event, Mmap, Reg, Sample, StreamStats, UserRegs, NUM_REGS, SOFT_REGS_MASK,
};
