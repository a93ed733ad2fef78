//! One module's (executable's or shared library's) symbols and DWARF, loaded from bytes.
//!
//! The symbolizer and the data namer both work from this: it is parsed once per module and
//! cached by [`crate::naming::symbolize::Symbolizer`]. Reading the file is the caller's job (I/O at the
//! edge), so tests hand in bytes of a binary compiled at test time.
//!
//! DWARF sections are copied into reference-counted buffers (`EndianArcSlice`) so the parsed
//! `gimli::Dwarf` owns its data and can be cached without borrowing the file bytes.

use std::sync::Arc;

use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

/// The reader every DWARF consumer in laser-detect uses.
pub type DwarfReader = gimli::EndianArcSlice<gimli::RunTimeEndian>;

/// Why a module could not be used at all (a stripped module is *not* an error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModuleError {
    #[error("not a readable ELF object ({len} bytes): {source}")]
    Object { len: usize, source: object::Error },
    #[error("malformed DWARF: {0}")]
    Dwarf(#[from] gimli::Error),
}

/// What an ELF symbol names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SymKind {
    Text,
    Data,
}

/// An ELF symbol (from `.symtab`, or `.dynsym` when the module is stripped).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElfSymbol {
    pub addr: u64,
    /// `st_size`; 0 when the assembler did not set it.
    pub size: u64,
    /// Raw (mangled) name.
    pub name: String,
    pub kind: SymKind,
}

/// Symbols and DWARF of one module.
pub struct DebugModule {
    /// Sorted by address; aliases at one address keep the one with a size, then the global one.
    pub symbols: Vec<ElfSymbol>,
    /// `None` when the module carries no `.debug_info` (stripped, or built without `-g`).
    pub dwarf: Option<Arc<gimli::Dwarf<DwarfReader>>>,
    pub build_id: Option<Vec<u8>>,
    /// File name from `.gnu_debuglink`, for finding a separate debug file.
    pub debuglink: Option<String>,
}

impl std::fmt::Debug for DebugModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DebugModule")
            .field("symbols", &self.symbols.len())
            .field("dwarf", &self.dwarf.is_some())
            .field("build_id", &self.build_id)
            .field("debuglink", &self.debuglink)
            .finish()
    }
}

impl DebugModule {
    /// Parses an ELF image. Missing symbols or debug info give an empty table / `None`.
    pub fn parse(bytes: &[u8]) -> Result<Self, ModuleError> {
        Self::parse_with(bytes, true)
    }

    /// [`DebugModule::parse`], reading the symbol table only `with_symbols`.
    fn parse_with(bytes: &[u8], with_symbols: bool) -> Result<Self, ModuleError> {
        let file = object::File::parse(bytes).map_err(|source| ModuleError::Object {
            len: bytes.len(),
            source,
        })?;
        let symbols = if with_symbols {
            read_symbols(&file)
        } else {
            Vec::new()
        };
        let dwarf = load_dwarf(&file)?;
        let build_id = file.build_id().ok().flatten().map(<[u8]>::to_vec);
        let debuglink = file
            .gnu_debuglink()
            .ok()
            .flatten()
            .map(|(name, _crc)| String::from_utf8_lossy(name).into_owned());
        Ok(DebugModule {
            symbols,
            dwarf,
            build_id,
            debuglink,
        })
    }

    pub fn has_debug_info(&self) -> bool {
        self.dwarf.is_some()
    }

    /// Takes DWARF (and symbols, if this module has none) from a separate debug file
    /// (`objcopy --only-keep-debug`). Returns whether it supplied debug info.
    pub fn attach_debug_file(&mut self, bytes: &[u8]) -> Result<bool, ModuleError> {
        // Its symbols are used only where the module has none (glibc's debug file has ~10,000
        // that a stripped libc's dynamic ones make unused).
        let other = DebugModule::parse_with(bytes, self.symbols.is_empty())?;
        if let (Some(ours), Some(theirs)) = (&self.build_id, &other.build_id) {
            if ours != theirs {
                return Ok(false);
            }
        }
        if self.symbols.is_empty() {
            self.symbols = other.symbols;
        }
        if other.dwarf.is_some() {
            self.dwarf = other.dwarf;
            return Ok(true);
        }
        Ok(false)
    }

    /// The symbol of `kind` containing `addr` and the offset into it. A symbol without a size
    /// (hand-written assembly) is taken to extend to the next symbol.
    pub fn symbol_at(&self, addr: u64, kind: SymKind) -> Option<(&ElfSymbol, u64)> {
        let idx = self.symbols.partition_point(|s| s.addr <= addr);
        let mut candidates = self.symbols[..idx].iter().rev().filter(|s| s.kind == kind);
        // The nearest symbol claims the address if it covers it, or if it has no size
        // (hand-written assembly): then it is taken to extend to the next symbol.
        let nearest = candidates.next()?;
        if nearest.size == 0 || addr - nearest.addr < nearest.size {
            return Some((nearest, addr - nearest.addr));
        }
        // Otherwise a bigger symbol further back may enclose it (nested objects).
        candidates
            .take(8)
            .find(|s| s.size > 0 && addr - s.addr < s.size)
            .map(|s| (s, addr - s.addr))
    }
}

/// Where a separate debug file for a module may live (GDB's search rules): by build-id under
/// `/usr/lib/debug/.build-id/`, then by `.gnu_debuglink` next to the module, in its `.debug/`
/// directory and under `/usr/lib/debug/` + the module's directory.
pub fn debug_file_candidates(
    module_path: &str,
    build_id: Option<&[u8]>,
    debuglink: Option<&str>,
) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(id) = build_id.filter(|id| id.len() >= 2) {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        out.push(format!(
            "/usr/lib/debug/.build-id/{}/{}.debug",
            &hex[..2],
            &hex[2..]
        ));
    }
    if let Some(link) = debuglink.filter(|l| !l.is_empty() && !l.contains('/')) {
        let dir = module_path.rsplit_once('/').map_or(".", |(d, _)| d);
        let dir = if dir.is_empty() { "/" } else { dir };
        let base = module_path.rsplit('/').next().unwrap_or(module_path);
        if link != base {
            out.push(format!("{dir}/{link}"));
        }
        out.push(format!("{dir}/.debug/{link}"));
        out.push(format!(
            "/usr/lib/debug{}/{link}",
            dir.trim_end_matches('/')
        ));
    }
    out
}

fn read_symbols(file: &object::File<'_>) -> Vec<ElfSymbol> {
    let mut syms: Vec<(ElfSymbol, bool)> = Vec::new();
    let take = |syms: &mut Vec<(ElfSymbol, bool)>, it: object::SymbolIterator<'_, '_>| {
        for s in it {
            let kind = match s.kind() {
                SymbolKind::Text => SymKind::Text,
                SymbolKind::Data => SymKind::Data,
                _ => continue,
            };
            let Ok(name) = s.name() else { continue };
            if name.is_empty() || s.address() == 0 || !s.is_definition() {
                continue;
            }
            let sym = ElfSymbol {
                addr: s.address(),
                size: s.size(),
                name: name.to_string(),
                kind,
            };
            syms.push((sym, s.is_global()));
        }
    };
    take(&mut syms, file.symbols());
    if syms.is_empty() {
        take(&mut syms, file.dynamic_symbols());
    }
    // At one address prefer a sized symbol, then a global one, then the shorter name
    // (`foo` over `__foo_internal`); deterministic either way. The key borrows the name: a
    // key that owned it cloned a string at every comparison (~5 ms of glibc's debug file's
    // 25 ms load).
    syms.sort_by(|(a, ga), (b, gb)| {
        let key = |s: &ElfSymbol, global: bool| {
            (
                s.addr,
                s.kind as u8,
                std::cmp::Reverse(s.size > 0),
                std::cmp::Reverse(global),
                s.name.len(),
            )
        };
        key(a, *ga)
            .cmp(&key(b, *gb))
            .then_with(|| a.name.cmp(&b.name))
    });
    syms.dedup_by(|later, earlier| {
        later.0.addr == earlier.0.addr && later.0.kind == earlier.0.kind
    });
    syms.into_iter().map(|(s, _)| s).collect()
}

fn load_dwarf(
    file: &object::File<'_>,
) -> Result<Option<Arc<gimli::Dwarf<DwarfReader>>>, ModuleError> {
    let has_info = file
        .section_by_name(".debug_info")
        .is_some_and(|s| s.size() > 0);
    if !has_info {
        return Ok(None);
    }
    let endian = if file.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let load = |id: gimli::SectionId| -> Result<DwarfReader, gimli::Error> {
        // Location lists and macros name where variables live at each pc and what macros
        // expand to; symbolization and global types need neither, and in glibc's debug file
        // the location lists are the second-largest compressed section (~0.6 MB to inflate).
        let unused = matches!(
            id,
            gimli::SectionId::DebugLoc
                | gimli::SectionId::DebugLocLists
                | gimli::SectionId::DebugMacinfo
                | gimli::SectionId::DebugMacro
        );
        let data: Arc<[u8]> = match file.section_by_name(id.name()).filter(|_| !unused) {
            // A section that fails to decompress is treated as absent: the rest still works.
            Some(sec) => sec
                .uncompressed_data()
                .map(|d| Arc::from(d.as_ref()))
                .unwrap_or_else(|_| Arc::from(&[][..])),
            None => Arc::from(&[][..]),
        };
        Ok(gimli::EndianArcSlice::new(data, endian))
    };
    let dwarf = gimli::Dwarf::load(load)?;
    Ok(Some(Arc::new(dwarf)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_a_typed_error_with_the_length() {
        let err = DebugModule::parse(b"not an elf").unwrap_err();
        assert!(err.to_string().contains("10 bytes"), "{err}");
    }

    #[test]
    fn debug_file_candidates_follow_gdb_rules() {
        let c = debug_file_candidates(
            "/opt/app/bin/lr",
            Some(&[0xab, 0xcd, 0xef]),
            Some("lr.debug"),
        );
        assert_eq!(
            c,
            vec![
                "/usr/lib/debug/.build-id/ab/cdef.debug",
                "/opt/app/bin/lr.debug",
                "/opt/app/bin/.debug/lr.debug",
                "/usr/lib/debug/opt/app/bin/lr.debug",
            ]
        );
        // A debuglink that names the module itself must not make it its own debug file.
        let c = debug_file_candidates("/x/lr", None, Some("lr"));
        assert_eq!(c, vec!["/x/.debug/lr", "/usr/lib/debug/x/lr"]);
    }
}
