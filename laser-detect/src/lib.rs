//! laser-detect: turns the driver's [`laser_driver::Event`] stream into contention findings.
//! No syscalls beyond reading files; every parser takes bytes or text.

pub mod dataname;
pub mod debug_module;
mod dwarf_types;
pub mod findings;
pub mod fix;
pub mod render_text;
pub mod report;
pub mod report_build;
pub mod symbolize;

pub use findings::{Analysis, Kind, LineFinding, Location, ModuleInfo, Op, SourceAccess};
pub use render_text::render_text;
pub use report::{Report, ReportError, SCHEMA};
pub use report_build::{build_report, ReportOptions};
pub use symbolize::Symbolizer;
