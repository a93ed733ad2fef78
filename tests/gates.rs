//! Golden tests of `--fail-on` gates and `laser diff`, on saved reports (no sampling, so the
//! outputs are exact): every malformed expression's usage error (exit 2, with the column), the
//! verdict lines and exit codes of gates over two fixture reports, and diff matching under a
//! simulated ASLR shift. Regenerate on purpose with `LASER_BLESS=1 cargo test --test gates`.

use std::path::{Path, PathBuf};
use std::process::Command;

const LASER: &str = env!("CARGO_BIN_EXE_laser");

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("laser-gates-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// `exit N`, then stdout and stderr, as one block.
fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(LASER).args(args).output().expect("laser runs");
    let code = out.status.code().unwrap_or(-1);
    let text = format!(
        "$ laser {}\nexit {code}\n{}{}",
        args.iter()
            .map(|a| if a.contains(' ') {
                format!("'{a}'")
            } else {
                a.to_string()
            })
            .collect::<Vec<_>>()
            .join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (code, text)
}

/// Compares `actual` with the golden file, or rewrites it under `LASER_BLESS`.
fn golden(name: &str, actual: &str) {
    let path = fixture("gates").join(name);
    if std::env::var_os("LASER_BLESS").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with LASER_BLESS=1)", path.display()));
    assert!(
        want == actual,
        "{name} differs (if intended: LASER_BLESS=1 cargo test --test gates)\n--- want\n{want}\n--- got\n{actual}"
    );
}

/// The paths in the fixtures' outputs, made stable.
fn scrub(s: &str) -> String {
    s.replace(env!("CARGO_MANIFEST_DIR"), "$ROOT")
}

#[test]
fn malformed_expressions_are_usage_errors_pointing_at_the_column() {
    let report = fixture("gates/two.report.json");
    let report = report.to_str().unwrap();
    let cases: &[(&str, usize)] = &[
        ("false_sharing_rate >> 1000", 21),
        ("false_sharing_rate = 1000", 20),
        ("false_sharing_rate > ", 22),
        ("flase_sharing_rate > 10", 1),
        ("finding.kind == flase_sharing", 17),
        ("finding.kind > 3", 14),
        ("finding.rate > fast", 16),
        ("(findings > 0", 14),
        ("findings > 0 )", 14),
        ("findings > 0 & lost > 0", 14),
        ("findings > 0 findings", 14),
        ("new.findings > 0", 1),
        ("finding.file == \"a.c", 17),
        ("", 1),
        ("finding.function == [abc", 21),
    ];
    let mut all = String::new();
    for &(expr, col) in cases {
        let (code, text) = run(&["report", "-q", report, "--fail-on", expr]);
        assert_eq!(code, 2, "{text}");
        assert!(text.contains(&format!("at column {col}\n")), "{text}");
        // The caret sits under that column (the expression is indented by two spaces).
        let caret = text
            .lines()
            .find(|l| l.trim() == "^")
            .expect("a caret line");
        assert_eq!(caret.len(), col + 2, "{text}");
        all.push_str(&scrub(&text));
        all.push('\n');
    }
    golden("parse_errors.txt", &all);
}

#[test]
fn gates_trip_with_exit_3_name_what_tripped_and_flag_unstable_verdicts() {
    let report = fixture("gates/two.report.json");
    let report = report.to_str().unwrap();
    // (expression, whether it trips, whether it must be flagged UNSTABLE)
    let cases: &[(&[&str], bool, bool)] = &[
        (&["false_sharing_rate > 1000"], true, false),
        (&["false_sharing_rate > 20000"], false, false),
        // 10,770/s from 55 events: 95% 8,275–14,017, so 10,000 could go either way.
        (&["finding.rate > 10000"], true, true),
        (
            &["finding.kind == false_sharing && finding.rate > 13000"],
            false,
            true,
        ),
        (&["true_sharing_rate > 1000"], true, false),
        (&["findings >= 3", "finding.data == heap*"], true, false),
        (
            &["finding.file == queue.c && finding.kind == true_sharing"],
            true,
            false,
        ),
        (
            &["finding.file == */laser-fixture/fs.c && finding.function == bump_?"],
            true,
            false,
        ),
        (&["finding.function == worker*"], false, false),
        (
            &["!(finding.data == counters) && finding.rate > 5000"],
            false,
            false,
        ),
        (&["contention_rate < 100 || lost > 0"], false, false),
        // Irrelevant uncertainty does not make a verdict unstable (Kleene logic).
        (&["findings > 1 || finding.rate > 10000"], true, false),
    ];
    let mut all = String::new();
    for &(exprs, trips, unstable) in cases {
        let mut args = vec!["report", "-q", report];
        for e in exprs {
            args.extend(["--fail-on", e]);
        }
        let (code, text) = run(&args);
        assert_eq!(code, if trips { 3 } else { 0 }, "{text}");
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("laser: gate "))
                .count(),
            exprs.len(),
            "one verdict line per gate\n{text}"
        );
        assert_eq!(text.contains("UNSTABLE"), unstable, "{text}");
        all.push_str(&scrub(&text));
        all.push('\n');
    }
    golden("verdicts.txt", &all);
}

#[test]
fn a_tripped_gate_still_writes_the_report_and_junit() {
    let report = fixture("gates/two.report.json");
    let json = tmp("tripped.json");
    let junit = tmp("tripped.xml");
    let (code, text) = run(&[
        "report",
        "-q",
        report.to_str().unwrap(),
        "--fail-on",
        "finding.kind == true_sharing",
        "--json",
        json.to_str().unwrap(),
        "--junit",
        junit.to_str().unwrap(),
    ]);
    assert_eq!(code, 3, "{text}");
    let back: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(back["findings"].as_array().unwrap().len(), 2);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&json).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "reports hold addresses: owner-only");
    let xml = std::fs::read_to_string(&junit).unwrap();
    golden("junit.xml", &scrub(&xml));
    // Structure a CI reader relies on: 3 cases (1 gate + 2 findings), 2 failures (the gate and
    // the true-sharing finding it tripped on), the `&&`-free name escaped where needed.
    assert!(
        xml.contains(r#"<testsuites name="laser" tests="3" failures="2""#),
        "{xml}"
    );
    assert_eq!(xml.matches("<testcase ").count(), 3);
    assert_eq!(xml.matches("<failure ").count(), 2);
    assert!(xml.contains("name=\"#2 true_sharing on `heap block 0x5577406ab2c0 (24 bytes)`"));
}

#[test]
fn github_format_annotates_each_source_line() {
    let report = fixture("gates/two.report.json");
    let (code, text) = run(&[
        "report",
        report.to_str().unwrap(),
        "--format",
        "github",
        "--fail-on",
        "finding.file == queue.c",
    ]);
    assert_eq!(code, 3, "{text}");
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("::")).collect();
    // counters: fs.c:13 and :22 (warnings); queue.c:40 and :41 (errors: the gate's finding);
    // the tripped gate itself.
    assert!(
        lines.iter().any(|l| l.starts_with(
            "::warning file=/laser-fixture/fs.c,line=13,title=laser%3A false sharing on counters::"
        )),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("::warning file=/laser-fixture/fs.c,line=22,")),
        "{text}"
    );
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with("::error file=/laser-fixture/queue.c,line=4"))
            .count(),
        2,
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l
                .starts_with("::error title=laser gate::gate tripped: finding.file == queue.c")),
        "{text}"
    );
    assert!(
        !text.contains("FALSE SHARING"),
        "github format replaces the text report\n{text}"
    );
    golden("github.txt", &scrub(&text));
}

/// A copy of `report` as another run would write it: every run-time address shifted (ASLR),
/// heap block addresses in names changed, findings in the other order, rates scaled.
fn rerun(report: &Path, scale: &[f64]) -> serde_json::Value {
    let mut r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
    let shift = |v: &mut serde_json::Value| {
        let a = u64::from_str_radix(v.as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
        *v = format!("{:#x}", a + 0x1_2345_6000).into();
    };
    let findings = r["findings"].as_array_mut().unwrap();
    for (f, k) in findings.iter_mut().zip(scale) {
        shift(&mut f["line_addr"]);
        for s in f["sources"].as_array_mut().unwrap() {
            shift(&mut s["pc"]);
        }
        let name = f["data"]["name"]
            .as_str()
            .unwrap()
            .replace("0x5577406ab2c0", "0x55d0c0a01230");
        f["data"]["name"] = name.into();
        let rate = f["rate_per_s"].as_f64().unwrap() * k;
        let events = (f["events"].as_f64().unwrap() * k).round() as u64;
        f["rate_per_s"] = rate.into();
        f["events"] = events.into();
    }
    findings.reverse();
    r
}

#[test]
fn diff_matches_findings_across_aslr_and_classifies_them() {
    let base = fixture("gates/two.report.json");
    // counters x4 (worse beyond both intervals), the heap line unchanged.
    let new = tmp("rerun.json");
    std::fs::write(&new, rerun(&base, &[4.0, 1.0]).to_string()).unwrap();
    let (b, n) = (base.to_str().unwrap(), new.to_str().unwrap());
    let (code, text) = run(&[
        "diff",
        b,
        n,
        "--fail-on",
        "regressed.rate_ratio > 2",
        "--fail-on",
        "new.findings > 0",
    ]);
    assert_eq!(code, 3, "{text}");
    assert!(
        text.contains("0 new, 1 worse, 0 gone, 0 better, 1 unchanged"),
        "{text}"
    );
    assert!(
        text.contains("gate tripped: regressed.rate_ratio > 2"),
        "{text}"
    );
    assert!(text.contains("gate passed: new.findings > 0"), "{text}");
    golden("diff.txt", &scrub(&text).replace(n, "$NEW"));

    let (code, json) = run(&["diff", b, n, "--format", "json"]);
    assert_eq!(code, 0);
    let body = &json[json.find('{').unwrap()..];
    let d: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(d["schema"], "laser-diff/1");
    let entries = d["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "1:1, nothing new or gone\n{body}");
    let worse = &entries[0];
    assert_eq!(worse["status"], "worse");
    assert_eq!(worse["data"], "counters");
    assert!(
        (worse["rate_ratio"].as_f64().unwrap() - 4.0).abs() < 1e-9,
        "{worse}"
    );
    // Base and new sides point at each report's own finding: the order was reversed.
    assert_eq!(
        (
            worse["base"]["index"].as_u64(),
            worse["new"]["index"].as_u64()
        ),
        (Some(0), Some(1))
    );

    // Against itself: everything unchanged; a finding dropped shows as gone / new.
    let (code, text) = run(&[
        "diff",
        b,
        b,
        "--fail-on",
        "worse.findings > 0 || new.findings > 0 || gone.findings > 0",
    ]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("0 new, 0 worse, 0 gone, 0 better, 2 unchanged"),
        "{text}"
    );
    let mut one = rerun(&base, &[1.0, 1.0]);
    one["findings"].as_array_mut().unwrap().remove(0); // the heap line (reversed order)
    let onep = tmp("one.json");
    std::fs::write(&onep, one.to_string()).unwrap();
    let (code, text) = run(&[
        "diff",
        onep.to_str().unwrap(),
        b,
        "--fail-on",
        "new.findings > 0",
    ]);
    assert_eq!(code, 3, "{text}");
    assert!(text.contains("new       true_sharing"), "{text}");
    let (_, text) = run(&["diff", b, onep.to_str().unwrap()]);
    assert!(text.contains("gone      true_sharing"), "{text}");
}

#[test]
fn the_programs_own_failure_wins_over_a_tripped_gate() {
    // `findings >= 0` always trips: what decides the status is precedence alone.
    let gate = ["run", "-q", "--fail-on", "findings >= 0", "--"];
    let with = |prog: &[&str]| {
        let args: Vec<&str> = gate.iter().chain(prog).copied().collect();
        run(&args)
    };
    let (code, text) = with(&["true"]);
    assert_eq!(code, 3, "{text}");
    assert!(
        text.contains("laser: gate tripped: findings >= 0"),
        "{text}"
    );
    let (code, text) = with(&["sh", "-c", "exit 7"]);
    assert_eq!(code, 7, "{text}");
    assert!(
        text.contains("laser: gate tripped"),
        "the verdict is still printed\n{text}"
    );
    let (code, text) = with(&["sh", "-c", "kill -9 $$"]);
    assert_eq!(code, 128 + 9, "{text}");
    let (code, text) = run(&["run", "-q", "--fail-on", "findings > 0", "--", "true"]);
    assert_eq!(code, 0, "{text}");
}

#[test]
fn a_saved_report_keeps_its_threshold_unless_one_is_given() {
    // A report made with --threshold 100 holding a 500 ev/s line.
    let mut low: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("gates/two.report.json")).unwrap())
            .unwrap();
    low["threshold"] = 100.0.into();
    low["findings"][1]["rate_per_s"] = 500.0.into();
    let path = tmp("low.json");
    std::fs::write(&path, low.to_string()).unwrap();
    let r = path.to_str().unwrap();
    // Without --threshold both findings stay (the default 1,000 would drop the 500 ev/s one)…
    let (code, text) = run(&["report", "-q", r, "--fail-on", "findings > 1"]);
    assert_eq!(code, 3, "{text}");
    // …and a threshold given drops lines under it before the gates see the report.
    let (code, text) = run(&[
        "report",
        "-q",
        r,
        "--threshold",
        "5000",
        "--fail-on",
        "findings > 0 && findings < 2",
    ]);
    assert_eq!(code, 3, "{text}");
    assert!(text.contains("findings = 1"), "{text}");
}

#[test]
fn a_pass_on_a_run_whose_threads_barely_overlapped_says_it_could_not_observe() {
    // fs.report.json's run (threads together 18% of the time) with its finding taken out.
    let report = fixture("gates/blind.report.json");
    let report = report.to_str().unwrap();
    let mut all = String::new();
    // (gates, exit, flagged COULD NOT OBSERVE)
    let cases: &[(&[&str], i32, bool)] = &[
        (&["findings > 0"], 0, true),
        (
            &["false_sharing_rate > 1000", "--format", "github"],
            0,
            true,
        ),
        // A CI job can also fail such runs outright.
        (&["findings > 0 || overlap < 0.5"], 3, false),
    ];
    for &(args, code, flagged) in cases {
        let mut a = vec!["report", "-q", report, "--fail-on"];
        a.extend(args);
        let (got, text) = run(&a);
        assert_eq!(got, code, "{text}");
        assert_eq!(text.contains("COULD NOT OBSERVE"), flagged, "{text}");
        all.push_str(&scrub(&text));
        all.push('\n');
    }
    // The two-finding report (no concurrency recorded) passes plainly.
    let two = fixture("gates/two.report.json");
    let (_, text) = run(&[
        "report",
        "-q",
        two.to_str().unwrap(),
        "--fail-on",
        "findings > 5",
    ]);
    assert!(!text.contains("COULD NOT OBSERVE"), "{text}");
    golden("blind.txt", &all);
}

#[test]
fn a_pass_on_a_run_too_short_to_look_says_it_could_not_observe() {
    // Threads side by side (overlap 0.9) but for 0.06 s only: no line could be looked at.
    let report = fixture("gates/short.report.json");
    let (code, text) = run(&[
        "report",
        "-q",
        report.to_str().unwrap(),
        "--fail-on",
        "findings > 0",
    ]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("COULD NOT OBSERVE"), "{text}");
    assert!(text.contains("for only 0.06 s"), "{text}");
    assert!(text.contains("less than the 0.2 s"), "{text}");
}
