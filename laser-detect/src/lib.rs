//! laser-detect: turns the driver's [`laser_driver::Event`] stream into contention findings.
//! No syscalls beyond reading files; every parser takes bytes or text.
//!
//! Pipeline: [`maps`] (filter by address space) → [`pccache`]/[`classify`] (decode each PC
//! once) → [`access`] + [`effaddr`] (sample → exact accesses) → [`line_model`] (LASER
//! contention events) → [`detector`] (rates, ranking, [`findings::Analysis`]); [`candidates`]
//! and [`estimate`] turn soft-sample findings into watchpoint windows and honest rates.

pub mod access;
pub mod candidates;
pub mod classify;
pub mod code;
pub mod detector;
pub mod effaddr;
pub mod estimate;
pub mod findings;
pub mod line_model;
pub mod line_table;
pub mod maps;
pub mod pccache;

pub use code::{CodeSource, ElfCode, Fallback, MemoryCode, ProcessCode};
pub use detector::{Config, Detector, FilterStats, WatchCandidate};
pub use estimate::{Estimator, LineEstimate};
pub use findings::{Analysis, Kind, LineFinding, Location, ModuleInfo, Op, SourceAccess};
