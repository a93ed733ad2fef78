//! laser-detect: turns the driver's [`laser_driver::Event`] stream into contention findings.
//! No syscalls beyond reading files; every parser takes bytes or text.
//!
//! Pipeline: [`maps`] (filter by address space) → [`pccache`]/[`classify`] (decode each PC
//! once) → [`access`] + [`effaddr`] (sample → exact accesses) → [`line_model`] (LASER
//! contention events) → [`detector`] (rates, ranking, [`findings::Analysis`]); [`candidates`]
//! and [`estimate`] turn soft-sample findings into watchpoint windows and honest rates.

pub mod access;
pub mod call_sites;
pub mod candidates;
pub mod classify;
pub mod code;
pub mod dataname;
pub mod debug_module;
pub mod detector;
mod dwarf_types;
pub mod effaddr;
pub mod estimate;
pub mod findings;
pub mod fix;
pub mod heap_blocks;
pub mod heap_names;
pub mod line_kind;
pub mod line_model;
pub mod line_table;
pub mod maps;
pub mod migratory;
pub mod own_frame;
pub mod pccache;
pub mod prefetch;
pub mod recent;
pub mod render_text;
pub mod report;
pub mod report_build;
pub mod skid;
pub mod survey;
pub mod symbolize;

pub use code::{CodeSource, ElfCode, Fallback, MemoryCode, ProcessCode};
pub use detector::{Config, Detector, FilterStats, WatchCandidate};
pub use estimate::{Estimator, LineEstimate};
pub use findings::{Analysis, CallSite, Kind, LineFinding, Location, ModuleInfo, Op, SourceAccess};

pub use render_text::render_text;
pub use report::{Report, ReportError, SCHEMA};
pub use report_build::{build_report, ReportOptions};
pub use symbolize::Symbolizer;

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
