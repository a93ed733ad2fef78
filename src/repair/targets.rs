//! Which code to repair: the target's address space (live code bytes, ELF function bounds,
//! load biases from /proc/PID/maps) and the contending PCs grouped by enclosing function, from
//! `--pc` or from a report's module+offset sources.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use laser_detect::decode::code::FileMapping;
use laser_detect::{CodeSource as _, ElfCode, Kind, ProcessCode, Report};
use laser_repair::plan;

/// What the target's address space tells us: its code (live bytes), and its ELF files
/// (function bounds, load biases).
pub struct Space {
    pub pid: i32,
    pub mem: ProcessCode,
    pub elf: ElfCode,
    /// path → load bias, for every file mapped executable.
    pub biases: BTreeMap<String, u64>,
    pub maps_text: String,
}

impl Space {
    pub fn read(pid: i32) -> Result<Self> {
        let maps_text = std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .with_context(|| format!("reading /proc/{pid}/maps"))?;
        let mem = ProcessCode::open(pid as u32).with_context(|| {
            format!("opening /proc/{pid}/mem (need ptrace rights: root or same user)")
        })?;
        let mut elf = ElfCode::new();
        let mut biases = BTreeMap::new();
        for r in laser_detect::decode::maps::parse(&maps_text) {
            if !r.exec || !r.path.starts_with('/') {
                continue;
            }
            let m = FileMapping {
                path: &r.path,
                start: r.start,
                end: r.end,
                pgoff: r.offset,
                exec: r.exec,
            };
            if let Some(l) = elf.map_file(&m) {
                biases.insert(r.path.clone(), l.bias);
            }
        }
        Ok(Space {
            pid,
            mem,
            elf,
            biases,
            maps_text,
        })
    }

    /// Run-time address of ELF vaddr `offset` in `module` (exact path, else same file name).
    fn resolve(&self, module: &str, offset: u64) -> Option<u64> {
        let base = |p: &str| p.rsplit('/').next().unwrap_or(p).to_string();
        let bias = self.biases.get(module).or_else(|| {
            let want = base(module);
            self.biases
                .iter()
                .find(|(p, _)| base(p) == want)
                .map(|(_, b)| b)
        })?;
        Some(offset.wrapping_add(*bias))
    }

    pub fn module_of(&self, addr: u64) -> Option<(String, u64)> {
        laser_detect::decode::maps::parse(&self.maps_text)
            .into_iter()
            .find(|r| r.start <= addr && addr < r.end && r.path.starts_with('/'))
            .and_then(|r| {
                let b = self.biases.get(&r.path)?;
                Some((r.path, addr.wrapping_sub(*b)))
            })
    }
}

/// The planner's view of the live process.
pub struct Live<'a>(pub &'a ProcessCode);

impl plan::CodeSource for Live<'_> {
    fn read_code(&self, addr: u64, buf: &mut [u8]) -> usize {
        self.0.read_code(addr, buf)
    }
}

/// PCs of one function, repaired together.
#[derive(Debug)]
pub struct Group {
    pub function: Option<(u64, u64)>,
    pub name: Option<String>,
    pub pcs: Vec<u64>,
}

pub fn group_pcs(pcs: &[u64], space: &Space, name: impl Fn(u64) -> Option<String>) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::new();
    for &pc in pcs {
        let f = space.elf.function_bounds(pc);
        match out.iter_mut().find(|g| f.is_some() && g.function == f) {
            Some(g) if !g.pcs.contains(&pc) => g.pcs.push(pc),
            Some(_) => {}
            None => out.push(Group {
                function: f,
                name: name(pc),
                pcs: vec![pc],
            }),
        }
    }
    out
}

/// PCs of every false-sharing finding, resolved into this process.
pub fn from_report(report: &Report, space: &Space, say: &mut super::Say<'_>) -> Result<Vec<Group>> {
    let mut pcs = Vec::new();
    let mut names: BTreeMap<u64, String> = BTreeMap::new();
    let mut wanted = 0;
    for f in &report.findings {
        if let Some(p) = f.process {
            say(&format!(
                "skipping line {:#x} ({}): it is in forked process {p}, and repair works on the \
                 process laser traces",
                f.line_addr, f.data.name
            ));
            continue;
        }
        if f.kind != Kind::FalseSharing {
            say(&format!(
                "skipping {:?} line {:#x} ({}): repair is for false sharing only",
                f.kind, f.line_addr, f.data.name
            ));
            continue;
        }
        for s in &f.sources {
            let (Some(module), Some(offset)) = (&s.module, s.offset) else {
                say(&format!(
                    "skipping source pc {:#x}: the report gives no module+offset",
                    s.pc
                ));
                continue;
            };
            wanted += 1;
            let Some(pc) = space.resolve(module, offset) else {
                say(&format!(
                    "skipping source {module}+{offset:#x}: not mapped executable in process {}",
                    space.pid
                ));
                continue;
            };
            if let Some(n) = s.function.as_ref().or(s.symbol.as_ref()) {
                names.insert(pc, n.clone());
            }
            pcs.push(pc);
        }
    }
    if wanted > 0 && pcs.is_empty() {
        bail!(
            "none of the report's {wanted} false-sharing source(s) is in code mapped by process {} \
             (a report of another program?)",
            space.pid
        );
    }
    Ok(group_pcs(&pcs, space, |pc| names.get(&pc).cloned()))
}
