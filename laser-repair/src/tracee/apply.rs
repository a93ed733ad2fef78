//! `apply`: put a repair into a running process in one hold.
//!
//! ```text
//!  seize all ─▶ mmap cache near code ─▶ plan builds bytes for that address ─▶ write record+code
//!     ─▶ decide thread moves (refuse before touching code) ─▶ patch (verify old bytes each)
//!     ─▶ move threads ─▶ commit + detach
//! ```
//!
//! Any error on the way unwinds through the transaction log: patched bytes restored, cache
//! unmapped, registers restored, every thread detached with its foreign signals handed back.

use std::ops::Range;
use std::time::Duration;

use super::error::{Result, TraceeError};
use super::patch::{self, CacheAddrs, CacheSizes, Move, PatchSet};
use super::record::{RecordState, RepairRecord};
use super::threads::{HoldPhases, LockStats};
use super::txn::Txn;

/// Where a repair comes from: the `plan` half, or a test.
///
/// The plan's code depends on where the cache lands (rel32 jumps back into the original code),
/// so the bytes are asked for only after the cache is mapped, while the target is held.
pub trait RepairSource {
    /// The code the cache must be within rel32 reach of (the function being repaired).
    fn code_span(&self) -> Range<u64>;
    /// Space to reserve before the bytes are known.
    fn sizes(&self) -> CacheSizes;
    /// Every address resolved for this cache placement.
    fn materialize(&self, cache: &CacheAddrs) -> std::result::Result<PatchSet, String>;
}

/// A [`RepairSource`] from a span, sizes and a closure.
pub struct FnSource<F> {
    pub span: Range<u64>,
    pub sizes: CacheSizes,
    pub build: F,
}

impl<F> RepairSource for FnSource<F>
where
    F: Fn(&CacheAddrs) -> std::result::Result<PatchSet, String>,
{
    fn code_span(&self) -> Range<u64> {
        self.span.clone()
    }
    fn sizes(&self) -> CacheSizes {
        self.sizes
    }
    fn materialize(&self, cache: &CacheAddrs) -> std::result::Result<PatchSet, String> {
        (self.build)(cache)
    }
}

/// Steps after which a test can make `apply` or `undo` fail on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailPoint {
    AfterSeize,
    AfterAlloc,
    AfterCodeWrite,
    AfterFirstPatch,
    AfterPatches,
    AfterMoves,
    /// In undo: after the first patch was restored.
    UndoAfterFirstRestore,
}

/// Knobs of `apply`/`undo`.
#[derive(Debug, Clone, Default)]
pub struct ApplyOptions {
    /// Run injected syscalls in this thread if it is usable (tests use the thread blocked in
    /// `read` to exercise syscall restarts).
    pub syscall_thread: Option<i32>,
    /// Test hook: fail right after this step (then everything must be undone).
    #[doc(hidden)]
    pub fail_at: Option<FailPoint>,
    /// Refuse ([`TraceeError::ThreadInRetiredCache`], retry shortly) while a thread runs in
    /// a retired cache of an earlier repair of the same bytes. An undo moves a thread with a
    /// buffered log to a flush stub ending in a jump back to the original instruction; if
    /// the same bytes are patched again before it gets there (an undo followed at once by a
    /// new apply, as the trial does), it jumps into the middle of the new entry jmp. Off by
    /// default: a thread can also stay in a retired cache for good (a loop with no safe
    /// point), and then the apply would never go through.
    pub wait_for_retired: bool,
}

pub(crate) fn hook(opts: &ApplyOptions, at: FailPoint) -> Result<()> {
    if opts.fail_at == Some(at) {
        Err(TraceeError::Injected(at))
    } else {
        Ok(())
    }
}

/// How long the target was held, and what the hold did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PauseStats {
    /// First thread interrupted → last thread detached, summed over holds (undo may retry).
    pub paused: Duration,
    /// Longest single hold.
    pub longest: Duration,
    pub holds: usize,
    pub threads: usize,
    pub signals_passed: usize,
    pub clone_events: usize,
    /// Where the time went, summed over holds.
    pub phases: HoldPhases,
    /// The longest single hold's wait for every thread to stop.
    pub longest_seize: Duration,
}

impl PauseStats {
    pub(crate) fn add(&mut self, s: &LockStats) {
        self.paused += s.paused;
        self.longest = self.longest.max(s.paused);
        self.holds += 1;
        self.threads = self.threads.max(s.threads);
        self.signals_passed += s.signals_passed;
        self.clone_events += s.clone_events;
        self.phases.add(&s.phases);
        self.longest_seize = self.longest_seize.max(s.phases.seize);
    }

    /// Adds another repair's or undo's holds to these.
    pub fn merge(&mut self, o: &PauseStats) {
        self.paused += o.paused;
        self.longest = self.longest.max(o.longest);
        self.holds += o.holds;
        self.threads = self.threads.max(o.threads);
        self.signals_passed += o.signals_passed;
        self.clone_events += o.clone_events;
        self.phases.add(&o.phases);
        self.longest_seize = self.longest_seize.max(o.longest_seize);
    }

    /// `seize 0.41, syscalls 0.90, writes 0.12, detach 0.30 ms` (summed over holds).
    pub fn phases_line(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let p = &self.phases;
        format!(
            "seize {:.2}, syscalls {:.2}, writes {:.2}, detach {:.2} ms",
            ms(p.seize),
            ms(p.syscalls),
            ms(p.writes),
            ms(p.detach)
        )
    }
}

/// A repair in force.
#[derive(Debug, Clone)]
pub struct AppliedRepair {
    pub pid: i32,
    pub cache: CacheAddrs,
    /// What is stored in the target for undo.
    pub record: RepairRecord,
    pub moved: Vec<Move>,
    pub pause: PauseStats,
}

impl AppliedRepair {
    /// Undoes this repair (same as `laser repair -p PID --undo` for this one cache).
    pub fn undo(&self, opts: &super::undo::UndoOptions) -> Result<super::undo::UndoReport> {
        super::undo::undo_one(self.pid, self.cache.map_base, opts)
    }
}

/// Puts the repair from `src` into process `pid`.
pub fn apply(pid: i32, src: &dyn RepairSource, opts: &ApplyOptions) -> Result<AppliedRepair> {
    let span = src.code_span();
    let sizes = src.sizes();
    if span.start >= span.end {
        return Err(TraceeError::InvalidPatchSet(format!(
            "empty code span {:#x}..{:#x}",
            span.start, span.end
        )));
    }
    // Caches of earlier repairs that undo retired (a thread was still inside, e.g. moved to
    // a flush stub that ends in a jump back to original code) and that patched bytes this
    // repair patches again: a thread still there would jump into the middle of the new entry
    // jmp. Read before the hold; checked against thread positions inside it.
    let retired: Vec<RepairRecord> = if !opts.wait_for_retired {
        Vec::new()
    } else {
        super::undo::find_repairs(pid)?
    }
    .into_iter()
    .filter(|r| {
        r.state == RecordState::Retired
            && r.patches
                .iter()
                .any(|p| p.range().start < span.end && span.start < p.range().end)
    })
    .collect();
    let mut txn = Txn::begin(pid, opts.syscall_thread)?;
    hook(opts, FailPoint::AfterSeize)?;

    let cache = txn.map_cache(&span, &sizes)?;
    hook(opts, FailPoint::AfterAlloc)?;

    let set = src
        .materialize(&cache)
        .map_err(|reason| TraceeError::Build {
            code_base: cache.code_base,
            reason,
        })?;
    patch::validate(&set, &cache)?;
    let record = RepairRecord {
        state: RecordState::Active,
        seq: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
        map_base: cache.map_base,
        map_len: cache.map_len,
        code_base: cache.code_base,
        code_len: set.code.len() as u64,
        data_base: cache.data_base,
        data_len: cache.data_len as u64,
        patches: set.patches.clone(),
        pc_map: set.pc_map.clone(),
    };
    let bytes = record.encode();
    if bytes.len() > cache.record_cap {
        return Err(TraceeError::RecordTooLarge {
            need: bytes.len(),
            cap: cache.record_cap,
        });
    }
    txn.fill(cache.map_base, &bytes)?;
    txn.fill(cache.code_base, &set.code)?;
    if !set.data.is_empty() {
        txn.fill(cache.data_base, &set.data)?;
    }
    hook(opts, FailPoint::AfterCodeWrite)?;

    // Decide every move before the first byte of code changes: a refusal leaves no trace.
    let positions = txn.positions()?;
    for t in &positions {
        if let Some(r) = retired
            .iter()
            .find(|r| (r.map_base..r.map_base + r.map_len).contains(&t.rip))
        {
            return Err(TraceeError::ThreadInRetiredCache {
                tid: t.tid,
                rip: t.rip,
                map_base: r.map_base,
            });
        }
    }
    let moves = patch::plan_moves(&positions, &set.patches, &set.pc_map)?;
    for (i, p) in set.patches.iter().enumerate() {
        txn.patch(p.addr, &p.old_bytes, &p.new_bytes)?;
        if i == 0 {
            hook(opts, FailPoint::AfterFirstPatch)?;
        }
    }
    hook(opts, FailPoint::AfterPatches)?;
    for m in &moves {
        txn.move_thread(m.tid, m.to)?;
    }
    hook(opts, FailPoint::AfterMoves)?;

    let stats = txn.commit();
    let mut pause = PauseStats::default();
    pause.add(&stats);
    Ok(AppliedRepair {
        pid,
        cache,
        record,
        moved: moves,
        pause,
    })
}
