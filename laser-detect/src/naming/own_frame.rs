//! Which frame of an inline chain is the program's own code.
//!
//! `A.x++` on a `std::atomic<int>` compiles to one `lock add` whose innermost source location
//! is libstdc++'s `atomic_base.h:618`, inlined into the program's `test7.cpp:26`. The line a
//! programmer can change is the second. The rule, innermost frame first:
//!
//! 1. A frame whose file is a *system* path never headlines while another frame can:
//!    `/usr/include/`, `/usr/local/include/`, `/usr/lib/` and `/usr/lib64/` (gcc's and
//!    clang's own headers live under `/usr/lib/gcc/<triple>/<ver>/include`,
//!    `/usr/lib/llvm-N/lib/clang/…`), `/usr/share/`, `/usr/src/` (distribution debug
//!    sources), any `…/include/c++/…` (libstdc++/libc++ wherever the toolchain lives), Rust's
//!    standard library (`/rustc/<hash>/…`, `…/lib/rustlib/src/…`) and crates from a package
//!    registry (`…/.cargo/registry/…`, `…/.cargo/git/…`).
//! 2. Of the rest, the innermost frame whose file lies under the compilation unit's own
//!    directories headlines: `DW_AT_comp_dir` and the directory of the unit's primary source
//!    file (`DW_AT_name`; with CMake the build directory is the comp dir and the sources are
//!    elsewhere). A header-only library the program vendors under those directories counts
//!    as the program's.
//! 3. Else the innermost non-system frame (a program header outside both directories).
//! 4. Else the innermost frame: nothing is the program's, the report stays as the DWARF says.
//!
//! Paths are compared by whole components (`/src/app` is not under `/src/ap`).

/// Whether `path` is a system or package file that is never the program's own line.
pub fn is_system_path(path: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "/usr/include/",
        "/usr/local/include/",
        "/usr/lib/",
        "/usr/lib64/",
        "/usr/share/",
        "/usr/src/",
        "/rustc/",
    ];
    const INSIDE: &[&str] = &[
        "/include/c++/",
        "/lib/rustlib/src/",
        "/.cargo/registry/",
        "/.cargo/git/",
    ];
    PREFIXES.iter().any(|p| path.starts_with(p)) || INSIDE.iter().any(|p| path.contains(p))
}

/// Whether `path` is `dir` or inside it, by whole path components.
fn under(path: &str, dir: &str) -> bool {
    let dir = dir.trim_end_matches('/');
    // `/` (or an empty comp dir) would hold everything: it says nothing about ownership.
    if dir.is_empty() {
        return false;
    }
    path.strip_prefix(dir)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The directories a compilation unit calls its own: its `DW_AT_comp_dir` and the directory
/// of its `DW_AT_name` (joined to the comp dir when relative).
pub fn unit_roots(comp_dir: Option<&str>, name: Option<&str>) -> Vec<String> {
    let mut roots: Vec<String> = Vec::new();
    if let Some(d) = comp_dir.filter(|d| d.starts_with('/')) {
        roots.push(d.to_string());
    }
    if let Some(n) = name {
        let full = match comp_dir {
            Some(d) if !n.starts_with('/') => format!("{}/{n}", d.trim_end_matches('/')),
            _ => n.to_string(),
        };
        if let Some((dir, _)) = full.rsplit_once('/') {
            if dir.starts_with('/') && !roots.iter().any(|r| r == dir) {
                roots.push(dir.to_string());
            }
        }
    }
    roots
}

/// Index of the frame to headline among `files` (innermost first; `None` where a frame's
/// file is unknown), by the rule in the module docs. `roots` come from [`unit_roots`].
pub fn headline(files: &[Option<&str>], roots: &[String]) -> usize {
    let own = |f: &str| !is_system_path(f) && roots.iter().any(|r| under(f, r));
    let not_system = |f: &str| !is_system_path(f);
    files
        .iter()
        .position(|f| f.is_some_and(own))
        .or_else(|| files.iter().position(|f| f.is_some_and(not_system)))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_headers_and_packages_are_not_the_program() {
        for p in [
            "/usr/include/c++/12/bits/atomic_base.h",
            "/usr/lib/gcc/x86_64-linux-gnu/12/include/stdatomic.h",
            "/usr/local/include/tbb/spin_mutex.h",
            "/opt/gcc-14/include/c++/14/atomic",
            "/rustc/90b35a6239c3d8bdabc530a6a0816f7ff89a0aaf/library/core/src/sync/atomic.rs",
            "/home/u/.cargo/registry/src/index.crates.io-6f17d22bba15001f/spin-0.9.8/src/mutex.rs",
            "/usr/src/debug/glibc-2.36/nptl/pthread_mutex_lock.c",
        ] {
            assert!(is_system_path(p), "{p}");
        }
        for p in [
            "/home/u/proj/test7.cpp",
            "/src/lr.c",
            "/usr/local/src/app/main.c",
        ] {
            assert!(!is_system_path(p), "{p}");
        }
    }

    #[test]
    fn roots_are_comp_dir_and_the_primary_source_directory() {
        assert_eq!(
            unit_roots(Some("/proj/build"), Some("/proj/src/a.cpp")),
            vec!["/proj/build", "/proj/src"]
        );
        assert_eq!(
            unit_roots(Some("/proj"), Some("src/a.cpp")),
            vec!["/proj", "/proj/src"]
        );
        assert_eq!(unit_roots(Some("/proj"), Some("a.cpp")), vec!["/proj"]);
        assert!(unit_roots(None, Some("a.cpp")).is_empty());
    }

    /// `A.x++` at -O2: fetch_add (header) ← operator++ (header) ← work (program).
    #[test]
    fn the_program_frame_under_the_comp_dir_headlines() {
        let roots = unit_roots(Some("/home/u/proj"), Some("t.cpp"));
        let chain = [
            Some("/usr/include/c++/12/bits/atomic_base.h"),
            Some("/usr/include/c++/12/bits/atomic_base.h"),
            Some("/home/u/proj/t.cpp"),
        ];
        assert_eq!(headline(&chain, &roots), 2);
        // A program helper inlined into a program function: the innermost stays.
        let own = [Some("/home/u/proj/t.cpp"), Some("/home/u/proj/t.cpp")];
        assert_eq!(headline(&own, &roots), 0);
    }

    #[test]
    fn a_program_header_outside_the_unit_directories_beats_a_system_header() {
        let roots = unit_roots(Some("/b"), Some("/p/main.c"));
        let chain = [
            Some("/usr/include/x86_64-linux-gnu/bits/string_fortified.h"),
            Some("/elsewhere/util.h"),
            Some("/p/main.c"),
        ];
        // Under the unit's directory wins over a non-system header elsewhere.
        assert_eq!(headline(&chain, &roots), 2);
        let chain = [Some("/usr/include/x.h"), Some("/elsewhere/util.h"), None];
        assert_eq!(headline(&chain, &roots), 1);
    }

    #[test]
    fn all_system_or_unknown_keeps_the_innermost() {
        let roots = unit_roots(Some("/"), Some("/usr/include/x.h"));
        assert_eq!(headline(&[Some("/usr/include/x.h"), None], &roots), 0);
        assert_eq!(headline(&[None, None], &[]), 0);
        // `/` as comp dir claims nothing; whole components only.
        assert!(!under("/srcx/a.c", "/src"));
        assert!(under("/src/a.c", "/src/"));
        assert!(!under("/a.c", "/"));
    }
}
