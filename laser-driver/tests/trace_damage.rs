//! Damaged recordings: a file cut off at every byte, random byte flips, and files that are not
//! recordings at all. The promise under test: a clean prefix of what was written, or an error —
//! never a panic, never an event that was not written.

use laser_driver::trace::{EndState, Reader, StreamReader, TraceError, TraceHeader, Writer};
use laser_driver::{BackendKind, Event, Mmap, Reg, Sample, UserRegs, SOFT_REGS_MASK};
use proptest::prelude::*;

/// ≥ 20 events covering every variant and every optional sample field.
fn events() -> Vec<Event> {
    let mut v = vec![
        Event::Comm {
            pid: 100,
            tid: 100,
            time: 1,
            name: "app".into(),
            exec: true,
        },
        Event::Mmap(Mmap {
            pid: 100,
            tid: 100,
            time: 2,
            addr: 0x5555_0000_0000,
            len: 0x2000,
            pgoff: 0x1000,
            prot: 5,
            flags: 2,
            path: "/usr/bin/app".into(),
            build_id: Some(vec![0xab; 20]),
        }),
        Event::Mmap(Mmap {
            pid: 100,
            tid: 100,
            time: 3,
            addr: 0x7f00_0000_0000,
            len: 0x1000,
            pgoff: 0,
            prot: 3,
            flags: 0x22,
            path: "//anon".into(),
            build_id: None,
        }),
        Event::Fork {
            pid: 100,
            ppid: 100,
            tid: 101,
            ptid: 100,
            time: 4,
        },
    ];
    for i in 0..16u64 {
        let mut regs = UserRegs::default();
        for r in [Reg::Ax, Reg::Cx, Reg::Sp, Reg::Ip, Reg::Flags, Reg::R15] {
            regs.set(r, 0x7ffd_0000_0000 + i * 8 + r as u64);
        }
        regs.mask |= SOFT_REGS_MASK;
        let backend = BackendKind::ALL[i as usize % 4];
        v.push(Event::Sample(Sample {
            backend,
            pid: 100,
            tid: 100 + (i as u32 % 2),
            cpu: i as u32 % 2,
            time: 10 + i,
            ip: 0x5555_0000_1000 + i,
            addr: (i % 2 == 0).then_some(0x5555_0000_4000 + i * 8),
            data_src: (i % 3 == 0).then_some(0x68100142),
            weight: 250_000,
            regs: (i % 4 != 1).then_some(regs),
            watch_slot: (backend == BackendKind::Watch).then_some(i as u8 % 4),
            callers: Default::default(),
        }));
    }
    v.extend([
        Event::Lost { count: 7, time: 30 },
        Event::Throttle {
            time: 31,
            throttled: true,
        },
        Event::Throttle {
            time: 32,
            throttled: false,
        },
        Event::WatchSet {
            time: 32,
            words: vec![(0x5555_0000_4000, 8), (0x5555_0000_4008, 4)],
            write_only: 0b10,
            exec: 0b01,
            front: 0b10,
            look: 0b01,
        },
        Event::WatchSet {
            time: 33,
            words: vec![],
            write_only: 0,
            exec: 0,
            front: 0,
            look: 0,
        },
        Event::Exit {
            pid: 100,
            ppid: 100,
            tid: 101,
            ptid: 100,
            time: 33,
        },
    ]);
    v
}

fn header() -> TraceHeader {
    let mut h = TraceHeader::new(BackendKind::Soft);
    h.cmdline = vec!["./app".into(), "--threads".into(), "2".into()];
    h.maps = "555500000000-555500002000 r-xp 00001000 08:01 42 /usr/bin/app\n".into();
    h.pid = 100;
    h
}

/// The file, and the offset where each record ends (record i is readable iff the file
/// reaches `ends[i]`).
fn recording() -> (Vec<u8>, Vec<Event>, usize, Vec<usize>) {
    let evs = events();
    let mut w = Writer::new(Vec::new(), &header()).unwrap();
    for e in &evs {
        w.write(e).unwrap();
    }
    let foot = w.footer(1_000_000);
    let bytes = w.finish(foot).unwrap();
    let mut r = Reader::new(&bytes).unwrap();
    let first = r.offset() as usize;
    let mut ends = Vec::new();
    while let Some(e) = r.next() {
        e.unwrap();
        ends.push(r.offset() as usize);
    }
    assert!(r.end_state().unwrap().is_complete());
    (bytes, evs, first, ends)
}

/// Reads everything a reader gives; returns the events before the first error, whether an
/// error came, and the end state.
fn drain<I: Iterator<Item = Result<Event, TraceError>>>(it: I) -> (Vec<Event>, bool) {
    let mut got = Vec::new();
    for e in it {
        match e {
            Ok(e) => got.push(e),
            Err(_) => return (got, true),
        }
    }
    (got, false)
}

/// `drain` through the lending API.
fn drain_ref(r: &mut Reader<'_>) -> (Vec<Event>, bool) {
    let mut got = Vec::new();
    while let Some(e) = r.next_ref() {
        match e {
            Ok(e) => got.push(e.clone()),
            Err(_) => return (got, true),
        }
    }
    (got, false)
}

#[test]
fn fixture_covers_every_variant() {
    let evs = events();
    assert!(evs.len() >= 20);
    let has = |f: fn(&Event) -> bool| evs.iter().any(f);
    assert!(has(
        |e| matches!(e, Event::Sample(s) if s.regs.is_some() && s.addr.is_some() && s.data_src.is_some())
    ));
    assert!(has(
        |e| matches!(e, Event::Sample(s) if s.watch_slot.is_some())
    ));
    assert!(has(|e| matches!(e, Event::Mmap(m) if m.build_id.is_some())));
    assert!(has(|e| matches!(e, Event::Comm { .. })));
    assert!(has(|e| matches!(e, Event::Fork { .. })));
    assert!(has(|e| matches!(e, Event::Exit { .. })));
    assert!(has(|e| matches!(e, Event::Lost { .. })));
    assert!(has(|e| matches!(e, Event::Throttle { .. })));
    assert!(has(
        |e| matches!(e, Event::WatchSet { words, .. } if words.len() == 2)
    ));
}

#[test]
fn every_cut_point_reads_a_clean_prefix() {
    let (bytes, evs, first, ends) = recording();
    for cut in 0..=bytes.len() {
        let part = &bytes[..cut];
        let mut r = match Reader::new(part) {
            Ok(r) => r,
            Err(e) => {
                assert!(cut < first, "cut {cut} after the header failed: {e}");
                continue;
            }
        };
        assert!(cut >= first, "a header cut at {cut} parsed");
        let (got, errored) = drain(r.by_ref());
        assert!(!errored, "cut {cut}: truncation reported as an error");
        let whole = ends.iter().filter(|&&e| e <= cut).count();
        assert_eq!(got, evs[..whole], "cut {cut}");
        match r.end_state().unwrap() {
            EndState::Complete { footer } => {
                assert_eq!(cut, bytes.len());
                assert_eq!(footer.stats.records, evs.len() as u64);
            }
            EndState::Truncated { offset } => {
                assert!(cut < bytes.len());
                let expect = if whole == 0 { first } else { ends[whole - 1] };
                // Past the last event, the footer or trailer is what is missing.
                if whole < evs.len() {
                    assert_eq!(*offset as usize, expect, "cut {cut}");
                }
            }
            s => panic!("cut {cut}: {s:?}"),
        }
        // The lending path and the streaming reader must agree.
        let mut l = Reader::new(part).unwrap();
        assert_eq!(drain_ref(&mut l), (got.clone(), false), "lend, cut {cut}");
        assert_eq!(l.end_state(), r.end_state(), "lend, cut {cut}");
        let mut s = StreamReader::new(part).unwrap();
        let (sgot, serr) = drain(s.by_ref());
        assert!(!serr);
        assert_eq!(sgot, got, "stream, cut {cut}");
        assert_eq!(s.end_state(), r.end_state(), "stream, cut {cut}");
    }
}

#[test]
fn flipped_payload_byte_stops_with_checksum_error_at_that_record() {
    let (mut bytes, evs, _, ends) = recording();
    // A byte inside record 5's payload.
    let at = ends[4] + 9;
    bytes[at] ^= 0x40;
    let mut r = Reader::new(&bytes).unwrap();
    let mut got = Vec::new();
    let mut err = None;
    for e in r.by_ref() {
        match e {
            Ok(e) => got.push(e),
            Err(e) => err = Some(e),
        }
    }
    assert_eq!(got, evs[..5]);
    let err = err.expect("damage must be reported");
    assert_eq!(err.offset(), Some(ends[4] as u64));
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!("record at byte {}: checksum mismatch", ends[4])),
        "{msg}"
    );
    assert!(
        matches!(r.end_state(), Some(EndState::Corrupt { offset, .. }) if *offset == ends[4] as u64)
    );
}

#[test]
fn huge_length_field_is_corruption_not_an_allocation() {
    let (mut bytes, evs, _, ends) = recording();
    bytes[ends[1] + 4] = 0xff; // high byte of record 2's length
    let mut r = Reader::new(&bytes).unwrap();
    let (got, errored) = drain(r.by_ref());
    assert_eq!(got, evs[..2]);
    assert!(errored);
    let mut s = StreamReader::new(&bytes[..]).unwrap();
    let (sgot, serr) = drain(s.by_ref());
    assert_eq!((sgot, serr), (got, true));
}

#[test]
fn trailing_garbage_after_end_marker_is_reported() {
    let (mut bytes, evs, _, _) = recording();
    bytes.extend_from_slice(b"junk");
    let mut r = Reader::new(&bytes).unwrap();
    let (got, errored) = drain(r.by_ref());
    assert_eq!(got, evs);
    assert!(errored);
    assert!(
        matches!(r.end_state(), Some(EndState::Corrupt { why, .. }) if why.contains("4 unexpected bytes"))
    );
}

#[test]
fn empty_file_is_an_error() {
    let e = Reader::new(&[]).err().unwrap();
    assert!(matches!(e, TraceError::Empty), "{e}");
    assert!(StreamReader::new(&[][..]).is_err());
}

#[test]
fn non_laser_file_is_named_as_such() {
    let elf = b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0\x03\0>\0";
    let e = Reader::new(elf).err().unwrap();
    let msg = e.to_string();
    assert!(
        msg.starts_with("not a laser recording (magic 7f454c4602010100"),
        "{msg}"
    );
    assert!(matches!(
        StreamReader::new(&b"hello world"[..]).err().unwrap(),
        TraceError::NotLaser { .. }
    ));
}

#[test]
fn future_version_is_refused_with_both_numbers() {
    let (mut bytes, _, _, _) = recording();
    bytes[8..10].copy_from_slice(&7u16.to_le_bytes());
    let e = Reader::new(&bytes).err().unwrap();
    assert!(matches!(e, TraceError::NewerVersion { found: 7 }));
    assert_eq!(
        e.to_string(),
        format!(
            "version 7 is newer than this laser ({}); upgrade laser to read it",
            laser_driver::trace::VERSION
        )
    );
}

#[test]
fn damaged_header_is_an_error() {
    let (mut bytes, _, first, _) = recording();
    bytes[first - 6] ^= 1;
    assert!(matches!(
        Reader::new(&bytes).err().unwrap(),
        TraceError::HeaderChecksum { .. }
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn random_byte_flips_never_invent_events(
        flips in prop::collection::vec((any::<prop::sample::Index>(), 1..=255u8), 1..4)
    ) {
        let (mut bytes, evs, _, _) = recording();
        let n = bytes.len();
        let mut offsets = std::collections::BTreeSet::new();
        for (i, x) in &flips {
            let at = i.index(n);
            if offsets.insert(at) {
                bytes[at] ^= x;
            }
        }
        if let Ok(mut r) = Reader::new(&bytes) {
            let (got, _) = drain(r.by_ref());
            prop_assert!(got.len() <= evs.len());
            prop_assert_eq!(&got[..], &evs[..got.len()]);
            prop_assert!(!r.end_state().unwrap().is_complete(), "damage at {:?} went unnoticed", offsets);
        }
        if let Ok(mut l) = Reader::new(&bytes) {
            let (got, _) = drain_ref(&mut l);
            prop_assert_eq!(&got[..], &evs[..got.len()]);
            prop_assert!(!l.end_state().unwrap().is_complete());
        }
        if let Ok(mut s) = StreamReader::new(&bytes[..]) {
            let (got, _) = drain(s.by_ref());
            prop_assert_eq!(&got[..], &evs[..got.len()]);
            prop_assert!(!s.end_state().unwrap().is_complete());
        }
    }
}

/// A frame with a valid CRC around any payload, as a buggy or hostile writer could produce.
fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![kind];
    f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    f.extend_from_slice(payload);
    let crc = crc32fast::hash(&f);
    f.extend_from_slice(&crc.to_le_bytes());
    f
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// Checksummed garbage reaches the payload decoders: they must return an error or an
    /// event, never panic, and stop the read at the first error.
    #[test]
    fn checksummed_garbage_payloads_never_panic(
        frames in prop::collection::vec((0u8..9, prop::collection::vec(any::<u8>(), 0..300)), 1..8)
    ) {
        let mut bytes = Writer::new(Vec::new(), &header()).unwrap().finish(Default::default()).unwrap();
        // Keep only the header; append the garbage frames.
        let first = Reader::new(&bytes).unwrap().offset() as usize;
        bytes.truncate(first);
        for (k, p) in &frames {
            bytes.extend(frame(*k, p));
        }
        let mut r = Reader::new(&bytes).unwrap();
        let mut errors = 0;
        let mut items = 0;
        for e in r.by_ref() {
            items += 1;
            errors += usize::from(e.is_err());
        }
        prop_assert!(errors <= 1);
        prop_assert!(items <= frames.len());
        prop_assert!(r.end_state().is_some());
        let mut l = Reader::new(&bytes).unwrap();
        let (lent, lerr) = drain_ref(&mut l);
        let mut s = StreamReader::new(&bytes[..]).unwrap();
        let (streamed, serr) = drain(s.by_ref());
        prop_assert_eq!(&lent, &streamed);
        prop_assert_eq!(lerr, serr);
        prop_assert_eq!(l.end_state(), s.end_state());
    }

    /// Arbitrary bytes after a valid magic: `Reader::new` and iteration never panic.
    #[test]
    fn arbitrary_bytes_never_panic(tail in prop::collection::vec(any::<u8>(), 0..400)) {
        let mut bytes = laser_driver::trace::MAGIC.to_vec();
        bytes.extend_from_slice(&tail);
        if let Ok(mut r) = Reader::new(&bytes) {
            for _ in r.by_ref() {}
        }
        if let Ok(mut s) = StreamReader::new(&bytes[..]) {
            for _ in s.by_ref() {}
        }
    }
}
