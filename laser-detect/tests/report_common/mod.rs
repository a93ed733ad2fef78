//! Shared by the report tests: compile `fixtures/lr.c` with gcc at test time, read its real
//! symbols and line table with binutils (an oracle independent of our DWARF code), and build
//! synthetic analyses whose addresses are the program's own.
#![allow(dead_code)] // each test binary uses a different part

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use iced_x86::{Decoder, DecoderOptions, OpKind};
use laser_detect::naming::symbolize::Symbolizer;
use object::{Object, ObjectSection};

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
    build_with(
        tag,
        "lr.c",
        "lr",
        &[
            "gcc",
            "-g",
            "-O0",
            "-fno-toplevel-reorder",
            "-pthread",
            "-o",
            "lr",
            "lr.c",
        ],
    )
}

/// Copies `fixtures/<source>` into a fresh directory named `tag` and runs `cmd` there, with
/// `-fdebug-prefix-map` (gcc/g++) or `--remap-path-prefix` (rustc) mapping it to `/src`.
pub fn build_with(tag: &str, source: &str, exe: &str, cmd: &[&str]) -> Built {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("report-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(fixture(source), dir.join(source)).unwrap();
    let remap = if cmd[0] == "rustc" {
        format!("--remap-path-prefix={}={SRC}", dir.display())
    } else {
        format!("-fdebug-prefix-map={}={SRC}", dir.display())
    };
    run(Command::new(cmd[0])
        .current_dir(&dir)
        .args(&cmd[1..])
        .arg(remap));
    Built {
        exe: dir.join(exe),
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

    fn exe_name(&self) -> String {
        self.exe.file_name().unwrap().to_string_lossy().into_owned()
    }

    /// Symbol addresses from `nm` (raw names).
    pub fn nm(&self) -> HashMap<String, u64> {
        self.tool("nm", &[&self.exe_name()])
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
            .tool("nm", &[&self.exe_name()])
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

    /// Line → instruction addresses of `lr.c`, from `readelf --debug-dump=decodedline`.
    pub fn line_table(&self) -> BTreeMap<u32, Vec<u64>> {
        self.line_table_of("lr.c")
    }

    /// Line → instruction addresses of source file `file`.
    pub fn line_table_of(&self, file: &str) -> BTreeMap<u32, Vec<u64>> {
        let mut out: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        let exe = self.exe_name();
        for l in self
            .tool("readelf", &["--debug-dump=decodedline", &exe])
            .lines()
        {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() >= 3 && f[0] == file {
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
    marker_in("lr.c", &format!("/* @{name} */"))
}

/// Line number of the first line of fixture `file` containing `tag`.
pub fn marker_in(file: &str, tag: &str) -> u32 {
    let text = std::fs::read_to_string(fixture(file)).unwrap();
    let idx = text
        .lines()
        .position(|l| l.contains(tag))
        .unwrap_or_else(|| panic!("no marker {tag} in {file}"));
    idx as u32 + 1
}

/// Compares with `fixtures/<name>`, or writes it when `LASER_BLESS=1`.
pub fn golden(name: &str, actual: &str) {
    let path = fixture(name);
    if std::env::var("LASER_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with LASER_BLESS=1 to create it",
            path.display()
        )
    });
    if expected != actual {
        let diff: Vec<String> = expected
            .lines()
            .zip(actual.lines())
            .enumerate()
            .filter(|(_, (e, a))| e != a)
            .take(5)
            .map(|(i, (e, a))| format!("line {}:\n  expected: {e}\n  actual:   {a}", i + 1))
            .collect();
        panic!(
            "{name} differs from the golden ({} vs {} lines); first differences:\n{}\n\
             If the change is intended, rerun with LASER_BLESS=1 and review the diff.",
            expected.lines().count(),
            actual.lines().count(),
            diff.join("\n")
        );
    }
}

/// Addresses of the instructions with a memory operand (not push/pop) whose line-table row
/// is `line` of `file`, in executable `exe` of `b`.
pub fn line_instructions(b: &Built, exe: &str, file: &str, line: u32) -> Vec<u64> {
    let mut rows: Vec<(u64, String, u32)> = Vec::new();
    for l in b
        .tool("readelf", &["--debug-dump=decodedline", exe])
        .lines()
    {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() >= 3 {
            if let (Ok(n), Some(a)) = (f[1].parse::<u32>(), f[2].strip_prefix("0x")) {
                if let Ok(a) = u64::from_str_radix(a, 16) {
                    rows.push((a, f[0].to_string(), n));
                }
            }
        }
    }
    rows.sort();
    let bytes = std::fs::read(b.dir.join(exe)).unwrap();
    let obj = object::File::parse(&*bytes).unwrap();
    let text = obj.section_by_name(".text").unwrap();
    let (base, data) = (text.address(), text.data().unwrap());
    let mut out = Vec::new();
    for w in rows.windows(2) {
        let ((start, f, n), (end, ..)) = (&w[0], &w[1]);
        if f != file || *n != line || end <= start || *start < base {
            continue;
        }
        let lo = (start - base) as usize;
        let hi = ((end - base) as usize).min(data.len());
        let mut d = Decoder::with_ip(64, &data[lo..hi], *start, DecoderOptions::NONE);
        while d.can_decode() {
            let i = d.decode();
            if (0..i.op_count()).any(|k| i.op_kind(k) == OpKind::Memory)
                && !i.is_stack_instruction()
            {
                out.push(i.ip());
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// A one-second soft-backend analysis of `samples` timer samples holding `findings`, with
/// nothing lost, filtered or noted and no modules: what the report tests build reports from.
pub fn soft_analysis(
    samples: u64,
    findings: Vec<laser_detect::LineFinding>,
) -> laser_detect::Analysis {
    laser_detect::Analysis {
        backend: laser_driver::BackendKind::Soft,
        duration_s: 1.0,
        samples,
        lost: 0,
        throttles: 0,
        filtered: 0,
        line_size: 64,
        findings,
        modules: vec![],
        notes: vec![],
        survey: None,
        concurrency: None,
    }
}
