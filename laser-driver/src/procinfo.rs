//! What a recording header and a late-attaching detector need from `/proc`: the target's
//! mappings (as text and as synthesized [`Mmap`] events), the CPU model, and the GNU build-ids
//! of mapped ELF files. Parsers take text/bytes; the `read_*` helpers do the I/O.

use std::collections::BTreeMap;

use object::{Object, ObjectKind};

use crate::event::{Event, Mmap};

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapEntry {
    pub start: u64,
    pub end: u64,
    /// `rwxp` / `r--s` …
    pub perms: String,
    pub offset: u64,
    pub inode: u64,
    /// File path, `[heap]`-style pseudo name, or empty for anonymous memory.
    pub path: String,
}

impl MapEntry {
    pub fn prot(&self) -> u32 {
        let b = self.perms.as_bytes();
        let mut p = 0;
        if b.first() == Some(&b'r') {
            p |= libc::PROT_READ;
        }
        if b.get(1) == Some(&b'w') {
            p |= libc::PROT_WRITE;
        }
        if b.get(2) == Some(&b'x') {
            p |= libc::PROT_EXEC;
        }
        p as u32
    }

    pub fn flags(&self) -> u32 {
        if self.perms.as_bytes().get(3) == Some(&b's') {
            libc::MAP_SHARED as u32
        } else {
            libc::MAP_PRIVATE as u32
        }
    }

    /// A real file (not anonymous, not `[vdso]`-style, not deleted).
    pub fn is_file(&self) -> bool {
        self.path.starts_with('/') && !self.path.ends_with(" (deleted)")
    }
}

/// Parses `/proc/PID/maps` text; malformed lines are skipped (the kernel never writes them,
/// but a truncated read can cut the last one).
pub fn parse_maps(text: &str) -> Vec<MapEntry> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<MapEntry> {
    // 00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/dbus-daemon
    let mut it = line.splitn(6, ' ');
    let range = it.next()?;
    let perms = it.next()?;
    let offset = it.next()?;
    let _dev = it.next()?;
    let inode = it.next()?;
    let path = it.next().unwrap_or("").trim_start();
    let (s, e) = range.split_once('-')?;
    Some(MapEntry {
        start: u64::from_str_radix(s, 16).ok()?,
        end: u64::from_str_radix(e, 16).ok()?,
        perms: perms.to_string(),
        offset: u64::from_str_radix(offset, 16).ok()?,
        inode: inode.parse().ok()?,
        path: path.to_string(),
    })
}

/// [`Mmap`] events for mappings that existed before laser attached, so the detector sees the
/// same picture it would have built from kernel MMAP2 records. `build_id` is looked up once
/// per path.
pub fn mmap_events(
    pid: u32,
    maps: &[MapEntry],
    build_ids: &BTreeMap<String, Vec<u8>>,
) -> Vec<Mmap> {
    maps.iter()
        .map(|m| Mmap {
            pid,
            tid: pid,
            time: 0,
            addr: m.start,
            len: m.end.saturating_sub(m.start),
            pgoff: m.offset,
            prot: m.prot(),
            flags: m.flags(),
            path: m.path.clone(),
            build_id: build_ids.get(&m.path).cloned(),
        })
        .collect()
}

/// The processes `pid`'s threads have forked and not yet reaped (`/proc/PID/task/*/children`;
/// empty where the kernel lacks `CONFIG_PROC_CHILDREN` or the process is gone).
pub fn children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for t in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(
                text.split_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            );
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// One process of a launched program as /proc shows it: see [`launched_tree`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcState {
    pub pid: i32,
    /// `None` for the launched process itself.
    pub parent: Option<i32>,
    /// Its `/proc/PID/maps` text.
    pub maps: String,
    /// Its `/proc/PID/comm`, without the newline.
    pub comm: String,
}

/// The launched process `root` (its maps already read: `root_maps`) and the processes it
/// and they have forked, parents before children (at most 1,024; a process gone meanwhile
/// is left out).
pub fn launched_tree(root: i32, root_maps: String) -> Vec<ProcState> {
    let comm = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|c| c.trim_end().to_string())
            .unwrap_or_default()
    };
    let mut procs = vec![ProcState {
        pid: root,
        parent: None,
        maps: root_maps,
        comm: comm(root),
    }];
    let mut i = 0;
    while i < procs.len() && procs.len() < 1024 {
        let parent = procs[i].pid;
        i += 1;
        for child in children(parent) {
            if procs.iter().all(|p| p.pid != child) {
                if let Ok(maps) = std::fs::read_to_string(format!("/proc/{child}/maps")) {
                    procs.push(ProcState {
                        pid: child,
                        parent: Some(parent),
                        maps,
                        comm: comm(child),
                    });
                }
            }
        }
    }
    procs
}

/// The records a launch's leaders would have written for `procs` had they counted from the
/// exec ([`launched_tree`], parents first): for the launched process, its exec and its
/// mappings; for each process it forked, the fork and, if its maps are no longer its
/// parent's (it has exec'd, or one of them has mapped since), an exec and its mappings. A
/// forked copy that has not exec'd gets the fork alone, so the detector gives it its
/// parent's mappings and keeps its private memory apart, as for a recorded fork.
/// `build_ids`: the build-ids of a process's mapped files ([`read_build_ids`]).
pub fn premapped_events(
    procs: &[ProcState],
    build_ids: impl Fn(&[MapEntry]) -> BTreeMap<String, Vec<u8>>,
) -> Vec<Event> {
    let mut out = Vec::new();
    for p in procs {
        let pid = p.pid as u32;
        let exec = match p.parent {
            None => true,
            Some(parent) => {
                out.push(Event::Fork {
                    pid,
                    ppid: parent as u32,
                    tid: pid,
                    ptid: parent as u32,
                    time: 0,
                });
                let parents_maps = procs.iter().find(|q| q.pid == parent).map(|q| &q.maps);
                parents_maps != Some(&p.maps)
            }
        };
        if !exec {
            continue;
        }
        let maps = parse_maps(&p.maps);
        let ids = build_ids(&maps);
        out.push(Event::Comm {
            pid,
            tid: pid,
            time: 0,
            name: p.comm.clone(),
            exec: true,
        });
        out.extend(mmap_events(pid, &maps, &ids).into_iter().map(Event::Mmap));
    }
    out
}

/// The `model name` of the first CPU in `/proc/cpuinfo` text.
pub fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == "model name").then(|| v.trim().to_string())
    })
}

/// The NT_GNU_BUILD_ID note of an ELF file's bytes, if it has one.
pub fn elf_build_id(bytes: &[u8]) -> Option<Vec<u8>> {
    build_id_in(bytes)
}

fn build_id_in<'a, R: object::ReadRef<'a>>(data: R) -> Option<Vec<u8>> {
    let file = object::File::parse(data).ok()?;
    if file.kind() == ObjectKind::Unknown {
        return None;
    }
    file.build_id().ok().flatten().map(<[u8]>::to_vec)
}

/// The build-id of the ELF file at `path`, reading only its headers and notes. A program
/// maps data files too, and reading each mapped file whole to look for a note took 0.5–0.6 s
/// of a launch whose program had mapped a 600 MB input just then (Phoenix histogram): that
/// long before laser's monitor loop first ran, and a one-second program was over before its
/// first watch window.
pub fn file_build_id(path: &str) -> Option<Vec<u8>> {
    let mut file = std::fs::File::open(path).ok()?;
    let mut magic = [0u8; 4];
    std::io::Read::read_exact(&mut file, &mut magic).ok()?;
    if magic != *b"\x7fELF" {
        return None;
    }
    let cache = object::ReadCache::new(file);
    build_id_in(&cache)
}

/// Build-ids of every distinct file in `maps` (unreadable or non-ELF files are left out).
pub fn read_build_ids(maps: &[MapEntry]) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for m in maps.iter().filter(|m| m.is_file()) {
        if out.contains_key(&m.path) {
            continue;
        }
        if let Some(id) = file_build_id(&m.path) {
            out.insert(m.path.clone(), id);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c8a00000-55d0c8a01000 r--p 00000000 08:01 131 /usr/bin/app
55d0c8a01000-55d0c8a02000 r-xp 00001000 08:01 131 /usr/bin/app
55d0c9000000-55d0c9021000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000001000 rw-s 00000000 00:05 77 /dev/shm/x (deleted)
7f0000002000-7f0000003000 ---p 00000000 00:00 0 
7ffd0000-
";

    /// What a launch released before its events counted is told: the launched process's
    /// exec and mappings; a forked copy (its parent's maps) as a fork alone; a child that
    /// has exec'd as a fork, an exec and its own mappings, parents first.
    #[test]
    fn premapped_events_are_the_records_the_leaders_missed() {
        let other = "7f1000000000-7f1000001000 r-xp 00000000 08:01 9 /usr/bin/worker\n";
        let state = |pid, parent, maps: &str, comm: &str| ProcState {
            pid,
            parent,
            maps: maps.to_string(),
            comm: comm.to_string(),
        };
        let procs = [
            state(10, None, MAPS, "app"),
            state(11, Some(10), MAPS, "app"),
            state(12, Some(10), other, "worker"),
        ];
        let ids = |maps: &[MapEntry]| {
            maps.iter()
                .filter(|m| m.is_file())
                .map(|m| (m.path.clone(), vec![0xab]))
                .collect::<BTreeMap<_, _>>()
        };
        let events = premapped_events(&procs, ids);
        let kinds: Vec<String> = events
            .iter()
            .map(|e| match e {
                Event::Comm {
                    pid, name, exec, ..
                } => format!("comm {pid} {name} {exec}"),
                Event::Fork { pid, ppid, .. } => format!("fork {pid}<-{ppid}"),
                Event::Mmap(m) => format!("mmap {} {}", m.pid, m.path),
                e => format!("{e:?}"),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "comm 10 app true",
                "mmap 10 /usr/bin/app",
                "mmap 10 /usr/bin/app",
                "mmap 10 [heap]",
                "mmap 10 /dev/shm/x (deleted)",
                "mmap 10 ",
                "fork 11<-10",
                "fork 12<-10",
                "comm 12 worker true",
                "mmap 12 /usr/bin/worker",
            ]
        );
        let Event::Mmap(m) = &events[2] else {
            unreachable!()
        };
        assert_eq!(
            (m.addr, m.pgoff, m.build_id.as_deref()),
            (0x55d0c8a01000, 0x1000, Some(&[0xab][..]))
        );
    }

    /// The tree is read from /proc: this test process's own child shows up under it.
    #[test]
    fn launched_tree_finds_a_forked_child() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let me = std::process::id() as i32;
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let tree = launched_tree(me, maps);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(tree[0].parent, None);
        let found = tree.iter().find(|p| p.pid == child.id() as i32);
        let found = found.expect("the child in the tree");
        assert_eq!(found.parent, Some(me));
        assert!(!found.maps.is_empty());
    }

    #[test]
    fn maps_lines_parse_and_bad_ones_are_skipped() {
        let m = parse_maps(MAPS);
        assert_eq!(m.len(), 5);
        assert_eq!(m[1].start, 0x55d0c8a01000);
        assert_eq!(m[1].offset, 0x1000);
        assert_eq!(m[1].prot(), (libc::PROT_READ | libc::PROT_EXEC) as u32);
        assert_eq!(m[1].path, "/usr/bin/app");
        assert!(m[1].is_file());
        assert_eq!(m[2].path, "[heap]");
        assert!(!m[2].is_file());
        assert_eq!(m[3].flags(), libc::MAP_SHARED as u32);
        assert!(!m[3].is_file());
        assert_eq!(m[4].path, "");
        assert_eq!(m[4].prot(), 0);
    }

    #[test]
    fn synthesized_mmaps_carry_build_ids() {
        let m = parse_maps(MAPS);
        let mut ids = BTreeMap::new();
        ids.insert("/usr/bin/app".to_string(), vec![1, 2, 3]);
        let ev = mmap_events(77, &m, &ids);
        assert_eq!(ev.len(), 5);
        assert_eq!(ev[1].len, 0x1000);
        assert_eq!(ev[1].build_id, Some(vec![1, 2, 3]));
        assert_eq!(ev[2].build_id, None);
        assert_eq!(ev[0].pid, 77);
    }

    #[test]
    fn cpu_model_from_cpuinfo() {
        let t = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n";
        assert_eq!(cpu_model(t).as_deref(), Some("AMD EPYC 7B13"));
        assert_eq!(cpu_model("processor: 0\n"), None);
    }

    #[test]
    fn build_id_read_from_the_file_is_the_one_in_its_bytes() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let exe = exe.to_str().unwrap();
        let bytes = std::fs::read(exe).unwrap();
        assert_eq!(file_build_id(exe), elf_build_id(&bytes));
        // Not ELF, or not there: none, without reading past the magic.
        let dir = std::env::temp_dir().join(format!("laser-buildid-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let data = dir.join("data.bin");
        std::fs::write(&data, vec![0u8; 1 << 16]).unwrap();
        assert_eq!(file_build_id(data.to_str().unwrap()), None);
        assert_eq!(file_build_id(dir.join("missing").to_str().unwrap()), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn build_id_of_a_real_elf_and_of_garbage() {
        // The test binary itself: rustc passes --build-id to the linker on Linux by default
        // only sometimes, so accept either, but it must not fail on garbage.
        assert_eq!(elf_build_id(b"not an elf"), None);
        assert_eq!(elf_build_id(&[0x7f, b'E', b'L', b'F', 2, 1, 1]), None);
        if let Ok(bytes) = std::fs::read("/proc/self/exe") {
            if let Some(id) = elf_build_id(&bytes) {
                assert!((8..=64).contains(&id.len()), "{id:?}");
            }
        }
    }
}
