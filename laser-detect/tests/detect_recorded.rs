//! Recorded input: real `cpu-clock` samples with user registers of a real false-sharing
//! program (tests/fixtures/detect/README.md says how they were made), replayed through the
//! detector with the ELF code source. This is the soft backend's whole claim on real skid: the load and store of
//! both threads' loops resolve to exact addresses, and the two adjacent counters come out as
//! false sharing on one line of the global `c`.

use std::path::PathBuf;

use laser_detect::{Config, Detector, ElfCode, Kind, Location, Op};
use laser_driver::{BackendKind, Event, Mmap, Reg, Sample, UserRegs};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/detect")
        .join(name)
}

const REGS: [Reg; 17] = [
    Reg::Ax,
    Reg::Bx,
    Reg::Cx,
    Reg::Dx,
    Reg::Si,
    Reg::Di,
    Reg::Bp,
    Reg::Sp,
    Reg::Flags,
    Reg::R8,
    Reg::R9,
    Reg::R10,
    Reg::R11,
    Reg::R12,
    Reg::R13,
    Reg::R14,
    Reg::R15,
];

fn hex(s: &str) -> u64 {
    u64::from_str_radix(s, 16).unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// Parse the fixture's line format into events.
fn events(text: &str, exe: &str) -> Vec<Event> {
    let mut v = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f[0] {
            "M" => v.push(Event::Mmap(Mmap {
                pid: f[1].parse().unwrap(),
                tid: f[2].parse().unwrap(),
                time: 0,
                addr: hex(f[3]),
                len: hex(f[4]),
                pgoff: hex(f[5]),
                prot: f[6].parse().unwrap(),
                flags: 2,
                path: if f[7] == "FS" {
                    exe.to_string()
                } else {
                    f[7].to_string()
                },
                build_id: None,
            })),
            "S" => {
                let ip = hex(f[4]);
                let mut regs = UserRegs::default();
                for (r, val) in REGS.iter().zip(&f[5..]) {
                    regs.set(*r, hex(val));
                }
                regs.set(Reg::Ip, ip);
                v.push(Event::Sample(Sample {
                    backend: BackendKind::Soft,
                    pid: f[1].parse().unwrap(),
                    tid: f[2].parse().unwrap(),
                    cpu: 0,
                    time: f[3].parse().unwrap(),
                    ip,
                    addr: None,
                    data_src: None,
                    weight: 250_000,
                    regs: Some(regs),
                    watch_slot: None,
                    callers: Default::default(),
                }))
            }
            "W" => v.push(Event::Sample(Sample {
                backend: BackendKind::Watch,
                pid: f[1].parse().unwrap(),
                tid: f[2].parse().unwrap(),
                cpu: 0,
                time: f[3].parse().unwrap(),
                ip: hex(f[4]),
                addr: Some(hex(f[5])),
                data_src: None,
                weight: 1,
                regs: None,
                watch_slot: Some(0),
                callers: Default::default(),
            })),
            other => panic!("bad record kind {other}"),
        }
    }
    v
}

#[test]
fn real_soft_samples_find_the_false_sharing() {
    let exe = fixture("fs");
    let exe = exe.to_str().unwrap();
    let text = std::fs::read_to_string(fixture("fs_soft.txt")).unwrap();
    let evs = events(&text, exe);
    let mut d = Detector::new(Config::default(), ElfCode::new());
    for e in &evs {
        d.feed(e);
    }
    let a = d.finish();
    let samples = evs.iter().filter(|e| matches!(e, Event::Sample(_))).count() as u64;
    assert_eq!(a.samples, samples);

    // Most samples in the loops give an exact access (DESIGN.md measured ~65%).
    let fs = d.filter_stats();
    assert!(
        fs.accesses * 100 >= samples * 50,
        "only {} exact accesses from {samples} samples: {fs:?}",
        fs.accesses
    );

    let top = &a.findings[0];
    eprintln!(
        "{samples} samples, {} exact accesses, top line {} events ({:.0}/s sampled), notes {:?}",
        fs.accesses, top.events, top.rate_per_s, a.notes
    );
    // `c` is at ELF vaddr 0x4040 (nm fs): a at +0, b at +8, one 64-byte line.
    let c_line = 0x4040 & !63;
    assert_eq!(
        top.data,
        Location::Module {
            path: exe.to_string(),
            vaddr: c_line
        },
        "{:#?}",
        a
    );
    assert_eq!(top.kind, Kind::FalseSharing);
    assert_eq!(top.threads.len(), 2);
    let offsets = top.sources.iter().fold(0u128, |m, s| m | s.offsets);
    assert_eq!(
        offsets,
        0xffffu128 << (0x4040 - c_line),
        "a and b, 8 bytes each"
    );
    // Loads and stores of both loops (wa at 0x11e0/0x11e7, wb at 0x1208/0x1213).
    let src: Vec<(u64, Op)> = top
        .sources
        .iter()
        .filter_map(|s| match &s.code {
            Location::Module { vaddr, .. } => Some((*vaddr, s.op)),
            _ => None,
        })
        .collect();
    for want in [
        (0x11e0, Op::Load),
        (0x11e7, Op::Store),
        (0x1208, Op::Load),
        (0x1213, Op::Store),
    ] {
        assert!(src.contains(&want), "{want:x?} missing from {src:x?}");
    }
    // Nothing else in this program contends.
    assert_eq!(a.findings.len(), 1, "{:#?}", a.findings);
    assert!(a.notes.iter().any(|n| n.contains("lower bound")));
}

#[test]
fn real_watch_samples_give_exact_transfers() {
    let exe = fixture("fs");
    let exe = exe.to_str().unwrap();
    let text = std::fs::read_to_string(fixture("fs_watch.txt")).unwrap();
    let evs = events(&text, exe);
    let mut d = Detector::new(Config::default(), ElfCode::new());
    for e in &evs {
        d.feed(e);
    }
    let a = d.finish();
    assert_eq!(a.backend, BackendKind::Watch);
    // The kernel clearing .bss at exec hits the watchpoints too: kernel IPs, filtered.
    let kernel = evs
        .iter()
        .filter(|e| matches!(e, Event::Sample(s) if s.ip >= 0xffff_8000_0000_0000))
        .count() as u64;
    assert!(kernel > 0);
    assert_eq!(d.filter_stats().kernel_pc, kernel);

    assert_eq!(a.findings.len(), 1, "{:#?}", a.findings);
    let f = &a.findings[0];
    assert_eq!(f.kind, Kind::FalseSharing);
    assert_eq!(
        f.data,
        Location::Module {
            path: exe.to_string(),
            vaddr: 0x4040 & !63
        }
    );
    // The trap IP is the instruction after the access; decoding the one before it gives the
    // loops' loads and stores.
    let src: Vec<(u64, Op)> = f
        .sources
        .iter()
        .filter_map(|s| match &s.code {
            Location::Module { vaddr, .. } => Some((*vaddr, s.op)),
            _ => None,
        })
        .collect();
    for want in [
        (0x11e0, Op::Load),
        (0x11e7, Op::Store),
        (0x1208, Op::Load),
        (0x1213, Op::Store),
    ] {
        assert!(src.contains(&want), "{want:x?} missing from {src:x?}");
    }

    // Bounds on the transfers of the exact history, computed here independently of the
    // estimator. Trap IPs (after the access) in `fs`: 0x11e3/0x120f follow the loads,
    // 0x11ea/0x121a the stores (objdump -d tests/fixtures/detect/fs). A thread switch where
    // either access is a store always moves the line (lower bound); no more than two transfers
    // can happen per switch (a load, then the store upgrading the shared copy: upper bound).
    let bias = 0x5555_5555_4000u64;
    let hist: Vec<(u32, bool)> = evs
        .iter()
        .filter_map(|e| match e {
            Event::Sample(s) if s.ip < 0xffff_8000_0000_0000 => match s.ip - bias {
                0x11e3 | 0x120f => Some((s.tid, false)),
                0x11ea | 0x121a => Some((s.tid, true)),
                other => panic!("unexpected trap ip {other:#x}"),
            },
            _ => None,
        })
        .collect();
    let switches = hist.windows(2).filter(|w| w[0].0 != w[1].0).count() as u64;
    let with_store = hist
        .windows(2)
        .filter(|w| w[0].0 != w[1].0 && (w[0].1 || w[1].1))
        .count() as u64;
    let est = d.estimates();
    assert_eq!(est.len(), 1);
    let e = &est[0];
    assert!(e.inferred, "the recording kept no window boundaries");
    assert!(
        with_store <= e.transfers && e.transfers <= 2 * switches,
        "{} transfers; {with_store} switches with a store, {switches} switches",
        e.transfers
    );
    assert_eq!(f.events, e.transfers);
    assert!(f.rate_per_s > 0.0);
    eprintln!(
        "{} accesses, {switches} switches ({with_store} with a store), {} transfers, \
         {:.0}/s over {:.1} ms armed ({:.1} ms effective, clamped {})",
        e.accesses,
        e.transfers,
        e.rate_per_s,
        e.armed_s * 1e3,
        e.effective_s * 1e3,
        e.clamped
    );
}
