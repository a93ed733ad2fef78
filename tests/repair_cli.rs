//! `laser repair` end to end on a live process compiled here with gcc: two threads bump
//! neighbouring longs of one line in `bump` (the store is found with objdump), counting rounds,
//! so the program itself proves no increment was lost (`ok 1`). Each test repairs a fresh
//! process while its threads run, and checks the bytes of the target through /proc/PID/mem.
//!
//! Built with gcc's defaults (`-fipa-ra` included: callers may keep values in caller-saved
//! registers across a call they know does not touch them; the repair must not clobber them).

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

#[test]
fn repair_mid_run_then_undo_keeps_every_increment() {
    let _g = serial();
    let b = bin();
    let t = Target::spawn(b);
    let orig = t.read(b.bump.0, (b.bump.1 - b.bump.0) as usize);
    let pc = format!("{:#x}", t.bias + b.store);
    let o = laser(&repair_args(&t, &["--pc", &pc]));
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    assert!(out.contains("applied: cache"), "{out}");
    assert!(out.contains("pause: "), "{out}");
    assert!(out.contains("SSB mode in use: FIFO") || out.contains("SSB mode in use: RTM"));
    assert_ne!(
        t.read(b.bump.0, orig.len()),
        orig,
        "bump's loop entry is patched"
    );
    assert!(t.free_running(), "laser detached");
    settle();
    assert!(t.free_running());
    let o = laser(&repair_args(&t, &["--undo"]));
    assert_eq!(o.status.code(), Some(0));
    assert!(
        stdout(&o).contains("1 patch(es) restored"),
        "{}",
        stdout(&o)
    );
    assert_eq!(t.read(b.bump.0, orig.len()), orig, "original bytes back");
    settle();
    // Undo again: nothing active is left (a retired cache may still be collected).
    let o = laser(&repair_args(&t, &["--undo"]));
    assert_eq!(o.status.code(), Some(0));
    assert!(
        !stdout(&o).contains("1 patch(es) restored"),
        "{}",
        stdout(&o)
    );
    let fin = t.finish();
    eprintln!("target: {fin}");
}

#[test]
fn dry_run_prints_the_plan_and_touches_nothing() {
    let _g = serial();
    let b = bin();
    let t = Target::spawn(b);
    let orig = t.read(b.bump.0, (b.bump.1 - b.bump.0) as usize);
    let maps = t.anon_exec();
    let pc = format!("{:#x}", t.bias + b.store);
    let o = laser(&repair_args(&t, &["--pc", &pc, "--dry-run"]));
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    for want in [
        "region:",
        "stores per flush",
        "entry patch at",
        "dry run",
        "SSB mode",
    ] {
        assert!(out.contains(want), "{want:?} missing: {out}");
    }
    assert_eq!(t.read(b.bump.0, orig.len()), orig);
    assert_eq!(t.anon_exec(), maps, "no code cache mapped");
    assert!(t.free_running());
    t.finish();
}

#[test]
fn avx_store_is_refused_with_a_reason_and_the_process_is_untouched() {
    let _g = serial();
    let b = bin();
    let t = Target::spawn(b);
    let avx = t.read(b.avx_store - 2, 24);
    let bump = t.read(b.bump.0, (b.bump.1 - b.bump.0) as usize);
    let maps = t.anon_exec();
    let pc = format!("{:#x}", t.bias + b.avx_store);
    let o = laser(&repair_args(&t, &["--pc", &pc]));
    assert_eq!(o.status.code(), Some(4), "REPAIR_REFUSED");
    let out = stdout(&o);
    assert!(out.contains("refused"), "{out}");
    // SSE/AVX stores are rewritten now (laser-repair plan/wide.rs); this loop's store address
    // moves (rax), so the default profitability rule refuses it as a general-path region.
    assert!(
        out.contains("store addresses change inside the loop"),
        "the reason says why: {out}"
    );
    assert_eq!(t.read(b.avx_store - 2, 24), avx);
    assert_eq!(t.read(b.bump.0, bump.len()), bump);
    assert_eq!(t.anon_exec(), maps);
    assert!(t.free_running());
    t.finish();
}

/// Store addresses that change inside the loop need the general store-buffer path, which was
/// measured slower than the contended original: refused by default, planned when forced.
#[test]
fn a_loop_with_varying_store_addresses_is_refused_unless_forced() {
    let _g = serial();
    let b = bin();
    let t = Target::spawn(b);
    let maps = t.anon_exec();
    let pc = format!("{:#x}", t.bias + b.vary_store);
    let o = laser(&repair_args(&t, &["--pc", &pc]));
    assert_eq!(o.status.code(), Some(4), "REPAIR_REFUSED: {}", stdout(&o));
    let out = stdout(&o);
    assert!(out.contains("store addresses change"), "{out}");
    assert!(out.contains("general path"), "{out}");
    let o = laser(&repair_args(
        &t,
        &["--pc", &pc, "--min-stores-per-flush", "0", "--dry-run"],
    ));
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(!stdout(&o).contains("refused"), "{}", stdout(&o));
    assert_eq!(t.anon_exec(), maps, "nothing mapped");
    assert!(t.free_running());
    t.finish();
}

#[test]
fn a_second_repair_of_the_same_function_is_refused() {
    let _g = serial();
    let b = bin();
    let t = Target::spawn(b);
    let pc = format!("{:#x}", t.bias + b.store);
    assert_eq!(
        laser(&repair_args(&t, &["--pc", &pc])).status.code(),
        Some(0)
    );
    let o = laser(&repair_args(&t, &["--pc", &pc]));
    assert_eq!(o.status.code(), Some(4));
    assert!(stdout(&o).contains("already repaired"), "{}", stdout(&o));
    assert_eq!(laser(&repair_args(&t, &["--undo"])).status.code(), Some(0));
    t.finish();
}

#[test]
fn bad_pid_is_a_clear_error() {
    let o = laser(&[
        "repair".into(),
        "-p".into(),
        "999999999".into(),
        "--undo".into(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("process 999999999 does not exist"), "{err}");
    let o = laser(&["repair".into(), "-p".into(), "1".into()]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "--pc, --from or --undo is required"
    );
}

/// A report as `laser run --json` writes it (module + ELF vaddr per source): the
/// false-sharing finding is repaired at this process's load address, the true-sharing one
/// skipped with the reason.
#[test]
fn from_report_resolves_module_offsets_in_this_process() {
    let _g = serial();
    let b = bin();
    let t = Target::spawn(b);
    let module = b.path.to_str().unwrap();
    let source = |off: u64| {
        serde_json::json!({
            "pc": "0x1", "module": module, "offset": format!("{off:#x}"), "function": "bump",
            "op": "store", "offsets": [0], "events": 10, "threads": [1]
        })
    };
    let finding = |kind: &str, off: u64| {
        serde_json::json!({
            "kind": kind, "line_addr": "0x1000", "rate_per_s": 5000.0, "events": 100,
            "share": 0.5, "threads": [1, 2], "fix": "pad",
            "data": {"kind": "global", "name": "counters"},
            "sources": [source(off)]
        })
    };
    let report = serde_json::json!({
        "schema": "laser-report/1", "backend": "soft", "duration_s": 1.0, "samples": 10,
        "lost": 0, "line_size": 64, "threshold": 1000.0,
        "findings": [finding("true_sharing", b.avx_store), finding("false_sharing", b.store)]
    });
    let path = b.path.with_file_name(format!("report-{}.json", t.pid));
    std::fs::write(&path, report.to_string()).unwrap();
    let orig = t.read(b.bump.0, (b.bump.1 - b.bump.0) as usize);
    let o = laser(&repair_args(&t, &["--from", path.to_str().unwrap()]));
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("false sharing only"), "{out}");
    assert!(
        out.contains("repair bump ["),
        "function named from the report: {out}"
    );
    assert!(out.contains(&format!("{:#x}", t.bias + b.store)), "{out}");
    assert!(out.contains("applied: cache"), "{out}");
    assert_ne!(t.read(b.bump.0, orig.len()), orig);
    settle();
    assert_eq!(laser(&repair_args(&t, &["--undo"])).status.code(), Some(0));
    assert_eq!(t.read(b.bump.0, orig.len()), orig);
    t.finish();
}

/// With gcc's default `-fipa-ra`, `worker` keeps `k` in a caller-saved register across
/// `call bump`. A planner that took caller-saved registers as dead at `ret` would clobber it
/// and the worker would fault (it did, before the planner kept every register live there).
#[test]
fn repair_of_ipa_ra_code_keeps_the_caller_alive() {
    let _g = serial();
    let b = build("fs-ipa-ra", &[]);
    let t = Target::spawn(&b);
    let pc = format!("{:#x}", t.bias + b.store);
    assert_eq!(
        laser(&repair_args(&t, &["--pc", &pc])).status.code(),
        Some(0)
    );
    settle();
    assert_eq!(laser(&repair_args(&t, &["--undo"])).status.code(), Some(0));
    t.finish();
}

/// An error in the ptrace half (here: another tracer already holds the process, so seizing
/// fails with EPERM) leaves the target as it was: same bytes, no cache, not stopped.
#[test]
fn a_tracee_failure_leaves_the_process_untouched() {
    let _g = serial();
    let b = bin();
    let t = Target::spawn(b);
    let orig = t.read(b.bump.0, (b.bump.1 - b.bump.0) as usize);
    let maps = t.anon_exec();
    let pid = t.pid;
    // SAFETY: plain ptrace requests on our own child; no memory is passed.
    let r = unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, 0, 0) };
    assert_eq!(r, 0, "seize: {}", std::io::Error::last_os_error());
    let pc = format!("{:#x}", t.bias + b.store);
    let o = laser(&repair_args(&t, &["--pc", &pc]));
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cannot ptrace"), "{err}");
    assert_eq!(t.read(b.bump.0, orig.len()), orig);
    assert_eq!(t.anon_exec(), maps);
    // Let go of it again (a seized thread must be in a stop to detach).
    // SAFETY: as above; `st` is a valid out-pointer for waitpid.
    unsafe {
        assert_eq!(libc::ptrace(libc::PTRACE_INTERRUPT, pid, 0, 0), 0);
        let mut st = 0;
        assert_eq!(libc::waitpid(pid, &mut st, libc::__WALL), pid);
        assert_eq!(libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0), 0);
    }
    assert!(t.free_running());
    t.finish();
}

/// Repair, undo, repair again on one live process, 100 times, through the real CLI (200
/// laser processes; ~1 min in a debug build here): every undo restores the original bytes,
/// the process never stops or stays traced, the code caches do not pile up, and at the end
/// the program proves it lost no increment (`ok 1`).
#[test]
fn repair_and_undo_100_times_on_one_process() {
    const CYCLES: usize = 100;
    let _g = serial();
    let b = bin();
    let t = Target::spawn(b);
    let orig = t.read(b.bump.0, (b.bump.1 - b.bump.0) as usize);
    let maps = t.anon_exec();
    let pc = format!("{:#x}", t.bias + b.store);
    let start = std::time::Instant::now();
    let mut max_caches = 0;
    for i in 0..CYCLES {
        let o = laser(&repair_args(&t, &["--pc", &pc]));
        assert_eq!(o.status.code(), Some(0), "repair, cycle {i}");
        assert!(stdout(&o).contains("applied: cache"), "cycle {i}");
        assert_ne!(t.read(b.bump.0, orig.len()), orig, "patched, cycle {i}");
        let o = laser(&repair_args(&t, &["--undo"]));
        assert_eq!(o.status.code(), Some(0), "undo, cycle {i}");
        assert!(stdout(&o).contains("1 patch(es) restored"), "cycle {i}");
        assert_eq!(t.read(b.bump.0, orig.len()), orig, "restored, cycle {i}");
        assert!(t.free_running(), "cycle {i}");
        max_caches = max_caches.max(t.anon_exec() - maps);
    }
    eprintln!(
        "{CYCLES} repair/undo cycles in {:.1} s; at most {max_caches} retired cache(s) mapped at once",
        start.elapsed().as_secs_f64()
    );
    // A retired cache is unmapped by a later undo once no thread refers to it: they must not
    // accumulate one per cycle.
    assert!(max_caches <= 3, "{max_caches} code caches left mapped");
    let fin = t.finish();
    eprintln!("target: {fin}");
}

/// The whole loop: `laser run --json` on the program finds the false sharing in `bump`, and
/// `laser repair --from` that report repairs a second run of it (other load address).
#[test]
fn laser_run_report_then_repair_from_it() {
    let _g = serial();
    let b = bin();
    let json = b.path.with_file_name("run-report.json");
    // Sampling on a loaded 2-core machine: threads that are not running at once do not
    // contend, so a run may see nothing; three tries. The threshold keeps bump's line (10^5+
    // ev/s) and leaves out the few stores of `rounds[k]` at exit, which the watchpoint survey
    // finds (real false sharing, a handful of events) and the repair would refuse (a
    // function without a loop), making this a test of something else.
    let mut found = false;
    for _ in 0..3 {
        let mut run = Command::new(LASER)
            .args(["run", "--threshold", "100", "-q", "--json"])
            .arg(&json)
            .arg("--")
            .arg(&b.path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_secs(2));
        writeln!(run.stdin.as_mut().unwrap(), "stop").unwrap();
        let o = run.wait_with_output().unwrap();
        assert!(o.status.success(), "laser run: {o:?}");
        let report = std::fs::read_to_string(&json).unwrap();
        if report.contains("\"false_sharing\"") {
            found = true;
            break;
        }
        eprintln!("no false sharing seen this run: {report}");
    }
    assert!(found, "laser run never reported the false sharing in bump");
    let t = Target::spawn(b);
    let orig = t.read(b.bump.0, (b.bump.1 - b.bump.0) as usize);
    let o = laser(&repair_args(&t, &["--from", json.to_str().unwrap()]));
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("repair bump ["), "{out}");
    assert_ne!(t.read(b.bump.0, orig.len()), orig);
    settle();
    assert_eq!(laser(&repair_args(&t, &["--undo"])).status.code(), Some(0));
    t.finish();
}

#[test]
fn a_report_of_another_program_is_an_error() {
    let _g = serial();
    let b = bin();
    let t = Target::spawn(b);
    let report = serde_json::json!({
        "schema": "laser-report/1", "backend": "soft", "duration_s": 1.0, "samples": 10,
        "lost": 0, "line_size": 64, "threshold": 1000.0,
        "findings": [{
            "kind": "false_sharing", "line_addr": "0x1000", "rate_per_s": 5000.0, "events": 100,
            "share": 0.5, "threads": [1, 2], "fix": "pad",
            "data": {"kind": "global", "name": "x"},
            "sources": [{"pc": "0x1", "module": "/nonexistent/other-program", "offset": "0x1139",
                         "op": "store", "offsets": [0], "events": 10}]
        }]
    });
    let path = b.path.with_file_name(format!("other-{}.json", t.pid));
    std::fs::write(&path, report.to_string()).unwrap();
    let o = laser(&repair_args(&t, &["--from", path.to_str().unwrap()]));
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("none of the report's 1 false-sharing source"),
        "{err}"
    );
    assert!(t.free_running());
    t.finish();
}

/// The trial (default): a forced repair of the padded twin, where nothing is falsely shared,
/// runs slower than native, so laser measures that, kills and undoes it, and says so; the
/// program's increments all land and its code is the original again.
#[test]
fn trial_undoes_a_repair_of_a_loop_without_false_sharing() {
    let _g = serial();
    let b = build("fs-padded-trial", &["-DPAD"]);
    let t = Target::spawn(&b);
    let orig = t.read(b.bump.0, (b.bump.1 - b.bump.0) as usize);
    let pc = format!("{:#x}", t.bias + b.store);
    let o = laser(&repair_args_trial(
        &t,
        &[
            "--pc",
            &pc,
            "--min-stores-per-flush",
            "0",
            "--trial-ms",
            "100",
        ],
    ));
    let out = stdout(&o);
    assert_eq!(
        o.status.code(),
        Some(0),
        "an undone repair exits as nothing repaired: {out}"
    );
    let line = out
        .lines()
        .find(|l| l.contains("trial: region"))
        .unwrap_or_else(|| panic!("no trial line: {out}"));
    assert!(line.contains(" undone: "), "{line}");
    assert!(line.contains("it/s"), "{line}");
    assert_eq!(t.read(b.bump.0, orig.len()), orig, "original bytes back");
    assert!(t.free_running());
    let fin = t.finish();
    assert!(fin.contains("ok 1"), "{fin}");
}

/// On the false-sharing program the trial measures both rates and decides; whatever it
/// decides the program stays correct and the code matches the verdict (patched if kept,
/// original if undone).
#[test]
fn trial_on_false_sharing_measures_and_keeps_code_consistent_with_its_verdict() {
    let _g = serial();
    let b = bin();
    let t = Target::spawn(b);
    let orig = t.read(b.bump.0, (b.bump.1 - b.bump.0) as usize);
    let pc = format!("{:#x}", t.bias + b.store);
    let o = laser(&repair_args_trial(&t, &["--pc", &pc, "--trial-ms", "100"]));
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let line = out
        .lines()
        .find(|l| l.contains("trial: region"))
        .unwrap_or_else(|| panic!("no trial line: {out}"));
    let kept = line.contains(" kept: ");
    assert!(kept || line.contains(" undone: "), "{line}");
    assert!(
        !line.contains("did not iterate"),
        "bump runs all the time: {line}"
    );
    // A kept store buffer then meets the placement trial: when pinning beats it, the store
    // buffer comes out (original code) and the threads stay pinned.
    let pinned = out.contains("faster than the store buffer's");
    assert!(!pinned || kept, "{out}");
    assert!(
        !pinned || out.contains("thread(s) pinned to CPU"),
        "a placement that beat the store buffer is said: {out}"
    );
    assert_eq!(
        t.read(b.bump.0, orig.len()) != orig,
        kept && !pinned,
        "{out}"
    );
    settle();
    assert!(t.free_running());
    if kept {
        assert_eq!(laser(&repair_args(&t, &["--undo"])).status.code(), Some(0));
    }
    let fin = t.finish();
    assert!(fin.contains("ok 1"), "{fin}");
}

/// The goal: a repair of real false sharing is kept. fs.c's `(*p)++` costs little
/// here (its load forwards from the core's own store buffer: the trial measured the repair at
/// 0.4-0.8x), so this uses the linear-regression loop (`-DLREG`, 5 shared stores per point),
/// whose repair RESULTS.md measured at 1.9x (post-repair rate, quiet machine) and the trial
/// kept at 2.5x in one scripts/bench run here. A timing verdict: on this loaded 2-vCPU VM
/// (load 4-7) the trial measured this loop's repair at 0.24-0.44x and undid it.
#[test]
#[ignore = "timing: needs the two threads co-scheduled (a quiet machine with 2+ cores)"]
fn trial_keeps_the_repair_of_a_loop_with_false_sharing() {
    let _g = serial();
    let b = build("fs-lreg", &["-DLREG"]);
    let t = Target::spawn(&b);
    let pcs: Vec<String> = stores_in(&b, "lreg")
        .iter()
        .map(|a| format!("{:#x}", t.bias + a))
        .collect();
    assert_eq!(pcs.len(), 5, "lreg's five sums");
    let mut args = vec!["--pc"];
    args.extend(pcs.iter().map(String::as_str));
    let o = laser(&repair_args_trial(&t, &args));
    let out = stdout(&o);
    assert!(out.contains(" kept: "), "{out}");
    settle();
    assert_eq!(laser(&repair_args(&t, &["--undo"])).status.code(), Some(0));
    let fin = t.finish();
    assert!(fin.contains("ok 1"), "{fin}");
}

/// -DLREG's program checks its own sums: repaired unmeasured (--no-trial), it stays right.
#[test]
fn lreg_repaired_without_trial_keeps_its_sums() {
    let _g = serial();
    let b = build("fs-lreg", &["-DLREG"]);
    let t = Target::spawn(&b);
    let pcs: Vec<String> = stores_in(&b, "lreg")
        .iter()
        .map(|a| format!("{:#x}", t.bias + a))
        .collect();
    let mut args = vec!["--pc"];
    args.extend(pcs.iter().map(String::as_str));
    let o = laser(&repair_args(&t, &args));
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains("applied: cache"), "{}", stdout(&o));
    settle();
    let fin = t.finish();
    assert!(fin.contains("ok 1"), "{fin}");
}
