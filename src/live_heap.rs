//! Naming contended heap lines by their malloc blocks while the target is still alive (see
//! `laser_detect::naming::heap_blocks`): the live half, reading `/proc/PID/maps` and `/proc/PID/mem`.

use std::time::{Duration, Instant};

use std::collections::{BTreeMap, BTreeSet};

use laser_detect::decode::maps::Region;
use laser_detect::naming::alloc_record::{Table, ARMED_N_OFFSET, MAX_ARMED};
use laser_detect::naming::alloc_site::{AllocSite, ModuleSet};
use laser_detect::naming::heap_blocks::{BlockState, Memory};

use crate::alloc_shim::AllocShim;
use laser_detect::naming::heap_names::{HeapBlocks, HeapNamer};
use laser_detect::Detector;

/// How often `laser run` looks at the top contended lines for heap blocks to name.
const HEAP_TICK: Duration = Duration::from_millis(250);
/// Top contended lines looked at per tick.
const HEAP_LINES_PER_TICK: usize = 8;
/// Target memory read per tick at most: walking a big heap takes several ticks.
const HEAP_TICK_BUDGET: u64 = 4 << 20;

/// The target's memory through `/proc/PID/mem` (needs the same ptrace access perf needs).
pub struct ProcMem(std::fs::File);

impl ProcMem {
    pub fn open(pid: i32) -> std::io::Result<ProcMem> {
        std::fs::File::open(format!("/proc/{pid}/mem")).map(ProcMem)
    }

    /// Opened for writing too: only to arm lines in laser's own recorder in the target.
    pub fn open_rw(pid: i32) -> std::io::Result<ProcMem> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .map(ProcMem)
    }

    pub fn write(&self, addr: u64, bytes: &[u8]) -> bool {
        std::os::unix::fs::FileExt::write_at(&self.0, bytes, addr).is_ok_and(|n| n == bytes.len())
    }
}

impl Memory for ProcMem {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> usize {
        std::os::unix::fs::FileExt::read_at(&self.0, buf, addr).unwrap_or(0)
    }
}

/// Names the malloc blocks of contended heap lines while the target is alive: `laser run`'s
/// target has exited when the report is built, so the top lines are read as the run goes
/// (every [`HEAP_TICK`], at most [`HEAP_TICK_BUDGET`] bytes per tick); `attach` also reads
/// the report's heap lines at the end ([`LiveHeap::name`]).
pub struct LiveHeap {
    pid: i32,
    namer: HeapNamer,
    mem: Option<ProcMem>,
    error: Option<String>,
    last: Option<Instant>,
    /// Time spent choosing lines and reading maps and memory, for the cost note.
    spent: Duration,
    /// The allocation recorder preloaded into the program (`laser run`), if any.
    shim: Option<AllocShim>,
    sites: BTreeMap<u64, AllocSite>,
    /// Lines armed in the recorder (blocks allocated there later are recorded).
    armed: BTreeSet<u64>,
    /// The recorder started, then the process exec'd a program without it.
    recorder_lost: bool,
}

impl LiveHeap {
    pub fn new(pid: i32, line_size: u32) -> LiveHeap {
        LiveHeap {
            pid,
            namer: HeapNamer::new(line_size),
            mem: None,
            error: None,
            last: None,
            spent: Duration::ZERO,
            shim: None,
            sites: BTreeMap::new(),
            armed: BTreeSet::new(),
            recorder_lost: false,
        }
    }

    /// Looks up allocation sites in `shim`'s table for the blocks named.
    pub fn with_shim(mut self, shim: Option<AllocShim>) -> LiveHeap {
        self.shim = shim;
        self
    }

    pub fn shim_mut(&mut self) -> Option<&mut AllocShim> {
        self.shim.as_mut()
    }

    pub fn tick(&mut self, detector: &Detector<crate::analyze::Code>) {
        if self.last.is_some_and(|t| t.elapsed() < HEAP_TICK) {
            return;
        }
        let t0 = Instant::now();
        self.last = Some(t0);
        let lines: Vec<u64> = detector
            .candidates(HEAP_LINES_PER_TICK)
            .into_iter()
            .map(|c| c.line_addr)
            .collect();
        self.spent += t0.elapsed();
        self.name(&lines, HEAP_TICK_BUDGET);
    }

    /// Reads the blocks of those `lines` not named yet, at most `budget` bytes.
    /// Also looks up, on each call, the sites of named blocks on armed lines, whether or not
    /// a line is left to name: a block allocated again after its line was armed is in the
    /// recorder's table only from then on, which may be long after its line was named.
    pub fn name(&mut self, lines: &[u64], budget: u64) {
        let naming = lines.iter().any(|&l| self.namer.wants(l));
        if self.error.is_some() || !(naming || self.sites_pending()) {
            return;
        }
        let t0 = Instant::now();
        // Maps change (brk grows, arenas appear): read them for each batch, only when needed.
        let maps = match std::fs::read_to_string(format!("/proc/{}/maps", self.pid)) {
            Ok(m) => m,
            Err(_) => return, // exited: nothing more to learn
        };
        if self.mem.is_none() {
            let open = if self.shim.is_some() {
                ProcMem::open_rw(self.pid)
            } else {
                ProcMem::open(self.pid)
            };
            match open {
                Ok(m) => self.mem = Some(m),
                Err(e) => {
                    self.error = Some(format!("cannot open /proc/{}/mem: {e}", self.pid));
                    return;
                }
            }
        }
        let regions = laser_detect::decode::maps::parse(&maps);
        if let (true, Some(mem)) = (naming, self.mem.as_mut()) {
            self.namer.update(lines, &regions, mem, budget);
        }
        self.find_sites(&regions);
        self.spent += t0.elapsed();
    }

    /// Whether a named live block on an armed line has no site yet: blocks allocated there
    /// since the arming are in the recorder's table.
    fn sites_pending(&self) -> bool {
        self.shim.is_some()
            && !self.armed.is_empty()
            && self.namer.named().any(|(l, b)| {
                matches!(b.state, BlockState::InUse | BlockState::Mmapped)
                    && self.armed.contains(&l)
                    && !self.sites.contains_key(&b.user)
            })
    }

    /// Finds the allocation sites of named blocks in the recorder's table; arms the lines of
    /// blocks it does not hold, so the blocks allocated there from now on are recorded.
    fn find_sites(&mut self, regions: &[Region]) {
        let (Some(shim), Some(mem)) = (self.shim.as_mut(), self.mem.as_mut()) else {
            return;
        };
        shim.drain();
        if shim.table.is_some() && !shim.mapped_in(regions) {
            // The process exec'd something the recorder is not preloaded into: never read,
            // let alone write, at the old table's address.
            shim.table = None;
            self.recorder_lost = true;
        }
        let Some(table) = shim.table.and_then(|a| Table::read(mem, a)) else {
            return;
        };
        let mut modules: Option<ModuleSet> = None;
        let mut unknown_lines = BTreeSet::new();
        let blocks: Vec<(u64, u64)> = self
            .namer
            .named()
            .filter(|(_, b)| matches!(b.state, BlockState::InUse | BlockState::Mmapped))
            .map(|(l, b)| (l, b.user))
            .filter(|(_, u)| !self.sites.contains_key(u))
            .collect();
        for (line, user) in blocks {
            match table.lookup(mem, user) {
                Some(rec) => {
                    let m = modules.get_or_insert_with(|| ModuleSet::new(regions));
                    self.sites.insert(user, m.site(&rec));
                }
                None => {
                    unknown_lines.insert(line);
                }
            }
        }
        let before = self.armed.len();
        for l in unknown_lines {
            if self.armed.len() < MAX_ARMED {
                self.armed.insert(l);
            }
        }
        if self.armed.len() != before {
            let line = self.namer.line_size();
            let ranges: Vec<(u64, u64)> = self.armed.iter().map(|&l| (l, l + line)).collect();
            mem.write(table.addr + ARMED_N_OFFSET, &Table::armed_bytes(&ranges));
        }
    }

    /// The blocks found, or why none could be read (for a report note).
    pub fn finish(&mut self) -> Result<HeapBlocks, String> {
        if let Some(s) = self.shim.as_mut() {
            s.drain();
        }
        match &self.error {
            Some(e) => Err(format!("heap blocks not named: {e}")),
            None => {
                let mut h = self.namer.finish();
                h.sites = self.sites.clone();
                h.sites_note = self.sites_note(&h);
                Ok(h)
            }
        }
    }

    /// Why heap blocks of the report have no allocation site, if some have none.
    fn sites_note(&self, h: &HeapBlocks) -> Option<String> {
        let shim = self.shim.as_ref()?;
        let live: Vec<u64> = h
            .lines
            .values()
            .filter_map(|r| r.as_ref().ok())
            .flatten()
            .filter(|b| matches!(b.state, BlockState::InUse | BlockState::Mmapped))
            .map(|b| b.user)
            .collect();
        if live.is_empty() {
            return None;
        }
        if shim.table.is_none() || self.recorder_lost {
            return Some(
                "allocation sites: laser's recorder was not in the program (its LD_PRELOAD \
                 was replaced, e.g. by `env LD_PRELOAD=…`, or the program is static or has \
                 its own malloc)"
                    .into(),
            );
        }
        let missing = live.iter().filter(|u| !h.sites.contains_key(u)).count();
        (missing > 0).then(|| {
            format!(
                "allocation sites: {missing} heap block(s) have none: allocated before laser \
                 armed their line (the recorder keeps each thread's first 16384 allocations, \
                 then only blocks allocated on a line laser found contended)"
            )
        })
    }

    /// What naming cost: bytes of target memory read and time spent.
    pub fn cost(&self) -> (u64, Duration) {
        (self.namer.bytes_read, self.spent)
    }
}
