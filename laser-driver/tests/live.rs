//! Live tests: really sample a child on this machine (soft backend: cpu-clock, works without
//! a PMU) and really hit hardware watchpoints. The target is `fixtures/two_threads.c`,
//! compiled with gcc at test time.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One live test at a time. Each runs a target that keeps both CPUs busy and measures what
/// the kernel does in its windows and samples; run side by side on 2 CPUs they measured each
/// other. Beside the other live tests, the share of hits in window margins reached 11% (at
/// most 6% alone) and the share of libc samples with the worker as first caller fell to 0.88
/// (the bar is 0.9), each about once in 20 runs. tests/cli.rs serializes the same way.
fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

use laser_driver::{
    BackendKind, Config, DriverError, Event, ExitStatus, Reg, Sample, Session, Status, WatchKind,
    WatchSpec, SOFT_REGS_MASK,
};

struct Target {
    path: PathBuf,
    shared_word: u64,
    store_insn_end: u64,
    /// The fixture's `worker` function: [start, next symbol).
    worker: (u64, u64),
}

/// Compiles the fixture once per test binary into a private temp directory.
fn target() -> &'static Target {
    static T: OnceLock<Target> = OnceLock::new();
    T.get_or_init(|| {
        // One directory per test process (concurrent runs must not overwrite a binary another
        // is executing); directories of test processes that are gone are removed.
        if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(pid) = name.strip_prefix("laser-driver-live-") {
                    if !Path::new(&format!("/proc/{pid}")).exists() {
                        let _ = std::fs::remove_dir_all(e.path());
                    }
                }
            }
        }
        let dir = std::env::temp_dir().join(format!("laser-driver-live-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("two_threads");
        build_fixture(
            "two_threads.c",
            &path,
            &["-O1", "-g", "-no-pie", "-pthread"],
        );
        let nm = Command::new("nm").arg(&path).output().expect("nm runs");
        let syms: BTreeMap<String, u64> = String::from_utf8_lossy(&nm.stdout)
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let a = u64::from_str_radix(f.next()?, 16).ok()?;
                let _kind = f.next()?;
                Some((f.next()?.to_string(), a))
            })
            .collect();
        let start = syms["worker"];
        // The next symbol other than the label inside worker.
        let end = syms
            .iter()
            .filter(|&(n, &a)| a > start && n != "store_insn_end")
            .map(|(_, &a)| a)
            .min()
            .unwrap();
        Target {
            shared_word: syms["shared_word"],
            store_insn_end: syms["store_insn_end"],
            worker: (start, end),
            path,
        }
    })
}

/// The trap guard (`shim/laser_trap_guard.c`, as the root package's build script builds it),
/// built once per test binary next to the fixture. These tests' windows trap as laser's do,
/// and on a KVM guest a hit whose cause the hypervisor lost reaches the fixture as a SIGTRAP
/// that kills it (one did: `a_thread_created_while_a_window_counts_is_watched_in_it` ended
/// with signal 5 in a full `cargo test` run).
fn guard_exe() -> &'static Path {
    static G: OnceLock<PathBuf> = OnceLock::new();
    G.get_or_init(|| {
        let out = target().path.with_file_name("laser_trap_guard");
        let shim = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shim");
        let src = shim.join("laser_trap_guard.c");
        let flags = std::fs::read_to_string(shim.join("laser_trap_guard.cflags"))
            .expect("the guard's flags");
        let st = Command::new("gcc")
            .args(flags.split_whitespace())
            .arg("-o")
            .arg(&out)
            .arg(&src)
            .status()
            .expect("gcc runs");
        assert!(st.success(), "gcc failed to build {}", src.display());
        out
    })
}

/// `cfg` with the trap guard, as laser runs its windows.
fn guarded(cfg: &Config) -> Config {
    Config {
        trap_guard: Some(guard_exe().to_path_buf()),
        ..cfg.clone()
    }
}

/// Launches under `cfg` with the trap guard and waits until it holds every thread (windows
/// arm only then).
fn launch_guarded(argv: &[OsString], cfg: &Config) -> Session {
    let mut s = Session::launch(argv, &guarded(cfg)).unwrap();
    s.wait_guard(Duration::from_secs(5));
    s
}

/// Attaches under `cfg` with the trap guard, as [`launch_guarded`].
fn attach_guarded(pid: i32, cfg: &Config) -> Session {
    let mut s = Session::attach(pid, &guarded(cfg)).unwrap();
    s.wait_guard(Duration::from_secs(5));
    s
}

/// Compiles `tests/fixtures/<name>` with gcc and `flags` into `out`.
fn build_fixture(name: &str, out: &Path, flags: &[&str]) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let st = Command::new("gcc")
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(&src)
        .status()
        .expect("gcc runs");
    assert!(st.success(), "gcc {flags:?} {name} failed");
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into a live local.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A watchpoint on the stores to the fixture's shared word.
fn shared_word_writes(t: &Target) -> WatchSpec {
    WatchSpec {
        addr: t.shared_word,
        len: 8,
        kind: WatchKind::Write,
    }
}

/// A word of the fixture next to its shared word that no thread touches.
fn quiet_word(t: &Target) -> WatchSpec {
    WatchSpec {
        addr: t.shared_word + 8,
        len: 8,
        kind: WatchKind::ReadWrite,
    }
}

/// The fixture launched for watching alone, with a generous budget: the tests using it are
/// about every thread being armed, not the duty cycle (which has its own tests); a loaded
/// machine must not starve one thread.
fn launch_watched(t: &Target, args: &[&str]) -> Session {
    let cfg = Config {
        backend: BackendKind::Watch,
        duty_cycle: generous_duty(Duration::from_millis(50)),
        ..Config::default()
    };
    launch_guarded(&argv(t, args), &cfg)
}

fn argv(t: &Target, args: &[&str]) -> Vec<OsString> {
    std::iter::once(t.path.clone().into_os_string())
        .chain(args.iter().map(OsString::from))
        .collect()
}

/// Polls until exit (or a generous deadline), collecting every event.
fn run_to_exit(s: &mut Session) -> (Vec<Event>, ExitStatus) {
    let mut events = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = s
            .poll(Duration::from_millis(50), &mut |e| events.push(e))
            .unwrap();
        if let Status::Exited(x) = st {
            return (events, x);
        }
        assert!(Instant::now() < deadline, "target did not exit");
    }
}

fn samples(events: &[Event]) -> impl Iterator<Item = &Sample> {
    events.iter().filter_map(|e| match e {
        Event::Sample(s) => Some(s),
        _ => None,
    })
}

/// Executable mappings of `path` from Mmap events.
fn text_ranges(events: &[Event], path: &Path) -> Vec<(u64, u64)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Mmap(m)
                if Path::new(&m.path) == path && m.prot & libc::PROT_EXEC as u32 != 0 =>
            {
                Some((m.addr, m.addr + m.len))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn launch_samples_both_threads_with_registers_inside_program_text() {
    let _serial = exclusive();
    let t = target();
    let cfg = Config {
        frequency: 2000,
        ..Config::default()
    };
    let t0 = monotonic_ns();
    let mut s = Session::launch(&argv(t, &["0.6", "3"]), &cfg).unwrap();
    let pid = s.pid() as u32;
    let (events, status) = run_to_exit(&mut s);
    let t1 = monotonic_ns();
    assert_eq!(status, ExitStatus::Code(3));
    // Timestamps are CLOCK_MONOTONIC, so they fall inside our own clock's window.
    for e in &events {
        assert!((t0..=t1).contains(&e.time()), "{e:?} outside [{t0}, {t1}]");
    }

    let text = text_ranges(&events, &t.path);
    assert!(!text.is_empty(), "no exec Mmap for the program");

    let worker_samples: Vec<&Sample> = samples(&events)
        .filter(|x| x.pid == pid && x.tid != pid)
        .collect();
    let tids: BTreeSet<u32> = worker_samples.iter().map(|x| x.tid).collect();
    eprintln!(
        "launch: {} events, {} worker samples from {tids:?}, stats {:?}",
        events.len(),
        worker_samples.len(),
        s.stats()
    );
    assert_eq!(tids.len(), 2, "samples from both worker threads: {tids:?}");
    for x in &worker_samples {
        assert_eq!(x.backend, BackendKind::Soft);
        let regs = x.regs.expect("user registers on every soft sample");
        assert_eq!(regs.mask, SOFT_REGS_MASK);
        assert_eq!(regs.get(Reg::Ip), Some(x.ip));
        assert!(x.weight > 0);
    }
    let in_text = worker_samples
        .iter()
        .filter(|x| text.iter().any(|&(a, b)| (a..b).contains(&x.ip)))
        .count();
    // The workers spend nearly all their time in the counting loop of the program itself.
    assert!(
        in_text * 2 > worker_samples.len(),
        "{in_text} of {} worker samples inside the program's text {text:x?}",
        worker_samples.len()
    );

    let exec_comm = events.iter().any(
        |e| matches!(e, Event::Comm { pid: p, exec: true, name, .. } if *p == pid && name == "two_threads"),
    );
    assert!(exec_comm, "Comm(exec) for the program");
    for tid in &tids {
        assert!(
            events
                .iter()
                .any(|e| matches!(e, Event::Fork { tid: x, pid: p, .. } if x == tid && *p == pid)),
            "Fork for worker {tid}"
        );
        assert!(
            events
                .iter()
                .any(|e| matches!(e, Event::Exit { tid: x, .. } if x == tid)),
            "Exit for worker {tid}"
        );
    }
    let st = s.stats();
    assert_eq!(st.samples as usize, samples(&events).count());
    assert_eq!(st.records as usize, events.len());
    assert_eq!(s.malformed_records(), 0);

    let h = s.header_info();
    assert_eq!(h.backend, BackendKind::Soft);
    assert_eq!(h.pid, pid);
    assert!(h.attrs[0].description.contains("cpu-clock, freq 2000 Hz"));
    assert!(h.attrs[0].bytes.len() >= 128);
}

/// A launched soft session asked to (`Config::sample_cpus`) samples whole CPUs where the
/// machine allows it (root here, as in CI): a busy process beside the target is sampled too,
/// and its samples are dropped as they are read; every sample delivered is the target's, and
/// the target is sampled as often as its own timers would (about 500 Hz of its CPU time, as
/// asked). The leaders are CPU-wide too: the processes the hog starts (mappings, names,
/// forks, exits) are not the target's business either.
#[test]
fn whole_cpu_sampling_keeps_the_targets_samples_only() {
    let _serial = exclusive();
    let t = target();
    let mut hog = std::process::Command::new("sh")
        .args(["-c", "while :; do /bin/true; done"])
        .spawn()
        .unwrap();
    let cfg = Config {
        watch: false,
        sample_cpus: true,
        frequency: 500,
        ..Config::default()
    };
    let mut s = Session::launch(&argv(t, &["0.6", "0"]), &cfg).unwrap();
    let pid = s.pid() as u32;
    let whole = s.samples_whole_cpus();
    let (events, status) = run_to_exit(&mut s);
    hog.kill().unwrap();
    hog.wait().unwrap();
    assert_eq!(status, ExitStatus::Code(0));
    let n = samples(&events).count() as u64;
    let foreign = s.stats().foreign;
    eprintln!("whole CPUs {whole}: {n} samples of the target, {foreign} of others dropped");
    assert!(
        samples(&events).all(|x| x.pid == pid),
        "a sample of another process"
    );
    for e in &events {
        let of = match e {
            Event::Mmap(m) => m.pid,
            Event::Comm { pid, .. } | Event::Fork { pid, .. } | Event::Exit { pid, .. } => *pid,
            _ => pid,
        };
        assert_eq!(of, pid, "another process's record: {e:?}");
    }
    assert!(
        text_ranges(&events, &t.path).len() == 1,
        "the program's text mapping, recorded from its exec"
    );
    // Two workers for 0.6 s beside a hog on 2 CPUs: ≥ 0.6 s of CPU at 500 Hz, whatever
    // the sharing.
    assert!(n >= 150, "{n} samples");
    if whole {
        assert!(
            foreign > 0,
            "the hog was never sampled: not CPU-wide after all"
        );
    } else {
        // Only where CPU-wide events are refused (perf_event_paranoid > 0 without
        // CAP_PERFMON): the leaders sample per task and nothing is dropped.
        assert_eq!(foreign, 0);
        eprintln!("note: CPU-wide events refused here; per-task sampling checked instead");
    }
}

/// Whole-CPU leaders follow the target into the processes it forks: a shell that runs the
/// program as its child (not by exec) hands over the child's exec, mappings and samples.
#[test]
fn whole_cpu_leaders_follow_the_processes_the_target_forks() {
    let _serial = exclusive();
    let t = target();
    let cfg = Config {
        watch: false,
        sample_cpus: true,
        frequency: 500,
        ..Config::default()
    };
    // `; exit 3` keeps sh from exec'ing the program in its own process.
    let script = format!("{} 0.3 0; exit 3", t.path.display());
    let argv: Vec<OsString> = ["sh", "-c", &script].iter().map(OsString::from).collect();
    let mut s = Session::launch(&argv, &cfg).unwrap();
    let sh = s.pid() as u32;
    let (events, status) = run_to_exit(&mut s);
    assert_eq!(status, ExitStatus::Code(3));
    let child = events.iter().find_map(|e| match e {
        Event::Comm {
            pid,
            exec: true,
            name,
            ..
        } if name == "two_threads" => Some(*pid),
        _ => None,
    });
    let child = child.expect("the child's exec");
    assert_ne!(child, sh, "run as a child, not exec'd");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::Fork { pid, ppid, .. } if *pid == child && *ppid == sh)),
        "the shell's fork of the child"
    );
    // One range, which may come twice: a child that exec'd between the program's release
    // and the leaders' first count is read from /proc, and its exec's own record can follow
    // (`Session::note_premapped`: "a mapping made in between is in both"). CI saw 2 records
    // twice (not kept; 0 in 110 runs here): the message shows them if they differ.
    let mut text = text_ranges(&events, &t.path);
    text.sort_unstable();
    text.dedup();
    let records: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Mmap(m) if Path::new(&m.path) == t.path => {
                Some((m.pid, m.addr, m.len, m.prot, m.time))
            }
            _ => None,
        })
        .collect();
    assert_eq!(text.len(), 1, "the child's text: {records:x?}");
    let n = samples(&events).filter(|x| x.pid == child).count();
    // Two workers for 0.3 s at 500 Hz: ~300 samples.
    assert!(n >= 60, "{n} samples of the child");
}

/// A launch with whole-CPU events releases the program before its events count: a program
/// that forks at once (no C library to start, so within microseconds of its exec) may have
/// forked before then, and laser then learns of the child, its exec and its mappings from
/// /proc instead of the leaders' records (`procinfo::premapped_events`, whose unit test
/// covers that path whatever the timing here; `laser run` takes it in about half the runs,
/// tests/cli.rs). Either way the child is followed, named and symbolizable.
#[test]
fn a_process_forked_before_the_events_count_is_followed() {
    let _serial = exclusive();
    let t = target();
    let dir = t.path.parent().unwrap();
    let forker = dir.join("early_fork");
    build_fixture(
        "early_fork.c",
        &forker,
        &["-O1", "-static", "-nostdlib", "-fno-stack-protector"],
    );
    let cfg = Config {
        watch: false,
        sample_cpus: true,
        frequency: 500,
        ..Config::default()
    };
    let argv: Vec<OsString> = [forker.as_os_str(), t.path.as_os_str()]
        .into_iter()
        .map(OsString::from)
        .chain(["0.3", "0"].map(OsString::from))
        .collect();
    let mut s = Session::launch(&argv, &cfg).unwrap();
    let parent = s.pid() as u32;
    let whole = s.samples_whole_cpus();
    let (events, status) = run_to_exit(&mut s);
    assert_eq!(status, ExitStatus::Code(0));
    let child = events.iter().find_map(|e| match e {
        Event::Fork { pid, ppid, .. } if *ppid == parent && *pid != parent => Some(*pid),
        _ => None,
    });
    let child = child.expect("the fork of the child");
    let early = events
        .iter()
        .any(|e| matches!(e, Event::Fork { pid, time: 0, .. } if *pid == child));
    eprintln!("whole CPUs {whole}; the child was forked before the events counted: {early}");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::Comm { pid, exec: true, name, .. }
            if *pid == child && name == "two_threads")),
        "the child's exec"
    );
    assert!(
        events.iter().any(
            |e| matches!(e, Event::Mmap(m) if m.pid == child && m.path == t.path.to_str().unwrap())
        ),
        "the child's text mapping"
    );
    let n = samples(&events).filter(|x| x.pid == child).count();
    // Two workers for 0.3 s at 500 Hz: ~300 samples.
    assert!(n >= 60, "{n} samples of the child");
}

#[test]
fn launch_reports_exit_status_and_missing_program() {
    let _serial = exclusive();
    let t = target();
    let mut s = Session::launch(&argv(t, &["0.05", "0"]), &Config::default()).unwrap();
    assert!(matches!(s.watch_mut(), Err(DriverError::WatchNotEnabled)));
    assert_eq!(run_to_exit(&mut s).1, ExitStatus::Code(0));
    assert!(matches!(
        Session::attach(i32::MAX, &Config::default()),
        Err(DriverError::NoSuchProcess { .. })
    ));
    let mut s = Session::launch(&argv(t, &["30", "0"]), &Config::default()).unwrap();
    s.signal(libc::SIGKILL).unwrap();
    assert_eq!(run_to_exit(&mut s).1, ExitStatus::Signal(libc::SIGKILL));

    let bad = [OsString::from("/nonexistent/laser-test-prog")];
    match Session::launch(&bad, &Config::default()) {
        Err(DriverError::ProgramNotFound { program, .. }) => {
            assert!(program.contains("laser-test-prog"))
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("launched a nonexistent program"),
    }
    // Without a PMU (every machine of this project) PEBS is refused before the launch.
    if !has_pebs() {
        let unavailable = Config {
            backend: BackendKind::Pebs,
            ..Config::default()
        };
        assert!(matches!(
            Session::launch(&argv(t, &["0.01", "0"]), &unavailable),
            Err(DriverError::BackendUnavailable { .. })
        ));
    }
}

fn has_pebs() -> bool {
    ["cpu", "cpu_core"].iter().any(|p| {
        Path::new("/sys/bus/event_source/devices")
            .join(p)
            .join("events/mem-loads")
            .exists()
    })
}

/// A live PEBS session on the fixture: load samples with data addresses and `data_src` in
/// both threads, some on the shared word. Needs PEBS hardware (bare metal or a VM with a
/// virtual PMU that passes PEBS through): `cargo test -p laser-driver --test live -- --ignored`.
#[test]
#[ignore = "needs Intel PEBS hardware"]
fn pebs_session_samples_loads_with_data_src() {
    let _serial = exclusive();
    assert!(has_pebs(), "no cpu/events/mem-loads on this machine");
    let t = target();
    let cfg = Config {
        backend: BackendKind::Pebs,
        watch: false,
        ..Config::default()
    };
    let mut s = Session::launch(&argv(t, &["0.6", "0"]), &cfg).unwrap();
    let (events, status) = run_to_exit(&mut s);
    assert_eq!(status, ExitStatus::Code(0));
    let pebs: Vec<&Sample> = samples(&events)
        .filter(|s| s.backend == BackendKind::Pebs)
        .collect();
    assert!(!pebs.is_empty(), "no PEBS samples");
    assert!(pebs.iter().all(|s| s.data_src.is_some() && s.weight >= 1));
    let tids: BTreeSet<u32> = pebs.iter().map(|s| s.tid).collect();
    assert!(tids.len() >= 2, "{tids:?}");
    assert!(
        pebs.iter()
            .any(|s| s.addr.map(|a| a & !7) == Some(t.shared_word & !7)),
        "no sample on the shared word"
    );
}

#[test]
fn attach_sees_existing_threads_and_one_created_later() {
    let _serial = exclusive();
    let t = target();
    // Until the first worker exists (main + worker 1).
    let mut child = spawn_with_threads(t, &["0.8", "0", "late"], Stdio::piped(), 2);
    let pid = child.id() as i32;
    let mut s = Session::attach(pid, &Config::default()).unwrap();
    let before: BTreeSet<i32> = s.threads().into_iter().collect();
    assert!(before.contains(&pid) && before.len() == 2, "{before:?}");

    let mut events = Vec::new();
    for _ in 0..4 {
        s.poll(Duration::from_millis(25), &mut |e| events.push(e))
            .unwrap();
    }
    // Let the program create its second worker now.
    child.stdin.take().unwrap().write_all(b"x").unwrap();
    let (rest, status) = run_to_exit(&mut s);
    events.extend(rest);
    assert_eq!(
        status,
        ExitStatus::Unknown,
        "not our child: status unknowable"
    );
    assert!(
        s.signal(libc::SIGTERM).is_err(),
        "no signals to an exited target"
    );
    child.wait().unwrap();

    let after: BTreeSet<i32> = s.threads().into_iter().collect();
    let late: Vec<i32> = after.difference(&before).copied().collect();
    assert_eq!(late.len(), 1, "one thread created after attach: {after:?}");
    let sampled: BTreeSet<u32> = samples(&events).map(|x| x.tid).collect();
    eprintln!("attach: before {before:?} after {after:?} sampled {sampled:?}");
    assert!(
        sampled.contains(&(late[0] as u32)),
        "samples from the late thread {late:?}: {sampled:?}"
    );
    let early_worker = *before.iter().find(|&&x| x != pid).unwrap() as u32;
    assert!(sampled.contains(&early_worker), "{sampled:?}");
    // Mappings that predate the attach were synthesized from /proc/PID/maps.
    assert!(!text_ranges(&events, &t.path).is_empty());
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::Fork { tid, .. } if *tid == late[0] as u32)));
}

#[test]
fn watchpoints_hit_in_both_threads_at_the_watched_address() {
    let _serial = exclusive();
    let t = target();
    let mut s = launch_watched(t, &["0.6", "0"]);
    let pid = s.pid() as u32;
    let spec = shared_word_writes(t);
    s.watch_mut().unwrap().arm(&[spec]).unwrap();
    let (events, status) = run_to_exit(&mut s);
    assert_eq!(status, ExitStatus::Code(0));

    let hits: Vec<&Sample> = samples(&events).collect();
    assert!(!hits.is_empty(), "no watchpoint hits");
    for h in &hits {
        assert_eq!(h.backend, BackendKind::Watch);
        assert_eq!(h.addr, Some(t.shared_word));
        assert_eq!(h.watch_slot, Some(0));
        // The trap fires after the store retires: ip is the next instruction.
        assert_eq!(h.ip, t.store_insn_end, "ip {:#x}", h.ip);
        assert_eq!(h.weight, 1);
        assert!(h.time > 0);
    }
    let tids: BTreeSet<u32> = hits.iter().map(|h| h.tid).filter(|&x| x != pid).collect();
    assert_eq!(
        tids.len(),
        2,
        "hits from both threads, created after the arm"
    );
    let watcher = s.watch_mut().unwrap();
    let (w, duty) = (watcher.stats(), watcher.duty_cycle());
    eprintln!("watch: {} hits from {tids:?}, {w:?}, {duty:?}", hits.len());
    assert_eq!(w.hits as usize, hits.len());
    assert_within_budget(&w, &duty);
    assert!(w.windows >= 1, "{w:?}");

    // The stream says when the word was watched: it opens with the armed word, and it closes
    // with "nothing watched". A window is announced only while every thread has its events
    // (`Watcher::mark`): hits taken while the others open or close fall outside it, in its
    // margins, and the estimator drops them.
    let marks: Vec<(u64, &Vec<(u64, u8)>)> = events
        .iter()
        .filter_map(|e| match e {
            Event::WatchSet { time, words, .. } => Some((*time, words)),
            _ => None,
        })
        .collect();
    assert!(marks.len() >= 2, "{marks:?}");
    assert_eq!(marks[0].1, &vec![(t.shared_word, 8u8)]);
    assert!(marks.last().unwrap().1.is_empty(), "{marks:?}");
    assert!(
        marks.windows(2).all(|p| p[0].0 <= p[1].0),
        "markers in time order"
    );
    let inside = |h: &&Sample| {
        let open = marks.iter().rev().find(|(t0, _)| *t0 <= h.time);
        open.is_some_and(|(_, w)| !w.is_empty())
    };
    let outside: Vec<u64> = hits.iter().filter(|h| !inside(h)).map(|h| h.time).collect();
    eprintln!("{} of {} hits in window margins", outside.len(), hits.len());
    // A window ends at the hit that spends one event's limit (its share of the cap); the
    // other events trap on until they spend theirs or the reader closes them, outside the
    // window. So the hits between two announced windows are bounded by what the kernel
    // lets the other events take, under the cap, not by a share of the run: measured here
    // 0-603 of 3,350-12,285 hits one test at a time, and once 866 of 7,302 (11.9%), whose
    // largest gap held about 300.
    let mut sorted = outside.clone();
    sorted.sort_unstable();
    let mut times: Vec<u64> = hits.iter().map(|h| h.time).collect();
    times.sort_unstable();
    let mut gap = 0usize;
    let mut worst = 0usize;
    let mut next_mark = 0;
    for t in times {
        while next_mark < marks.len() && marks[next_mark].0 <= t {
            if !marks[next_mark].1.is_empty() {
                gap = 0; // a window opened: the margin before it is over
            }
            next_mark += 1;
        }
        if sorted.binary_search(&t).is_ok() {
            gap += 1;
            worst = worst.max(gap);
        }
    }
    assert!(
        worst as u64 <= duty.max_hits_per_window,
        "{worst} hits between two windows, cap {}: {outside:?} {marks:?}",
        duty.max_hits_per_window
    );
    assert!(outside.len() * 4 <= hits.len(), "{outside:?} {marks:?}");
}

/// A launch window opens one event per slot on each thread, writing into the thread's own
/// ring, however many CPUs the machine has: per CPU, a window on a 64-CPU machine opened,
/// enabled and closed 64 events per slot and thread, each an interrupt of the thread's CPU.
/// Hits still arrive, from both workers.
#[test]
fn launch_windows_open_one_event_per_slot_and_thread() {
    let _serial = exclusive();
    let t = target();
    let mut s = launch_watched(t, &["0.6", "0"]);
    let pid = s.pid();
    s.watch_mut()
        .unwrap()
        .arm(&[quiet_word(t), shared_word_writes(t)])
        .unwrap();
    let mut events = Vec::new();
    let t0 = Instant::now();
    let mut seen = None;
    while t0.elapsed() < Duration::from_millis(500) {
        s.poll(Duration::from_millis(10), &mut |e| events.push(e))
            .unwrap();
        let tids: BTreeSet<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .filter_map(|d| d.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        let open = s.watch_mut().unwrap().window_events();
        if tids.len() == 3 && !open.is_empty() {
            seen = Some((tids, open));
            break;
        }
    }
    let (tids, open) = seen.expect("a window open on the main thread and both workers");
    assert!(open.iter().all(|&(_, _, cpu)| cpu == -1), "{open:?}");
    // Every (thread, slot) at most once: a slot whose event spent its limit is replaced, not
    // doubled. Threads of the window: those alive when it opened (all of them here).
    let pairs: BTreeSet<(i32, u8)> = open.iter().map(|&(tid, slot, _)| (tid, slot)).collect();
    assert_eq!(pairs.len(), open.len(), "{open:?}");
    assert!(
        pairs
            .iter()
            .all(|(tid, slot)| tids.contains(tid) && *slot < 2),
        "{open:?} {tids:?}"
    );
    let (rest, status) = run_to_exit(&mut s);
    events.extend(rest);
    assert_eq!(status, ExitStatus::Code(0));
    assert_both_workers_trapped(&events, 1);
}

/// Both workers of the fixture took hits on watch slot `slot`.
fn assert_both_workers_trapped(events: &[Event], slot: u8) {
    let hitters: BTreeSet<u32> = samples(events)
        .filter(|x| x.watch_slot == Some(slot))
        .map(|x| x.tid)
        .collect();
    assert_eq!(
        hitters.len(),
        2,
        "both workers' stores trapped: {hitters:?}"
    );
}

/// The fixture launched for watching alone with whole-CPU windows asked for
/// (`Config::sample_cpus`), under a generous budget.
fn launch_watched_cpus(t: &Target, args: &[&str]) -> Session {
    let cfg = Config {
        backend: BackendKind::Watch,
        sample_cpus: true,
        duty_cycle: generous_duty(Duration::from_millis(50)),
        ..Config::default()
    };
    launch_guarded(&argv(t, args), &cfg)
}

/// Polls until a window is open; its events.
fn open_window_events(s: &mut Session, events: &mut Vec<Event>) -> Vec<(i32, u8, i32)> {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(500) {
        s.poll(Duration::from_millis(10), &mut |e| events.push(e))
            .unwrap();
        let open = s.watch_mut().unwrap().window_events();
        if !open.is_empty() {
            return open;
        }
    }
    panic!("no window opened in 0.5 s");
}

/// Where CPU-wide events are allowed (root, as in CI), a launch window opens one event per
/// slot and CPU for the whole CPU, however many threads the target has: no debug-register
/// reload at each of their context switches, and threads created while it counts are watched
/// from their first instruction. Both workers' stores trap; the same store of a second copy
/// of the (non-PIE) fixture, at the same address in another process, traps too and is
/// dropped as read: every hit delivered is the target's.
#[test]
fn whole_cpu_windows_open_per_slot_and_cpu_and_keep_the_targets_hits() {
    let _serial = exclusive();
    let t = target();
    let mut twin = Command::new(&t.path)
        .args(["1.5", "0"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut s = launch_watched_cpus(t, &["0.6", "0"]);
    let pid = s.pid() as u32;
    s.watch_mut()
        .unwrap()
        .arm(&[quiet_word(t), shared_word_writes(t)])
        .unwrap();
    let mut events = Vec::new();
    let open = open_window_events(&mut s, &mut events);
    let whole = s.watch_mut().unwrap().window_is_cpu_wide();
    let (rest, status) = run_to_exit(&mut s);
    twin.kill().unwrap();
    twin.wait().unwrap();
    events.extend(rest);
    assert_eq!(status, ExitStatus::Code(0));
    assert!(
        samples(&events)
            .filter(|x| x.watch_slot.is_some())
            .all(|x| x.pid == pid),
        "another process's hit"
    );
    assert_both_workers_trapped(&events, 1);
    if !whole {
        eprintln!("note: whole-CPU windows refused here (CPU-wide events not allowed)");
        return;
    }
    let cpus = laser_driver::sys::online_cpus().unwrap();
    // (key, slot, CPU): a whole CPU's events carry a negative key, one per slot and CPU.
    let places: BTreeSet<(u8, i32)> = open.iter().map(|&(_, slot, cpu)| (slot, cpu)).collect();
    assert_eq!(places.len(), open.len(), "{open:?}");
    assert_eq!(open.len(), 2 * cpus.len(), "{open:?}");
    assert!(
        open.iter()
            .all(|&(key, slot, cpu)| key < 0 && slot < 2 && cpus.contains(&(cpu as u32))),
        "{open:?}"
    );
    assert!(
        s.stats().foreign > 0,
        "the twin's stores never trapped: not whole-CPU after all"
    );
}

/// Whole-CPU windows leave no debug register to another session's breakpoints while they
/// count, so a session opens them only while it is the only one watching on the machine
/// (`laser_driver::peers`), and says so while one is open: once another joins, the open
/// window re-opens per thread at the next poll (and lets the other's breakpoints in), and
/// so do the windows after it. Their hits still come.
#[test]
fn another_watching_session_turns_windows_per_thread() {
    let _serial = exclusive();
    let t = target();
    let mut s = launch_watched_cpus(t, &["0.8", "0"]);
    s.watch_mut().unwrap().arm(&[quiet_word(t)]).unwrap();
    let mut events = Vec::new();
    open_window_events(&mut s, &mut events);
    if !s.watch_mut().unwrap().window_is_cpu_wide() {
        eprintln!("note: whole-CPU windows refused here (or another session watches)");
        return;
    }
    let other = laser_driver::peers::Peers::join(&laser_driver::peers::lock_path())
        .expect("the peers file");
    assert!(!other.wait_for_whole_cpu_windows(Duration::ZERO));
    s.poll(Duration::from_millis(1), &mut |e| events.push(e))
        .unwrap();
    assert!(!s.watch_mut().unwrap().window_is_cpu_wide());
    assert!(other.wait_for_whole_cpu_windows(Duration::ZERO));
    // A new set: the window closes and opens again, per thread.
    s.watch_mut()
        .unwrap()
        .arm(&[shared_word_writes(t)])
        .unwrap();
    let open = open_window_events(&mut s, &mut events);
    assert!(!s.watch_mut().unwrap().window_is_cpu_wide());
    assert!(
        open.iter().all(|&(tid, _, cpu)| tid > 0 && cpu == -1),
        "{open:?}"
    );
    let (rest, status) = run_to_exit(&mut s);
    drop(other);
    events.extend(rest);
    assert_eq!(status, ExitStatus::Code(0));
    assert!(
        samples(&events).any(|x| x.watch_slot == Some(0)),
        "no hit from the per-thread window"
    );
}

/// A thread created while a launch window counts is watched from when laser reads its
/// creation record: a program that starts its workers afresh every few milliseconds (the
/// fixture's `rounds`: 3 ms workers between 4 ms of the main thread alone) has them watched
/// for most of their lives only if the reader reads those records promptly
/// (`laser_driver::CHURN_POLL`), not at its 50 ms poll. Measured: 143–162 of 192–214 such
/// workers trapped; 6–7 of 220 when the reader slept its 50 ms (a window that ends at its cap
/// before a new worker's events open leaves that one out: the bar is 40%).
#[test]
fn workers_created_during_a_window_are_watched_promptly() {
    let _serial = exclusive();
    let t = target();
    let mut s = launch_watched(t, &["0.8", "0", "rounds"]);
    let pid = s.pid() as u32;
    s.watch_mut()
        .unwrap()
        .arm(&[shared_word_writes(t)])
        .unwrap();
    let (events, status) = run_to_exit(&mut s);
    assert_eq!(status, ExitStatus::Code(0));
    // Windows: from each WatchSet with words to the next WatchSet.
    let mut windows: Vec<(u64, u64)> = Vec::new();
    let mut open: Option<u64> = None;
    for e in &events {
        if let Event::WatchSet { time, words, .. } = e {
            if let Some(start) = open.take() {
                windows.push((start, *time));
            }
            if !words.is_empty() {
                open = Some(*time);
            }
        }
    }
    let counting = |at: u64| windows.iter().any(|&(a, b)| a <= at && at < b);
    // Workers created while a window counted, and whether each trapped at all.
    let created: BTreeSet<u32> = events
        .iter()
        .filter_map(|e| match e {
            Event::Fork {
                pid: p, tid, time, ..
            } if *p == pid && *tid != pid && counting(*time) => Some(*tid),
            _ => None,
        })
        .collect();
    let trapped: BTreeSet<u32> = samples(&events)
        .filter(|x| x.watch_slot.is_some() && created.contains(&x.tid))
        .map(|x| x.tid)
        .collect();
    assert!(
        created.len() >= 10,
        "{} workers created in windows",
        created.len()
    );
    let share = trapped.len() as f64 / created.len() as f64;
    assert!(
        share >= 0.4,
        "{} of {} workers created while a window counted trapped",
        trapped.len(),
        created.len()
    );
}

/// A code window: an instruction breakpoint on the instruction after the fixture's store (it
/// runs once per inner loop in both workers) traps before it runs, reports its own address as
/// both IP and watched address, and is announced as an instruction (`exec`), not data.
#[test]
fn code_watchpoints_trap_before_the_instruction_in_both_threads() {
    let _serial = exclusive();
    let t = target();
    let mut s = launch_watched(t, &["0.6", "0"]);
    let pid = s.pid() as u32;
    let spec = WatchSpec {
        addr: t.store_insn_end,
        len: 8,
        kind: WatchKind::Exec,
    };
    s.watch_mut().unwrap().arm(&[spec]).unwrap();
    let (events, status) = run_to_exit(&mut s);
    assert_eq!(status, ExitStatus::Code(0));
    let hits: Vec<&Sample> = samples(&events).collect();
    assert!(!hits.is_empty(), "no instruction breakpoint hits");
    for h in &hits {
        assert_eq!(h.backend, BackendKind::Watch);
        assert_eq!(h.ip, t.store_insn_end, "ip {:#x}", h.ip);
        assert_eq!(h.addr, Some(t.store_insn_end));
        assert!(
            h.regs.is_some(),
            "registers for the address the instruction will use"
        );
    }
    let tids: BTreeSet<u32> = hits.iter().map(|h| h.tid).filter(|&x| x != pid).collect();
    assert_eq!(tids.len(), 2, "hits from both threads: {tids:?}");
    let first = events.iter().find_map(|e| match e {
        Event::WatchSet {
            words,
            exec,
            write_only,
            ..
        } if !words.is_empty() => Some((words.clone(), *exec, *write_only)),
        _ => None,
    });
    assert_eq!(first, Some((vec![(t.store_insn_end, 8u8)], 1, 0)));
    // An instruction watch takes length 8 at any alignment; data rules do not apply.
    let odd = WatchSpec {
        addr: t.store_insn_end | 1,
        len: 8,
        kind: WatchKind::Exec,
    };
    assert!(odd.validate().is_ok());
    assert!(WatchSpec { len: 4, ..odd }.validate().is_err());
}

#[test]
fn watchpoints_rearm_and_disarm_while_running() {
    let _serial = exclusive();
    let t = target();
    let cfg = Config {
        watch: true,
        frequency: 500,
        duty_cycle: generous_duty(Duration::from_millis(50)),
        ..Config::default()
    };
    let mut s = launch_guarded(&argv(t, &["1.2", "0"]), &cfg);
    let pid = s.pid() as u32;
    let mut events = Vec::new();
    // Armed on a word nobody touches first, then on shared_word, then disarmed.
    let quiet = quiet_word(t);
    s.watch_mut().unwrap().arm(&[quiet]).unwrap();
    for _ in 0..4 {
        s.poll(Duration::from_millis(25), &mut |e| events.push(e))
            .unwrap();
    }
    let on_quiet = samples(&events).filter(|x| x.watch_slot.is_some()).count();
    assert_eq!(on_quiet, 0, "hits on a word no one touches");
    let busy = WatchSpec {
        addr: t.shared_word,
        len: 8,
        kind: WatchKind::ReadWrite,
    };
    // Both workers exist by now: the new set must reach both.
    s.watch_mut().unwrap().arm(&[quiet, busy]).unwrap();
    let t0 = Instant::now();
    let slot1_tids = |events: &[Event]| -> BTreeSet<u32> {
        samples(events)
            .filter(|x| x.watch_slot == Some(1) && x.tid != pid)
            .map(|x| x.tid)
            .collect()
    };
    while t0.elapsed() < Duration::from_millis(150)
        || (slot1_tids(&events).len() < 2 && t0.elapsed() < Duration::from_millis(600))
    {
        s.poll(Duration::from_millis(25), &mut |e| events.push(e))
            .unwrap();
    }
    s.watch_mut().unwrap().disarm().unwrap();
    assert_eq!(
        slot1_tids(&events).len(),
        2,
        "re-pointed slot 1 hit in both existing threads"
    );
    // Drain what was in flight, then nothing new may arrive while disarmed.
    s.poll(Duration::from_millis(10), &mut |e| events.push(e))
        .unwrap();
    let n_watch = samples(&events).filter(|x| x.watch_slot.is_some()).count();
    let mut later = Vec::new();
    let (rest, _) = run_to_exit(&mut s);
    later.extend(rest);
    assert_eq!(
        samples(&later).filter(|x| x.watch_slot.is_some()).count(),
        0,
        "hits after disarm (had {n_watch} before)"
    );
    // Soft samples kept flowing alongside.
    assert!(samples(&events)
        .chain(samples(&later))
        .any(|x| x.backend == BackendKind::Soft));
}

#[test]
fn header_info_has_build_ids_maps_and_cpu_model() {
    let _serial = exclusive();
    let t = target();
    let mut s = Session::launch(&argv(t, &["0.2", "0"]), &Config::default()).unwrap();
    let mut events = Vec::new();
    s.poll(Duration::from_millis(50), &mut |e| events.push(e))
        .unwrap();
    let h = s.header_info();
    assert!(h.maps.contains(t.path.to_str().unwrap()), "{}", h.maps);
    let want = Command::new("readelf")
        .args(["-n"])
        .arg(&t.path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&want.stdout);
    let hex = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("gcc emits a build-id")
        .trim()
        .to_string();
    let got = &h.build_ids[t.path.to_str().unwrap()];
    let got_hex: String = got.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(got_hex, hex);
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
    if cpuinfo.contains("model name") {
        assert!(h.cpu_model.is_some());
    }
    assert_eq!(h.command[1], "0.2");
    assert!(h.start_time_perf_ns > 0 && h.start_time_perf_ns <= monotonic_ns());
    assert!(
        h.start_time_unix_ns > 1_600_000_000 * 1_000_000_000,
        "after 2020"
    );
    run_to_exit(&mut s);
}

#[test]
fn a_full_small_ring_loses_records_and_says_so() {
    let _serial = exclusive();
    let t = target();
    let cfg = Config {
        frequency: 20_000,
        buffer_pages: 1,
        ..Config::default()
    };
    let mut s = Session::launch(&argv(t, &["0.5", "0"]), &cfg).unwrap();
    // Do not read for a while: a 4 KiB ring holds ~18 samples.
    std::thread::sleep(Duration::from_millis(300));
    let (events, _) = run_to_exit(&mut s);
    let lost_events: u64 = events
        .iter()
        .map(|e| match e {
            Event::Lost { count, .. } => *count,
            _ => 0,
        })
        .sum();
    eprintln!("lost: {lost_events} lost, stats {:?}", s.stats());
    assert!(
        lost_events > 0,
        "no PERF_RECORD_LOST from an overflowing ring"
    );
    assert_eq!(s.stats().lost, lost_events);
}

#[test]
fn attach_arms_watchpoints_in_every_thread() {
    let _serial = exclusive();
    let t = target();
    let mut child = spawn_with_threads(t, &["1.0", "0"], Stdio::null(), 3);
    let pid = child.id() as i32;
    let cfg = Config {
        backend: BackendKind::Watch,
        // Generous budget: this test is about every thread being armed, not the duty
        // cycle (which has its own test); a loaded machine must not starve one thread.
        duty_cycle: generous_duty(Duration::from_millis(50)),
        ..Config::default()
    };
    let mut s = attach_guarded(pid, &cfg);
    let spec = shared_word_writes(t);
    s.watch_mut().unwrap().arm(&[spec]).unwrap();
    let (events, status) = run_to_exit(&mut s);
    child.wait().unwrap();
    assert_eq!(status, ExitStatus::Unknown);
    let hits: Vec<&Sample> = samples(&events).collect();
    let tids: BTreeSet<u32> = hits.iter().map(|h| h.tid).collect();
    eprintln!("attach watch: {} hits from {tids:?}", hits.len());
    assert_eq!(tids.len(), 2, "hits from both workers: {tids:?}");
    assert!(hits
        .iter()
        .all(|h| h.addr == Some(t.shared_word) && h.ip == t.store_insn_end));
}

/// An attached thread's events live across windows, and the kernel's limit with them: an
/// event that trapped is replaced before it counts again. Here the reader sleeps 300 ms into
/// each of three windows on a hot word (each rolls over, or cools down and starts again);
/// each must stop at the cap per event and each must have hits (a breakpoint its limit
/// stopped and enabled again traps without counting).
#[test]
fn attached_windows_stop_at_their_cap_each_time_the_reader_is_late() {
    let _serial = exclusive();
    let t = target();
    // Long enough to outlive the three windows however slowly a loaded machine gets to
    // them (killed below): with 3 s, a CI run beside the other live tests read [50, 0, 0],
    // which a target that had exited gives as well.
    let mut child = spawn_with_threads(t, &["20.0", "0", "hot"], Stdio::null(), 3);
    let pid = child.id() as i32;
    // Cap 50 (a 0.25 ms cost floor, above the calibrated cost): 300 ms pay a window's
    // hits, so it rolls over at the next read.
    let duty =
        laser_driver::DutyCycle::new(Duration::from_millis(25), 0.5, Duration::from_micros(250));
    let cap = duty.max_hits_per_window;
    assert_eq!(cap, 50);
    let cfg = Config {
        backend: BackendKind::Watch,
        duty_cycle: duty,
        ..Config::default()
    };
    let mut s = attach_guarded(pid, &cfg);
    s.watch_mut()
        .unwrap()
        .arm(&[shared_word_writes(t)])
        .unwrap();
    let mut per_window = Vec::new();
    for _ in 0..3 {
        let t0 = Instant::now();
        while !s.watch_mut().unwrap().is_counting() && t0.elapsed() < Duration::from_secs(2) {
            s.poll(Duration::from_millis(5), &mut |_| {}).unwrap();
        }
        per_window.push(late_read_hits(&mut s));
    }
    let w = s.watch_mut().unwrap().stats();
    let alive = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    child.wait().unwrap();
    eprintln!("attached, late reader: hits per window {per_window:?}, cap {cap}, {w:?}");
    assert!(
        alive,
        "the target exited before its third window: {per_window:?}"
    );
    // The workers' events, each stopped at its share of the cap (the cap over the CPUs):
    // at least one share, at most the cap per thread.
    let cpus = laser_driver::sys::online_cpus().map_or(1, |c| c.len().max(1));
    let share = cap.div_ceil(cpus as u64);
    assert!(
        per_window.iter().all(|&h| h >= share && h <= cap * 3),
        "{per_window:?} (share {share})"
    );
}

/// Run as `nobody` (re-executing this test binary), attaching to a root-owned process must
/// fail with the explained permission error, not a bare errno.
#[test]
fn permission_denied_explains_itself() {
    let _serial = exclusive();
    use std::os::unix::process::CommandExt;
    if let Ok(pid) = std::env::var("LASER_TEST_ATTACH_AS_NOBODY") {
        let pid: i32 = pid.parse().unwrap();
        match Session::attach(pid, &Config::default()) {
            Err(e @ DriverError::PermissionDenied { .. }) => println!("DENIED: {e}"),
            Err(e) => println!("OTHER ERROR: {e}"),
            Ok(_) => println!("ATTACHED"),
        }
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // Not root: attach to init (another user's process) directly.
        let e = Session::attach(1, &Config::default()).err().unwrap();
        assert!(e.to_string().contains("perf_event_paranoid"), "{e}");
        return;
    }
    let t = target();
    let mut victim = Command::new(&t.path).args(["3", "0"]).spawn().unwrap();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "permission_denied_explains_itself",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("LASER_TEST_ATTACH_AS_NOBODY", victim.id().to_string());
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe
    // syscalls (setgroups/setgid/setuid) to drop to nobody.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(65534) != 0
                || libc::setuid(65534) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let _ = victim.kill();
    let _ = victim.wait();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(text.contains("DENIED:"), "{text}");
    assert!(
        text.contains("/proc/sys/kernel/perf_event_paranoid is"),
        "{text}"
    );
    assert!(text.contains("CAP_SYS_PTRACE"), "{text}");
}

#[test]
fn duty_cycle_bounds_trap_time_on_a_hot_word() {
    let _serial = exclusive();
    let t = target();
    let cfg = Config {
        backend: BackendKind::Watch,
        ..Config::default()
    };
    let mut s = launch_guarded(&argv(t, &["0.5", "0", "hot"]), &cfg);
    let spec = shared_word_writes(t);
    s.watch_mut().unwrap().arm(&[spec]).unwrap();
    let (events, _) = run_to_exit(&mut s);
    let w = s.watch_mut().unwrap();
    let (stats, duty) = (w.stats(), w.duty_cycle());
    let hits = samples(&events).count() as u64;
    eprintln!("hot: {hits} hits, {stats:?}, {duty:?}");
    assert_eq!(stats.hits, hits);
    assert!(hits > 0 && stats.windows >= 1, "{stats:?}");
    // Unbounded, two threads storing every few ns would trap ~100 % of the time; the duty
    // cycle must have cooled down, and trap time stays within the bound.
    assert!(stats.cooldown_time > Duration::ZERO, "{stats:?}");
    assert_within_budget(&stats, &duty);
}

/// The kernel ends a window at its cap (`PERF_EVENT_IOC_REFRESH`), however late the reader:
/// here it does not read at all for 300 ms while two threads store to the word every few
/// nanoseconds. Each event (a thread on a CPU) stops at the cap; read and closed only after
/// the 300 ms, the window would otherwise hold thousands of hits.
#[test]
fn the_kernel_stops_a_window_at_its_cap_when_the_reader_is_late() {
    let _serial = exclusive();
    let t = target();
    // A 50-hit cap that nothing else ends early: a window as long as the run, and a cost
    // floor (4 ms a hit) well above the calibrated one, so the cooldown outlasts the run.
    let duty =
        laser_driver::DutyCycle::new(Duration::from_secs(10), 0.02, Duration::from_millis(4));
    let cap = duty.max_hits_per_window;
    assert_eq!(cap, 50);
    let mut s = launch_armed_on_hot_word(t, "1.0", duty);
    let mut events = Vec::new();
    std::thread::sleep(Duration::from_millis(300));
    let (rest, status) = run_to_exit(&mut s);
    assert_eq!(status, ExitStatus::Code(0));
    events.extend(rest);
    let hits = samples(&events).filter(|x| x.watch_slot.is_some()).count() as u64;
    let w = s.watch_mut().unwrap().stats();
    eprintln!("late reader: {hits} hits, cap {cap}, {w:?}");
    assert_eq!(w.windows, 1, "{w:?}");
    // 3 threads × the CPUs each may have run on, each event at most the cap.
    let cpus = laser_driver::sys::online_cpus().unwrap().len() as u64;
    assert!(hits >= cap, "the hot word hit its cap: {hits}");
    assert!(hits <= cap * 3 * cpus, "{hits} hits, cap {cap} per event");
}

/// A window that was cheap for its time rolls over with its events open: those that spent
/// their limit are renewed (a breakpoint the kernel stopped at its limit and enabled again
/// traps on without counting). The reader sleeps 300 ms in each of three windows of 25 ms on
/// a hot word; each must stop at its cap, and each must have hits.
#[test]
fn a_rolled_over_window_gets_a_fresh_cap() {
    let _serial = exclusive();
    let t = target();
    // Cap 50; 200 hits need 150 ms of wall and CPU time, so 300 ms pay a window and it rolls
    // over at the next read (a 0.25 ms cost floor, above the calibrated cost).
    let duty =
        laser_driver::DutyCycle::new(Duration::from_millis(25), 0.5, Duration::from_micros(250));
    let cap = duty.max_hits_per_window;
    assert_eq!(cap, 50);
    let mut s = launch_armed_on_hot_word(t, "3.0", duty);
    let mut per_window = Vec::new();
    for _ in 0..3 {
        per_window.push(late_read_hits(&mut s));
    }
    let w = s.watch_mut().unwrap().stats();
    s.signal(libc::SIGKILL).unwrap();
    let _ = run_to_exit(&mut s);
    eprintln!("rolled over: hits per window {per_window:?}, cap {cap}, {w:?}");
    assert_eq!(
        w.cooldown_time,
        Duration::ZERO,
        "rolled over, never cooled: {w:?}"
    );
    let cpus = laser_driver::sys::online_cpus().unwrap().len() as u64;
    assert!(
        per_window.iter().all(|&h| h >= cap && h <= cap * 3 * cpus),
        "{per_window:?}"
    );
}

/// A whole CPU's window events are one group, slot 0 leading (laser-driver's `GroupRole`):
/// each event is stopped at its own limit by the kernel, and a window that rolls over renews
/// what trapped: a spent member inside its group, a spent leader (which stopped its group)
/// with a whole new group. The reader sleeps 300 ms in each of three 25 ms windows (see
/// `a_rolled_over_window_gets_a_fresh_cap`): each window must stop at its cap, and each must
/// have hits, which only a renewed event gives. Once with the hot word a member, once the
/// leader.
#[test]
fn a_whole_cpu_windows_group_stops_at_its_cap_and_rolls_over_fresh() {
    let _serial = exclusive();
    let t = target();
    for hot_leads in [false, true] {
        let specs = if hot_leads {
            [shared_word_writes(t), quiet_word(t)]
        } else {
            [quiet_word(t), shared_word_writes(t)]
        };
        let Some((per_window, w, cap)) = whole_cpu_late_windows(t, &specs) else {
            eprintln!("note: whole-CPU windows refused here (CPU-wide events not allowed)");
            return;
        };
        eprintln!("whole-CPU, hot word leads {hot_leads}: hits per window {per_window:?}, cap {cap}, {w:?}");
        assert_eq!(w.cooldown_time, Duration::ZERO, "rolled over: {w:?}");
        // One event per slot and CPU, each limited to its share of the cap.
        let cpus = laser_driver::sys::online_cpus().unwrap().len() as u64;
        let share = cap.div_ceil(cpus);
        assert!(
            per_window.iter().all(|&h| h >= share && h <= share * cpus),
            "hot word leads {hot_leads}: {per_window:?}, share {share} a CPU"
        );
    }
}

/// The fixture's hot mode under whole-CPU windows on `specs` (rolling over: 25 ms windows, a
/// 50% budget), read late three times: the hits of each window, the watch's stats and the
/// cap. `None` where whole-CPU windows are refused.
fn whole_cpu_late_windows(
    t: &Target,
    specs: &[WatchSpec],
) -> Option<(Vec<u64>, laser_driver::WatchStats, u64)> {
    let duty =
        laser_driver::DutyCycle::new(Duration::from_millis(25), 0.5, Duration::from_micros(250));
    let cap = duty.max_hits_per_window;
    let cfg = Config {
        backend: BackendKind::Watch,
        sample_cpus: true,
        duty_cycle: duty,
        ..Config::default()
    };
    let mut s = launch_guarded(&argv(t, &["3.0", "0", "hot"]), &cfg);
    wait_for_threads(&mut s, 3);
    s.watch_mut().unwrap().arm(specs).unwrap();
    s.watch_mut().unwrap().enable_opened().unwrap();
    let whole = s.watch_mut().unwrap().window_is_cpu_wide();
    let mut per_window = Vec::new();
    if whole {
        for _ in 0..3 {
            per_window.push(late_read_hits(&mut s));
        }
    }
    let w = s.watch_mut().unwrap().stats();
    s.signal(libc::SIGKILL).unwrap();
    let _ = run_to_exit(&mut s);
    whole.then_some((per_window, w, cap))
}

/// Launch windows are not inherited: a thread created while one counts gets its events when
/// its creation record is read. One window spans the run; the second worker starts 200 ms
/// after it opened, and both workers' stores are seen in it.
#[test]
fn a_thread_created_while_a_window_counts_is_watched_in_it() {
    let _serial = exclusive();
    let t = target();
    let duty = laser_driver::DutyCycle::new(Duration::from_secs(10), 0.5, Duration::from_micros(5));
    let mut s = launch_guarded(&argv(t, &["0.6", "0", "delayed"]), &watch_config(duty));
    let pid = s.pid();
    let mut events = Vec::new();
    // Main and the first worker only.
    wait_for_threads(&mut s, 2);
    s.watch_mut()
        .unwrap()
        .arm(&[shared_word_writes(t)])
        .unwrap();
    let (rest, status) = run_to_exit(&mut s);
    assert_eq!(status, ExitStatus::Code(0));
    events.extend(rest);
    let w = s.watch_mut().unwrap().stats();
    let tids: BTreeSet<u32> = samples(&events)
        .filter(|x| x.watch_slot.is_some() && x.tid != pid as u32)
        .map(|x| x.tid)
        .collect();
    eprintln!("{tids:?} {w:?}");
    assert_eq!(w.windows, 1, "one window, never closed: {w:?}");
    assert_eq!(tids.len(), 2, "both workers, the second created mid-window");
}

/// The work runs in a process the launched one forks (`sh -c`, make, a wrapper script): the
/// trap budget must grow with that process's CPU time, or the first cooldown would never end
/// (the shell itself only waits).
#[test]
fn duty_cycle_budgets_the_cpu_of_processes_the_target_forks() {
    let _serial = exclusive();
    let t = target();
    let cfg = Config {
        backend: BackendKind::Watch,
        // A generous budget, so the child's CPU time pays a cooldown many times over even
        // when a loaded machine wakes the reader late and a window overshoots its cap (CI:
        // 551 hits in one 16 ms window at 2 % needed ~850 ms of CPU; the child had 538 ms).
        // With the parent's clock alone (the shell only waits) no budget is ever paid.
        duty_cycle: generous_duty(Duration::from_millis(20)),
        ..Config::default()
    };
    let script = format!("{} 0.5 0 hot; true", t.path.display());
    let cmd: Vec<OsString> = ["sh", "-c", &script].iter().map(OsString::from).collect();
    let mut s = launch_guarded(&cmd, &cfg);
    let spec = shared_word_writes(t);
    s.watch_mut().unwrap().arm(&[spec]).unwrap();
    let (events, status) = run_to_exit(&mut s);
    assert_eq!(status, ExitStatus::Code(0));
    let w = s.watch_mut().unwrap();
    let (stats, duty) = (w.stats(), w.duty_cycle());
    eprintln!("via sh: {} hits, {stats:?}", samples(&events).count());
    // A hot word cools down within the first window; more windows mean cooldowns ended,
    // paid for by the child's CPU time.
    assert!(stats.windows >= 2, "{stats:?}");
    assert!(stats.target_cpu > Duration::from_millis(100), "{stats:?}");
    assert_within_budget(&stats, &duty);
}

fn list_tids(pid: i32) -> Vec<i32> {
    laser_driver::threads::list_tids(pid).unwrap_or_default()
}

/// Starts the fixture with `args` and `stdin` (for an attach), and waits until it has `n`
/// threads, for at most 10 s.
fn spawn_with_threads(t: &Target, args: &[&str], stdin: Stdio, n: usize) -> std::process::Child {
    let child = Command::new(&t.path)
        .args(args)
        .stdin(stdin)
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let deadline = Instant::now() + Duration::from_secs(10);
    while list_tids(pid).len() < n {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(5));
    }
    child
}

/// Polls `s` (events dropped) until its target has `n` threads, for at most 5 s.
fn wait_for_threads(s: &mut Session, n: usize) {
    let t0 = Instant::now();
    while list_tids(s.pid()).len() < n && t0.elapsed() < Duration::from_secs(5) {
        s.poll(Duration::from_millis(5), &mut |_| {}).unwrap();
    }
    assert_eq!(list_tids(s.pid()).len(), n);
}

/// A reader 300 ms late: sleeps, then reads what is there. Returns the watch hits read.
fn late_read_hits(s: &mut Session) -> u64 {
    std::thread::sleep(Duration::from_millis(300));
    let mut hits = 0u64;
    s.poll(Duration::from_millis(1), &mut |e| {
        hits += u64::from(matches!(e, Event::Sample(x) if x.watch_slot.is_some()))
    })
    .unwrap();
    hits
}

/// The fixture launched in `hot` mode for `secs` under `duty`, its shared word watched for
/// writes once both workers run (main + 2 threads), so the window opens on all of them at once.
fn launch_armed_on_hot_word(t: &Target, secs: &str, duty: laser_driver::DutyCycle) -> Session {
    let mut s = launch_guarded(&argv(t, &[secs, "0", "hot"]), &watch_config(duty));
    wait_for_threads(&mut s, 3);
    s.watch_mut()
        .unwrap()
        .arm(&[shared_word_writes(t)])
        .unwrap();
    // Now, not at the next poll (which would read the first hits).
    s.watch_mut().unwrap().enable_opened().unwrap();
    s
}

/// A watch-only session under `duty`.
fn watch_config(duty: laser_driver::DutyCycle) -> Config {
    Config {
        backend: BackendKind::Watch,
        duty_cycle: duty,
        ..Config::default()
    }
}

/// A duty cycle with a 50 % trap budget (and a 5 µs hit-cost floor; calibration still
/// measures the real cost), for tests about something other than the default budget: a
/// loaded machine must neither starve a thread of windows nor leave a cooldown unpaid.
fn generous_duty(window: Duration) -> laser_driver::DutyCycle {
    laser_driver::DutyCycle::new(window, 0.5, Duration::from_micros(5))
}

/// Trap time of every paid-for window (hits × the calibrated hit cost) ≤ s/(1+s) of the
/// target's CPU time over the watched cycles. The last window may be unpaid when the target
/// exits mid-cooldown; under load the reader wakes late and a window overshoots its cap, but
/// never more than what the run's CPU time allowed before.
fn assert_within_budget(w: &laser_driver::WatchStats, duty: &laser_driver::DutyCycle) {
    let paid = duty.hit_cost.as_secs_f64() * (w.hits - w.unpaid_hits) as f64;
    let s = duty.max_slowdown;
    let budget = s / (1.0 + s) * w.target_cpu.as_secs_f64();
    assert!(
        paid <= budget * 1.001 + 1e-6,
        "{paid} s of traps, budget {budget} s for {w:?}"
    );
    assert!(w.target_cpu > Duration::ZERO, "{w:?}");
}

/// The main thread leaves early (pthread_exit): its per-CPU events hang up, yet the workers
/// are still sampled until the process really ends, launched or attached.
#[test]
fn main_thread_exiting_first_does_not_end_observation() {
    let _serial = exclusive();
    let t = target();
    let mut s = Session::launch(&argv(t, &["0.5", "0", "mainexit"]), &Config::default()).unwrap();
    let pid = s.pid() as u32;
    let (events, status) = run_to_exit(&mut s);
    assert_eq!(status, ExitStatus::Code(0));
    let main_exit = events
        .iter()
        .find_map(|e| match e {
            Event::Exit { tid, time, .. } if *tid == pid => Some(*time),
            _ => None,
        })
        .expect("Exit record of the main thread");
    let late = samples(&events)
        .filter(|x| x.tid != pid && x.time > main_exit)
        .count();
    assert!(late > 0, "no worker samples after the main thread exited");

    let mut child = Command::new(&t.path)
        .args(["0.6", "0", "mainexit"])
        .spawn()
        .unwrap();
    let cpid = child.id() as i32;
    // Wait until the main thread is gone (a zombie leader) but workers run.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{cpid}/stat")).unwrap_or_default();
        if stat.contains(") Z") {
            break;
        }
        assert!(Instant::now() < deadline, "main thread never exited");
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut s = Session::attach(cpid, &Config::default()).unwrap();
    let mut events = Vec::new();
    let st = s
        .poll(Duration::from_millis(100), &mut |e| events.push(e))
        .unwrap();
    assert_eq!(
        st,
        Status::Running,
        "zombie leader is not the end of the process"
    );
    let (rest, _) = run_to_exit(&mut s);
    events.extend(rest);
    child.wait().unwrap();
    assert!(
        samples(&events).any(|x| x.tid as i32 != cpid),
        "workers sampled after attaching behind a zombie leader"
    );
}

/// Samples taken inside libc carry the program's call site: the return address into `worker`
/// found on the sampled stack (memset is a leaf without a frame pointer, so a frame-pointer
/// walk would miss it).
#[test]
fn samples_in_a_library_carry_the_programs_return_address() {
    let _serial = exclusive();
    let t = target();
    let mut s = Session::launch(&argv(t, &["0.4", "0", "libc"]), &Config::default()).unwrap();
    let (events, _) = run_to_exit(&mut s);
    let libc: Vec<(u64, u64)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Mmap(m) if m.prot & libc::PROT_EXEC as u32 != 0 && m.path.contains("libc") => {
                Some((m.addr, m.addr + m.len))
            }
            _ => None,
        })
        .collect();
    let in_libc: Vec<&Sample> = samples(&events)
        .filter(|s| libc.iter().any(|&(a, b)| a <= s.ip && s.ip < b))
        .collect();
    let (start, end) = t.worker;
    let from_worker = in_libc
        .iter()
        .filter(|s| {
            s.callers
                .as_slice()
                .first()
                .is_some_and(|&c| start < c && c < end)
        })
        .count();
    eprintln!(
        "{} samples, {} in libc, {from_worker} with worker as first caller",
        samples(&events).count(),
        in_libc.len()
    );
    assert!(in_libc.len() >= 50, "{}", in_libc.len());
    // Not every one: a sample in the PLT stub or between call and frame set-up differs.
    assert!(
        from_worker * 10 >= in_libc.len() * 9,
        "{from_worker} of {}",
        in_libc.len()
    );
}

/// The guard seizes a program whose threads clone while it lists them. A thread it has seized
/// (with `PTRACE_O_TRACECLONE`) that clones hands the new thread to the guard at once, before
/// the listing reaches it; seizing that one again is refused with EPERM. Before the guard
/// told its own tracees from others, 47 of 100 starts against this fixture said "error
/// PTRACE_SEIZE … Operation not permitted", and a CI run lost a live test to it.
#[test]
fn the_guard_seizes_threads_that_clone_while_it_lists_them() {
    let _x = exclusive();
    let exe = target().path.with_file_name("thread_churn");
    build_fixture("thread_churn.c", &exe, &["-O2", "-pthread"]);
    let mut child = Command::new(&exe).spawn().expect("the fixture starts");
    std::thread::sleep(Duration::from_millis(20));
    // (No panic before the fixture is killed: it would run on for its minute.)
    let mut refused = Vec::new();
    for _ in 0..30 {
        match laser_driver::trap_guard::TrapGuard::spawn(guard_exe(), child.id() as i32) {
            Ok(mut g) => {
                let state = g.wait_ready(Duration::from_secs(5)).clone();
                let _ = g.finish();
                if state != laser_driver::trap_guard::GuardState::Ready {
                    refused.push(format!("{state:?}"));
                }
            }
            Err(e) => refused.push(format!("the guard did not start: {e}")),
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(refused.is_empty(), "30 starts of the guard: {refused:?}");
}
