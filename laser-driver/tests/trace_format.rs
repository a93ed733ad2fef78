//! The recording format round-trips every event and header losslessly, through both readers,
//! and stays readable when a newer laser adds header fields or record kinds.

use laser_driver::trace::{
    EndState, PerfAttr, Reader, StreamReader, TraceError, TraceHeader, Writer, MAGIC,
};
use laser_driver::{BackendKind, Event, Mmap, Sample, StreamStats, UserRegs, NUM_REGS};
use proptest::prelude::*;

fn backend() -> impl Strategy<Value = BackendKind> {
    prop::sample::select(BackendKind::ALL.to_vec())
}

/// Registers as a backend produces them: slots outside the mask are 0.
fn regs() -> impl Strategy<Value = UserRegs> {
    (any::<u64>(), prop::array::uniform24(any::<u64>())).prop_map(|(mask, vals)| {
        let mut r = UserRegs {
            mask,
            values: [0; NUM_REGS],
        };
        for (i, v) in vals.into_iter().enumerate() {
            if mask & (1 << i) != 0 {
                r.values[i] = v;
            }
        }
        r
    })
}

fn sample() -> impl Strategy<Value = Sample> {
    (
        backend(),
        any::<(u32, u32, u32)>(),
        any::<(u64, u64, u64)>(),
        any::<Option<u64>>(),
        any::<Option<u64>>(),
        prop::option::of(regs()),
        any::<Option<u8>>(),
        prop::collection::vec(any::<u64>(), 0..=laser_driver::MAX_CALLERS),
    )
        .prop_map(
            |(
                backend,
                (pid, tid, cpu),
                (time, ip, weight),
                addr,
                data_src,
                regs,
                watch_slot,
                callers,
            )| {
                Sample {
                    backend,
                    pid,
                    tid,
                    cpu,
                    time,
                    ip,
                    addr,
                    data_src,
                    weight,
                    regs,
                    watch_slot,
                    callers: callers.iter().collect(),
                }
            },
        )
}

fn event() -> impl Strategy<Value = Event> {
    let ids = any::<(u32, u32, u32, u32, u64)>();
    prop_oneof![
        6 => sample().prop_map(Event::Sample),
        1 => (
            any::<(u32, u32, u64, u64, u64, u64, u32, u32)>(),
            ".{0,40}",
            prop::option::of(prop::collection::vec(any::<u8>(), 0..40)),
        )
            .prop_map(|((pid, tid, time, addr, len, pgoff, prot, flags), path, build_id)| {
                Event::Mmap(Mmap { pid, tid, time, addr, len, pgoff, prot, flags, path, build_id })
            }),
        1 => (any::<(u32, u32, u64, bool)>(), ".{0,16}").prop_map(|((pid, tid, time, exec), name)| {
            Event::Comm { pid, tid, time, name, exec }
        }),
        1 => ids.prop_map(|(pid, ppid, tid, ptid, time)| Event::Fork { pid, ppid, tid, ptid, time }),
        1 => ids.prop_map(|(pid, ppid, tid, ptid, time)| Event::Exit { pid, ppid, tid, ptid, time }),
        // Kernel lost counts are small (the footer check compares sums of them).
        1 => (0..u64::from(u32::MAX), any::<u64>()).prop_map(|(count, time)| Event::Lost { count, time }),
        1 => any::<(u64, bool)>().prop_map(|(time, throttled)| Event::Throttle { time, throttled }),
        1 => (any::<u64>(), proptest::collection::vec(any::<(u64, u8)>(), 0..5), any::<(u8, u8, u8, u8)>())
            .prop_map(|(time, words, (w, x, f, l))| {
                // One bit per word.
                let mask = ((1u16 << words.len()) - 1) as u8;
                let (write_only, exec, front, look) = (w & mask, x & mask, f & mask, l & mask);
                Event::WatchSet { time, words, write_only, exec, front, look }
            }),
        1 => any::<(u64, u64)>().prop_map(|(time, hit_ns)| Event::WatchCost { time, hit_ns }),
    ]
}

fn header() -> impl Strategy<Value = TraceHeader> {
    (
        backend(),
        prop::collection::vec(
            (".{0,20}", prop::collection::vec(any::<u8>(), 0..136)),
            0..3,
        ),
        any::<(u64, u32, u64, u64)>(),
        ".{0,30}",
        prop::collection::vec(".{0,12}", 0..4),
        ".{0,200}",
        prop::collection::btree_map(".{0,30}", prop::collection::vec(any::<u8>(), 0..24), 0..3),
    )
        .prop_map(
            |(backend, attrs, (freq, pid, unix, perf), cpu, cmdline, maps, build_ids)| {
                let mut h = TraceHeader::new(backend);
                h.attrs = attrs
                    .into_iter()
                    .map(|(description, raw)| PerfAttr { description, raw })
                    .collect();
                h.sample_freq = freq;
                h.pid = pid;
                h.start_time_unix_ns = unix;
                h.start_time_perf_ns = perf;
                h.cpu_model = cpu;
                h.cmdline = cmdline;
                h.maps = maps;
                h.build_ids = build_ids;
                h
            },
        )
}

fn write(h: &TraceHeader, evs: &[Event], duration_ns: u64) -> Vec<u8> {
    let mut w = Writer::new(Vec::new(), h).unwrap();
    for e in evs {
        w.write(e).unwrap();
    }
    let f = w.footer(duration_ns);
    w.finish(f).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn round_trip(h in header(), evs in prop::collection::vec(event(), 0..60), dur in any::<u64>()) {
        let bytes = write(&h, &evs, dur);
        let mut expect = StreamStats::default();
        evs.iter().for_each(|e| expect.account(e));

        let mut r = Reader::new(&bytes).unwrap();
        prop_assert_eq!(r.header(), &h);
        let got: Vec<Event> = r.by_ref().collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(&got, &evs);
        let complete = EndState::Complete {
            footer: laser_driver::trace::TraceFooter { stats: expect, duration_ns: dur },
        };
        prop_assert_eq!(r.end_state(), Some(&complete));
        prop_assert_eq!(r.quick_footer(), Some(laser_driver::trace::TraceFooter { stats: expect, duration_ns: dur }));

        // The lending path reuses one slot: registers of a previous sample must not leak
        // into the next (random masks make every sample's mask differ).
        let mut l = Reader::new(&bytes).unwrap();
        let mut lent = Vec::new();
        while let Some(e) = l.next_ref() {
            lent.push(e.unwrap().clone());
        }
        prop_assert_eq!(&lent, &evs);
        prop_assert_eq!(l.end_state(), Some(&complete));

        let mut s = StreamReader::new(&bytes[..]).unwrap();
        prop_assert_eq!(s.header(), &h);
        let sgot: Vec<Event> = s.by_ref().collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(&sgot, &evs);
        prop_assert_eq!(s.end_state(), Some(&complete));
    }
}

/// A frame as the format document describes it, built independently of the writer.
fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![kind];
    f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    f.extend_from_slice(payload);
    let crc = crc32fast::hash(&f);
    f.extend_from_slice(&crc.to_le_bytes());
    f
}

#[test]
fn documented_layout_of_a_lost_record() {
    let h = TraceHeader::new(BackendKind::Soft);
    let bytes = write(&h, &[Event::Lost { count: 3, time: 9 }], 5);
    let (_, first) = header_span(&bytes);
    let mut payload = 3u64.to_le_bytes().to_vec();
    payload.extend_from_slice(&9u64.to_le_bytes());
    let f = frame(6, &payload);
    assert_eq!(&bytes[first..first + f.len()], &f[..]);
    // Footer right after, then the trailer pointing at it.
    let foot_at = first + f.len();
    assert_eq!(bytes[foot_at], 0xff);
    let n = bytes.len();
    assert_eq!(&bytes[n - 8..], b"LASEREND");
    assert_eq!(
        u64::from_le_bytes(bytes[n - 16..n - 8].try_into().unwrap()),
        foot_at as u64
    );
}

#[test]
fn documented_layout_of_a_soft_sample() {
    // CRC-32 as the document names it.
    assert_eq!(crc32fast::hash(b"123456789"), 0xcbf4_3926);
    let mut regs = UserRegs::default();
    for i in 0..NUM_REGS {
        if laser_driver::SOFT_REGS_MASK & (1 << i) != 0 {
            regs.values[i] = 0x1000 + i as u64;
        }
    }
    regs.mask = laser_driver::SOFT_REGS_MASK;
    let s = Sample {
        backend: BackendKind::Watch,
        pid: 11,
        tid: 12,
        cpu: 1,
        time: 99,
        ip: 0x401000,
        addr: Some(0x5000),
        data_src: None,
        weight: 3,
        regs: Some(regs),
        watch_slot: Some(2),
        callers: Default::default(),
    };
    // A sample's frame as written, and its payload built from TRACE_FORMAT.md field by
    // field: backend 4 (watch), flags, pid 11, tid 12, cpu 1, time 99, ip, weight 3, then
    // the optional u64 fields given.
    let written = |s: &Sample| {
        let bytes = write(
            &TraceHeader::new(BackendKind::Watch),
            &[Event::Sample(s.clone())],
            0,
        );
        let (_, first) = header_span(&bytes);
        bytes[first..].to_vec()
    };
    let fixed = |flags: u8, optional: &[u64]| {
        let mut p = vec![4u8, flags];
        for v in [11u32, 12, 1] {
            p.extend_from_slice(&v.to_le_bytes());
        }
        for v in [99u64, 0x401000, 3].iter().chain(optional) {
            p.extend_from_slice(&v.to_le_bytes());
        }
        p
    };
    let mut p = fixed(0b1101, &[0x5000]);
    p.push(2);
    p.extend_from_slice(&laser_driver::SOFT_REGS_MASK.to_le_bytes());
    for i in (0..10).chain(16..24) {
        p.extend_from_slice(&(0x1000u64 + i).to_le_bytes());
    }
    let f = frame(1, &p);
    assert_eq!(&written(&s)[..f.len()], &f[..]);
    // Without addr and watch_slot this is the document's 199-byte soft sample frame.
    assert_eq!(f.len() - 9, 199);

    // Callers follow the registers: a count byte, then the addresses.
    let with_callers = Sample {
        regs: None,
        watch_slot: None,
        addr: None,
        callers: [0x401234u64, 0x7f00_0000_0010].iter().collect(),
        ..s
    };
    let mut p = fixed(0b1_0000, &[]);
    p.push(2);
    for v in [0x401234u64, 0x7f00_0000_0010] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    let f = frame(1, &p);
    assert_eq!(&written(&with_callers)[..f.len()], &f[..]);
    let bytes = write(
        &TraceHeader::new(BackendKind::Watch),
        &[Event::Sample(with_callers.clone())],
        0,
    );
    let back: Vec<Event> = Reader::new(&bytes).unwrap().map(Result::unwrap).collect();
    assert_eq!(back, vec![Event::Sample(with_callers)]);
}

#[test]
fn record_removed_whole_is_caught_by_the_footer_count() {
    let evs: Vec<Event> = (0..5).map(|i| Event::Lost { count: i, time: i }).collect();
    let bytes = write(&TraceHeader::new(BackendKind::Soft), &evs, 0);
    let (_, first) = header_span(&bytes);
    let lost_frame = 9 + 16;
    // Splice out the second record and fix the trailer so only the count can tell.
    let mut cut = bytes[..first + lost_frame].to_vec();
    cut.extend_from_slice(&bytes[first + 2 * lost_frame..]);
    let n = cut.len();
    let foot = u64::from_le_bytes(cut[n - 16..n - 8].try_into().unwrap()) - lost_frame as u64;
    cut[n - 16..n - 8].copy_from_slice(&foot.to_le_bytes());
    let mut r = Reader::new(&cut).unwrap();
    let mut got = Vec::new();
    let mut err = None;
    for e in r.by_ref() {
        match e {
            Ok(e) => got.push(e),
            Err(e) => err = Some(e.to_string()),
        }
    }
    assert_eq!(got.len(), 4);
    let err = err.expect("a missing record must be reported");
    assert!(
        err.ends_with("footer counts 5 records but the file holds 4"),
        "{err}"
    );
}

#[test]
fn writer_dropped_without_finish_leaves_every_event_readable() {
    let evs: Vec<Event> = (0..100)
        .map(|i| Event::Lost { count: i, time: i })
        .collect();
    let mut file = Vec::new();
    {
        let mut w = Writer::new(&mut file, &TraceHeader::new(BackendKind::Soft)).unwrap();
        for e in &evs {
            w.write(e).unwrap();
        }
        // Dropped here, as on an error path: no footer.
    }
    let mut r = Reader::new(&file).unwrap();
    let got: Vec<_> = r.by_ref().collect::<Result<_, _>>().unwrap();
    assert_eq!(got, evs);
    assert_eq!(
        r.end_state(),
        Some(&EndState::Truncated {
            offset: file.len() as u64
        })
    );
    assert_eq!(r.quick_footer(), None);
}

/// (TLV length, offset of the first record) read from the fixed file head.
fn header_span(bytes: &[u8]) -> (usize, usize) {
    assert_eq!(bytes[..8], MAGIC);
    let len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    (len, 16 + len + 4)
}

/// Rewrites the header with `extra` TLV bytes appended and its CRC recomputed.
fn with_extra_header_field(bytes: &[u8], extra: &[u8]) -> Vec<u8> {
    let (len, first) = header_span(bytes);
    let mut out = bytes[..16 + len].to_vec();
    out.extend_from_slice(extra);
    let new_len = (len + extra.len()) as u32;
    out[12..16].copy_from_slice(&new_len.to_le_bytes());
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&bytes[first..]);
    out
}

#[test]
fn unknown_header_tags_are_skipped() {
    let mut h = TraceHeader::new(BackendKind::Watch);
    h.cpu_model = "AMD EPYC".into();
    let evs = [Event::Lost { count: 1, time: 2 }];
    let bytes = write(&h, &evs, 0);
    let mut tlv = 999u16.to_le_bytes().to_vec();
    tlv.extend_from_slice(&3u32.to_le_bytes());
    tlv.extend_from_slice(b"new");
    // The trailer's footer offset moves with the header; rebuild the tail by hand.
    let moved = with_extra_header_field(&bytes, &tlv);
    let n = moved.len();
    let foot = u64::from_le_bytes(moved[n - 16..n - 8].try_into().unwrap()) + tlv.len() as u64;
    let mut fixed = moved;
    fixed[n - 16..n - 8].copy_from_slice(&foot.to_le_bytes());
    let mut r = Reader::new(&fixed).unwrap();
    assert_eq!(r.header(), &h);
    let got: Vec<_> = r.by_ref().collect::<Result<_, _>>().unwrap();
    assert_eq!(got, evs);
    assert!(r.end_state().unwrap().is_complete(), "{:?}", r.end_state());
}

#[test]
fn header_without_backend_is_refused() {
    let bytes = write(&TraceHeader::new(BackendKind::Soft), &[], 0);
    // Change the backend field's tag (first TLV, tag 1) to an unknown one.
    let (len, first) = header_span(&bytes);
    let mut out = bytes[..16 + len].to_vec();
    out[16..18].copy_from_slice(&500u16.to_le_bytes());
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&bytes[first..]);
    let e = Reader::new(&out).err().unwrap();
    assert!(e.to_string().contains("no backend field"), "{e}");
}

#[test]
fn unknown_record_kinds_are_skipped_and_counted() {
    let evs = [
        Event::Lost { count: 1, time: 2 },
        Event::Throttle {
            time: 3,
            throttled: true,
        },
    ];
    let h = TraceHeader::new(BackendKind::Soft);
    let mut bytes = write(&h, &evs[..1], 0);
    // Cut the footer off and splice in: a future kind, the second event, and a footer that
    // counts all three records.
    let n = bytes.len();
    let foot = u64::from_le_bytes(bytes[n - 16..n - 8].try_into().unwrap()) as usize;
    bytes.truncate(foot);
    bytes.extend(frame(0x42, b"from the future"));
    let mut payload = 3u64.to_le_bytes().to_vec();
    payload.push(1);
    bytes.extend(frame(7, &payload));
    let foot = bytes.len() as u64;
    let mut fp = Vec::new();
    for v in [0u64, 1, 1, 3, 0] {
        fp.extend_from_slice(&v.to_le_bytes());
    }
    bytes.extend(frame(0xff, &fp));
    bytes.extend_from_slice(&foot.to_le_bytes());
    bytes.extend_from_slice(b"LASEREND");

    let mut r = Reader::new(&bytes).unwrap();
    let got: Vec<_> = r.by_ref().collect::<Result<_, _>>().unwrap();
    assert_eq!(got, evs);
    assert_eq!(r.skipped_unknown(), 1);
    assert!(r.end_state().unwrap().is_complete(), "{:?}", r.end_state());
    let mut s = StreamReader::new(&bytes[..]).unwrap();
    let sgot: Vec<_> = s.by_ref().collect::<Result<_, _>>().unwrap();
    assert_eq!(sgot, evs);
    assert!(s.end_state().unwrap().is_complete());
}

#[test]
fn footer_that_miscounts_records_is_corruption() {
    let evs = [Event::Lost { count: 1, time: 2 }];
    let mut w = Writer::new(Vec::new(), &TraceHeader::new(BackendKind::Soft)).unwrap();
    w.write(&evs[0]).unwrap();
    let mut f = w.footer(0);
    f.stats.records = 5;
    let e = w.finish(f).err().unwrap();
    assert!(matches!(
        e,
        TraceError::FooterMismatch {
            footer: 5,
            written: 1
        }
    ));
}

#[test]
fn record_payload_that_does_not_decode_is_an_error_with_its_kind() {
    let h = TraceHeader::new(BackendKind::Soft);
    let mut bytes = write(&h, &[], 0);
    let (_, first) = header_span(&bytes);
    bytes.truncate(first);
    // A throttle record whose boolean is 2, CRC valid: a writer bug, not a flipped bit.
    let mut payload = 1u64.to_le_bytes().to_vec();
    payload.push(2);
    bytes.extend(frame(7, &payload));
    let mut r = Reader::new(&bytes).unwrap();
    let e = r.next().unwrap().err().unwrap();
    assert_eq!(
        e.to_string(),
        format!("record at byte {first} (kind 7): boolean field is neither 0 nor 1")
    );
    assert!(r.next().is_none());
    assert!(matches!(r.end_state(), Some(EndState::Corrupt { .. })));
}

#[test]
fn full_disk_leaves_a_readable_prefix() {
    use std::{cell::RefCell, rc::Rc};
    // A sink that takes at most `cap` bytes, like a disk filling up mid-write.
    struct Full(Rc<RefCell<Vec<u8>>>, usize);
    impl std::io::Write for Full {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let mut v = self.0.borrow_mut();
            let room = self.1 - v.len();
            if room == 0 {
                return Err(std::io::Error::other("disk full"));
            }
            let n = b.len().min(room);
            v.extend_from_slice(&b[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let s = Event::Sample(Sample {
        backend: BackendKind::Soft,
        pid: 1,
        tid: 1,
        cpu: 0,
        time: 0,
        ip: 0x401000,
        addr: None,
        data_src: None,
        weight: 1,
        regs: Some(UserRegs {
            mask: (1 << NUM_REGS) - 1,
            values: [7; NUM_REGS],
        }),
        watch_slot: None,
        callers: Default::default(),
    });
    let sink = Rc::new(RefCell::new(Vec::new()));
    let h = TraceHeader::new(BackendKind::Soft);
    let mut w = Writer::new(Full(sink.clone(), 200_000), &h).unwrap();
    let mut written = 0;
    let err = loop {
        match w.write(&s) {
            Ok(()) => written += 1,
            Err(e) => break e,
        }
        assert!(written < 100_000, "the full disk must surface as an error");
    };
    assert!(err.to_string().contains("disk full"), "{err}");
    // After a failed write the writer refuses more: appending could follow a torn record.
    let again = w.write(&s).expect_err("refused after a failure");
    assert!(matches!(again, TraceError::WriterFailed { .. }), "{again}");
    drop(w);
    let bytes = sink.borrow().clone();
    assert_eq!(bytes.len(), 200_000);
    let mut r = Reader::new(&bytes).unwrap();
    let got: Vec<_> = r.by_ref().collect::<Result<_, _>>().unwrap();
    assert!(!got.is_empty() && got.len() <= written);
    assert!(got.iter().all(|e| *e == s));
    assert!(matches!(r.end_state(), Some(EndState::Truncated { .. })));
}

#[test]
fn stream_reader_copes_with_short_reads_and_interruptions() {
    // A pipe hands data over in arbitrary pieces and may be interrupted by a signal.
    struct Trickle<'a> {
        data: &'a [u8],
        calls: usize,
    }
    impl std::io::Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.calls += 1;
            if self.calls.is_multiple_of(7) {
                return Err(std::io::ErrorKind::Interrupted.into());
            }
            let n = buf.len().min(self.data.len()).min(1 + self.calls % 3);
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }
    let mut h = TraceHeader::new(BackendKind::Soft);
    h.maps = "x".repeat(300);
    let evs: Vec<Event> = (0..50)
        .map(|i| Event::Comm {
            pid: i,
            tid: i,
            time: u64::from(i),
            name: format!("t{i}"),
            exec: i.is_multiple_of(2),
        })
        .collect();
    let bytes = write(&h, &evs, 1);
    let mut s = StreamReader::new(Trickle {
        data: &bytes,
        calls: 0,
    })
    .unwrap();
    assert_eq!(s.header(), &h);
    let got: Vec<_> = s.by_ref().collect::<Result<_, _>>().unwrap();
    assert_eq!(got, evs);
    assert!(s.end_state().unwrap().is_complete());
}
