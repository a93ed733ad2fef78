//! Shared by the report tests: compile `fixtures/lr.c` with gcc at test time, read its real
//! symbols and line table with binutils (an oracle independent of our DWARF code), and build
//! synthetic analyses whose addresses are the program's own.
#![allow(dead_code)] // each test binary uses a different part

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use laser_detect::symbolize::Symbolizer;

/// Where the compiled program claims to live: `-fdebug-prefix-map` rewrites the build
/// directory to this, and analyses name the module by it, so output never shows a temp path.
pub const SRC: &str = "/src";
pub const MODULE: &str = "/src/lr";
/// Load bias of a typical PIE, for run-time addresses.
pub const BIAS: u64 = 0x5555_5555_4000;

pub struct Built {
    pub dir: PathBuf,
    pub exe: PathBuf,
}

fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e} (gcc and binutils are required)"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Compiles `fixtures/lr.c` into a fresh directory named `tag`.
pub fn build(tag: &str) -> Built {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("report-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(fixture("lr.c"), dir.join("lr.c")).unwrap();
    run(Command::new("gcc")
        .current_dir(&dir)
        .args([
            "-g",
            "-O0",
            "-fno-toplevel-reorder",
            "-pthread",
            "-o",
            "lr",
            "lr.c",
        ])
        .arg(format!("-fdebug-prefix-map={}={SRC}", dir.display())));
    Built {
        exe: dir.join("lr"),
        dir,
    }
}

impl Built {
    /// A symbolizer that reads `/src/...` from the build directory and nothing else.
    pub fn symbolizer(&self) -> Symbolizer {
        let dir = self.dir.clone();
        Symbolizer::with_reader(Box::new(move |path: &str| {
            match path.strip_prefix("/src/") {
                Some(rest) => std::fs::read(dir.join(rest)),
                None => Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    path.to_string(),
                )),
            }
        }))
    }

    pub fn tool(&self, prog: &str, args: &[&str]) -> String {
        run(Command::new(prog).current_dir(&self.dir).args(args))
    }

    /// Symbol addresses from `nm`.
    pub fn nm(&self) -> HashMap<String, u64> {
        self.tool("nm", &["lr"])
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let addr = u64::from_str_radix(it.next()?, 16).ok()?;
                let _kind = it.next()?;
                Some((it.next()?.to_string(), addr))
            })
            .collect()
    }

    /// Text symbols from `nm`, sorted by address.
    pub fn text_symbols(&self) -> Vec<(u64, String)> {
        let mut v: Vec<(u64, String)> = self
            .tool("nm", &["lr"])
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let addr = u64::from_str_radix(it.next()?, 16).ok()?;
                let kind = it.next()?;
                (kind == "t" || kind == "T").then(|| (addr, it.next().unwrap_or("").to_string()))
            })
            .collect();
        v.sort();
        v
    }

    /// Line → instruction addresses, from `readelf --debug-dump=decodedline`.
    pub fn line_table(&self) -> BTreeMap<u32, Vec<u64>> {
        let mut out: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for l in self
            .tool("readelf", &["--debug-dump=decodedline", "lr"])
            .lines()
        {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() >= 3 && f[0] == "lr.c" {
                if let (Ok(line), Some(addr)) = (f[1].parse::<u32>(), f[2].strip_prefix("0x")) {
                    if let Ok(addr) = u64::from_str_radix(addr, 16) {
                        out.entry(line).or_default().push(addr);
                    }
                }
            }
        }
        for v in out.values_mut() {
            v.sort();
            v.dedup();
        }
        out
    }
}

/// Line number of the `/* @name */` marker in lr.c.
pub fn marker(name: &str) -> u32 {
    let text = std::fs::read_to_string(fixture("lr.c")).unwrap();
    let tag = format!("/* @{name} */");
    let idx = text
        .lines()
        .position(|l| l.contains(&tag))
        .unwrap_or_else(|| panic!("no marker {tag} in lr.c"));
    idx as u32 + 1
}
