//! Every contended access typed from DWARF (`naming::access_type`): programs compiled at test
//! time, C and C++, -O0 and -O2. For each marked source line, every instruction the line
//! table gives that line is typed, and the line's access must come out as the expected type
//! and member: heap structs through a pointer (at -O0 reloaded from its stack slot), arrays
//! of per-thread structs, an anonymous member behind a typedef, a pointer member followed,
//! a C++ class with a base class and `std::atomic` members.

mod report_common;

use std::collections::BTreeSet;

use report_common::{build_with, line_instructions, marker_in, Built};

/// `(type, expr)` of every typed access on the marked line.
fn typed_on(b: &Built, exe: &str, file: &str, tag: &str) -> BTreeSet<(String, String)> {
    let line = marker_in(file, tag);
    let pcs = line_instructions(b, exe, file, line);
    assert!(!pcs.is_empty(), "{exe}: no instructions for {file}:{line}");
    let mut sym = b.symbolizer();
    let module = format!("/src/{exe}");
    pcs.iter()
        .filter_map(|&pc| sym.type_access(&module, pc).ok())
        .map(|t| (t.type_name, t.expr))
        .collect()
}

fn expect(b: &Built, exe: &str, file: &str, tag: &str, ty: &str, expr: &str) {
    let got = typed_on(b, exe, file, tag);
    assert!(
        got.contains(&(ty.to_string(), expr.to_string())),
        "{exe} {tag}: expected `{ty}` / `{expr}` among {got:?}"
    );
}

fn build(exe: &str, src: &str, compiler: &str, opt: &str) -> Built {
    build_with(
        exe,
        src,
        exe,
        &[compiler, "-g", opt, "-pthread", "-o", exe, src],
    )
}

#[test]
fn c_heap_structs_arrays_anonymous_members_and_pointer_chains() {
    for opt in ["-O0", "-O2"] {
        let exe = format!("types_c{}", &opt[1..]);
        let b = build(&exe, "types.c", "gcc", opt);
        let f = "types.c";
        expect(&b, &exe, f, "@sx", "struct lreg_args", "args->SX");
        expect(&b, &exe, f, "@sy", "struct lreg_args", "args->SY");
        // An array of per-thread structs through a pointer: the element is unknown statically.
        let got = typed_on(&b, &exe, f, "@misses");
        assert!(
            got.iter().any(|(t, e)| t == "struct stat"
                && e.starts_with("stats")
                && e.ends_with(".misses")),
            "{exe}: {got:?}"
        );
        expect(&b, &exe, f, "@failed", "job_t", "job->failed");
        expect(&b, &exe, f, "@chase", "struct node", "h->list->value");
    }
}

#[test]
fn cpp_base_classes_and_atomic_members() {
    for opt in ["-O0", "-O2"] {
        let exe = format!("types_cpp{}", &opt[1..]);
        let b = build(&exe, "types.cpp", "g++", opt);
        let f = "types.cpp";
        // At -O0 `fetch_add` is an out-of-line libstdc++ function: the access is in it, and
        // the caller's line only passes `&this->hits`. At -O2 it is inlined into bump().
        if opt == "-O2" {
            expect(&b, &exe, f, "@bump", "class Counter", "this->hits");
        }
        expect(&b, &exe, f, "@misses", "class Counter", "this->misses");
        // Members declared in the base class are named as Counter's own.
        expect(&b, &exe, f, "@id", "class Counter", "c->id");
        if opt == "-O2" {
            expect(&b, &exe, f, "@refs", "class Counter", "c->refs");
        }
    }
}

#[test]
fn openmp_regions_reach_shared_locals_through_their_data_block() {
    for opt in ["-O0", "-O2"] {
        let exe = format!("types_omp{}", &opt[1..]);
        let b = build_with(
            &exe,
            "types_omp.c",
            &exe,
            &["gcc", "-g", opt, "-fopenmp", "-o", &exe, "types_omp.c"],
        );
        let f = "types_omp.c";
        // A shared array, through the pointer member the region's data block holds for it
        // (`int (*)[2]`), and a heap array through the copy of main's pointer: named as
        // main names them. Before, the outlined function was not found in DWARF at all, and
        // at -O2 a load through rbp was taken for a stack slot.
        for (tag, ty, expr) in [
            ("@sum", "double", "sum[*]"),
            ("@counts", "int", "counts[*]"),
            ("@tot", "long int", "tot[*]"),
        ] {
            expect(&b, &exe, f, tag, ty, expr);
        }
    }
}
