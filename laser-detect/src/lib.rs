//! laser-detect: turns the driver's [`laser_driver::Event`] stream into contention findings.
//! No syscalls beyond reading files; every parser takes bytes or text.
//!
//! The folders are the pipeline's stages, in the order data flows through them:
//! - [`decode`]: the target's address space ([`decode::maps`]), code bytes ([`decode::code`]),
//!   each PC decoded once ([`decode::pccache`], [`decode::classify`]), and a sample turned into
//!   the exact accesses it proves ([`decode::access`], [`decode::effaddr`], [`decode::skid`]).
//! - [`model`]: the LASER per-line model ([`model::line_model`]) and the [`model::detector`]
//!   that rates and ranks lines into a [`model::findings::Analysis`]; watchpoint planning
//!   ([`model::candidates`], [`model::survey`]), honest rates from watch windows
//!   ([`model::estimate`]) and migratory aggregation ([`model::migratory`]).
//! - [`naming`]: from addresses to source lines ([`naming::symbolize`]), data names and types
//!   ([`naming::dataname`], `naming::dwarf_types`), the type and member of each contended
//!   access ([`naming::access_type`], with `naming::scope_vars` and `naming::reg_track`) and
//!   heap blocks ([`naming::heap_blocks`]).
//! - [`report`]: the versioned JSON schema, [`report::build`] (threshold, rank, name, fix),
//!   [`report::fix`], [`report::render_text`], and the data profile ([`report::by_type`],
//!   `--by type|field`) with its per-type fixes ([`report::type_fix`]).

pub mod decode;
pub mod model;
pub mod naming;
pub mod report;

pub use decode::code::{CodeSource, ElfCode, Fallback, MemoryCode, ProcessCode};
pub use model::detector::{Config, Detector, FilterStats, WatchCandidate};
pub use model::estimate::{Estimator, LineEstimate};
pub use model::findings::{
    Analysis, CallSite, Kind, LineFinding, Location, ModuleInfo, Op, SourceAccess,
};

pub use naming::symbolize::Symbolizer;
pub use report::build::{build_report, ReportOptions};
pub use report::render_text::render_text;
pub use report::{Report, ReportError, SCHEMA};

#[cfg(test)]
pub(crate) mod test_util {
    /// Start addresses of the instructions in `bytes` (assembled at `ip`).
    pub fn starts(ip: u64, bytes: &[u8]) -> Vec<u64> {
        let mut d = iced_x86::Decoder::with_ip(64, bytes, ip, iced_x86::DecoderOptions::NONE);
        let mut v = Vec::new();
        while d.can_decode() {
            v.push(d.decode().ip());
        }
        v
    }
}
