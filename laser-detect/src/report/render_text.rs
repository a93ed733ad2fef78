//! The report as text for people: what was measured (and what was lost), then each contended
//! line with a byte map of who touches which bytes, the source lines, the data, and the fix.
//!
//! ```text
//! #1  FALSE SHARING  48,210 ev/s  (91.0% of contention, 96,420 events)  line 0x555555558080
//!     data     global `acc` (struct acc[4]) in /src/lr
//!     offset   0        8        16       24       32       40       48       56
//!     line     WWWWWWWW ........ ........ WWWWWWWW ........ ........ ........ ........
//!     a T101   WWWWWWWW ........ ........ ........ ........ ........ ........ ........
//!     b T102   ........ ........ ........ WWWWWWWW ........ ........ ........ ........
//!     a  lr.c:59 in worker   store [0..8) acc[0].sum_x   25,000 ev/s (52%)
//!          | acc[id].sum_x += i;
//! ```
//!
//! Output is a pure function of the [`Report`] (sorted, fixed precision), so it is
//! golden-tested.

use std::collections::BTreeSet;
use std::fmt::Write;

use crate::model::findings::{Kind, Op};
use crate::report::fix::byte_ranges;
use crate::report::{CalledFrom, Finding, Report, Source};

const WRAP: usize = 100;
/// Sources listed per finding in text.
pub const MAX_SOURCES: usize = 12;

/// `48210.4` → `48,210`.
pub(crate) fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn rate(r: f64) -> String {
    if r.is_finite() && r >= 0.0 {
        thousands(r.round() as u64)
    } else {
        "?".into()
    }
}

fn percent(x: f64) -> String {
    if x.is_finite() {
        format!("{:.1}%", x * 100.0)
    } else {
        "?%".into()
    }
}

fn kind_title(k: Kind) -> &'static str {
    match k {
        Kind::FalseSharing => "FALSE SHARING",
        Kind::TrueSharing => "TRUE SHARING",
        Kind::Mixed => "MIXED TRUE/FALSE SHARING",
    }
}

fn op_char(op: Op) -> char {
    match op {
        Op::Load => 'R',
        Op::Store => 'W',
        Op::Rmw => 'X',
    }
}

/// Source labels a, b, …, z, aa, ab, … (the byte-map rows and source lines share them).
pub fn label(i: usize) -> String {
    let letters = b"abcdefghijklmnopqrstuvwxyz";
    if i < 26 {
        (letters[i] as char).to_string()
    } else {
        format!("{}{}", label(i / 26 - 1), letters[i % 26] as char)
    }
}

fn threads(ts: &[u32]) -> String {
    ts.iter()
        .map(|t| format!("T{t}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Greedy word wrap of `text` after `first` (already written), continuation lines indented.
pub(crate) fn wrap(out: &mut String, first: &str, text: &str, indent: usize) {
    let mut line = first.to_string();
    // `empty`: nothing on the line yet that the next word must be separated from.
    let mut empty = first.trim().is_empty();
    for word in words(text) {
        let word = word.as_str();
        if !empty && line.chars().count() + 1 + word.chars().count() > WRAP {
            out.push_str(line.trim_end());
            out.push('\n');
            line = " ".repeat(indent);
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    out.push_str(line.trim_end());
    out.push('\n');
}

/// Whitespace-separated words, except that a `code span` stays one unbreakable word.
fn words(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut open = false;
    for w in text.split_whitespace() {
        match out.last_mut() {
            Some(last) if open => {
                last.push(' ');
                last.push_str(w);
            }
            _ => out.push(w.to_string()),
        }
        if w.matches('`').count() % 2 == 1 {
            open = !open;
        }
    }
    out
}

/// The whole report as text.
pub fn render_text(r: &Report) -> String {
    let mut out = String::new();
    header(&mut out, r);
    for (i, f) in r.findings.iter().enumerate() {
        out.push('\n');
        finding(&mut out, i + 1, f, r.line_size);
    }
    out
}

fn header(out: &mut String, r: &Report) {
    let _ = writeln!(
        out,
        "laser report: backend {}, {:.2} s, {} samples ({} filtered), {} lost, threshold {} ev/s",
        r.backend,
        r.duration_s,
        thousands(r.samples),
        thousands(r.filtered),
        thousands(r.lost),
        rate(r.threshold)
    );
    if r.lost > 0 {
        let total = r.samples.saturating_add(r.lost);
        let pct = r.lost as f64 / total.max(1) as f64;
        wrap(
            out,
            "!! LOST",
            &format!(
                "{} samples ({} of all): the kernel dropped them because they were not read \
                 in time. Rates are underestimates and short bursts of contention may be missing.",
                thousands(r.lost),
                percent(pct)
            ),
            3,
        );
    }
    if r.throttles > 0 {
        wrap(
            out,
            "!! THROTTLED",
            &format!(
                "{} times: the kernel lowered the sampling rate \
                 (kernel.perf_event_max_sample_rate). Rates are underestimates.",
                thousands(r.throttles)
            ),
            3,
        );
    }
    for n in &r.notes {
        wrap(out, "note:", n, 6);
    }
    let b = &r.below_threshold;
    let below = match (b.lines, b.thin) {
        (0, _) => String::new(),
        (_, 0) => format!(
            "; {} more below it ({} events) not shown",
            thousands(b.lines),
            thousands(b.events)
        ),
        _ => format!(
            "; {} more below it or rated from too few events to be above it ({} of them, \
             fewer than {} events each; {} events in all) not shown",
            thousands(b.lines),
            thousands(b.thin),
            crate::report::MIN_FINDING_EVENTS,
            thousands(b.events)
        ),
    };
    if r.findings.is_empty() {
        let _ = writeln!(
            out,
            "No contended cache lines at or above {} ev/s{below}.",
            rate(r.threshold)
        );
        return;
    }
    let _ = writeln!(
        out,
        "{} contended cache line{} at or above {} ev/s{below}.",
        r.findings.len(),
        if r.findings.len() == 1 { "" } else { "s" },
        rate(r.threshold),
    );
    if let Some(c) = &r.coverage {
        wrap(out, "types:", &crate::report::by_type::coverage_line(c), 7);
    }
    let _ = writeln!(
        out,
        "byte map: R read  W write  X read+write (rmw)  * true sharing: 2+ threads, one writes  . not seen"
    );
}

fn data_line(f: &Finding) -> String {
    let d = &f.data;
    match d.kind.as_str() {
        "global" => {
            let objs = if d.objects.is_empty() {
                format!("`{}`", d.name)
            } else {
                d.objects
                    .iter()
                    .map(|o| match &o.type_name {
                        Some(t) => format!("`{}` ({t})", o.name),
                        None => format!("`{}` ({} bytes)", o.name, o.size),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            match &d.module {
                Some(m) => format!("global {objs} in {m}"),
                None => format!("global {objs}"),
            }
        }
        "heap" if !d.blocks.is_empty() => {
            let list: Vec<String> = d
                .blocks
                .iter()
                .map(|b| {
                    let arena = match b.arena.as_str() {
                        "mmap" => "its own mmap".to_string(),
                        a => format!("{a} arena"),
                    };
                    let state = match b.state.as_str() {
                        "in_use" | "mmapped" => String::new(),
                        "top" => ", top chunk".to_string(),
                        st => format!(", {st}"),
                    };
                    format!(
                        "heap block {:#x} ({} bytes, {arena}{state}){}",
                        b.addr,
                        b.size,
                        alloc_site_text(b)
                    )
                })
                .collect();
            // One block per line: addresses make long lines.
            list.join("\n             ")
        }
        "heap" => "heap object (allocation site not tracked)".into(),
        "stack" if d.name.starts_with("stack of ") => format!(
            "{}'s stack, reached by other threads (a local shared through a pointer)",
            &d.name["stack of ".len()..]
        ),
        "stack" if d.name == "shared stack" => {
            "a thread's stack, reached by other threads (a local shared through a pointer)".into()
        }
        "stack" => "stack".into(),
        _ => "unknown (not in any mapping)".into(),
    }
}

/// `, allocated at fs.c:30 in main via xmalloc (24 bytes requested)`, or nothing.
fn alloc_site_text(b: &crate::report::HeapBlock) -> String {
    let Some(site) = &b.alloc_site else {
        return String::new();
    };
    let at = match (&site.file, site.line) {
        (Some(f), Some(l)) => format!("{}:{l}", short_path(f)),
        _ => "an unknown line".to_string(),
    };
    let func = site
        .function
        .as_ref()
        .map(|f| format!(" in {f}"))
        .unwrap_or_default();
    let via: Vec<&str> = site
        .frames
        .iter()
        .filter(|f| f.skipped.as_deref() == Some("wrapper"))
        .filter_map(|f| f.function.as_deref())
        .collect();
    let via = if via.is_empty() {
        String::new()
    } else {
        format!(" via {}", via.join(" ← "))
    };
    let req = b
        .requested_size
        .map(|n| format!(" ({n} bytes requested)"))
        .unwrap_or_default();
    format!(", allocated at {at}{func}{via}{req}")
}

fn short_path(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

fn finding(out: &mut String, n: usize, f: &Finding, line_size: u32) {
    let _ = writeln!(
        out,
        "#{n}  {}  {} ev/s  ({} of contention, {} events)  line {:#x}{}",
        kind_title(f.kind),
        rate(f.rate_per_s),
        percent(f.share),
        thousands(f.events),
        f.line_addr,
        f.process
            .map_or(String::new(), |p| format!(" in forked process {p}"))
    );
    if f.kind == Kind::Mixed {
        let _ = writeln!(
            out,
            "    split    {} true-sharing, {} false-sharing events",
            thousands(f.true_events),
            thousands(f.false_events)
        );
    }
    if let Some(e) = &f.extent {
        let _ = writeln!(
            out,
            "    extent   {} lines {:#x}..{:#x} ({} bytes): migratory, the same code makes \
             them hot one after another; the byte map lays them on one line",
            e.lines, e.start, e.end, e.bytes
        );
    }
    let _ = writeln!(out, "    data     {}", data_line(f));
    // Outside the globals (named by their variables already), the type the accesses go
    // through names the data.
    if f.data.kind != "global" && !f.data.types.is_empty() {
        let types: Vec<String> = f.data.types.iter().map(|t| format!("`{t}`")).collect();
        let _ = writeln!(out, "    type     {}", types.join(", "));
    }
    if f.data.kind != "global" && !f.data.type_fields.is_empty() {
        wrap(out, "    fields  ", &f.data.type_fields.join(", "), 13);
        if !f.data.fields.is_empty() {
            wrap(out, "    bytes   ", &f.data.fields.join(", "), 13);
        }
    } else if !f.data.fields.is_empty() {
        wrap(out, "    fields  ", &f.data.fields.join(", "), 13);
    }
    let _ = writeln!(
        out,
        "    threads  {}",
        threads(&f.threads).replace(',', ", ")
    );
    // A line with dozens of contending instructions would bury the fix: show the top ones
    // (sources are sorted by events) and sum up the rest; JSON keeps them all.
    let shown = &f.sources[..f.sources.len().min(MAX_SOURCES)];
    byte_map(out, f, shown, line_size);
    for (i, s) in shown.iter().enumerate() {
        source(out, &label(i), s, f);
    }
    let rest = &f.sources[shown.len()..];
    if !rest.is_empty() {
        let events: u64 = rest.iter().map(|s| s.events).sum();
        let _ = writeln!(
            out,
            "    +{} more source{} ({} events) in the JSON report",
            rest.len(),
            if rest.len() == 1 { "" } else { "s" },
            thousands(events)
        );
    }
    wrap(out, "    fix:", &f.fix, 9);
}

/// Rows of one char per byte, in groups of 8, one 64-byte chunk at a time.
fn byte_map(out: &mut String, f: &Finding, shown: &[Source], line_size: u32) {
    let size = line_size.clamp(1, 128) as usize;
    // Summary row: union of ops; '*' where 2+ threads touch a byte and one of them writes.
    let mut summary = vec!['.'; size];
    for (b, cell) in summary.iter_mut().enumerate() {
        let touching: Vec<&Source> = f
            .sources
            .iter()
            .filter(|s| s.mask() & (1u128 << b) != 0)
            .collect();
        if touching.is_empty() {
            continue;
        }
        let ts: BTreeSet<u32> = touching
            .iter()
            .flat_map(|s| s.threads.iter().copied())
            .collect();
        let writes = touching.iter().any(|s| s.op.writes());
        let reads = touching.iter().any(|s| s.op.reads());
        // The line model's kind is authoritative: a false-sharing line has no byte two
        // threads share, even when an analysis merged threads into one source.
        *cell = if ts.len() >= 2 && writes && f.kind != Kind::FalseSharing {
            '*'
        } else if writes && reads {
            'X'
        } else if writes {
            'W'
        } else {
            'R'
        };
    }
    let labels: Vec<String> = shown
        .iter()
        .enumerate()
        .map(|(i, s)| format!("{} {}", label(i), threads(&s.threads)))
        .collect();
    let width = labels
        .iter()
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(0)
        .max(6)
        + 2;
    for chunk in (0..size).step_by(64) {
        let end = (chunk + 64).min(size);
        let mut head = format!("    {:<width$}", "offset");
        for g in (chunk..end).step_by(8) {
            head.push_str(&format!("{g:<9}"));
        }
        let _ = writeln!(out, "{}", head.trim_end());
        let row = |cells: &dyn Fn(usize) -> char| -> String {
            (chunk..end)
                .step_by(8)
                .map(|g| (g..(g + 8).min(end)).map(cells).collect::<String>())
                .collect::<Vec<_>>()
                .join(" ")
        };
        let _ = writeln!(out, "    {:<width$}{}", "line", row(&|b| summary[b]));
        for (s, l) in shown.iter().zip(&labels) {
            let mask = s.mask();
            let c = op_char(s.op);
            let cells = row(&|b| if mask & (1u128 << b) != 0 { c } else { '.' });
            let _ = writeln!(out, "    {l:<width$}{cells}");
        }
    }
}

fn where_(s: &Source) -> String {
    let func = s.function.as_deref().or(s.symbol.as_deref());
    match (&s.file, s.line) {
        (Some(file), Some(line)) => {
            let base = file.rsplit('/').next().unwrap_or(file);
            match func {
                Some(fun) => format!("{base}:{line} in {fun}"),
                None => format!("{base}:{line}"),
            }
        }
        _ => {
            let at = match (&s.module, s.offset) {
                (Some(m), Some(o)) => {
                    format!("{}+{o:#x}", m.rsplit('/').next().unwrap_or(m))
                }
                _ => return format!("pc {:#x} (code not in a file)", s.pc),
            };
            let why = if s.debug_info {
                "no line info"
            } else {
                "no debug info"
            };
            match s.symbol.as_deref().or(func) {
                Some(sym) => format!("{sym} ({at}, {why})"),
                None => format!("{at} ({why})"),
            }
        }
    }
}

fn source(out: &mut String, label: &str, s: &Source, f: &Finding) {
    let share = if f.events > 0 {
        s.events as f64 / f.events as f64
    } else {
        0.0
    };
    let fields = match &s.data_type {
        Some(t) if f.data.kind != "global" => format!(" {}", t.expr),
        _ if s.fields.is_empty() => String::new(),
        _ => format!(" {}", s.fields.join(", ")),
    };
    let _ = writeln!(
        out,
        "    {label:<2} {}   {} {}{fields}   {} ev/s ({})",
        where_(s),
        s.op.as_str(),
        byte_ranges(s.mask()),
        rate(f.rate_per_s * share),
        percent(share)
    );
    let pad = " ".repeat(label.len().max(2) + 5);
    if let Some(text) = &s.text {
        let _ = writeln!(out, "{pad}| {text}");
    }
    let at = |frame: &crate::report::Inlined| match (&frame.file, frame.line) {
        (Some(file), Some(line)) => {
            format!(" at {}:{line}", file.rsplit('/').next().unwrap_or(file))
        }
        _ => String::new(),
    };
    // Outermost library frame first: the order a reader follows from their own line down
    // to the header line that holds the instruction.
    for frame in s.library_frames.iter().rev() {
        let _ = writeln!(
            out,
            "{pad}via {}{}",
            frame.function.as_deref().unwrap_or("?"),
            at(frame)
        );
    }
    for frame in &s.inlined {
        let _ = writeln!(
            out,
            "{pad}inlined into {}{}",
            frame.function.as_deref().unwrap_or("?"),
            at(frame)
        );
    }
    if !s.called_from.is_empty() {
        let sites: Vec<String> = s
            .called_from
            .iter()
            .map(|c| format!("{} ({})", call_site(c), percent(c.share)))
            .collect();
        let first = format!("{pad}called from");
        wrap(out, &first, &sites.join(", "), first.len() + 1);
    }
}

/// Where a call site is: `file:line in function`, else symbol or module+offset.
fn call_site(c: &CalledFrom) -> String {
    match (&c.file, c.line, &c.function) {
        (Some(file), Some(line), f) => {
            let base = file.rsplit('/').next().unwrap_or(file);
            match f {
                Some(fun) => format!("{base}:{line} in {fun}"),
                None => format!("{base}:{line}"),
            }
        }
        _ => match (&c.symbol, &c.module, c.offset) {
            (Some(sym), _, _) => sym.clone(),
            (None, Some(m), Some(o)) => format!("{}+{o:#x}", m.rsplit('/').next().unwrap_or(m)),
            _ => format!("{:#x}", c.ret),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_labels() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(48210), "48,210");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(rate(f64::NAN), "?");
        assert_eq!(label(0), "a");
        assert_eq!(label(25), "z");
        assert_eq!(label(26), "aa");
        assert_eq!(label(27), "ab");
    }

    #[test]
    fn wrap_keeps_lines_short_and_words_whole() {
        let mut out = String::new();
        let text = "word ".repeat(60);
        wrap(&mut out, "    fix:", &text, 9);
        assert!(out.lines().count() > 2);
        for l in out.lines() {
            assert!(l.len() <= WRAP, "{l}");
        }
        assert!(out.lines().skip(1).all(|l| l.starts_with("         word")));
        assert_eq!(out.split_whitespace().filter(|w| *w == "word").count(), 60);
        // Code spans are never split across lines.
        let mut out = String::new();
        wrap(
            &mut out,
            "x",
            &format!("{} `if (a != v) a = v;` end", "w ".repeat(45)),
            2,
        );
        assert!(out.contains("`if (a != v) a = v;`"), "{out}");
    }
}
