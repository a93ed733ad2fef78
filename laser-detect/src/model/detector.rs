//! The detector: one `Event` stream in, one [`Analysis`] out. It does not know whether events
//! come from perf, watchpoints or a recording (STYLE.md item 2).
//!
//! # Weights: what an event count means per backend
//! - `pebs`/`ibs`: each sample stands for `weight` (= the sampling period) events of its kind;
//!   a contention event found between two sampled accesses is counted with the later sample's
//!   weight, an estimate of the real number.
//! - `watch`: every access to the watched bytes is seen; weight 1, counts exact for those bytes
//!   over the armed windows; rates come from [`crate::model::estimate`] (armed time, trap correction).
//! - `soft`: a timer sample counts time, not memory events, so it carries no event weight. Each
//!   contention event the line model finds between two sampled accesses of different threads
//!   proves at least one real line transfer in between, and those intervals are disjoint: the
//!   count is a LOWER BOUND of the real transfers ("sampled events"), counted with weight 1.
//!   Real rates for soft runs come from watch windows on the candidates (`candidates`).
//!
//! # Order
//! The line model compares each access with the previous one to its line, so the stream must
//! be in time order across CPUs (merge the per-CPU ring buffers by timestamp, as perf's
//! ordered-events does). A stream fed CPU by CPU still finds the lines, with fewer events.
//!
//! # Threads, not cores
//! Contention is counted between threads, not CPUs: a false-sharing pattern in the code is
//! found even when the run's threads happened to share a core (then the reported rate is
//! higher than the hardware's transfers).

use std::collections::BTreeMap;
use std::sync::Arc;

use hashbrown::{HashMap, HashSet};
use laser_driver::{BackendKind, Event, Mmap, Sample, StreamStats};

use crate::decode::access::{resolve, Access, Accesses, DropReason};
use crate::decode::code::{CodeSource, FileMapping};
use crate::decode::frame_slots::FrameSlots;
use crate::decode::maps::{self, copy_key, split_copy, AddressSpace, Class, Spaces, KERNEL_START};
use crate::decode::pccache::{PcCache, Where};
use crate::decode::store_pair::store_after_load;
use crate::model::armed_cost::{ArmedCost, ArmedCostSummary};
use crate::model::concurrency::ConcurrencyTracker;
use crate::model::estimate::{Estimator, LineEstimate, DEFAULT_TRAP_COST_NS};
use crate::model::findings::{
    Analysis, CallSite, LineFinding, Location, ModuleInfo, SourceAccess, SurveySummary,
};
use crate::model::line_kind::line_kind;
use crate::model::line_model::{byte_mask, LineModel, LineStat, SourceStat, WordHistory};
use crate::model::neighbours::NeighbourStores;
use crate::model::survey::{HotLines, SurveyTarget};
use crate::naming::call_sites::{is_shared_library, CallSites};
use crate::naming::heap_blocks::Memory;

pub use crate::model::candidates::WatchCandidate;

/// Detector settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// 64, or 128 to group adjacent-line pairs (adjacent-line prefetch).
    pub line_size: u32,
    /// Run duration when the caller knows it better than the first-to-last sample span.
    pub duration_s: Option<f64>,
    /// Cost of one watchpoint trap, for the estimator's slowdown correction.
    pub trap_cost_ns: u64,
    /// Lines with fewer events are left out (noise floor; the rate threshold is the report's).
    pub min_events: u64,
    /// Bound on lines whose last access is remembered (32 bytes each; LRU beyond).
    pub max_lines: usize,
    /// Bound on contended lines kept with per-PC detail (least contended half dropped beyond).
    pub max_contended: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            line_size: 64,
            duration_s: None,
            trap_cost_ns: DEFAULT_TRAP_COST_NS,
            min_events: 1,
            max_lines: crate::model::line_model::DEFAULT_MAX_LINES,
            max_contended: crate::model::line_model::DEFAULT_MAX_CONTENDED,
        }
    }
}

/// Why samples produced no access, for the summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FilterStats {
    /// Samples whose IP is in the kernel.
    pub kernel_pc: u64,
    /// Samples whose IP is in vdso/vvar/vsyscall.
    pub special_pc: u64,
    pub undecodable: u64,
    /// Samples at instructions that touch no memory (not an error: most instructions).
    pub no_memory: u64,
    pub stack: u64,
    pub thread_local: u64,
    pub missing_regs: u64,
    /// Watch hits by a narrow access that overwrote its address registers: the bytes it
    /// touched in the watched word are unknown, so the hit is not counted.
    pub watch_bytes_unknown: u64,
    /// Accesses dropped because their data address is stack, vdso or kernel.
    pub stack_data: u64,
    /// Accesses that reached the line model.
    pub accesses: u64,
}

/// Code windows an instruction gets on the strength of neighbouring stores alone
/// ([`Detector::neighbour_candidates`]): enough for one to fall in a phase where the parts
/// meet on a line (moving_scratch: one phase in four shares nothing), few enough that parts
/// that never meet do not keep taking turns from lines known to be contended.
pub const NEIGHBOUR_CODE_WINDOWS: usize = 5;

/// A contended line's rate as steering weighs it: its data windows' estimate where one
/// could count transfers (not a code window's), else its sampled events over `duration_s`.
fn steering_rate(l: &LineStat, estimates: &[LineEstimate], duration_s: f64) -> f64 {
    estimates
        .iter()
        .find(|e| e.line_addr == l.line_addr && e.informative() && !e.code)
        .map_or(l.events as f64 / duration_s, |e| e.rate_per_s)
}

impl FilterStats {
    /// Samples dropped by the filter (everything but "touches no memory").
    pub fn dropped(&self) -> u64 {
        self.kernel_pc
            + self.special_pc
            + self.undecodable
            + self.stack
            + self.thread_local
            + self.missing_regs
            + self.watch_bytes_unknown
    }
}

/// Look windows remembered for weighing their hits ([`in_look`]): hits come
/// within a few ms of their window, and a run has a few looks per contended line.
const MAX_LOOKS_KEPT: usize = 64;

pub struct Detector<C: CodeSource> {
    config: Config,
    code: C,
    pcs: PcCache,
    spaces: Spaces,
    /// The pid of each forked copy ([`AddressSpace::copy`]) by its number.
    copies: BTreeMap<u16, u32>,
    main_pid: Option<u32>,
    model: LineModel,
    estimator: Estimator,
    /// Lines whose watch window is open (from the last `Event::WatchSet`).
    watched_lines: Vec<u64>,
    /// Look windows (`Event::WatchSet::look`): line, start and end (`u64::MAX` while open),
    /// the latest [`MAX_LOOKS_KEPT`]. Their hits name who accesses the line, and count no
    /// event.
    looks: Vec<(u64, u64, u64)>,
    /// Look windows announced, and the lines they were on (for the report's note).
    look_windows: u64,
    look_lines: Vec<u64>,
    /// The latest look hit of each thread on each word looks watched.
    look_words: WordHistory,
    /// Instructions code windows have watched (see `code_candidates`).
    code_watched: Vec<u64>,
    stats: StreamStats,
    filter: FilterStats,
    first_time: u64,
    last_time: u64,
    backends: [u64; 4],
    /// Per thread (direct-mapped by tid), the stack extent its sp was last seen in, so the
    /// stack lookup runs only when a thread's sp leaves it.
    stacks: [(u32, u64, u64); STACK_SLOTS],
    /// Stack lines a thread other than the stack's own reached: shared data (kept for every
    /// thread from then on, the stack's owner included).
    shared_stack_lines: HashSet<u64>,
    out: Accesses,
    call_sites: CallSites,
    /// Sampled accesses per line, for the watchpoint survey ([`crate::model::survey`]).
    hot: HotLines,
    /// Store instructions two threads' samples show storing into neighbouring memory
    /// ([`crate::model::neighbours`]): candidates for code windows.
    neighbours: NeighbourStores,
    /// Writable data objects (ELF vaddr, size) and load bias of each program (not shared
    /// library) module, per (pid, module index).
    globals: HashMap<(u32, u32), ModuleGlobals>,
    /// Lines watched while the line model had no contention on them: (bytes watched, windows).
    surveyed: HashMap<u64, (u128, u64)>,
    /// Timer samples on fast-string instructions, armed and not: what watching costs.
    armed_cost: ArmedCost,
    /// What timer samples have shown of the stack slots -O0 code reloads pointers from.
    frame_slots: FrameSlots,
    /// Which threads ran at the same time, from timer samples.
    concurrency: ConcurrencyTracker,
}

const STACK_SLOTS: usize = 64;

/// Whether the watch hit `a` fell in one of the look windows `looks` on its line
/// ([`Detector::looks`]).
fn in_look(looks: &[(u64, u64, u64)], line_size: u32, a: &Access) -> bool {
    let line = a.addr & line_mask(line_size);
    looks
        .iter()
        .any(|&(l, t0, t1)| l == line && t0 <= a.time && a.time <= t1)
}

/// The mask that clears an address's offset in a `line_size`-byte line.
fn line_mask(line_size: u32) -> u64 {
    !(u64::from(line_size.max(1)) - 1)
}

/// A program module's load bias and writable data objects (ELF vaddr, size).
type ModuleGlobals = (u64, Arc<[(u64, u64)]>);

/// The report's account of the watchpoint survey: what was covered, and what it found.
fn survey_note(s: &SurveySummary) -> String {
    format!(
        "watch survey: {} line(s) no timer sample showed contended ({} in globals of the \
         program or its libraries, {} heap) watched for stores in {} window(s), {} bytes in \
         all; contention found on {} of them; survey windows see stores only (but on a line \
         two threads were sampled on apart, and around one thread's stores), so transfers \
         that loads cause there are not counted (lower bounds), and bytes never watched (most \
         heap data) are not covered",
        s.lines,
        s.global_lines,
        s.heap_lines,
        s.windows,
        s.bytes,
        s.found.len()
    )
}

/// The report's account of what armed watchpoints cost in fast-string slowdown, when they
/// cost something measurable (a slowdown of at least 5%).
fn armed_cost_note(s: &ArmedCostSummary) -> Option<String> {
    let slowdown = s.slowdown().filter(|&x| x >= 1.05)?;
    let pct = |n: u64, of: u64| 100.0 * n as f64 / of.max(1) as f64;
    Some(format!(
        "watch cost: with watchpoints armed, {:.0}% of timer samples were in fast-string \
         copies (rep movs/stos), {:.0}% without ({} and {} samples): an armed data breakpoint \
         turns fast strings off, so the program ran ~{:.1}x slower while watched; watch \
         windows were spaced to keep that within the overhead budget, so watch-based rates \
         come from less armed time",
        pct(s.armed_fast_string, s.armed_samples),
        pct(s.unarmed_fast_string, s.unarmed_samples),
        s.armed_samples,
        s.unarmed_samples,
        slowdown
    ))
}

fn backend_index(b: BackendKind) -> usize {
    match b {
        BackendKind::Pebs => 0,
        BackendKind::Ibs => 1,
        BackendKind::Soft => 2,
        BackendKind::Watch => 3,
    }
}

impl<C: CodeSource> Detector<C> {
    pub fn new(config: Config, code: C) -> Self {
        let model =
            LineModel::with_limits(config.line_size, config.max_lines, config.max_contended);
        let estimator = Estimator::new(config.line_size).with_trap_cost(config.trap_cost_ns);
        Self {
            config,
            code,
            pcs: PcCache::new(),
            spaces: Spaces::default(),
            copies: BTreeMap::new(),
            main_pid: None,
            model,
            estimator,
            watched_lines: Vec::new(),
            looks: Vec::new(),
            look_windows: 0,
            look_lines: Vec::new(),
            look_words: WordHistory::default(),
            code_watched: Vec::new(),
            stats: StreamStats::default(),
            filter: FilterStats::default(),
            first_time: u64::MAX,
            last_time: 0,
            backends: [0; 4],
            stacks: [(0, 0, 0); STACK_SLOTS],
            shared_stack_lines: HashSet::new(),
            out: Accesses::default(),
            call_sites: CallSites::default(),
            hot: HotLines::default(),
            neighbours: NeighbourStores::default(),
            globals: HashMap::new(),
            surveyed: HashMap::new(),
            armed_cost: ArmedCost::default(),
            frame_slots: FrameSlots::default(),
            concurrency: ConcurrencyTracker::default(),
        }
    }

    pub fn code_source(&self) -> &C {
        &self.code
    }

    pub fn filter_stats(&self) -> FilterStats {
        self.filter
    }

    /// Lines the model tracks (its memory is proportional to this).
    pub fn lines_tracked(&self) -> usize {
        self.model.lines_tracked()
    }

    /// Lines forgotten by the bounded line table.
    pub fn line_evictions(&self) -> u64 {
        self.model.evictions()
    }

    /// Seed a process's address space from `/proc/PID/maps` text (what a recording's header
    /// or `attach` captured before any `Mmap` event).
    pub fn add_maps(&mut self, pid: u32, text: &str) {
        for r in maps::parse(text) {
            self.map_region(pid, &r, None);
        }
    }

    fn map_region(&mut self, pid: u32, r: &maps::Region, build_id: Option<&[u8]>) {
        let space = self.spaces.entry(pid);
        let is_file = r.path.starts_with('/');
        let layout = if is_file {
            self.code.map_file(&FileMapping {
                path: &r.path,
                start: r.start,
                end: r.end,
                pgoff: r.offset,
                exec: r.exec,
            })
        } else {
            None
        };
        let bias = layout
            .as_ref()
            .map_or(r.start.wrapping_sub(r.offset), |l| l.bias);
        if let Some(m) = space.insert_region(r, bias) {
            if let Some(l) = &layout {
                space.set_module_layout(m, &l.segments);
                if !l.writable_objects.is_empty() && !is_shared_library(&r.path) {
                    self.globals
                        .entry((pid, m))
                        .or_insert_with(|| (bias, l.writable_objects.clone()));
                }
            }
            let module = &mut space.modules[m as usize];
            if module.build_id.is_none() {
                module.build_id = build_id
                    .map(<[u8]>::to_vec)
                    .or_else(|| layout.and_then(|l| l.build_id));
            }
        }
    }

    fn on_mmap(&mut self, m: &Mmap) {
        let r = maps::Region {
            start: m.addr,
            end: m.addr.saturating_add(m.len),
            read: m.prot & 1 != 0,
            write: m.prot & 2 != 0,
            exec: m.prot & 4 != 0,
            offset: m.pgoff,
            inode: 0,
            path: m.path.clone(),
            shared: m.flags & libc::MAP_SHARED as u32 != 0,
        };
        self.map_region(m.pid, &r, m.build_id.as_deref());
    }

    /// Watchpoints on `line_addr`'s line were armed at `time` (the CLI calls this when it arms
    /// a window; see [`crate::model::estimate`]).
    pub fn watch_window_begin(&mut self, line_addr: u64, time: u64) {
        self.estimator.begin_window(line_addr, time);
    }

    pub fn watch_window_end(&mut self, line_addr: u64, time: u64) {
        self.estimator.end_window(line_addr, time);
    }

    /// How many times longer the target's work takes while watchpoints are armed (see
    /// [`crate::model::armed_cost`]); `None` until enough armed time has been sampled.
    pub fn armed_slowdown(&self) -> Option<f64> {
        self.armed_cost.slowdown()
    }

    /// The bytes of the contended line at `line` that its contending accesses stored (bit n =
    /// byte n; 0 for a line not contended).
    pub fn stored_bytes(&self, line: u64) -> u128 {
        self.source_bytes(line, |s| s.op.writes())
    }

    /// The bytes of the contended line at `line` that any of its named accesses touched,
    /// loads included (bit n = byte n; 0 for a line not contended).
    pub fn accessed_bytes(&self, line: u64) -> u128 {
        self.source_bytes(line, |_| true)
    }

    /// The bytes of the contended line at `line` that its accesses `keep` takes touched.
    fn source_bytes(&self, line: u64, keep: impl Fn(&SourceStat) -> bool) -> u128 {
        self.contended_line(line).map_or(0, |l| {
            l.sources
                .iter()
                .filter(|s| keep(s))
                .fold(0, |m, s| m | s.offsets)
        })
    }

    /// The threads whose contending accesses (samples' and windows') are on the line at
    /// `line`, by id: none for a line not contended.
    pub fn line_threads(&self, line: u64) -> Vec<u32> {
        // (`LineStat::threads` holds each thread once.)
        self.contended_line(line)
            .map_or_else(Vec::new, |l| l.threads.iter().map(|t| t.0).collect())
    }

    /// How many threads the contending accesses on the line at `line` (samples' and
    /// windows' alike) show storing there: 0 for a line not contended.
    pub fn storing_threads(&self, line: u64) -> usize {
        let mut tids: Vec<u32> = self
            .contended_line(line)
            .into_iter()
            .flat_map(|l| l.sources.iter().filter(|s| s.op.writes()))
            .flat_map(|s| s.threads.iter().copied())
            .collect();
        tids.sort_unstable();
        tids.dedup();
        tids.len()
    }

    /// The contended line at `line`, if it is one.
    fn contended_line(&self, line: u64) -> Option<&LineStat> {
        self.model.contended().find(|l| l.line_addr == line)
    }

    /// The cache line size the detector groups accesses by (bytes).
    pub fn line_size(&self) -> u32 {
        self.config.line_size
    }

    pub fn estimates(&self) -> Vec<LineEstimate> {
        self.estimator.estimates()
    }

    /// Consume one event.
    pub fn feed(&mut self, e: &Event) {
        self.stats.account(e);
        match e {
            Event::Sample(s) => self.sample(s),
            Event::Mmap(m) => self.on_mmap(m),
            Event::Comm {
                pid, exec: true, ..
            } => {
                // New program image: old mappings and decoded code are gone.
                self.spaces.insert(*pid, AddressSpace::new());
                self.globals.retain(|k, _| k.0 != *pid);
                self.pcs.clear();
                self.call_sites.clear_checks();
            }
            Event::Fork { pid, ppid, .. } if pid != ppid => {
                if let Some(mut child) = self.spaces.get(*ppid).cloned() {
                    // Its private memory is the parent's addresses but other memory: two
                    // processes each writing its own copy of a global share no line.
                    let n = (self.copies.len() as u16)
                        .saturating_add(1)
                        .min(maps::MAX_COPY);
                    self.copies.insert(n, *pid);
                    child.copy = n;
                    self.spaces.insert(*pid, child);
                }
            }
            Event::WatchSet {
                time,
                words,
                write_only,
                exec,
                front,
                look,
            } => self.on_watch_set(*time, words, *write_only, *exec, *front, *look),
            // A measurement of this run beats the configured default.
            Event::WatchCost { hit_ns, .. } => self.estimator.set_trap_cost(*hit_ns),
            // An exited thread contends no more: its last access to a word or a line is not
            // paired with a watch hit after the join (`WordHistory`, `LineModel::access_live`).
            Event::Exit { tid, .. } => {
                self.look_words.forget(*tid);
                self.model.thread_exited(*tid);
            }
            _ => {}
        }
    }

    /// The driver says exactly `words` are watched from `time` on: close the windows of the
    /// lines watched until now and open windows on the lines of `words` (the estimator's armed
    /// time comes from these, so replayed recordings get the same rates as the live run).
    ///
    /// Words watched for writes only (`write_only`, bit i = word i: survey windows) give the
    /// estimator every store to them and no load: stores of two threads are transfers it
    /// counts, transfers loads cause are missed (a lower bound, said in the survey note).
    ///
    /// Words that are instructions (`exec`, bit i = word i) open one code window on them
    /// ([`crate::model::estimate`], "Code windows"), not a data window on their bytes.
    ///
    /// Data words of a front window (`front`) open front windows on their lines: data windows
    /// like the others, on lines a code window has just found contended, so not surveys.
    ///
    /// A look (`look`: words of a line already rated that no sample showed, steering's
    /// `unsampled_look`) opens no window: its hits reach the line model as any access (who
    /// else touches the line there, and where in the code), but a window that watches the
    /// line's rare words and not its hot ones would rate it far too low.
    fn on_watch_set(
        &mut self,
        time: u64,
        words: &[(u64, u8)],
        write_only: u8,
        exec: u8,
        front: u8,
        look: u8,
    ) {
        for line in std::mem::take(&mut self.watched_lines) {
            self.estimator.end_window(line, time);
        }
        for l in self.looks.iter_mut().filter(|l| l.2 == u64::MAX) {
            l.2 = time;
        }
        let mask = line_mask(self.config.line_size);
        for (i, &(a, _)) in words.iter().enumerate() {
            let line = a & mask;
            if look & (1 << i) != 0 && !self.looks.iter().any(|l| l.0 == line && l.1 == time) {
                if self.looks.len() >= MAX_LOOKS_KEPT {
                    self.looks.remove(0);
                }
                self.looks.push((line, time, u64::MAX));
                self.look_windows += 1;
                if !self.look_lines.contains(&line) {
                    self.look_lines.push(line);
                }
            }
        }
        self.estimator.end_code_window(time);
        self.armed_cost.transition(time, !words.is_empty());
        let is_code = |i: usize| exec & (1 << i) != 0;
        let pcs: Vec<u64> = (0..words.len())
            .filter(|&i| is_code(i))
            .map(|i| words[i].0)
            .collect();
        if !pcs.is_empty() {
            for &pc in &pcs {
                if !self.code_watched.contains(&pc) {
                    self.code_watched.push(pc);
                }
            }
            self.estimator.begin_code_window(time, pcs);
        }
        // The data words, each with whether it traps on stores only.
        let is_front = front != 0;
        let words: Vec<((u64, u8), bool)> = (0..words.len())
            .filter(|&i| !is_code(i) && look & (1 << i) == 0)
            .map(|i| (words[i], write_only & (1 << i) != 0))
            .collect();
        let mut lines: Vec<u64> = words.iter().map(|&((a, _), _)| a & mask).collect();
        lines.sort_unstable();
        lines.dedup();
        for &line in &lines {
            let watched = words
                .iter()
                .filter(|w| w.0 .0 & mask == line)
                .fold(0u128, |b, &((a, len), _)| {
                    b | byte_mask((a - line) as u32, u32::from(len))
                });
            // A window on a line no sample showed contended is a survey (see `survey`).
            if !self.model.is_contended(line) && !is_front {
                let e = self.surveyed.entry(line).or_default();
                e.0 |= watched;
                e.1 += 1;
            }
            let stores_only = words.iter().filter(|w| w.0 .0 & mask == line).all(|w| w.1);
            if is_front {
                self.estimator.begin_front_window(line, time, stores_only);
            } else if stores_only {
                self.estimator.begin_store_window(line, time);
            } else {
                self.estimator.begin_window(line, time);
            }
            self.estimator.note_watched(line, watched, stores_only);
        }
        self.watched_lines = lines;
    }

    fn sample(&mut self, s: &Sample) {
        self.backends[backend_index(s.backend)] += 1;
        self.first_time = self.first_time.min(s.time);
        self.last_time = self.last_time.max(s.time);
        // Every timer sample says its thread was running (kernel PCs too); a soft sample's
        // weight is its period in ns.
        if s.backend == BackendKind::Soft {
            self.concurrency.sample(s.tid, s.cpu, s.time, s.weight);
        }
        if s.ip >= KERNEL_START {
            self.filter.kernel_pc += 1;
            return;
        }
        self.main_pid.get_or_insert(s.pid);
        // One map lookup per sample; the fields below are borrowed disjointly.
        let space = self.spaces.entry(s.pid);
        let (info, skid) =
            self.pcs
                .lookup_sampled(s.ip, s.tid, &self.code, || match space.classify(s.ip) {
                    Class::Special => Where {
                        special: true,
                        library: false,
                    },
                    Class::Module { module, .. } => Where {
                        special: false,
                        library: is_shared_library(&space.modules[module as usize].path),
                    },
                    _ => Where::default(),
                });
        if info.special {
            self.filter.special_pc += 1;
            return;
        }
        if s.backend != BackendKind::Watch {
            let fast_string = info.at.as_ref().is_some_and(|i| i.is_fast_string());
            self.armed_cost.sample(s.time, fast_string);
        }
        if let Some(sp) = s.regs.as_ref().and_then(|r| r.get(laser_driver::Reg::Sp)) {
            let slot = &mut self.stacks[s.tid as usize % STACK_SLOTS];
            if !(slot.0 == s.tid && slot.1 <= sp && sp < slot.2) {
                if let Some((lo, hi)) = space.note_stack_pointer(sp) {
                    *slot = (s.tid, lo, hi);
                }
            }
        }
        // A sample reached only from the instruction before it shows what that instruction
        // loaded: the value of a frame slot a pointer is reloaded from (`frame_slots`).
        if s.backend == BackendKind::Soft && !info.join {
            if let (Some(prev), Some(regs)) = (info.prev.as_ref(), s.regs.as_ref()) {
                self.frame_slots.learn_after(prev, regs);
            }
        }
        if let Err(why) = resolve(s, info, skid, &self.frame_slots, &mut self.out) {
            match why {
                DropReason::Undecodable => self.filter.undecodable += 1,
                DropReason::NoMemory => self.filter.no_memory += 1,
                DropReason::Stack => self.filter.stack += 1,
                DropReason::ThreadLocal => self.filter.thread_local += 1,
                DropReason::MissingRegs => self.filter.missing_regs += 1,
                DropReason::WatchBytesUnknown => self.filter.watch_bytes_unknown += 1,
            }
            return;
        }
        // A sample inside a shared library: where the program called it (the stack's
        // candidates, checked against this process's maps and the code before them).
        let ip_class = if info.library && !s.callers.is_empty() {
            space.classify(s.ip)
        } else {
            Class::Unknown // program code, or no candidates: nothing to look up
        };
        let caller = match ip_class {
            Class::Module { module, .. } => {
                self.call_sites.pick(&self.code, s.callers.as_slice(), |c| {
                    match space.classify(c) {
                        Class::Module { module: m, .. } => m != module,
                        _ => false,
                    }
                })
            }
            _ => None,
        };
        let line_mask = line_mask(self.model.line_size());
        let code_hit = crate::decode::access::is_code_hit(s);
        // The stack this thread's stack pointer is in (noted above from this very sample).
        let own_stack = Some(self.stacks[s.tid as usize % STACK_SLOTS])
            .filter(|slot| slot.0 == s.tid)
            .map(|slot| (slot.1, slot.2));
        for a in self.out.iter() {
            match space.classify(a.addr) {
                Class::Special => {
                    self.filter.stack_data += 1;
                    continue;
                }
                // A thread's own stack is its own, but a line of it that another thread
                // reaches is shared data, for the owner too from then on (OpenMP's shared
                // locals live on the master thread's stack, and a pthread program's per-
                // thread results array is often a local of main): `sum[id] += …` at -O0
                // from two OpenMP threads was 2,000 dropped accesses and no finding. Where
                // the thread's own stack is not known, the access counts as its own.
                Class::Stack => {
                    let own = own_stack.is_none_or(|(lo, hi)| lo <= a.addr && a.addr < hi);
                    let line = a.addr & line_mask;
                    if !own {
                        self.shared_stack_lines.insert(line);
                    } else if !self.shared_stack_lines.contains(&line) {
                        self.filter.stack_data += 1;
                        continue;
                    }
                }
                _ => {}
            }
            // A forked copy's private memory is keyed apart from the original's (and from
            // other copies'): from here on every model sees it as other lines.
            let keyed;
            let a = if space.copy != 0 && space.is_private(a.addr) {
                keyed = Access {
                    addr: copy_key(a.addr, space.copy),
                    ..*a
                };
                &keyed
            } else {
                a
            };
            if let Some(ret) = caller {
                self.call_sites.note(a.addr & line_mask, a.pc, ret);
            }
            self.filter.accesses += 1;
            // A look's hit: a participant in what it contends with, no event of its own (a
            // look watches a line's rare words, chosen to be seen, not counted).
            let looked;
            let a = if s.backend == BackendKind::Watch
                && in_look(&self.looks, self.config.line_size, a)
            {
                self.look_words.note(&mut self.model, a);
                looked = Access { weight: 0, ..*a };
                &looked
            } else {
                a
            };
            if s.backend == BackendKind::Watch {
                self.model.access_live(a);
            } else {
                self.model.access(a);
            }
            if code_hit {
                self.estimator.observe_code(a);
            } else if s.backend == BackendKind::Watch {
                self.estimator.observe(a);
            } else {
                let line = a.addr & line_mask;
                let off = (a.addr - line) as u32;
                let len = u32::from(a.size.max(1)).min(self.model.line_size() - off);
                self.hot
                    .note(line, a.tid, a.op.writes(), byte_mask(off, len));
                self.neighbours.note(a.pc, a.tid, a.addr, a.op.writes());
            }
        }
    }

    /// `addr` as a place in a module's code, else `Unknown`.
    fn code_location(&self, addr: u64) -> Location {
        match self.location(addr) {
            m @ Location::Module { .. } => m,
            _ => Location::Unknown,
        }
    }

    /// The call sites seen for instruction `pc` on the line, most samples first.
    fn called_from(&self, line_addr: u64, pc: u64) -> Vec<CallSite> {
        let Some(c) = self.call_sites.get(line_addr, pc) else {
            return Vec::new();
        };
        let total = c.total().max(1) as f64;
        let mut out: Vec<CallSite> = c
            .sites
            .iter()
            .map(|&(ret, samples)| CallSite {
                ret,
                code: self.code_location(ret),
                samples,
                share: samples as f64 / total,
            })
            .collect();
        out.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.ret.cmp(&b.ret)));
        out
    }

    fn location(&self, addr: u64) -> Location {
        // A forked copy's line is named in the copy's space (its globals are the original's
        // globals, at the same addresses).
        let (copy, addr) = split_copy(addr);
        let pid = match copy {
            0 => self.main_pid,
            n => self.copies.get(&n).copied(),
        };
        let Some(space) = pid.and_then(|p| self.spaces.get(p)) else {
            return Location::Unknown;
        };
        match space.classify(addr) {
            Class::Module { module, vaddr } => Location::Module {
                path: space.modules[module as usize].path.clone(),
                vaddr,
            },
            Class::Heap => Location::Heap,
            Class::Stack => Location::Stack {
                owner: self
                    .stacks
                    .iter()
                    .find(|&&(tid, lo, hi)| tid != 0 && lo <= addr && addr < hi)
                    .map(|s| s.0),
                shared: self
                    .shared_stack_lines
                    .contains(&(addr & line_mask(self.model.line_size()))),
            },
            Class::Special | Class::Unknown => Location::Unknown,
        }
    }

    /// The stream's main backend: the most frequent, preferring sampling backends over watch
    /// (a soft run with watch windows is a soft run).
    fn backend(&self) -> BackendKind {
        let sampling = [BackendKind::Pebs, BackendKind::Ibs, BackendKind::Soft];
        sampling
            .into_iter()
            .filter(|b| self.backends[backend_index(*b)] > 0)
            .max_by_key(|b| self.backends[backend_index(*b)])
            .unwrap_or(if self.backends[3] > 0 {
                BackendKind::Watch
            } else {
                BackendKind::Soft
            })
    }

    pub fn duration_s(&self) -> f64 {
        self.config.duration_s.unwrap_or_else(|| {
            if self.last_time > self.first_time {
                (self.last_time - self.first_time) as f64 * 1e-9
            } else {
                0.0
            }
        })
    }

    fn finding(&self, l: &LineStat, est: Option<&LineEstimate>, duration: f64) -> LineFinding {
        let (events, true_events, false_events, rate) = match est {
            // The windows count a line's transfers exactly, but only while armed, and a line
            // whose contention changes kind with the program's phases can have all its windows
            // in one phase: streamcluster's work_mem line is false sharing while pgain runs
            // and true sharing in the short reduction after it, and in 1 run of ~8 its few
            // windows fell in the reduction (13 of 15 transfers true, where other runs' line
            // models held 0–15 true of 77–207 events). The line model has seen the windows'
            // hits and the timer samples of every phase at its share of the run, so the kind
            // is judged on its events; the rate stays the windows'.
            Some(e) => (e.transfers, l.true_events, l.false_events, e.rate_per_s),
            None => {
                let r = if duration > 0.0 {
                    l.events as f64 / duration
                } else {
                    0.0
                };
                (l.events, l.true_events, l.false_events, r)
            }
        };
        let kind = line_kind(true_events, false_events);
        let mut sources: Vec<SourceAccess> = l
            .sources
            .iter()
            .map(|s| {
                let mut threads = s.threads.clone();
                threads.sort_unstable();
                let ev = match est {
                    Some(e) => e.per_pc.iter().find(|p| p.0 == s.pc).map_or(0, |p| p.1),
                    None => s.events,
                };
                SourceAccess {
                    pc: s.pc,
                    code: self.code_location(s.pc),
                    op: s.op,
                    offsets: s.offsets,
                    events: ev,
                    threads,
                    called_from: self.called_from(l.line_addr, s.pc),
                }
            })
            .collect();
        sources.sort_by(|a, b| b.events.cmp(&a.events).then(a.pc.cmp(&b.pc)));
        let mut threads: Vec<u32> = l.threads.iter().map(|t| t.0).collect();
        threads.sort_unstable();
        LineFinding {
            line_addr: l.line_addr,
            line_size: self.model.line_size(),
            kind,
            events,
            true_events,
            false_events,
            rate_per_s: rate,
            share: 0.0,
            threads,
            data: self.location(l.line_addr),
            process: match split_copy(l.line_addr).0 {
                0 => None,
                n => self.copies.get(&n).copied(),
            },
            sources,
            by_code: est.is_some_and(|e| e.code),
            front: est.is_some_and(|e| e.front),
        }
    }

    /// The analysis so far: every contended line with at least `min_events`, ranked by rate.
    pub fn finish(&self) -> Analysis {
        let duration = self.duration_s();
        let estimates = self.estimator.estimates();
        // A line whose windows never saw two threads keeps its sampled count: "0 transfers
        // in windows that could not have seen one" would drop real contention. So does a
        // line whose windows counted none while the line model proved some (contention that
        // came in phases the windows missed: the proven events are a lower bound).
        let est_of = |line: u64| {
            estimates.iter().find(|e| {
                e.line_addr == line
                    && e.informative()
                    && (e.transfers > 0 || !self.model.is_contended(line))
            })
        };
        let mut findings: Vec<LineFinding> = self
            .model
            .contended()
            .map(|l| self.finding(l, est_of(l.line_addr), duration))
            .filter(|f| f.events >= self.config.min_events.max(1))
            .collect();
        let total: u64 = findings.iter().map(|f| f.events).sum::<u64>() + self.model.pruned().1;
        for f in &mut findings {
            f.share = if total > 0 {
                f.events as f64 / total as f64
            } else {
                0.0
            };
        }
        findings.sort_by(|a, b| {
            b.rate_per_s
                .total_cmp(&a.rate_per_s)
                .then(b.events.cmp(&a.events))
                .then(a.line_addr.cmp(&b.line_addr))
        });
        let backend = self.backend();
        let mut notes = self.notes(backend, &findings, &estimates);
        let survey = self.survey_summary();
        if let Some(s) = &survey {
            notes.push(survey_note(s));
        }
        if self.look_windows > 0 {
            notes.push(format!(
                "looks: {} window(s) on {} contended line(s) watched words no timer sample \
                 showed there, alone or with one sampled word's stores, to name the accesses \
                 too rare for samples; a look's hits count no events and rate nothing",
                self.look_windows,
                self.look_lines.len()
            ));
        }
        if let Some((windows, armed_ns, traps, lines)) = self.estimator.code_summary() {
            notes.push(format!(
                "code windows: {} instruction(s) that contend on lines too briefly hot for a \
                 data window were watched at every execution in {} window(s), {:.1} ms armed, \
                 {} traps, on {} line(s); a line's rate from them is its transfers over the \
                 time its instructions were watched, and accesses by other instructions are \
                 not seen (lower bounds)",
                self.code_watched.len(),
                windows,
                armed_ns as f64 * 1e-6,
                traps,
                lines
            ));
        }
        if let Some(n) = armed_cost_note(&self.armed_cost.summary()) {
            notes.push(n);
        }
        let concurrency = self.concurrency.summary();
        if let Some(c) = concurrency.as_ref().filter(|c| c.low()) {
            notes.push(format!(
                "concurrency: {}; the report may show less contention than there is (a rerun \
                 on a less busy machine may show more)",
                c.describe()
            ));
        }
        Analysis {
            backend,
            duration_s: duration,
            samples: self.stats.samples,
            lost: self.stats.lost,
            throttles: self.stats.throttles,
            filtered: self.filter.dropped(),
            line_size: self.model.line_size(),
            modules: self.modules(),
            notes,
            survey,
            concurrency,
            findings,
        }
    }

    /// What survey windows covered, and which of their lines turned out contended.
    fn survey_summary(&self) -> Option<SurveySummary> {
        if self.surveyed.is_empty() {
            return None;
        }
        let mut s = SurveySummary::default();
        for (&line, &(bytes, windows)) in &self.surveyed {
            s.lines += 1;
            s.bytes += u64::from(bytes.count_ones());
            s.windows += windows;
            match self.location(line) {
                Location::Module { .. } => s.global_lines += 1,
                Location::Heap => s.heap_lines += 1,
                _ => {}
            }
            if self.model.is_contended(line) {
                s.found.push(line);
            }
        }
        s.found.sort_unstable();
        Some(s)
    }

    /// The main process's program globals at run-time addresses, sorted.
    fn program_globals(&self) -> Vec<(u64, u64)> {
        let mut globals: Vec<(u64, u64)> = self
            .globals
            .iter()
            .filter(|(k, _)| Some(k.0) == self.main_pid)
            .flat_map(|(_, (bias, objs))| objs.iter().map(|&(v, n)| (v.wrapping_add(*bias), n)))
            .collect();
        globals.sort_unstable();
        globals
    }

    /// Words the sampled code of the main process updates atomically at fixed addresses
    /// ([`PcCache::atomic_globals`]) that lie in a module's data (not its code, the heap or a
    /// stack), in the order found.
    fn atomic_globals(&self) -> Vec<(u64, u64)> {
        let Some(space) = self.main_pid.and_then(|p| self.spaces.get(p)) else {
            return Vec::new();
        };
        self.pcs
            .atomic_globals()
            .iter()
            .filter(|&&(a, _)| {
                space
                    .find(a)
                    .is_some_and(|m| !m.exec && matches!(m.owner, maps::Owner::Module(_)))
            })
            .map(|&(a, n)| (a, u64::from(n)))
            .collect()
    }

    /// Heap blocks the program's globals point to, read from the live target through `mem`
    /// ([`crate::model::survey::pointed_blocks`]).
    pub fn pointed_heap_blocks(&self, mem: &mut dyn Memory) -> Vec<(u64, u64)> {
        let Some(space) = self.main_pid.and_then(|p| self.spaces.get(p)) else {
            return Vec::new();
        };
        crate::model::survey::pointed_blocks(&self.program_globals(), mem, |a| {
            space.classify(a) == Class::Heap
        })
    }

    /// Survey turns worth taking now, highest priority first ([`crate::model::survey::plan`]): lines
    /// samples touched without showing contention, the program's writable globals, the words
    /// code near the samples updates atomically ([`PcCache::atomic_globals`]), and the heap
    /// blocks `pointed` to by the globals. Lines the survey found contended stay in it (their
    /// store-only windows keep the estimate honest when read+write windows drown in loads).
    pub fn survey_plan(&self, pointed: &[(u64, u64)]) -> Vec<SurveyTarget> {
        let mut plan = crate::model::survey::plan(
            &self.hot,
            &self.program_globals(),
            &self.atomic_globals(),
            pointed,
            self.model.line_size(),
            // A line samples showed contended is the candidates' to watch, once they do: one
            // never watched yet keeps its survey turns, or a candidate ranked behind busier
            // lines is watched by neither (Phoenix kmeans: the line of `modified`, contended
            // by its samples, behind four heap lines for the whole run).
            |l| {
                self.model.is_contended(l)
                    && !self.surveyed.contains_key(&l)
                    && self.estimator.was_watched(l)
            },
        );
        // A forked copy's lines are not addresses to watch (see `candidates`).
        plan.retain(|t| split_copy(t.watch.line_addr).0 == 0);
        plan
    }

    fn modules(&self) -> Vec<ModuleInfo> {
        let mut out: Vec<ModuleInfo> = Vec::new();
        let mut spaces: Vec<(u32, &AddressSpace)> = self.spaces.iter().collect();
        spaces.sort_unstable_by_key(|&(p, _)| (Some(p) != self.main_pid, p));
        for (_, space) in spaces {
            for m in &space.modules {
                if !out.iter().any(|o| o.path == m.path) {
                    out.push(ModuleInfo {
                        path: m.path.clone(),
                        bias: m.bias,
                        build_id: m.build_id.clone(),
                    });
                }
            }
        }
        out
    }

    fn notes(
        &self,
        backend: BackendKind,
        findings: &[LineFinding],
        estimates: &[LineEstimate],
    ) -> Vec<String> {
        let mut notes = Vec::new();
        let rated = findings
            .iter()
            .filter(|f| {
                estimates
                    .iter()
                    .any(|e| e.line_addr == f.line_addr && e.informative())
            })
            .count();
        let one_thread = findings
            .iter()
            .filter(|f| {
                estimates
                    .iter()
                    .any(|e| e.line_addr == f.line_addr && !e.informative())
            })
            .count();
        if backend == BackendKind::Soft && rated < findings.len() {
            notes.push(format!(
                "soft backend: {} line(s) counted from timer-sampled accesses; each counted \
                 event is a real line transfer but most transfers fall between samples, so \
                 their events and rates are lower bounds (sampled events), not totals",
                findings.len() - rated
            ));
        }
        if one_thread > 0 {
            notes.push(format!(
                "{one_thread} watched line(s) showed one thread per watch window (each thread's \
                 burst of accesses used up a window's trap budget before another thread came \
                 by): their windows cannot count transfers, so they keep the sampled count, a \
                 lower bound"
            ));
        }
        if rated > 0 {
            let informative = || estimates.iter().filter(|e| e.informative());
            let armed: f64 = informative().map(|e| e.armed_s).sum();
            let transfers: u64 = informative().map(|e| e.transfers).sum();
            let err = if transfers > 0 {
                100.0 / (transfers as f64).sqrt()
            } else {
                100.0
            };
            notes.push(format!(
                "{rated} line(s) rated from watchpoint windows: exact access history of the \
                 watched words over {:.1} ms armed, {transfers} transfers, ±{err:.0}% \
                 statistical, {:.1} µs per watchpoint hit taken out of the armed time; bytes \
                 not watched are not counted",
                armed * 1e3,
                self.estimator.trap_cost_ns() as f64 / 1e3
            ));
            let stand_in: f64 = informative().map(|e| e.stand_in_s).sum();
            if stand_in > 0.0 {
                let n = informative().filter(|e| e.stand_in_s > 0.0).count();
                notes.push(format!(
                    "{n} line(s) also rated over the {:.1} ms of cooldowns after their \
                     windows, at the rate each window measured (a window on a busy line ends \
                     at its trap cap and the next comes after the cooldown that pays for it: \
                     counting armed time alone would under-rate lines contended in phases)",
                    stand_in * 1e3
                ));
            }
            if estimates.iter().any(|e| e.inferred) {
                notes.push(
                    "watch windows not recorded: armed time inferred from first to last hit \
                     per line (rates are upper estimates)"
                        .to_string(),
                );
            }
            if estimates.iter().any(|e| e.clamped) {
                let n = estimates.iter().filter(|e| e.clamped).count();
                notes.push(format!(
                    "{n} watched line(s) trapped on most accesses (trap time over half the armed \
                     time): their rates are not corrected for the slowdown, so they are lower \
                     bounds"
                ));
            }
        }
        let (pl, pe) = self.model.pruned();
        if pl > 0 {
            notes.push(format!(
                "{pl} weakly contended line(s) with {pe} events in all were dropped to bound \
                 memory; shares count them"
            ));
        }
        if self.model.evictions() > 0 {
            notes.push(format!(
                "{} line(s) forgotten by the bounded line table (idle while {} others were \
                 touched); events they would have formed later are not counted",
                self.model.evictions(),
                self.config.max_lines
            ));
        }
        if self.stats.lost > 0 {
            notes.push(format!(
                "{} samples lost by the kernel (ring buffer full): counts are low",
                self.stats.lost
            ));
        }
        if self.stats.throttles > 0 {
            notes.push(format!(
                "sampling throttled {} time(s) by the kernel",
                self.stats.throttles
            ));
        }
        let f = &self.filter;
        notes.push(format!(
            "filter: {} accesses analysed; samples dropped: kernel {}, vdso {}, undecodable {}, \
             stack {}, thread-local {}, missing registers {}; {} at instructions without \
             memory operands; {} stack data accesses",
            f.accesses,
            f.kernel_pc,
            f.special_pc,
            f.undecodable,
            f.stack,
            f.thread_local,
            f.missing_regs,
            f.no_memory,
            f.stack_data
        ));
        if self.duration_s() <= 0.0 {
            notes.push("run duration unknown (one timestamp): rates are 0".to_string());
        }
        notes
    }

    /// The modules (paths) holding the instructions of the contended lines seen so far: the
    /// ones a report will symbolize, for [`crate::naming::prefetch`] to load ahead of it.
    pub fn contended_modules(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for line in self.model.contended() {
            for s in &line.sources {
                if let Location::Module { path, .. } = self.location(s.pc) {
                    if !out.contains(&path) {
                        out.push(path);
                    }
                }
            }
        }
        out
    }

    /// The top `max_lines` contended lines and, per line, up to 4 naturally aligned words
    /// different threads touched: where to arm watchpoints.
    ///
    /// Never a forked copy's private line: a watchpoint is on an address in every process,
    /// and a copy's key is no address.
    pub fn candidates(&self, max_lines: usize) -> Vec<WatchCandidate> {
        let original = |l: &&LineStat| split_copy(l.line_addr).0 == 0;
        crate::model::candidates::candidates(self.model.contended().filter(original), max_lines)
    }

    /// Read+write words around what the one thread seen on `line` stores there
    /// (`Estimator::edge_probe`): where a neighbour that only reads would be.
    pub fn edge_probe(&self, line: u64) -> Option<WatchCandidate> {
        if split_copy(line).0 != 0 {
            return None;
        }
        let words = self.estimator.edge_probe(line)?;
        Some(WatchCandidate {
            line_addr: line,
            words,
        })
    }

    /// Where the open code window last saw contention (`Estimator::code_front`): the line and
    /// the words a front window should watch, `None` while it has seen no transfer.
    pub fn code_front(&self) -> Option<WatchCandidate> {
        let (line_addr, words) = self.estimator.code_front()?;
        if split_copy(line_addr).0 != 0 {
            return None; // a forked copy's line: see `candidates`
        }
        Some(WatchCandidate {
            line_addr,
            words: words.into_iter().map(|w| (w, 8)).collect(),
        })
    }

    /// Instructions worth a code window ([`crate::model::estimate`], "Code windows"), most
    /// promising first: each contends on two or more lines that samples showed contended by
    /// two threads, or on one that data windows then found cooled (untouched, or each window
    /// filled by one thread: see the body), every one of them under `threshold` by what
    /// samples and data windows measured. That is the
    /// mark of contention that moves (`model::migratory`): a line hot for a few milliseconds
    /// has cooled before a data window can open on it, so its rate stays a sampled lower
    /// bound, while the instruction that moves along the lines is there all the time.
    /// Instructions that also contend on a line above the threshold are left to that line's
    /// data windows.
    pub fn code_candidates(&self, threshold: f64, max: usize) -> Vec<u64> {
        let duration = self.duration_s();
        if duration <= 0.0 {
            return Vec::new();
        }
        let estimates = self.estimator.estimates();
        let rate = |l: &LineStat| steering_rate(l, &estimates, duration);
        // Per instruction: contended lines under the threshold, events on them, whether it
        // stores, and whether it also contends on a line above the threshold.
        #[derive(Default)]
        struct Pc {
            lines: Vec<u64>,
            events: u64,
            stores: bool,
            hot: bool,
            cold: bool,
        }
        // A line samples showed contended that data windows then found cooled: the
        // contention was there and has moved on (or stopped), or comes and goes. Its signs:
        // - every window found it untouched;
        // - a long window found it untouched (`quiet_windows`): PARSEC streamcluster frees
        //   and allocates its `work_mem` again in every call, at one of a few addresses, and
        //   the line two threads' blocks share is contended only while the block is there;
        //   a 100 ms window there saw nothing, the instruction got no code window, and the
        //   run (1 in 6) reported no false sharing;
        // - two or more windows and each filled by one thread (one thread's burst spent the
        //   trap cap before the other came by, or the other's words there were not
        //   watched): the windows cannot count a transfer, the line's estimate stays
        //   uninformative however many it gets, and only the code shows where the pair
        //   meets (streamcluster again: three windows on the line of `work_mem` each saw
        //   one thread's stores). Only for an instruction samples showed two threads run
        //   there: a code window on one thread's own instruction traps that thread alone and
        //   cannot show a transfer either. idx4_rw_false's store and load are each one
        //   thread's; with its threads taking turns on one CPU for half the run, the store
        //   got code turns of ~250 ms each (four a run, ~80% of the trap budget) and the
        //   line's data windows, the only ones that can see the pair, one window a turn.
        // The line's (untouched, every window saw one thread).
        let cooled = |l: &LineStat| {
            estimates
                .iter()
                .find(|e| e.line_addr == l.line_addr && e.windows > 0)
                .map_or((false, false), |e| {
                    (
                        e.accesses == 0 || e.quiet_windows > 0,
                        e.windows >= 2 && !e.informative(),
                    )
                })
        };
        let mut per_pc: HashMap<u64, Pc> = HashMap::new();
        for l in self.model.contended().filter(|l| l.threads.len() >= 2) {
            let hot = rate(l) >= threshold;
            let (untouched, one_thread_windows) = cooled(l);
            for src in &l.sources {
                let e = per_pc.entry(src.pc).or_default();
                e.lines.push(l.line_addr);
                e.events += src.events;
                e.stores |= src.op.writes();
                e.hot |= hot;
                e.cold |= untouched || (one_thread_windows && src.threads.len() >= 2);
            }
        }
        // Code that contends on two lines, or on one that had cooled when it was watched.
        let mut pcs: Vec<(u64, Pc)> = per_pc
            .into_iter()
            .filter(|(_, p)| (p.lines.len() >= 2 || p.cold) && !p.hot)
            .collect();
        // Stores first (a line two threads store to is what moves), then most lines.
        pcs.sort_by(|a, b| {
            (b.1.stores, b.1.lines.len(), b.1.events, a.0).cmp(&(
                a.1.stores,
                a.1.lines.len(),
                a.1.events,
                b.0,
            ))
        });
        // One instruction per loop: every watched instruction traps at each execution, and
        // the loads beside a store on the same lines would only triple the traps that fill
        // the window's budget before the loop has gone round once. Instructions whose lines
        // are mostly another chosen one's are the same loop.
        let mut chosen: Vec<(u64, Vec<u64>)> = Vec::new();
        for (pc, mut p) in pcs {
            p.lines.sort_unstable();
            let same_loop = chosen.iter().any(|(_, lines)| {
                let common = p.lines.iter().filter(|l| lines.binary_search(l).is_ok());
                2 * common.count() >= p.lines.len().min(lines.len())
            });
            if !same_loop {
                chosen.push((pc, p.lines));
            }
            if chosen.len() == max {
                break;
            }
        }
        // A load whose samples showed the contention stands for the loop's store to the same
        // address, when there is one: a front window follows lines two threads store to,
        // which a window on the load never sees (see `decode::store_pair`).
        let mut out: Vec<u64> = Vec::with_capacity(chosen.len());
        for (pc, _) in chosen {
            let pc = store_after_load(&self.code, pc).unwrap_or(pc);
            if !out.contains(&pc) {
                out.push(pc);
            }
        }
        out
    }

    /// Store instructions that samples showed two threads making into neighbouring memory
    /// ([`crate::model::neighbours`]): where their parts meet a line may be shared that no
    /// sample showed contended. Each is worth a few looks, a code window each
    /// ([`NEIGHBOUR_CODE_WINDOWS`]): one that finds the parts meeting on a line makes that
    /// line contended, and its instruction one of [`Detector::code_candidates`]; one that
    /// does not has found parts that keep to their own lines (per-thread counters a few
    /// hundred bytes apart). Instructions that contend on a line above `threshold` are left
    /// to that line's data windows; at most `max`, lowest address first.
    pub fn neighbour_candidates(&self, threshold: f64, max: usize) -> Vec<u64> {
        let near = self.neighbours.near(|pc| store_after_load(&self.code, pc));
        if near.is_empty() {
            return near; // the common case: no estimates to compute
        }
        let duration = self.duration_s().max(1e-9);
        let estimates = self.estimator.estimates();
        // The instructions of lines above the threshold, rated once for all of `near`.
        let hot: HashSet<u64> = self
            .model
            .contended()
            .filter(|l| steering_rate(l, &estimates, duration) >= threshold)
            .flat_map(|l| l.sources.iter().map(|s| s.pc))
            .collect();
        near.into_iter()
            .filter(|pc| {
                self.estimator.code_windows_on(*pc) < NEIGHBOUR_CODE_WINDOWS && !hot.contains(pc)
            })
            .take(max)
            .collect()
    }
}
