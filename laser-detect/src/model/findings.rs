//! What the analysis hands to symbolization and reporting: contended cache lines with the
//! instructions and threads involved, in raw (unsymbolized) form.
//!
//! Addresses come in two forms: `pc` is the run-time address (valid only for that run, ASLR),
//! `module` + `offset` is where the instruction lives in its ELF file, as an ELF virtual address
//! (`pc - load bias`), which is what DWARF and symbol tables use and what a later run can map
//! back to its own run-time address.

use laser_driver::BackendKind;

/// Contention kind of one cache line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Contending accesses touched disjoint bytes: separating the data removes it.
    FalseSharing,
    /// Contending accesses touched the same bytes: the data itself is shared.
    TrueSharing,
    /// Both kinds on one line, the minority shown to be a fifth or more of the events
    /// (`line_kind::KIND_SHARE`, `MIXED_SIGNIFICANCE`; neighbour accesses of an exchanged
    /// word count as true).
    Mixed,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::FalseSharing => "false_sharing",
            Kind::TrueSharing => "true_sharing",
            Kind::Mixed => "mixed",
        }
    }
}

/// What an instruction does to memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Load,
    Store,
    /// Read-modify-write: `add [m], r`, `inc [m]`, `xchg`, `lock xadd`, `cmpxchg`, …
    Rmw,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Load => "load",
            Op::Store => "store",
            Op::Rmw => "rmw",
        }
    }
    pub fn writes(self) -> bool {
        !matches!(self, Op::Load)
    }
    pub fn reads(self) -> bool {
        !matches!(self, Op::Store)
    }
}

/// Where an address lies in the target's address space, from its maps.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Location {
    /// Inside a file mapping: `path` and the ELF virtual address (address − load bias).
    Module { path: String, vaddr: u64 },
    /// `[heap]` or anonymous memory (malloc arenas, mmap'd heap objects).
    Heap,
    /// `[stack]` or a thread stack, with the thread whose stack pointer was last seen in it
    /// (when one was), and whether threads other than its owner reached the line.
    Stack { owner: Option<u32>, shared: bool },
    /// Not in any known mapping.
    Unknown,
}

/// One instruction contending on a line.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceAccess {
    /// Run-time address of the instruction.
    pub pc: u64,
    /// The instruction's module and ELF vaddr (`Location::Module`), else `Unknown`.
    pub code: Location,
    pub op: Op,
    /// Bytes of the line this instruction touched, bit N = offset N (lines up to 128 bytes).
    pub offsets: u128,
    /// Contention events attributed to this instruction (weighted, i.e. estimated real events).
    pub events: u64,
    /// Threads that executed it against this line.
    pub threads: Vec<u32>,
    /// For an instruction in a shared library: where the program called into the library,
    /// most samples first (see [`crate::naming::call_sites`]). Empty when unknown.
    pub called_from: Vec<CallSite>,
}

/// A call into a library, found on the sampled stacks of one contending instruction.
#[derive(Clone, Debug, PartialEq)]
pub struct CallSite {
    /// Run-time return address (the instruction after the call).
    pub ret: u64,
    /// Its module and ELF vaddr, else `Unknown`.
    pub code: Location,
    /// Samples of the instruction on this line called from here.
    pub samples: u64,
    /// `samples` over all of the instruction's samples with a known call site on this line.
    pub share: f64,
}

/// One contended cache line.
#[derive(Clone, Debug, PartialEq)]
pub struct LineFinding {
    /// Run-time address of the first byte of the line.
    pub line_addr: u64,
    /// 64, or 128 with `--line 128`.
    pub line_size: u32,
    pub kind: Kind,
    /// Estimated contention events (weighted) and their split by kind.
    pub events: u64,
    pub true_events: u64,
    pub false_events: u64,
    /// Events per second of the run.
    pub rate_per_s: f64,
    /// Share of all contention events in the run, 0..=1.
    pub share: f64,
    pub threads: Vec<u32>,
    /// Where the line lies (global in a module, heap, stack, unknown).
    pub data: Location,
    /// A forked copy's private line: the pid of the process whose copy it is
    /// (`line_addr` is then the detector's key for it, [`crate::decode::maps::copy_key`]).
    pub process: Option<u32>,
    /// Contending instructions, most events first.
    pub sources: Vec<SourceAccess>,
    /// The rate is from code windows (`model::estimate`): measured over the time the
    /// contending instructions were watched, wherever they went. Such lines join a migratory group whatever their own rate ([`crate::model::migratory`]).
    pub by_code: bool,
    /// The line had front windows (`model::estimate`): a code window found the code that
    /// moves along lines on it, and its data were watched while it was hot; its rate is the
    /// loop's while there. It joins its migratory group whatever its rate.
    pub front: bool,
}

/// Contention events from which a line's rate is taken at its word. One or two transfers
/// are what a line threads share shows now and then (a round counter the main thread stores
/// while workers read its neighbour), and a rate extrapolated from them is known only within
/// a factor of ~40 (one event) or ~8 (two): such a line is a finding only if the low end of
/// its rate's 95% interval is at or above the threshold ([`POISSON_LOW_95`]). In full
/// accuracy runs every finding on an expected line rested on 14 events or more, and the ones
/// from a single event were a spurious line (`round_threads`, round_no's line at 1,049 ev/s)
/// or a wrong kind (`locked_queue`, one false-sharing event at 2,722 ev/s beside its true
/// sharing). A low `--threshold` (everything above 1 ev/s) still lists such lines.
pub const MIN_FINDING_EVENTS: u64 = POISSON_LOW_95.len() as u64;

/// The low end of the two-sided 95% interval of a Poisson mean, for counts 0, 1 and 2.
pub const POISSON_LOW_95: [f64; 3] = [0.0, 0.0253, 0.2422];

impl LineFinding {
    /// Whether the report lists this line on its own at `threshold` events/s: its rate is at
    /// or above it, from at least [`MIN_FINDING_EVENTS`] events or, from fewer, even at the
    /// low end of its 95% interval.
    pub fn reported_at(&self, threshold: f64) -> bool {
        // NaN rates (a zero-length run) are never above a threshold.
        let above = self.rate_per_s >= threshold;
        match usize::try_from(self.events).map(|n| POISSON_LOW_95.get(n)) {
            Ok(Some(low)) => {
                above && self.rate_per_s * low / self.events.max(1) as f64 >= threshold
            }
            _ => above,
        }
    }
}

/// A loaded module (executable or shared library) seen in the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleInfo {
    pub path: String,
    /// Load bias: run-time address − ELF vaddr.
    pub bias: u64,
    pub build_id: Option<Vec<u8>>,
}

/// The analysis result: every contended line found (not yet thresholded), ranked by rate.
#[derive(Clone, Debug, PartialEq)]
pub struct Analysis {
    pub backend: BackendKind,
    pub duration_s: f64,
    pub samples: u64,
    pub lost: u64,
    pub throttles: u64,
    /// Samples dropped by the filter (kernel, vdso, stack, TLS, undecodable), for the summary.
    pub filtered: u64,
    pub line_size: u32,
    pub findings: Vec<LineFinding>,
    pub modules: Vec<ModuleInfo>,
    /// Human-readable caveats to print with the report (e.g. "estimated from soft samples").
    pub notes: Vec<String>,
    /// What watch windows surveyed beyond the lines samples showed contended (see
    /// [`crate::model::survey`]); `None` when no window did.
    pub survey: Option<SurveySummary>,
    /// How much the program's threads ran at the same time (from timer samples; see
    /// [`crate::model::concurrency`]); `None` without timer samples.
    pub concurrency: Option<crate::model::concurrency::Concurrency>,
}

/// Lines watched in windows that opened while no sample had shown contention there.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SurveySummary {
    /// Lines surveyed, and of them in module data (globals of the program or its libraries) and
    /// the heap.
    pub lines: u64,
    pub global_lines: u64,
    pub heap_lines: u64,
    /// Distinct bytes watched over all surveyed lines.
    pub bytes: u64,
    /// Survey windows opened.
    pub windows: u64,
    /// Surveyed lines that turned out contended (their contention was first seen in a watch
    /// window), by line address.
    pub found: Vec<u64>,
}
