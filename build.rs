//! Builds laser's allocation recorder (`shim/laser_alloc.c`), a small shared library `laser
//! run` preloads into the program it launches; the binary embeds it (`src/alloc_shim.rs`).
//! It is C because it replaces malloc: Rust's std allocates through malloc itself. It is
//! compiled with the system C compiler (`$CC`, else `cc`), which laser's tests need anyway;
//! no crate is added for one command.

use std::path::PathBuf;
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
}
