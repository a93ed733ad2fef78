//! `laser diff` output: text for people, JSON (`laser-diff/1`) for machines, GitHub
//! annotations and JUnit for CI.

use serde::Serialize;

use super::{Diff, Entry, Status};
use crate::gate::eval::fmt_num;
use crate::gate::report::place;
use crate::gate::Verdict;
use crate::interval::Estimate;

/// Schema name of the diff JSON.
pub const SCHEMA: &str = "laser-diff/1";

/// `10,770/s (95% 8,110–14,010)`, or `—` for a side without the finding.
fn rate(e: &Estimate, present: bool) -> String {
    if !present {
        return "—".into();
    }
    if e.is_exact() {
        return format!("{}/s", fmt_num(e.value));
    }
    format!(
        "{}/s (95% {}–{})",
        fmt_num(e.value),
        fmt_num(e.lo),
        fmt_num(e.hi)
    )
}

fn ratio(e: &Entry) -> String {
    match e.status {
        Status::New => "new".into(),
        Status::Gone => "gone".into(),
        _ => format!("x{:.2}", e.ratio.value),
    }
}

/// The text comparison: one line per finding, grouped new, worse, gone, better, unchanged.
pub fn text(d: &Diff<'_>, names: &(String, String)) -> String {
    let mut out = format!(
        "laser diff: {} ({} findings, {:.2} s) → {} ({} findings, {:.2} s)\n",
        names.0,
        d.base.findings.len(),
        d.base.duration_s,
        names.1,
        d.new.findings.len(),
        d.new.duration_s
    );
    for e in &d.entries {
        let f = d.finding(e);
        out.push_str(&format!(
            "{:<9} {:<13} `{}` at {}: {} → {} ({})\n",
            e.status.as_str(),
            f.kind.as_str(),
            f.data.name,
            place(f),
            rate(&e.base_rate, e.base.is_some()),
            rate(&e.new_rate, e.new.is_some()),
            ratio(e)
        ));
        if let (Some(b), Some(n)) = (e.base, e.new) {
            let (bk, nk) = (d.base.findings[b].kind, d.new.findings[n].kind);
            if bk != nk {
                out.push_str(&format!(
                    "          kind changed: {} → {}\n",
                    bk.as_str(),
                    nk.as_str()
                ));
            }
        }
    }
    out.push_str(&format!(
        "{} new, {} worse, {} gone, {} better, {} unchanged (worse/better: the 95% intervals \
         do not overlap)\n",
        d.count(Status::New),
        d.count(Status::Worse),
        d.count(Status::Gone),
        d.count(Status::Better),
        d.count(Status::Unchanged)
    ));
    out
}

#[derive(Serialize)]
struct Side {
    /// Index in that report's `findings`.
    index: usize,
    #[serde(serialize_with = "hex")]
    line_addr: u64,
    rate_per_s: f64,
    rate_lo: f64,
    rate_hi: f64,
    events: u64,
}

fn hex<S: serde::Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{v:#x}"))
}

#[derive(Serialize)]
struct JsonEntry {
    status: &'static str,
    kind: &'static str,
    data: String,
    place: String,
    /// Source keys the match was made on (`dir/file.c:13`).
    sources: Vec<String>,
    base: Option<Side>,
    new: Option<Side>,
    /// new / base rate; null for new (infinite) findings.
    rate_ratio: Option<f64>,
}

#[derive(Serialize)]
struct Summary {
    new: usize,
    worse: usize,
    gone: usize,
    better: usize,
    unchanged: usize,
}

#[derive(Serialize)]
struct JsonDiff {
    schema: &'static str,
    base: String,
    new: String,
    summary: Summary,
    entries: Vec<JsonEntry>,
}

/// The comparison as pretty JSON (`laser-diff/1`), with a trailing newline.
pub fn json(d: &Diff<'_>, names: &(String, String)) -> String {
    let side = |r: &laser_detect::Report, i: Option<usize>, e: &Estimate| {
        i.map(|i| Side {
            index: i,
            line_addr: r.findings[i].line_addr,
            rate_per_s: e.value,
            rate_lo: e.lo,
            rate_hi: e.hi,
            events: r.findings[i].events,
        })
    };
    let j = JsonDiff {
        schema: SCHEMA,
        base: names.0.clone(),
        new: names.1.clone(),
        summary: Summary {
            new: d.count(Status::New),
            worse: d.count(Status::Worse),
            gone: d.count(Status::Gone),
            better: d.count(Status::Better),
            unchanged: d.count(Status::Unchanged),
        },
        entries: d
            .entries
            .iter()
            .map(|e| {
                let f = d.finding(e);
                JsonEntry {
                    status: e.status.as_str(),
                    kind: f.kind.as_str(),
                    data: f.data.name.clone(),
                    place: place(f),
                    sources: f
                        .sources
                        .iter()
                        .filter_map(super::matching::source_key)
                        .collect(),
                    base: side(d.base, e.base, &e.base_rate),
                    new: side(d.new, e.new, &e.new_rate),
                    rate_ratio: Some(e.ratio.value).filter(|r| r.is_finite()),
                }
            })
            .collect(),
    };
    let mut s = serde_json::to_string_pretty(&j).unwrap_or_default();
    s.push('\n');
    s
}

/// GitHub annotations for new and worse findings (`::error` where a gate tripped on them).
pub fn github(d: &Diff<'_>, gated: &[usize]) -> String {
    let mut shown = d.new.clone();
    shown.findings.clear();
    let mut gated_shown = Vec::new();
    for (i, e) in d.entries.iter().enumerate() {
        if let (Status::New | Status::Worse, Some(n)) = (e.status, e.new) {
            if gated.contains(&i) {
                gated_shown.push(shown.findings.len());
            }
            let mut f = d.new.findings[n].clone();
            // The annotation's title says what changed.
            f.data.name = format!("{} ({} {})", f.data.name, e.status.as_str(), ratio(e));
            shown.findings.push(f);
        }
    }
    crate::output::github::annotations(&shown, &gated_shown)
}

/// JUnit: a case per gate and per new or worse finding (failed when a gate tripped on it).
pub fn junit(d: &Diff<'_>, title: &str, verdicts: &[Verdict], gated: &[usize]) -> String {
    use crate::output::junit::{gate_cases, suite, Case};
    let mut cases = gate_cases(verdicts);
    for (i, e) in d.entries.iter().enumerate() {
        if !matches!(e.status, Status::New | Status::Worse) {
            continue;
        }
        let f = d.finding(e);
        let name = format!(
            "{} {} on `{}` at {}",
            e.status.as_str(),
            f.kind.as_str(),
            f.data.name,
            place(f)
        );
        let out = format!(
            "{} → {} ({})\n",
            rate(&e.base_rate, e.base.is_some()),
            rate(&e.new_rate, e.new.is_some()),
            ratio(e)
        );
        cases.push(Case {
            classname: "laser.diff".into(),
            failure: gated.contains(&i).then(|| {
                (
                    format!("{name}: a --fail-on gate tripped on it"),
                    out.clone(),
                )
            }),
            name,
            output: out,
        });
    }
    suite(title, d.new.duration_s, &cases)
}
