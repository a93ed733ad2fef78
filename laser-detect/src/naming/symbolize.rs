//! From (module path, ELF vaddr) to source: file, line, function, inlined frames.
//!
//! One [`Symbolizer`] per report: it opens each module once (through a file-reading closure,
//! so tests and recordings can supply bytes), keeps its symbols, DWARF and `addr2line`
//! context, and answers every lookup from that cache. A module without debug info still gives
//! `function+offset` from its ELF symbols and says "no debug info"; a module that cannot be
//! read at all gives only the address. Nothing here fails a report.
//!
//! The headline frame is the program's own: an instruction inlined from a system header
//! (`std::atomic`'s `atomic_base.h`) is reported at the program line it was inlined into,
//! with the header frames kept in [`CodeLocation::library`] ([`crate::naming::own_frame`] has the rule).

use std::collections::HashMap;
use std::io;

use crate::naming::access_type::{AccessTyper, TypedAccess};
use crate::naming::dataname::{DataIndex, LineData};
use crate::naming::debug_module::{debug_file_candidates, DebugModule, DwarfReader, SymKind};
use crate::naming::own_frame;
use crate::naming::unit_lines::UnitLines;

/// Reads a whole file (module, separate debug file, or source file) by path. `Send` so a
/// symbolizer can move to a worker thread.
pub type FileReader = Box<dyn FnMut(&str) -> io::Result<Vec<u8>> + Send>;

/// One caller frame an instruction's function was inlined into.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct InlinedFrame {
    /// The function the inner frame was inlined into (demangled).
    pub function: Option<String>,
    /// Call site in `function` (DWARF `DW_AT_call_file`/`DW_AT_call_line`).
    pub file: Option<String>,
    pub line: Option<u32>,
}

/// Where an instruction comes from in the source.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct CodeLocation {
    /// The headline function, demangled: the innermost frame in the program's own code (an
    /// inlined callee if the instruction was inlined from the program's own code), else the
    /// innermost frame.
    pub function: Option<String>,
    /// Source position of the headline frame: the instruction's own line, or, when the
    /// instruction was inlined from library code, the program line that code was inlined at.
    pub file: Option<String>,
    pub line: Option<u32>,
    pub column: Option<u32>,
    /// Callers the headline function was inlined into, innermost first; the last one is the
    /// out-of-line function that holds the instruction. Empty when nothing was inlined.
    pub inlined: Vec<InlinedFrame>,
    /// Library frames (system headers, other packages) inlined into the headline frame,
    /// innermost first: the first is the instruction's own location in its function, each
    /// next one a library function's call site of the one before. Empty when the innermost
    /// frame is the headline.
    pub library: Vec<InlinedFrame>,
    /// ELF symbol and offset, e.g. `worker+0x1c` (demangled); present whenever a symbol covers
    /// the address, with or without debug info.
    pub symbol: Option<String>,
    /// Whether the module had DWARF (embedded or in a separate debug file).
    pub debug_info: bool,
}

/// Demangles a Rust (legacy or v0) or C++ (Itanium) symbol; other names come back unchanged.
/// `lang` is the DWARF language of the unit when known and picks the scheme; without it Rust
/// is tried first (its legacy mangling is a strict subset of Itanium `_ZN…E`).
pub fn demangle(name: &str, lang: Option<gimli::DwLang>) -> String {
    let rust = || {
        rustc_demangle::try_demangle(name)
            .ok()
            .map(|d| format!("{d:#}"))
    };
    let cpp = || {
        cpp_demangle::Symbol::new(name)
            .ok()
            .and_then(|s| s.demangle(&cpp_demangle::DemangleOptions::default()).ok())
    };
    let out = match lang {
        Some(gimli::DW_LANG_Rust) => rust(),
        Some(
            gimli::DW_LANG_C_plus_plus
            | gimli::DW_LANG_C_plus_plus_03
            | gimli::DW_LANG_C_plus_plus_11
            | gimli::DW_LANG_C_plus_plus_14
            | gimli::DW_LANG_C_plus_plus_17
            | gimli::DW_LANG_C_plus_plus_20,
        ) => cpp(),
        Some(_) => None,
        None if name.starts_with("_R") || name.starts_with("_ZN") => rust().or_else(cpp),
        None if name.starts_with("_Z") => cpp(),
        None => None,
    };
    out.unwrap_or_else(|| name.to_string())
}

pub(crate) struct LoadedModule {
    debug: DebugModule,
    /// Source lookups: `None` without DWARF (or DWARF addr2line refuses).
    ctx: Option<UnitLines>,
    /// Built on first data lookup: most modules only ever need code lookups.
    data: Option<DataIndex>,
    /// Built on first access typing (the module's code and units, read again from the file).
    typer: Option<AccessTyper>,
}

#[cfg(test)]
impl LoadedModule {
    pub(crate) fn debug(&self) -> &DebugModule {
        &self.debug
    }

    pub(crate) fn has_dwarf(&self) -> bool {
        self.debug.dwarf.is_some()
    }
}

/// Opens `path` (and, without DWARF, its separate debug file) through `read`: symbols, DWARF
/// and the `addr2line` context. The slow part of a report (inflating compressed DWARF), so
/// [`crate::naming::prefetch`] runs it on a worker thread while the program still runs.
pub(crate) fn load_module(
    read: &mut dyn FnMut(&str) -> io::Result<Vec<u8>>,
    path: &str,
    find_debug_files: bool,
) -> Result<LoadedModule, String> {
    let bytes = read(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let mut debug = DebugModule::parse(&bytes).map_err(|e| format!("{path}: {e}"))?;
    drop(bytes);
    if !debug.has_debug_info() && find_debug_files {
        let candidates =
            debug_file_candidates(path, debug.build_id.as_deref(), debug.debuglink.as_deref());
        for candidate in candidates {
            if let Ok(extra) = read(&candidate) {
                // A candidate that is unreadable or belongs to another build is skipped.
                if debug.attach_debug_file(&extra).unwrap_or(false) {
                    break;
                }
            }
        }
    }
    let ctx = debug.dwarf.as_ref().and_then(UnitLines::new);
    Ok(LoadedModule {
        debug,
        ctx,
        data: None,
        typer: None,
    })
}

/// Cached per-module symbolization. See the module docs.
pub struct Symbolizer {
    read: FileReader,
    /// `Err` keeps the reason a module could not be opened, so it is tried once.
    modules: HashMap<String, Result<LoadedModule, String>>,
    sources: HashMap<String, Option<Vec<String>>>,
    find_debug_files: bool,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    /// A symbolizer reading modules, separate debug files and sources from the file system.
    pub fn new() -> Self {
        Self::with_reader(Box::new(|path: &str| std::fs::read(path)))
    }

    /// A symbolizer reading files through `read` (tests, recordings carrying their modules,
    /// path remapping). Separate debug files are looked up through the same closure.
    pub fn with_reader(read: FileReader) -> Self {
        Symbolizer {
            read,
            modules: HashMap::new(),
            sources: HashMap::new(),
            find_debug_files: true,
        }
    }

    /// Whether to look for `.gnu_debuglink` / build-id debug files for modules without DWARF.
    pub fn set_find_debug_files(&mut self, on: bool) {
        self.find_debug_files = on;
    }

    /// Why `module` could not be opened, if it could not (after a lookup tried it).
    pub fn module_error(&self, module: &str) -> Option<&str> {
        self.modules.get(module)?.as_ref().err().map(String::as_str)
    }

    /// Whether `module` was opened and has DWARF; `None` if it could not be opened.
    pub fn has_debug_info(&mut self, module: &str) -> Option<bool> {
        self.module(module).map(|m| m.ctx.is_some())
    }

    /// The GNU build-id of `module` as opened, to check it is the file that was recorded.
    pub fn build_id(&mut self, module: &str) -> Option<Vec<u8>> {
        self.module(module)?.debug.build_id.clone()
    }

    fn module(&mut self, path: &str) -> Option<&mut LoadedModule> {
        if !self.modules.contains_key(path) {
            let loaded = self.load(path);
            self.modules.insert(path.to_string(), loaded);
        }
        self.modules.get_mut(path)?.as_mut().ok()
    }

    fn load(&mut self, path: &str) -> Result<LoadedModule, String> {
        // A live run may have loaded it already, in idle time (`prefetch`).
        if let Some(done) = crate::naming::prefetch::take(path) {
            return done;
        }
        load_module(&mut self.read, path, self.find_debug_files)
    }

    /// Source location of the instruction at ELF vaddr `vaddr` in `module`. Never fails: what
    /// could not be found is `None`.
    pub fn symbolize(&mut self, module: &str, vaddr: u64) -> CodeLocation {
        let Some(m) = self.module(module) else {
            return CodeLocation::default();
        };
        let mut out = CodeLocation {
            debug_info: m.ctx.is_some(),
            ..CodeLocation::default()
        };
        if let Some((sym, off)) = m.debug.symbol_at(vaddr, SymKind::Text) {
            let name = demangle(&sym.name, None);
            out.symbol = Some(if off == 0 {
                name
            } else {
                format!("{name}+{off:#x}")
            });
        }
        // addr2line computes `probe + 1` (an overflow panic in debug builds at u64::MAX, an
        // address no module has anyway).
        let ctx = m.ctx.as_mut().filter(|_| vaddr < u64::MAX);
        if let Some(ctx) = ctx.and_then(|c| c.context(vaddr)) {
            let roots = ctx
                .find_dwarf_and_unit(vaddr)
                .skip_all_loads()
                .map(|unit| {
                    use gimli::Reader as _;
                    let text = |r: Option<&DwarfReader>| {
                        r.and_then(|r| r.to_string_lossy().ok().map(|s| s.into_owned()))
                    };
                    own_frame::unit_roots(
                        text(unit.comp_dir.as_ref()).as_deref(),
                        text(unit.name.as_ref()).as_deref(),
                    )
                })
                .unwrap_or_default();
            if let Ok(frames) = ctx.find_frames(vaddr).skip_all_loads() {
                fill_frames(&mut out, frames, &roots);
            }
        }
        if out.function.is_none() {
            out.function = m
                .debug
                .symbol_at(vaddr, SymKind::Text)
                .map(|(s, _)| demangle(&s.name, None));
        }
        out
    }

    /// Names the bytes `mask` (bit N = byte N) of the line at ELF vaddr `line_vaddr` in
    /// `module`: the objects there and the field at each contended offset. `None` when the
    /// module cannot be opened.
    pub fn name_data(
        &mut self,
        module: &str,
        line_vaddr: u64,
        line_size: u32,
        mask: u128,
    ) -> Option<LineData> {
        let m = self.module(module)?;
        let index = Self::data_index(&mut m.data, &m.debug);
        index.read_pending();
        Some(index.name_line(&m.debug.symbols, line_vaddr, line_size, mask))
    }

    /// The module's type table and global index, made on first use; its globals are read
    /// when first needed ([`DataIndex::types_first`]).
    fn data_index<'a>(data: &'a mut Option<DataIndex>, debug: &DebugModule) -> &'a mut DataIndex {
        data.get_or_insert_with(|| match &debug.dwarf {
            Some(dwarf) => DataIndex::types_first(dwarf.clone()),
            None => DataIndex::default(),
        })
    }

    /// The data type and member the instruction at ELF vaddr `pc` in `module` accesses
    /// ([`crate::naming::access_type`]). `Err` is why not, as the report's coverage counts it.
    pub fn type_access(&mut self, module: &str, pc: u64) -> Result<TypedAccess, &'static str> {
        let needs_typer = match self.module(module) {
            None => return Err("module not readable"),
            Some(m) if m.debug.dwarf.is_none() => return Err("no debug info"),
            Some(m) => m.typer.is_none(),
        };
        if needs_typer {
            let bytes = (self.read)(module).ok();
            if let Some(m) = self.module(module) {
                if let Some(dwarf) = &m.debug.dwarf {
                    m.typer = Some(AccessTyper::new(bytes.as_deref(), dwarf.clone()));
                }
            }
        }
        let m = self.module(module).ok_or("module not readable")?;
        let mut typer = m.typer.take().ok_or("no debug info")?;
        let out = typer.type_at(
            Self::data_index(&mut m.data, &m.debug),
            &m.debug.symbols,
            pc,
        );
        m.typer = Some(typer);
        out
    }

    /// The data type and member at ELF vaddr `addr` of a global in `module`.
    pub fn type_global(&mut self, module: &str, addr: u64) -> Option<TypedAccess> {
        let m = self.module(module)?;
        m.debug.dwarf.as_ref()?;
        crate::naming::access_type::type_global(Self::data_index(&mut m.data, &m.debug), addr)
    }

    /// The text of line `line` (1-based) of source file `file`, trimmed; `None` when the file
    /// cannot be read. Files are read once.
    pub fn source_line(&mut self, file: &str, line: u32) -> Option<String> {
        if !self.sources.contains_key(file) {
            let text = (self.read)(file).ok().map(|bytes| {
                String::from_utf8_lossy(&bytes)
                    .lines()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            });
            self.sources.insert(file.to_string(), text);
        }
        let lines = self.sources.get(file)?.as_ref()?;
        let text = lines.get((line as usize).checked_sub(1)?)?.trim();
        (!text.is_empty()).then(|| text.to_string())
    }
}

/// addr2line yields the innermost frame first, with the probe's own location; each following
/// frame is a caller with the call site as its location. The frame [`own_frame::headline`]
/// picks becomes the location; the frames inside it are `library`, the ones around it
/// `inlined`.
fn fill_frames(
    out: &mut CodeLocation,
    mut frames: addr2line::FrameIter<'_, DwarfReader>,
    roots: &[String],
) {
    let mut chain: Vec<(InlinedFrame, Option<u32>)> = Vec::new();
    while let Ok(Some(frame)) = frames.next() {
        let function = frame.function.as_ref().and_then(|f| {
            let raw = f.raw_name().ok()?;
            Some(demangle(&raw, f.language))
        });
        let (file, line, column) = match &frame.location {
            Some(loc) => (loc.file.map(str::to_string), loc.line, loc.column),
            None => (None, None, None),
        };
        chain.push((
            InlinedFrame {
                function,
                file,
                line,
            },
            column,
        ));
        if chain.len() > 64 {
            break; // malformed DWARF could loop; no real inline chain is this deep
        }
    }
    let files: Vec<Option<&str>> = chain.iter().map(|(f, _)| f.file.as_deref()).collect();
    let k = own_frame::headline(&files, roots);
    let mut rest = chain.into_iter();
    out.library = rest.by_ref().take(k).map(|(f, _)| f).collect();
    if let Some((head, column)) = rest.next() {
        out.function = head.function;
        out.file = head.file;
        out.line = head.line;
        out.column = column;
    }
    out.inlined = rest.map(|(f, _)| f).collect();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demangles_cpp_rust_and_leaves_c_alone() {
        assert_eq!(demangle("_ZN3foo3barEv", None), "foo::bar()");
        assert_eq!(
            demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE", None),
            "core::ptr::drop_in_place"
        );
        assert_eq!(demangle("_RNvCs1234_7mycrate3foo", None), "mycrate::foo");
        assert_eq!(demangle("worker", None), "worker");
        // The DWARF language wins over the guess.
        assert_eq!(
            demangle("_ZN3foo3barEv", Some(gimli::DW_LANG_C99)),
            "_ZN3foo3barEv"
        );
    }

    #[test]
    fn unreadable_module_gives_empty_location_and_a_reason() {
        let mut s = Symbolizer::with_reader(Box::new(|p: &str| {
            Err(io::Error::new(io::ErrorKind::NotFound, p.to_string()))
        }));
        let loc = s.symbolize("/nope/app", 0x1130);
        assert_eq!(loc, CodeLocation::default());
        assert!(s.module_error("/nope/app").unwrap().contains("/nope/app"));
        assert_eq!(s.has_debug_info("/nope/app"), None);
        assert!(s.name_data("/nope/app", 0x4000, 64, 1).is_none());
    }

    #[test]
    fn source_lines_are_1_based_and_trimmed() {
        let mut s = Symbolizer::with_reader(Box::new(|_: &str| Ok(b"a\n   b = 1;  \n".to_vec())));
        assert_eq!(s.source_line("x.c", 2).as_deref(), Some("b = 1;"));
        assert_eq!(s.source_line("x.c", 0), None);
        assert_eq!(s.source_line("x.c", 3), None);
    }
}
