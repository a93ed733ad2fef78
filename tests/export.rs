//! `--pprof` and `--collapsed` read back: the gzipped profile decodes as profile.proto with
//! prost (the vendored generated messages), and its totals, labels and source lines are the
//! report's, computed here from the report's JSON independently of laser's exporter.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;
use std::process::Command;

use prost::Message;

#[path = "../src/export/proto.rs"]
mod proto;

/// Per cache line: events, kind, data name, and the (file, line) of its sources.
type PerLine = BTreeMap<String, (u64, String, String, BTreeSet<(String, i64)>)>;

const LASER: &str = env!("CARGO_BIN_EXE_laser");

#[test]
fn pprof_and_collapsed_profiles_hold_the_reports_events() {
    let report = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gates/two.report.json");
    let dir = std::env::temp_dir().join(format!("laser-export-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (pb, folded) = (dir.join("c.pb.gz"), dir.join("c.folded"));
    let out = Command::new(LASER)
        .args(["report", "-q"])
        .arg(&report)
        .arg("--pprof")
        .arg(&pb)
        .arg("--collapsed")
        .arg(&folded)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();

    // What the report says, per cache line: events, kind, data, and the source lines.
    let mut want = PerLine::new();
    for f in r["findings"].as_array().unwrap() {
        let lines = f["sources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["file"].as_str().unwrap().to_owned(),
                    s["line"].as_i64().unwrap(),
                )
            })
            .collect();
        want.insert(
            f["line_addr"].as_str().unwrap().to_owned(),
            (
                f["events"].as_u64().unwrap(),
                f["kind"].as_str().unwrap().to_owned(),
                f["data"]["name"].as_str().unwrap().to_owned(),
                lines,
            ),
        );
    }

    let gz = std::fs::read(&pb).unwrap();
    assert_eq!(&gz[..2], &[0x1f, 0x8b], "gzip");
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut raw)
        .unwrap();
    let p = proto::Profile::decode(&raw[..]).expect("a profile.proto message");
    let s = |i: i64| p.string_table[i as usize].as_str();
    assert_eq!(s(0), "");
    assert_eq!(
        (s(p.sample_type[0].ty), s(p.sample_type[0].unit)),
        ("contention", "count")
    );
    let mut got = PerLine::new();
    for sample in &p.sample {
        let label = |k: &str| {
            sample
                .label
                .iter()
                .find(|l| s(l.key) == k)
                .map(|l| s(l.str).to_owned())
                .unwrap_or_else(|| panic!("no {k} label: {sample:?}"))
        };
        let e = got.entry(label("cache_line")).or_default();
        e.0 += sample.value[0] as u64;
        e.1 = label("kind");
        e.2 = label("data");
        // The leaf location's innermost line: the contending source line.
        let leaf = p
            .location
            .iter()
            .find(|l| l.id == sample.location_id[0])
            .unwrap();
        let line = &leaf.line[0];
        let func = p
            .function
            .iter()
            .find(|f| f.id == line.function_id)
            .unwrap();
        e.3.insert((s(func.filename).to_owned(), line.line));
    }
    assert_eq!(got, want, "pprof per cache line vs the report");

    // Collapsed stacks: the same total, and each line `stack count`.
    let text = std::fs::read_to_string(&folded).unwrap();
    let total: u64 = text
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    assert_eq!(total, want.values().map(|w| w.0).sum::<u64>(), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("bump_b fs.c:13;[false_sharing counters] ")),
        "{text}"
    );
}
