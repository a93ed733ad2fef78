//! Golden text and JSON reports over a synthetic analysis of `fixtures/lr.c`, compiled at test
//! time: the addresses are the program's own (from `nm`/`readelf`), so symbolization, DWARF
//! data names and fixes are real. Goldens live in `tests/fixtures/`; regenerate them on
//! purpose with `LASER_BLESS=1 cargo test -p laser-detect --test report_golden`.
//!
//! Addresses depend on the compiler's code layout, so before comparing, every address the
//! test put in (and every `symbol+offset` derived from one) is replaced by a named
//! placeholder such as `<pc:sum_x>`: a new gcc moves code without breaking the goldens, while
//! anything else the reporter prints is compared byte for byte.

mod report_common;

use std::collections::HashMap;

use laser_detect::model::findings::{
    Analysis, CallSite, Kind, LineFinding, Location, ModuleInfo, Op, SourceAccess,
};
use laser_detect::{build_report, render_text, Report, ReportOptions};
use laser_driver::BackendKind;
use report_common::{build, golden, marker, Built, BIAS, MODULE};

/// Named addresses used in the analysis, for building it and for normalizing output.
struct Addrs {
    /// placeholder name → address (all ≥ 0x1000, so no small number in the text is mistaken
    /// for one)
    named: Vec<(String, u64)>,
    /// `symbol+0xoff` strings → placeholder: offsets are small numbers, so they are only
    /// replaced right after their symbol's name.
    sym_offsets: Vec<(String, String)>,
    /// Text symbols of the program (`nm`), sorted, to name `symbol+offset`s.
    text_symbols: Vec<(u64, String)>,
}

/// Bytes `[start, end)` of a line as a bitmap.
fn bytes(start: u32, end: u32) -> u128 {
    (start..end).fold(0u128, |m, b| m | (1u128 << b))
}

impl Addrs {
    fn add(&mut self, name: &str, value: u64) -> u64 {
        assert!(
            value >= 0x1000,
            "{name} = {value:#x} is too small to replace safely"
        );
        self.named.push((name.to_string(), value));
        value
    }

    /// Replaces each whole `symbol+0x…` written for a source, then each whole `0x…` token
    /// whose value was named (first name wins).
    fn normalize(&self, text: &str) -> String {
        let mut text = text.to_string();
        for (from, to) in &self.sym_offsets {
            let mut out = String::new();
            let mut rest = text.as_str();
            while let Some(i) = rest.find(from.as_str()) {
                let after = &rest[i + from.len()..];
                let whole = !after.starts_with(|c: char| c.is_ascii_hexdigit());
                out.push_str(&rest[..i]);
                out.push_str(if whole { to } else { from });
                rest = after;
            }
            out.push_str(rest);
            text = out;
        }
        let text = text.as_str();
        let mut names: HashMap<u64, &str> = HashMap::new();
        for (n, v) in &self.named {
            names.entry(*v).or_insert(n);
        }
        let mut out = String::new();
        let mut rest = text;
        while let Some(i) = rest.find("0x") {
            out.push_str(&rest[..i]);
            let tail = &rest[i + 2..];
            let len = tail.bytes().take_while(u8::is_ascii_hexdigit).count();
            let value = u64::from_str_radix(&tail[..len], 16).ok();
            match value.and_then(|v| names.get(&v)) {
                Some(n) if len > 0 => out.push_str(&format!("<{n}>")),
                _ => out.push_str(&rest[i..i + 2 + len]),
            }
            rest = &tail[len..];
        }
        out.push_str(rest);
        out
    }
}

impl Addrs {
    fn src(
        &mut self,
        name: &str,
        vaddr: u64,
        op: Op,
        offsets: u128,
        events: u64,
        threads: &[u32],
    ) -> SourceAccess {
        self.add(&format!("off:{name}"), vaddr);
        self.add(&format!("pc:{name}"), BIAS + vaddr);
        // The symbol+offset the report shows for this pc.
        let containing = self
            .text_symbols
            .iter()
            .rev()
            .find(|(s, _)| *s <= vaddr)
            .cloned();
        if let Some((start, sym)) = containing {
            let shown = format!("{sym}+{:#x}", vaddr - start);
            if !self.sym_offsets.iter().any(|(f, _)| *f == shown) {
                self.sym_offsets
                    .push((shown, format!("{sym}+<symoff:{name}>")));
            }
        }
        SourceAccess {
            pc: BIAS + vaddr,
            code: Location::Module {
                path: MODULE.into(),
                vaddr,
            },
            op,
            offsets,
            events,
            threads: threads.to_vec(),
            called_from: vec![],
        }
    }
}

fn line(
    a: &mut Addrs,
    name: &str,
    data: Location,
    kind: Kind,
    rate: f64,
    share: f64,
    sources: Vec<SourceAccess>,
) -> LineFinding {
    let events: u64 = sources.iter().map(|s| s.events).sum();
    let vaddr = match &data {
        Location::Module { vaddr, .. } => *vaddr,
        // Heap, stack, unknown: a made-up run-time line of their own.
        _ => 0x7f00_0000_1000 + 0x40 * a.named.len() as u64 - BIAS,
    };
    let line_addr = a.add(&format!("line:{name}"), BIAS + vaddr);
    let mut threads: Vec<u32> = sources.iter().flat_map(|s| s.threads.clone()).collect();
    threads.sort();
    threads.dedup();
    let (true_events, false_events) = match kind {
        Kind::FalseSharing => (0, events),
        Kind::TrueSharing => (events, 0),
        Kind::Mixed => (events / 2, events - events / 2),
    };
    LineFinding {
        line_addr,
        line_size: 64,
        kind,
        events,
        true_events,
        false_events,
        rate_per_s: rate,
        share,
        threads,
        data,
        sources,
        process: None,
        by_code: false,
        front: false,
    }
}

/// The analysis a run of lr would produce: every data shape of lr.c, plus a heap line, a
/// stack line with code outside any file, and one line under the threshold.
fn analysis(b: &Built) -> (Analysis, Addrs) {
    let mut a = Addrs {
        named: vec![],
        sym_offsets: vec![],
        text_symbols: b.text_symbols(),
    };
    let nm = b.nm();
    let lines = b.line_table();
    let at = |m: &str, nth: usize| {
        let v = &lines[&marker(m)];
        v[nth.min(v.len() - 1)]
    };
    let global = |a: &mut Addrs, sym: &str| {
        let v = a.add(&format!("data:{sym}"), nm[sym]);
        Location::Module {
            path: MODULE.into(),
            vaddr: v,
        }
    };
    let (t1, t2) = (101, 102);
    let mut findings = Vec::new();

    let data = global(&mut a, "acc");
    let s = vec![
        a.src(
            "sum_x",
            at("sum_x", 0),
            Op::Store,
            bytes(0, 8),
            52_000,
            &[t1],
        ),
        a.src(
            "sum_x",
            at("sum_x", 0),
            Op::Store,
            bytes(24, 32),
            41_000,
            &[t2],
        ),
        a.src(
            "sum_x.load",
            at("sum_x", 0),
            Op::Load,
            bytes(0, 8) | bytes(24, 32),
            3_420,
            &[t1, t2],
        ),
    ];
    findings.push(line(
        &mut a,
        "acc",
        data,
        Kind::FalseSharing,
        48_210.0,
        0.5120,
        s,
    ));

    let data = global(&mut a, "hits_a");
    let bump = lines[&marker("bump")].clone();
    let s = vec![
        a.src("bump_a", bump[0], Op::Store, bytes(0, 8), 20_000, &[t1]),
        a.src(
            "bump_b",
            bump[bump.len() - 1],
            Op::Store,
            bytes(8, 16),
            19_500,
            &[t2],
        ),
    ];
    findings.push(line(
        &mut a,
        "hits",
        data,
        Kind::FalseSharing,
        19_750.0,
        0.2098,
        s,
    ));

    let data = global(&mut a, "counter");
    let s = vec![
        a.src(
            "counter",
            at("counter", 0),
            Op::Rmw,
            bytes(0, 8),
            9_000,
            &[t1],
        ),
        a.src(
            "counter",
            at("counter", 0),
            Op::Rmw,
            bytes(0, 8),
            8_800,
            &[t2],
        ),
    ];
    findings.push(line(
        &mut a,
        "counter",
        data,
        Kind::TrueSharing,
        8_900.0,
        0.0945,
        s,
    ));

    let data = global(&mut a, "done_flag");
    let s = vec![a.src(
        "flag",
        at("flag", 0),
        Op::Store,
        bytes(0, 4),
        6_000,
        &[t1, t2],
    )];
    findings.push(line(
        &mut a,
        "flag",
        data,
        Kind::TrueSharing,
        3_000.0,
        0.0319,
        s,
    ));

    let data = global(&mut a, "lock_word");
    let mut s = vec![
        a.src(
            "lock",
            at("lock", 0),
            Op::Rmw,
            bytes(0, 4),
            2_600,
            &[t1, t2],
        ),
        a.src(
            "unlock",
            at("unlock", 0),
            Op::Store,
            bytes(0, 4),
            1_400,
            &[t1, t2],
        ),
    ];
    // spin_lock is a real call at -O0: its return address is the first instruction of the
    // next line (@total), and the report names the call's own line (@call_lock).
    // (Its addresses are those of the @total source below, and normalize to its names.)
    let ret = at("total", 0);
    s[0].called_from = vec![CallSite {
        ret: BIAS + ret,
        code: Location::Module {
            path: MODULE.into(),
            vaddr: ret,
        },
        samples: 40,
        share: 1.0,
    }];
    findings.push(line(
        &mut a,
        "lock",
        data,
        Kind::TrueSharing,
        2_000.0,
        0.0212,
        s,
    ));

    let data = global(&mut a, "cfg");
    let s = vec![
        a.src(
            "cfg_hi",
            at("cfg_hi", 0),
            Op::Store,
            bytes(8, 12),
            1_500,
            &[t1],
        ),
        a.src(
            "cfg_hi",
            at("cfg_hi", 0),
            Op::Store,
            bytes(16, 20),
            1_400,
            &[t2],
        ),
        a.src(
            "total",
            at("total", 0),
            Op::Rmw,
            bytes(24, 32),
            800,
            &[t1, t2],
        ),
    ];
    findings.push(line(&mut a, "cfg", data, Kind::Mixed, 1_850.0, 0.0196, s));

    let s = vec![
        a.src(
            "sum_y",
            at("sum_y", 0),
            Op::Store,
            bytes(0, 8),
            1_200,
            &[t1],
        ),
        a.src(
            "sum_y",
            at("sum_y", 0),
            Op::Store,
            bytes(8, 16),
            1_100,
            &[t2],
        ),
    ];
    findings.push(line(
        &mut a,
        "heap",
        Location::Heap,
        Kind::FalseSharing,
        1_150.0,
        0.0122,
        s,
    ));

    let jit = SourceAccess {
        pc: a.add("pc:jit", 0x7f12_3456_7890),
        code: Location::Unknown,
        op: Op::Store,
        offsets: 0xff << 32,
        events: 2_100,
        threads: vec![t1, t2],
        called_from: vec![],
    };
    findings.push(line(
        &mut a,
        "stack",
        Location::Stack {
            owner: None,
            shared: false,
        },
        Kind::TrueSharing,
        1_050.0,
        0.0112,
        vec![jit],
    ));

    let s = vec![a.src("n", at("n", 0), Op::Rmw, bytes(16, 24), 900, &[t1, t2])];
    findings.push(line(
        &mut a,
        "below",
        Location::Unknown,
        Kind::TrueSharing,
        450.0,
        0.0048,
        s,
    ));

    let analysis = Analysis {
        backend: BackendKind::Soft,
        duration_s: 2.0,
        samples: 40_000,
        lost: 120,
        throttles: 2,
        filtered: 800,
        line_size: 64,
        findings,
        modules: vec![ModuleInfo {
            path: MODULE.into(),
            bias: BIAS,
            build_id: None,
        }],
        notes: vec!["contention estimated from soft (cpu-clock) samples".into()],
        survey: None,
        concurrency: None,
    };
    (analysis, a)
}

#[test]
fn golden_text_and_json_with_debug_info() {
    let b = build("golden");
    let (analysis, addrs) = analysis(&b);
    let mut sym = b.symbolizer();
    let report = build_report(&analysis, &mut sym, &ReportOptions::default());

    // What the goldens must show, asserted directly too.
    assert_eq!(
        report.findings.len(),
        8,
        "the 450 ev/s line is under the threshold"
    );
    assert_eq!(
        (report.below_threshold.lines, report.below_threshold.events),
        (1, 900)
    );
    let acc = &report.findings[0];
    assert_eq!(acc.data.fields, ["acc[0].sum_x", "acc[1].sum_x"]);
    assert_eq!(acc.sources[0].line, Some(marker("sum_x")));
    assert!(
        acc.fix.contains("Pad `struct acc` (24 bytes) to 64 bytes"),
        "{}",
        acc.fix
    );
    let lock = report
        .findings
        .iter()
        .find(|f| f.data.name == "lock_word")
        .unwrap();
    let call = &lock.sources[0].called_from[0];
    assert_eq!(call.line, Some(marker("call_lock")));
    assert_eq!(call.function.as_deref(), Some("worker"));
    let hits = &report.findings[1];
    assert_eq!(hits.data.name, "hits_a, hits_b");
    assert_eq!(hits.sources[1].inlined[0].line, Some(marker("bump_b")));

    let json = report.to_json();
    assert_eq!(Report::from_json(&json).unwrap(), report, "JSON round trip");
    let text = render_text(&report);
    golden("report_lr.json", &addrs.normalize(&json));
    golden("report_lr.txt", &addrs.normalize(&text));
}

#[test]
fn golden_text_without_debug_info() {
    let b = build("golden-stripped");
    let (analysis, addrs) = analysis(&b);
    b.tool("strip", &["--strip-debug", "lr"]);
    let mut sym = b.symbolizer();
    let report = build_report(&analysis, &mut sym, &ReportOptions::default());
    assert!(report
        .notes
        .iter()
        .any(|n| n.contains("no debug info for /src/lr")));
    assert!(report.findings[0]
        .sources
        .iter()
        .all(|s| !s.debug_info && s.file.is_none()));
    assert_eq!(
        report.findings[0].data.fields,
        ["acc", "acc+0x18"],
        "symbol + offset, no fields"
    );
    golden(
        "report_lr_stripped.txt",
        &addrs.normalize(&render_text(&report)),
    );
}

#[test]
fn threshold_and_128_byte_lines() {
    let b = build("golden-128");
    let (mut analysis, _) = analysis(&b);
    let mut sym = b.symbolizer();
    let opts = ReportOptions {
        threshold: 10_000.0,
        ..ReportOptions::default()
    };
    let report = build_report(&analysis, &mut sym, &opts);
    let rates: Vec<f64> = report.findings.iter().map(|f| f.rate_per_s).collect();
    assert_eq!(rates, [48_210.0, 19_750.0]);
    assert_eq!(report.below_threshold.lines, 7);
    assert!(render_text(&report)
        .contains("2 contended cache lines at or above 10,000 ev/s; 7 more below it"));

    // 128-byte lines: the map has two 64-byte halves and the fix pads to 128.
    analysis.line_size = 128;
    analysis.findings.truncate(1);
    analysis.findings[0].sources[1].offsets = 0xff << 72;
    let report = build_report(&analysis, &mut sym, &ReportOptions::default());
    let text = render_text(&report);
    assert_eq!(text.matches("    offset").count(), 2, "{text}");
    assert!(text.contains("64       72       80"), "{text}");
    assert_eq!(
        report.findings[0].data.fields,
        ["acc[0].sum_x", "acc[1].sum_x", "acc[3].sum_x"]
    );
    assert!(
        report.findings[0].fix.contains("to 128 bytes"),
        "{}",
        report.findings[0].fix
    );

    // No findings at all.
    analysis.findings.clear();
    let text = render_text(&build_report(
        &analysis,
        &mut sym,
        &ReportOptions::default(),
    ));
    assert!(
        text.contains("No contended cache lines at or above 1,000 ev/s."),
        "{text}"
    );
}

#[test]
fn build_id_mismatch_is_a_note() {
    let b = build("build-id");
    let (mut analysis, _) = analysis(&b);
    let notes_with = |analysis: &Analysis| {
        let mut sym = b.symbolizer();
        build_report(analysis, &mut sym, &ReportOptions::default()).notes
    };
    // The real build-id (from readelf) gives no note; another one does, naming both.
    let real = b.tool("readelf", &["-n", "lr"]);
    let hex = real
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("gcc links with --build-id")
        .trim()
        .to_string();
    let bytes: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    analysis.modules[0].build_id = Some(bytes);
    assert!(!notes_with(&analysis).iter().any(|n| n.contains("build-id")));
    analysis.modules[0].build_id = Some(vec![0xde, 0xad]);
    let notes = notes_with(&analysis);
    let note = notes
        .iter()
        .find(|n| n.contains("build-id"))
        .expect("a note");
    assert!(note.contains("dead") && note.contains(&hex), "{note}");
}

#[test]
fn many_sources_are_summed_up_and_non_finite_numbers_survive_json() {
    let b = build("many");
    let (mut analysis, _) = analysis(&b);
    analysis.findings.truncate(1);
    let first = analysis.findings[0].sources[0].clone();
    analysis.findings[0].sources = (0..15u64)
        .map(|i| SourceAccess {
            pc: first.pc + i,
            events: 100 - i,
            ..first.clone()
        })
        .collect();
    analysis.duration_s = f64::NAN;
    analysis.findings[0].rate_per_s = f64::INFINITY;
    let mut sym = b.symbolizer();
    let report = build_report(&analysis, &mut sym, &ReportOptions::default());
    assert_eq!(
        report.findings[0].sources.len(),
        15,
        "JSON keeps every source"
    );
    let text = render_text(&report);
    let max = laser_detect::report::render_text::MAX_SOURCES;
    // The three least frequent: 100-12, 100-13, 100-14 events.
    assert!(
        text.contains(&format!(
            "+{} more sources ({} events)",
            15 - max,
            88 + 87 + 86
        )),
        "{text}"
    );
    assert!(text.contains(&format!(
        "    {:<3}",
        laser_detect::report::render_text::label(max - 1)
    )));
    let back = Report::from_json(&report.to_json()).expect("finite numbers only");
    assert_eq!(back.duration_s, 0.0);
}

#[test]
fn path_map_rewrites_every_path_in_the_report() {
    let b = build("path-map");
    let (analysis, _) = analysis(&b);
    b.tool("strip", &["--strip-debug", "lr"]);
    let mut sym = b.symbolizer();
    let opts = ReportOptions {
        path_map: vec![("/src/".into(), "$BUILD/".into())],
        ..ReportOptions::default()
    };
    let json = build_report(&analysis, &mut sym, &opts).to_json();
    assert!(!json.contains("/src/"), "{json}");
    assert!(json.contains("\"module\": \"$BUILD/lr\""));
    assert!(json.contains("no debug info for $BUILD/lr"));
    // With debug info, source files and inlined-at files too.
    let b = build("path-map-debug");
    let (with_debug, _) = self::analysis(&b);
    let mut sym = b.symbolizer();
    let json = build_report(&with_debug, &mut sym, &opts).to_json();
    assert!(!json.contains("/src/"), "{json}");
    assert!(json.contains("\"file\": \"$BUILD/lr.c\""));
}

/// A line rated above the threshold from one or two events is a finding only if the low end
/// of its rate's 95% interval is above it too: else it is counted with the lines below the
/// threshold, and said to be thin. A low threshold still lists it.
#[test]
fn a_rate_from_too_few_events_is_not_a_finding() {
    use laser_detect::model::findings::MIN_FINDING_EVENTS;
    let b = build("golden-thin");
    let (mut analysis, _) = analysis(&b);
    let mut sym = b.symbolizer();
    let full = build_report(&analysis, &mut sym, &ReportOptions::default());
    let top = analysis
        .findings
        .iter_mut()
        .max_by(|a, c| a.rate_per_s.total_cmp(&c.rate_per_s))
        .unwrap();
    let line = top.line_addr;
    // locked_queue's stray line: one event at 2,722 ev/s (95% interval 69-15,100).
    top.rate_per_s = 2722.0;
    let mut with_events = |n: u64, threshold: f64| {
        let f = analysis
            .findings
            .iter_mut()
            .find(|f| f.line_addr == line)
            .unwrap();
        f.events = n;
        let opts = ReportOptions {
            threshold,
            ..ReportOptions::default()
        };
        build_report(&analysis, &mut sym, &opts)
    };
    for n in 1..MIN_FINDING_EVENTS {
        let report = with_events(n, 1000.0);
        assert_eq!(report.findings.len(), full.findings.len() - 1, "{n} events");
        assert!(report.findings.iter().all(|f| f.line_addr != line));
        assert_eq!(report.below_threshold.lines, full.below_threshold.lines + 1);
        assert_eq!(report.below_threshold.thin, 1);
        let text = render_text(&report);
        assert!(
            text.contains("or rated from too few events to be above it (1 of them, fewer than 3"),
            "{text}"
        );
    }
    // Enough events; or a threshold the interval's low end clears (one event: 69 ev/s).
    let again = with_events(MIN_FINDING_EVENTS, 1000.0);
    assert_eq!(again.findings.len(), full.findings.len());
    assert_eq!(again.below_threshold.thin, 0);
    let low = with_events(1, 50.0);
    assert!(low.findings.iter().any(|f| f.line_addr == line));
    assert_eq!(low.below_threshold.thin, 0);
}
