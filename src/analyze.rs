//! From a detector's analysis to the reports people and machines read.

use std::borrow::Cow;
use std::sync::Arc;

use anyhow::Result;
use laser_detect::decode::code::{ElfImage, FileMapping, ModuleLayout};
use laser_detect::naming::heap_names::HeapBlocks;
use laser_detect::{
    build_report, Analysis, CodeSource, Detector, ElfCode, Report, ReportOptions, Symbolizer,
};

use crate::cli::AnalysisArgs;

/// `--path-map FROM=TO` prefixes: where to read files the target had at other paths.
#[derive(Clone, Debug, Default)]
pub struct PathMap(Vec<(String, String)>);

impl PathMap {
    pub fn new(pairs: &[(String, String)]) -> Self {
        PathMap(pairs.to_vec())
    }

    /// `path` with the first matching prefix replaced (whole path components only).
    pub fn apply<'a>(&self, path: &'a str) -> Cow<'a, str> {
        for (from, to) in &self.0 {
            if let Some(rest) = path.strip_prefix(from.as_str()) {
                if rest.is_empty() || rest.starts_with('/') || from.ends_with('/') {
                    return Cow::Owned(format!("{to}{rest}"));
                }
            }
        }
        Cow::Borrowed(path)
    }
}

/// The detector's code source: the ELF files the target mapped, read through the path map.
/// Module paths in the analysis stay as the target saw them.
pub struct Code {
    elf: ElfCode,
    map: PathMap,
}

impl CodeSource for Code {
    fn read_code(&self, addr: u64, buf: &mut [u8]) -> usize {
        self.elf.read_code(addr, buf)
    }

    fn function_bounds(&self, addr: u64) -> Option<(u64, u64)> {
        self.elf.function_bounds(addr)
    }

    fn direct_callers(&self, addr: u64) -> Vec<u64> {
        self.elf.direct_callers(addr)
    }

    fn call_target(&self, addr: u64) -> Option<u64> {
        self.elf.call_target(addr)
    }

    fn map_file(&mut self, m: &FileMapping<'_>) -> Option<ModuleLayout> {
        let path = self.map.apply(m.path);
        self.elf.map_file(&FileMapping { path: &path, ..*m })
    }
}

/// A detector reading code from the ELF files the target maps.
pub fn detector(args: &AnalysisArgs, duration_s: Option<f64>) -> Detector<Code> {
    detector_with(args, duration_s, ElfCode::new())
}

/// [`detector`] with the ELF images [`warm_up`] parsed.
pub fn detector_with(args: &AnalysisArgs, duration_s: Option<f64>, elf: ElfCode) -> Detector<Code> {
    let config = laser_detect::Config {
        line_size: args.line,
        duration_s,
        ..Default::default()
    };
    let code = Code {
        elf,
        map: PathMap::new(&args.path_map),
    };
    Detector::new(config, code)
}

/// Work every launch's detector does once the program runs, done by `laser run` right after
/// it has released the program, while the kernel execs it and its dynamic loader starts
/// (≈ 1 ms here, in which the program runs none of its own code): the instruction decoder's
/// tables (≈ 0.9 ms at the first decode otherwise) and the parsed images of the program's
/// executable, its dynamic loader and the C library next to that loader (≈ 0.35 ms), which a
/// dynamically linked program maps. Left for the first samples, this work would fall where
/// the program's threads hold both CPUs.
///
/// Not on a thread of its own, started before the launch as it once was: this machine's
/// kernel places a new thread on its creator's CPU and runs it first (`sched_vcpu_pack` on
/// its command line), so the thread took the CPU from the launch for ~1 ms in most runs
/// while the other CPU idled, and the program started that much later (benchmarks/RESULTS.md,
/// forty-fifth session).
pub fn warm_up(program: Option<&std::ffi::OsStr>) -> ElfCode {
    laser_detect::decode::warm_up();
    let program = program.and_then(|p| {
        laser_driver::launch::resolve_program(p, std::env::var_os("PATH").as_deref()).ok()
    });
    let mut paths = Vec::new();
    if let Some(p) = program.and_then(|p| std::fs::canonicalize(p).ok()) {
        paths.extend(loader_and_libc(&p));
        paths.extend(p.to_str().map(str::to_string));
    }
    paths.sort();
    paths.dedup();
    let images = paths
        .into_iter()
        .filter_map(|p| {
            let image = ElfImage::open(std::path::Path::new(&p))?;
            Some((p, Arc::new(image)))
        })
        .collect();
    ElfCode::with_preloaded(images)
}

/// The dynamic loader `program` names (its `PT_INTERP`) and the C library beside it, as
/// the kernel will name their mappings (symbolic links resolved): what a dynamically linked
/// program maps first. Nothing for a static program or a script. (laser itself is static, so
/// its own mappings cannot say where the system's C library is.)
fn loader_and_libc(program: &std::path::Path) -> Vec<String> {
    use object::read::elf::{FileHeader, ProgramHeader};
    use std::io::Read;
    // The program headers and the interpreter's name sit at the start of the file.
    let mut head = Vec::with_capacity(16 << 10);
    let read = std::fs::File::open(program).and_then(|f| f.take(16 << 10).read_to_end(&mut head));
    if read.is_err() {
        return Vec::new();
    }
    let Ok(header) = object::elf::FileHeader64::<object::Endianness>::parse(&*head) else {
        return Vec::new();
    };
    let Ok(endian) = header.endian() else {
        return Vec::new();
    };
    let interp = header
        .program_headers(endian, &*head)
        .ok()
        .and_then(|phdrs| {
            phdrs
                .iter()
                .find_map(|ph| ph.interpreter(endian, &*head).ok().flatten())
        });
    let Some(loader) = interp
        .and_then(|i| std::str::from_utf8(i).ok())
        .and_then(|i| std::fs::canonicalize(i).ok())
    else {
        return Vec::new();
    };
    let libc = loader
        .parent()
        .and_then(|dir| std::fs::canonicalize(dir.join("libc.so.6")).ok());
    [Some(loader), libc]
        .into_iter()
        .flatten()
        .filter_map(|p| p.to_str().map(str::to_string))
        .collect()
}

/// What `emit` made: the report, and whether a `--fail-on` gate tripped on it.
pub struct Emitted {
    pub report: Report,
    pub tripped: bool,
}

/// Symbolizes, thresholds and delivers the report (text unless `--quiet`, JSON if `--json`,
/// gates, JUnit: `output::deliver`). `heap`: the malloc blocks of heap lines, read from the
/// live process (`None` for recordings). `title` names the run in JUnit.
pub fn emit(
    analysis: &Analysis,
    args: &AnalysisArgs,
    heap: Option<HeapBlocks>,
    title: &str,
) -> Result<Emitted> {
    let report = build(analysis, args, heap);
    let tripped = crate::output::deliver(&report, args, title)?;
    Ok(Emitted { report, tripped })
}

/// Symbolizes and thresholds, printing nothing (`run --repair` decides from this mid-run).
pub fn build(analysis: &Analysis, args: &AnalysisArgs, heap: Option<HeapBlocks>) -> Report {
    let opts = ReportOptions {
        threshold: args.threshold,
        heap_blocks: heap,
        ..Default::default()
    };
    let map = PathMap::new(&args.path_map);
    let mut symbolizer = Symbolizer::with_reader(Box::new(move |p: &str| {
        std::fs::read(map.apply(p).as_ref())
    }));
    build_report(analysis, &mut symbolizer, &opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The paths the warm-up names are the ones a dynamically linked program's maps show.
    #[test]
    fn loader_and_libc_are_named_as_a_program_maps_them() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep runs");
        let exe = std::fs::read_link(format!("/proc/{}/exe", child.id())).unwrap();
        let mut maps = String::new();
        // The loader maps the C library a moment after the exec.
        for _ in 0..200 {
            maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).unwrap();
            if maps.contains("/libc.so") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let _ = child.kill();
        let _ = child.wait();
        let named = loader_and_libc(&exe);
        assert_eq!(named.len(), 2, "{named:?}");
        assert!(named.iter().any(|p| p.contains("/libc.so")), "{named:?}");
        for p in &named {
            assert!(maps.contains(p.as_str()), "{p} not in\n{maps}");
        }
        // A static program (laser's own test binary) has no loader to name.
        let own = std::env::current_exe().unwrap();
        assert!(loader_and_libc(&own).is_empty());
        assert!(loader_and_libc(std::path::Path::new("/nonexistent")).is_empty());
    }

    #[test]
    fn path_map_replaces_whole_components_first_match_wins() {
        let m = PathMap::new(&[
            ("/build/app".into(), "/srv/app".into()),
            ("/build".into(), "/x".into()),
            ("/usr/lib".into(), "/nonexistent/usr/lib".into()),
        ]);
        assert_eq!(m.apply("/build/app/bin/a"), "/srv/app/bin/a");
        assert_eq!(m.apply("/build/application"), "/x/application");
        assert_eq!(
            m.apply("/buildx/a"),
            "/buildx/a",
            "not a component boundary"
        );
        assert_eq!(
            m.apply("/usr/lib/libc.so.6"),
            "/nonexistent/usr/lib/libc.so.6"
        );
        assert_eq!(m.apply("/opt/a"), "/opt/a");
    }
}
