//! Every record type laser consumes, written byte by byte as the kernel lays it out for
//! [`SAMPLE_TYPE`] with `sample_id_all`, pushed through a ring (wrapping) and decoded.

use super::*;
use crate::attr::{self, Binding};
use crate::event::{Reg, SOFT_REGS_MASK};
use crate::ring::{drain, SliceRing};

const ID_SOFT: u64 = 0x51;
const ID_WATCH: u64 = 0x77;

fn decoder() -> Decoder {
    let info = attr::parse_info(&attr::to_bytes(&attr::soft(Binding::Launch, 1000, 0))).unwrap();
    let mut d = Decoder::new(info, Source::Soft);
    d.add_source(ID_SOFT, Source::Soft);
    d.add_source(ID_WATCH, Source::Watch(2));
    d
}

#[derive(Default)]
struct Body(Vec<u8>);
impl Body {
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u8s(mut self, v: &[u8]) -> Self {
        self.0.extend_from_slice(v);
        self
    }
    /// NUL-terminated, padded to 8 bytes like the kernel's filename/comm fields.
    fn cstr(mut self, s: &str) -> Self {
        self.0.extend_from_slice(s.as_bytes());
        self.0.push(0);
        while !self.0.len().is_multiple_of(8) {
            self.0.push(0);
        }
        self
    }
    /// sample_id trailer: TID, TIME, CPU, IDENTIFIER (in the kernel's order).
    fn trailer(self, pid: u32, tid: u32, time: u64, cpu: u32, id: u64) -> Vec<u8> {
        self.u32(pid).u32(tid).u64(time).u32(cpu).u32(0).u64(id).0
    }
}

fn sample_body(id: u64, ip: u64, pid: u32, tid: u32, time: u64, addr: u64, cpu: u32) -> Vec<u8> {
    let mut b = regs_part(id, ip, pid, tid, time, addr, cpu);
    // PERF_SAMPLE_STACK_USER with nothing copied: size 0 and no dyn_size.
    b.extend_from_slice(&0u64.to_le_bytes());
    b
}

/// A sample whose stack copy holds `words` (the kernel's `size` = STACK_USER_BYTES, the rest
/// zero) of which the first `dyn_size` bytes are real.
fn sample_with_stack(ip: u64, words: &[u64], dyn_size: u64) -> Vec<u8> {
    let mut b = regs_part(ID_SOFT, ip, 10, 11, 200, 0, 0);
    let size = attr::STACK_USER_BYTES as usize;
    b.extend_from_slice(&(size as u64).to_le_bytes());
    let mut stack: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    stack.resize(size, 0);
    b.extend_from_slice(&stack);
    b.extend_from_slice(&dyn_size.to_le_bytes());
    b
}

fn regs_part(id: u64, ip: u64, pid: u32, tid: u32, time: u64, addr: u64, cpu: u32) -> Vec<u8> {
    let mut b = Body::default()
        .u64(id)
        .u64(ip)
        .u32(pid)
        .u32(tid)
        .u64(time)
        .u64(addr)
        .u32(cpu)
        .u32(0)
        .u64(250_000) // period
        .u64(2); // PERF_SAMPLE_REGS_ABI_64
    for i in 0..NUM_REGS as u64 {
        if SOFT_REGS_MASK & (1 << i) != 0 {
            b = b.u64(0x1000 + i);
        }
    }
    b.0
}

fn decode_all(records: &[(u32, u16, Vec<u8>)], start: u64) -> (Vec<Event>, Decoder) {
    let mut ring = SliceRing::new(4096, start);
    for (k, m, b) in records {
        assert!(ring.push(*k, *m, b));
    }
    let mut d = decoder();
    let mut out = Vec::new();
    let mut scratch = Vec::new();
    let n = drain(&mut ring, &mut scratch, |r| out.extend(d.decode(r))).unwrap();
    assert_eq!(n, records.len());
    (out, d)
}

#[test]
fn every_record_type_decodes() {
    let records = vec![
        (9, 2, sample_body(ID_SOFT, 0x401000, 10, 11, 100, 0, 1)),
        (
            9,
            2,
            sample_body(ID_WATCH, 0x401008, 10, 12, 101, 0x404040, 0),
        ),
        (
            10,
            0,
            Body::default()
                .u32(10)
                .u32(10)
                .u64(0x400000)
                .u64(0x2000)
                .u64(0x1000)
                .u32(8)
                .u32(1)
                .u64(1234)
                .u64(0)
                .u32(5)
                .u32(2)
                .cstr("/usr/bin/app")
                .trailer(10, 10, 102, 0, ID_SOFT),
        ),
        (
            10,
            PERF_RECORD_MISC_MMAP_BUILD_ID,
            Body::default()
                .u32(10)
                .u32(10)
                .u64(0x7f00_0000_0000)
                .u64(0x1000)
                .u64(0)
                .u8s(&[4, 0, 0, 0])
                .u8s(&[0xde, 0xad, 0xbe, 0xef])
                .u8s(&[0; 16])
                .u32(5)
                .u32(2)
                .cstr("/lib/libc.so.6")
                .trailer(10, 10, 103, 0, ID_SOFT),
        ),
        (
            3,
            0,
            Body::default()
                .u32(10)
                .u32(12)
                .cstr("worker")
                .trailer(10, 12, 104, 1, ID_SOFT),
        ),
        (
            3,
            1 << 13,
            Body::default()
                .u32(10)
                .u32(10)
                .cstr("app")
                .trailer(10, 10, 105, 1, ID_SOFT),
        ),
        (
            7,
            0,
            Body::default()
                .u32(10)
                .u32(10)
                .u32(12)
                .u32(10)
                .u64(106)
                .trailer(10, 12, 106, 0, ID_SOFT),
        ),
        (
            4,
            0,
            Body::default()
                .u32(10)
                .u32(10)
                .u32(12)
                .u32(12)
                .u64(107)
                .trailer(10, 12, 107, 0, ID_SOFT),
        ),
        (
            2,
            0,
            Body::default()
                .u64(ID_SOFT)
                .u64(42)
                .trailer(10, 12, 108, 0, ID_SOFT),
        ),
        (
            5,
            0,
            Body::default()
                .u64(109)
                .u64(ID_SOFT)
                .u64(0)
                .trailer(10, 12, 109, 0, ID_SOFT),
        ),
        (
            6,
            0,
            Body::default()
                .u64(110)
                .u64(ID_SOFT)
                .u64(0)
                .trailer(10, 12, 110, 0, ID_SOFT),
        ),
    ];
    // Start near the end so several records straddle the wrap.
    let (events, d) = decode_all(&records, 4096 - 300);
    assert_eq!(d.malformed, 0);
    assert_eq!(events.len(), records.len());

    let Event::Sample(s) = &events[0] else {
        panic!("{:?}", events[0])
    };
    assert_eq!(
        (s.backend, s.pid, s.tid, s.cpu, s.time, s.ip, s.addr),
        (BackendKind::Soft, 10, 11, 1, 100, 0x401000, None)
    );
    assert_eq!(s.weight, 250_000);
    let regs = s.regs.unwrap();
    assert_eq!(regs.mask, SOFT_REGS_MASK);
    assert_eq!(regs.get(Reg::Ax), Some(0x1000));
    assert_eq!(regs.get(Reg::Ip), Some(0x1008));
    assert_eq!(regs.get(Reg::R15), Some(0x1000 + 23));
    assert_eq!(regs.get(Reg::Cs), None);

    let Event::Sample(w) = &events[1] else {
        panic!()
    };
    assert_eq!(
        (w.backend, w.tid, w.addr, w.watch_slot, w.weight),
        (BackendKind::Watch, 12, Some(0x404040), Some(2), 1)
    );

    assert_eq!(
        events[2],
        Event::Mmap(Mmap {
            pid: 10,
            tid: 10,
            time: 102,
            addr: 0x400000,
            len: 0x2000,
            pgoff: 0x1000,
            prot: 5,
            flags: 2,
            path: "/usr/bin/app".into(),
            build_id: None,
        })
    );
    let Event::Mmap(m) = &events[3] else { panic!() };
    assert_eq!(m.build_id.as_deref(), Some(&[0xde, 0xad, 0xbe, 0xef][..]));
    assert_eq!((m.path.as_str(), m.time), ("/lib/libc.so.6", 103));
    assert_eq!(
        events[4],
        Event::Comm {
            pid: 10,
            tid: 12,
            time: 104,
            name: "worker".into(),
            exec: false
        }
    );
    assert!(matches!(&events[5], Event::Comm { exec: true, time: 105, name, .. } if name == "app"));
    assert_eq!(
        events[6],
        Event::Fork {
            pid: 10,
            ppid: 10,
            tid: 12,
            ptid: 10,
            time: 106
        }
    );
    assert_eq!(
        events[7],
        Event::Exit {
            pid: 10,
            ppid: 10,
            tid: 12,
            ptid: 12,
            time: 107
        }
    );
    assert_eq!(
        events[8],
        Event::Lost {
            count: 42,
            time: 108
        }
    );
    assert_eq!(
        events[9],
        Event::Throttle {
            time: 109,
            throttled: true
        }
    );
    assert_eq!(
        events[10],
        Event::Throttle {
            time: 110,
            throttled: false
        }
    );

    let mut stats = crate::event::StreamStats::default();
    events.iter().for_each(|e| stats.account(e));
    assert_eq!((stats.samples, stats.lost, stats.throttles), (2, 42, 1));
}

#[test]
fn samples_from_the_tracking_event_and_unknown_types_are_dropped() {
    let mut d = decoder();
    d.add_source(0x99, Source::Tracking);
    let body = sample_body(0x99, 1, 1, 1, 1, 0, 0);
    assert_eq!(
        d.decode(RawRecord {
            kind: 9,
            misc: 0,
            body: &body
        }),
        None
    );
    assert_eq!(
        d.decode(RawRecord {
            kind: 16,
            misc: 0,
            body: &[0; 16]
        }),
        None
    );
    assert_eq!(d.malformed, 0);
}

#[test]
fn truncated_and_corrupt_bodies_are_counted_not_panics() {
    let mut d = decoder();
    let body = sample_body(ID_SOFT, 1, 1, 1, 1, 0, 0);
    for cut in 0..body.len() {
        let _ = d.decode(RawRecord {
            kind: 9,
            misc: 0,
            body: &body[..cut],
        });
    }
    assert!(d.malformed > 0);
    let before = d.malformed;
    // MMAP2 with a build-id length the parser would assert on.
    let mut bad = Body::default()
        .u32(1)
        .u32(1)
        .u64(0)
        .u64(0)
        .u64(0)
        .u8s(&[200, 0, 0, 0])
        .0;
    bad.resize(120, 0);
    assert_eq!(
        d.decode(RawRecord {
            kind: 10,
            misc: PERF_RECORD_MISC_MMAP_BUILD_ID,
            body: &bad
        }),
        None
    );
    assert_eq!(d.malformed, before + 1);
    for kind in [2u32, 3, 4, 5, 6, 7, 10] {
        for cut in 0..40 {
            let _ = d.decode(RawRecord {
                kind,
                misc: 0,
                body: &bad[..cut],
            });
        }
    }
}

#[test]
fn a_sample_split_at_every_byte_decodes_identically() {
    let body = sample_body(ID_WATCH, 0x401008, 10, 12, 101, 0x404040, 1);
    let len = 8 + body.len() as u64;
    let reference = {
        let mut d = decoder();
        d.decode(RawRecord {
            kind: 9,
            misc: 2,
            body: &body,
        })
        .unwrap()
    };
    for split in 0..=len {
        let mut ring = SliceRing::new(512, 512 * 5 - split);
        assert!(ring.push(9, 2, &body));
        let mut d = decoder();
        let mut out = Vec::new();
        drain(&mut ring, &mut Vec::new(), |r| out.extend(d.decode(r))).unwrap();
        assert_eq!(out, vec![reference.clone()], "split at byte {split}");
    }
}

proptest::proptest! {
    /// Arbitrary bodies of every record type decode or count as malformed, never panic.
    #[test]
    fn arbitrary_bodies_never_panic(
        kind in 0u32..20,
        misc in proptest::prelude::any::<u16>(),
        body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400),
    ) {
        let mut d = decoder();
        let _ = d.decode(RawRecord { kind, misc, body: &body });
    }
}

/// Return addresses into other modules are picked from the stack copy, within `dyn_size`,
/// using the executable mappings decoded before the sample (the stack itself is not kept).
#[test]
fn sampled_stacks_yield_return_addresses_into_other_modules() {
    let mmap2 = |addr: u64, len: u64, prot: u32, path: &str, time: u64| {
        Body::default()
            .u32(10)
            .u32(10)
            .u64(addr)
            .u64(len)
            .u64(0)
            .u32(8)
            .u32(1)
            .u64(1234)
            .u64(0)
            .u32(prot)
            .u32(2)
            .cstr(path)
            .trailer(10, 10, time, 0, ID_SOFT)
    };
    let libc_ip = 0x7f00_0000_0100;
    let records = vec![
        // A sample before any code is known: no candidates.
        (9, 0, sample_with_stack(libc_ip, &[0x401010], 512)),
        (10, 0, mmap2(0x400000, 0x2000, 5, "/usr/bin/app", 1)),
        (10, 0, mmap2(0x402000, 0x1000, 3, "/usr/bin/app", 2)),
        (
            10,
            0,
            mmap2(0x7f00_0000_0000, 0x1000, 5, "/lib/libc.so.6", 3),
        ),
        (
            9,
            0,
            sample_with_stack(
                libc_ip,
                // libc frame, app data, the app's return address, then past dyn_size
                // another app address that is not real stack.
                &[0x7f00_0000_0200, 0x402010, 0x401010, 0x401020],
                24,
            ),
        ),
        (9, 0, sample_body(ID_SOFT, libc_ip, 10, 11, 300, 0, 0)),
    ];
    let (events, d) = decode_all(&records, 0);
    assert_eq!(d.malformed, 0);
    let callers: Vec<Vec<u64>> = events
        .iter()
        .filter_map(|e| match e {
            Event::Sample(s) => Some(s.callers.as_slice().to_vec()),
            _ => None,
        })
        .collect();
    assert_eq!(callers, vec![vec![], vec![0x401010], vec![]]);
}

/// A PEBS load sample sharing the tracking event's ring: its own layout (WEIGHT, DATA_SRC,
/// no registers), told apart by its id, decoded with its data address, `data_src` and period.
#[test]
fn precise_samples_decode_with_their_own_layout() {
    use crate::import::sample::{write, RawSample, SampleLayout};
    const ID_PEBS: u64 = 0x99;
    let mut d = decoder();
    d.add_precise(ID_PEBS, BackendKind::Pebs, attr::MEM_SAMPLE_TYPE);
    let layout = SampleLayout {
        sample_type: attr::MEM_SAMPLE_TYPE,
        ..Default::default()
    };
    let raw = RawSample {
        id: Some(ID_PEBS),
        ip: Some(0x40_1000),
        pid: Some(7),
        tid: Some(8),
        time: Some(1234),
        addr: Some(0x60_1040),
        cpu: Some(1),
        period: Some(1009),
        weight: Some(212),
        data_src: Some(0x6_0080_0842),
        ..Default::default()
    };
    let body = write(&raw, &layout);
    let e = d.decode(RawRecord {
        kind: 9,
        misc: 2,
        body: &body,
    });
    let Some(Event::Sample(s)) = e else {
        panic!("{e:?}")
    };
    assert_eq!(
        (s.backend, s.tid, s.ip, s.addr, s.data_src, s.weight, s.regs),
        (
            BackendKind::Pebs,
            8,
            0x40_1000,
            Some(0x60_1040),
            Some(0x6_0080_0842),
            1009,
            None
        )
    );
    // A body cut short is malformed, not a panic and not a sample.
    assert_eq!(
        d.decode(RawRecord {
            kind: 9,
            misc: 2,
            body: &body[..body.len() - 8],
        }),
        None
    );
    assert_eq!(d.malformed, 1);
}
