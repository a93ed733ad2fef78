//! `laser diff base.json new.json`: which contention is new, gone, worse or better between two
//! runs, for "no regression against main" gates. Findings are matched by data and source
//! lines (`matching`), never by address; rates are compared with their 95% intervals
//! (`interval`): a rate is worse or better only when the two intervals do not overlap, so the
//! noise of two runs on a busy runner reads as `unchanged`.

pub mod matching;
pub mod render;

use std::path::Path;

use anyhow::{Context, Result};
use laser_detect::report::{Finding, Report};

use crate::cli::{DiffArgs, DiffFormat};
use crate::gate::eval::{Subject, Val};
use crate::gate::metric::Metric;
use crate::gate::report::{describe, finding_value, rate, total_value};
use crate::interval::Estimate;

/// How a finding changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    New,
    Worse,
    Gone,
    Better,
    Unchanged,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::New => "new",
            Status::Worse => "worse",
            Status::Gone => "gone",
            Status::Better => "better",
            Status::Unchanged => "unchanged",
        }
    }
}

/// One finding of either run, matched or not.
#[derive(Clone, Debug)]
pub struct Entry {
    pub status: Status,
    pub base: Option<usize>,
    pub new: Option<usize>,
    pub base_rate: Estimate,
    pub new_rate: Estimate,
    /// new / base; infinite for new findings, 0 for gone ones.
    pub ratio: Estimate,
}

/// Two reports and how their findings correspond.
pub struct Diff<'a> {
    pub base: &'a Report,
    pub new: &'a Report,
    pub entries: Vec<Entry>,
}

impl<'a> Diff<'a> {
    pub fn new(base: &'a Report, new: &'a Report) -> Self {
        let pairs = matching::pair(&base.findings, &new.findings);
        let zero = Estimate::exact(0.0);
        let mut entries: Vec<Entry> = pairs
            .iter()
            .map(|&(b, n)| {
                let (br, nr) = (rate(&base.findings[b]), rate(&new.findings[n]));
                let status = if nr.lo > br.hi {
                    Status::Worse
                } else if nr.hi < br.lo {
                    Status::Better
                } else {
                    Status::Unchanged
                };
                Entry {
                    status,
                    base: Some(b),
                    new: Some(n),
                    base_rate: br,
                    new_rate: nr,
                    ratio: nr.ratio(br),
                }
            })
            .collect();
        for (n, f) in new.findings.iter().enumerate() {
            if !pairs.iter().any(|p| p.1 == n) {
                entries.push(Entry {
                    status: Status::New,
                    base: None,
                    new: Some(n),
                    base_rate: zero,
                    new_rate: rate(f),
                    ratio: Estimate::exact(f64::INFINITY),
                });
            }
        }
        for (b, f) in base.findings.iter().enumerate() {
            if !pairs.iter().any(|p| p.0 == b) {
                entries.push(Entry {
                    status: Status::Gone,
                    base: Some(b),
                    new: None,
                    base_rate: rate(f),
                    new_rate: zero,
                    ratio: zero,
                });
            }
        }
        entries.sort_by(|a, b| {
            a.status
                .cmp(&b.status)
                .then(b.new_rate.value.total_cmp(&a.new_rate.value))
                .then(b.base_rate.value.total_cmp(&a.base_rate.value))
        });
        Diff { base, new, entries }
    }

    /// The finding an entry stands for: the new run's, or the base run's when gone.
    pub fn finding(&self, e: &Entry) -> &'a Finding {
        match (e.new, e.base) {
            (Some(n), _) => &self.new.findings[n],
            (None, Some(b)) => &self.base.findings[b],
            (None, None) => unreachable!("an entry has at least one side"),
        }
    }

    pub fn count(&self, s: Status) -> usize {
        self.entries.iter().filter(|e| e.status == s).count()
    }

    /// The matched entry with the largest new/base ratio.
    fn max_ratio(&self) -> Option<&Entry> {
        self.entries
            .iter()
            .filter(|e| e.base.is_some() && e.new.is_some())
            .max_by(|a, b| a.ratio.value.total_cmp(&b.ratio.value))
    }
}

impl Subject for Diff<'_> {
    fn total(&self, m: Metric) -> Val {
        let n = |s: Status| Val::Num(Estimate::exact(self.count(s) as f64));
        match m {
            Metric::NewFindings => n(Status::New),
            Metric::GoneFindings => n(Status::Gone),
            Metric::WorseFindings | Metric::RegressedFindings => n(Status::Worse),
            Metric::BetterFindings => n(Status::Better),
            Metric::RegressedRateRatio => {
                Val::Num(self.max_ratio().map_or(Estimate::exact(0.0), |e| e.ratio))
            }
            m => total_value(self.new, m),
        }
    }

    fn items(&self) -> usize {
        self.entries.len()
    }

    fn item(&self, i: usize, m: Metric) -> Val {
        let e = &self.entries[i];
        match m {
            Metric::FindingStatus => Val::Text(vec![e.status.as_str().into()]),
            Metric::FindingBaseRate => Val::Num(e.base_rate),
            Metric::FindingRateRatio => Val::Num(e.ratio),
            Metric::FindingRate => Val::Num(e.new_rate),
            m => finding_value(self.finding(e), m),
        }
    }

    fn describe(&self, i: usize) -> String {
        let e = &self.entries[i];
        format!("{} {}", e.status.as_str(), describe(self.finding(e)))
    }

    /// A new run that could not observe contention may hide new findings.
    fn blind(&self) -> Option<String> {
        crate::gate::report::ReportSubject(self.new)
            .blind()
            .map(|why| format!("in the new run, {why}"))
    }
}

fn read(path: &Path) -> Result<Report> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Report::from_json(&text).with_context(|| format!("parsing {}", path.display()))
}

/// `laser diff`.
pub fn run(args: DiffArgs) -> Result<i32> {
    let base = read(&args.base)?;
    let new = read(&args.new)?;
    let diff = Diff::new(&base, &new);
    let (tripped, verdicts) = crate::gate::check_all(&args.fail_on, &diff);
    let gated = crate::output::gated_findings(&verdicts);
    let names = (
        args.base.display().to_string(),
        args.new.display().to_string(),
    );
    if !args.quiet {
        match args.format {
            DiffFormat::Text => print!("{}", render::text(&diff, &names)),
            DiffFormat::Json => print!("{}", render::json(&diff, &names)),
            DiffFormat::Github => print!("{}", render::github(&diff, &gated)),
        }
    }
    if let Some(path) = &args.json {
        crate::private_file::write(path, render::json(&diff, &names).as_bytes())
            .with_context(|| format!("writing the diff to {}", path.display()))?;
    }
    let format = match args.format {
        DiffFormat::Github => crate::cli::Format::Github,
        _ => crate::cli::Format::Text,
    };
    crate::output::print_verdicts(&verdicts, format);
    if let Some(path) = &args.junit {
        let title = format!("laser diff {} {}", names.0, names.1);
        crate::output::write_junit(path, &render::junit(&diff, &title, &verdicts, &gated))?;
    }
    Ok(crate::gate::exit_code(crate::exit::OK, tripped))
}
