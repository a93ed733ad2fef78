//! End-to-end tests of the `laser` command on programs compiled here with gcc: exit codes, bad
//! input, reports (text and JSON), recordings and attach. They really sample (soft backend +
//! watchpoints), so they assert on what any working run must show, not on exact counts.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

const LASER: &str = env!("CARGO_BIN_EXE_laser");

/// The contention tests check what is found (lines, kind, data), not how intense it is: on a
/// loaded 2-core runner the two threads often share one CPU and really do contend less (the
/// watch estimate drops from ~50k to a few hundred transfers/s). So they report from 100/s.
const LOW_THRESHOLD: f64 = 100.0;
const LOW: &str = "100";

/// Two threads incrementing neighbouring words of one line: the simplest false sharing.
/// Runs for argv[1] seconds (default 1); the golden recording is of the same program. Its
/// source lines 13 (thread 2) and 22 (thread 1) are asserted on.
const FS_C: &str = include_str!("fixtures/golden/fs.c");

/// Tests that measure contention run one at a time: two busy programs on 2 cores time-slice
/// each other's threads, and threads that don't run at once don't contend (really: the
/// counts drop, which is what laser then reports).
fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn workdir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("laser-cli-tests-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    })
}

/// The false-sharing pair of FS_C in a program whose main thread first takes all 4 of its
/// debug registers, as a debugger's hardware watchpoints would.
const DEBUG_REGISTERS_TAKEN_C: &str = include_str!("fixtures/programs/debug_registers_taken.c");

/// Forges the SIGTRAP of a lost debug exception, runs its own int1, or stops itself
/// (`forge` / `int1` / `stop`), with false sharing beside it; prints "alive handled N".
const LOST_DEBUG_TRAP_C: &str = include_str!("fixtures/programs/lost_debug_trap.c");

/// `src` compiled with -O2 -g as `name` in the work directory.
fn compile(name: &str, src: &str) -> PathBuf {
    let d = workdir();
    let c = d.join(format!("{name}.c"));
    std::fs::write(&c, src).unwrap();
    let bin = d.join(name);
    let ok = Command::new("gcc")
        .args(["-O2", "-g", "-pthread", "-o"])
        .arg(&bin)
        .arg(&c)
        .status()
        .expect("gcc runs");
    assert!(ok.success(), "gcc failed");
    bin
}

/// Builds the false-sharing program once (with -g; and a stripped copy).
fn fs_program() -> &'static (PathBuf, PathBuf) {
    static P: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    P.get_or_init(|| {
        let d = workdir();
        let bin = compile("fs", FS_C);
        let stripped = d.join("fs-stripped");
        std::fs::copy(&bin, &stripped).unwrap();
        let ok = Command::new("strip").arg(&stripped).status().unwrap();
        assert!(ok.success());
        (bin, stripped)
    })
}

fn laser(args: &[&str]) -> Output {
    Command::new(LASER)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("laser runs")
}

/// `laser run --threshold LOW OPTS… --json <workdir>/json_name -- bin args…`: its output and
/// the JSON report's path.
fn run_to_json(json_name: &str, opts: &[&str], bin: &Path, args: &[&str]) -> (Output, PathBuf) {
    let out = workdir().join(json_name);
    let mut argv = vec!["run", "--threshold", LOW];
    argv.extend_from_slice(opts);
    argv.extend_from_slice(&["--json", out.to_str().unwrap(), "--", bin.to_str().unwrap()]);
    argv.extend_from_slice(args);
    (laser(&argv), out)
}

/// The first line a spawned program prints (its stdout piped), trimmed.
fn first_line(child: &mut std::process::Child) -> String {
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    line.trim().to_string()
}

/// `laser attach -p PID --duration D --json <workdir>/json_name`: its output and the path.
fn attach_to_json(json_name: &str, pid: &str, duration: &str) -> (Output, PathBuf) {
    let out = workdir().join(json_name);
    let o = laser(&[
        "attach",
        "-p",
        pid,
        "--duration",
        duration,
        "--json",
        out.to_str().unwrap(),
    ]);
    (o, out)
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn json(path: &Path) -> serde_json::Value {
    let s = std::fs::read_to_string(path).unwrap();
    serde_json::from_str(&s).unwrap()
}

/// The finding on `counters` of a laser-report/1 JSON, asserted to be false sharing.
fn counters_finding<'a>(report: &'a serde_json::Value, ctx: &str) -> &'a serde_json::Value {
    assert_eq!(report["schema"], "laser-report/1", "{ctx}");
    let f = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| {
            f["data"]["name"]
                .as_str()
                .unwrap_or("")
                .contains("counters")
        })
        .unwrap_or_else(|| panic!("no finding on `counters`: {report:#}\n{ctx}"));
    assert_eq!(f["kind"], "false_sharing", "{f:#}");
    f
}

/// The report's notes.
fn notes(report: &serde_json::Value) -> Vec<&str> {
    report["notes"].as_array().map_or(Vec::new(), |n| {
        n.iter().filter_map(|n| n.as_str()).collect()
    })
}

/// The report's note that starts with `prefix`, if any.
fn note_starting<'a>(report: &'a serde_json::Value, prefix: &str) -> Option<&'a str> {
    notes(report).into_iter().find(|n| n.starts_with(prefix))
}

/// The false-sharing finding on `counters` with both source lines, from a laser-report/1 JSON.
fn assert_finds_counters(report: &serde_json::Value, ctx: &str) {
    let f = counters_finding(report, ctx);
    let lines: Vec<u64> = f["sources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["line"].as_u64())
        .collect();
    assert!(
        lines.contains(&13) && lines.contains(&22),
        "{lines:?}\n{f:#}"
    );
    assert!(f["rate_per_s"].as_f64().unwrap() >= LOW_THRESHOLD, "{f:#}");
}

#[test]
fn run_reports_false_sharing_with_source_lines_and_json() {
    let _serial = exclusive();
    let (bin, _) = fs_program();
    let (o, out) = run_to_json("run.json", &[], bin, &["1.5"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("done 1"),
        "program output passes through\n{t}"
    );
    assert!(stdout.contains("FALSE SHARING"), "{t}");
    assert!(
        stdout.contains("fs.c:13") && stdout.contains("fs.c:22"),
        "{t}"
    );
    assert!(stdout.contains("counters"), "{t}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("backend soft"),
        "says which backend and why\n{t}"
    );
    assert_finds_counters(&json(&out), &t);
}

/// The program runs in a process that the launched one forks at once: with whole-CPU
/// sampling the launched process is released before laser's events count, and a forker with
/// no C library to start forks within microseconds of its exec, before then in about half
/// the runs here (3 of 6 under ftrace), when laser learns of the child from /proc. The
/// child's false sharing is found with its source lines whichever way it went.
#[test]
fn a_program_forked_at_once_by_the_launched_one_is_reported() {
    let _serial = exclusive();
    let (bin, _) = fs_program();
    let forker = workdir().join("early_fork");
    let src =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("laser-driver/tests/fixtures/early_fork.c");
    let ok = Command::new("gcc")
        .args(["-O1", "-static", "-nostdlib", "-fno-stack-protector", "-o"])
        .arg(&forker)
        .arg(&src)
        .status()
        .expect("gcc runs");
    assert!(ok.success(), "gcc -static -nostdlib failed");
    let (o, out) = run_to_json("forked.json", &[], &forker, &[bin.to_str().unwrap(), "1.5"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("done 1"), "{t}");
    assert_finds_counters(&json(&out), &t);
}

#[test]
fn exit_status_of_the_program_passes_through() {
    let o = laser(&["run", "--quiet", "--", "sh", "-c", "exit 3"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let o = laser(&["run", "--quiet", "--", "sh", "-c", "kill -SEGV $$"]);
    assert_eq!(o.status.code(), Some(128 + 11), "{}", text(&o));
    let o = laser(&["run", "--quiet", "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn missing_and_non_executable_programs_are_clear_errors() {
    let o = laser(&["run", "--", "/nonexistent/program"]);
    assert_eq!(o.status.code(), Some(127), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("not found"),
        "{}",
        text(&o)
    );

    let f = workdir().join("not-executable");
    std::fs::write(&f, "just text\n").unwrap();
    let o = laser(&["run", "--", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(126), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("laser: error"), "{}", text(&o));
    assert!(!err.contains("panicked"), "{}", text(&o));
}

/// Two threads in false sharing while 8 more sleep: every thread gets the watch windows'
/// events, only two trap. The pair must be found as it is alone (a version that
/// shared each window's hit cap out among all 11 threads stopped the pair's events at a
/// fifth of it and let the windows run on unseen: rated 162-388/s, or not found).
/// How high the rate must be is not asserted: see the test.
const FS_BESIDE_IDLE_C: &str = include_str!("fixtures/programs/fs_beside_idle.c");

#[test]
fn false_sharing_beside_idle_threads_is_found() {
    let _serial = exclusive();
    let bin = compile("fs_beside_idle", FS_BESIDE_IDLE_C);
    let (o, out) = run_to_json("beside_idle.json", &[], &bin, &["1.5", "8"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let report = json(&out);
    let f = counters_finding(&report, &t);
    // Quiet, a release laser rates this pair 30k-65k/s here, but these tests run the dev
    // build: quiet, it rated the pair 353-26,715/s (10 runs), and two clean-clone CI runs
    // 206/s and 370/s. In its windows one thread of the pair often does not run at all (a
    // recording: 13 of the 14 windows with hits had them from one thread), so only the floor
    // every contention test uses is asserted: the shared-cap version (162-388/s at overlap
    // 0.95, once not found) is caught only when it misses.
    assert!(f["rate_per_s"].as_f64().unwrap() >= LOW_THRESHOLD, "{f:#}");
}

/// The "watchpoint cost" note of a JSON report: (traps, percent of the run).
fn watch_cost(report: &serde_json::Value) -> Option<(u64, f64)> {
    let note = notes(report)
        .into_iter()
        .find(|n| n.starts_with("watchpoint cost:"))?;
    let traps = note
        .strip_prefix("watchpoint cost: ")?
        .split(' ')
        .next()?
        .parse()
        .ok()?;
    let pct = note
        .split_once("% of the")?
        .0
        .rsplit(' ')
        .next()?
        .parse()
        .ok()?;
    Some((traps, pct))
}

/// The default cost model (`full`) charges the budget with laser's work on the window events
/// and the watched threads' context switches as well as the traps (each priced without a
/// wake-up per hit), and the note says all three; `traps` prices each trap with a wake-up
/// instead, and the note says so. Either way the whole stays within the budget.
#[test]
fn both_cost_models_stay_within_the_budget_and_the_note_says_which() {
    let _serial = exclusive();
    let (bin, _) = fs_program();
    for (model, says) in [
        ("full", "context switch(es) of watched threads"),
        ("traps", "--watch-cost-model traps"),
    ] {
        let (o, out) = run_to_json(
            &format!("{model}-model.json"),
            &["--watch-cost-model", model, "--watch-budget", "2"],
            bin,
            &["1.5"],
        );
        let t = text(&o);
        assert_eq!(o.status.code(), Some(0), "{t}");
        let report = json(&out);
        let note = note_starting(&report, "watchpoint cost:")
            .unwrap_or_else(|| panic!("no watchpoint cost note: {report:#}\n{t}"));
        assert!(note.contains(says), "{model}: {note}");
        assert_eq!(
            note.contains("laser's work on the events of"),
            model == "full",
            "{note}"
        );
        let (traps, pct) = watch_cost(&report).unwrap();
        assert!(traps > 0 && pct <= 2.1, "{traps} traps, {pct}%: {note}");
    }
    let o = laser(&["run", "--watch-cost-model", "all", "--", "true"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("the models are `traps` and `full`"),
        "{}",
        text(&o)
    );
}

#[test]
fn the_watch_budget_bounds_what_traps_cost_and_the_report_says_it() {
    let _serial = exclusive();
    let (bin, _) = fs_program();
    let mut seen = Vec::new();
    // The default first: 1%, charged with all a window costs (`--watch-cost-model full`).
    for (budget, default) in [("1", true), ("0.5", false), ("2", false)] {
        let args: &[&str] = if default {
            &[]
        } else {
            &["--watch-budget", budget]
        };
        let (o, out) = run_to_json(&format!("budget-{budget}.json"), args, bin, &["1.5"]);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(0), "{t}");
        let report = json(&out);
        // What is found is other tests' business: a smaller budget rates fewer lines per
        // second (at 0.5% a CI run once saw a single transfer in the pair's one window and
        // reported nothing: RESULTS, thirteenth session).
        let (traps, pct) = watch_cost(&report)
            .unwrap_or_else(|| panic!("no watchpoint cost note: {report:#}\n{t}"));
        // The duty cycle pays every window's traps with a cooldown, except the last one's: the
        // slack is one window (100 ms × the budget) over the 1.5 s run, under 0.1 point.
        let b: f64 = budget.parse().unwrap();
        assert!(
            traps > 0 && pct <= b + 0.1,
            "budget {budget}%: {traps} traps, {pct}%\n{t}"
        );
        if default {
            let note = notes(&report)
                .into_iter()
                .find(|n| n.starts_with("watchpoint cost:"))
                .unwrap();
            assert!(
                note.contains("(budget 1%, --watch-budget)")
                    && note.contains("laser's work on the events of"),
                "{note}"
            );
        }
        seen.push(traps);
    }
    // Surveys and the hot line spend the whole budget: a quarter of it is far fewer traps.
    assert!(seen[1] < seen[2], "traps at 1%, 0.5% and 2%: {seen:?}");

    let o = laser(&["run", "--watch-budget", "0", "--", "true"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--watch-budget"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_program_that_exits_at_once_gives_an_empty_report() {
    let out = workdir().join("true.json");
    let o = laser(&["run", "--json", out.to_str().unwrap(), "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = json(&out);
    assert_eq!(r["schema"], "laser-report/1");
    assert_eq!(r["findings"].as_array().unwrap().len(), 0, "{r:#}");
}

#[test]
fn stripped_binary_reports_addresses_and_says_debug_info_is_missing() {
    let _serial = exclusive();
    let (_, stripped) = fs_program();
    let o = laser(&[
        "run",
        "--threshold",
        LOW,
        "--",
        stripped.to_str().unwrap(),
        "1.5",
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("FALSE SHARING"), "{t}");
    assert!(
        stdout.contains("0x"),
        "addresses instead of source lines\n{t}"
    );
    assert!(stdout.to_lowercase().contains("debug info"), "{t}");
}

#[test]
fn fork_and_exec_children_are_followed_without_trouble() {
    let _serial = exclusive();
    let (bin, _) = fs_program();
    let cmd = format!("{} 1; exit 5", bin.display());
    let o = laser(&["run", "--", "sh", "-c", &cmd]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(5), "{t}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("done 1"), "{t}");
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("panicked"),
        "{t}"
    );
}

const FORK_COPIES_C: &str = include_str!("fixtures/programs/fork_copies.c");

/// Two processes of one program (fork, no exec) each writing its own counter of a global
/// pair share no line: each has its own copy of it. The same pair in a `MAP_SHARED` mapping
/// both see is falsely shared between them.
#[test]
fn forked_copies_share_a_line_only_in_shared_memory() {
    let _serial = exclusive();
    let bin = compile("fork_copies", FORK_COPIES_C);
    let (o, out) = run_to_json("fork_private.json", &[], &bin, &["1"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let report = json(&out);
    assert_eq!(report["findings"].as_array().unwrap().len(), 0, "{t}");
    let (o, out) = run_to_json("fork_shared.json", &[], &bin, &["1", "shared"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let report = json(&out);
    let findings = report["findings"].as_array().unwrap();
    let f = findings
        .iter()
        .find(|f| f["kind"] == "false_sharing")
        .unwrap_or_else(|| panic!("no false sharing in the shared mapping\n{t}"));
    assert!(f.get("process").is_none(), "{f:#}");
    assert_eq!(f["threads"].as_array().unwrap().len(), 2, "{f:#}");
    assert!(f["rate_per_s"].as_f64().unwrap() >= LOW_THRESHOLD, "{f:#}");
}

#[test]
fn record_then_report_gives_the_same_finding_and_survives_truncation() {
    let _serial = exclusive();
    let (bin, _) = fs_program();
    let rec = workdir().join("fs.laser");
    let o = laser(&[
        "record",
        "-o",
        rec.to_str().unwrap(),
        "--",
        bin.to_str().unwrap(),
        "1.5",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = workdir().join("report.json");
    let o = laser(&[
        "report",
        "--threshold",
        LOW,
        "--json",
        out.to_str().unwrap(),
        rec.to_str().unwrap(),
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert_finds_counters(&json(&out), &t);

    // Cut the recording in half: a warning, the first half analysed, no failure.
    let bytes = std::fs::read(&rec).unwrap();
    let cut = workdir().join("cut.laser");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let o = laser(&["report", cut.to_str().unwrap()]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("truncated"),
        "{t}"
    );

    // Not a recording at all: a clear error, exit 1.
    let o = laser(&["report", bin.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a laser recording"));
}

#[test]
fn attach_monitors_a_running_process_for_a_duration() {
    let _serial = exclusive();
    let (bin, _) = fs_program();
    let mut child = Command::new(bin)
        .arg("4")
        .env("FS_PRINT_PID", "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let pid = child.id().to_string();
    let out = workdir().join("attach.json");
    let o = laser(&[
        "attach",
        "-p",
        &pid,
        "--duration",
        "1.5s",
        "--threshold",
        LOW,
        "--json",
        out.to_str().unwrap(),
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert_finds_counters(&json(&out), &t);
    // The target was left running, unharmed, and finishes normally.
    let status = child.wait().unwrap();
    assert!(status.success());

    let o = laser(&["attach", "-p", "999999999", "--duration", "1s"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("does not exist"));
}

#[test]
fn backends_lists_soft_as_available() {
    let o = laser(&["backends"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(
        s.lines()
            .any(|l| l.starts_with("soft") && l.contains("available")),
        "{t}"
    );
    assert!(s.contains("auto"), "{t}");
}

/// A thread whose debug registers another tool holds is sampled but not watched: `run` and
/// `attach` both go on and say which thread (`attach` used to fail on it with ENOSPC).
#[test]
fn a_thread_whose_debug_registers_are_taken_is_named_and_the_run_goes_on() {
    let _serial = exclusive();
    let bin = compile("debug_registers_taken", DEBUG_REGISTERS_TAKEN_C);
    let taken_note = |report: &serde_json::Value| -> Option<String> {
        report["notes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|n| n.as_str())
            .find(|n| n.contains("debug registers taken"))
            .map(str::to_owned)
    };

    let (o, out) = run_to_json("taken-run.json", &[], &bin, &["1"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let note = taken_note(&json(&out)).unwrap_or_else(|| panic!("no note\n{t}"));
    assert!(note.starts_with("watch: 1 thread(s)"), "{note}");

    let mut child = Command::new(&bin)
        .arg("3")
        .env("FS_PRINT_PID", "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = first_line(&mut child);
    let (o, out) = attach_to_json("taken-attach.json", &pid, "1s");
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let note = taken_note(&json(&out)).unwrap_or_else(|| panic!("no note\n{t}"));
    assert!(
        note.contains(&format!("T{pid}")),
        "the main thread is named: {note}"
    );
    assert!(
        child.wait().unwrap().success(),
        "the target finishes normally"
    );
}

/// The trap guard keeps the SIGTRAP of a lost debug exception (forged here, in a thread
/// created after the launch) from the program, says so in the report, and changes nothing
/// else: the program's own int1 reaches its handler, and a stop and continue work as without
/// laser. Without watchpoints there is no guard, and the same trap kills the program.
#[test]
fn the_trap_guard_keeps_only_a_lost_debug_trap_from_the_program() {
    let _serial = exclusive();
    let bin = compile("lost_debug_trap", LOST_DEBUG_TRAP_C);
    let guard_note =
        |report: &serde_json::Value| note_starting(report, "trap guard:").map(str::to_owned);

    let (o, out) = run_to_json("trap-forge.json", &[], &bin, &["forge"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("alive handled 0"), "{t}");
    let note = guard_note(&json(&out)).unwrap_or_else(|| panic!("no guard note\n{t}"));
    assert!(note.starts_with("trap guard: kept 1 SIGTRAP(s)"), "{note}");

    // Past the thread creations the guard stops for, a new thread is seized as laser reads
    // its creation.
    let (o, out) = run_to_json("trap-churn.json", &[], &bin, &["churn"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let note = guard_note(&json(&out)).unwrap_or_else(|| panic!("no guard note\n{t}"));
    assert!(note.starts_with("trap guard: kept 1 SIGTRAP(s)"), "{note}");

    let (o, out) = run_to_json("trap-int1.json", &[], &bin, &["int1"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(
        t.contains("alive handled 1"),
        "the program's own int1 is passed on\n{t}"
    );
    assert_eq!(guard_note(&json(&out)), None, "{t}");

    let (o, _) = run_to_json("trap-stop.json", &[], &bin, &["stop"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("alive handled 0"), "{t}");

    // A program another tracer holds cannot be guarded: no windows, a note, no harm.
    let mut child = Command::new(&bin)
        .arg("traced")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let line = first_line(&mut child);
    let pid = line.strip_prefix("traced ").expect("traced PID");
    let (o, out) = attach_to_json("trap-traced.json", pid, "0.5");
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let report = json(&out);
    let off =
        note_starting(&report, "watch windows: off").unwrap_or_else(|| panic!("no note\n{t}"));
    assert!(off.contains("PTRACE_SEIZE"), "{off}");
    assert!(child.wait().unwrap().success());

    // The premise: unguarded, the forged trap kills (laser passes on 128 + SIGTRAP).
    let (o, _) = run_to_json(
        "trap-unguarded.json",
        &["--watch", "false"],
        &bin,
        &["forge"],
    );
    assert_eq!(o.status.code(), Some(128 + 5), "{}", text(&o));
}
