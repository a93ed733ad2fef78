//! `laser run --history-site FILE:LINE`: DProf's data flow view of objects allocated on one
//! line. The recorder announces each allocation made there and holds the allocating thread
//! until laser has pointed the debug registers at the new object's first words; from then on
//! every read and write of those words, by any thread, is a watchpoint hit with its thread,
//! CPU and instruction, until the object is freed (the recorder announces that too and waits
//! while laser disarms) or the program ends. Objects are watched one at a time.
//!
//! A site resolves to call sites (`alloc_history::call_sites_at_line`); a type
//! (`--history-type`) to its DWARF size, allocations of exactly that size being taken as its
//! objects (each object's printed site shows whether that held). When DWARF access typing can
//! say which sites store into a `TYPE *`, a type should resolve to those sites instead:
//! [`HistoryTarget::filter`] is that seam.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Context, Result};
use laser_detect::naming::alloc_history::{call_sites_at_line, type_size, Touch};
use laser_detect::naming::alloc_record::AllocRecord;
use laser_detect::naming::alloc_site::{AllocSite, ModuleSet};
use laser_detect::naming::symbolize::Symbolizer;
use laser_driver::{BackendKind, Sample, Session, WatchKind, WatchSpec, MAX_WATCHES};

use crate::alloc_shim::{AllocShim, Message};

/// What to follow: an allocation site given as `FILE:LINE`, or a type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HistoryTarget {
    Site { file: String, line: u64 },
    Type { name: String },
}

/// What the recorder looks for: call sites (return addresses, ELF vaddrs in the executable)
/// and/or a requested size.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HistoryFilter {
    pub sites: Vec<u64>,
    pub size: Option<u64>,
}

impl HistoryTarget {
    pub fn parse_site(s: &str) -> Result<HistoryTarget> {
        let (file, line) = s
            .rsplit_once(':')
            .context("--history-site takes FILE:LINE, e.g. queue.c:40")?;
        let line = line
            .parse()
            .with_context(|| format!("--history-site: `{line}` is not a line number"))?;
        Ok(HistoryTarget::Site {
            file: file.to_string(),
            line,
        })
    }

    /// What the recorder looks for, resolved in `program`'s DWARF: a site's call
    /// instructions' return addresses, or a type's size (see `alloc_history::type_size`).
    pub fn filter(&self, program: &Path) -> Result<HistoryFilter> {
        let bytes = std::fs::read(program)
            .with_context(|| format!("reading {} for --history-*", program.display()))?;
        let module = laser_detect::naming::debug_module::DebugModule::parse(&bytes)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let Some(dwarf) = module.dwarf.as_ref() else {
            bail!(
                "--history-* needs debug info: {} has no DWARF",
                program.display()
            );
        };
        let (file, line) = match self {
            HistoryTarget::Type { name } => {
                let Some(size) = type_size(dwarf, name) else {
                    bail!(
                        "--history-type: no type `{name}` with a size in {}",
                        program.display()
                    );
                };
                return Ok(HistoryFilter {
                    sites: Vec::new(),
                    size: Some(size),
                });
            }
            HistoryTarget::Site { file, line } => (file, line),
        };
        let image = laser_detect::decode::code::ElfImage::open(program)
            .context("--history-site: not an ELF file")?;
        let sites = call_sites_at_line(dwarf, &image, file, *line);
        if sites.is_empty() {
            bail!(
                "--history-site {file}:{line}: no call instruction on that line in {} (is it \
                 the line that calls malloc or its wrapper?)",
                program.display()
            );
        }
        Ok(HistoryFilter { sites, size: None })
    }
}

/// One access to a watched object.
struct Hit {
    time: u64,
    tid: u32,
    cpu: u32,
    ip: u64,
    offset: u64,
    place: Option<(String, u64)>,
    touch: Option<Touch>,
}

/// One watched object.
struct Object {
    ptr: u64,
    rec: AllocRecord,
    tid: u32,
    cpu: u32,
    site: Option<AllocSite>,
    words: Vec<u64>,
    hits: Vec<Hit>,
    /// Thread and CPU that freed it.
    freed_by: Option<(u32, u32)>,
}

/// The live state of `--history-site`.
pub struct History {
    target: String,
    objects: usize,
    pid: i32,
    current: Option<Object>,
    done: Vec<Object>,
    modules: Option<ModuleSet>,
    declined: u64,
}

impl History {
    pub fn new(target: String, objects: usize, pid: i32) -> History {
        History {
            target,
            objects: objects.max(1),
            pid,
            current: None,
            done: Vec::new(),
            modules: None,
            declined: 0,
        }
    }

    fn modules(&mut self) -> Option<&mut ModuleSet> {
        if self.modules.is_none() {
            let maps = std::fs::read_to_string(format!("/proc/{}/maps", self.pid)).ok()?;
            self.modules = Some(ModuleSet::new(&laser_detect::decode::maps::parse(&maps)));
        }
        self.modules.as_mut()
    }

    /// A sample from the stream: kept when it is a watchpoint hit on the watched object.
    pub fn observe(&mut self, s: &Sample) {
        let (Some(o), Some(addr)) = (self.current.as_mut(), s.addr) else {
            return;
        };
        if s.backend != BackendKind::Watch || addr < o.ptr || addr >= o.ptr + 32 {
            return;
        }
        o.hits.push(Hit {
            time: s.time,
            tid: s.tid,
            cpu: s.cpu,
            ip: s.ip,
            offset: addr - o.ptr,
            place: None,
            touch: None,
        });
    }

    /// Handles the recorder's announcements: arms the debug registers on a new object, or
    /// disarms them at its free, and lets the waiting thread go on.
    pub fn step(&mut self, session: &mut Session, shim: &mut AllocShim) -> Result<()> {
        shim.drain();
        for m in std::mem::take(&mut shim.messages) {
            match m {
                Message::Alloc { tid, cpu, rec } => {
                    if self.current.is_some() || self.done.len() >= self.objects {
                        self.declined += 1;
                        shim.answer(if self.done.len() >= self.objects {
                            b'q'
                        } else {
                            b'n'
                        });
                        continue;
                    }
                    // The object's first words, up to the 4 debug registers (8 bytes each).
                    let words: Vec<u64> = (0..MAX_WATCHES as u64)
                        .map(|i| rec.ptr + 8 * i)
                        .filter(|&a| a < rec.ptr + rec.size.max(1))
                        .collect();
                    let specs: Vec<WatchSpec> = words
                        .iter()
                        .map(|&addr| WatchSpec {
                            addr,
                            len: 8,
                            kind: WatchKind::ReadWrite,
                        })
                        .collect();
                    // Inherited: a thread the allocating one creates right after (a hand-off
                    // to a new worker) is watched from its first instruction.
                    // The allocation is held until the window is armed: a guard still
                    // seizing the threads is waited for (it takes milliseconds).
                    session.wait_guard(std::time::Duration::from_secs(2));
                    let armed = session
                        .watch_mut()
                        .map_err(anyhow::Error::new)
                        .and_then(|w| {
                            w.set_inherit(true);
                            w.arm(&specs).map_err(anyhow::Error::new)
                        });
                    if let Err(e) = armed {
                        shim.answer(b'q');
                        return Err(e.context("arming watchpoints for --history-site"));
                    }
                    let site = self.modules().map(|m| m.site(&rec));
                    self.current = Some(Object {
                        ptr: rec.ptr,
                        rec,
                        tid,
                        cpu,
                        site,
                        words,
                        hits: Vec::new(),
                        freed_by: None,
                    });
                    shim.answer(b'w');
                }
                Message::Free { tid, cpu, ptr } => {
                    if self.current.as_ref().is_some_and(|o| o.ptr == ptr) {
                        if let Ok(w) = session.watch_mut() {
                            let _ = w.disarm();
                        }
                        self.place_hits();
                        let mut o = self.current.take().expect("checked");
                        o.freed_by = Some((tid, cpu));
                        self.done.push(o);
                    }
                    shim.answer(if self.done.len() >= self.objects {
                        b'q'
                    } else {
                        b'n'
                    });
                }
            }
        }
        self.place_hits();
        Ok(())
    }

    /// Places new hits in their module and decodes how they touched the object, while the
    /// process (and its maps) still exist.
    fn place_hits(&mut self) {
        let Some(mut o) = self.current.take() else {
            return;
        };
        if let Some(m) = self.modules() {
            for h in o.hits.iter_mut().filter(|h| h.place.is_none()) {
                h.place = m.place(h.ip);
                h.touch = m.touch(h.ip);
            }
        }
        self.current = Some(o);
    }

    /// The history as text, for after the report.
    pub fn render(mut self) -> String {
        self.place_hits();
        if let Some(o) = self.current.take() {
            self.done.push(o);
        }
        let mut sym = Symbolizer::new();
        let mut out = String::new();
        let _ = writeln!(out, "\naccess history: objects {}", self.target);
        if self.done.is_empty() {
            let _ = writeln!(
                out,
                "    no allocation on that line was seen while laser watched"
            );
        }
        let mut where_ = |place: &Option<(String, u64)>| -> String {
            match place {
                Some((m, v)) => {
                    let l = sym.symbolize(m, v.wrapping_sub(1));
                    let func = l.function.unwrap_or_else(|| "?".into());
                    match (l.file, l.line) {
                        (Some(f), Some(n)) => {
                            format!("{func} ({}:{n})", f.rsplit('/').next().unwrap_or(&f))
                        }
                        _ => func,
                    }
                }
                None => "?".into(),
            }
        };
        for (n, o) in self.done.iter().enumerate() {
            let at = o
                .site
                .as_ref()
                .and_then(|s| s.site.and_then(|i| s.frames.get(i)))
                .map(|f| where_(&f.module.clone().zip(f.vaddr)))
                .unwrap_or_else(|| "?".into());
            let _ = writeln!(
                out,
                "object {} at {:#x} ({} bytes requested); watching offsets {}",
                n + 1,
                o.ptr,
                o.rec.size,
                o.words
                    .iter()
                    .map(|w| format!("[{}..{})", w - o.ptr, w - o.ptr + 8))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            let _ = writeln!(
                out,
                "    allocated  thread {:<7} cpu {}  in {at}",
                o.tid, o.cpu
            );
            let mut hits: Vec<&Hit> = o.hits.iter().collect();
            hits.sort_by_key(|h| h.time);
            let t0 = hits.first().map_or(0, |h| h.time);
            let mut last_cpu = Some(o.cpu);
            let threads: BTreeSet<u32> = hits.iter().map(|h| h.tid).collect();
            for h in &hits {
                let moved = match last_cpu {
                    Some(c) if c != h.cpu => format!("  line moved cpu {c} → {}", h.cpu),
                    _ => String::new(),
                };
                last_cpu = Some(h.cpu);
                let _ = writeln!(
                    out,
                    "    +{:.6}s thread {:<7} cpu {}  {:<10} [{}..{})  {}{moved}",
                    (h.time - t0) as f64 / 1e9,
                    h.tid,
                    h.cpu,
                    h.touch.map_or("access", Touch::as_str),
                    h.offset & !7,
                    (h.offset & !7) + 8,
                    where_(&h.place),
                );
            }
            match o.freed_by {
                Some((t, c)) => {
                    let moved = match last_cpu {
                        Some(l) if l != c => format!("  line moved cpu {l} → {c}"),
                        _ => String::new(),
                    };
                    let _ = writeln!(out, "    freed      thread {t:<7} cpu {c}{moved}");
                }
                None => {
                    let _ = writeln!(out, "    not freed while watched");
                }
            }
            let _ = writeln!(
                out,
                "    {} access(es) by {} thread(s)",
                hits.len(),
                threads.len()
            );
        }
        if self.declined > 0 {
            let _ = writeln!(
                out,
                "    ({} more allocation(s) there not watched: one object at a time, {} in all)",
                self.declined, self.objects
            );
        }
        out
    }
}
