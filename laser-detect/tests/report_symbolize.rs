//! Symbolization and data naming against a C program compiled at test time; the expected
//! addresses and lines come from binutils (`nm`, `readelf`), not from our DWARF code.

mod report_common;

use laser_detect::naming::symbolize::InlinedFrame;
use report_common::{build, marker, MODULE};

#[test]
fn source_line_function_and_inlined_frames() {
    let b = build("sym");
    let lines = b.line_table();
    let mut sym = b.symbolizer();

    let at = lines[&marker("sum_x")][0];
    let loc = sym.symbolize(MODULE, at);
    assert!(loc.debug_info);
    assert_eq!(loc.file.as_deref(), Some("/src/lr.c"));
    assert_eq!(loc.line, Some(marker("sum_x")));
    assert_eq!(loc.function.as_deref(), Some("worker"));
    assert!(loc.inlined.is_empty(), "{:?}", loc.inlined);
    let worker = b.nm()["worker"];
    assert_eq!(loc.symbol, Some(format!("worker+{:#x}", at - worker)));

    // `bump` is always_inline: its body appears twice in worker, once per call site.
    let copies = &lines[&marker("bump")];
    assert!(copies.len() >= 2, "{copies:x?}");
    for (copy, call) in [(copies[0], "bump_a"), (copies[copies.len() - 1], "bump_b")] {
        let loc = sym.symbolize(MODULE, copy);
        assert_eq!(loc.function.as_deref(), Some("bump"));
        assert_eq!(loc.line, Some(marker("bump")));
        assert_eq!(
            loc.inlined,
            vec![InlinedFrame {
                function: Some("worker".into()),
                file: Some("/src/lr.c".into()),
                line: Some(marker(call)),
            }]
        );
    }
    assert_eq!(
        sym.source_line("/src/lr.c", marker("flag")).as_deref(),
        Some("done_flag = 1; /* @flag */")
    );
}

#[test]
fn strip_debug_falls_back_to_elf_symbols() {
    let b = build("strip-debug");
    let lines = b.line_table();
    let worker = b.nm()["worker"];
    b.tool("strip", &["--strip-debug", "lr"]);
    let mut sym = b.symbolizer();
    let at = lines[&marker("sum_x")][0];
    let loc = sym.symbolize(MODULE, at);
    assert!(!loc.debug_info);
    assert_eq!(loc.file, None);
    assert_eq!(loc.line, None);
    assert_eq!(loc.function.as_deref(), Some("worker"));
    assert_eq!(loc.symbol, Some(format!("worker+{:#x}", at - worker)));
    assert_eq!(sym.has_debug_info(MODULE), Some(false));
}

#[test]
fn strip_all_gives_addresses_only_without_failing() {
    let b = build("strip-all");
    let lines = b.line_table();
    let acc = b.nm()["acc"];
    b.tool("strip", &["--strip-all", "lr"]);
    let mut sym = b.symbolizer();
    let loc = sym.symbolize(MODULE, lines[&marker("sum_x")][0]);
    assert!(!loc.debug_info);
    assert_eq!((loc.function, loc.file, loc.symbol), (None, None, None));
    let data = sym.name_data(MODULE, acc, 64, 0xff).unwrap();
    assert!(data.objects.is_empty() && data.spans.is_empty());
}

#[test]
fn separate_debug_file_via_gnu_debuglink() {
    let b = build("debuglink");
    let lines = b.line_table();
    b.tool("objcopy", &["--only-keep-debug", "lr", "lr.debug"]);
    b.tool("strip", &["--strip-debug", "lr"]);
    b.tool("objcopy", &["--add-gnu-debuglink=lr.debug", "lr"]);
    let mut sym = b.symbolizer();
    let loc = sym.symbolize(MODULE, lines[&marker("counter")][0]);
    assert!(loc.debug_info, "debug info from /src/lr.debug");
    assert_eq!(loc.line, Some(marker("counter")));
    // Turned off, the same module has none.
    let mut sym = b.symbolizer();
    sym.set_find_debug_files(false);
    assert!(
        !sym.symbolize(MODULE, lines[&marker("counter")][0])
            .debug_info
    );
}

#[test]
fn data_names_fields_of_struct_arrays_scalars_and_nested_structs() {
    let b = build("data");
    let nm = b.nm();
    let mut sym = b.symbolizer();

    // acc[0].sum_x (bytes 0..8) and acc[1].sum_x (bytes 24..32) of a 24-byte struct array.
    let acc = nm["acc"];
    assert_eq!(acc % 64, 0, "lr.c aligns acc to 64");
    let mask = 0xffu128 | (0xffu128 << 24);
    let d = sym.name_data(MODULE, acc, 64, mask).unwrap();
    assert_eq!(d.fields_for(mask), vec!["acc[0].sum_x", "acc[1].sum_x"]);
    assert_eq!(d.objects.len(), 1);
    assert_eq!(d.objects[0].name, "acc");
    assert_eq!(d.objects[0].type_name.as_deref(), Some("struct acc[4]"));
    assert_eq!(d.objects[0].size, 96);
    assert_eq!(d.objects[0].element, Some(("struct acc".to_string(), 24)));
    // Second line of the array: byte 64 is 16 bytes into acc[2] (which starts at 48).
    let d = sym.name_data(MODULE, acc + 64, 64, 0xff).unwrap();
    assert_eq!(d.fields_for(0xff), vec!["acc[2].n"]);

    // Two adjacent scalars on one line: two objects.
    let (a, bb) = (nm["hits_a"], nm["hits_b"]);
    assert_eq!(
        bb,
        a + 8,
        "lr.c keeps hits_b right after hits_a (-fno-toplevel-reorder)"
    );
    let d = sym.name_data(MODULE, a, 64, 0xffff).unwrap();
    let names: Vec<&str> = d.objects.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["hits_a", "hits_b"]);
    assert_eq!(d.fields_for(0xffff), vec!["hits_a", "hits_b"]);
    assert_eq!(d.objects[0].type_name.as_deref(), Some("long int"));

    // Nested: struct outer { char tag; struct inner { int lo, hi; } in[2]; long total; }.
    let cfg = nm["cfg"];
    let d = sym.name_data(MODULE, cfg, 64, u128::MAX >> 96).unwrap();
    assert_eq!(
        d.fields_for(u128::MAX),
        vec![
            "cfg.tag",
            "cfg.<padding>",
            "cfg.in[0].lo",
            "cfg.in[0].hi",
            "cfg.in[1].lo",
            "cfg.in[1].hi",
            "cfg.total"
        ]
    );
    let hi1 = d.spans.iter().find(|s| s.field == "cfg.in[1].hi").unwrap();
    assert_eq!((hi1.start, hi1.end), (16, 20));
    assert_eq!(d.objects[0].type_name.as_deref(), Some("struct outer"));

    // A volatile int: the qualifier is part of the type name.
    let d = sym.name_data(MODULE, nm["done_flag"], 64, 0xf).unwrap();
    assert_eq!(d.objects[0].type_name.as_deref(), Some("volatile int"));
}

/// Prints how long symbolization and the data index take on a big binary: this test binary
/// itself (Rust, full DWARF of our dependencies). Run with
/// `cargo test -p laser-detect --test report_symbolize -- --ignored --nocapture measure`.
#[test]
#[ignore = "measurement: prints timings, asserts only that lookups succeed"]
fn measure_symbolize_on_this_test_binary() {
    use std::time::Instant;
    let exe = std::env::current_exe().unwrap();
    let path = exe.to_string_lossy().into_owned();
    let bytes = std::fs::read(&exe).unwrap();
    let module = laser_detect::naming::debug_module::DebugModule::parse(&bytes).unwrap();
    let text: Vec<u64> = module
        .symbols
        .iter()
        .filter(|s| s.kind == laser_detect::naming::debug_module::SymKind::Text && s.size > 4)
        .map(|s| s.addr + s.size / 2)
        .collect();
    let data = module
        .symbols
        .iter()
        .find(|s| s.kind == laser_detect::naming::debug_module::SymKind::Data && s.size >= 8)
        .map(|s| s.addr)
        .unwrap();
    let mut sym = laser_detect::Symbolizer::new();
    let t = Instant::now();
    let first = sym.symbolize(&path, text[0]);
    let open = t.elapsed();
    let t = Instant::now();
    let mut with_line = 0;
    for &a in &text {
        with_line += usize::from(sym.symbolize(&path, a).line.is_some());
    }
    let lookups = t.elapsed();
    let t = Instant::now();
    let d = sym.name_data(&path, data & !63, 64, u128::MAX >> 64);
    let index = t.elapsed();
    let t = Instant::now();
    for &a in &text {
        sym.symbolize(&path, a);
    }
    let again = t.elapsed();
    println!(
        "binary {} MB: open+first lookup {:?}; {} lookups {:?} ({:.1} µs each, {} with a line); \
         same again warm {:?}; data index + one line {:?} ({} objects)",
        bytes.len() / 1_000_000,
        open,
        text.len(),
        lookups,
        lookups.as_secs_f64() * 1e6 / text.len() as f64,
        with_line,
        again,
        index,
        d.map_or(0, |d| d.objects.len()),
    );
    assert!(first.debug_info && with_line > text.len() / 2);
}

/// Truncated and corrupted binaries must give partial answers or none, never a panic.
#[test]
fn damaged_binaries_never_panic() {
    let b = build("damaged");
    let lines = b.line_table();
    let nm = b.nm();
    let good = std::fs::read(&b.exe).unwrap();
    let at = lines[&marker("sum_x")][0];
    let mut damaged: Vec<Vec<u8>> = Vec::new();
    for cut in [
        16,
        64,
        1000,
        good.len() / 3,
        good.len() / 2,
        good.len() - 100,
    ] {
        damaged.push(good[..cut].to_vec());
    }
    // Flip bytes through the back half of the file (where the debug sections are).
    for seed in 1..=48u64 {
        let mut bytes = good.clone();
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for _ in 0..64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = good.len() / 2 + (x as usize) % (good.len() / 2);
            bytes[i] ^= (x >> 32) as u8 | 1;
        }
        damaged.push(bytes);
    }
    for bytes in damaged {
        let mut sym =
            laser_detect::Symbolizer::with_reader(Box::new(move |_: &str| Ok(bytes.clone())));
        let _ = sym.symbolize(MODULE, at);
        let _ = sym.symbolize(MODULE, u64::MAX);
        let _ = sym.name_data(MODULE, nm["acc"], 64, u128::MAX);
        let _ = sym.name_data(MODULE, !63, 128, u128::MAX);
    }
}

#[test]
fn separate_debug_file_via_build_id() {
    let b = build("build-id-debug");
    let lines = b.line_table();
    let notes = b.tool("readelf", &["-n", "lr"]);
    let id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("gcc links with --build-id")
        .trim()
        .to_string();
    b.tool("objcopy", &["--only-keep-debug", "lr", "lr.debug"]);
    b.tool("strip", &["--strip-debug", "lr"]);
    // Serve the debug file where distributions install it, without touching /usr.
    let want = format!("/usr/lib/debug/.build-id/{}/{}.debug", &id[..2], &id[2..]);
    let dir = b.dir.clone();
    let mut sym = laser_detect::Symbolizer::with_reader(Box::new(move |path: &str| {
        if path == want {
            std::fs::read(dir.join("lr.debug"))
        } else if path == MODULE {
            std::fs::read(dir.join("lr"))
        } else {
            Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                path.to_string(),
            ))
        }
    }));
    let loc = sym.symbolize(MODULE, lines[&marker("flag")][0]);
    assert!(loc.debug_info);
    assert_eq!(loc.line, Some(marker("flag")));
}
