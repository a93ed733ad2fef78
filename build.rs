//! Builds laser's allocation recorder (`shim/laser_alloc.c`), a small shared library `laser
//! run` preloads into the program it launches; the binary embeds it (`src/alloc_shim.rs`).
//! And the trap guard (`shim/laser_trap_guard.c`), embedded too (`src/trap_guard_exe.rs`).
//! It is C because it replaces malloc: Rust's std allocates through malloc itself. It is
//! compiled with the system C compiler (`$CC`, else `cc`), which laser's tests need anyway;
//! no crate is added for one command.
//!
//! A dynamically linked `laser` (a build without `.cargo/config.toml`'s static flags) is
//! linked with packed relative relocations (`DT_RELR`) where the toolchain and C library
//! support them ([`packs_relative_relocs`]); the static build has no run-time relocations.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let src = "shim/laser_alloc.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=CC");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let so = out.join("liblaser_alloc.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    // Frame pointers: the recorder finds its caller's frame through its own.
    let status = Command::new(&cc)
        .args([
            "-O2",
            "-fPIC",
            "-shared",
            "-fno-omit-frame-pointer",
            "-Wall",
            "-o",
        ])
        .arg(&so)
        .arg(src)
        .arg("-ldl")
        .status()
        .unwrap_or_else(|e| panic!("running the C compiler `{cc}` for {src}: {e}"));
    assert!(status.success(), "`{cc}` failed to build {src}");
    // The trap guard (`src/trap_guard_exe.rs`): a static program on raw system calls, so that
    // starting one beside every watched run costs ~0.1 ms, not a second laser's ~1 ms.
    let guard_src = "shim/laser_trap_guard.c";
    println!("cargo:rerun-if-changed={guard_src}");
    // Its flags, one a line, are shared with laser-driver's live tests, which build it too.
    let guard_flags = "shim/laser_trap_guard.cflags";
    println!("cargo:rerun-if-changed={guard_flags}");
    let flags = std::fs::read_to_string(guard_flags)
        .unwrap_or_else(|e| panic!("reading {guard_flags}: {e}"));
    let guard = out.join("laser_trap_guard");
    let status = Command::new(&cc)
        .args(flags.split_whitespace())
        .arg("-o")
        .arg(&guard)
        .arg(guard_src)
        .status()
        .unwrap_or_else(|e| panic!("running the C compiler `{cc}` for {guard_src}: {e}"));
    assert!(status.success(), "`{cc}` failed to build {guard_src}");
    let features = std::env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
    let static_build = features.split(',').any(|f| f == "crt-static");
    if !static_build && packs_relative_relocs(&cc, &out) {
        println!("cargo:rustc-link-arg-bin=laser=-Wl,-z,pack-relative-relocs");
    }
}

/// Whether a position-independent program linked with `-z pack-relative-relocs` builds and
/// runs here: the linker knows the option (binutils ≥ 2.38) and the dynamic loader applies
/// packed relocations (glibc ≥ 2.36; the linker then makes the program require them, so an
/// older loader refuses it). laser's ~9,700 relative relocations then take 2.5 KB instead of
/// 230 KB, and every `laser run` starts 0.3 ms sooner (benchmarks/RESULTS.md, twenty-eighth
/// session). Elsewhere laser links as before.
fn packs_relative_relocs(cc: &str, out: &Path) -> bool {
    let src = out.join("relr_probe.c");
    let exe = out.join("relr_probe");
    if std::fs::write(&src, "int main(void) { return 0; }\n").is_err() {
        return false;
    }
    let built = Command::new(cc)
        .args(["-fPIE", "-pie", "-Wl,-z,pack-relative-relocs", "-o"])
        .arg(&exe)
        .arg(&src)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    built && Command::new(&exe).status().is_ok_and(|s| s.success())
}
