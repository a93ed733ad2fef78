//! The live view: drawn on a terminal (a pseudo-terminal from util-linux `script`), with
//! samples/s, lost and the top line; absent with `--quiet` and when stderr is not a terminal.

mod c_run;

use std::path::Path;
use std::process::Command;

use c_run::{compile, temp_dir, LASER};

/// Runs `laser ARGS -- exe 2` under a pseudo-terminal; returns what the terminal showed.
fn on_terminal(exe: &Path, args: &str) -> String {
    let log = exe.with_extension(format!("tty{}", args.len()));
    let cmd = format!("{LASER} run {args} -- {} 2 >/dev/null", exe.display());
    let st = Command::new("script")
        .args(["-qec", &cmd])
        .arg(&log)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("util-linux `script` gives the test a terminal");
    assert!(st.success());
    String::from_utf8_lossy(&std::fs::read(&log).unwrap()).replace('\r', "\n")
}

#[test]
fn live_view_only_on_a_terminal_and_not_with_quiet() {
    let dir = temp_dir("live-view");
    let exe = compile(&dir, "fs", include_str!("fixtures/golden/fs.c"));
    let shown = on_terminal(&exe, "");
    assert!(
        shown.contains(" samples/s · 0 lost") || shown.contains(" lost"),
        "{shown}"
    );
    assert!(shown.contains(" samples/s · "), "{shown}");
    assert!(
        ["top: false sharing", "top: true sharing", "top: mixed"]
            .iter()
            .any(|t| shown.contains(t)),
        "the top line and its kind\n{shown}"
    );
    let quiet = on_terminal(&exe, "-q");
    assert!(!quiet.contains("samples/s"), "{quiet}");
    // Not a terminal: stderr is a pipe.
    let out = Command::new(LASER)
        .args(["run", "--"])
        .arg(&exe)
        .arg("1")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("samples/s"));
}
