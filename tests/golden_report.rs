//! Golden-output tests: `laser report` (text and JSON) of a recording kept in the repo must
//! stay byte-identical. Regenerate on purpose with `LASER_BLESS=1` (see the fixture README).

use std::path::{Path, PathBuf};
use std::process::Command;

const LASER: &str = env!("CARGO_BIN_EXE_laser");
/// Where the fixture lived when `fs.laser` was recorded (the paths inside the recording).
const RECORDED_DIR: &str = "/work/main/tests/fixtures/golden";

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/golden")
}

/// Runs `laser report` on the kept recording; returns (stdout, JSON text).
fn report() -> (String, String) {
    let dir = fixture_dir();
    let d = dir.to_str().unwrap();
    let json = std::env::temp_dir().join(format!("laser-golden-{}.json", std::process::id()));
    let out = Command::new(LASER)
        .current_dir(&dir)
        .args(["report", "--json"])
        .arg(&json)
        .args(["--path-map", &format!("{RECORDED_DIR}={d}")])
        .args(["--path-map", &format!("/laser-fixture={d}")])
        // System libraries differ between machines; the golden must not depend on them.
        .args(["--path-map", "/usr/lib=/nonexistent/usr/lib"])
        .args(["--path-map", "/lib=/nonexistent/lib"])
        .arg("fs.laser")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let j = std::fs::read_to_string(&json).unwrap();
    let _ = std::fs::remove_file(&json);
    (text, j)
}

fn check(name: &str, got: &str) {
    let path = fixture_dir().join(name);
    if std::env::var_os("LASER_BLESS").is_some() {
        std::fs::write(&path, got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with LASER_BLESS=1 to create it)",
            path.display()
        )
    });
    if want != got {
        let first = want
            .lines()
            .zip(got.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(want.lines().count().min(got.lines().count()));
        panic!(
            "{name} differs from the golden file at line {}:\n  want: {:?}\n  got:  {:?}\n\
             (if the change is intended: LASER_BLESS=1 cargo test --test golden_report)",
            first + 1,
            want.lines().nth(first),
            got.lines().nth(first)
        );
    }
}

#[test]
fn text_and_json_reports_of_the_kept_recording_match_the_goldens() {
    let (text, json) = report();
    // What the golden must show, independently of its bytes: the line, the kind, the fields.
    assert!(text.contains("FALSE SHARING"), "{text}");
    assert!(
        text.contains("counters.a") && text.contains("counters.b"),
        "{text}"
    );
    assert!(
        text.contains("fs.c:13") && text.contains("fs.c:22"),
        "{text}"
    );
    check("fs.report.txt", &text);
    check("fs.report.json", &json);
}

#[test]
fn rethresholding_a_recording_hides_the_finding_without_losing_it() {
    let dir = fixture_dir();
    let d = dir.to_str().unwrap();
    let out = Command::new(LASER)
        .current_dir(&dir)
        .args(["report", "--threshold", "1e9"])
        .args(["--path-map", &format!("{RECORDED_DIR}={d}")])
        .arg("fs.laser")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(!text.contains("FALSE SHARING"), "{text}");
    assert!(text.contains("1 more below it"), "{text}");
}
