//! Heap lines in the report: named by their malloc blocks when a live run read them, plain
//! `heap` otherwise (recordings), with in-block offsets in the fields and a fix that tells
//! "one object" from "neighbouring objects".

use laser_detect::naming::heap_blocks::{ArenaKind, Block, BlockState, HeapError};
use laser_detect::naming::heap_names::HeapBlocks;
use laser_detect::{
    build_report, render_text, Analysis, Kind, LineFinding, Location, Op, Report, ReportOptions,
    SourceAccess, Symbolizer,
};

mod report_common;

const LINE: u64 = 0x5555_5555_a2c0;

/// Two threads write `bytes` (line offsets) each, from two instructions.
fn analysis(t1: std::ops::Range<u32>, t2: std::ops::Range<u32>) -> Analysis {
    let mask = |r: std::ops::Range<u32>| r.fold(0u128, |m, b| m | (1u128 << b));
    let access = |pc: u64, offsets: u128, t: u32| SourceAccess {
        pc,
        code: Location::Unknown,
        op: Op::Store,
        offsets,
        events: 5000,
        threads: vec![t],
        called_from: vec![],
    };
    report_common::soft_analysis(
        10_000,
        vec![LineFinding {
            line_addr: LINE,
            line_size: 64,
            kind: Kind::FalseSharing,
            events: 10_000,
            true_events: 0,
            false_events: 10_000,
            rate_per_s: 10_000.0,
            share: 1.0,
            threads: vec![11, 12],
            data: Location::Heap,
            sources: vec![access(0x1000, mask(t1), 11), access(0x1010, mask(t2), 12)],
            process: None,
            by_code: false,
            front: false,
        }],
    )
}

/// A main-arena block whose chunk starts at `chunk` (user pointer `chunk + 16`).
fn block(chunk: u64, chunk_size: u64) -> Block {
    Block {
        chunk,
        chunk_size,
        user: chunk + 16,
        usable: chunk_size - 8,
        state: BlockState::InUse,
        arena: ArenaKind::Main,
    }
}

fn report(a: &Analysis, heap: Option<HeapBlocks>) -> Report {
    let opts = ReportOptions {
        heap_blocks: heap,
        ..ReportOptions::default()
    };
    build_report(a, &mut Symbolizer::new(), &opts)
}

fn with(line: u64, r: Result<Vec<Block>, HeapError>) -> Option<HeapBlocks> {
    let mut h = HeapBlocks::default();
    h.lines.insert(line, r);
    Some(h)
}

#[test]
fn two_neighbouring_blocks_on_one_line() {
    // heap_objects: 32-byte chunks back to back; each thread's 16-byte object in its own.
    //   line  0x2c0: [A hdr 0x2c0..0x2d0][A 0x2d0..0x2e8][B hdr][B 0x2f0..0x308)
    //   T11 writes A[0..16) = line [16..32), T12 writes B[0..16) = line [48..64).
    let a = analysis(16..32, 48..64);
    let r = report(
        &a,
        with(LINE, Ok(vec![block(LINE, 0x20), block(LINE + 0x20, 0x20)])),
    );
    let d = &r.findings[0].data;
    assert_eq!(d.kind, "heap");
    assert_eq!(
        d.name,
        format!(
            "heap blocks {:#x} (24 bytes), {:#x} (24 bytes)",
            LINE + 16,
            LINE + 48
        )
    );
    assert_eq!(d.blocks.len(), 2);
    assert_eq!(d.blocks[0].offsets, (0..16).collect::<Vec<u64>>());
    assert_eq!(
        d.fields,
        [
            format!("block@{:#x}[0..16)", LINE + 16),
            format!("block@{:#x}[0..16)", LINE + 48)
        ]
    );
    let s = &r.findings[0].sources;
    assert_eq!(s[0].fields, [format!("block@{:#x}[0..16)", LINE + 16)]);
    let fix = &r.findings[0].fix;
    assert!(fix.starts_with("2 heap blocks share this line"), "{fix}");
    assert!(fix.contains("aligned_alloc(64"), "{fix}");
    assert!(
        fix.contains(&format!("T11 block@{:#x}[0..16)", LINE + 16)),
        "{fix}"
    );
    let text = render_text(&r);
    assert!(
        text.contains(&format!(
            "    data     heap block {:#x} (24 bytes, main arena)\n             \
             heap block {:#x} (24 bytes, main arena)\n",
            LINE + 16,
            LINE + 48
        )),
        "{text}"
    );
    // The JSON keeps the blocks and reads back.
    let back = Report::from_json(&r.to_json()).unwrap();
    assert_eq!(back, r);
    assert!(r.to_json().contains("\"blocks\""));
}

#[test]
fn false_sharing_inside_one_block() {
    // One 48-byte block (chunk 0x40) from line offset 16: T11 writes its bytes 0..8,
    // T12 its bytes 8..16.
    let a = analysis(16..24, 24..32);
    let r = report(&a, with(LINE, Ok(vec![block(LINE, 0x40)])));
    let d = &r.findings[0].data;
    assert_eq!(d.name, format!("heap block {:#x} (56 bytes)", LINE + 16));
    assert_eq!(d.fields, [format!("block@{:#x}[0..16)", LINE + 16)]);
    let fix = &r.findings[0].fix;
    assert!(
        fix.starts_with(&format!(
            "False sharing inside one 56-byte heap block at {:#x}",
            LINE + 16
        )),
        "{fix}"
    );
    assert!(fix.contains("[0..8)") && fix.contains("[8..16)"), "{fix}");
    // A thread-arena block glibc has marked free: the text says both.
    let mut b = block(LINE, 0x40);
    (b.arena, b.state) = (ArenaKind::Thread, BlockState::Free);
    let r = report(&a, with(LINE, Ok(vec![b])));
    assert_eq!(r.findings[0].data.blocks[0].state, "free");
    assert!(
        render_text(&r).contains(&format!(
            "data     heap block {:#x} (56 bytes, thread arena, free)",
            LINE + 16
        )),
        "{}",
        render_text(&r)
    );
}

#[test]
fn bytes_in_no_block_are_malloc_headers_and_errors_become_notes() {
    let a = analysis(8..16, 16..24);
    let r = report(&a, with(LINE, Ok(vec![block(LINE, 0x20)])));
    assert_eq!(
        r.findings[0].data.fields,
        [
            format!("block@{:#x}[0..8)", LINE + 16),
            "malloc header".into()
        ]
    );
    let err = HeapError::BadSize {
        chunk: LINE - 0x40,
        size: 0x13,
    };
    let r = report(&a, with(LINE, Err(err)));
    assert_eq!(r.findings[0].data.name, "heap");
    assert!(
        r.notes
            .iter()
            .any(|n| n.contains("malloc block unknown") && n.contains("0x13")),
        "{:?}",
        r.notes
    );
    // Live run, line never read: a note says so.
    let r = report(&a, Some(HeapBlocks::default()));
    assert!(r
        .notes
        .iter()
        .any(|n| n.contains("1 heap line(s) named only")));
}

#[test]
fn without_a_live_process_heap_lines_stay_plain() {
    let a = analysis(16..32, 48..64);
    let r = report(&a, None);
    let d = &r.findings[0].data;
    assert_eq!((d.name.as_str(), d.blocks.len()), ("heap", 0));
    assert!(!r.to_json().contains("\"blocks\""));
    assert!(render_text(&r).contains("heap object (allocation site not tracked)"));
    assert!(r.findings[0].fix.contains("one heap block"));
}

#[test]
fn merged_thread_sources_name_the_parts_not_who_touched_which() {
    let mut a = analysis(16..32, 48..64);
    // One instruction run by both threads against both objects (heap_objects' `account`).
    let f = &mut a.findings[0];
    f.sources[0].offsets |= f.sources[1].offsets;
    f.sources[0].threads = vec![11, 12];
    f.sources.truncate(1);
    let r = report(
        &a,
        with(LINE, Ok(vec![block(LINE, 0x20), block(LINE + 0x20, 0x20)])),
    );
    let fix = &r.findings[0].fix;
    assert!(
        fix.contains(&format!(
            "T11, T12 touch block@{:#x}[0..16), block@{:#x}[0..16)",
            LINE + 16,
            LINE + 48
        )),
        "{fix}"
    );
}
