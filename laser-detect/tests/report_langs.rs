//! C++ and Rust: demangled function names and namespaced globals, on programs compiled at test
//! time with g++ and rustc (expected addresses and lines from binutils).

mod report_common;

use report_common::{build_with, marker_in};

#[test]
fn cpp_functions_and_namespaced_globals_are_demangled() {
    let b = build_with(
        "cpp",
        "ns.cpp",
        "ns",
        &["g++", "-g", "-O0", "-o", "ns", "ns.cpp"],
    );
    let lines = b.line_table_of("ns.cpp");
    let nm = b.nm();
    let mut sym = b.symbolizer();
    let module = "/src/ns";

    let at = lines[&marker_in("ns.cpp", "// @work")][0];
    let loc = sym.symbolize(module, at);
    assert_eq!(loc.function.as_deref(), Some("app::work(int)"));
    assert_eq!(loc.file.as_deref(), Some("/src/ns.cpp"));
    let at = lines[&marker_in("ns.cpp", "// @twice")][0];
    let loc = sym.symbolize(module, at);
    assert_eq!(loc.function.as_deref(), Some("long app::twice<long>(long)"));
    assert!(loc
        .symbol
        .unwrap()
        .starts_with("long app::twice<long>(long)"));

    // app::stats[1].misses: element 1 starts at 16, misses is 8 into it.
    let stats = nm["_ZN3app5statsE"];
    let d = sym.name_data(module, stats, 64, 0xff << 24).unwrap();
    assert_eq!(d.fields_for(u128::MAX), vec!["app::stats[1].misses"]);
    assert_eq!(d.objects[0].type_name.as_deref(), Some("struct Stats[2]"));
    // A static data member defined outside its class.
    let limit = nm["_ZN3app3Cfg5limitE"];
    let d = sym
        .name_data(module, limit & !63, 64, 0xff << (limit % 64))
        .unwrap();
    assert_eq!(d.fields_for(u128::MAX), vec!["app::Cfg::limit"]);
}

#[test]
fn rust_functions_and_statics_are_demangled() {
    let b = build_with(
        "rust",
        "rs.rs",
        "rs",
        &["rustc", "-g", "-C", "opt-level=0", "-o", "rs", "rs.rs"],
    );
    let lines = b.line_table_of("rs.rs");
    let nm = b.nm();
    let mut sym = b.symbolizer();
    let module = "/src/rs";

    let at = lines[&marker_in("rs.rs", "// @bump")][0];
    let loc = sym.symbolize(module, at);
    assert_eq!(loc.function.as_deref(), Some("rs::bump"));
    assert_eq!(loc.file.as_deref(), Some("/src/rs.rs"));
    assert_eq!(loc.line, Some(marker_in("rs.rs", "// @bump")));

    let (raw, &pairs) = nm
        .iter()
        .find(|(n, _)| n.starts_with("_ZN2rs5PAIRS"))
        .expect("PAIRS in nm");
    assert!(raw.ends_with('E'));
    // PAIRS[1].b is bytes 24..32 of PAIRS; 8-aligned, so it never straddles a line.
    let target = pairs + 24;
    let line = target & !63;
    let d = sym
        .name_data(module, line, 64, 0xff << (target - line))
        .unwrap();
    assert_eq!(d.fields_for(u128::MAX), vec!["rs::PAIRS[1].b"]);
}
