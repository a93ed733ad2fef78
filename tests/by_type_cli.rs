//! `--by type` / `--by field` on the command line: the views replace the per-line text report
//! on stdout, and a saved report made before typed accesses existed still renders (with no
//! types). The views' content is golden-tested in laser-detect (`tests/by_type_golden.rs`).

use std::path::Path;
use std::process::Command;

const LASER: &str = env!("CARGO_BIN_EXE_laser");

fn report(view: &str) -> String {
    let saved = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gates/two.report.json");
    let out = Command::new(LASER)
        .args(["report", "--by", view])
        .arg(&saved)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn by_views_replace_the_text_report_on_a_saved_report() {
    let types = report("type");
    assert!(
        types.starts_with("laser data profile: 0 types with contended accesses"),
        "{types}"
    );
    assert!(!types.contains("byte map"), "{types}");
    let fields = report("field");
    assert!(
        fields.starts_with("laser contended fields: 0 members of 0 types"),
        "{fields}"
    );
    let bad = Command::new(LASER)
        .args(["report", "--by", "line", "x.json"])
        .output()
        .unwrap();
    assert_eq!(
        bad.status.code(),
        Some(2),
        "an unknown view is a usage error"
    );
}
