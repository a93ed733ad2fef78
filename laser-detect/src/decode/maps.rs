//! The target's address space: `/proc/PID/maps` text, kept current by `Mmap` events, and the
//! question the filter asks of every address: module code/data, heap, stack, or dropped.
//!
//! Load bias of a file mapping, from its file offset and the ELF program header (`PT_LOAD`)
//! whose file range contains that offset:
//!
//! ```text
//!   file:    |--- p_offset ---|== segment ==|
//!   ELF va:  |--- p_vaddr ----|== segment ==|
//!   mapped at `start` from file offset `pgoff` (page-aligned, inside the segment):
//!   vaddr(start) = p_vaddr + (pgoff − p_offset)
//!   bias         = start − vaddr(start)          run-time address = ELF vaddr + bias
//! ```
//!
//! Without program headers (file unreadable) the bias falls back to `start − pgoff`, right for
//! the usual layout where the first segment has `p_vaddr == p_offset` (PIE, shared libraries).

use std::cell::Cell;

/// Addresses at or above this are kernel addresses (x86-64 canonical upper half).
pub const KERNEL_START: u64 = 0xffff_8000_0000_0000;

/// Where a forked copy's number goes in the addresses the detector keys its private memory
/// by ([`AddressSpace::copy`]): user addresses end below 2^47, so bits 48–62 are free, and a
/// keyed address stays below [`KERNEL_START`].
const COPY_SHIFT: u32 = 48;
/// The largest copy number; later forks share it (their lines are kept apart from the
/// original's, not from each other's).
pub const MAX_COPY: u16 = 0x7fff;

/// `addr` in forked copy `copy`'s private memory, as the detector keys it (`copy` 0: the
/// address itself).
pub fn copy_key(addr: u64, copy: u16) -> u64 {
    addr | (u64::from(copy.min(MAX_COPY)) << COPY_SHIFT)
}

/// The copy a keyed address belongs to (0: an original process, or shared memory) and the
/// address in that process.
pub fn split_copy(key: u64) -> (u16, u64) {
    if key >= KERNEL_START {
        return (0, key);
    }
    ((key >> COPY_SHIFT) as u16, key & ((1 << COPY_SHIFT) - 1))
}

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    pub start: u64,
    pub end: u64,
    pub read: bool,
    pub write: bool,
    pub exec: bool,
    pub offset: u64,
    pub inode: u64,
    /// File path, `[heap]`, `[stack]`, `[vdso]`, … or empty for anonymous memory.
    pub path: String,
    /// `MAP_SHARED` (`s` in the maps text): the same memory in every process that maps it.
    pub shared: bool,
}

/// Parse `/proc/PID/maps` text. Malformed lines are skipped (the kernel's format is fixed, so a
/// bad line means a truncated capture, and the rest is still useful).
pub fn parse(text: &str) -> Vec<Region> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Region> {
    // 7f1c2a000000-7f1c2a021000 rw-p 00000000 00:00 0          [heap]
    let mut it = line.splitn(6, ' ');
    let range = it.next()?;
    let perms = it.next()?.as_bytes();
    let offset = u64::from_str_radix(it.next()?, 16).ok()?;
    let _dev = it.next()?;
    let inode = it.next()?.parse().ok()?;
    let path = it.next().unwrap_or("").trim_start().to_string();
    let (s, e) = range.split_once('-')?;
    let start = u64::from_str_radix(s, 16).ok()?;
    let end = u64::from_str_radix(e, 16).ok()?;
    if perms.len() < 4 || end <= start {
        return None;
    }
    Some(Region {
        start,
        end,
        read: perms[0] == b'r',
        write: perms[1] == b'w',
        exec: perms[2] == b'x',
        offset,
        inode,
        path,
        shared: perms[3] == b's',
    })
}

/// One loadable segment of an ELF file, as the bias computation needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    pub offset: u64,
    pub vaddr: u64,
    pub filesz: u64,
    pub memsz: u64,
}

/// Load bias of a mapping of file offset `pgoff` at `start` (see the module docs).
pub fn load_bias(start: u64, pgoff: u64, segments: &[LoadSegment]) -> u64 {
    let page = |x: u64| x & !0xfff;
    let seg = segments
        .iter()
        .find(|s| page(s.offset) <= pgoff && pgoff < s.offset + s.filesz.max(1))
        .or_else(|| segments.iter().find(|s| page(s.offset) == page(pgoff)));
    match seg {
        Some(s) => start
            .wrapping_sub(pgoff)
            .wrapping_sub(s.vaddr.wrapping_sub(s.offset)),
        None => start.wrapping_sub(pgoff),
    }
}

/// What a mapping holds, for the filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// A file mapping (or the anonymous `.bss` right after one): index into the module list.
    Module(u32),
    /// `[heap]` and anonymous memory.
    Heap,
    /// `[stack]` or an anonymous mapping a thread's stack pointer was seen in.
    Stack,
    /// `[vdso]`, `[vvar]`, `[vsyscall]`: kernel-provided pages; dropped.
    Special,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub exec: bool,
    pub owner: Owner,
    /// `MAP_SHARED` ([`Region::shared`]).
    pub shared: bool,
}

/// A module (file) known in this address space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    pub path: String,
    pub bias: u64,
    /// Run-time extent of all its `PT_LOAD` segments (memsz, so `.bss` included), if known.
    pub span: Option<(u64, u64)>,
    pub build_id: Option<Vec<u8>>,
}

/// Where an address lies, as the filter decides it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Module {
        module: u32,
        vaddr: u64,
    },
    Heap,
    Stack,
    /// vdso/vvar/vsyscall or kernel: dropped.
    Special,
    Unknown,
}

/// Per-process address-space model. Mappings are kept sorted and non-overlapping; a new
/// mapping replaces whatever it overlaps, as `mmap(MAP_FIXED)` does.
#[derive(Clone, Debug, Default)]
pub struct AddressSpace {
    maps: Vec<Mapping>,
    pub modules: Vec<Module>,
    /// Non-zero: a copy a `fork` made of another process's space, not replaced by an `exec`
    /// since. Its private memory is at the same addresses as the original's but is other
    /// memory, so the detector keeps its lines apart ([`copy_line`]).
    pub copy: u16,
    /// Index of the mapping the last lookup hit: consecutive accesses mostly hit the same one.
    hint: Cell<usize>,
}

fn owner_of_name(path: &str) -> Option<Owner> {
    match path {
        // perf names anonymous memory in MMAP2 records `//anon` (maps text leaves it empty).
        "" | "[heap]" | "//anon" => Some(Owner::Heap),
        // Shared anonymous memory (`MAP_SHARED | MAP_ANONYMOUS`) is a deleted shmem file.
        "/dev/zero (deleted)" => Some(Owner::Heap),
        "[stack]" => Some(Owner::Stack),
        "[vdso]" | "[vvar]" | "[vsyscall]" | "[vvar_vclock]" | "[uprobes]" => Some(Owner::Special),
        p if p.starts_with("[stack:") => Some(Owner::Stack),
        p if p.starts_with('[') => Some(Owner::Heap), // [anon:…] names
        _ => None,
    }
}

impl AddressSpace {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn mappings(&self) -> &[Mapping] {
        &self.maps
    }

    /// Index of the module for `path`, creating it with `bias` if new. The first mapping of a
    /// file fixes its bias (later mappings of the same file share it).
    pub fn module_index(&mut self, path: &str, bias: u64) -> u32 {
        if let Some(i) = self.modules.iter().position(|m| m.path == path) {
            return i as u32;
        }
        self.modules.push(Module {
            path: path.to_string(),
            bias,
            span: None,
            build_id: None,
        });
        (self.modules.len() - 1) as u32
    }

    /// Record a module's segments: its run-time span lets the anonymous `.bss` mapping that
    /// follows the file-backed data count as module data, not heap.
    pub fn set_module_layout(&mut self, module: u32, segments: &[LoadSegment]) {
        let Some(m) = self.modules.get_mut(module as usize) else {
            return;
        };
        let lo = segments.iter().map(|s| s.vaddr).min();
        let hi = segments.iter().map(|s| s.vaddr + s.memsz).max();
        if let (Some(lo), Some(hi)) = (lo, hi) {
            m.span = Some((lo.wrapping_add(m.bias), hi.wrapping_add(m.bias)));
        }
        let span = m.span;
        if let Some((lo, hi)) = span {
            for map in &mut self.maps {
                if map.owner == Owner::Heap && map.start >= lo && map.start < hi {
                    map.owner = Owner::Module(module);
                }
            }
        }
    }

    /// Insert a mapping, replacing the parts of older mappings it overlaps.
    pub fn insert(&mut self, start: u64, end: u64, exec: bool, owner: Owner) {
        if end <= start {
            return;
        }
        let owner = match owner {
            Owner::Heap => self.bss_owner(start, end).unwrap_or(Owner::Heap),
            o => o,
        };
        let mut out = Vec::with_capacity(self.maps.len() + 2);
        for m in self.maps.drain(..) {
            if m.end <= start || m.start >= end {
                out.push(m);
                continue;
            }
            if m.start < start {
                out.push(Mapping {
                    end: start,
                    ..m.clone()
                });
            }
            if m.end > end {
                out.push(Mapping { start: end, ..m });
            }
        }
        let pos = out.partition_point(|m| m.start < start);
        out.insert(
            pos,
            Mapping {
                start,
                end,
                exec,
                owner,
                shared: false,
            },
        );
        self.maps = out;
    }

    fn bss_owner(&self, start: u64, end: u64) -> Option<Owner> {
        self.modules.iter().enumerate().find_map(|(i, m)| {
            let (lo, hi) = m.span?;
            (start >= lo && start < hi && end > start).then_some(Owner::Module(i as u32))
        })
    }

    /// Insert a region from maps text or an `Mmap` event. File mappings get a module; the
    /// caller supplies the bias (from [`load_bias`]).
    pub fn insert_region(&mut self, r: &Region, bias: u64) -> Option<u32> {
        let module = match owner_of_name(&r.path) {
            Some(o) => {
                self.insert(r.start, r.end, r.exec, o);
                None
            }
            None => {
                let idx = self.module_index(&r.path, bias);
                self.insert(r.start, r.end, r.exec, Owner::Module(idx));
                Some(idx)
            }
        };
        if r.shared {
            if let Some(m) = self.maps.iter_mut().find(|m| m.start == r.start) {
                m.shared = true;
            }
        }
        module
    }

    /// Whether `addr` is this process's own memory: anything but a `MAP_SHARED` mapping
    /// (memory no mapping is known for included, as `brk` growth is).
    pub fn is_private(&self, addr: u64) -> bool {
        !self.find(addr).is_some_and(|m| m.shared)
    }

    #[inline]
    pub fn find(&self, addr: u64) -> Option<&Mapping> {
        if let Some(m) = self.maps.get(self.hint.get()) {
            if m.start <= addr && addr < m.end {
                return Some(m);
            }
        }
        let i = self
            .maps
            .partition_point(|m| m.start <= addr)
            .checked_sub(1)?;
        let m = self.maps.get(i)?;
        if addr < m.end {
            self.hint.set(i);
            Some(m)
        } else {
            None
        }
    }

    /// Classify a data or code address.
    #[inline]
    pub fn classify(&self, addr: u64) -> Class {
        if addr >= KERNEL_START {
            return Class::Special;
        }
        match self.find(addr).map(|m| m.owner) {
            Some(Owner::Module(i)) => Class::Module {
                module: i,
                vaddr: addr.wrapping_sub(self.modules[i as usize].bias),
            },
            Some(Owner::Heap) => Class::Heap,
            Some(Owner::Stack) => Class::Stack,
            Some(Owner::Special) => Class::Special,
            // Streams without data mmaps (perf records only executable mappings unless asked)
            // still know each module's extent from its program headers: globals are there.
            None => self
                .modules
                .iter()
                .position(|m| m.span.is_some_and(|(lo, hi)| lo <= addr && addr < hi))
                .map_or(Class::Unknown, |i| Class::Module {
                    module: i as u32,
                    vaddr: addr.wrapping_sub(self.modules[i].bias),
                }),
        }
    }

    /// A thread's stack pointer was seen at `sp`: the anonymous mapping holding it is a thread
    /// stack (glibc allocates them with plain `mmap`, indistinguishable from heap otherwise).
    /// If no mapping is known there (the stream carried no data mmaps), a synthetic stack
    /// mapping of the surrounding 64 KiB is recorded, clipped to its neighbours.
    /// Returns the stack's extent.
    pub fn note_stack_pointer(&mut self, sp: u64) -> Option<(u64, u64)> {
        if sp == 0 || sp >= KERNEL_START {
            return None;
        }
        let i = self.maps.partition_point(|m| m.start <= sp);
        if let Some(m) = i.checked_sub(1).and_then(|j| self.maps.get_mut(j)) {
            if sp < m.end {
                return match m.owner {
                    Owner::Heap | Owner::Stack => {
                        m.owner = Owner::Stack;
                        Some((m.start, m.end))
                    }
                    _ => None,
                };
            }
        }
        let prev_end = i.checked_sub(1).map_or(0, |j| self.maps[j].end);
        let next_start = self.maps.get(i).map_or(KERNEL_START, |m| m.start);
        let lo = (sp & !0xfff).saturating_sub(0x4000).max(prev_end);
        let hi = ((sp & !0xfff) + 0xc000).min(next_start);
        self.insert(lo, hi, false, Owner::Stack);
        Some((lo, hi))
    }
}

/// The address spaces of a stream's processes by pid, remembering the last one asked for:
/// nearly every sample comes from the process of the one before, and a hash lookup per
/// sample was ~4% of the detector's replay instructions.
#[derive(Clone, Debug, Default)]
pub struct Spaces {
    spaces: Vec<(u32, AddressSpace)>,
    index: hashbrown::HashMap<u32, usize>,
    last: Option<(u32, usize)>,
}

impl Spaces {
    pub fn get(&self, pid: u32) -> Option<&AddressSpace> {
        self.index.get(&pid).map(|&i| &self.spaces[i].1)
    }

    /// The space of `pid`, empty at first.
    #[inline]
    pub fn entry(&mut self, pid: u32) -> &mut AddressSpace {
        let i = match self.last {
            Some((p, i)) if p == pid => i,
            _ => self.find_or_add(pid),
        };
        &mut self.spaces[i].1
    }

    #[cold]
    fn find_or_add(&mut self, pid: u32) -> usize {
        let n = self.spaces.len();
        let i = *self.index.entry(pid).or_insert(n);
        if i == n {
            self.spaces.push((pid, AddressSpace::new()));
        }
        self.last = Some((pid, i));
        i
    }

    /// Replaces the space of `pid` (a new program image, or a child's copy of its parent's).
    pub fn insert(&mut self, pid: u32, space: AddressSpace) {
        *self.entry(pid) = space;
    }

    /// Each pid and its space, in the order the pids were first seen.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &AddressSpace)> + '_ {
        self.spaces.iter().map(|(pid, space)| (*pid, space))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_anon_name_is_heap() {
        // A live MMAP2 record of anonymous memory carries the name `//anon`.
        assert!(matches!(owner_of_name("//anon"), Some(Owner::Heap)));
        assert!(matches!(owner_of_name(""), Some(Owner::Heap)));
        assert!(owner_of_name("/usr/lib/libc.so.6").is_none());
    }

    const MAPS: &str = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 1234                       /usr/bin/app
55d0c0a01000-55d0c0a02000 r-xp 00001000 08:01 1234                       /usr/bin/app
55d0c0a03000-55d0c0a04000 rw-p 00002000 08:01 1234                       /usr/bin/app
55d0c0a04000-55d0c0a05000 rw-p 00000000 00:00 0 
55d0c1000000-55d0c1021000 rw-p 00000000 00:00 0                          [heap]
7f00aa000000-7f00aa800000 rw-p 00000000 00:00 0 
7f00ab000000-7f00ab028000 r--p 00000000 08:01 99                         /usr/lib/x86_64-linux-gnu/libc.so.6
7f00ab028000-7f00ab1bd000 r-xp 00028000 08:01 99                         /usr/lib/x86_64-linux-gnu/libc.so.6
7ffd11100000-7ffd11121000 rw-p 00000000 00:00 0                          [stack]
7ffd111f0000-7ffd111f4000 r--p 00000000 00:00 0                          [vvar]
7ffd111f4000-7ffd111f6000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";

    fn space() -> AddressSpace {
        let mut s = AddressSpace::new();
        for r in parse(MAPS) {
            s.insert_region(&r, r.start - r.offset);
        }
        s
    }

    #[test]
    fn parses_every_field() {
        let v = parse(MAPS);
        assert_eq!(v.len(), 12);
        assert_eq!(v[1].start, 0x55d0c0a01000);
        assert_eq!(v[1].end, 0x55d0c0a02000);
        assert!(v[1].exec && v[1].read && !v[1].write);
        assert_eq!(v[1].offset, 0x1000);
        assert_eq!(v[1].inode, 1234);
        assert_eq!(v[1].path, "/usr/bin/app");
        assert_eq!(v[3].path, "", "anonymous");
        assert_eq!(v[4].path, "[heap]");
    }

    #[test]
    fn skips_malformed_lines() {
        let v = parse("garbage\n1000-2000 r-xp 0 00:00 0 /x\n2000-1000 r-xp 0 00:00 0 /y\n\n");
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].path, "/x");
    }

    #[test]
    fn path_with_spaces_is_kept() {
        let v = parse("1000-2000 r-xp 00000000 08:01 7    /opt/my app/lib.so (deleted)\n");
        assert_eq!(v[0].path, "/opt/my app/lib.so (deleted)");
    }

    #[test]
    fn classifies_regions() {
        let s = space();
        let app_bias = 0x55d0c0a00000;
        assert_eq!(
            s.classify(0x55d0c0a01234),
            Class::Module {
                module: 0,
                vaddr: 0x55d0c0a01234 - app_bias
            }
        );
        assert_eq!(s.classify(0x55d0c1000010), Class::Heap);
        assert_eq!(s.classify(0x7f00aa000100), Class::Heap, "anonymous");
        assert_eq!(s.classify(0x7ffd11120000), Class::Stack);
        assert_eq!(s.classify(0x7ffd111f4100), Class::Special, "vdso");
        assert_eq!(s.classify(0x7ffd111f0100), Class::Special, "vvar");
        assert_eq!(s.classify(0xffffffffff600000), Class::Special, "vsyscall");
        assert_eq!(s.classify(0xffffffff81000000), Class::Special, "kernel");
        assert_eq!(s.classify(0x1000), Class::Unknown);
        match s.classify(0x7f00ab030000) {
            Class::Module { module, vaddr } => {
                assert_eq!(
                    s.modules[module as usize].path,
                    "/usr/lib/x86_64-linux-gnu/libc.so.6"
                );
                assert_eq!(vaddr, 0x30000);
            }
            c => panic!("{c:?}"),
        }
    }

    #[test]
    fn bss_after_module_is_module_data() {
        let mut s = space();
        // The app's PT_LOAD segments: data segment memsz reaches into the anonymous page.
        let segs = [
            LoadSegment {
                offset: 0,
                vaddr: 0,
                filesz: 0x1000,
                memsz: 0x1000,
            },
            LoadSegment {
                offset: 0x1000,
                vaddr: 0x1000,
                filesz: 0x1000,
                memsz: 0x1000,
            },
            LoadSegment {
                offset: 0x2000,
                vaddr: 0x3000,
                filesz: 0x800,
                memsz: 0x1800,
            },
        ];
        s.set_module_layout(0, &segs);
        assert_eq!(
            s.classify(0x55d0c0a04010),
            Class::Module {
                module: 0,
                vaddr: 0x4010
            }
        );
    }

    #[test]
    fn bias_from_program_headers() {
        // A non-PIE-like layout: the data segment's vaddr is 0x1000 above its file offset.
        let segs = [
            LoadSegment {
                offset: 0,
                vaddr: 0x400000,
                filesz: 0x2000,
                memsz: 0x2000,
            },
            LoadSegment {
                offset: 0x2e10,
                vaddr: 0x403e10,
                filesz: 0x220,
                memsz: 0x300,
            },
        ];
        assert_eq!(load_bias(0x400000, 0, &segs), 0);
        assert_eq!(load_bias(0x403000, 0x2000, &segs), 0);
        // PIE: same file mapped at 0x5555_0000_0000 - 0x400000.
        let b = 0x5555_0000_0000u64;
        assert_eq!(load_bias(b + 0x403000, 0x2000, &segs), b);
        assert_eq!(
            load_bias(0x7000, 0x3000, &[]),
            0x4000,
            "fallback start − pgoff"
        );
    }

    #[test]
    fn mmap_replaces_overlap() {
        let mut s = space();
        // dlopen over the middle of the anonymous region.
        s.insert(0x7f00aa100000, 0x7f00aa200000, true, Owner::Module(7));
        assert_eq!(s.find(0x7f00aa0fffff).unwrap().owner, Owner::Heap);
        assert_eq!(s.find(0x7f00aa100000).unwrap().owner, Owner::Module(7));
        assert_eq!(s.find(0x7f00aa200000).unwrap().owner, Owner::Heap);
        let n = s.mappings().len();
        assert!(s.mappings().windows(2).all(|w| w[0].end <= w[1].start));
        assert_eq!(n, 14);
    }

    #[test]
    fn thread_stack_identified_by_sp() {
        let mut s = space();
        assert_eq!(s.classify(0x7f00aa7ff000), Class::Heap);
        assert_eq!(
            s.note_stack_pointer(0x7f00aa7fe000),
            Some((0x7f00aa000000, 0x7f00aa800000))
        );
        assert_eq!(s.classify(0x7f00aa7ff000), Class::Stack);
        // An sp in a module's mapping (a coroutine on a static stack) does not relabel it.
        assert_eq!(s.note_stack_pointer(0x55d0c0a03100), None);
        // An sp in no mapping: a synthetic stack window around it.
        let (lo, hi) = s.note_stack_pointer(0x7e00_0000_5000).unwrap();
        assert!(lo <= 0x7e00_0000_5000 && 0x7e00_0000_5000 < hi);
        assert_eq!(s.classify(0x7e00_0000_5008), Class::Stack);
    }
}
