//! One report's metrics for gates (`run`, `report`, `attach`; `diff` for the new side).

use laser_detect::report::{Finding, Report};
use laser_detect::Kind;

use super::eval::{Subject, Val};
use super::metric::Metric;
use crate::interval::Estimate;

/// The rate of a finding with its interval.
pub fn rate(f: &Finding) -> Estimate {
    Estimate::rate(f.rate_per_s, f.events)
}

/// The part of a finding's rate of one kind: `rate × kind_events / events`, with the interval
/// of that part's own count.
fn kind_rate(f: &Finding, kind: Kind) -> Estimate {
    let split = f.true_events + f.false_events;
    let part = match kind {
        Kind::FalseSharing => f.false_events,
        _ => f.true_events,
    };
    if split == 0 {
        // No split recorded (an old report): the whole line counts as its kind.
        return if f.kind == kind {
            rate(f)
        } else {
            Estimate::exact(0.0)
        };
    }
    Estimate::rate(f.rate_per_s * part as f64 / split as f64, part)
}

/// `fs.c:13` for the finding's top source with a line, else its function or symbol.
pub fn place(f: &Finding) -> String {
    f.sources
        .iter()
        .find_map(|s| {
            let file = s.file.as_deref()?;
            let name = file.rsplit('/').next().unwrap_or(file);
            Some(format!("{name}:{}", s.line?))
        })
        .or_else(|| f.sources.iter().find_map(|s| s.function.clone()))
        .or_else(|| f.sources.iter().find_map(|s| s.symbol.clone()))
        .unwrap_or_else(|| "unknown code".into())
}

/// `false_sharing on `counters` at fs.c:13`.
pub fn describe(f: &Finding) -> String {
    format!("{} on `{}` at {}", f.kind.as_str(), f.data.name, place(f))
}

/// A per-finding metric of one report's finding.
pub fn finding_value(f: &Finding, m: Metric) -> Val {
    let texts = |get: &dyn Fn(&laser_detect::report::Source) -> Option<String>| {
        let mut v: Vec<String> = Vec::new();
        for t in f.sources.iter().filter_map(get) {
            if !v.contains(&t) {
                v.push(t);
            }
        }
        Val::Text(v)
    };
    match m {
        Metric::FindingKind => Val::Text(vec![f.kind.as_str().to_owned()]),
        Metric::FindingRate => Val::Num(rate(f)),
        Metric::FindingEvents => Val::Num(Estimate::exact(f.events as f64)),
        Metric::FindingShare => Val::Num(Estimate::exact(f.share)),
        Metric::FindingFile => texts(&|s| s.file.clone()),
        Metric::FindingFunction => texts(&|s| s.function.clone().or_else(|| s.symbol.clone())),
        Metric::FindingData => Val::Text(vec![f.data.name.clone()]),
        _ => Val::Num(Estimate::exact(0.0)),
    }
}

/// A total of one report.
pub fn total_value(r: &Report, m: Metric) -> Val {
    let sum = |k: Option<Kind>| {
        Val::Num(Estimate::sum(r.findings.iter().map(|f| match k {
            Some(k) => kind_rate(f, k),
            None => rate(f),
        })))
    };
    match m {
        Metric::FalseSharingRate => sum(Some(Kind::FalseSharing)),
        Metric::TrueSharingRate => sum(Some(Kind::TrueSharing)),
        Metric::ContentionRate => sum(None),
        Metric::Findings => Val::Num(findings(r)),
        Metric::Lost => Val::Num(Estimate::exact(r.lost as f64)),
        Metric::Samples => Val::Num(Estimate::exact(r.samples as f64)),
        // A run with no overlap to measure (one thread, or no timer samples) hid nothing.
        Metric::Overlap => Val::Num(Estimate::exact(
            r.concurrency
                .as_ref()
                .and_then(|c| c.overlap)
                .unwrap_or(1.0),
        )),
        _ => Val::Num(Estimate::exact(0.0)),
    }
}

/// The number of findings, with the interval their rates allow: a finding whose rate's 95%
/// interval reaches below the report's threshold might not be listed in a rerun, so the low
/// end counts only the findings whose whole interval is at or above it. Lines below the
/// threshold are not listed one by one (only counted), so the high end is the listed count.
fn findings(r: &Report) -> Estimate {
    let n = r.findings.len() as f64;
    let sure = r
        .findings
        .iter()
        .filter(|f| rate(f).lo >= r.threshold)
        .count() as f64;
    Estimate {
        value: n,
        lo: sure,
        hi: n,
    }
}

/// Gates on one report: totals over its listed findings, `finding.*` over each.
pub struct ReportSubject<'a>(pub &'a Report);

impl Subject for ReportSubject<'_> {
    fn total(&self, m: Metric) -> Val {
        total_value(self.0, m)
    }

    fn items(&self) -> usize {
        self.0.findings.len()
    }

    fn item(&self, i: usize, m: Metric) -> Val {
        finding_value(&self.0.findings[i], m)
    }

    fn describe(&self, i: usize) -> String {
        format!("#{} {}", i + 1, describe(&self.0.findings[i]))
    }

    fn blind(&self) -> Option<String> {
        let c = self.0.concurrency.as_ref().filter(|c| c.low())?;
        Some(c.describe())
    }
}
