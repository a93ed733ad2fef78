//! Shared by the tests that load a real ELF file at a load bias through `ElfCode`.

/// `/proc/PID/maps` lines for the file `path` (its bytes `data`) loaded at `bias`, from its
/// PT_LOAD segments.
pub fn maps_text(path: &str, data: &[u8], bias: u64) -> String {
    use object::{Object, ObjectSegment};
    let f = object::File::parse(data).unwrap();
    let mut s = String::new();
    for seg in f.segments() {
        let (off, _) = seg.file_range();
        let start = (seg.address() & !0xfff) + bias;
        let end = ((seg.address() + seg.size() + 0xfff) & !0xfff) + bias;
        let perms = match seg.flags() {
            // p_flags: PF_X = 1, PF_W = 2, PF_R = 4.
            object::SegmentFlags::Elf { p_flags, .. } => format!(
                "{}{}{}p",
                if p_flags.0 & 4 != 0 { 'r' } else { '-' },
                if p_flags.0 & 2 != 0 { 'w' } else { '-' },
                if p_flags.0 & 1 != 0 { 'x' } else { '-' },
            ),
            _ => "r--p".into(),
        };
        s += &format!(
            "{start:x}-{end:x} {perms} {:08x} 08:01 42 {path}\n",
            off & !0xfff
        );
    }
    s
}

/// Compiles the C source `src` with gcc as a PIE with debug info at `opt` (`-O1`, `-O2`) into
/// a fresh temporary directory named for `tag` and this process; returns the executable.
pub fn gcc_pie(tag: &str, src: &str, opt: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("laser-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("prog.c");
    std::fs::write(&file, src).unwrap();
    let exe = dir.join("prog");
    let out = std::process::Command::new("gcc")
        .args([opt, "-g", "-fPIE", "-pie", "-o"])
        .arg(&exe)
        .arg(&file)
        .output()
        .expect("gcc must be installed for this test (apt-get install gcc)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}
