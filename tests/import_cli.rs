//! `laser import` end to end on the perf.data fixtures of laser-driver/tests/fixtures/perf_data
//! (two crafted memory-sample files and one `perf record` of the golden `fs` program), and
//! the clean refusal of `--backend pebs|ibs` on a machine without the hardware.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const LASER: &str = env!("CARGO_BIN_EXE_laser");

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn golden() -> String {
    root().join("tests/fixtures/golden").display().to_string()
}

fn perf_data(name: &str) -> String {
    root()
        .join("laser-driver/tests/fixtures/perf_data")
        .join(name)
        .display()
        .to_string()
}

/// A scratch directory per test (and process): HOME and build-id caches are ours.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("laser-import-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `laser import --threshold 0 --json … ARGS` with HOME in `home` (no perf build-id cache
/// unless the test makes one) and no PERF_BUILDID_DIR unless `cache` is given.
fn import(home: &Path, cache: Option<&Path>, args: &[&str]) -> (Output, serde_json::Value) {
    let json = home.join("report.json");
    let mut c = Command::new(LASER);
    c.env("HOME", home).env_remove("PERF_BUILDID_DIR");
    if let Some(cache) = cache {
        c.env("PERF_BUILDID_DIR", cache);
    }
    let o = c
        .args(["import", "--threshold", "0", "-q", "--json"])
        .arg(&json)
        // Sources were compiled under /laser-fixture (see tests/fixtures/golden/README.md).
        .args(["--path-map", &format!("/laser-fixture={}", golden())])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (o, j)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// (file, line, op, events) of each source of finding `f`.
fn sources(f: &serde_json::Value) -> Vec<(String, u64, String, u64)> {
    f["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["file"]
                    .as_str()
                    .unwrap_or("")
                    .rsplit('/')
                    .next()
                    .unwrap()
                    .to_string(),
                s["line"].as_u64().unwrap_or(0),
                s["op"].as_str().unwrap().to_string(),
                s["events"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The crafted c2c file through `--path-map` to the binary: the report a live run of `fs`
/// gives — the `counters` line, false sharing, main's and bump_b's lines, the fix — with
/// HITM loads counted at the load period and stores only in the byte map.
#[test]
fn c2c_recording_gives_the_live_report() {
    let home = scratch("c2c");
    let map = format!("/build/app={}", golden());
    let (o, j) = import(
        &home,
        None,
        &["--path-map", &map, &perf_data("fs-c2c-spr.perf.data")],
    );
    assert!(!stderr(&o).contains("warning"), "{}", stderr(&o));
    assert_eq!(j["backend"], "pebs");
    let f = &j["findings"].as_array().unwrap()[..];
    assert_eq!(f.len(), 1, "{j}");
    let f = &f[0];
    assert_eq!(f["kind"], "false_sharing");
    // 30 rounds with two HITM loads each, period 1009; the 20 rounds of L1/forwarded loads
    // add nothing.
    assert_eq!(f["events"], 60 * 1009);
    assert_eq!(f["threads"], serde_json::json!([4000, 4001]));
    assert_eq!(f["data"]["name"], "counters");
    assert_eq!(
        f["data"]["fields"],
        serde_json::json!(["counters.a", "counters.b"])
    );
    let mut s = sources(f);
    s.sort();
    assert_eq!(
        s,
        [
            ("fs.c".into(), 13, "load".into(), 30 * 1009),
            ("fs.c".into(), 13, "store".into(), 0),
            ("fs.c".into(), 22, "load".into(), 30 * 1009),
            ("fs.c".into(), 22, "store".into(), 0),
        ]
    );
    assert!(f["fix"].as_str().unwrap().contains("aligned(64)"), "{f}");
    let notes = j["notes"].to_string();
    assert!(notes.contains("60 HITM"), "{notes}");
}

#[test]
fn ibs_recording_counts_peer_hitm_loads() {
    let home = scratch("ibs");
    let map = format!("/build/app={}", golden());
    let (_, j) = import(
        &home,
        None,
        &["--path-map", &map, &perf_data("fs-mem-zen4-ibs.perf.data")],
    );
    assert_eq!(j["backend"], "ibs");
    let f = &j["findings"][0];
    assert_eq!(
        (f["kind"].as_str(), f["events"].as_u64()),
        (Some("false_sharing"), Some(50 * 1009))
    );
    assert_eq!(f["data"]["name"], "counters");
}

/// No path map: the binary is found in perf's build-id cache by the id the file stores.
#[test]
fn binaries_are_found_by_build_id_in_perfs_cache() {
    let home = scratch("cache");
    let cache = home.join("cache");
    let elf = cache.join(".build-id/b2/c6f7612ad2fbcc7cc8fcb7e69be068864f3f0a/elf");
    std::fs::create_dir_all(elf.parent().unwrap()).unwrap();
    std::fs::copy(root().join("tests/fixtures/golden/fs"), &elf).unwrap();
    let (o, j) = import(&home, Some(&cache), &[&perf_data("fs-c2c-spr.perf.data")]);
    assert!(!stderr(&o).contains("warning"), "{}", stderr(&o));
    let s = sources(&j["findings"][0]);
    assert!(s.iter().any(|s| s.0 == "fs.c" && s.1 == 22), "{s:?}");
}

/// A different binary at the mapped path is not used (its lines would be wrong); a missing
/// one is reported; either way the contended line is still reported, by address.
#[test]
fn wrong_or_missing_binaries_are_named_and_not_used() {
    let home = scratch("wrong");
    let other = home.join("app");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_laser"), other.join("fs")).unwrap();
    let map = format!("/build/app={}", other.display());
    let (o, j) = import(
        &home,
        None,
        &["--path-map", &map, &perf_data("fs-c2c-spr.perf.data")],
    );
    assert!(
        stderr(&o).contains("is not the binary the recording names"),
        "{}",
        stderr(&o)
    );
    let f = &j["findings"][0];
    assert_eq!(f["events"], 60 * 1009);
    assert!(sources(f).iter().all(|s| s.0.is_empty()), "{f}");

    let (o, j) = import(&home, None, &[&perf_data("fs-c2c-spr.perf.data")]);
    let e = stderr(&o);
    assert!(
        e.contains("/build/app/fs (build-id b2c6f761") && e.contains("not on this machine"),
        "{e}"
    );
    assert_eq!(j["findings"][0]["events"], 60 * 1009);
}

/// The file recorded here with `perf record -e cpu-clock --user-regs`: timer samples whose
/// registers give exact data addresses, as the soft backend's do — the same false sharing a
/// live `laser run` of `fs` reports.
#[test]
fn recorded_timer_samples_find_the_false_sharing() {
    let home = scratch("recorded");
    let map = format!("/work/wt14={}", root().display());
    let (_, j) = import(
        &home,
        None,
        &["--path-map", &map, &perf_data("fs-cpu-clock.perf.data")],
    );
    assert_eq!(j["backend"], "soft");
    assert!(j["samples"].as_u64().unwrap() > 100, "{j}");
    let f = &j["findings"][0];
    assert_eq!(f["kind"], "false_sharing", "{j}");
    assert_eq!(f["data"]["name"], "counters");
    let s = sources(f);
    assert!(s.iter().any(|s| s.0 == "fs.c" && s.1 == 13), "{s:?}");
    assert!(s.iter().any(|s| s.0 == "fs.c" && s.1 == 22), "{s:?}");
}

#[test]
fn garbage_is_an_error_not_a_panic() {
    let home = scratch("garbage");
    let p = home.join("garbage.data");
    std::fs::write(&p, b"PERFILE2\x68\0\0\0\0\0\0\0 definitely not the rest").unwrap();
    let o = Command::new(LASER)
        .args(["import"])
        .arg(&p)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("perf.data header is damaged"),
        "{}",
        stderr(&o)
    );
}

fn has_core_pmu() -> bool {
    ["cpu", "cpu_core"]
        .iter()
        .any(|p| Path::new("/sys/bus/event_source/devices").join(p).exists())
}

/// `--backend pebs|ibs` stops before the program runs, naming what is missing. (Live
/// PEBS/IBS sessions are not wired, so this holds on PMU machines too; the messages checked
/// are those of a machine without one, like every machine of this project.)
#[test]
fn precise_backends_refuse_before_running_the_program() {
    let home = scratch("refuse");
    for (backend, want) in [("pebs", "no core PMU"), ("ibs", "ibs_op does not exist")] {
        let marker = home.join(format!("ran-{backend}"));
        let o = Command::new(LASER)
            .args(["run", "--backend", backend, "--", "touch"])
            .arg(&marker)
            .output()
            .unwrap();
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{e}");
        assert!(!marker.exists(), "{backend}: the program ran");
        if !has_core_pmu() {
            assert!(e.contains(want) && e.contains("--backend soft"), "{e}");
        }
    }
    let o = Command::new(LASER).arg("backends").output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.lines()
            .any(|l| l.starts_with("pebs") && l.contains("unavailable")),
        "{out}"
    );
    if !has_core_pmu() {
        let auto = out.lines().find(|l| l.starts_with("auto")).unwrap();
        assert!(auto.contains("soft") && auto.contains("no PEBS"), "{auto}");
    }
}
