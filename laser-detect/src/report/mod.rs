//! The versioned JSON report (`laser-report/1`), documented in `laser-detect/REPORT.md`.
//!
//! These structs are the schema: `serde_json` writes them for `--json FILE` and
//! [`Report::from_json`] reads them back for `laser repair --from report.json` and `laser diff`.
//! Addresses are hex strings (`"0x4080"`) because JSON numbers lose precision above 2^53.
//! Additive changes (new optional fields) keep the schema name; readers ignore unknown fields.
//! Removing, renaming or changing the meaning of a field bumps the major (`laser-report/2`).

//!
//! Stage 4 of the pipeline: the submodules build this report from an analysis ([`build`]),
//! suggest fixes ([`fix`]) and render it for people ([`render_text`]).

pub mod build;
pub mod by_type;
pub mod fix;
pub mod render_text;
pub mod type_fix;

use serde::{Deserialize, Serialize};

use crate::model::findings::{Kind, Op};

/// Schema name and major version written into every report.
pub const SCHEMA: &str = "laser-report/1";

/// Errors reading a report back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    #[error("not a laser report: {0}")]
    Json(#[from] serde_json::Error),
    #[error("unsupported report schema {found:?}: this laser reads {SCHEMA:?}")]
    Schema { found: String },
}

/// A whole report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// `pebs`, `ibs`, `soft`, `watch`.
    pub backend: String,
    pub duration_s: f64,
    pub samples: u64,
    pub lost: u64,
    #[serde(default)]
    pub throttles: u64,
    /// Samples the filter dropped (kernel, vdso, stack, TLS, undecodable).
    #[serde(default)]
    pub filtered: u64,
    /// Cache-line size the analysis grouped by (64, or 128 for adjacent-line pairs).
    #[serde(default = "default_line_size")]
    pub line_size: u32,
    /// Events/s a line needed to be reported.
    pub threshold: f64,
    /// Contended lines under the threshold, left out of `findings`.
    #[serde(default)]
    pub below_threshold: BelowThreshold,
    #[serde(default)]
    pub notes: Vec<String>,
    /// What watchpoint survey windows covered beyond the lines samples showed contended
    /// (absent when none ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub survey: Option<Survey>,
    /// How much of the run two or more of the program's threads ran at the same time, from
    /// timer samples (absent without them). A low `overlap` means contention had little time
    /// to happen: a run without findings is then no evidence of none. Added within
    /// `laser-report/1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<crate::model::concurrency::Concurrency>,
    /// Ranked: highest rate first.
    pub findings: Vec<Finding>,
    /// DProf's data profile: the data types of the contended accesses, most events first,
    /// with their contended members, threads, source lines, kinds, layout and fix (see
    /// [`by_type`]). Added within `laser-report/1`; absent when no access was typed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub types: Vec<TypeProfile>,
    /// How many contended accesses got a data type, and why the others did not (perf's
    /// "annotate data type stats"). Added within `laser-report/1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage: Option<Coverage>,
}

/// The data type and member one contended instruction accesses (from DWARF, see
/// `laser_detect::naming::access_type`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceType {
    /// C-style type: `struct lreg_args`, `class Counter`, a typedef's name for an anonymous
    /// struct, `long int` for an array of longs.
    #[serde(rename = "type")]
    pub type_name: String,
    /// `sizeof` the type (one element, for arrays of it).
    pub size: u64,
    /// Member path in the type (`SX`, `in[2].hi`, `counts[*]`); empty for a scalar.
    #[serde(default)]
    pub member: String,
    /// Offset of the access in the type.
    pub offset: u64,
    /// The access as the program writes it: `args->SX`, `stats[*].misses`, `acc[1].sum_x`
    /// (`[*]`: an element chosen at run time).
    pub expr: String,
    /// How it was found: `variable` (a variable's location at the PC is the base register),
    /// `tracked` (walking back over moves, offsets, spills, pointer loads), `stack` (a local
    /// object the operand addresses), `global` (a global's address).
    pub how: String,
}

/// Typed and untyped contended accesses (the findings' sources).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Coverage {
    pub accesses: u64,
    pub typed: u64,
    /// The same, weighted by the accesses' contention events.
    pub events: u64,
    pub typed_events: u64,
    /// Why the rest were not typed, most accesses first.
    #[serde(default)]
    pub untyped: Vec<UntypedReason>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UntypedReason {
    pub reason: String,
    pub accesses: u64,
    pub events: u64,
}

/// One data type in the data profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TypeProfile {
    #[serde(rename = "type")]
    pub type_name: String,
    pub size: u64,
    /// Contention events of accesses to this type, and their share of all the findings'.
    pub events: u64,
    pub share: f64,
    /// Contended lines (findings) with an access to this type.
    pub lines: u64,
    /// Finding kinds seen (`false_sharing`, `true_sharing`, `mixed`), by events.
    pub kinds: Vec<String>,
    pub threads: Vec<u32>,
    /// Contended members, by offset.
    pub fields: Vec<FieldProfile>,
    /// Source lines accessing it, most events first.
    pub sources: Vec<TypeSource>,
    /// Whether distinct objects of the type share lines with each other (array elements or
    /// neighbouring heap blocks, each used by another thread).
    #[serde(default)]
    pub objects_share_lines: bool,
    /// The type's members from DWARF (structs and classes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layout: Vec<TypeMember>,
    /// What would separate its contended parts (see `laser_detect::report::type_fix`).
    pub fix: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldProfile {
    /// Member path (`SX`, `counts[*]`; empty: the whole scalar).
    pub member: String,
    pub offset: u64,
    pub events: u64,
    /// `load`, `store`, `rmw` seen.
    pub ops: Vec<String>,
    pub threads: Vec<u32>,
    /// Finding kinds of the lines it was contended on.
    pub kinds: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TypeSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    pub expr: String,
    pub events: u64,
}

/// A member of a type's DWARF layout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TypeMember {
    /// `<base Name>` for a base class, `<anonymous>` for an unnamed struct/union member.
    pub name: String,
    pub offset: u64,
    pub size: u64,
    #[serde(rename = "type")]
    pub type_name: String,
}

fn default_line_size() -> u32 {
    64
}

/// The lines a migratory finding spans (see `laser_detect::model::migratory`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Extent {
    /// Contended lines in it (hot one after another: each under the threshold on its own,
    /// or rated by code windows over the time its code was watched).
    pub lines: u64,
    /// `[start, end)`: from the first line's first byte to the last line's end (run-time
    /// addresses, valid for that run only).
    #[serde(with = "hex")]
    pub start: u64,
    #[serde(with = "hex")]
    pub end: u64,
    pub bytes: u64,
}

/// The watchpoint survey's coverage (see `laser_detect::model::survey`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Survey {
    /// Lines surveyed, of them in globals (the program's or its libraries') and on the heap.
    pub lines: u64,
    pub global_lines: u64,
    pub heap_lines: u64,
    /// Distinct bytes watched, over all surveyed lines.
    pub bytes: u64,
    pub windows: u64,
    /// Surveyed lines found contended (above or below the threshold).
    pub found: u64,
}

/// What the threshold left out, so a report never silently hides contention.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BelowThreshold {
    pub lines: u64,
    pub events: u64,
    /// Of `lines`, those rated at or above the threshold from fewer than
    /// [`MIN_FINDING_EVENTS`] events whose rate's 95% interval reaches below it
    /// (`LineFinding::reported_at`; absent when none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub thin: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

pub use crate::model::findings::MIN_FINDING_EVENTS;

/// One contended cache line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    #[serde(with = "kind_str")]
    pub kind: Kind,
    /// Run-time address of the line's first byte (valid for that run only).
    #[serde(with = "hex")]
    pub line_addr: u64,
    /// The line is private memory of a process `fork` copied the program into (no `exec`
    /// since): its pid. `line_addr` is the address in that process; the original's line at
    /// the same address is other memory, reported apart. Absent for the program itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<u32>,
    pub rate_per_s: f64,
    pub events: u64,
    #[serde(default)]
    pub true_events: u64,
    #[serde(default)]
    pub false_events: u64,
    /// Share of all contention events of the run, 0..=1.
    pub share: f64,
    pub threads: Vec<u32>,
    pub data: Data,
    /// Most events first.
    pub sources: Vec<Source>,
    pub fix: String,
    /// Migratory contention: this finding is several lines, each under the threshold, whose
    /// contention comes from the same instructions (rates and events summed, `line_addr` the
    /// first line, the byte map all lines laid on one). Absent for a single line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extent: Option<Extent>,
}

/// Which data a line holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Data {
    /// `global`, `heap`, `stack` or `unknown`.
    pub kind: String,
    /// Object name(s) (`acc`, `hits_a, hits_b`), or `heap`/`stack`/`unknown`.
    pub name: String,
    /// Fields at the contended bytes, in offset order (`acc[0].sum_x`).
    #[serde(default)]
    pub fields: Vec<String>,
    /// For globals: the module and the ELF vaddr of the line's first byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    #[serde(default, with = "opt_hex", skip_serializing_if = "Option::is_none")]
    pub vaddr: Option<u64>,
    /// Objects with contended bytes on the line, in address order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub objects: Vec<DataObject>,
    /// Heap lines of a live run: the malloc blocks holding contended bytes, by address.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocks: Vec<HeapBlock>,
    /// Data types of the line's typed accesses, most events first (`struct lreg_args`).
    /// Added within `laser-report/1`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub types: Vec<String>,
    /// The typed accesses' expressions in offset order (`args->SX, args->SY`): what a heap
    /// line's `fields` cannot say. Added within `laser-report/1`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub type_fields: Vec<String>,
}

/// A glibc malloc block (chunk) with contended bytes on a heap line, read from the live
/// process (`heap_blocks`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeapBlock {
    /// Run-time address malloc returned for the block (that run only).
    #[serde(with = "hex")]
    pub addr: u64,
    /// Usable bytes from `addr` (`malloc_usable_size`: the request rounded up).
    pub size: u64,
    /// `in_use` (also blocks freed to tcache/fastbins, which glibc leaves marked in use),
    /// `free`, `top` (not yet handed out), `mmapped`.
    pub state: String,
    /// `main`, `thread` or `mmap`.
    pub arena: String,
    /// Contended bytes of the line inside this block, as offsets from `addr`, ascending.
    pub offsets: Vec<u64>,
    /// The size the program asked for (malloc's argument; `calloc`'s product), when the
    /// allocation recorder saw the allocation (`laser run`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_size: Option<u64>,
    /// Where the program allocated the block, past allocator wrappers and library frames.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc_site: Option<AllocSite>,
}

/// An allocation's site and call stack (`blocks[].alloc_site`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocSite {
    /// The site: the first frame in the program's own code that is not an allocator wrapper.
    pub file: Option<String>,
    pub line: Option<u32>,
    pub function: Option<String>,
    /// The call stack, innermost first (the caller of malloc first).
    pub frames: Vec<AllocFrame>,
}

/// One frame of an allocation's call stack.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocFrame {
    /// Run-time return address.
    #[serde(with = "hex")]
    pub pc: u64,
    pub module: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub function: Option<String>,
    /// `wrapper` (an allocator wrapper such as `xmalloc`), `library` (system code), or absent
    /// for program frames; the site is the first frame without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

impl HeapBlock {
    /// `[8..16)+[24..32)` in block offsets.
    pub fn ranges(&self) -> String {
        ranges(&self.offsets)
    }
}

/// Runs of consecutive offsets as `[a..b)` joined by `+`.
pub fn ranges(offsets: &[u64]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < offsets.len() {
        let start = offsets[i];
        let mut end = start + 1;
        while i + 1 < offsets.len() && offsets[i + 1] == end {
            end += 1;
            i += 1;
        }
        out.push(format!("[{start}..{end})"));
        i += 1;
    }
    out.join("+")
}

/// A global object on the line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DataObject {
    pub name: String,
    /// C-style type from DWARF; absent with symbols only.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_name: Option<String>,
    #[serde(with = "hex")]
    pub vaddr: u64,
    pub size: u64,
    /// For arrays: element type and size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub element_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub element_size: Option<u64>,
}

/// One instruction contending on the line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Source {
    /// Run-time address (that run only).
    #[serde(with = "hex")]
    pub pc: u64,
    /// Module file and ELF vaddr of the instruction: stable across runs (ASLR), what
    /// `laser repair --from` uses. Absent for code with no file (JIT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    #[serde(default, with = "opt_hex", skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<u32>,
    /// The headline frame's function, demangled: the innermost frame of the program's own code
    /// (see `library_frames`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// ELF symbol + offset, e.g. `worker+0x1c`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symbol: Option<String>,
    /// Callers `function` was inlined into, innermost first, each with its call site.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inlined: Vec<Inlined>,
    /// When the instruction is library code (a system header such as `atomic_base.h`, another
    /// package) inlined into the program: those library frames, innermost first, the first
    /// at the instruction's own line. `file`/`line`/`function` are then the program's frame.
    /// Added within `laser-report/1`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub library_frames: Vec<Inlined>,
    /// False when the module had no DWARF: only `symbol` (if any) is known.
    #[serde(default = "yes")]
    pub debug_info: bool,
    /// The source line's text, when the file was readable at report time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(with = "op_str")]
    pub op: Op,
    /// Byte offsets in the line this instruction touched.
    pub offsets: Vec<u32>,
    /// Fields at those offsets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
    pub events: u64,
    #[serde(default)]
    pub threads: Vec<u32>,
    /// For an instruction in a shared library: where the program called into it, most
    /// samples first (from return addresses on the sampled stacks).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub called_from: Vec<CalledFrom>,
    /// The data type and member this instruction accesses. Added within `laser-report/1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_type: Option<SourceType>,
    /// Why `data_type` is absent (the coverage reason). Added within `laser-report/1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub untyped: Option<String>,
}

/// A call site in the program that led to a library instruction.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CalledFrom {
    /// Run-time return address (the instruction after the call; that run only).
    #[serde(with = "hex")]
    pub ret: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// ELF vaddr of the return address in `module`.
    #[serde(default, with = "opt_hex", skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Source position and function of the call instruction itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// ELF symbol + offset of the return address, e.g. `push+0x1c`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symbol: Option<String>,
    /// Samples of the instruction on this line that came from here, and their share of
    /// those with a known call site.
    pub samples: u64,
    pub share: f64,
}

fn yes() -> bool {
    true
}

/// A caller frame an inlined function sits in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inlined {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
}

impl Report {
    /// Parses a report written by this or an older `laser-report/1` writer.
    pub fn from_json(text: &str) -> Result<Report, ReportError> {
        #[derive(Deserialize)]
        struct Head {
            schema: String,
        }
        let head: Head = serde_json::from_str(text)?;
        if head.schema != SCHEMA {
            return Err(ReportError::Schema { found: head.schema });
        }
        Ok(serde_json::from_str(text)?)
    }

    /// Raises the threshold of a finished report (`laser report --threshold` on a saved
    /// JSON): findings under it move into `below_threshold`. Lowering it cannot bring back
    /// lines the first threshold dropped, so a lower value only lowers the recorded number.
    pub fn apply_threshold(&mut self, threshold: f64) {
        let (keep, drop): (Vec<Finding>, Vec<Finding>) = std::mem::take(&mut self.findings)
            .into_iter()
            .partition(|f| f.rate_per_s >= threshold);
        self.below_threshold.lines += drop.len() as u64;
        self.below_threshold.events += drop.iter().map(|f| f.events).sum::<u64>();
        self.findings = keep;
        if threshold.is_finite() {
            self.threshold = self.threshold.max(threshold);
        }
    }

    /// Pretty JSON with a trailing newline.
    pub fn to_json(&self) -> String {
        // Serializing these plain structs cannot fail (no maps with non-string keys, and
        // non-finite floats become null).
        let mut s = serde_json::to_string_pretty(self).unwrap_or_default();
        s.push('\n');
        s
    }
}

impl Source {
    /// `offsets` as a bitmap, bit N = byte N.
    pub fn mask(&self) -> u128 {
        self.offsets
            .iter()
            .filter(|&&o| o < 128)
            .fold(0u128, |m, &o| m | (1u128 << o))
    }
}

/// Byte offsets of a bitmap, ascending.
pub fn mask_offsets(mask: u128) -> Vec<u32> {
    (0..128).filter(|b| mask & (1u128 << b) != 0).collect()
}

mod hex {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{v:#x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let s = String::deserialize(d)?;
        parse(&s).ok_or_else(|| D::Error::custom(format!("bad hex address {s:?}")))
    }

    pub fn parse(s: &str) -> Option<u64> {
        let digits = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X"))?;
        u64::from_str_radix(digits, 16).ok()
    }
}

mod opt_hex {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.serialize_str(&format!("{v:#x}")),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(s) => super::hex::parse(&s)
                .map(Some)
                .ok_or_else(|| D::Error::custom(format!("bad hex address {s:?}"))),
        }
    }
}

mod kind_str {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    use crate::model::findings::Kind;

    pub fn serialize<S: Serializer>(v: &Kind, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(v.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Kind, D::Error> {
        let s = String::deserialize(d)?;
        [Kind::FalseSharing, Kind::TrueSharing, Kind::Mixed]
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| D::Error::custom(format!("unknown finding kind {s:?}")))
    }
}

mod op_str {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    use crate::model::findings::Op;

    pub fn serialize<S: Serializer>(v: &Op, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(v.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Op, D::Error> {
        let s = String::deserialize(d)?;
        [Op::Load, Op::Store, Op::Rmw]
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| D::Error::custom(format!("unknown op {s:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Report {
        Report {
            schema: SCHEMA.into(),
            backend: "soft".into(),
            duration_s: 1.5,
            samples: 1000,
            lost: 3,
            throttles: 0,
            filtered: 10,
            line_size: 64,
            threshold: 1000.0,
            below_threshold: BelowThreshold {
                lines: 2,
                events: 40,
                thin: 0,
            },
            notes: vec!["estimated".into()],
            survey: None,
            concurrency: None,
            findings: vec![Finding {
                kind: Kind::FalseSharing,
                line_addr: 0x5555_5555_8080,
                process: None,
                rate_per_s: 48210.5,
                events: 72316,
                true_events: 0,
                false_events: 72316,
                share: 0.91,
                threads: vec![11, 12],
                data: Data {
                    kind: "global".into(),
                    name: "acc".into(),
                    fields: vec!["acc[0].sum_x".into()],
                    module: Some("/src/lr".into()),
                    vaddr: Some(0x4080),
                    objects: vec![],
                    blocks: vec![],
                    types: vec!["struct acc".into()],
                    type_fields: vec![],
                },
                sources: vec![Source {
                    pc: 0x5555_5555_5289,
                    module: Some("/src/lr".into()),
                    offset: Some(0x1289),
                    file: None,
                    line: None,
                    column: None,
                    function: None,
                    symbol: Some("worker+0xfe".into()),
                    inlined: vec![],
                    library_frames: vec![],
                    debug_info: false,
                    text: None,
                    op: Op::Rmw,
                    offsets: vec![0, 1, 2],
                    fields: vec![],
                    events: 5,
                    threads: vec![11],
                    called_from: vec![CalledFrom {
                        ret: 0x5555_5555_5301,
                        module: Some("/src/lr".into()),
                        offset: Some(0x1301),
                        file: Some("lr.c".into()),
                        line: Some(40),
                        function: Some("main".into()),
                        symbol: Some("main+0x21".into()),
                        samples: 7,
                        share: 1.0,
                    }],
                    data_type: Some(SourceType {
                        type_name: "struct acc".into(),
                        size: 24,
                        member: "sum_x".into(),
                        offset: 0,
                        expr: "acc[0].sum_x".into(),
                        how: "global".into(),
                    }),
                    untyped: None,
                }],
                fix: "pad".into(),
                extent: None,
            }],
            types: vec![],
            coverage: Some(Coverage {
                accesses: 1,
                typed: 1,
                events: 5,
                typed_events: 5,
                untyped: vec![],
            }),
        }
    }

    #[test]
    fn round_trips_through_json() {
        let r = sample();
        let back = Report::from_json(&r.to_json()).unwrap();
        assert_eq!(back, r);
        assert!(r.to_json().contains("\"line_addr\": \"0x555555558080\""));
        assert!(r.to_json().contains("\"op\": \"rmw\""));
        assert!(r.to_json().contains("\"ret\": \"0x555555555301\""));
        // A source without call sites writes no `called_from`, and an older report without
        // the field reads back with none.
        let mut none = r.clone();
        none.findings[0].sources[0].called_from.clear();
        assert!(!none.to_json().contains("called_from"));
        assert_eq!(Report::from_json(&none.to_json()).unwrap(), none);
    }

    #[test]
    fn library_frames_are_additive() {
        let mut r = sample();
        // Written only when present: a report of a program with no inlined header code is
        // byte for byte what older writers wrote, and older reports read back with none.
        assert!(!r.to_json().contains("library_frames"));
        r.findings[0].sources[0].library_frames = vec![Inlined {
            function: Some("std::__atomic_base<int>::fetch_add(int, std::memory_order)".into()),
            file: Some("/usr/include/c++/12/bits/atomic_base.h".into()),
            line: Some(618),
        }];
        let json = r.to_json();
        assert!(json.contains("\"library_frames\": ["), "{json}");
        assert_eq!(Report::from_json(&json).unwrap(), r);
    }

    #[test]
    fn other_schema_majors_and_garbage_are_typed_errors() {
        let text = sample().to_json().replace(SCHEMA, "laser-report/2");
        let err = Report::from_json(&text).unwrap_err();
        assert!(err.to_string().contains("laser-report/2"), "{err}");
        assert!(matches!(Report::from_json("{"), Err(ReportError::Json(_))));
        let bad = sample().to_json().replace("\"0x1289\"", "\"1289\"");
        assert!(Report::from_json(&bad)
            .unwrap_err()
            .to_string()
            .contains("1289"));
        let bad = sample().to_json().replace("\"rmw\"", "\"poke\"");
        assert!(Report::from_json(&bad)
            .unwrap_err()
            .to_string()
            .contains("poke"));
    }

    #[test]
    fn raising_the_threshold_moves_findings_below_it() {
        let mut r = sample();
        r.apply_threshold(50_000.0);
        assert!(r.findings.is_empty());
        assert_eq!(
            r.below_threshold,
            BelowThreshold {
                lines: 3,
                events: 40 + 72316,
                thin: 0,
            }
        );
        assert_eq!(r.threshold, 50_000.0);
        let mut r = sample();
        r.apply_threshold(10.0);
        assert_eq!((r.findings.len(), r.threshold), (1, 1000.0));
    }

    #[test]
    fn unknown_fields_are_ignored_and_optional_ones_default() {
        let text = sample()
            .to_json()
            .replacen("\"backend\"", "\"future_field\": [1, 2],\n  \"backend\"", 1)
            .replace("  \"throttles\": 0,\n", "");
        let r = Report::from_json(&text).unwrap();
        assert_eq!(r.throttles, 0);
        assert_eq!(r.findings[0].sources[0].mask(), 0b111);
    }
}
