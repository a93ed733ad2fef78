//! Naming contended heap lines by their malloc blocks while the target is still alive (see
//! `laser_detect::naming::heap_blocks`): the live half, reading `/proc/PID/maps` and `/proc/PID/mem`.

use std::time::{Duration, Instant};

use laser_detect::naming::heap_blocks::Memory;
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
        }
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
    pub fn name(&mut self, lines: &[u64], budget: u64) {
        if self.error.is_some() || !lines.iter().any(|&l| self.namer.wants(l)) {
            return;
        }
        let t0 = Instant::now();
        // Maps change (brk grows, arenas appear): read them for each batch, only when needed.
        let maps = match std::fs::read_to_string(format!("/proc/{}/maps", self.pid)) {
            Ok(m) => m,
            Err(_) => return, // exited: nothing more to learn
        };
        if self.mem.is_none() {
            match ProcMem::open(self.pid) {
                Ok(m) => self.mem = Some(m),
                Err(e) => {
                    self.error = Some(format!("cannot open /proc/{}/mem: {e}", self.pid));
                    return;
                }
            }
        }
        let regions = laser_detect::decode::maps::parse(&maps);
        if let Some(mem) = self.mem.as_mut() {
            self.namer.update(lines, &regions, mem, budget);
        }
        self.spent += t0.elapsed();
    }

    /// The blocks found, or why none could be read (for a report note).
    pub fn finish(&self) -> Result<HeapBlocks, String> {
        match &self.error {
            Some(e) => Err(format!("heap blocks not named: {e}")),
            None => Ok(self.namer.finish()),
        }
    }

    /// What naming cost: bytes of target memory read and time spent.
    pub fn cost(&self) -> (u64, Duration) {
        (self.namer.bytes_read, self.spent)
    }
}
