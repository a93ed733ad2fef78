//! The seam through which the detector reads code bytes (STYLE.md item 3): the detector is
//! generic over [`CodeSource`], so unit tests hand it assembled bytes in memory and a live run
//! hands it the ELF files the target mapped.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;
use object::elf::{gnu_hash, SHN_UNDEF, STT_FUNC, STT_GNU_IFUNC};
use object::read::elf::{ElfFile64, Sym, VersionTable};
use object::{
    Endianness, Object, ObjectSection, ObjectSegment, ObjectSymbol, ObjectSymbolTable,
    SectionFlags, SymbolKind,
};

use crate::decode::maps::{load_bias, LoadSegment};

/// A file mapping the detector saw (from maps text or an `Mmap` event).
#[derive(Clone, Copy, Debug)]
pub struct FileMapping<'a> {
    pub path: &'a str,
    pub start: u64,
    pub end: u64,
    pub pgoff: u64,
    pub exec: bool,
}

/// What a code source learned about a mapped file: its load bias and segments (for `.bss`
/// extents) and build-id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleLayout {
    pub bias: u64,
    pub segments: Vec<LoadSegment>,
    pub build_id: Option<Vec<u8>>,
    /// The file's writable data objects (ELF vaddr, size): what a watchpoint survey of the
    /// program's globals covers (see `survey`). Shared: every mapping of a file repeats it.
    pub writable_objects: Arc<[(u64, u64)]>,
}

/// How far from a function [`ElfImage::direct_callers`] looks for calls to it, each way.
pub const CALLER_REACH: u64 = 64 << 10;

/// Reads the target's code at run-time addresses.
pub trait CodeSource {
    /// Copy up to `buf.len()` code bytes at run-time address `addr` into `buf`; returns how many
    /// were available (0: no code known there).
    fn read_code(&self, addr: u64, buf: &mut [u8]) -> usize;

    /// `[start, end)` of the function containing `addr`, for the linear sweep that finds the
    /// instruction before a sampled IP. `None` when unknown (stripped code).
    fn function_bounds(&self, _addr: u64) -> Option<(u64, u64)> {
        None
    }

    /// Addresses of the direct `call` instructions (`e8 rel32`) near `addr` in the same file
    /// whose target is `addr`, in address order ([`ElfImage::direct_callers`]): where a
    /// library function that samples landed in is called from inside its library (glibc's
    /// `random_r` from `__random`, which takes the lock around it). Empty when unknown.
    fn direct_callers(&self, _addr: u64) -> Vec<u64> {
        Vec::new()
    }

    /// Where a call to `addr` goes: through a PLT stub, the function of another file the stub's
    /// symbol names (the first file mapped that defines it, as the dynamic linker binds it);
    /// anything else is its own target. `None` when it is a stub that cannot be resolved.
    fn call_target(&self, addr: u64) -> Option<u64> {
        Some(addr)
    }

    /// The target mapped a file. Sources backed by files open it here. Returns the file's
    /// layout if the source could read it.
    fn map_file(&mut self, _m: &FileMapping<'_>) -> Option<ModuleLayout> {
        None
    }
}

/// A boxed source is a source: lets the CLI pick one at run time (`Detector<Box<dyn CodeSource>>`).
impl<T: CodeSource + ?Sized> CodeSource for Box<T> {
    fn read_code(&self, addr: u64, buf: &mut [u8]) -> usize {
        (**self).read_code(addr, buf)
    }
    fn function_bounds(&self, addr: u64) -> Option<(u64, u64)> {
        (**self).function_bounds(addr)
    }
    fn direct_callers(&self, addr: u64) -> Vec<u64> {
        (**self).direct_callers(addr)
    }
    fn call_target(&self, addr: u64) -> Option<u64> {
        (**self).call_target(addr)
    }
    fn map_file(&mut self, m: &FileMapping<'_>) -> Option<ModuleLayout> {
        (**self).map_file(m)
    }
}

/// Code bytes held in memory: for tests, and for code copied out of a process.
#[derive(Clone, Debug, Default)]
pub struct MemoryCode {
    chunks: BTreeMap<u64, Vec<u8>>,
    functions: Vec<(u64, u64)>,
}

impl MemoryCode {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes at `addr` (not overlapping other chunks).
    pub fn add(&mut self, addr: u64, bytes: Vec<u8>) {
        self.chunks.insert(addr, bytes);
    }

    /// Bytes of one function at `addr`: also records its bounds.
    pub fn add_function(&mut self, addr: u64, bytes: Vec<u8>) {
        let end = addr + bytes.len() as u64;
        self.add(addr, bytes);
        let pos = self.functions.partition_point(|f| f.0 < addr);
        self.functions.insert(pos, (addr, end));
    }
}

impl CodeSource for MemoryCode {
    fn read_code(&self, addr: u64, buf: &mut [u8]) -> usize {
        let Some((&start, bytes)) = self.chunks.range(..=addr).next_back() else {
            return 0;
        };
        let off = (addr - start) as usize;
        if off >= bytes.len() {
            return 0;
        }
        let n = buf.len().min(bytes.len() - off);
        buf[..n].copy_from_slice(&bytes[off..off + n]);
        n
    }

    fn function_bounds(&self, addr: u64) -> Option<(u64, u64)> {
        let i = self.functions.partition_point(|f| f.0 <= addr);
        let f = *self.functions.get(i.checked_sub(1)?)?;
        (addr < f.1).then_some(f)
    }
}

/// A parsed ELF file: the facts the detector needs, owned, plus the mapped bytes.
pub struct ElfImage {
    data: Mmap,
    /// `PT_LOAD` segments.
    pub segments: Vec<LoadSegment>,
    /// Function symbols `[start, end)` in ELF vaddrs, sorted.
    pub functions: Vec<(u64, u64)>,
    pub build_id: Option<Vec<u8>>,
    /// Data symbols `(vaddr, size)` in writable sections (`.data`, `.bss`), sorted.
    pub writable_objects: Arc<[(u64, u64)]>,
    /// Section headers with file contents: (name, vaddr, file offset, length).
    sections: Vec<(String, u64, u64, u64)>,
}

impl ElfImage {
    pub fn open(path: &Path) -> Option<Self> {
        // Only regular files that begin as ELF files do: a program maps data files too
        // (Phoenix histogram its 600 MB input, glibc the locale archive), and each mapping
        // here costs an mmap and a munmap for nothing; opening a device node the target
        // mapped could even act on the device. The path is looked at before it is opened.
        if !std::fs::metadata(path).ok()?.is_file() {
            return None;
        }
        let file = File::open(path).ok()?;
        let mut magic = [0u8; 4];
        file.read_exact_at(&mut magic, 0).ok()?;
        if magic != *b"\x7fELF" {
            return None;
        }
        // SAFETY: the file is mapped read-only and only read through slices. Another process
        // truncating it while mapped would fault; every profiler reading a target's binaries
        // accepts that, and the target itself has the same file mapped.
        let data = unsafe { Mmap::map(&file) }.ok()?;
        let facts = parse_elf(&data)?;
        Some(Self {
            data,
            segments: facts.segments,
            functions: facts.functions,
            build_id: facts.build_id,
            writable_objects: facts.writable_objects.into(),
            sections: facts.sections,
        })
    }

    /// The symbol a PLT stub at `vaddr` (in `.plt.sec` or `.plt`) jumps through: the stub's
    /// `jmp *GOT(%rip)` names a GOT slot, and the slot's `JUMP_SLOT` relocation the symbol.
    pub fn plt_symbol(&self, vaddr: u64) -> Option<String> {
        let in_plt = [".plt.sec", ".plt"].iter().any(|name| {
            self.section(name)
                .is_some_and(|(a, b)| a <= vaddr && vaddr < a + b.len() as u64)
        });
        if !in_plt {
            return None;
        }
        let mut code = [0u8; 16];
        let n = self.read_vaddr(vaddr, &mut code);
        let mut d = iced_x86::Decoder::with_ip(64, &code[..n], vaddr, 0);
        let slot = (0..3).find_map(|_| {
            let ins = d.decode();
            (ins.flow_control() == iced_x86::FlowControl::IndirectBranch
                && ins.is_ip_rel_memory_operand())
            .then(|| ins.ip_rel_memory_address())
        })?;
        let f = object::File::parse(&*self.data).ok()?;
        let (_, rel) = f.dynamic_relocations()?.find(|(off, _)| *off == slot)?;
        let object::RelocationTarget::Symbol(i) = rel.target() else {
            return None;
        };
        // A dynamic relocation's index is into `.dynsym`, not `.symtab`.
        let table = f.dynamic_symbol_table()?;
        let name = table.symbol_by_index(i).ok()?.name().ok()?;
        Some(name.to_string())
    }

    /// The ELF vaddr of the function this file exports as `name`, if it defines one.
    ///
    /// Looked up in the file's `.gnu.hash` table, as the dynamic linker does: a walk of
    /// `.dynsym` took ~50–100 µs in libstdc++ or libc, once per callee met through a PLT, on
    /// the reader's thread while the program ran (~2 of laser's 31 ms on parsec
    /// streamcluster), and a map of every export built once cost as much as the walks.
    pub fn exported_function(&self, name: &str) -> Option<u64> {
        let f = ElfFile64::<Endianness>::parse(&*self.data).ok()?;
        let (e, data) = (f.endian(), f.data());
        let symbols = f.elf_dynamic_symbol_table();
        let Ok(Some((table, _))) = f.elf_section_table().gnu_hash(e, data) else {
            // No GNU hash table (an old or `--hash-style=sysv` link): walk the symbols.
            let found = f.dynamic_symbols().find(|s| {
                s.kind() == SymbolKind::Text && s.is_definition() && s.name() == Ok(name)
            });
            return found.map(|s| s.address());
        };
        let bytes = name.as_bytes();
        // No version asked for: the first definition of the name, as the walk found it.
        let versions = VersionTable::default();
        let (_, sym) = table.find(e, bytes, gnu_hash(bytes), None, symbols, &versions)?;
        let text = matches!(sym.st_type(), STT_FUNC | STT_GNU_IFUNC);
        (text && sym.st_shndx(e) != SHN_UNDEF).then(|| sym.st_value(e))
    }

    /// ELF vaddrs of the direct calls (`e8 rel32`) to `vaddr` within [`CALLER_REACH`] of it
    /// in `.text`, in address order. Only nearby: the linker lays out a file's functions
    /// together and a library's files in its build order, so a helper's callers inside its
    /// library mostly lie close to it (glibc's `random` is 1 KiB before `random_r`), and a
    /// window of the text is scanned in ~20 µs where the whole of glibc's took 1.3 ms on the
    /// target's CPUs. A byte that only looks like a call to `vaddr` is a rare false caller,
    /// which costs a look at a function that does not call it, nothing more.
    pub fn direct_callers(&self, vaddr: u64) -> Vec<u64> {
        let Some((base, text)) = self.section(".text") else {
            return Vec::new();
        };
        let lo = vaddr.saturating_sub(CALLER_REACH).max(base);
        let hi = vaddr
            .saturating_add(CALLER_REACH)
            .min(base + text.len() as u64);
        if lo >= hi {
            return Vec::new();
        }
        let window = &text[(lo - base) as usize..(hi - base) as usize];
        window
            .windows(5)
            .enumerate()
            .filter(|(_, w)| w[0] == 0xe8)
            .filter_map(|(i, w)| {
                let site = lo + i as u64;
                let rel = i32::from_le_bytes([w[1], w[2], w[3], w[4]]);
                ((site + 5).wrapping_add_signed(i64::from(rel)) == vaddr).then_some(site)
            })
            .collect()
    }

    /// A section's ELF vaddr and bytes (`.eh_frame`, `.plt`, …), if the file has it: from the
    /// headers read at `open` (unwinding asks for `.eh_frame` once per frame).
    pub fn section(&self, name: &str) -> Option<(u64, &[u8])> {
        let &(_, addr, off, len) = self.sections.iter().find(|s| s.0 == name)?;
        let bytes = self.data.get(off as usize..(off + len) as usize)?;
        Some((addr, bytes))
    }

    /// Bytes at ELF vaddr `vaddr`, from the file-backed part of a segment.
    pub fn read_vaddr(&self, vaddr: u64, buf: &mut [u8]) -> usize {
        let Some(s) = self
            .segments
            .iter()
            .find(|s| s.vaddr <= vaddr && vaddr < s.vaddr + s.filesz)
        else {
            return 0;
        };
        let off = (s.offset + (vaddr - s.vaddr)) as usize;
        let avail = (s.vaddr + s.filesz - vaddr) as usize;
        let n = buf
            .len()
            .min(avail)
            .min(self.data.len().saturating_sub(off));
        buf[..n].copy_from_slice(&self.data[off..off + n]);
        n
    }
}

/// What the detector reads from an ELF file.
pub struct ElfFacts {
    pub segments: Vec<LoadSegment>,
    /// Function symbols `[start, end)`, sorted.
    pub functions: Vec<(u64, u64)>,
    pub build_id: Option<Vec<u8>>,
    /// Data symbols `(vaddr, size)` in writable allocated sections, sorted by address.
    pub writable_objects: Vec<(u64, u64)>,
    /// Section headers with file contents: (name, vaddr, file offset, length).
    pub sections: Vec<(String, u64, u64, u64)>,
}

/// Parse an ELF image's segments, function and writable data symbols and build-id from its
/// bytes.
pub fn parse_elf(data: &[u8]) -> Option<ElfFacts> {
    let f = object::File::parse(data).ok()?;
    let segments: Vec<LoadSegment> = f
        .segments()
        .map(|s| {
            let (offset, filesz) = s.file_range();
            LoadSegment {
                offset,
                vaddr: s.address(),
                filesz,
                memsz: s.size(),
            }
        })
        .collect();
    let mut functions: Vec<(u64, u64)> = f
        .symbols()
        .chain(f.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0 && s.is_definition())
        .map(|s| (s.address(), s.address() + s.size()))
        .collect();
    if functions.is_empty() {
        // Stripped (`strip --strip-all`): no symbols, but the unwind tables survive, and each
        // FDE covers one function. Without bounds the skid rule (decode the instruction before
        // the sampled IP) would be lost, and with it most exact accesses.
        functions = eh_frame_functions(&f);
    }
    functions.sort_unstable();
    functions.dedup();
    let build_id = f.build_id().ok().flatten().map(<[u8]>::to_vec);
    let sections = f
        .sections()
        .filter_map(|s| {
            let (off, len) = s.file_range()?;
            Some((s.name().ok()?.to_string(), s.address(), off, len))
        })
        .collect();
    Some(ElfFacts {
        sections,
        segments,
        functions,
        build_id,
        writable_objects: writable_objects(&f),
    })
}

/// `(vaddr, size)` of every sized data symbol in a writable allocated section: the globals a
/// program can store to. Read-only data (`.rodata`) cannot be contended, so it is left out.
fn writable_objects(f: &object::File<'_>) -> Vec<(u64, u64)> {
    const SHF_WRITE: u64 = 0x1;
    const SHF_ALLOC: u64 = 0x2;
    let writable = |s: &object::Symbol<'_, '_>| {
        let Some(idx) = s.section_index() else {
            return false;
        };
        match f.section_by_index(idx).map(|sec| sec.flags()) {
            Ok(SectionFlags::Elf { sh_flags, .. }) => {
                sh_flags.0 & (SHF_WRITE | SHF_ALLOC) == SHF_WRITE | SHF_ALLOC
            }
            _ => false,
        }
    };
    let mut out: Vec<(u64, u64)> = f
        .symbols()
        .filter(|s| {
            s.kind() == SymbolKind::Data && s.size() > 0 && s.is_definition() && writable(s)
        })
        .map(|s| (s.address(), s.size()))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// `[start, end)` of every FDE in `.eh_frame`: function extents of a binary with no symbols.
fn eh_frame_functions(f: &object::File<'_>) -> Vec<(u64, u64)> {
    use gimli::{BaseAddresses, CieOrFde, EhFrame, NativeEndian, UnwindSection};
    use object::ObjectSection;
    let Some(sec) = f.section_by_name(".eh_frame") else {
        return Vec::new();
    };
    let Ok(data) = sec.data() else {
        return Vec::new();
    };
    let mut eh = EhFrame::new(data, NativeEndian);
    eh.set_address_size(8);
    let mut bases = BaseAddresses::default().set_eh_frame(sec.address());
    if let Some(text) = f.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    let mut out = Vec::new();
    let mut entries = eh.entries(&bases);
    // A malformed table ends the walk; what was read so far is still right.
    while let Ok(Some(entry)) = entries.next() {
        if let CieOrFde::Fde(partial) = entry {
            if let Ok(fde) = partial.parse(|_, b, o| eh.cie_from_offset(b, o)) {
                if fde.len() > 0 {
                    out.push((fde.initial_address(), fde.initial_address() + fde.len()));
                }
            }
        }
    }
    out
}

struct LoadedModule {
    path: String,
    bias: u64,
    /// Run-time extent of the module's segments.
    lo: u64,
    hi: u64,
    image: Arc<ElfImage>,
}

/// Code read from the ELF files the target mapped, at the bias its mappings imply.
///
/// A file mapped again at another bias (the program a wrapper like `env` or a shell `exec`s maps
/// libc anew, at a new address; a second process maps it elsewhere) is one more module sharing
/// the parsed image. Lookups take the latest mapping that covers an address: after an `exec`
/// the old image's ranges are gone from the process, and the new ones may overlap them.
#[derive(Default)]
pub struct ElfCode {
    modules: Vec<LoadedModule>,
    /// Images parsed ahead of their mapping ([`ElfCode::with_preloaded`]), by path.
    preloaded: Vec<(String, Arc<ElfImage>)>,
}

impl ElfCode {
    pub fn new() -> Self {
        Self::default()
    }

    /// An `ElfCode` that takes `images` (path, parsed image) for the first mapping of each
    /// path instead of opening the file then: `laser run` parses the C library on another
    /// CPU while it starts the program, not on one the program's threads run on.
    pub fn with_preloaded(images: Vec<(String, Arc<ElfImage>)>) -> Self {
        Self {
            modules: Vec::new(),
            preloaded: images,
        }
    }

    fn module(&self, addr: u64) -> Option<&LoadedModule> {
        self.modules
            .iter()
            .rev()
            .find(|m| m.lo <= addr && addr < m.hi)
    }
}

impl CodeSource for ElfCode {
    fn read_code(&self, addr: u64, buf: &mut [u8]) -> usize {
        self.module(addr)
            .map_or(0, |m| m.image.read_vaddr(addr.wrapping_sub(m.bias), buf))
    }

    fn function_bounds(&self, addr: u64) -> Option<(u64, u64)> {
        let m = self.module(addr)?;
        let v = addr.wrapping_sub(m.bias);
        let f = &m.image.functions;
        // Symbols may nest (aliases); take the last start ≤ v that still covers it.
        let i = f.partition_point(|s| s.0 <= v);
        f[..i]
            .iter()
            .rev()
            .take(8)
            .find(|s| v < s.1)
            .map(|&(s, e)| (s.wrapping_add(m.bias), e.wrapping_add(m.bias)))
    }

    fn call_target(&self, addr: u64) -> Option<u64> {
        let Some(i) = self
            .modules
            .iter()
            .rposition(|m| m.lo <= addr && addr < m.hi)
        else {
            return Some(addr);
        };
        let m = &self.modules[i];
        let Some(name) = m.image.plt_symbol(addr.wrapping_sub(m.bias)) else {
            return Some(addr);
        };
        // The dynamic linker binds a symbol to the first object in load order that defines
        // it: the files mapped after the caller's, in the order they were (a wrapper's own
        // libraries, mapped before it, are another process's).
        self.modules[i + 1..]
            .iter()
            .filter(|o| !Arc::ptr_eq(&o.image, &m.image))
            .find_map(|o| {
                let v = o.image.exported_function(&name)?;
                Some(v.wrapping_add(o.bias))
            })
    }

    fn direct_callers(&self, addr: u64) -> Vec<u64> {
        let Some(m) = self.module(addr) else {
            return Vec::new();
        };
        m.image
            .direct_callers(addr.wrapping_sub(m.bias))
            .into_iter()
            .map(|v| v.wrapping_add(m.bias))
            .collect()
    }

    fn map_file(&mut self, m: &FileMapping<'_>) -> Option<ModuleLayout> {
        let layout = |l: &LoadedModule| ModuleLayout {
            bias: l.bias,
            segments: l.image.segments.clone(),
            build_id: l.image.build_id.clone(),
            writable_objects: l.image.writable_objects.clone(),
        };
        // Another segment of a load already known (its address lies in that load's extent).
        if let Some(l) = self
            .modules
            .iter()
            .rev()
            .find(|l| l.path == m.path && l.lo <= m.start && m.start < l.hi)
        {
            return Some(layout(l));
        }
        // The file loaded again elsewhere: the parsed image is shared.
        let image = match self.modules.iter().rev().find(|l| l.path == m.path) {
            Some(l) => l.image.clone(),
            None => match self.preloaded.iter().position(|(p, _)| p == m.path) {
                Some(i) => self.preloaded.swap_remove(i).1,
                None => Arc::new(ElfImage::open(Path::new(m.path))?),
            },
        };
        let bias = load_bias(m.start, m.pgoff, &image.segments);
        let lo = image.segments.iter().map(|s| s.vaddr).min()?;
        let hi = image.segments.iter().map(|s| s.vaddr + s.memsz).max()?;
        self.modules.push(LoadedModule {
            path: m.path.to_string(),
            bias,
            lo: lo.wrapping_add(bias),
            hi: hi.wrapping_add(bias),
            image,
        });
        self.modules.last().map(layout)
    }
}

/// Code read from a live process's memory (`/proc/PID/mem`): for code with no file behind it
/// (JIT, `memfd`, deleted binaries). Reading a file is the only OS contact; a process that
/// exits makes reads return 0.
pub struct ProcessCode {
    mem: File,
}

impl ProcessCode {
    /// Opens `/proc/PID/mem` (needs ptrace access to the target: same user, or root).
    pub fn open(pid: u32) -> std::io::Result<Self> {
        Ok(Self {
            mem: File::open(format!("/proc/{pid}/mem"))?,
        })
    }
}

impl CodeSource for ProcessCode {
    fn read_code(&self, addr: u64, buf: &mut [u8]) -> usize {
        // A range crossing into an unmapped page fails as a whole: retry the part up to the
        // page boundary, which is where instructions near a mapping's end live.
        self.mem.read_at(buf, addr).unwrap_or_else(|_| {
            let to_page = (0x1000 - (addr & 0xfff)) as usize;
            if to_page < buf.len() {
                self.mem.read_at(&mut buf[..to_page], addr).unwrap_or(0)
            } else {
                0
            }
        })
    }
}

/// Try `A` first, then `B`: e.g. `Fallback(ElfCode::new(), ProcessCode::open(pid)?)` reads
/// code from files where there are files and from memory elsewhere.
pub struct Fallback<A, B>(pub A, pub B);

impl<A: CodeSource, B: CodeSource> CodeSource for Fallback<A, B> {
    fn read_code(&self, addr: u64, buf: &mut [u8]) -> usize {
        match self.0.read_code(addr, buf) {
            0 => self.1.read_code(addr, buf),
            n => n,
        }
    }

    fn function_bounds(&self, addr: u64) -> Option<(u64, u64)> {
        self.0
            .function_bounds(addr)
            .or_else(|| self.1.function_bounds(addr))
    }

    fn call_target(&self, addr: u64) -> Option<u64> {
        self.0.call_target(addr)
    }

    fn direct_callers(&self, addr: u64) -> Vec<u64> {
        let a = self.0.direct_callers(addr);
        if a.is_empty() {
            self.1.direct_callers(addr)
        } else {
            a
        }
    }

    fn map_file(&mut self, m: &FileMapping<'_>) -> Option<ModuleLayout> {
        let a = self.0.map_file(m);
        let b = self.1.map_file(m);
        a.or(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The system's C library (laser's tests are linked statically, so their own maps have
    /// none): the one the C compiler links programs against.
    fn own_libc() -> std::path::PathBuf {
        let out = std::process::Command::new("cc")
            .arg("-print-file-name=libc.so.6")
            .output()
            .expect("cc runs");
        let named = String::from_utf8(out.stdout).unwrap();
        std::fs::canonicalize(named.trim()).expect("cc names an existing libc.so.6")
    }

    /// glibc's `random` takes its lock around a call of `random_r`: the direct callers of
    /// `random_r` include a site inside `random`, which is where the lock's atomic update is.
    #[test]
    fn direct_callers_find_where_glibc_calls_random_r() {
        let image = ElfImage::open(&own_libc()).unwrap();
        let data = std::fs::read(own_libc()).unwrap();
        let f = object::File::parse(&*data).unwrap();
        let sym = |name: &str| {
            f.dynamic_symbols()
                .find(|s| s.name() == Ok(name))
                .map(|s| (s.address(), s.address() + s.size()))
                .unwrap()
        };
        let (random, random_end) = sym("random");
        let sites = image.direct_callers(sym("random_r").0);
        assert!(
            sites.iter().any(|&c| random <= c && c < random_end),
            "callers {sites:x?}, random at {random:#x}..{random_end:#x}"
        );
        assert!(
            sites.len() <= 4,
            "a helper called from a few places: {sites:x?}"
        );
        // And the call is one: the bytes at the site decode as a call to random_r.
        for &c in &sites {
            let mut b = [0u8; 5];
            assert_eq!(image.read_vaddr(c, &mut b), 5);
            let ins = iced_x86::Decoder::with_ip(64, &b, c, 0).decode();
            assert_eq!(ins.near_branch_target(), sym("random_r").0, "{ins}");
        }
    }

    /// The `.gnu.hash` lookup names the function a walk of `.dynsym` names, for every
    /// function libc exports, and nothing for names it does not define (an import, a data
    /// object, a name it lacks).
    #[test]
    fn exported_functions_are_found_through_the_hash_table() {
        let image = ElfImage::open(&own_libc()).unwrap();
        let data = std::fs::read(own_libc()).unwrap();
        let f = object::File::parse(&*data).unwrap();
        let walk = |name: &str| {
            f.dynamic_symbols()
                .find(|s| s.kind() == SymbolKind::Text && s.is_definition() && s.name() == Ok(name))
                .map(|s| s.address())
        };
        let mut names: Vec<&str> = f
            .dynamic_symbols()
            .filter(|s| s.kind() == SymbolKind::Text && s.is_definition())
            .filter_map(|s| s.name().ok())
            .collect();
        assert!(
            names.len() > 1000,
            "libc exports its functions: {}",
            names.len()
        );
        names.dedup();
        for name in names {
            assert_eq!(image.exported_function(name), walk(name), "{name}");
        }
        let import = f
            .dynamic_symbols()
            .find(|s| s.is_undefined() && s.name().is_ok_and(|n| !n.is_empty()))
            .and_then(|s| s.name().ok())
            .expect("libc imports a symbol (from the dynamic loader)");
        assert_eq!(image.exported_function(import), None, "{import}");
        assert_eq!(image.exported_function("environ"), None, "a data object");
        assert_eq!(image.exported_function("no_such_function_in_libc"), None);
        assert!(image.exported_function("random").is_some());
    }

    /// A wrapper (`env`, a shell) maps libc, then `exec`s the program, which maps libc again
    /// at another address: code must be read at the new bias too (it was read at the first
    /// one, so every sample in libc came out undecodable).
    #[test]
    fn a_file_mapped_again_at_another_bias_is_read_at_both() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let path = exe.to_str().unwrap();
        let image = ElfImage::open(&exe).unwrap();
        let first = image.segments.iter().min_by_key(|s| s.vaddr).unwrap();
        assert_eq!(first.offset, 0, "first PT_LOAD maps the file from offset 0");
        let &(f, fe) = image.functions.iter().find(|f| f.1 - f.0 >= 8).unwrap();
        let mut want = [0u8; 8];
        assert_eq!(image.read_vaddr(f, &mut want), 8);
        let mut code = ElfCode::new();
        let mut at = |base: u64| {
            let l = code
                .map_file(&FileMapping {
                    path,
                    start: base + first.vaddr,
                    end: base + first.vaddr + 4096,
                    pgoff: 0,
                    exec: false,
                })
                .unwrap();
            assert_eq!(l.bias, base);
        };
        at(0x5555_0000_0000);
        at(0x7f00_0000_0000);
        for base in [0x5555_0000_0000u64, 0x7f00_0000_0000] {
            let mut got = [0u8; 8];
            assert_eq!(code.read_code(base + f, &mut got), 8, "at bias {base:#x}");
            assert_eq!(got, want);
            assert_eq!(code.function_bounds(base + f), Some((base + f, base + fe)));
        }
        // Another segment of a known load is the same load, not a new one.
        let text = image.segments.iter().find(|s| s.offset > 0).unwrap();
        let l = code
            .map_file(&FileMapping {
                path,
                start: 0x5555_0000_0000 + (text.vaddr & !4095),
                end: 0x5555_0000_0000 + (text.vaddr & !4095) + 4096,
                pgoff: text.offset & !4095,
                exec: true,
            })
            .unwrap();
        assert_eq!(l.bias, 0x5555_0000_0000);
        assert_eq!(code.modules.len(), 2);
    }

    /// A preloaded image stands for its path's first mapping: no file is opened then (here
    /// the path does not even exist), and a second mapping shares it.
    #[test]
    fn a_preloaded_image_is_taken_for_its_path() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let image = Arc::new(ElfImage::open(&exe).unwrap());
        let first = *image.segments.iter().min_by_key(|s| s.vaddr).unwrap();
        let path = "/nonexistent/laser-test/libpreloaded.so";
        let mapping = |base: u64| FileMapping {
            path,
            start: base + first.vaddr,
            end: base + first.vaddr + 4096,
            pgoff: 0,
            exec: false,
        };
        assert!(ElfCode::new().map_file(&mapping(0x1000_0000)).is_none());
        let mut code = ElfCode::with_preloaded(vec![(path.to_string(), image.clone())]);
        let l = code
            .map_file(&mapping(0x1000_0000))
            .expect("the preloaded image");
        assert_eq!((l.bias, &l.segments), (0x1000_0000, &image.segments));
        assert!(code.map_file(&mapping(0x2000_0000)).is_some());
        assert!(Arc::ptr_eq(&code.modules[0].image, &code.modules[1].image));
        assert!(code.preloaded.is_empty());
    }

    #[test]
    fn memory_code_reads_within_chunks() {
        let mut c = MemoryCode::new();
        c.add_function(0x1000, vec![1, 2, 3, 4]);
        c.add(0x2000, vec![9; 16]);
        let mut b = [0u8; 8];
        assert_eq!(c.read_code(0x1001, &mut b), 3);
        assert_eq!(&b[..3], &[2, 3, 4]);
        assert_eq!(c.read_code(0x1004, &mut b), 0);
        assert_eq!(c.read_code(0xfff, &mut b), 0);
        assert_eq!(c.read_code(0x2008, &mut b), 8);
        assert_eq!(c.function_bounds(0x1003), Some((0x1000, 0x1004)));
        assert_eq!(c.function_bounds(0x1004), None);
        assert_eq!(
            c.function_bounds(0x2000),
            None,
            "no bounds for plain chunks"
        );
    }

    #[test]
    fn fallback_reads_second_where_first_has_nothing() {
        let mut a = MemoryCode::new();
        a.add_function(0x1000, vec![0x90; 4]);
        let mut b = MemoryCode::new();
        b.add_function(0x2000, vec![0xc3; 2]);
        let f: Box<dyn CodeSource> = Box::new(Fallback(a, b));
        let mut buf = [0u8; 4];
        assert_eq!(f.read_code(0x1000, &mut buf), 4);
        assert_eq!(buf, [0x90; 4]);
        assert_eq!(f.read_code(0x2000, &mut buf), 2);
        assert_eq!(buf[0], 0xc3);
        assert_eq!(f.function_bounds(0x2001), Some((0x2000, 0x2002)));
        assert_eq!(f.read_code(0x3000, &mut buf), 0);
    }

    #[test]
    fn process_code_reads_own_memory() {
        // Our own code, read through /proc/self/mem, matches the bytes in memory.
        let p = ProcessCode::open(std::process::id()).unwrap();
        let f = fallback_reads_second_where_first_has_nothing as fn() as usize as u64;
        let mut buf = [0u8; 16];
        assert_eq!(p.read_code(f, &mut buf), 16);
        // SAFETY: `f` is the address of a function of this binary, mapped readable and
        // executable for the life of the process; 16 bytes from a function's start stay
        // inside the text mapping (the test reads the same range through /proc above).
        let direct = unsafe { std::slice::from_raw_parts(f as *const u8, 16) };
        assert_eq!(&buf, direct);
        assert_eq!(p.read_code(0, &mut buf), 0, "unmapped page");
    }

    // Two statics of sizes nothing else in this binary has: one writable, one read-only.
    #[used]
    static mut WRITABLE_PROBE: [u8; 4099] = [0; 4099];
    #[used]
    static READ_ONLY_PROBE: [u8; 4097] = [1; 4097];

    #[test]
    fn writable_objects_are_the_globals_a_program_can_store_to() {
        let exe = std::env::current_exe().unwrap();
        let img = ElfImage::open(&exe).expect("own executable parses");
        let sizes: Vec<u64> = img.writable_objects.iter().map(|o| o.1).collect();
        assert!(sizes.contains(&4099), "the static mut is listed");
        assert!(!sizes.contains(&4097), "read-only data is not");
        assert!(img.writable_objects.windows(2).all(|w| w[0] <= w[1]));
        let _ = (std::ptr::addr_of!(WRITABLE_PROBE), &READ_ONLY_PROBE);
    }

    #[test]
    fn parse_elf_rejects_garbage() {
        assert!(parse_elf(b"not an elf").is_none());
        assert!(parse_elf(&[]).is_none());
    }

    #[test]
    fn only_regular_elf_files_are_opened() {
        // A data file the target maps (an input, the locale archive), a device node and a
        // FIFO are passed over without being mapped (the FIFO without being opened: opening
        // it would wait for a writer forever).
        let dir = std::env::temp_dir().join(format!("laser-code-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let data = dir.join("input.bmp");
        std::fs::write(&data, vec![0x42u8; 8192]).unwrap();
        assert!(ElfImage::open(&data).is_none());
        let short = dir.join("short");
        std::fs::write(&short, b"\x7fE").unwrap();
        assert!(ElfImage::open(&short).is_none());
        assert!(ElfImage::open(Path::new("/dev/zero")).is_none());
        assert!(ElfImage::open(&dir).is_none());
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo reads a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(ElfImage::open(&fifo).is_none());
        let mut code = ElfCode::new();
        let mapping = |path| FileMapping {
            path,
            start: 0x10000,
            end: 0x12000,
            pgoff: 0,
            exec: false,
        };
        assert!(code.map_file(&mapping(data.to_str().unwrap())).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reads_own_test_binary() {
        // This test binary is an ELF with symbols: its segments and functions parse, and the
        // bytes at a function's vaddr match the file.
        let exe = std::env::current_exe().unwrap();
        let img = ElfImage::open(&exe).expect("own executable parses");
        assert!(!img.segments.is_empty());
        assert!(!img.functions.is_empty());
        let (f, e) = img.functions[img.functions.len() / 2];
        let mut b = [0u8; 4];
        let n = img.read_vaddr(f, &mut b);
        assert_eq!(n, 4.min((e - f) as usize));
    }
}
