//! `laser import perf.data`: a recording made elsewhere with `perf c2c record` or
//! `perf mem record` (or `perf record`), analysed by the same detector and report as a live
//! run. Binaries are found by the paths the file names (through `--path-map`), checked
//! against the build-ids perf stored, and otherwise looked up by build-id in perf's cache
//! (`$PERF_BUILDID_DIR`, else `~/.debug`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use laser_driver::import::{self, PerfImport};

use crate::analyze::{self, PathMap};
use crate::cli::ImportArgs;
use crate::exit;

pub fn run(args: ImportArgs) -> Result<i32> {
    let bytes =
        std::fs::read(&args.input).with_context(|| format!("reading {}", args.input.display()))?;
    let imp =
        import::read(&bytes).with_context(|| format!("importing {}", args.input.display()))?;
    let mut analysis_args = args.analysis.clone();
    let user_map = PathMap::new(&analysis_args.path_map);
    let mut found = Vec::new();
    for (path, id) in &imp.info.build_ids {
        match resolve_binary(path, id, &user_map, &cache_dirs()) {
            Resolved::AsNamed => {}
            Resolved::At(p) => found.push((path.clone(), p.to_string_lossy().into_owned())),
            Resolved::Missing(why) => eprintln!("laser: {why}"),
            Resolved::Mismatch(why) => {
                eprintln!("laser: {why}");
                // Read nothing rather than the wrong file's code and lines.
                found.push((
                    path.clone(),
                    format!("/nonexistent/build-id-mismatch{path}"),
                ));
            }
        }
    }
    // Exact paths resolved by build-id come first: they are known to be the right files.
    found.append(&mut analysis_args.path_map);
    analysis_args.path_map = found;

    describe(&args.input, &imp);
    if let Some(why) = &imp.stopped {
        eprintln!(
            "laser: warning: {} is damaged ({why}): analysing the records before it",
            args.input.display()
        );
    }
    let duration = imp.duration_s();
    let mut detector = analyze::detector(&analysis_args, (duration > 0.0).then_some(duration));
    for e in &imp.events {
        detector.feed(e);
    }
    let mut analysis = detector.finish();
    analysis.notes.extend(notes(&imp));
    // Gates apply to an imported profile as to a live run (`--fail-on` is in AnalysisArgs).
    let title = format!("laser import {}", args.input.display());
    let emitted = analyze::emit(&analysis, &analysis_args, None, &title)?;
    Ok(crate::gate::exit_code(exit::OK, emitted.tripped))
}

fn describe(input: &Path, imp: &PerfImport) {
    let i = &imp.info;
    let events: Vec<String> = i.events.iter().map(|(n, b)| format!("{n} ({b})")).collect();
    eprintln!(
        "laser: perf.data {} from `{}` on {} ({}, perf {}): events {}",
        input.display(),
        i.cmdline.join(" "),
        i.hostname.as_deref().unwrap_or("?"),
        i.cpu_desc.as_deref().unwrap_or("unknown CPU"),
        i.perf_version.as_deref().unwrap_or("?"),
        events.join(", ")
    );
}

/// What the report should say about the import beyond what the detector saw.
fn notes(imp: &PerfImport) -> Vec<String> {
    let c = &imp.counts;
    let mut v = Vec::new();
    if c.memory_samples > 0 {
        v.push(format!(
            "perf.data: {} memory samples ({} loads, {} stores); perf c2c would count {} HITM \
             and {} peer loads; a HITM load counts as a contention event (with its sampling \
             period) when the line's last sampled writer was another thread, stores give the \
             byte layout only",
            c.memory_samples, c.loads, c.stores, c.hitm, c.peer
        ));
    }
    if c.no_transfer > 0 {
        v.push(format!(
            "perf.data: {} loads were served without a cache-to-cache transfer (L1/L2/LFB hits, \
             forwards, memory) and are not contention; the filter note counts them among \
             instructions without memory operands",
            c.no_transfer
        ));
    }
    if c.malformed > 0 {
        v.push(format!(
            "perf.data: {} unreadable records skipped",
            c.malformed
        ));
    }
    if imp.stopped.is_some() {
        v.push("the perf.data file ended early: counts cover only what was read".into());
    }
    v
}

enum Resolved {
    /// The file at the named (mapped) path has the recorded build-id.
    AsNamed,
    /// Found elsewhere by build-id.
    At(PathBuf),
    Missing(String),
    /// A file is there but it is another build.
    Mismatch(String),
}

fn cache_dirs() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(d) = std::env::var_os("PERF_BUILDID_DIR") {
        v.push(PathBuf::from(d));
    }
    if let Some(h) = std::env::var_os("HOME") {
        v.push(Path::new(&h).join(".debug"));
    }
    v
}

fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

fn resolve_binary(path: &str, id: &[u8], map: &PathMap, caches: &[PathBuf]) -> Resolved {
    // Kernel, vdso and anonymous "files" have no binary to read.
    if !path.starts_with('/') || id.is_empty() {
        return Resolved::AsNamed;
    }
    let here = map.apply(path).into_owned();
    let named = std::fs::read(&here).ok();
    if let Some(b) = &named {
        if import::build_id_of(b).as_deref() == Some(id) {
            return Resolved::AsNamed;
        }
    }
    for c in caches {
        let p = import::build_id_cache_path(c, id);
        if std::fs::read(&p)
            .ok()
            .is_some_and(|b| import::build_id_of(&b).as_deref() == Some(id))
        {
            return Resolved::At(p);
        }
    }
    match named {
        Some(_) => Resolved::Mismatch(format!(
            "warning: {here} is not the binary the recording names (build-id {} differs): \
             its samples are reported by address (use --path-map to point at the right file)",
            hex(id)
        )),
        None => Resolved::Missing(format!(
            "warning: {path} (build-id {}) is not on this machine{}: its samples are reported \
             by address (use --path-map FROM=TO, or put it in perf's build-id cache)",
            hex(id),
            if here != path {
                format!(" (looked at {here})")
            } else {
                String::new()
            }
        )),
    }
}
