//! Shared by the tests that compile a small C program and run it under `laser run --json`.
#![allow(dead_code)] // each test binary uses a different part

use std::path::{Path, PathBuf};
use std::process::Command;

pub const LASER: &str = env!("CARGO_BIN_EXE_laser");

/// A private temp directory for one test process.
pub fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("laser-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes `source` to `dir/name.c` and builds `dir/name` with `gcc -O2 -g -pthread`.
pub fn compile(dir: &Path, name: &str, source: &str) -> PathBuf {
    compile_opt(dir, name, source, "-O2")
}

/// [`compile`] at optimization level `opt` (`-O0`, `-O2`).
pub fn compile_opt(dir: &Path, name: &str, source: &str, opt: &str) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    let exe = dir.join(name);
    std::fs::write(&src, source).unwrap();
    let out = Command::new("gcc")
        .args([opt, "-g", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("gcc runs (this test builds its C program)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// What `laser run --threshold 1 --json` printed and wrote for `exe`.
pub struct Run {
    pub stdout: String,
    /// stdout and stderr, for assertion messages.
    pub ctx: String,
    pub report: serde_json::Value,
}

/// Runs `exe` under `laser run --threshold 1 --json`, asserting that laser succeeded.
pub fn laser_run(exe: &Path) -> Run {
    let json = exe.with_extension("json");
    let out = Command::new(LASER)
        .args(["run", "--threshold", "1", "--json"])
        .arg(&json)
        .arg("--")
        .arg(exe)
        .output()
        .expect("laser runs");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let ctx = format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{ctx}");
    let report = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    Run {
        stdout,
        ctx,
        report,
    }
}
