//! A synthetic PEBS stream through the whole pipeline: for asm-tests with loads among their
//! contending instructions, a perf.data file (as `perf c2c record` would write it on an Intel
//! part) of HITM load samples and store samples at the tests' labelled instructions and
//! shared bytes, imported with `laser import`, must give each test's manifest answer: the
//! kind, the contending source lines (file:line from DWARF of the built test), their ops and
//! bytes, the threads — for position-independent builds and a statically linked one. Stands
//! in for PEBS hardware, which no machine here has.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use laser_driver::import::craft::{CraftAttr, PerfDataWriter};
use laser_driver::import::sample::{bits, RawSample, SampleLayout};
use serde_json::Value;

const LASER: &str = env!("CARGO_BIN_EXE_laser");
/// Where the PIE tests are "loaded"; static (ET_EXEC) ones run at their link addresses.
const PIE_BASE: u64 = 0x5610_0000_0000;
const PID: u32 = 6000;
const LOAD_PERIOD: u64 = 19; // the LASER paper's sample-after value
const STORE_PERIOD: u64 = 10007;
const ROUNDS: u64 = 40;
/// Intel `pebs_data_source[0x07]`: L3 hit, snoop HITM.
const LOCAL_HITM: u64 = 0x6_0080_0842;
/// The same with the lock bit (the load half of a locked RMW).
const LOCKED_HITM: u64 = LOCAL_HITM | (0x02 << 24);
/// Intel store: OP_STORE | L1 hit.
const STORE: u64 = 0x4 | (0x0a << 5);

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn run(c: &mut Command) -> String {
    let o = c.output().unwrap_or_else(|e| panic!("{c:?}: {e}"));
    assert!(
        o.status.success(),
        "{c:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Generates the asm-tests into `dir` (not asm-tests/build, which other suites build in) and
/// builds `names` there.
fn build(dir: &Path, names: &[&str]) {
    run(Command::new("python3").arg("-c").arg(format!(
        "import sys; sys.path.insert(0, {:?}); import gen; gen.BUILD = {:?}; gen.generate(write=True)",
        root().join("asm-tests").display().to_string(),
        dir.display().to_string()
    )));
    run(Command::new("gcc")
        .args(["-g", "-O2", "-pthread", "-c"])
        .arg(root().join("asm-tests/harness.c"))
        .arg("-o")
        .arg(dir.join("harness.o")));
    for n in names {
        run(Command::new("gcc")
            .args(["-g", "-pthread"])
            .arg(dir.join(format!("{n}.S")))
            .arg(dir.join("harness.o"))
            .arg("-o")
            .arg(dir.join(n)));
    }
    // One statically linked copy: no libraries, linked at a fixed address.
    run(Command::new("gcc")
        .args(["-g", "-pthread", "-static"])
        .arg(dir.join(format!("{}.S", names[0])))
        .arg(dir.join("harness.o"))
        .arg("-o")
        .arg(dir.join(format!("{}-static", names[0]))));
}

fn symbols(bin: &Path) -> Vec<(String, u64)> {
    run(Command::new("nm").arg(bin))
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let a = u64::from_str_radix(f.next()?, 16).ok()?;
            let _kind = f.next()?;
            Some((f.next()?.to_string(), a))
        })
        .collect()
}

/// (vaddr, memsz, offset, prot) of each PT_LOAD, from `readelf -lW`.
fn loads(bin: &Path) -> Vec<(u64, u64, u64, u32)> {
    run(Command::new("readelf").arg("-lW").arg(bin))
        .lines()
        .filter(|l| l.trim_start().starts_with("LOAD"))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let h = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
            let flags = &f[6..f.len() - 1].concat();
            let prot = u32::from(flags.contains('R'))
                | if flags.contains('W') { 2 } else { 0 }
                | if flags.contains('E') { 4 } else { 0 };
            (h(f[2]), h(f[5]), h(f[1]), prot)
        })
        .collect()
}

fn mem_attr(name: &str, config: u64, config1: u64, period: u64, id: u64) -> CraftAttr {
    CraftAttr {
        name: name.into(),
        type_: 4,
        config,
        config1,
        sample_period: period,
        precise_ip: 3,
        layout: SampleLayout {
            sample_type: bits::IDENTIFIER
                | bits::IP
                | bits::TID
                | bits::TIME
                | bits::ADDR
                | bits::CPU
                | bits::PERIOD
                | bits::WEIGHT
                | bits::DATA_SRC,
            ..Default::default()
        },
        ids: vec![id],
    }
}

/// Writes the c2c-style recording of `test` and returns it with the expected event count.
fn craft(test: &Value, bin: &Path) -> (Vec<u8>, u64) {
    let pie = run(Command::new("readelf").arg("-h").arg(bin)).contains("DYN (");
    let base = if pie { PIE_BASE } else { 0 };
    let syms = symbols(bin);
    let sym = |n: &str| {
        syms.iter()
            .find(|s| s.0 == n)
            .unwrap_or_else(|| panic!("{n}"))
            .1
    };
    let shared = base + sym("asmtest_shared");
    let path = bin.display().to_string();
    let mut w = PerfDataWriter::default();
    let loads_ix = w.attr(mem_attr(
        "cpu/mem-loads,ldlat=30/P",
        0x1cd,
        30,
        LOAD_PERIOD,
        1,
    ));
    let stores_ix = w.attr(mem_attr("cpu/mem-stores/P", 0x82d0, 0, STORE_PERIOD, 2));
    w.pmu(4, "cpu");
    w.comm(PID, PID, 1, "asmtest", true);
    for (vaddr, memsz, offset, prot) in loads(bin) {
        let start = vaddr & !0xfff;
        let end = (vaddr + memsz + 0xfff) & !0xfff;
        w.mmap2(
            PID,
            1,
            base + start,
            end - start,
            offset & !0xfff,
            prot,
            &path,
        );
    }
    let contending = test["contending"].as_array().unwrap();
    let (mut t, mut expected, mut prev_writer) = (10u64, 0u64, None::<u64>);
    for _ in 0..ROUNDS {
        for c in contending {
            let thread = c["thread"].as_u64().unwrap();
            let op = c["op"].as_str().unwrap();
            let (attr, data_src, period) = match op {
                "store" => (stores_ix, STORE, STORE_PERIOD),
                "load" => (loads_ix, LOCAL_HITM, LOAD_PERIOD),
                "rmw" => (loads_ix, LOCKED_HITM, LOAD_PERIOD),
                o => panic!("{o}"),
            };
            // A HITM access counts when the line's last access was another thread's write.
            if op != "store" && prev_writer.is_some_and(|p| p != thread) {
                expected += LOAD_PERIOD;
            }
            prev_writer = Some(thread);
            t += 1000;
            w.sample(
                attr,
                &RawSample {
                    ip: Some(base + sym(c["label"].as_str().unwrap())),
                    pid: Some(PID),
                    tid: Some(PID + thread as u32),
                    time: Some(t),
                    addr: Some(shared + c["offset"].as_u64().unwrap()),
                    cpu: Some(thread as u32),
                    period: Some(period),
                    weight: Some(90),
                    data_src: Some(data_src),
                    ..Default::default()
                },
            );
        }
    }
    w.finished_round();
    (w.finish(), expected)
}

#[test]
fn pebs_hitm_streams_give_the_asm_tests_expected_reports() {
    let names = [
        "rw_false_s8",
        "rw_true_s4",
        "xadd_vs_load_true",
        "t3_rw_false_s8",
    ];
    let dir = std::env::temp_dir().join(format!("laser-pebs-synth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    build(&dir, &names);
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("asm-tests/manifest.json")).unwrap(),
    )
    .unwrap();
    let with_static = format!("{}-static", names[0]);
    for bin_name in names.iter().copied().chain([with_static.as_str()]) {
        let name = bin_name.trim_end_matches("-static");
        let test = manifest["tests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap();
        let bin = dir.join(bin_name);
        let (bytes, expected_events) = craft(test, &bin);
        let data = dir.join(format!("{bin_name}.perf.data"));
        std::fs::write(&data, bytes).unwrap();
        let json = dir.join(format!("{bin_name}.json"));
        run(Command::new(LASER)
            .env("HOME", &dir)
            .env_remove("PERF_BUILDID_DIR")
            .args(["import", "-q", "--threshold", "0", "--json"])
            .arg(&json)
            .arg(&data));
        let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(r["backend"], "pebs", "{name}");
        let f = r["findings"].as_array().unwrap();
        assert_eq!(f.len(), 1, "{name}: {r}");
        let f = &f[0];
        assert_eq!(f["kind"], test["expected_kind"], "{name}: {f}");
        assert_eq!(f["events"], expected_events, "{name}");
        assert_eq!(
            f["threads"].as_array().unwrap().len() as u64,
            test["threads"].as_u64().unwrap(),
            "{name}"
        );
        // Every contending instruction of the manifest, at its file:line, with its op and
        // bytes — and nothing else.
        let want: BTreeSet<(String, u64, String, Vec<u64>)> = test["contending"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                let (o, s) = (c["offset"].as_u64().unwrap(), c["size"].as_u64().unwrap());
                (
                    c["file"].as_str().unwrap().to_string(),
                    c["line"].as_u64().unwrap(),
                    c["op"].as_str().unwrap().to_string(),
                    (o..o + s).collect(),
                )
            })
            .collect();
        let got: BTreeSet<(String, u64, String, Vec<u64>)> = f["sources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["file"]
                        .as_str()
                        .unwrap()
                        .rsplit('/')
                        .next()
                        .unwrap()
                        .to_string(),
                    s["line"].as_u64().unwrap(),
                    s["op"].as_str().unwrap().to_string(),
                    s["offsets"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_u64().unwrap())
                        .collect(),
                )
            })
            .collect();
        assert_eq!(got, want, "{name}");
        assert_eq!(f["data"]["name"], "asmtest_shared", "{name}: {f}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
