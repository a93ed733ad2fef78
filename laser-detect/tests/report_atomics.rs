//! C++ atomics in reports, on `fixtures/atomic.cpp` compiled with g++ at -O0 and -O2 at test
//! time (issue 11, classes 4 and 6):
//! - the program's line, not the header's: `std::atomic<int>` increments and a
//!   `std::atomic_flag` spinlock compile to instructions whose innermost source line is in
//!   libstdc++'s `atomic_base.h`; the report headlines `atomic.cpp`'s line and keeps the
//!   header frames as context. The instructions come from objdump, not from our decoder;
//! - names: a `std::atomic<int> x` declared in a base class is `as[0].x`;
//! - the fix for two globals on one line speaks of each variable by its own name.
//!
//! `fixtures/report_atomic.{json,txt}` are goldens of one report (addresses and libstdc++
//! line numbers normalized); regenerate them on purpose with
//! `LASER_BLESS=1 cargo test -p laser-detect --test report_atomics`.

mod report_common;

use std::collections::BTreeSet;

use laser_detect::model::findings::{Kind, LineFinding, Location, Op, SourceAccess};
use laser_detect::naming::symbolize::CodeLocation;
use laser_detect::{build_report, render_text, Report, ReportOptions};
use report_common::{build_with, golden, marker_in, Built};

const MODULE: &str = "/src/atomic";
const SOURCE: &str = "/src/atomic.cpp";

/// Compiles atomic.cpp at `opt` into a directory of its own per `tag` (tests run in parallel).
fn build(tag: &str, opt: &str) -> Built {
    build_with(
        &format!("atomic-{tag}{opt}"),
        "atomic.cpp",
        "atomic",
        &["g++", "-g", opt, "-pthread", "-o", "atomic", "atomic.cpp"],
    )
}

fn marker(name: &str) -> u32 {
    marker_in("atomic.cpp", &format!("/* @{name} */"))
}

/// The atomic and lock instructions of `work(int)` (objdump): locked RMWs, `xchg` with
/// memory, and the plain store that releases `lock` at -O2.
fn atomic_instructions(b: &Built, function: &str) -> Vec<u64> {
    b.tool(
        "objdump",
        &[
            "-d",
            "--no-show-raw-insn",
            &format!("--disassemble={function}"),
            "atomic",
        ],
    )
    .lines()
    .filter_map(|l| {
        let (addr, ins) = l.trim().split_once(":\t")?;
        let atomic = ins.starts_with("lock ")
            || (ins.starts_with("xchg") && ins.contains('('))
            || (ins.starts_with("movb   $0x0,") && ins.ends_with("<lock>"));
        atomic.then(|| u64::from_str_radix(addr, 16).ok())?
    })
    .collect()
}

fn header_line_first(loc: &CodeLocation) -> Option<(&str, u32)> {
    let f = loc.library.first()?;
    Some((f.file.as_deref()?.rsplit('/').next()?, f.line?))
}

/// Every atomic instruction in `work` headlines a marked line of atomic.cpp in `work(int)`,
/// with atomic_base.h as its innermost library frame; returns the markers seen.
fn headlines(b: &Built) -> BTreeSet<&'static str> {
    let mut sym = b.symbolizer();
    let names = ["inc", "fetch", "tas", "clear"];
    let mut seen = BTreeSet::new();
    let found = atomic_instructions(b, "_Z4worki");
    assert!(!found.is_empty(), "no atomic instruction in work()");
    for at in found {
        let loc = sym.symbolize(MODULE, at);
        assert_eq!(loc.file.as_deref(), Some(SOURCE), "{at:#x}: {loc:?}");
        assert_eq!(
            loc.function.as_deref(),
            Some("work(int)"),
            "{at:#x}: {loc:?}"
        );
        let name = names
            .iter()
            .find(|n| loc.line == Some(marker(n)))
            .unwrap_or_else(|| panic!("{at:#x} at an unmarked line: {loc:?}"));
        seen.insert(*name);
        let (file, line) = header_line_first(&loc).unwrap_or_else(|| panic!("{loc:?}"));
        assert_eq!(file, "atomic_base.h", "{loc:?}");
        assert!(line > 0);
        // Nothing outside work() was inlined into: no callers.
        assert!(loc.inlined.is_empty(), "{loc:?}");
        // The program's text, not the header's.
        let text = sym.source_line(SOURCE, marker(name)).unwrap();
        assert!(text.contains(&format!("/* @{name} */")), "{text}");
    }
    seen
}

#[test]
fn optimized_atomics_and_spinlock_headline_the_programs_line() {
    let b = build("headlines", "-O2");
    assert_eq!(
        headlines(&b),
        BTreeSet::from(["inc", "fetch", "tas", "clear"])
    );
    // `x++` goes through two header functions: operator++ calls fetch_add, both inlined.
    let mut sym = b.symbolizer();
    let inc = atomic_instructions(&b, "_Z4worki")
        .into_iter()
        .map(|a| sym.symbolize(MODULE, a))
        .find(|l| l.line == Some(marker("inc")))
        .unwrap();
    let chain: Vec<Option<&str>> = inc.library.iter().map(|f| f.function.as_deref()).collect();
    assert_eq!(
        chain,
        [
            Some("std::__atomic_base<int>::fetch_add(int, std::memory_order)"),
            Some("std::__atomic_base<int>::operator++(int)")
        ]
    );
}

#[test]
fn unoptimized_always_inline_atomics_headline_the_programs_line() {
    let b = build("headlines", "-O0");
    // `fetch_add`, `test_and_set` and `clear` are always_inline even at -O0.
    assert_eq!(headlines(&b), BTreeSet::from(["fetch", "tas", "clear"]));
    // `operator++(int)` is not: at -O0 it is an out-of-line function of its own, holding the
    // `lock xadd`, and no frame of the program encloses it. The header line stays (what
    // DWARF says); naming the caller would need the call stack.
    let mut sym = b.symbolizer();
    let out_of_line = atomic_instructions(&b, "_ZNSt13__atomic_baseIiEppEi");
    assert_eq!(out_of_line.len(), 1, "{out_of_line:x?}");
    let loc = sym.symbolize(MODULE, out_of_line[0]);
    assert!(
        loc.file.as_deref().unwrap().ends_with("/atomic_base.h"),
        "{loc:?}"
    );
    assert_eq!(
        loc.inlined[0].function.as_deref(),
        Some("std::__atomic_base<int>::operator++(int)")
    );
    assert!(loc.library.is_empty());
}

const BIAS: u64 = 0x5555_5555_4000;

/// What a golden must not depend on: addresses (whole `0x…` tokens named in `named`), the
/// offset after `work(int)+`, and libstdc++'s version directory and line numbers in
/// `atomic_base.h` (another g++ moves them). Everything else is compared byte for byte.
fn normalize(text: &str, named: &[(&str, u64)]) -> String {
    let mut out = String::new();
    let mut prev_header = false;
    for line in text.lines() {
        let mut l = line.to_string();
        // `0x…` tokens, right to left so earlier positions stay valid.
        let starts: Vec<usize> = l.match_indices("0x").map(|(i, _)| i).collect();
        for i in starts.into_iter().rev() {
            let len = l[i + 2..].bytes().take_while(u8::is_ascii_hexdigit).count();
            let Ok(v) = u64::from_str_radix(&l[i + 2..i + 2 + len], 16) else {
                continue;
            };
            let after_symbol = l[..i].ends_with("work(int)+");
            if let Some((n, _)) = named.iter().find(|(_, a)| *a == v) {
                l.replace_range(i..i + 2 + len, &format!("<{n}>"));
            } else if after_symbol {
                l.replace_range(i..i + 2 + len, "<symoff>");
            }
        }
        if let Some(i) = l.find("/include/c++/") {
            let rest = &l[i + "/include/c++/".len()..];
            let v = rest.find('/').unwrap_or(0);
            l.replace_range(i..i + "/include/c++/".len() + v, "/include/c++/<v>");
        }
        if let Some(i) = l.find("atomic_base.h:") {
            let at = i + "atomic_base.h:".len();
            let n = l[at..].bytes().take_while(u8::is_ascii_digit).count();
            l.replace_range(at..at + n, "<n>");
        }
        // JSON: a library frame's `"line": N` follows its `"file"`.
        if prev_header && l.trim_start().starts_with("\"line\": ") {
            let at = l.find(": ").unwrap() + 2;
            let n = l[at..].bytes().take_while(u8::is_ascii_digit).count();
            l.replace_range(at..at + n, "<n>");
        }
        prev_header = l.contains("atomic_base.h\"");
        out.push_str(&l);
        out.push('\n');
    }
    out
}

/// A contending instruction at `vaddr`: `op` on the line's bytes `bytes` by `thread`.
fn access(vaddr: u64, op: Op, bytes: u128, thread: u32) -> SourceAccess {
    SourceAccess {
        pc: BIAS + vaddr,
        code: Location::Module {
            path: MODULE.into(),
            vaddr,
        },
        op,
        offsets: bytes,
        events: 500,
        threads: vec![thread],
        called_from: vec![],
    }
}

/// The report of a run with one contended line of kind `kind` at global address `data`.
fn report_of(b: &Built, kind: Kind, data: u64, sources: Vec<SourceAccess>) -> Report {
    let events: u64 = sources.iter().map(|s| s.events).sum();
    let analysis = report_common::soft_analysis(
        1000,
        vec![LineFinding {
            line_addr: BIAS + (data & !63),
            line_size: 64,
            kind,
            events,
            true_events: if kind == Kind::TrueSharing { events } else { 0 },
            false_events: if kind == Kind::FalseSharing {
                events
            } else {
                0
            },
            rate_per_s: events as f64,
            share: 1.0,
            threads: vec![1, 2],
            data: Location::Module {
                path: MODULE.into(),
                vaddr: data,
            },
            sources,
            process: None,
            by_code: false,
            front: false,
        }],
    );
    build_report(&analysis, &mut b.symbolizer(), &ReportOptions::default())
}

/// Bytes `[from, to)` of the object at `addr`, as a mask of its line.
fn bytes_of(addr: u64, from: u64, to: u64) -> u128 {
    (from..to).fold(0u128, |m, o| m | 1 << (addr % 64 + o))
}

/// Two threads' `as[id].x++` on neighbouring elements of `as`: the report (JSON and text)
/// names atomic.cpp's line and its text, with atomic_base.h as the `via` context.
#[test]
fn report_headlines_the_program_line_in_json_and_text() {
    let b = build("report", "-O2");
    let mut sym = b.symbolizer();
    let inc = atomic_instructions(&b, "_Z4worki")
        .into_iter()
        .find(|&a| sym.symbolize(MODULE, a).line == Some(marker("inc")))
        .unwrap();
    let as_ = b.nm()["as"];
    let report = report_of(
        &b,
        Kind::FalseSharing,
        as_,
        vec![
            access(inc, Op::Rmw, bytes_of(as_, 0, 4), 1),
            access(inc, Op::Rmw, bytes_of(as_, 8, 12), 2),
        ],
    );
    let s = &report.findings[0].sources[0];
    assert_eq!(s.file.as_deref(), Some(SOURCE));
    assert_eq!(s.line, Some(marker("inc")));
    assert_eq!(s.function.as_deref(), Some("work(int)"));
    assert_eq!(s.text.as_deref(), Some("as[id].x++; /* @inc */"));
    let via: Vec<&str> = s
        .library_frames
        .iter()
        .map(|f| f.file.as_deref().unwrap().rsplit('/').next().unwrap())
        .collect();
    assert_eq!(via, ["atomic_base.h", "atomic_base.h"]);

    // Class 6 of issue 11: `x` sits in a base class and is a std::atomic<int>; it is named
    // as the program writes it, never `<padding>` or `x._M_i`.
    assert_eq!(report.findings[0].data.fields, ["as[0].x", "as[1].x"]);
    assert_eq!(s.fields, ["as[0].x"]);

    let json = report.to_json();
    assert!(json.contains("\"library_frames\""), "{json}");
    assert_eq!(Report::from_json(&json).unwrap(), report, "JSON round trip");
    let text = render_text(&report);
    let named = [
        ("pc:inc", BIAS + inc),
        ("off:inc", inc),
        ("line:as", BIAS + (as_ & !63)),
        ("vaddr:as-line", as_ & !63),
        ("data:as", as_),
    ];
    golden("report_atomic.json", &normalize(&json, &named));
    golden("report_atomic.txt", &normalize(&text, &named));
    let want = format!("atomic.cpp:{} in work(int)", marker("inc"));
    assert!(text.contains(&want), "{text}");
    assert!(text.contains("| as[id].x++; /* @inc */"), "{text}");
    assert!(
        text.contains("via std::__atomic_base<int>::operator++(int) at atomic_base.h:"),
        "{text}"
    );
}

/// `struct A : Base { int y; }` with `std::atomic<int> x` in `Base`: `as[1].x`, `as[0].y`.
#[test]
fn members_of_a_base_class_and_atomics_are_named_as_written() {
    for opt in ["-O0", "-O2"] {
        let b = build("names", opt);
        let mut sym = b.symbolizer();
        let as_ = b.nm()["as"];
        let at = |from: u64, to: u64| bytes_of(as_, from, to);
        let d = sym.name_data(MODULE, as_ & !63, 64, u128::MAX).unwrap();
        assert_eq!(d.fields_for(at(0, 4)), ["as[0].x"], "{opt}");
        assert_eq!(d.fields_for(at(4, 8)), ["as[0].y"], "{opt}");
        assert_eq!(d.fields_for(at(8, 12)), ["as[1].x"], "{opt}");
        let obj = d.objects.iter().find(|o| o.name == "as").unwrap();
        assert_eq!(obj.type_name.as_deref(), Some("struct A[2]"), "{opt}");
        // `lock` (std::atomic_flag, whose only member is `_M_i`) is named by itself.
        let lock = b.nm()["lock"];
        let d = sym
            .name_data(MODULE, lock & !63, 64, 1 << (lock % 64))
            .unwrap();
        assert_eq!(d.fields_for(u128::MAX), ["lock"], "{opt}");
    }
}

/// `modified` set by every thread next to `num_points` they only read (streamcluster's
/// line): one sentence for the flag, with its own name in the snippet, and one naming the
/// neighbour that false-shares with it; never `if (modified, num_points != v)`.
#[test]
fn two_globals_on_one_line_get_a_fix_each() {
    let b = build("globals", "-O0");
    let nm = b.nm();
    let (modified, num_points) = (nm["modified"], nm["num_points"]);
    assert_eq!(
        modified / 64,
        num_points / 64,
        "g++ put them on different lines"
    );
    let lines = b.line_table_of("atomic.cpp");
    let store = lines[&marker("modified")][0];
    let load = lines[&marker("num_points")][0];
    let report = report_of(
        &b,
        Kind::TrueSharing,
        modified,
        vec![
            access(store, Op::Store, bytes_of(modified, 0, 1), 1),
            access(store, Op::Store, bytes_of(modified, 0, 1), 2),
            access(load, Op::Load, bytes_of(num_points, 0, 4), 1),
            access(load, Op::Load, bytes_of(num_points, 0, 4), 2),
        ],
    );
    let f = &report.findings[0];
    let mut names = f.data.fields.clone();
    names.sort();
    assert_eq!(names, ["modified", "num_points"]);
    assert!(!f.fix.contains("modified, num_points"), "{}", f.fix);
    assert!(
        f.fix
            .contains("`modified` is re-written by every thread (T1, T2)")
            && f.fix.contains("`if (modified != v) modified = v;`"),
        "{}",
        f.fix
    );
    assert!(
        f.fix
            .contains("`num_points` shares the line with `modified` and false-shares with it"),
        "{}",
        f.fix
    );
}

/// A call into a shared library from inlined header code (`std::mutex::lock()` →
/// gthr-default.h → `pthread_mutex_lock`): the call site a lock's `called_from` shows is
/// the program's line too, with the same rule.
#[test]
fn call_sites_inlined_from_headers_headline_the_programs_line() {
    let b = build("callsite", "-O2");
    let mut sym = b.symbolizer();
    let listing = b.tool(
        "objdump",
        &[
            "-d",
            "--no-show-raw-insn",
            "--disassemble=_Z4worki",
            "atomic",
        ],
    );
    let ret = listing
        .lines()
        .skip_while(|l| !l.contains("<pthread_mutex_lock@plt>"))
        .nth(1)
        .and_then(|l| u64::from_str_radix(l.trim().split_once(':')?.0, 16).ok())
        .unwrap_or_else(|| panic!("no call of pthread_mutex_lock in work():\n{listing}"));
    // As report_build does for a call site: the call instruction is the byte before `ret`.
    let loc = sym.symbolize(MODULE, ret - 1);
    assert_eq!(loc.file.as_deref(), Some(SOURCE), "{loc:?}");
    assert_eq!(loc.line, Some(marker("mutex_lock")), "{loc:?}");
    assert_eq!(loc.function.as_deref(), Some("work(int)"));
    let functions: Vec<&str> = loc
        .library
        .iter()
        .filter_map(|f| f.function.as_deref())
        .collect();
    assert!(functions.contains(&"std::mutex::lock()"), "{loc:?}");
}
