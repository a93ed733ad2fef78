//! Profiles for fleet backends and flame graphs: `--pprof FILE` (profile.proto, gzipped, as
//! Parca, Pyroscope and `go tool pprof` read) and `--collapsed FILE` (one `frame;frame count`
//! line per stack, as `flamegraph.pl` and inferno read). Both weight each contending
//! instruction by the contention events the report gives it.

pub mod collapsed;
pub mod pprof;
pub mod proto;

use anyhow::{Context, Result};
use laser_detect::report::{Finding, Report, Source};

use crate::cli::AnalysisArgs;

/// Writes the profiles `args` asks for.
pub fn write_requested(report: &Report, args: &AnalysisArgs) -> Result<()> {
    if let Some(path) = &args.pprof {
        let bytes = pprof::gzipped(report).context("compressing the pprof profile")?;
        crate::private_file::write(path, &bytes)
            .with_context(|| format!("writing the pprof profile to {}", path.display()))?;
    }
    if let Some(path) = &args.collapsed {
        crate::private_file::write(path, collapsed::render(report).as_bytes())
            .with_context(|| format!("writing collapsed stacks to {}", path.display()))?;
    }
    Ok(())
}

/// One weighted stack of a profile: a contending instruction of a finding, or the finding's
/// events no instruction was credited with.
pub struct Weighted<'a> {
    pub finding: &'a Finding,
    /// `None`: the remainder of the finding's events.
    pub source: Option<&'a Source>,
    pub events: u64,
}

/// Every finding's sources with their events; when the sources' events add up to less than
/// the finding's (an estimate that credits some transfers to no instruction), one more entry
/// carries the difference, so a profile's total is never below the report's.
pub fn weighted(report: &Report) -> Vec<Weighted<'_>> {
    let mut out = Vec::new();
    for f in &report.findings {
        let mut credited = 0;
        for s in f.sources.iter().filter(|s| s.events > 0) {
            credited += s.events;
            out.push(Weighted {
                finding: f,
                source: Some(s),
                events: s.events,
            });
        }
        if f.events > credited {
            out.push(Weighted {
                finding: f,
                source: None,
                events: f.events - credited,
            });
        }
    }
    out
}

/// A frame of a stack, outermost first: (function, file, line).
pub type Frame = (String, Option<String>, Option<u32>);

/// The call stack of a source, outermost first: the program's call site (library code), the
/// out-of-line function and the functions inlined into it, down to the instruction's own.
pub fn frames(s: &Source) -> Vec<Frame> {
    let mut out: Vec<Frame> = Vec::new();
    if let Some(c) = s.called_from.first() {
        out.push((
            c.function
                .clone()
                .or_else(|| c.symbol.clone())
                .unwrap_or_else(|| format!("{:#x}", c.ret)),
            c.file.clone(),
            c.line,
        ));
    }
    // `inlined` is innermost first, each with the call site in that caller.
    for i in s.inlined.iter().rev() {
        out.push((
            i.function.clone().unwrap_or_else(|| "?".into()),
            i.file.clone(),
            i.line,
        ));
    }
    out.push((
        s.function
            .clone()
            .or_else(|| s.symbol.clone())
            .unwrap_or_else(|| format!("{:#x}", s.pc)),
        s.file.clone(),
        s.line,
    ));
    out
}
