//! Golden `laser report --by type` and `--by field` output over `fixtures/types.c` compiled
//! at test time (-O0): a synthetic analysis puts the program's real store instructions on heap
//! lines, so typing (DWARF variables, stack-slot reloads, pointer members), the data profile
//! and the per-type fixes are real. The views print no addresses, so the goldens hold across
//! compilers as long as the types come out right. Regenerate on purpose with
//! `LASER_BLESS=1 cargo test -p laser-detect --test by_type_golden`.

mod report_common;

use iced_x86::{Decoder, DecoderOptions, OpKind, Register};
use laser_detect::model::findings::{Kind, LineFinding, Location, Op, SourceAccess};
use laser_detect::report::by_type::{render_fields, render_types};
use laser_detect::{build_report, Report, ReportOptions};
use report_common::{build_with, golden, line_instructions, marker_in, Built};

const EXE: &str = "types_golden";

/// The store on the marked line of types.c whose address is not a stack slot: the program's
/// access to the heap object (at -O0 the line also reloads pointers from the frame).
fn store(b: &Built, tag: &str) -> u64 {
    let line = marker_in("types.c", tag);
    let bytes = std::fs::read(b.dir.join(EXE)).unwrap();
    let obj = object::File::parse(&*bytes).unwrap();
    use object::{Object, ObjectSection};
    let text = obj.section_by_name(".text").unwrap();
    let data = text.data().unwrap();
    line_instructions(b, EXE, "types.c", line)
        .into_iter()
        .find(|&pc| {
            let off = (pc - text.address()) as usize;
            let i = Decoder::with_ip(64, &data[off..], pc, DecoderOptions::NONE).decode();
            i.op0_kind() == OpKind::Memory
                && !matches!(i.memory_base(), Register::RBP | Register::RSP)
        })
        .unwrap_or_else(|| panic!("no heap store on {tag}"))
}

fn bytes(r: std::ops::Range<u32>) -> u128 {
    r.fold(0u128, |m, b| m | (1u128 << b))
}

fn access(pc: Option<u64>, op: Op, offsets: u128, events: u64, t: u32) -> SourceAccess {
    SourceAccess {
        pc: pc.unwrap_or(0x7f00_0000_1000),
        code: match pc {
            Some(vaddr) => Location::Module {
                path: format!("/src/{EXE}"),
                vaddr,
            },
            None => Location::Unknown,
        },
        op,
        offsets,
        events,
        threads: vec![t],
        called_from: vec![],
    }
}

fn line(addr: u64, kind: Kind, sources: Vec<SourceAccess>) -> LineFinding {
    let events = sources.iter().map(|s| s.events).sum();
    let mut threads: Vec<u32> = sources.iter().flat_map(|s| s.threads.clone()).collect();
    threads.sort_unstable();
    threads.dedup();
    LineFinding {
        line_addr: addr,
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
        share: 0.0,
        threads,
        data: Location::Heap,
        sources,
        process: None,
        by_code: false,
        front: false,
    }
}

fn report(b: &Built) -> Report {
    let sx = Some(store(b, "@sx"));
    let sy = Some(store(b, "@sy"));
    let misses = Some(store(b, "@misses"));
    let failed = Some(store(b, "@failed"));
    let chase = Some(store(b, "@chase"));
    report_of(
        b,
        vec![
            // One lreg_args, SX written by T1 and SY by T2 (16 bytes into the line).
            line(
                0x5555_5555_a2c0,
                Kind::FalseSharing,
                vec![
                    access(sx, Op::Rmw, bytes(24..32), 3000, 1),
                    access(sy, Op::Rmw, bytes(32..40), 2000, 2),
                ],
            ),
            // Per-thread `struct stat` elements packed in one block: stats[*].misses of two
            // elements on one line, one thread each.
            line(
                0x5555_5555_a340,
                Kind::FalseSharing,
                vec![
                    access(misses, Op::Rmw, bytes(8..16), 1500, 1),
                    access(misses, Op::Rmw, bytes(32..40), 1200, 2),
                ],
            ),
            // One job's counter bumped by both threads.
            line(
                0x5555_5555_a400,
                Kind::TrueSharing,
                vec![
                    access(failed, Op::Rmw, bytes(16..24), 500, 1),
                    access(failed, Op::Rmw, bytes(16..24), 300, 2),
                ],
            ),
            // A node reached through h->list.
            line(
                0x5555_5555_a480,
                Kind::TrueSharing,
                vec![
                    access(chase, Op::Rmw, bytes(8..16), 400, 1),
                    access(chase, Op::Rmw, bytes(8..16), 350, 2),
                ],
            ),
            // Code with no file: untyped, counted in the coverage.
            line(
                0x5555_5555_a500,
                Kind::FalseSharing,
                vec![
                    access(None, Op::Store, bytes(0..8), 100, 1),
                    access(None, Op::Store, bytes(8..16), 100, 2),
                ],
            ),
        ],
    )
}

/// The report of a one-second soft-backend analysis with these findings, at threshold 100.
fn report_of(b: &Built, findings: Vec<LineFinding>) -> Report {
    let analysis = report_common::soft_analysis(10_000, findings);
    let opts = ReportOptions {
        threshold: 100.0,
        ..ReportOptions::default()
    };
    build_report(&analysis, &mut b.symbolizer(), &opts)
}

#[test]
fn by_type_and_by_field_views() {
    let b = build_with(
        EXE,
        "types.c",
        EXE,
        &["gcc", "-g", "-O0", "-pthread", "-o", EXE, "types.c"],
    );
    let r = report(&b);
    let c = r.coverage.as_ref().unwrap();
    assert_eq!((c.accesses, c.typed), (10, 8));
    assert_eq!(c.untyped[0].reason, "code not in a file");
    let names: Vec<&str> = r.types.iter().map(|t| t.type_name.as_str()).collect();
    assert_eq!(
        names,
        ["struct lreg_args", "struct stat", "job_t", "struct node"]
    );
    // The heap line reads as its type and members, not as block offsets.
    assert_eq!(r.findings[0].data.types, ["struct lreg_args"]);
    assert_eq!(r.findings[0].data.type_fields, ["args->SX", "args->SY"]);
    golden("by_type.txt", &render_types(&r));
    golden("by_field.txt", &render_fields(&r));
    // A saved report renders the same views.
    let back = Report::from_json(&r.to_json()).unwrap();
    assert_eq!(render_types(&back), render_types(&r));
}

/// An instruction in a system library is not typed (that would read all of the library's
/// debug info: glibc's, for a barrier's counter, took 50–100 ms of laser after the program
/// had exited), and the coverage says why; the program's own access on the line still is.
#[test]
fn system_library_code_is_left_untyped_and_counted() {
    // Its own build directory: the tests of this file run in parallel.
    let b = build_with(
        "types_syslib",
        "types.c",
        EXE,
        &["gcc", "-g", "-O0", "-pthread", "-o", EXE, "types.c"],
    );
    let mut libc = access(Some(0x9_1000), Op::Rmw, bytes(32..40), 2000, 2);
    libc.code = Location::Module {
        path: "/usr/lib/x86_64-linux-gnu/libc.so.6".into(),
        vaddr: 0x9_1000,
    };
    let r = report_of(
        &b,
        vec![line(
            0x5555_5555_a2c0,
            Kind::FalseSharing,
            vec![
                access(Some(store(&b, "@sx")), Op::Rmw, bytes(24..32), 3000, 1),
                libc,
            ],
        )],
    );
    let sources = &r.findings[0].sources;
    let lib = sources
        .iter()
        .find(|s| s.module.as_deref() == Some("/usr/lib/x86_64-linux-gnu/libc.so.6"))
        .unwrap();
    assert_eq!(lib.untyped.as_deref(), Some("system library code"));
    assert!(lib.data_type.is_none());
    let own = sources.iter().find(|s| s.data_type.is_some()).unwrap();
    assert_eq!(
        own.data_type.as_ref().unwrap().type_name,
        "struct lreg_args"
    );
    let c = r.coverage.as_ref().unwrap();
    assert_eq!((c.accesses, c.typed), (2, 1));
    assert_eq!(c.untyped[0].reason, "system library code");
}
