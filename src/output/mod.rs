//! What a finished report becomes besides the text report: gate verdicts, CI annotations,
//! JUnit XML and profiles. `deliver` runs them all in the order a CI log reads best.

pub mod github;
pub mod junit;

use std::path::Path;

use anyhow::{Context, Result};
use laser_detect::{render_text, Report};

use crate::cli::{AnalysisArgs, ByView, Format};
use crate::gate::{self, report::ReportSubject, Verdict};

/// Evaluates the gates and writes every output `args` asks for. `title` names the run in
/// JUnit (`laser run ./app`). Returns whether a gate tripped.
pub fn deliver(report: &Report, args: &AnalysisArgs, title: &str) -> Result<bool> {
    let (tripped, verdicts) = gate::check_all(&args.fail_on, &ReportSubject(report));
    match args.format {
        Format::Text if !args.quiet => match args.by {
            None => print!("{}", render_text(report)),
            Some(ByView::Type) => print!("{}", laser_detect::report::by_type::render_types(report)),
            Some(ByView::Field) => {
                print!("{}", laser_detect::report::by_type::render_fields(report))
            }
        },
        Format::Text => {}
        Format::Github => print!(
            "{}",
            github::annotations(report, &gated_findings(&verdicts))
        ),
    }
    if let Some(path) = &args.json {
        crate::private_file::write(path, (report.to_json() + "\n").as_bytes())
            .with_context(|| format!("writing the JSON report to {}", path.display()))?;
    }
    print_verdicts(&verdicts, args.format);
    if let Some(path) = &args.junit {
        write_junit(path, &junit::report(title, report, &verdicts))?;
    }
    crate::export::write_requested(report, args)?;
    Ok(tripped)
}

/// One `laser: gate …` line per gate on stderr (stdout may be the program's); with
/// `--format github` also a workflow command for each tripped or unstable one.
pub fn print_verdicts(verdicts: &[Verdict], format: Format) {
    for v in verdicts {
        eprintln!("laser: {}", v.line());
    }
    if format == Format::Github {
        print!("{}", github::verdicts(verdicts));
    }
}

pub fn write_junit(path: &Path, xml: &str) -> Result<()> {
    crate::private_file::write(path, xml.as_bytes())
        .with_context(|| format!("writing the JUnit report to {}", path.display()))
}

/// Findings (by index) that satisfied some per-finding gate.
pub fn gated_findings(verdicts: &[Verdict]) -> Vec<usize> {
    let mut v: Vec<usize> = verdicts
        .iter()
        .filter(|v| v.tripped)
        .flat_map(|v| v.findings.iter().copied())
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}
