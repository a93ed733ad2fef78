//! `laser diff` on two real runs of the same program: ASLR puts every address somewhere else
//! the second time, and the findings must still match one to one.

mod c_run;

use std::process::Command;

use c_run::{compile, temp_dir, LASER};

#[test]
fn two_runs_of_one_program_match_one_to_one_despite_aslr() {
    let dir = temp_dir("diff-runs");
    let exe = compile(&dir, "fs", include_str!("fixtures/golden/fs.c"));
    let mut reports = Vec::new();
    for i in 0..2 {
        let json = dir.join(format!("run{i}.json"));
        // 100 ev/s: a busy 2-CPU runner can really halve the contention (see tests/cli.rs).
        let out = Command::new(LASER)
            .args(["run", "-q", "--threshold", "100", "--json"])
            .arg(&json)
            .arg("--")
            .arg(&exe)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        reports.push(json);
    }
    let read = |p: &std::path::Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    };
    let (a, b) = (read(&reports[0]), read(&reports[1]));
    let line = |r: &serde_json::Value| {
        r["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["data"]["name"] == "counters")
            .map(|f| f["line_addr"].clone())
    };
    assert!(line(&a).is_some() && line(&b).is_some(), "{a:#}\n{b:#}");
    // PIE + ASLR: the line's run-time address differs, so matching cannot be by address.
    assert_ne!(line(&a), line(&b));
    let out = Command::new(LASER)
        .arg("diff")
        .args(&reports)
        .args([
            "--format",
            "json",
            "--fail-on",
            "new.findings > 0 || gone.findings > 0",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let d: serde_json::Value = serde_json::from_str(&text).unwrap();
    let counters: Vec<&serde_json::Value> = d["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["data"] == "counters")
        .collect();
    assert_eq!(counters.len(), 1, "one entry for both runs' line\n{text}");
    let e = counters[0];
    assert!(
        !["new", "gone"].contains(&e["status"].as_str().unwrap()),
        "matched\n{text}"
    );
    assert!(e["base"]["index"].is_u64() && e["new"]["index"].is_u64());
    // Everything each run found at a real rate is matched: nothing new or gone above
    // 1,000/s (below that a busy runner's noise may come and go).
    for e in d["entries"].as_array().unwrap() {
        let side = if e["status"] == "new" {
            &e["new"]
        } else {
            &e["base"]
        };
        if matches!(e["status"].as_str(), Some("new" | "gone")) {
            assert!(
                side["rate_per_s"].as_f64().unwrap() < 1000.0,
                "{e:#}\n{text}"
            );
        }
    }
}
