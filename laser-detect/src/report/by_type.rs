//! DProf's data profile (Pesterev et al., EuroSys 2010) for contention: the findings regrouped
//! by the data *type* their accesses touch rather than by cache line, so contention that code
//! profiles spread over many lines and functions adds up on the type that causes it.
//!
//! ```text
//!   finding #1 line 0x…2c0: args->SX (T1), args->SY (T2)      ┐
//!   finding #4 line 0x…300: args->SX (T3), args->SY (T4)      ├─▶ struct lreg_args: SX, SY
//!   finding #2 line 0x…4040: per[0].hits (T1), per[1].hits    ──▶ struct stat: hits (objects
//!                                                                  share lines)
//! ```
//!
//! [`profile`] builds the report's `types[]` from typed sources, [`coverage`] counts what was
//! typed, and [`render_types`] / [`render_fields`] print `laser report --by type` / `--by
//! field`. All of it reads only a [`Report`], so a saved JSON report renders the same views.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use crate::report::render_text::thousands as group;
use crate::report::type_fix;
use crate::report::{
    Coverage, FieldProfile, Finding, Report, TypeMember, TypeProfile, TypeSource, UntypedReason,
};

/// Source lines listed per type at most.
const MAX_SOURCES: usize = 8;

/// Layouts by type name (`struct lreg_args` → size and members), from DWARF at report time.
pub type Layouts = BTreeMap<String, (u64, Vec<TypeMember>)>;

/// The data profile of `findings`, most events first (ties: type name).
pub fn profile(findings: &[Finding], layouts: &Layouts, line_size: u32) -> Vec<TypeProfile> {
    /// Per member: events, ops, threads, kinds.
    type FieldAcc = (u64, BTreeSet<String>, BTreeSet<u32>, BTreeSet<String>);
    /// File, line, function, expression.
    type SourceKey = (Option<String>, Option<u32>, Option<String>, String);
    #[derive(Default)]
    struct Acc {
        size: u64,
        events: u64,
        lines: BTreeSet<u64>,
        kinds: BTreeMap<String, u64>,
        threads: BTreeSet<u32>,
        fields: BTreeMap<(u64, String), FieldAcc>,
        sources: BTreeMap<SourceKey, u64>,
        share_lines: bool,
    }
    let total: u64 = findings
        .iter()
        .flat_map(|f| &f.sources)
        .map(|s| s.events)
        .sum();
    let mut by: BTreeMap<String, Acc> = BTreeMap::new();
    for f in findings {
        let kind = f.kind.as_str().to_string();
        // (type, member) → line masks seen, for "objects share lines".
        let mut masks: BTreeMap<(&str, &str), BTreeSet<u32>> = BTreeMap::new();
        for s in &f.sources {
            let Some(t) = &s.data_type else { continue };
            let a = by.entry(t.type_name.clone()).or_default();
            a.size = t.size;
            a.events += s.events;
            a.lines.insert(f.line_addr);
            *a.kinds.entry(kind.clone()).or_default() += s.events;
            a.threads.extend(&s.threads);
            let fe = a.fields.entry((t.offset, t.member.clone())).or_default();
            fe.0 += s.events;
            fe.1.insert(s.op.as_str().to_string());
            fe.2.extend(&s.threads);
            fe.3.insert(kind.clone());
            *a.sources
                .entry((s.file.clone(), s.line, s.function.clone(), t.expr.clone()))
                .or_default() += s.events;
            // Each run of the instruction's bytes is the member in one object.
            masks
                .entry((t.type_name.as_str(), t.member.as_str()))
                .or_default()
                .extend(run_starts(s.mask()));
        }
        // One member at two places of one line: two objects of the type there.
        for ((ty, _), starts) in masks {
            if starts.len() > 1 || f.data.blocks.len() > 1 {
                if let Some(a) = by.get_mut(ty) {
                    a.share_lines = true;
                }
            }
        }
    }
    let mut out: Vec<TypeProfile> = by
        .into_iter()
        .map(|(name, a)| {
            let mut kinds: Vec<(String, u64)> = a.kinds.into_iter().collect();
            kinds.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
            let mut sources: Vec<TypeSource> = a
                .sources
                .into_iter()
                .map(|((file, line, function, expr), events)| TypeSource {
                    file,
                    line,
                    function,
                    expr,
                    events,
                })
                .collect();
            sources.sort_by(|x, y| {
                y.events
                    .cmp(&x.events)
                    .then((&x.file, x.line, &x.expr).cmp(&(&y.file, y.line, &y.expr)))
            });
            sources.truncate(MAX_SOURCES);
            let (size, layout) = layouts.get(&name).cloned().unwrap_or((a.size, Vec::new()));
            let mut p = TypeProfile {
                type_name: name,
                size,
                events: a.events,
                // Rounded: the JSON must read back equal.
                share: if total == 0 {
                    0.0
                } else {
                    (a.events as f64 / total as f64 * 1e4).round() / 1e4
                },
                lines: a.lines.len() as u64,
                kinds: kinds.into_iter().map(|k| k.0).collect(),
                threads: a.threads.into_iter().collect(),
                fields: a
                    .fields
                    .into_iter()
                    .map(
                        |((offset, member), (events, ops, threads, kinds))| FieldProfile {
                            member,
                            offset,
                            events,
                            ops: ops.into_iter().collect(),
                            threads: threads.into_iter().collect(),
                            kinds: kinds.into_iter().collect(),
                        },
                    )
                    .collect(),
                sources,
                objects_share_lines: a.share_lines,
                layout,
                fix: String::new(),
            };
            p.fix = type_fix::suggest(&p, line_size);
            p
        })
        .collect();
    out.sort_by(|x, y| y.events.cmp(&x.events).then(x.type_name.cmp(&y.type_name)));
    out
}

/// First byte of each run of set bits.
fn run_starts(mask: u128) -> Vec<u32> {
    (0..128)
        .filter(|&b| mask & (1u128 << b) != 0 && (b == 0 || mask & (1u128 << (b - 1)) == 0))
        .collect()
}

/// Typed and untyped sources of `findings`, or `None` when there are none.
pub fn coverage(findings: &[Finding]) -> Option<Coverage> {
    let mut c = Coverage::default();
    let mut reasons: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for s in findings.iter().flat_map(|f| &f.sources) {
        c.accesses += 1;
        c.events += s.events;
        if s.data_type.is_some() {
            c.typed += 1;
            c.typed_events += s.events;
        } else {
            let r = s.untyped.clone().unwrap_or_else(|| "not attempted".into());
            let e = reasons.entry(r).or_default();
            e.0 += 1;
            e.1 += s.events;
        }
    }
    c.untyped = reasons
        .into_iter()
        .map(|(reason, (accesses, events))| UntypedReason {
            reason,
            accesses,
            events,
        })
        .collect();
    c.untyped
        .sort_by(|a, b| b.accesses.cmp(&a.accesses).then(a.reason.cmp(&b.reason)));
    (c.accesses > 0).then_some(c)
}

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        "0.0%".into()
    } else {
        format!("{:.1}%", 100.0 * part as f64 / whole as f64)
    }
}

fn threads(ts: &[u32]) -> String {
    ts.iter()
        .map(|t| format!("T{t}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The report's `types[]`, or, for a saved report made before it existed, one built now
/// from its typed sources (without layouts).
fn types_of(r: &Report) -> Vec<TypeProfile> {
    if r.types.is_empty() {
        profile(&r.findings, &Layouts::new(), r.line_size)
    } else {
        r.types.clone()
    }
}

/// The coverage line both views and the text report print.
pub fn coverage_line(c: &Coverage) -> String {
    let mut s = format!(
        "typed {} of {} contended accesses ({} of events)",
        c.typed,
        c.accesses,
        pct(c.typed_events, c.events)
    );
    if !c.untyped.is_empty() {
        let why: Vec<String> = c
            .untyped
            .iter()
            .map(|u| format!("{} {}", u.accesses, u.reason))
            .collect();
        s.push_str(&format!("; untyped: {}", why.join(", ")));
    }
    s
}

/// `laser report --by type`: types ranked by contention events, each with its contended
/// members, threads, source lines, kinds and fix.
pub fn render_types(r: &Report) -> String {
    let types = types_of(r);
    let mut out = String::new();
    let total: u64 = types.iter().map(|t| t.events).sum();
    let _ = writeln!(
        out,
        "laser data profile: {} type{} with contended accesses, {} events",
        types.len(),
        if types.len() == 1 { "" } else { "s" },
        group(total)
    );
    if let Some(c) = &r.coverage {
        crate::report::render_text::wrap(&mut out, "", &coverage_line(c), 0);
    }
    for (i, t) in types.iter().enumerate() {
        let _ = writeln!(
            out,
            "\n#{}  {}  ({} bytes)  {} events ({:.1}% of contention)  {} line{}",
            i + 1,
            t.type_name,
            t.size,
            group(t.events),
            t.share * 100.0,
            t.lines,
            if t.lines == 1 { "" } else { "s" }
        );
        let kinds: Vec<String> = t.kinds.iter().map(|k| k.replace('_', " ")).collect();
        let _ = writeln!(out, "    kinds    {}", kinds.join(", "));
        let _ = writeln!(out, "    threads  {}", threads(&t.threads));
        if t.objects_share_lines {
            let _ = writeln!(out, "    objects  several objects of the type share a line");
        }
        let _ = writeln!(
            out,
            "    fields   offset  member               events  ops         threads"
        );
        for f in &t.fields {
            let member = if f.member.is_empty() {
                "(whole)"
            } else {
                f.member.as_str()
            };
            let _ = writeln!(
                out,
                "             {:<6}  {:<19}  {:>6}  {:<10}  {}",
                f.offset,
                member,
                group(f.events),
                f.ops.join(","),
                threads(&f.threads)
            );
        }
        let _ = writeln!(out, "    sources");
        for s in &t.sources {
            let at = match (&s.file, s.line) {
                (Some(f), Some(l)) => {
                    format!("{}:{l}", f.rsplit('/').next().unwrap_or(f))
                }
                _ => "?".into(),
            };
            let func = s
                .function
                .as_deref()
                .map(|f| format!(" in {f}"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "             {at}{func}  {}  {} events",
                s.expr,
                group(s.events)
            );
        }
        if !t.fix.is_empty() {
            crate::report::render_text::wrap(&mut out, "    fix:", &t.fix, 9);
        }
    }
    out
}

/// `laser report --by field`: every contended member of every type, most events first.
pub fn render_fields(r: &Report) -> String {
    let types = types_of(r);
    let mut rows: Vec<(&TypeProfile, &FieldProfile)> = types
        .iter()
        .flat_map(|t| t.fields.iter().map(move |f| (t, f)))
        .collect();
    rows.sort_by(|a, b| {
        b.1.events
            .cmp(&a.1.events)
            .then(a.0.type_name.cmp(&b.0.type_name))
            .then(a.1.offset.cmp(&b.1.offset))
    });
    let total: u64 = rows.iter().map(|r| r.1.events).sum();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "laser contended fields: {} member{} of {} type{}, {} events",
        rows.len(),
        if rows.len() == 1 { "" } else { "s" },
        types.len(),
        if types.len() == 1 { "" } else { "s" },
        group(total)
    );
    if let Some(c) = &r.coverage {
        crate::report::render_text::wrap(&mut out, "", &coverage_line(c), 0);
    }
    let _ = writeln!(
        out,
        "\n  events   share  type.member (offset)                      ops         kinds          threads"
    );
    for (t, f) in rows {
        let name = if f.member.is_empty() {
            format!("{} (+{})", t.type_name, f.offset)
        } else {
            format!("{}.{} (+{})", t.type_name, f.member, f.offset)
        };
        let kinds: Vec<String> = f.kinds.iter().map(|k| k.replace('_', " ")).collect();
        let _ = writeln!(
            out,
            "  {:>6}  {:>6}  {:<40}  {:<10}  {:<13}  {}",
            group(f.events),
            pct(f.events, total),
            name,
            f.ops.join(","),
            kinds.join(","),
            threads(&f.threads)
        );
    }
    out
}
