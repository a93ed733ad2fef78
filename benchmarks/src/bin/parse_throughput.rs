//! Parse throughput of the recording format: how many records per second one core decodes.
//! Goal: ≥ 10 M records/s (issue 2), so `laser report` on a minute of 2-thread 10 kHz
//! sampling (1.2 M samples) parses in well under a second.
//!
//! ```text
//! cargo run --release -p laser-benchmarks --bin parse_throughput [-- RECORDS [ROUNDS]]
//! ```
//!
//! Builds a realistic synthetic recording in memory (soft-backend samples with the 18
//! registers the soft backend records, two threads, an mmap or comm now and then, a rare
//! lost record), then times, side by side in one run so machine load affects all alike:
//!
//! - `touch`: summing the file's bytes 8 at a time (memory bandwidth floor),
//! - `frames`: walking the frames and checking every CRC, decoding nothing,
//! - `decode`: the full `trace::Reader` as an iterator, building every `Event`,
//! - `lend`: `Reader::next_ref`, decoding into one reused `Event` in place,
//! - `stream`: `trace::StreamReader` over the same bytes through `std::io::Read`,
//! - `write`: `trace::Writer` encoding the same events into memory (the recording side's
//!   cost per sample, which a live `laser record` pays while the target runs).
//!
//! Times are thread CPU time, the best of ROUNDS rounds (the minimum is the least disturbed by
//! other processes); the passes are interleaved within each round.
//! The decoded event count is checked against what was written, and the footer must be intact.

use std::hint::black_box;
use std::time::{Duration, Instant};

use laser_driver::trace::{EndState, Reader, StreamReader, TraceHeader, Writer};
use laser_driver::{BackendKind, Event, Mmap, Reg, Sample, UserRegs, SOFT_REGS_MASK};

/// xorshift64*: deterministic, dependency-free variety for addresses and register values.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn sample(rng: &mut Rng, i: u64) -> Event {
    let tid = 4242 + (i % 2) as u32;
    let mut regs = UserRegs::default();
    let heap = 0x5555_5555_9000 + (rng.next() % 4096) * 8;
    let stack = 0x7ffd_1234_0000 - (rng.next() % 512) * 8;
    // Pointers, small counters and flags, as a loop body's registers look.
    for (r, v) in [
        (Reg::Ax, rng.next() % 1000),
        (Reg::Bx, heap),
        (Reg::Cx, heap + 8),
        (Reg::Dx, rng.next()),
        (Reg::Si, rng.next() % 64),
        (Reg::Di, heap),
        (Reg::Bp, stack + 64),
        (Reg::Sp, stack),
        (Reg::Ip, 0x5555_5555_1000 + (rng.next() % 256)),
        (Reg::Flags, 0x246),
        (Reg::R8, rng.next() % 100_000),
        (Reg::R9, 0),
        (Reg::R10, heap + 64),
        (Reg::R11, 0x202),
        (Reg::R12, rng.next()),
        (Reg::R13, 1),
        (Reg::R14, heap + 128),
        (Reg::R15, 7),
    ] {
        regs.set(r, v);
    }
    debug_assert_eq!(regs.mask, SOFT_REGS_MASK);
    Event::Sample(Sample {
        backend: BackendKind::Soft,
        pid: 4242,
        tid,
        cpu: (i % 2) as u32,
        time: 1_000_000_000 + i * 50_000,
        ip: regs.values[Reg::Ip as usize],
        addr: None,
        data_src: None,
        weight: 250_000,
        regs: Some(regs),
        watch_slot: None,
        callers: Default::default(),
    })
}

/// The recording and the number of events in it.
fn build(n: u64) -> (Vec<u8>, u64) {
    let mut h = TraceHeader::new(BackendKind::Soft);
    h.sample_freq = 4000;
    h.cmdline = vec!["./false_sharing".into(), "2".into()];
    h.cpu_model = "synthetic".into();
    h.maps = "555555554000-555555556000 r-xp 00000000 08:01 42 /bench/false_sharing\n".repeat(40);
    let mut w = Writer::new(Vec::with_capacity(n as usize * 200), &h).expect("in-memory write");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut written = 0u64;
    let mut put = |w: &mut Writer<Vec<u8>>, e: &Event| {
        w.write(e).expect("in-memory write");
        written += 1;
    };
    for i in 0..n {
        if i % 5000 == 0 {
            put(
                &mut w,
                &Event::Mmap(Mmap {
                    pid: 4242,
                    tid: 4242,
                    time: 1_000_000_000 + i * 50_000,
                    addr: 0x7f00_0000_0000 + i * 4096,
                    len: 0x21_000,
                    pgoff: 0,
                    prot: 5,
                    flags: 2,
                    path: "/usr/lib/x86_64-linux-gnu/libm.so.6".into(),
                    build_id: Some(vec![0x5a; 20]),
                }),
            );
        }
        if i % 20_000 == 1 {
            put(
                &mut w,
                &Event::Comm {
                    pid: 4242,
                    tid: 4243,
                    time: 1_000_000_000 + i * 50_000,
                    name: "worker".into(),
                    exec: false,
                },
            );
        }
        if i % 100_000 == 2 {
            put(
                &mut w,
                &Event::Lost {
                    count: 3,
                    time: 1_000_000_000 + i * 50_000,
                },
            );
        }
        put(&mut w, &sample(&mut rng, i));
    }
    let footer = w.footer(n * 50_000);
    let bytes = w.finish(footer).expect("in-memory write");
    (bytes, written)
}

/// CPU time of this thread: what "single core" throughput means, and unlike wall time not
/// inflated when other processes take the core away mid-pass (2 shared cores here).
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID needs no setup.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Runs `f`; returns its thread CPU time (wall time if the CPU clock is unavailable).
fn timed<T>(f: impl FnOnce() -> T) -> (Duration, T) {
    let (c0, w0) = (thread_cpu(), Instant::now());
    let r = f();
    let cpu = thread_cpu().saturating_sub(c0);
    (if cpu.is_zero() { w0.elapsed() } else { cpu }, r)
}

/// Walk frames and check CRCs only: the floor the framing itself sets.
fn frames_only(bytes: &[u8], start: usize) -> u64 {
    let mut pos = start;
    let mut n = 0;
    while let Some(head) = bytes.get(pos..pos + 5) {
        let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let Some(body) = bytes.get(pos..pos + 5 + len) else {
            break;
        };
        let Some(crc) = bytes.get(pos + 5 + len..pos + 9 + len) else {
            break;
        };
        if crc32fast::hash(body).to_le_bytes() != crc {
            break;
        }
        if head[0] == 0xff {
            break;
        }
        pos += 9 + len;
        n += 1;
    }
    n
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let rounds: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);

    let (bytes, written) = build(n);
    let mb = bytes.len() as f64 / 1e6;
    println!(
        "recording: {written} records ({n} samples with 18 regs), {mb:.1} MB, {:.0} B/record",
        bytes.len() as f64 / written as f64
    );

    let start = Reader::new(&bytes).expect("header").offset() as usize;
    let header = Reader::new(&bytes).expect("header").header().clone();
    let events: Vec<Event> = Reader::new(&bytes)
        .expect("header")
        .collect::<Result<_, _>>()
        .expect("intact recording");

    // Passes run interleaved, round after round, so a burst of load from other processes
    // hits all of them alike; each keeps its fastest round.
    let mut t = [Duration::MAX; 6];
    let (mut nf, mut nd, mut nl, mut ns, mut end) = (0, 0, 0, 0, None);
    let mut written_again_matches = true;
    let mut sink = bytes.clone();
    for _ in 0..rounds {
        let (d, sum) = timed(|| {
            bytes
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
                .fold(0u64, |a, b| a.wrapping_add(b))
        });
        black_box(sum);
        t[0] = t[0].min(d);

        let (d, k) = timed(|| frames_only(black_box(&bytes), start));
        (t[1], nf) = (t[1].min(d), k);

        let (d, (k, e)) = timed(|| {
            let mut r = Reader::new(black_box(&bytes)).expect("header");
            let mut k = 0u64;
            for e in r.by_ref() {
                // Inspect in place, as a consumer matching on the event would.
                if let Ok(ev) = &e {
                    black_box(ev);
                    k += 1;
                }
            }
            (k, r.end_state().cloned())
        });
        (t[2], nd, end) = (t[2].min(d), k, e);

        let (d, k) = timed(|| {
            let mut r = Reader::new(black_box(&bytes)).expect("header");
            let mut k = 0u64;
            while let Some(e) = r.next_ref() {
                if let Ok(ev) = e {
                    black_box(ev);
                    k += 1;
                }
            }
            k
        });
        (t[3], nl) = (t[3].min(d), k);

        let (d, k) = timed(|| {
            let mut r = StreamReader::new(black_box(&bytes[..])).expect("header");
            let mut k = 0u64;
            for e in r.by_ref() {
                if let Ok(ev) = &e {
                    black_box(ev);
                    k += 1;
                }
            }
            k
        });
        (t[4], ns) = (t[4].min(d), k);

        // Into a reused buffer: a file sink does not page-fault fresh memory per record.
        sink.clear();
        let (d, ()) = timed(|| {
            let mut w = Writer::new(&mut sink, &header).expect("in memory");
            for e in &events {
                w.write(black_box(e)).expect("in memory");
            }
            let f = w.footer(n * 50_000);
            w.finish(f).expect("in memory");
        });
        t[5] = t[5].min(d);
        // Same events, same header: the same bytes.
        written_again_matches &= sink == bytes;
    }
    let [t_touch, t_frames, t_decode, t_lend, t_stream, t_write] = t;

    let ok = nf == written
        && nd == written
        && nl == written
        && ns == written
        && events.len() as u64 == written
        && written_again_matches;
    let complete =
        matches!(end, Some(EndState::Complete { footer }) if footer.stats.records == written);
    let rate = |t: Duration| written as f64 / t.as_secs_f64() / 1e6;
    let gbs = |t: Duration| mb / 1e3 / t.as_secs_f64();
    println!(
        "{:<8} {:>10} {:>12} {:>8} {:>10}",
        "pass", "cpu ms", "M records/s", "GB/s", "vs decode"
    );
    for (name, t) in [
        ("touch", t_touch),
        ("frames", t_frames),
        ("decode", t_decode),
        ("lend", t_lend),
        ("stream", t_stream),
        ("write", t_write),
    ] {
        println!(
            "{name:<8} {:>10.1} {:>12.2} {:>8.2} {:>9.2}x",
            t.as_secs_f64() * 1e3,
            rate(t),
            gbs(t),
            t.as_secs_f64() / t_decode.as_secs_f64()
        );
    }
    println!(
        "count check: written {written}, frames {nf}, decoded {nd}, lent {nl}, streamed {ns}, re-encoded identically: {written_again_matches}: {}",
        if ok { "OK" } else { "MISMATCH" }
    );
    println!(
        "footer: {}",
        if complete {
            "complete"
        } else {
            "MISSING OR WRONG"
        }
    );
    let goal = 10.0;
    for (name, t) in [("decode (iterator)", t_decode), ("lend (next_ref)", t_lend)] {
        println!(
            "{name}: {:.2} M records/s single core (goal ≥ {goal} M/s): {}",
            rate(t),
            if rate(t) >= goal { "met" } else { "NOT met" }
        );
    }
    if !ok || !complete {
        std::process::exit(1);
    }
}
