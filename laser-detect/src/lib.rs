//! laser-detect: turns the driver's [`laser_driver::Event`] stream into contention findings.
//! No syscalls beyond reading files; every parser takes bytes or text.

pub mod findings;

pub use findings::{Analysis, Kind, LineFinding, Location, ModuleInfo, Op, SourceAccess};
