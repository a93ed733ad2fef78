//! Source lookups in a module's DWARF, one compilation unit at a time when the module is big.
//!
//! `addr2line::Context` parses every unit's header and abbreviations when it is made. For
//! glibc's separate debug file (2,063 units, each with its own abbreviations) that was ~15 ms
//! of the ~40 ms a load took here, paid after the program has exited whenever a finding's
//! instruction is in glibc (a barrier's condition variable, a mutex) and the prefetch worker
//! found no idle CPU to load it in (parsec streamcluster: 17–64 ms between the program's exit
//! and laser's in 3 traced runs of 20, ~3 ms in the others). A report asks about a few
//! addresses of such a module, so a big module's units are found through `.debug_aranges` and
//! each gets a context of its own, made when an address in it is first asked for: the unit's
//! bytes as `.debug_info`, every other section whole.
//!
//! A unit that refers into another by section offset (`DW_FORM_ref_addr`: Rust does across
//! its codegen units, GCC across units in LTO builds) fails there, or finds no unit for the
//! address; such a lookup, and one at an address no `.debug_aranges` entry covers, is
//! answered by a context over every unit, made then. What is given up: a reference into
//! another unit that fails silently (a name that comes back absent rather than as an error)
//! is not caught; the tests find none at 800 addresses of laser's own binary and of glibc.

use std::collections::HashMap;
use std::sync::Arc;

use gimli::{DebugAranges, DebugInfo, DebugInfoOffset, Dwarf, Reader as _, Section as _};

use crate::naming::debug_module::DwarfReader;

/// Modules with at least this much `.debug_info` are looked up one unit at a time: glibc's
/// debug file has ~9 MB; a program's own DWARF is far below, and keeps one whole context.
const PER_UNIT_FROM: usize = 1 << 20;

type Context = addr2line::Context<DwarfReader>;

/// The addr2line contexts of one module's DWARF.
pub(crate) enum UnitLines {
    /// One context over every unit, made at load.
    Whole(Box<Context>),
    /// A context per unit, made on first use.
    PerUnit(PerUnit),
}

pub(crate) struct PerUnit {
    dwarf: Arc<Dwarf<DwarfReader>>,
    /// `[start, end)` address ranges and the `.debug_info` offset of the unit covering each,
    /// from `.debug_aranges`, sorted by start.
    ranges: Vec<(u64, u64, usize)>,
    /// Contexts made so far, by unit offset (`None`: the unit could not be parsed).
    units: HashMap<usize, Option<Context>>,
    /// For addresses no range covers: a context over every unit, made on first need.
    whole: Option<Option<Context>>,
}

impl UnitLines {
    /// The contexts for `dwarf`: per unit when its `.debug_info` is big and it has
    /// `.debug_aranges`, else one context made now. `None` when addr2line refuses the DWARF.
    pub(crate) fn new(dwarf: &Arc<Dwarf<DwarfReader>>) -> Option<UnitLines> {
        if dwarf.debug_info.reader().len() >= PER_UNIT_FROM {
            if let Some(p) = PerUnit::new(dwarf.clone()) {
                return Some(UnitLines::PerUnit(p));
            }
        }
        Context::from_arc_dwarf(dwarf.clone())
            .ok()
            .map(|c| UnitLines::Whole(Box::new(c)))
    }

    /// The context that answers for `vaddr`.
    pub(crate) fn context(&mut self, vaddr: u64) -> Option<&Context> {
        match self {
            UnitLines::Whole(c) => Some(c),
            UnitLines::PerUnit(p) => p.context(vaddr),
        }
    }
}

impl PerUnit {
    /// `None` when the module has no usable `.debug_aranges` (then one whole context).
    pub(crate) fn new(dwarf: Arc<Dwarf<DwarfReader>>) -> Option<PerUnit> {
        let mut ranges = Vec::new();
        let mut headers = dwarf.debug_aranges.headers();
        while let Ok(Some(h)) = headers.next() {
            let unit = h.debug_info_offset().0;
            let mut entries = h.entries();
            while let Ok(Some(e)) = entries.next() {
                let r = e.range();
                if r.begin < r.end {
                    ranges.push((r.begin, r.end, unit));
                }
            }
        }
        if ranges.is_empty() {
            return None;
        }
        ranges.sort_unstable();
        Some(PerUnit {
            dwarf,
            ranges,
            units: HashMap::new(),
            whole: None,
        })
    }

    fn context(&mut self, vaddr: u64) -> Option<&Context> {
        // Once the whole context exists (a lookup needed it), it answers everything: a unit's
        // own context would give the same answer or fall back to it anyway.
        if matches!(self.whole, Some(Some(_))) {
            return self.whole.as_ref().and_then(Option::as_ref);
        }
        // Ranges of different units do not overlap in a sane file; take the last start ≤ vaddr
        // that still covers it, looking back a little past nested or duplicate entries.
        let i = self.ranges.partition_point(|r| r.0 <= vaddr);
        let unit = self.ranges[..i]
            .iter()
            .rev()
            .take(8)
            .find(|r| vaddr < r.1)
            .map(|r| r.2);
        let dwarf = &self.dwarf;
        let one = unit.and_then(|u| {
            self.units
                .entry(u)
                .or_insert_with(|| unit_context(dwarf, u))
                .as_ref()
        });
        // A unit that names an entry of another by section offset (`DW_FORM_ref_addr`: Rust
        // does, across its codegen units) fails there, or finds no unit for the address: the
        // whole context answers instead.
        if let Some(c) = one.filter(|c| answers(c, vaddr)) {
            return Some(c);
        }
        self.whole
            .get_or_insert_with(|| Context::from_arc_dwarf(dwarf.clone()).ok())
            .as_ref()
    }
}

/// Whether `ctx` finds the unit of `vaddr` and walks its frames without an error.
fn answers(ctx: &Context, vaddr: u64) -> bool {
    if ctx.find_dwarf_and_unit(vaddr).skip_all_loads().is_none() {
        return false;
    }
    let Ok(mut frames) = ctx.find_frames(vaddr).skip_all_loads() else {
        return false;
    };
    loop {
        match frames.next() {
            Ok(Some(_)) => {}
            Ok(None) => return true,
            Err(_) => return false,
        }
    }
}

/// A context over the one unit at `.debug_info` offset `unit`: its bytes are the section,
/// every other section is the module's (line programs, strings, ranges and addresses are
/// found by their own offsets, which do not move).
fn unit_context(dwarf: &Dwarf<DwarfReader>, unit: usize) -> Option<Context> {
    let header = dwarf
        .debug_info
        .header_from_offset(DebugInfoOffset(unit))
        .ok()?;
    let len = header.length_including_self();
    let info = dwarf.debug_info.reader();
    if unit.checked_add(len)? > info.len() {
        return None;
    }
    // The unit's offset is now 0: the module's ranges name offsets that mean nothing here,
    // and the unit's own DW_AT_ranges / low_pc say where it is.
    let one = with_info(dwarf, info.range(unit..unit + len), info.range(0..0));
    Context::from_arc_dwarf(Arc::new(one)).ok()
}

/// `dwarf` with `info` as its `.debug_info` and `aranges` as its `.debug_aranges`.
fn with_info(
    dwarf: &Dwarf<DwarfReader>,
    info: DwarfReader,
    aranges: DwarfReader,
) -> Dwarf<DwarfReader> {
    Dwarf {
        debug_abbrev: dwarf.debug_abbrev.clone(),
        debug_addr: dwarf.debug_addr.clone(),
        debug_aranges: DebugAranges::from(aranges),
        debug_info: DebugInfo::from(info),
        debug_line: dwarf.debug_line.clone(),
        debug_line_str: dwarf.debug_line_str.clone(),
        debug_macinfo: dwarf.debug_macinfo.clone(),
        debug_macro: dwarf.debug_macro.clone(),
        debug_names: dwarf.debug_names.clone(),
        debug_str: dwarf.debug_str.clone(),
        debug_str_offsets: dwarf.debug_str_offsets.clone(),
        debug_types: dwarf.debug_types.clone(),
        locations: dwarf.locations.clone(),
        ranges: dwarf.ranges.clone(),
        file_type: dwarf.file_type,
        sup: dwarf.sup.clone(),
        abbreviations_cache: gimli::AbbreviationsCache::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::naming::debug_module::{DebugModule, SymKind};

    /// Every frame (function, file, line) addr2line gives for `vaddr`.
    fn frames(ctx: &Context, vaddr: u64) -> Vec<(Option<String>, Option<String>, Option<u32>)> {
        let Ok(mut it) = ctx.find_frames(vaddr).skip_all_loads() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        while let Ok(Some(f)) = it.next() {
            let name = f
                .function
                .as_ref()
                .and_then(|n| n.raw_name().ok().map(|s| s.into_owned()));
            let (file, line) = f
                .location
                .map_or((None, None), |l| (l.file.map(str::to_string), l.line));
            out.push((name, file, line));
        }
        out
    }

    /// Per-unit contexts answer as one whole context does, frame for frame, at the start and
    /// the middle of every function of `module` (up to `limit` functions, spread evenly).
    /// Returns how many addresses had a named frame with a line, and whether any lookup fell
    /// back to the whole context.
    fn per_unit_matches_whole(module: &DebugModule, limit: usize) -> (usize, bool) {
        let dwarf = module.dwarf.clone().expect("the module has DWARF");
        let whole = Context::from_arc_dwarf(dwarf.clone()).unwrap();
        let mut per = PerUnit::new(dwarf).expect("the module has .debug_aranges");
        let funcs: Vec<_> = module
            .symbols
            .iter()
            .filter(|s| s.kind == SymKind::Text && s.size > 0)
            .collect();
        let step = (funcs.len() / limit).max(1);
        let mut named = 0;
        for s in funcs.iter().step_by(step) {
            for vaddr in [s.addr, s.addr + s.size / 2] {
                let want = frames(&whole, vaddr);
                let got = per
                    .context(vaddr)
                    .map(|c| frames(c, vaddr))
                    .unwrap_or_default();
                assert_eq!(got, want, "{} at {vaddr:#x}", s.name);
                named += usize::from(want.iter().any(|f| f.0.is_some() && f.2.is_some()));
            }
        }
        (named, per.whole.is_some())
    }

    #[test]
    fn per_unit_contexts_answer_as_the_whole_one_does() {
        // laser's own test binary: Rust and C units (std, its dependencies), with DWARF.
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let own = DebugModule::parse(&exe).unwrap();
        let (named, _) = per_unit_matches_whole(&own, 400);
        assert!(named > 100, "most sampled functions have frames: {named}");
        // glibc's separate debug file, the module this is for, where the machine has it.
        let libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
        if let Ok(m) = crate::naming::symbolize::load_module(&mut |p| std::fs::read(p), libc, true)
        {
            if m.has_dwarf() {
                let (named, fell_back) = per_unit_matches_whole(m.debug(), 400);
                assert!(named > 100, "glibc's functions have frames: {named}");
                // C units name no entry of another: no lookup needed the whole context.
                assert!(!fell_back, "a glibc lookup fell back to the whole context");
            } else {
                eprintln!("no debug file for {libc} here (libc6-dbg): checked laser's own only");
            }
        }
    }

    #[test]
    fn only_big_modules_are_looked_up_per_unit() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let own = DebugModule::parse(&exe).unwrap();
        let dwarf = own.dwarf.unwrap();
        let big = dwarf.debug_info.reader().len() >= PER_UNIT_FROM;
        let lines = UnitLines::new(&dwarf).unwrap();
        assert_eq!(matches!(lines, UnitLines::PerUnit(_)), big);
        // The same DWARF with its .debug_info cut below the bar keeps one whole context.
        let none = dwarf.debug_info.reader().range(0..0);
        let small = with_info(&dwarf, none.clone(), dwarf.debug_aranges.reader().clone());
        assert!(matches!(
            UnitLines::new(&Arc::new(small)),
            Some(UnitLines::Whole(_))
        ));
    }
}
