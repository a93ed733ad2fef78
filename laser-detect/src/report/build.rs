//! From an [`Analysis`] to a [`Report`]: threshold, rank, symbolize, name data, suggest fixes.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::findings::{Analysis, CallSite, LineFinding, Location, SourceAccess};
use crate::model::migratory::Extent;
use crate::naming::access_type::TypedAccess;
use crate::naming::alloc_site::is_system_module;
use crate::naming::dataname::LineData;
use crate::naming::heap_names::HeapBlocks;
use crate::naming::symbolize::Symbolizer;
use crate::report::by_type::{self, Layouts};
use crate::report::fix;
use crate::report::{
    mask_offsets, ranges, BelowThreshold, CalledFrom, Data, DataObject, Extent as ReportExtent,
    Finding, HeapBlock, Inlined, Report, Source, SourceType, Survey, TypeMember, SCHEMA,
};

/// How to build a report.
#[derive(Clone, Debug, PartialEq)]
pub struct ReportOptions {
    /// Lines below this many events per second are left out (counted in `below_threshold`),
    /// and so are lines rated from too few events to be above it
    /// ([`crate::model::findings::LineFinding::reported_at`]).
    pub threshold: f64,
    /// Attach the text of each source line when the source file is readable.
    pub source_text: bool,
    /// At most this many sources per finding (the rest are the least frequent); 0 = all.
    pub max_sources: usize,
    /// Path prefixes to rewrite in the finished report, `(from, to)`, first match wins:
    /// module, source file and inlined-at paths and notes. For output that must not depend on
    /// where a program was built or run (golden tests over recordings, sharing reports). The
    /// rewritten `module` no longer opens the file, so `laser repair --from` needs a report
    /// made without it.
    pub path_map: Vec<(String, String)>,
    /// The malloc blocks of heap lines, read from the live process (`laser run`/`attach`);
    /// `None` when there was no process to read (a recording): heap lines are then `heap`.
    pub heap_blocks: Option<HeapBlocks>,
}

impl Default for ReportOptions {
    fn default() -> Self {
        ReportOptions {
            threshold: 1000.0,
            source_text: true,
            max_sources: 0,
            path_map: Vec::new(),
            heap_blocks: None,
        }
    }
}

/// Builds the report. Never fails: what cannot be symbolized or named is left out and said in
/// `notes`.
pub fn build_report(
    analysis: &Analysis,
    symbolizer: &mut Symbolizer,
    opts: &ReportOptions,
) -> Report {
    let line_size = if analysis.line_size == 0 {
        64
    } else {
        analysis.line_size
    };
    // Lines under the threshold that one loop moves along add up (`migratory`): they are
    // reported as one finding with their extent, not counted below the threshold.
    // A group resting on too few events is no finding either (`LineFinding::reported_at`):
    // its lines are counted below the threshold, each on its own.
    let migratory: Vec<_> = crate::model::migratory::migratory(&analysis.findings, opts.threshold)
        .into_iter()
        .filter(|(f, _)| f.reported_at(opts.threshold))
        .collect();
    let in_extent = |line: u64| migratory.iter().any(|m| m.1.lines.contains(&line));
    let mut kept: Vec<(&LineFinding, Option<&Extent>)> = Vec::new();
    let mut below = BelowThreshold::default();
    for f in &analysis.findings {
        // A line of a migratory finding is reported in it, whatever its own rate (lines
        // rated by code windows can be above the threshold, see `migratory`).
        if in_extent(f.line_addr) {
            continue;
        }
        if f.reported_at(opts.threshold) {
            kept.push((f, None));
        } else {
            below.lines += 1;
            below.events += f.events;
            below.thin += u64::from(f.rate_per_s >= opts.threshold);
        }
    }
    kept.extend(migratory.iter().map(|(f, e)| (f, Some(e))));
    kept.sort_by(|a, b| {
        b.0.rate_per_s
            .total_cmp(&a.0.rate_per_s)
            .then(a.0.line_addr.cmp(&b.0.line_addr))
    });
    let mut modules: BTreeSet<String> = BTreeSet::new();
    let mut notes = analysis.notes.clone();
    let mut layouts = Layouts::new();
    let findings: Vec<Finding> = kept
        .into_iter()
        .map(|(f, extent)| {
            let mut out = finding(
                f,
                line_size,
                symbolizer,
                opts,
                &mut modules,
                &mut notes,
                &mut layouts,
            );
            if let Some(e) = extent {
                out.extent = Some(report_extent(e, line_size));
                out.fix = format!(
                    "Contention moves along {} lines ({} bytes) that the same code touches one \
                     after another, each hot for a while, together {:.0} ev/s. {}",
                    e.lines.len(),
                    out.extent.as_ref().map_or(0, |x| x.bytes),
                    f.rate_per_s,
                    out.fix
                );
            }
            out
        })
        .collect();
    heap_summary(&findings, opts, &mut notes);
    for info in &analysis.modules {
        let (Some(want), true) = (&info.build_id, modules.contains(&info.path)) else {
            continue;
        };
        if let Some(have) = symbolizer.build_id(&info.path) {
            if &have != want {
                notes.push(format!(
                    "{} is not the file that ran (build-id {} there, {} now): source lines and \
                     names may be wrong",
                    info.path,
                    hex_bytes(want),
                    hex_bytes(&have)
                ));
            }
        }
    }
    for m in &modules {
        if let Some(err) = symbolizer.module_error(m) {
            notes.push(format!("{err}: addresses only"));
        } else if symbolizer.has_debug_info(m) == Some(false) {
            notes.push(format!(
                "no debug info for {m}: functions from ELF symbols only, no file:line or fields \
                 (rebuild with -g or install its debug package)"
            ));
        }
    }
    let mut report = Report {
        schema: SCHEMA.to_string(),
        backend: analysis.backend.name().to_string(),
        duration_s: finite(analysis.duration_s),
        samples: analysis.samples,
        lost: analysis.lost,
        throttles: analysis.throttles,
        filtered: analysis.filtered,
        line_size,
        threshold: finite(opts.threshold),
        below_threshold: below,
        notes,
        survey: analysis.survey.as_ref().map(|s| Survey {
            lines: s.lines,
            global_lines: s.global_lines,
            heap_lines: s.heap_lines,
            bytes: s.bytes,
            windows: s.windows,
            found: s.found.len() as u64,
        }),
        concurrency: analysis.concurrency.clone(),
        types: by_type::profile(&findings, &layouts, line_size),
        coverage: by_type::coverage(&findings),
        findings,
    };
    if !opts.path_map.is_empty() {
        remap_paths(&mut report, &opts.path_map);
    }
    report
}

fn remap(path: &mut String, map: &[(String, String)]) {
    if let Some((from, to)) = map.iter().find(|(from, _)| path.starts_with(from.as_str())) {
        *path = format!("{to}{}", &path[from.len()..]);
    }
}

fn remap_paths(r: &mut Report, map: &[(String, String)]) {
    for f in &mut r.findings {
        if let Some(m) = &mut f.data.module {
            remap(m, map);
        }
        for s in &mut f.sources {
            for p in [&mut s.module, &mut s.file].into_iter().flatten() {
                remap(p, map);
            }
            for i in s.inlined.iter_mut().chain(&mut s.library_frames) {
                if let Some(p) = &mut i.file {
                    remap(p, map);
                }
            }
            for c in &mut s.called_from {
                for p in [&mut c.module, &mut c.file].into_iter().flatten() {
                    remap(p, map);
                }
            }
        }
    }
    for t in &mut r.types {
        for s in &mut t.sources {
            if let Some(p) = &mut s.file {
                remap(p, map);
            }
        }
    }
    // Notes are prose: a path may sit anywhere in them.
    for n in &mut r.notes {
        for (from, to) in map {
            *n = n.replace(from.as_str(), to);
        }
    }
}

/// JSON has no NaN or infinity (serde_json writes `null`, which does not read back as a
/// number); a zero-length run can produce them.
fn finite(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        0.0
    }
}

fn hex_bytes(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn finding(
    f: &LineFinding,
    line_size: u32,
    sym: &mut Symbolizer,
    opts: &ReportOptions,
    modules: &mut BTreeSet<String>,
    notes: &mut Vec<String>,
    layouts: &mut Layouts,
) -> Finding {
    let union = f.sources.iter().fold(0u128, |m, s| m | s.offsets);
    let (mut data, line_data) = data(&f.data, line_size, union, sym, modules);
    if f.data == Location::Heap {
        if let Some(found) = opts
            .heap_blocks
            .as_ref()
            .and_then(|h| h.lines.get(&f.line_addr))
        {
            match found {
                Ok(blocks) => {
                    name_heap(&mut data, f.line_addr, line_size, union, blocks);
                    let sites = opts.heap_blocks.as_ref().map(|h| &h.sites);
                    for b in &mut data.blocks {
                        if let Some(site) = sites.and_then(|s| s.get(&b.addr)) {
                            b.requested_size = Some(site.requested_size);
                            b.alloc_site = Some(alloc_site(site, sym, modules));
                        }
                    }
                }
                Err(e) => notes.push(format!(
                    "heap line {:#x}: malloc block unknown: {e}",
                    f.line_addr
                )),
            }
        }
    }
    let mut accesses: Vec<&SourceAccess> = f.sources.iter().collect();
    accesses.sort_by(|a, b| {
        b.events
            .cmp(&a.events)
            .then(a.pc.cmp(&b.pc))
            .then(a.offsets.cmp(&b.offsets))
    });
    if opts.max_sources > 0 {
        accesses.truncate(opts.max_sources);
    }
    let mut sources: Vec<Source> = accesses
        .into_iter()
        .map(|s| source(s, line_data.as_ref(), sym, opts, modules))
        .collect();
    if !data.blocks.is_empty() {
        for s in &mut sources {
            s.fields = heap_fields(&data.blocks, f.line_addr, line_size, s.mask());
        }
    }
    for s in &mut sources {
        type_source(s, &data, sym, layouts);
    }
    name_types(&mut data, &sources);
    let mut threads = f.threads.clone();
    threads.sort_unstable();
    threads.dedup();
    let mut out = Finding {
        kind: f.kind,
        // A forked copy's line: its address in that process, which `process` names.
        line_addr: crate::decode::maps::split_copy(f.line_addr).1,
        process: f.process,
        rate_per_s: finite(f.rate_per_s),
        events: f.events,
        true_events: f.true_events,
        false_events: f.false_events,
        share: finite(f.share),
        threads,
        data,
        sources,
        fix: String::new(),
        extent: None,
    };
    out.fix = fix::suggest(&out, line_size);
    // Outside the globals (whose fix already names objects and fields), a line whose
    // accesses are all of one type gets that type's fix from its DWARF layout: after the
    // blocks' fix when malloc blocks are known (it says which blocks), else instead of the
    // generic heap text.
    if out.data.kind != "global" && out.data.types.len() == 1 {
        if let Some(p) = by_type::profile(std::slice::from_ref(&out), layouts, line_size).first() {
            if !p.fix.is_empty() && out.data.blocks.is_empty() {
                out.fix = p.fix.clone();
            } else if !p.fix.is_empty() {
                out.fix = format!("{} {}", out.fix, p.fix);
            }
        }
    }
    out
}

/// The data type and member a source accesses: for a global line from the contended
/// address itself, elsewhere from the instruction and DWARF variables (`access_type`).
fn type_source(s: &mut Source, data: &Data, sym: &mut Symbolizer, layouts: &mut Layouts) {
    let typed: Result<TypedAccess, &str> = match (data.kind.as_str(), &data.module, data.vaddr) {
        ("global", Some(m), Some(v)) => match s.offsets.first() {
            Some(&o) => sym.type_global(m, v + u64::from(o)).ok_or_else(|| {
                if sym.has_debug_info(m) == Some(false) {
                    "no debug info"
                } else {
                    "global with no DWARF variable"
                }
            }),
            None => Err("no bytes"),
        },
        _ => match (&s.module, s.offset) {
            // A system library's accesses are typed only where the program's own data is
            // named (its globals above, its own instructions): typing one instruction of
            // glibc (a barrier's counter) walks all of glibc's separate debug info, 50–100
            // ms of laser after the program has exited (parsec streamcluster, one run in
            // two), for the type of glibc's own argument (`pthread_barrier_t`).
            (Some(m), Some(_)) if is_system_module(m) => Err("system library code"),
            (Some(m), Some(pc)) => sym.type_access(m, pc),
            _ => Err("code not in a file"),
        },
    };
    // The instruction's operand must agree with where the line is: a stack slot or a global
    // does not hold heap data (a source attributed to the wrong instruction, e.g. by skid).
    let typed = typed.and_then(|t| match (data.kind.as_str(), t.how) {
        ("heap", "stack") => Err("operand is a stack slot, the line is not"),
        ("heap" | "stack", "global") => Err("operand is a global, the line is not"),
        _ => Ok(t),
    });
    match typed {
        Ok(t) => {
            layouts.entry(t.type_name.clone()).or_insert_with(|| {
                let members = t
                    .layout
                    .iter()
                    .map(|m| TypeMember {
                        name: m.name.clone(),
                        offset: m.offset,
                        size: m.size,
                        type_name: m.type_name.clone(),
                    })
                    .collect();
                (t.type_size, members)
            });
            s.data_type = Some(SourceType {
                type_name: t.type_name,
                size: t.type_size,
                member: t.member,
                offset: t.offset,
                expr: t.expr,
                how: t.how.to_string(),
            });
        }
        Err(why) => s.untyped = Some(why.to_string()),
    }
}

/// The line's types (most events first) and typed expressions (in offset order).
fn name_types(data: &mut Data, sources: &[Source]) {
    let mut events: BTreeMap<&str, u64> = BTreeMap::new();
    let mut exprs: Vec<(u32, &str)> = Vec::new();
    for s in sources {
        if let Some(t) = &s.data_type {
            *events.entry(t.type_name.as_str()).or_default() += s.events;
            exprs.push((s.offsets.first().copied().unwrap_or(0), t.expr.as_str()));
        }
    }
    let mut types: Vec<(&str, u64)> = events.into_iter().collect();
    types.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    data.types = types.into_iter().map(|t| t.0.to_string()).collect();
    exprs.sort();
    for (_, e) in exprs {
        if !data.type_fields.iter().any(|x| x == e) {
            data.type_fields.push(e.to_string());
        }
    }
}

fn data(
    loc: &Location,
    line_size: u32,
    union: u128,
    sym: &mut Symbolizer,
    modules: &mut BTreeSet<String>,
) -> (Data, Option<LineData>) {
    let plain = |kind: &str| Data {
        kind: kind.to_string(),
        name: kind.to_string(),
        fields: vec![],
        module: None,
        vaddr: None,
        objects: vec![],
        blocks: vec![],
        types: vec![],
        type_fields: vec![],
    };
    match loc {
        Location::Module { path, vaddr } => {
            modules.insert(path.clone());
            // The bias is page aligned, so the line starts at the same offset in the file.
            let line_vaddr = vaddr - vaddr % u64::from(line_size);
            let line_data = sym.name_data(path, line_vaddr, line_size, union);
            let base = path.rsplit('/').next().unwrap_or(path);
            let (name, fields, objects) = match &line_data {
                Some(ld) if !ld.objects.is_empty() => (
                    ld.objects
                        .iter()
                        .map(|o| o.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    ld.fields_for(union),
                    ld.objects
                        .iter()
                        .map(|o| DataObject {
                            name: o.name.clone(),
                            type_name: o.type_name.clone(),
                            vaddr: o.vaddr,
                            size: o.size,
                            element_type: o.element.as_ref().map(|e| e.0.clone()),
                            element_size: o.element.as_ref().map(|e| e.1),
                        })
                        .collect(),
                ),
                _ => (format!("{base}+{line_vaddr:#x}"), vec![], vec![]),
            };
            let data = Data {
                kind: "global".into(),
                name,
                fields,
                module: Some(path.clone()),
                vaddr: Some(line_vaddr),
                objects,
                blocks: vec![],
                types: vec![],
                type_fields: vec![],
            };
            (data, line_data)
        }
        Location::Heap => (plain("heap"), None),
        // Another thread's stack is named by its owner: the threads reached it through a
        // pointer (OpenMP's shared locals, a results array that is a local of main).
        Location::Stack {
            owner,
            shared: true,
        } => (
            Data {
                name: owner.map_or("shared stack".into(), |t| format!("stack of T{t}")),
                ..plain("stack")
            },
            None,
        ),
        Location::Stack { .. } => (plain("stack"), None),
        Location::Unknown => (plain("unknown"), None),
    }
}

/// An allocation stack symbolized: each return address at its call instruction.
///
/// A wrapper the compiler inlined into its caller (`static inline void *xmalloc(…)` in a
/// header) has no frame of its own to analyse: the site frame's headline is then the
/// wrapper's line. When that inlined function is named like an allocator
/// ([`inlined_wrapper_name`]), it is listed as a `wrapper` frame and the site moves to the
/// line that called it.
fn alloc_site(
    site: &crate::naming::alloc_site::AllocSite,
    sym: &mut Symbolizer,
    modules: &mut BTreeSet<String>,
) -> crate::report::AllocSite {
    let mut frames: Vec<crate::report::AllocFrame> = Vec::new();
    let mut at = None;
    for (i, f) in site.frames.iter().enumerate() {
        let loc = match (&f.module, f.vaddr) {
            (Some(m), Some(v)) => {
                modules.insert(m.clone());
                sym.symbolize(m, v.wrapping_sub(1))
            }
            _ => Default::default(),
        };
        let frame = |file, line, function, skipped: Option<&str>| crate::report::AllocFrame {
            pc: f.pc,
            module: f.module.clone(),
            file,
            line,
            function,
            skipped: skipped.map(str::to_string),
        };
        if site.site != Some(i) {
            frames.push(frame(loc.file, loc.line, loc.function, f.skipped));
            continue;
        }
        // The site frame: step out of inlined allocator wrappers, innermost first.
        let (mut file, mut line, mut function) = (loc.file, loc.line, loc.function);
        for caller in &loc.inlined {
            if !function.as_deref().is_some_and(inlined_wrapper_name) {
                break;
            }
            frames.push(frame(file, line, function, Some("wrapper")));
            (file, line, function) = (caller.file.clone(), caller.line, caller.function.clone());
        }
        at = Some(frames.len());
        frames.push(frame(file, line, function, None));
    }
    let at = at.and_then(|i| frames.get(i));
    crate::report::AllocSite {
        file: at.and_then(|f| f.file.clone()),
        line: at.and_then(|f| f.line),
        function: at.and_then(|f| f.function.clone()),
        frames,
    }
}

/// An inlined function taken for an allocator wrapper by its name: its last path component
/// ends in `alloc` (`xmalloc`, `safe_malloc`, `xcalloc`, `xrealloc`, `zalloc`). Only for
/// inlined frames, whose code is not there to analyse as [`crate::naming::alloc_site`] does
/// for real frames; `allocate` or `make_job` are not taken.
fn inlined_wrapper_name(function: &str) -> bool {
    let base = function.split('(').next().unwrap_or(function);
    let base = base.rsplit("::").next().unwrap_or(base);
    base.to_ascii_lowercase().ends_with("alloc")
}

/// Names a heap line by the malloc blocks holding its contended bytes (`union`).
fn name_heap(
    data: &mut Data,
    line_addr: u64,
    line_size: u32,
    union: u128,
    blocks: &[crate::naming::heap_blocks::Block],
) {
    data.blocks = blocks
        .iter()
        .filter_map(|b| {
            let offsets: Vec<u64> = (0..line_size.min(128))
                .filter(|&o| union & (1u128 << o) != 0)
                .map(|o| line_addr + u64::from(o))
                .filter(|&a| b.contains(a))
                .map(|a| a - b.user)
                .collect();
            (!offsets.is_empty()).then(|| HeapBlock {
                addr: b.user,
                size: b.usable,
                state: b.state.as_str().to_string(),
                arena: b.arena.as_str().to_string(),
                offsets,
                requested_size: None,
                alloc_site: None,
            })
        })
        .collect();
    data.fields = heap_fields(&data.blocks, line_addr, line_size, union);
    if !data.blocks.is_empty() {
        let list: Vec<String> = data
            .blocks
            .iter()
            .map(|b| format!("{:#x} ({} bytes)", b.addr, b.size))
            .collect();
        data.name = format!(
            "heap block{} {}",
            if list.len() == 1 { "" } else { "s" },
            list.join(", ")
        );
    }
}

/// The block and in-block offsets of each contended byte run in `mask`:
/// `block@0x5555555592a0[8..16)`; bytes in no block (malloc's own headers) are
/// `malloc header`.
pub fn heap_fields(
    blocks: &[HeapBlock],
    line_addr: u64,
    line_size: u32,
    mask: u128,
) -> Vec<String> {
    let mut per_block: Vec<Vec<u64>> = vec![Vec::new(); blocks.len()];
    let mut outside = false;
    for o in (0..line_size.min(128)).filter(|&o| mask & (1u128 << o) != 0) {
        let a = line_addr + u64::from(o);
        match blocks
            .iter()
            .position(|b| a >= b.addr && a - b.addr < b.size)
        {
            Some(i) => per_block[i].push(a - blocks[i].addr),
            None => outside = true,
        }
    }
    let mut out: Vec<String> = blocks
        .iter()
        .zip(&per_block)
        .filter(|(_, offs)| !offs.is_empty())
        .map(|(b, offs)| format!("block@{:#x}{}", b.addr, ranges(offs)))
        .collect();
    if outside {
        out.push("malloc header".to_string());
    }
    out
}

/// A migratory finding's extent as the report states it (in the process whose lines they
/// are: a group never mixes processes, see `migratory`).
fn report_extent(e: &Extent, line_size: u32) -> ReportExtent {
    let addr = |l: u64| crate::decode::maps::split_copy(l).1;
    let first = e.lines.first().copied().map_or(0, addr);
    let last = e.lines.last().copied().map_or(0, addr);
    ReportExtent {
        lines: e.lines.len() as u64,
        start: first,
        end: last + u64::from(line_size),
        bytes: (last + u64::from(line_size)).saturating_sub(first),
    }
}

/// One note for the heap lines a live run could not look at.
fn heap_summary(findings: &[Finding], opts: &ReportOptions, notes: &mut Vec<String>) {
    let Some(h) = &opts.heap_blocks else {
        return;
    };
    if let Some(n) = &h.sites_note {
        notes.push(n.clone());
    }
    let unread = findings
        .iter()
        .filter(|f| f.data.kind == "heap" && !h.lines.contains_key(&f.line_addr))
        .count();
    if unread > 0 {
        notes.push(format!(
            "{unread} heap line(s) named only `heap`: their malloc blocks were not read while              the process ran (laser run reads the top few contended lines as it goes)"
        ));
    }
}

fn source(
    s: &SourceAccess,
    line_data: Option<&LineData>,
    sym: &mut Symbolizer,
    opts: &ReportOptions,
    modules: &mut BTreeSet<String>,
) -> Source {
    let mut threads = s.threads.clone();
    threads.sort_unstable();
    threads.dedup();
    let mut out = Source {
        pc: s.pc,
        module: None,
        offset: None,
        file: None,
        line: None,
        column: None,
        function: None,
        symbol: None,
        inlined: vec![],
        library_frames: vec![],
        debug_info: false,
        text: None,
        op: s.op,
        offsets: mask_offsets(s.offsets),
        fields: line_data
            .map(|d| d.fields_for(s.offsets))
            .unwrap_or_default(),
        events: s.events,
        threads,
        called_from: merge_sites(
            s.called_from
                .iter()
                .map(|c| called_from(c, sym, modules))
                .collect(),
        ),
        data_type: None,
        untyped: None,
    };
    if let Location::Module { path, vaddr } = &s.code {
        modules.insert(path.clone());
        let loc = sym.symbolize(path, *vaddr);
        out.module = Some(path.clone());
        out.offset = Some(*vaddr);
        out.debug_info = loc.debug_info;
        out.symbol = loc.symbol;
        out.function = loc.function;
        out.column = loc.column;
        let frames = |v: Vec<crate::naming::symbolize::InlinedFrame>| -> Vec<Inlined> {
            v.into_iter()
                .map(|f| Inlined {
                    function: f.function,
                    file: f.file,
                    line: f.line,
                })
                .collect()
        };
        out.inlined = frames(loc.inlined);
        out.library_frames = frames(loc.library);
        if let (Some(file), Some(line), true) = (&loc.file, loc.line, opts.source_text) {
            out.text = sym.source_line(file, line);
        }
        out.file = loc.file;
        out.line = loc.line;
    }
    out
}

/// Call sites on the same source line of the same function are one site for a reader (two
/// calls on one line, or calls of two functions that tail-call the library from one line):
/// their samples and shares add up, the first return address stays. Most samples first.
fn merge_sites(sites: Vec<CalledFrom>) -> Vec<CalledFrom> {
    let mut out: Vec<CalledFrom> = Vec::with_capacity(sites.len());
    for c in sites {
        let same = |o: &&mut CalledFrom| {
            o.line.is_some()
                && (&o.module, &o.file, o.line, &o.function)
                    == (&c.module, &c.file, c.line, &c.function)
        };
        match out.iter_mut().find(same) {
            Some(o) => {
                o.samples += c.samples;
                o.share += c.share;
            }
            None => out.push(c),
        }
    }
    out.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.ret.cmp(&b.ret)));
    out
}

/// A call site, symbolized at the call instruction (the byte before the return address: the
/// return address itself may already belong to the next source line).
fn called_from(c: &CallSite, sym: &mut Symbolizer, modules: &mut BTreeSet<String>) -> CalledFrom {
    let mut out = CalledFrom {
        ret: c.ret,
        module: None,
        offset: None,
        file: None,
        line: None,
        function: None,
        symbol: None,
        samples: c.samples,
        share: c.share,
    };
    if let Location::Module { path, vaddr } = &c.code {
        modules.insert(path.clone());
        let loc = sym.symbolize(path, vaddr.saturating_sub(1));
        out.module = Some(path.clone());
        out.offset = Some(*vaddr);
        out.symbol = sym.symbolize(path, *vaddr).symbol;
        // The headline frame, as for the sources: the program line the call is written on.
        out.function = loc.function;
        out.file = loc.file;
        out.line = loc.line;
    }
    out
}

#[cfg(test)]
mod inlined_wrapper_tests {
    use super::inlined_wrapper_name;

    #[test]
    fn allocator_names_are_wrappers_other_names_are_not() {
        for w in [
            "xmalloc",
            "safe_malloc",
            "xcalloc",
            "ns::xrealloc",
            "zalloc(unsigned long)",
        ] {
            assert!(inlined_wrapper_name(w), "{w}");
        }
        for n in [
            "allocate",
            "main",
            "make_job",
            "alloc_table_init",
            "operator new",
        ] {
            assert!(!inlined_wrapper_name(n), "{n}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(ret: u64, line: Option<u32>, function: &str, samples: u64) -> CalledFrom {
        CalledFrom {
            ret,
            module: Some("/app".into()),
            offset: Some(ret),
            file: Some("app.c".into()),
            line,
            function: Some(function.into()),
            symbol: None,
            samples,
            share: samples as f64 / 10.0,
        }
    }

    #[test]
    fn call_sites_on_one_source_line_merge_and_the_rest_stay_apart() {
        let merged = merge_sites(vec![
            site(0x10, Some(30), "worker", 3),
            site(0x20, Some(15), "from_a", 2),
            site(0x30, Some(30), "worker", 4),
            site(0x40, None, "worker", 1),
            site(0x50, None, "worker", 1),
        ]);
        let got: Vec<(u64, Option<u32>, u64)> =
            merged.iter().map(|c| (c.ret, c.line, c.samples)).collect();
        // Lines unknown are never merged: two return addresses may be two different calls.
        assert_eq!(
            got,
            vec![
                (0x10, Some(30), 7),
                (0x20, Some(15), 2),
                (0x40, None, 1),
                (0x50, None, 1)
            ]
        );
        assert!((merged[0].share - 0.7).abs() < 1e-12);
    }
}
