//! The kernel's description of its PMUs under `/sys/bus/event_source/devices/<pmu>/`:
//!
//! ```text
//!  cpu/type                 4                          ← perf_event_attr.type
//!  cpu/caps/pmu_name        skylake
//!  cpu/caps/max_precise     3
//!  cpu/format/event         config:0-7                 ← where each term's bits go
//!  cpu/format/umask         config:8-15
//!  cpu/format/ldlat         config1:0-15
//!  cpu/events/mem-loads     event=0xcd,umask=0x1,ldlat=3
//!  cpu/events/mem-stores    event=0xd0,umask=0x82
//! ```
//!
//! Event encodings are read from here, never hard-coded: they differ between generations
//! (Haswell's `mem-stores` is `0xd0/0x82`, Sapphire Rapids' `0xcd/0x2`) and between the two
//! core types of a hybrid part. The parsers take text; [`SysfsTree`] is the one seam to the
//! file system, so fixture trees stand in for `/sys` in tests.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::pmu::PmuError;

/// Where the kernel lists its PMUs.
pub const PMU_DIR: &str = "/sys/bus/event_source/devices";

/// Read access to a tree of small text files (sysfs, or a fixture copy of it).
pub trait SysfsTree {
    /// The file at `rel` (relative to the PMU directory), or `None` if it does not exist.
    fn read(&self, rel: &str) -> Option<String>;
    /// Names in the directory `rel`, sorted; empty if it does not exist.
    fn list(&self, rel: &str) -> Vec<String>;
}

/// A directory on disk: `/sys/bus/event_source/devices` live, a fixture in tests.
pub struct DirTree(pub PathBuf);

impl DirTree {
    pub fn system() -> DirTree {
        DirTree(PathBuf::from(PMU_DIR))
    }
}

impl SysfsTree for DirTree {
    fn read(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.0.join(rel)).ok()
    }
    fn list(&self, rel: &str) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.0.join(rel))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
}

/// Which `perf_event_attr` word a format field lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ConfigWord {
    Config,
    Config1,
    Config2,
    Config3,
}

/// A `format/<term>` file: the bit ranges a term's value is scattered into, low bits first
/// (`config:8-15,32-35` puts value bits 0–7 at 8–15 and bits 8–11 at 32–35).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Format {
    pub word: ConfigWord,
    /// Inclusive (low, high) bit ranges.
    pub ranges: Vec<(u8, u8)>,
}

impl Format {
    /// Parses `config:0-7`, `config1:0-15`, `config:21`, `config:8-15,40-47`.
    pub fn parse(text: &str) -> Result<Format, PmuError> {
        let bad = || PmuError::BadFormat(text.trim().to_string());
        let (word, bits) = text.trim().split_once(':').ok_or_else(bad)?;
        let word = match word {
            "config" => ConfigWord::Config,
            "config1" => ConfigWord::Config1,
            "config2" => ConfigWord::Config2,
            "config3" => ConfigWord::Config3,
            _ => return Err(bad()),
        };
        let mut ranges = Vec::new();
        for r in bits.split(',') {
            let (lo, hi) = match r.split_once('-') {
                Some((lo, hi)) => (lo, hi),
                None => (r, r),
            };
            let lo: u8 = lo.trim().parse().map_err(|_| bad())?;
            let hi: u8 = hi.trim().parse().map_err(|_| bad())?;
            if lo > hi || hi > 63 {
                return Err(bad());
            }
            ranges.push((lo, hi));
        }
        Ok(Format { word, ranges })
    }

    /// Bits of the value this format can hold.
    pub fn width(&self) -> u32 {
        self.ranges.iter().map(|(l, h)| u32::from(h - l) + 1).sum()
    }

    /// Scatters `value` into its bit ranges; `None` if it does not fit.
    pub fn place(&self, value: u64) -> Option<u64> {
        let w = self.width();
        if w < 64 && value >> w != 0 {
            return None;
        }
        let mut out = 0u64;
        let mut v = value;
        for &(lo, hi) in &self.ranges {
            let n = u32::from(hi - lo) + 1;
            let mask = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
            out |= (v & mask) << lo;
            v = if n == 64 { 0 } else { v >> n };
        }
        Some(out)
    }
}

/// One `term=value` of an event string; a bare `term` means 1 (as perf reads it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Term {
    pub name: String,
    pub value: u64,
}

/// Parses an `events/<name>` file: `event=0xcd,umask=0x1,ldlat=3`.
pub fn parse_event(text: &str) -> Result<Vec<Term>, PmuError> {
    let bad = || PmuError::BadEvent(text.trim().to_string());
    let mut terms = Vec::new();
    for t in text.trim().split(',').filter(|t| !t.is_empty()) {
        let (name, value) = match t.split_once('=') {
            Some((n, v)) => (n.trim(), parse_num(v.trim()).ok_or_else(bad)?),
            None => (t.trim(), 1),
        };
        if name.is_empty() {
            return Err(bad());
        }
        terms.push(Term {
            name: name.to_string(),
            value,
        });
    }
    if terms.is_empty() {
        return Err(bad());
    }
    Ok(terms)
}

fn parse_num(s: &str) -> Option<u64> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// The config words of an encoded event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Encoding {
    pub config: u64,
    pub config1: u64,
    pub config2: u64,
}

/// One PMU as sysfs describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pmu {
    /// Directory name: `cpu`, `cpu_core`, `cpu_atom`, `ibs_op`, …
    pub name: String,
    /// `type`: the value for `perf_event_attr.type`.
    pub type_: u32,
    /// `caps/pmu_name`, e.g. `skylake`, `sapphire_rapids`, `alderlake_hybrid`.
    pub pmu_name: Option<String>,
    /// `caps/max_precise`, where the kernel exports it.
    pub max_precise: Option<u8>,
    pub formats: BTreeMap<String, Format>,
    /// Raw `events/*` strings by name (parsed when used: one bad alias must not hide the rest).
    pub events: BTreeMap<String, String>,
}

impl Pmu {
    /// Reads PMU `name` from `tree`; `None` if it has no readable `type`.
    pub fn read(tree: &dyn SysfsTree, name: &str) -> Result<Option<Pmu>, PmuError> {
        let Some(type_text) = tree.read(&format!("{name}/type")) else {
            return Ok(None);
        };
        let type_ = type_text
            .trim()
            .parse()
            .map_err(|_| PmuError::BadType(name.to_string(), type_text.trim().to_string()))?;
        let mut formats = BTreeMap::new();
        for f in tree.list(&format!("{name}/format")) {
            // A format this parser does not know (a future kernel's) only matters if an event
            // uses that term, and then encoding says which term is missing.
            if let Some(Ok(fmt)) = tree
                .read(&format!("{name}/format/{f}"))
                .map(|t| Format::parse(&t))
            {
                formats.insert(f, fmt);
            }
        }
        let mut events = BTreeMap::new();
        for e in tree.list(&format!("{name}/events")) {
            // `.scale`/`.unit` files describe counters, not encodings.
            if e.contains('.') {
                continue;
            }
            if let Some(text) = tree.read(&format!("{name}/events/{e}")) {
                events.insert(e, text.trim().to_string());
            }
        }
        let cap = |c: &str| {
            tree.read(&format!("{name}/caps/{c}"))
                .map(|s| s.trim().to_string())
        };
        Ok(Some(Pmu {
            name: name.to_string(),
            type_,
            pmu_name: cap("pmu_name"),
            max_precise: cap("max_precise").and_then(|s| s.parse().ok()),
            formats,
            events,
        }))
    }

    /// Encodes the terms of event `event` with `overrides` applied (e.g. `ldlat=30`).
    pub fn encode(&self, event: &str, overrides: &[Term]) -> Result<Encoding, PmuError> {
        let text = self.events.get(event).ok_or_else(|| PmuError::NoEvent {
            pmu: self.name.clone(),
            event: event.to_string(),
        })?;
        let mut terms = parse_event(text)?;
        for o in overrides {
            match terms.iter_mut().find(|t| t.name == o.name) {
                Some(t) => t.value = o.value,
                None => terms.push(o.clone()),
            }
        }
        self.encode_terms(&terms)
    }

    /// Places every term through this PMU's formats.
    pub fn encode_terms(&self, terms: &[Term]) -> Result<Encoding, PmuError> {
        let mut enc = Encoding::default();
        for t in terms {
            let f = self
                .formats
                .get(&t.name)
                .ok_or_else(|| PmuError::NoFormat {
                    pmu: self.name.clone(),
                    term: t.name.clone(),
                })?;
            let bits = f.place(t.value).ok_or_else(|| PmuError::TermTooWide {
                term: t.name.clone(),
                value: t.value,
                width: f.width(),
            })?;
            match f.word {
                ConfigWord::Config => enc.config |= bits,
                ConfigWord::Config1 => enc.config1 |= bits,
                ConfigWord::Config2 => enc.config2 |= bits,
                // No kernel laser supports puts a memory-event term in config3.
                ConfigWord::Config3 => {
                    return Err(PmuError::NoFormat {
                        pmu: self.name.clone(),
                        term: t.name.clone(),
                    })
                }
            }
        }
        Ok(enc)
    }
}

/// Every PMU in `tree` with a readable `type`. A PMU whose `type` does not parse is left out
/// (an uncore or vendor PMU must not hide the core PMU); if it was a core PMU, planning then
/// says the core PMU is missing.
pub fn read_all(tree: &dyn SysfsTree) -> Result<Vec<Pmu>, PmuError> {
    read_named(tree, |_| true)
}

/// [`read_all`] for the PMUs whose name `wanted` accepts: the backend probe of every `laser
/// run` reads only the core and IBS PMUs it decides on (a VM's breakpoint, msr, power,
/// tracepoint, uprobe and kprobe directories took ~0.3 ms of its start).
pub fn read_named(
    tree: &dyn SysfsTree,
    wanted: impl Fn(&str) -> bool,
) -> Result<Vec<Pmu>, PmuError> {
    let mut out = Vec::new();
    for name in tree.list("").into_iter().filter(|n| wanted(n)) {
        if let Ok(Some(p)) = Pmu::read(tree, &name) {
            out.push(p);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_and_place() {
        let f = Format::parse("config1:0-15\n").unwrap();
        assert_eq!((f.word, f.width()), (ConfigWord::Config1, 16));
        assert_eq!(f.place(30), Some(30));
        assert_eq!(f.place(0x1_0000), None);
        let f = Format::parse("config:8-15,32-35").unwrap();
        assert_eq!(f.place(0x3ff), Some(0xff00 | (0x3 << 32)));
        let f = Format::parse("config:21").unwrap();
        assert_eq!((f.place(1), f.place(2)), (Some(1 << 21), None));
        assert_eq!(
            Format::parse("config:0-63").unwrap().place(u64::MAX),
            Some(u64::MAX)
        );
        for bad in [
            "config",
            "cfg:0-7",
            "config:7-0",
            "config:0-64",
            "config:a-b",
        ] {
            assert!(Format::parse(bad).is_err(), "{bad}");
        }
    }

    /// An in-memory tree: (path, text) pairs.
    struct Mem(Vec<(&'static str, &'static str)>);
    impl SysfsTree for Mem {
        fn read(&self, rel: &str) -> Option<String> {
            self.0.iter().find(|f| f.0 == rel).map(|f| f.1.to_string())
        }
        fn list(&self, rel: &str) -> Vec<String> {
            let prefix = if rel.is_empty() {
                String::new()
            } else {
                format!("{rel}/")
            };
            let mut v: Vec<String> = self
                .0
                .iter()
                .filter_map(|f| f.0.strip_prefix(prefix.as_str()))
                .map(|r| r.split('/').next().unwrap().to_string())
                .collect();
            v.sort();
            v.dedup();
            v
        }
    }

    #[test]
    fn odd_pmus_and_formats_do_not_hide_the_core_pmu() {
        let t = Mem(vec![
            ("cpu/type", "4\n"),
            ("cpu/format/event", "config:0-7\n"),
            ("cpu/format/umask", "config:8-15\n"),
            ("cpu/format/ldlat", "config1:0-15\n"),
            ("cpu/format/future", "config9:0-3\n"),
            ("cpu/events/mem-loads", "event=0xcd,umask=0x1,ldlat=3\n"),
            ("weird/type", "not a number\n"),
        ]);
        let pmus = read_all(&t).unwrap();
        assert_eq!(pmus.len(), 1);
        let cpu = &pmus[0];
        assert!(!cpu.formats.contains_key("future"));
        let e = cpu
            .encode(
                "mem-loads",
                &[Term {
                    name: "ldlat".into(),
                    value: 30,
                }],
            )
            .unwrap();
        assert_eq!((e.config, e.config1), (0x1cd, 30));
        let e = cpu.encode_terms(&[Term {
            name: "future".into(),
            value: 1,
        }]);
        assert!(matches!(e, Err(PmuError::NoFormat { .. })));
    }

    #[test]
    fn events_parse_like_perf() {
        let t = parse_event("event=0xcd,umask=0x1,ldlat=3\n").unwrap();
        assert_eq!(
            t.iter()
                .map(|t| (t.name.as_str(), t.value))
                .collect::<Vec<_>>(),
            [("event", 0xcd), ("umask", 1), ("ldlat", 3)]
        );
        let t = parse_event("event=0x3c,any").unwrap();
        assert_eq!(t[1].value, 1);
        assert!(parse_event("").is_err());
        assert!(parse_event("event=zz").is_err());
    }
}
