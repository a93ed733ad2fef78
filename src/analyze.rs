//! From a detector's analysis to the reports people and machines read.

use std::path::Path;

use anyhow::{Context, Result};
use laser_detect::{
    build_report, render_text, Analysis, Detector, ElfCode, Report, ReportOptions, Symbolizer,
};

use crate::cli::AnalysisArgs;

/// A detector reading code from the ELF files the target maps.
pub fn detector(args: &AnalysisArgs, duration_s: Option<f64>) -> Detector<ElfCode> {
    let config = laser_detect::Config {
        line_size: args.line,
        duration_s,
        ..Default::default()
    };
    Detector::new(config, ElfCode::new())
}

/// Symbolizes, thresholds and prints (text unless `--quiet`, JSON if `--json`).
pub fn emit(analysis: &Analysis, args: &AnalysisArgs) -> Result<Report> {
    let opts = ReportOptions {
        threshold: args.threshold,
        ..Default::default()
    };
    let mut symbolizer = Symbolizer::new();
    let report = build_report(analysis, &mut symbolizer, &opts);
    if !args.quiet {
        print!("{}", render_text(&report));
    }
    if let Some(path) = &args.json {
        write_json(&report, path)?;
    }
    Ok(report)
}

fn write_json(report: &Report, path: &Path) -> Result<()> {
    std::fs::write(path, report.to_json() + "\n")
        .with_context(|| format!("writing the JSON report to {}", path.display()))
}
