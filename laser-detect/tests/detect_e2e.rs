//! End to end on synthetic event streams: assembled code in memory, samples with registers as
//! the soft backend would take them, and watch samples with armed windows.

use iced_x86::code_asm::{qword_ptr, rax, rcx, rdx, rsi, CodeAssembler};
use laser_detect::{Config, Detector, Kind, Location, MemoryCode, Op};
use laser_driver::{BackendKind, Event, Mmap, Reg, Sample, UserRegs};

const CODE: u64 = 0x40_1000;
const HEAP: u64 = 0x60_0000;
const LINE: u64 = HEAP + 0x1000; // the falsely shared line
const RO_LINE: u64 = HEAP + 0x2000; // read-only control line
const PID: u32 = 100;

const MAPS: &str = "\
00400000-00401000 r--p 00000000 08:01 1 /app
00401000-00402000 r-xp 00001000 08:01 1 /app
00600000-00621000 rw-p 00000000 00:00 0  [heap]
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
";

/// ```text
/// counter:  mov rsi,[rcx] ; add rsi,1 ; mov [rcx],rsi ; dec rax ; jnz counter ; ret
/// reader:   mov rsi,[rcx] ; add rdx,rsi ; dec rax ; jnz reader ; ret
/// ```
/// Returns the code and the instruction addresses of each function.
fn program() -> (MemoryCode, Vec<u64>, Vec<u64>) {
    let counter = counter_at(CODE);
    let mut b = CodeAssembler::new(64).unwrap();
    let mut top = b.create_label();
    b.set_label(&mut top).unwrap();
    b.mov(rsi, qword_ptr(rcx)).unwrap();
    b.add(rdx, rsi).unwrap();
    b.dec(rax).unwrap();
    b.jnz(top).unwrap();
    b.ret().unwrap();
    let reader_at = CODE + 0x100;
    let reader = b.assemble(reader_at).unwrap();
    let c = starts(CODE, &counter);
    let r = starts(reader_at, &reader);
    let mut m = MemoryCode::new();
    m.add_function(CODE, counter);
    m.add_function(reader_at, reader);
    (m, c, r)
}

/// The counter loop (see [`program`]) assembled at `at`.
fn counter_at(at: u64) -> Vec<u8> {
    let mut a = CodeAssembler::new(64).unwrap();
    let mut top = a.create_label();
    a.set_label(&mut top).unwrap();
    a.mov(rsi, qword_ptr(rcx)).unwrap();
    a.add(rsi, 1).unwrap();
    a.mov(qword_ptr(rcx), rsi).unwrap();
    a.dec(rax).unwrap();
    a.jnz(top).unwrap();
    a.ret().unwrap();
    a.assemble(at).unwrap()
}

/// Start addresses of the instructions in `bytes` (assembled at `ip`).
fn starts(ip: u64, bytes: &[u8]) -> Vec<u64> {
    let mut d = iced_x86::Decoder::with_ip(64, bytes, ip, iced_x86::DecoderOptions::NONE);
    let mut v = Vec::new();
    while d.can_decode() {
        v.push(d.decode().ip());
    }
    v
}

fn soft(tid: u32, time: u64, ip: u64, cx: u64) -> Event {
    let mut regs = UserRegs::default();
    regs.set(Reg::Cx, cx);
    regs.set(Reg::Ax, 1000);
    regs.set(Reg::Si, 1);
    regs.set(Reg::Sp, 0x7ffd_0001_0000);
    regs.set(Reg::Ip, ip);
    Event::Sample(Sample {
        backend: BackendKind::Soft,
        pid: PID,
        tid,
        cpu: tid % 2,
        time,
        ip,
        addr: None,
        data_src: None,
        weight: 100_000,
        regs: Some(regs),
        watch_slot: None,
        callers: Default::default(),
    })
}

/// Two counter threads on offsets 0 and 8 of LINE, two reader threads on RO_LINE, sampled
/// round-robin at the instructions after the load and after the store (where skid puts them).
fn stream(c: &[u64], r: &[u64], n: u64) -> Vec<Event> {
    let mut v = Vec::new();
    let mut t = 1_000_000_000u64;
    for i in 0..n {
        let ip = if i % 2 == 0 { c[1] } else { c[3] };
        for (tid, off) in [(1, 0), (2, 8)] {
            t += 100_000;
            v.push(soft(tid, t, ip, LINE + off));
        }
        for (tid, off) in [(3, 0), (4, 16)] {
            t += 100_000;
            v.push(soft(tid, t, r[1], RO_LINE + off));
        }
    }
    v
}

#[test]
fn false_sharing_found_and_read_only_control_is_not() {
    let (code, c, r) = program();
    let mut d = Detector::new(Config::default(), code);
    d.add_maps(PID, MAPS);
    let events = stream(&c, &r, 200);
    for e in &events {
        d.feed(e);
    }
    let a = d.finish();
    assert_eq!(a.backend, BackendKind::Soft);
    assert_eq!(a.samples, events.len() as u64);
    assert_eq!(a.findings.len(), 1, "{:#?}", a.findings);
    let f = &a.findings[0];
    assert_eq!(f.line_addr, LINE);
    assert_eq!(f.kind, Kind::FalseSharing);
    assert_eq!(f.true_events, 0);
    assert!(f.events > 100, "{}", f.events);
    assert_eq!(f.threads, vec![1, 2]);
    assert_eq!(f.data, Location::Heap);
    assert!((f.share - 1.0).abs() < 1e-12);
    // Rate: events over the stream's duration.
    assert!((f.rate_per_s - f.events as f64 / a.duration_s).abs() < 1e-6);
    // Both the load (before `add`) and the store (before `dec`) contend.
    let pcs: Vec<(u64, Op)> = f.sources.iter().map(|s| (s.pc, s.op)).collect();
    assert!(pcs.contains(&(c[0], Op::Load)), "{pcs:x?}");
    assert!(pcs.contains(&(c[2], Op::Store)), "{pcs:x?}");
    let offsets = f.sources.iter().fold(0u128, |m, s| m | s.offsets);
    assert_eq!(offsets, 0xffff, "two 8-byte words: offsets 0 and 8");
    for s in &f.sources {
        assert_eq!(
            s.code,
            Location::Module {
                path: "/app".into(),
                vaddr: s.pc - 0x40_0000
            }
        );
    }
    assert!(
        a.notes.iter().any(|n| n.contains("lower bound")),
        "{:?}",
        a.notes
    );
    assert_eq!(a.modules.len(), 1);
    assert_eq!(a.modules[0].path, "/app");

    // Watch candidates: one word per thread.
    let cand = d.candidates(4);
    assert_eq!(cand.len(), 1);
    assert_eq!(cand[0].line_addr, LINE);
    assert_eq!(cand[0].words, vec![(LINE, 8), (LINE + 8, 8)]);
}

/// An anonymous 8 MiB mapping at 0x7f00_0000_0000 (a thread stack glibc made) announced by
/// thread `tid`.
fn thread_stack_mmap(tid: u32) -> Event {
    Event::Mmap(Mmap {
        pid: PID,
        tid,
        time: 1,
        addr: 0x7f00_0000_0000,
        len: 0x80_0000,
        pgoff: 0,
        prot: 3,
        flags: 0x22,
        path: String::new(),
        build_id: None,
    })
}

#[test]
fn stack_data_and_kernel_samples_are_filtered() {
    let (code, c, _) = program();
    let mut d = Detector::new(Config::default(), code);
    d.add_maps(PID, MAPS);
    // A thread stack in an anonymous mapping announced by an Mmap event: the sampled rsp
    // falls in it, so accesses there are stack data.
    d.feed(&thread_stack_mmap(5));
    let stack_var = 0x7f00_007f_f000;
    for i in 0..50u64 {
        for tid in [5, 6] {
            let Event::Sample(mut s) = soft(tid, 10 + i * 2 + tid as u64, c[1], stack_var) else {
                unreachable!()
            };
            s.regs.as_mut().unwrap().set(Reg::Sp, 0x7f00_007f_e000);
            d.feed(&Event::Sample(s));
        }
    }
    let Event::Sample(mut k) = soft(5, 500, 0xffff_ffff_8100_0000, 0) else {
        unreachable!()
    };
    k.ip = 0xffff_ffff_8100_0000;
    d.feed(&Event::Sample(k));
    let a = d.finish();
    assert!(a.findings.is_empty(), "{:#?}", a.findings);
    let fs = d.filter_stats();
    assert_eq!(fs.kernel_pc, 1);
    assert_eq!(fs.stack_data, 100);
    assert_eq!(a.filtered, 1);
}

/// A results array local to thread 1 (the main thread, its rsp in `[stack]`) that thread 2,
/// whose stack is elsewhere, updates through a pointer: thread 1 counts on word 0, thread 2 on
/// word 8 of one line of thread 1's stack. Another thread reaching it makes the line shared
/// data, thread 1's own accesses included; a line of thread 1's stack no other thread
/// reaches stays private.
#[test]
fn another_threads_stack_is_shared_data_where_a_thread_reaches_it() {
    let (code, c, _) = program();
    let mut d = Detector::new(Config::default(), code);
    d.add_maps(PID, MAPS);
    d.feed(&thread_stack_mmap(2));
    let results = 0x7ffd_0001_0400; // in [stack], below thread 1's rsp
    let private = 0x7ffd_0001_0800;
    let mut t = 1_000_000_000u64;
    for i in 0..200u64 {
        let ip = if i % 2 == 0 { c[1] } else { c[3] };
        for (tid, sp, addr) in [
            (2, 0x7f00_007f_e000, results + 8),
            (1, 0x7ffd_0001_0000, results),
            (1, 0x7ffd_0001_0000, private),
        ] {
            t += 100_000;
            let Event::Sample(mut s) = soft(tid, t, ip, addr) else {
                unreachable!()
            };
            s.regs.as_mut().unwrap().set(Reg::Sp, sp);
            d.feed(&Event::Sample(s));
        }
    }
    let a = d.finish();
    assert_eq!(a.findings.len(), 1, "{:#?}", a.findings);
    let f = &a.findings[0];
    assert_eq!(f.line_addr, results);
    assert_eq!(f.kind, Kind::FalseSharing);
    assert_eq!(f.threads, vec![1, 2]);
    assert_eq!(
        f.data,
        Location::Stack {
            owner: Some(1),
            shared: true
        }
    );
    // Thread 1's accesses to the line no one else reaches are dropped as its own.
    assert_eq!(d.filter_stats().stack_data, 200);
}

/// A detector over [`program`] with the target's maps, counting no trap time (the watch
/// tests' windows are synthetic), and the instruction addresses of the counter and reader.
fn watch_detector() -> (Detector<MemoryCode>, Vec<u64>, Vec<u64>) {
    let (code, c, r) = program();
    let cfg = Config {
        trap_cost_ns: 0,
        ..Config::default()
    };
    let mut d = Detector::new(cfg, code);
    d.add_maps(PID, MAPS);
    (d, c, r)
}

fn watch(tid: u32, time: u64, ip_after: u64, addr: u64) -> Event {
    Event::Sample(Sample {
        backend: BackendKind::Watch,
        pid: PID,
        tid,
        cpu: 0,
        time,
        ip: ip_after,
        addr: Some(addr),
        data_src: None,
        weight: 1,
        regs: None,
        watch_slot: Some(0),
        callers: Default::default(),
    })
}

/// A 10 ms watch window on LINE from time 0 in which threads 1 and 2 store alternately at
/// offsets 0 and 8 through the counter's store (`c`), 1 µs apart: 100 rounds, 199 transfers.
fn alternating_window(d: &mut Detector<MemoryCode>, c: &[u64]) {
    d.watch_window_begin(LINE, 0);
    let mut t = 0;
    for _ in 0..100 {
        for (tid, off) in [(1, 0), (2, 8)] {
            t += 1000;
            // Trap after the store at c[2]: the sampled ip is c[3].
            d.feed(&watch(tid, t, c[3], LINE + off));
        }
    }
    d.watch_window_end(LINE, 10_000_000);
}

#[test]
fn watch_windows_give_the_rate() {
    let (mut d, c, _) = watch_detector();
    // A 10 ms window in which the two threads alternate stores: 100 rounds → 199 transfers.
    alternating_window(&mut d, &c);
    let a = d.finish();
    assert_eq!(a.backend, BackendKind::Watch);
    let f = &a.findings[0];
    assert_eq!((f.events, f.kind), (199, Kind::FalseSharing));
    assert!((f.rate_per_s - 19_900.0).abs() < 1e-6, "{}", f.rate_per_s);
    assert_eq!(f.sources[0].pc, c[2]);
    assert_eq!(f.sources[0].op, Op::Store);
    assert!(a.notes.iter().any(|n| n.contains("watchpoint windows")));
}

/// A look (`Event::WatchSet::look`: a rated line's rare words, with an anchor word's stores)
/// names what accesses the line there, as a participant in what it contends with, and counts
/// no event: the line's rate and events stay its own windows'.
#[test]
fn a_look_names_a_rare_access_and_counts_nothing() {
    let (mut d, c, r) = watch_detector();
    alternating_window(&mut d, &c);
    let look = |time, words: Vec<(u64, u8)>| Event::WatchSet {
        time,
        look: ((1u16 << words.len()) - 1) as u8,
        write_only: u8::from(!words.is_empty()),
        words,
        exec: 0,
        front: 0,
    };
    d.feed(&look(20_000_000, vec![(LINE, 8), (LINE + 16, 8)]));
    let mut t = 20_000_000;
    for _ in 0..50 {
        t += 1000;
        d.feed(&watch(1, t, c[3], LINE));
        t += 1000;
        // Thread 2's reader loads the word beside: the trap comes after r[0].
        d.feed(&watch(2, t, r[1], LINE + 16));
    }
    d.feed(&look(30_000_000, vec![]));
    let a = d.finish();
    let f = &a.findings[0];
    assert_eq!((f.events, f.kind), (199, Kind::FalseSharing));
    assert!((f.rate_per_s - 19_900.0).abs() < 1e-6, "{}", f.rate_per_s);
    let load = f.sources.iter().find(|s| s.pc == r[0]);
    let load = load.unwrap_or_else(|| panic!("the look's load is not a source: {f:#?}"));
    assert_eq!((load.op, load.events), (Op::Load, 0));
    assert!(
        a.notes
            .iter()
            .any(|n| n.starts_with("looks: 1 window(s) on 1")),
        "{:?}",
        a.notes
    );
}

#[test]
fn the_recorded_hit_cost_corrects_the_armed_time() {
    // The same 10 ms window as above, but the driver measured 20 µs per hit: the busiest
    // thread trapped 100 times, so the threads really ran 8 ms unslowed, not 10.
    let (mut d, c, _) = watch_detector();
    d.feed(&Event::WatchCost {
        time: 0,
        hit_ns: 20_000,
    });
    alternating_window(&mut d, &c);
    let f = &d.finish().findings[0];
    assert_eq!(f.events, 199);
    assert!(
        (f.rate_per_s - 199.0 / 0.008).abs() < 1e-3,
        "{}",
        f.rate_per_s
    );
}

#[test]
fn watch_windows_that_saw_one_thread_each_keep_the_sampled_count() {
    // Soft samples found false sharing on LINE; then two windows, each filled by one
    // thread's burst (its trap budget spent before the other came by): they saw no transfer
    // because they could not, and the line must not vanish from the report.
    let (mut d, c, r) = watch_detector();
    for e in stream(&c, &r, 100) {
        d.feed(&e);
    }
    let sampled = d
        .finish()
        .findings
        .iter()
        .find(|f| f.line_addr == LINE)
        .map(|f| f.events)
        .expect("soft samples find the line");
    let mut t = 3_000_000_000u64;
    for (tid, off) in [(1, 0), (2, 8)] {
        d.watch_window_begin(LINE, t);
        for _ in 0..50 {
            t += 1_000;
            d.feed(&watch(tid, t, c[3], LINE + off));
        }
        t += 1_000;
        d.watch_window_end(LINE, t);
    }
    let a = d.finish();
    let f = a.findings.iter().find(|f| f.line_addr == LINE).unwrap();
    // The watched accesses also pass through the line model (one event where the second
    // window's thread follows the first's), so the sampled count is a floor.
    assert!(
        f.events >= sampled && f.events < sampled + 5,
        "the sampled count stands: {} vs {sampled}",
        f.events
    );
    assert!(
        a.notes
            .iter()
            .any(|n| n.contains("one thread per watch window")),
        "{:?}",
        a.notes
    );
}

#[test]
fn line_128_merges_adjacent_lines() {
    let (code, c, _) = program();
    let mut d = Detector::new(
        Config {
            line_size: 128,
            ..Config::default()
        },
        code,
    );
    d.add_maps(PID, MAPS);
    let mut t = 0;
    for _ in 0..20 {
        for (tid, off) in [(1, 0), (2, 64)] {
            t += 1000;
            d.feed(&soft(tid, t, c[3], LINE + off));
        }
    }
    let a = d.finish();
    assert_eq!(a.line_size, 128);
    assert_eq!(a.findings.len(), 1);
    assert_eq!(a.findings[0].kind, Kind::FalseSharing);
    // With 64-byte lines the same stream has no contention at all.
    let (code, _, _) = program();
    let mut d64 = Detector::new(Config::default(), code);
    d64.add_maps(PID, MAPS);
    let mut t = 0;
    for _ in 0..20 {
        for (tid, off) in [(1, 0), (2, 64)] {
            t += 1000;
            d64.feed(&soft(tid, t, c[3], LINE + off));
        }
    }
    assert!(d64.finish().findings.is_empty());
}

/// A forked copy's private memory is other memory at the same addresses: a parent thread and
/// a child thread each writing its own copy of one line share nothing, while two threads of
/// the child writing its copy falsely share it (reported as the child's line). In a
/// `MAP_SHARED` mapping the parent and the child do share the line.
#[test]
fn forked_copies_share_a_line_only_in_shared_memory() {
    let child = PID + 1;
    let run = |shared: bool| {
        let (code, c, _) = program();
        let mut d = Detector::new(Config::default(), code);
        d.add_maps(PID, MAPS);
        if shared {
            d.feed(&Event::Mmap(Mmap {
                pid: PID,
                tid: PID,
                time: 1,
                addr: LINE & !0xfff,
                len: 0x1000,
                pgoff: 0,
                prot: 3,
                flags: libc::MAP_SHARED as u32 | libc::MAP_ANONYMOUS as u32,
                path: "/dev/zero (deleted)".into(),
                build_id: None,
            }));
        }
        d.feed(&Event::Fork {
            pid: child,
            ppid: PID,
            tid: child,
            ptid: PID,
            time: 2,
        });
        let mut t = 1_000_000_000u64;
        // Parent thread 1 on offset 0; child threads 11 and 12 on offsets 8 and 16.
        for i in 0..200u64 {
            let ip = if i % 2 == 0 { c[1] } else { c[3] };
            for (pid, tid, off) in [(PID, 1, 0), (child, 11, 8), (child, 12, 16)] {
                t += 100_000;
                let Event::Sample(mut s) = soft(tid, t, ip, LINE + off) else {
                    unreachable!()
                };
                s.pid = pid;
                d.feed(&Event::Sample(s));
            }
        }
        d.finish()
    };
    let private = run(false);
    assert_eq!(private.findings.len(), 1, "{:#?}", private.findings);
    let f = &private.findings[0];
    assert_eq!(f.threads, vec![11, 12], "the child's own pair only");
    assert_eq!(f.process, Some(child));
    assert_eq!(f.kind, Kind::FalseSharing);
    assert_eq!(laser_detect::decode::maps::split_copy(f.line_addr).1, LINE);
    // Named in the child's space, which is the parent's copy.
    assert_eq!(f.data, Location::Heap);
    let shared = run(true);
    assert_eq!(shared.findings.len(), 1, "{:#?}", shared.findings);
    let f = &shared.findings[0];
    assert_eq!(f.threads, vec![1, 11, 12], "one line for all three");
    assert_eq!((f.line_addr, f.process), (LINE, None));
}

#[test]
fn fork_copies_the_address_space_and_exec_resets_it() {
    let (code, c, _) = program();
    let mut d = Detector::new(Config::default(), code);
    d.add_maps(PID, MAPS);
    let child = PID + 1;
    d.feed(&Event::Fork {
        pid: child,
        ppid: PID,
        tid: child,
        ptid: PID,
        time: 1,
    });
    let in_stack = 0x7ffd_0000_0100; // inside the parent's [stack] mapping
    let sample = |pid: u32, time: u64| {
        let Event::Sample(mut s) = soft(child, time, c[1], in_stack) else {
            unreachable!()
        };
        s.pid = pid;
        Event::Sample(s)
    };
    d.feed(&sample(child, 10));
    assert_eq!(
        d.filter_stats().stack_data,
        1,
        "the child knows the parent's stack"
    );
    d.feed(&Event::Comm {
        pid: child,
        tid: child,
        time: 20,
        name: "new".into(),
        exec: true,
    });
    d.feed(&sample(child, 30));
    let fs = d.filter_stats();
    // After exec the old mappings are gone: the same address is no longer known as stack
    // (the new image's stack is recognised only around the sampled rsp).
    assert_eq!(fs.stack_data, 1);
    assert_eq!(fs.accesses, 1, "{fs:?}");
}

#[test]
fn soft_run_with_watch_windows_rates_watched_lines_from_the_windows() {
    let (mut d, c, r) = watch_detector();
    // Soft samples: false sharing on LINE; a second falsely shared line, never watched.
    let other = HEAP + 0x3000;
    for e in stream(&c, &r, 100) {
        d.feed(&e);
    }
    let mut t = 2_000_000_000u64;
    for _ in 0..50 {
        for (tid, off) in [(5, 0), (6, 8)] {
            t += 100_000;
            d.feed(&soft(tid, t, c[3], other + off));
        }
    }
    // Then a 1 ms watch window on LINE's candidate words: 20 alternating stores.
    let cand = d.candidates(1);
    assert_eq!(cand[0].line_addr, LINE);
    let t0 = t + 1_000_000;
    d.watch_window_begin(LINE, t0);
    for i in 0..10u64 {
        d.feed(&watch(1, t0 + 10 + 4 * i, c[3], cand[0].words[0].0));
        d.feed(&watch(2, t0 + 12 + 4 * i, c[3], cand[0].words[1].0));
    }
    d.watch_window_end(LINE, t0 + 1_000_000);
    let a = d.finish();
    assert_eq!(a.backend, BackendKind::Soft);
    let watched = a.findings.iter().find(|f| f.line_addr == LINE).unwrap();
    assert_eq!(watched.events, 19, "exact transfers in the window");
    assert!((watched.rate_per_s - 19_000.0).abs() < 1e-6);
    let unwatched = a.findings.iter().find(|f| f.line_addr == other).unwrap();
    assert!((unwatched.rate_per_s - unwatched.events as f64 / a.duration_s).abs() < 1e-6);
    assert!(a.notes.iter().any(|n| n.contains("lower bound")));
    assert!(a.notes.iter().any(|n| n.contains("watchpoint windows")));
    // Ranked by rate: the honestly rated line first.
    assert_eq!(a.findings[0].line_addr, LINE);
}

#[test]
fn precise_samples_are_weighted_by_their_period() {
    // PEBS-style samples: precise IP, data address and data_src given, weight = period.
    let (code, c, _) = program();
    let mut d = Detector::new(Config::default(), code);
    d.add_maps(PID, MAPS);
    let mut t = 0;
    for i in 0..100u64 {
        for (tid, off) in [(1, 0), (2, 8)] {
            t += 1_000_000;
            let (ip, src) = if i % 2 == 0 { (c[0], 0x2) } else { (c[2], 0x4) };
            d.feed(&Event::Sample(Sample {
                backend: BackendKind::Pebs,
                pid: PID,
                tid,
                cpu: tid,
                time: t,
                ip,
                addr: Some(LINE + off),
                data_src: Some(src),
                weight: 1000,
                regs: None,
                watch_slot: None,
                callers: Default::default(),
            }));
        }
    }
    let a = d.finish();
    assert_eq!(a.backend, BackendKind::Pebs);
    let f = &a.findings[0];
    assert_eq!(f.kind, Kind::FalseSharing);
    // Every sample after the first meets the other thread's previous access; the pairs where
    // both are loads (even rounds) are not contention: 100 rounds × 2 samples − 1 − 50.
    assert_eq!(f.events, 149 * 1000);
    assert!(!a.notes.iter().any(|n| n.contains("lower bound")));
    let ops: Vec<Op> = f.sources.iter().map(|s| s.op).collect();
    assert!(ops.contains(&Op::Load) && ops.contains(&Op::Store));
}

/// Contention sampled inside a shared library (a lock routine's loop) is shown with the
/// program's call sites: the first stack candidate in another module that follows a call.
/// Candidates in the library itself, or after no call, are passed over; samples in the
/// program's own code get no call sites.
#[test]
fn library_samples_name_the_programs_call_sites() {
    const LIB: u64 = 0x7f00_0000_1000;
    let maps = format!(
        "{MAPS}7f0000000000-7f0000001000 r--p 00000000 08:01 2 /lib/libc.so.6\n\
         7f0000001000-7f0000002000 r-xp 00001000 08:01 2 /lib/libc.so.6\n"
    );
    // The library: the counter loop. The program: `call rel32` (to a PLT-like stub) at
    // 0x401800 and at 0x401900, and a `nop` at 0x401a00 (a code pointer that is no return
    // address).
    let lib = counter_at(LIB);
    let lib_pcs = starts(LIB, &lib);
    let (mut code, c, _) = program();
    code.add_function(LIB, lib);
    for at in [0x40_1800u64, 0x40_1900] {
        let mut b = CodeAssembler::new(64).unwrap();
        b.call(CODE).unwrap();
        b.nop().unwrap();
        code.add(at, b.assemble(at).unwrap());
    }
    code.add(0x40_19f8, vec![0x90; 16]);
    let (from_a, from_b, not_ret) = (0x40_1805u64, 0x40_1905u64, 0x40_1a00u64);

    let mut d = Detector::new(Config::default(), code);
    d.add_maps(PID, &maps);
    let mut t = 1_000_000_000u64;
    for i in 0..200u64 {
        let ip = if i % 2 == 0 { lib_pcs[1] } else { lib_pcs[3] };
        for (tid, off, stack) in [
            (1, 0, vec![LIB + 0x40, from_a]),
            (2, 8, vec![not_ret, LIB + 0x44, from_b]),
        ] {
            t += 100_000;
            let mut e = soft(tid, t, ip, LINE + off);
            if let Event::Sample(s) = &mut e {
                s.callers = stack.iter().collect();
            }
            d.feed(&e);
        }
        // The program's own counter, with a candidate into the library: no call site.
        for (tid, off) in [(3, 32), (4, 40)] {
            t += 100_000;
            let mut e = soft(tid, t, c[if i % 2 == 0 { 1 } else { 3 }], LINE + 0x40 + off);
            if let Event::Sample(s) = &mut e {
                s.callers = [LIB + 0x20].iter().collect();
            }
            d.feed(&e);
        }
    }
    let a = d.finish();
    assert_eq!(a.findings.len(), 2, "{:#?}", a.findings);
    let lib_line = a.findings.iter().find(|f| f.line_addr == LINE).unwrap();
    for s in &lib_line.sources {
        assert!(
            matches!(&s.code, Location::Module { path, .. } if path == "/lib/libc.so.6"),
            "{s:?}"
        );
        let sites: Vec<(u64, u64)> = s.called_from.iter().map(|c| (c.ret, c.samples)).collect();
        assert_eq!(sites.len(), 2, "{sites:x?}");
        assert!(sites
            .iter()
            .all(|&(r, n)| (r == from_a || r == from_b) && n > 0));
        let share: f64 = s.called_from.iter().map(|c| c.share).sum();
        assert!((share - 1.0).abs() < 1e-9);
        assert!(matches!(
            &s.called_from[0].code,
            // ELF vaddr: the run-time address less /app's load bias (0x400000).
            Location::Module { path, vaddr }
                if path == "/app" && [from_a, from_b].contains(&(vaddr + 0x40_0000))
        ));
    }
    let app_line = a
        .findings
        .iter()
        .find(|f| f.line_addr == LINE + 0x40)
        .unwrap();
    assert!(app_line.sources.iter().all(|s| s.called_from.is_empty()));
}

#[test]
fn a_contended_line_stays_in_the_survey_until_a_window_watches_it() {
    // Samples show the counters' line contended: the candidates' to watch. Until a window
    // has watched it, the survey keeps its turns (a candidate ranked behind busier lines
    // would otherwise be watched by neither); after, the survey leaves it to them.
    let (code, c, r) = program();
    let mut d = Detector::new(Config::default(), code);
    d.add_maps(PID, MAPS);
    for e in &stream(&c, &r, 200) {
        d.feed(e);
    }
    let surveyed =
        |d: &Detector<MemoryCode>| d.survey_plan(&[]).iter().any(|t| t.watch.line_addr == LINE);
    assert!(surveyed(&d));
    d.watch_window_begin(LINE, 2_000_000_000);
    d.watch_window_end(LINE, 2_010_000_000);
    assert!(!surveyed(&d));
}

#[test]
fn a_window_that_fell_in_a_short_phase_of_another_kind_does_not_decide_the_kind() {
    // The samples of the whole run: two threads storing to their own words of LINE (false
    // sharing), as streamcluster's work_mem is while pgain runs.
    let (mut d, c, r) = watch_detector();
    for e in stream(&c, &r, 100) {
        d.feed(&e);
    }
    // One window, in the short phase where both threads write the same word (its reduction).
    let t0 = 3_000_000_000u64;
    d.watch_window_begin(LINE, t0);
    for i in 0..10u64 {
        d.feed(&watch(1, t0 + 10 + 4 * i, c[3], LINE));
        d.feed(&watch(2, t0 + 12 + 4 * i, c[3], LINE));
    }
    d.watch_window_end(LINE, t0 + 1_000_000);
    let a = d.finish();
    let f = a.findings.iter().find(|f| f.line_addr == LINE).unwrap();
    assert_eq!(f.events, 19, "the rate is still the window's");
    assert!(
        f.true_events >= 19,
        "the window's true transfers are counted: {f:?}"
    );
    assert!(f.false_events > 4 * f.true_events, "{f:?}");
    assert_eq!(
        f.kind,
        Kind::FalseSharing,
        "the run's phases decide, not the window's"
    );
}

/// The counter's store after soft samples found LINE contended (thread 1 counting at offset
/// 0, thread 2 reading offset 8 through another instruction: no instruction stores for two
/// threads, see `neighbouring_stores_of_two_threads_get_a_code_window`), then `windows` on
/// LINE: each `(length ns, threads that trap in it)`. Returns the instructions offered a code
/// window (at a threshold no sampled rate reaches, so none is "hot").
/// `shared_code`: both threads run the store (SPMD code, as streamcluster's); otherwise it is
/// thread 1's alone, and thread 2 only loads there.
fn code_candidates_after(windows: &[(u64, &[u32])], shared_code: bool) -> (Vec<u64>, u64) {
    let (mut d, c, r) = watch_detector();
    let mut t = 1_000_000_000u64;
    for i in 0..100 {
        let ip2 = if shared_code && i % 2 == 0 {
            c[3]
        } else {
            r[1]
        };
        for (tid, ip, off) in [(1, c[3], 0), (2, ip2, 8)] {
            t += 100_000;
            d.feed(&soft(tid, t, ip, LINE + off));
        }
    }
    let mut t = 3_000_000_000u64;
    for &(len, tids) in windows {
        d.watch_window_begin(LINE, t);
        for (i, &tid) in tids.iter().enumerate() {
            for k in 0..40u64 {
                let ip = if tid == 2 && !shared_code { r[1] } else { c[3] };
                d.feed(&watch(
                    tid,
                    t + 1_000 + 100 * (40 * i as u64 + k),
                    ip,
                    LINE + 8 * u64::from(tid - 1),
                ));
            }
        }
        t += len;
        d.watch_window_end(LINE, t);
        t += 100_000_000;
    }
    (d.code_candidates(1e12, 4), c[2])
}

/// Contention that comes and goes at an address (a heap block freed and allocated again
/// elsewhere, PARSEC streamcluster's `work_mem`) is followed by its code: a line whose data
/// window counted long and saw nothing, or whose windows (two or more) were each filled by
/// one thread, gives its instructions a code window; a line whose window saw the pair, a
/// single window of one thread, or a short empty window, does not. Windows that each saw one
/// thread lead to the code only when two threads run it: a code window on one thread's own
/// instruction cannot see a transfer either.
#[test]
fn a_line_the_data_windows_find_quiet_or_taken_in_turns_is_followed_by_its_code() {
    let none: &[u32] = &[];
    for (windows, expect, shared_only, why) in [
        (vec![], false, false, "no window yet"),
        (
            vec![(20_000_000, none)],
            true,
            false,
            "every window found it untouched",
        ),
        (
            vec![(2_000_000, &[1, 2][..]), (20_000_000, none)],
            true,
            false,
            "a long window found it untouched",
        ),
        (
            vec![(2_000_000, &[1, 2][..]), (5_000_000, none)],
            false,
            false,
            "an empty window too short to say",
        ),
        (
            vec![(2_000_000, &[1][..]), (2_000_000, &[2][..])],
            true,
            true,
            "each window one thread, different ones",
        ),
        (
            vec![(2_000_000, &[1][..]), (2_000_000, &[1][..])],
            true,
            true,
            "each window one thread, the same one (the other's words unwatched)",
        ),
        (
            vec![(2_000_000, &[1][..])],
            false,
            false,
            "one window of one thread: the next may see the pair",
        ),
        (
            vec![(2_000_000, &[1, 2][..])],
            false,
            false,
            "a window saw the pair",
        ),
    ] {
        for shared_code in [true, false] {
            let (pcs, store) = code_candidates_after(&windows, shared_code);
            assert_eq!(
                pcs.contains(&store),
                expect && (shared_code || !shared_only),
                "{why}, both threads run the store: {shared_code}: {pcs:#x?}"
            );
        }
    }
}

/// Two threads storing through one instruction into neighbouring memory, never on the same
/// line (each its own part of a block): the line model sees no contention, yet the store gets
/// a code window (`model::neighbours`), which sees where the parts meet. Parts two pages
/// apart (two threads' own buffers) do not.
#[test]
fn neighbouring_stores_of_two_threads_get_a_code_window() {
    for (gap, expect) in [(256u64, true), (8192, false)] {
        let (mut d, c, _) = watch_detector();
        let mut t = 1_000_000_000u64;
        for i in 0..20u64 {
            for (tid, base) in [(1, HEAP), (2, HEAP + gap)] {
                t += 100_000;
                d.feed(&soft(tid, t, c[3], base + 64 * (i % 2)));
            }
        }
        let a = d.finish();
        assert!(
            a.findings.is_empty(),
            "no line two threads share: {:#?}",
            a.findings
        );
        assert_eq!(
            d.neighbour_candidates(1000.0, 4).contains(&c[2]),
            expect,
            "gap {gap}"
        );
        assert!(d.code_candidates(1000.0, 4).is_empty());
    }
}
