//! Undo: restore the original bytes and bring threads back out of the code cache, from the same
//! laser process or from a later `laser repair -p PID --undo` (everything needed is in the record
//! at the start of each cache mapping, see `record`).
//!
//! A *safe point* is a hold in which no thread is strictly inside patched bytes (it would resume
//! in the middle of an original instruction) and every thread in the cache code sits at a pc of
//! the map (it moves back to the matching original pc). Undo retries holds a few milliseconds
//! apart until it gets one. If threads stay inside the cache between mapped pcs (a long loop
//! with a sparse map), the last attempt restores the bytes anyway and leaves those threads
//! running the cache copy, which leaves through its exits into the restored code.
//!
//! The cache is unmapped only when no thread refers to it any more: not by RIP, not by any
//! general register, not by any word of its stack from the red zone up (return addresses of
//! calls made from the cache, signal frames). Otherwise its record is marked `Retired` and a
//! later undo unmaps it once it is free.

use std::time::Duration;

use super::apply::{hook, ApplyOptions, FailPoint, PauseStats};
use super::error::{Result, TraceeError};
use super::maps::MapRegion;
use super::mem::ProcMem;
use super::patch::{Move, ThreadPos};
use super::record::{self, RecordState, RepairRecord};
use super::txn::Txn;

/// Knobs of `undo`.
#[derive(Debug, Clone)]
pub struct UndoOptions {
    /// Holds to try for a safe point.
    pub max_attempts: usize,
    /// Time the target runs between two attempts.
    pub retry_delay: Duration,
    pub apply: ApplyOptions,
}

impl Default for UndoOptions {
    fn default() -> Self {
        UndoOptions {
            max_attempts: 50,
            retry_delay: Duration::from_millis(2),
            apply: ApplyOptions::default(),
        }
    }
}

/// What undo did to one cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UndoReport {
    pub map_base: u64,
    /// Patches whose original bytes were put back (0 for an already retired cache).
    pub restored_patches: usize,
    pub moved: Vec<Move>,
    /// The mapping is gone; otherwise it was kept as `Retired`.
    pub unmapped: bool,
    /// Threads still referring to the cache (RIP inside it with no safe point found, a register,
    /// or a word on the stack): the mapping was kept as `Retired` for a later undo to collect.
    pub threads_left_in_cache: usize,
    pub pause: PauseStats,
}

/// Every laser repair record in `pid` (newest first), read without stopping it.
pub fn find_repairs(pid: i32) -> Result<Vec<RepairRecord>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            TraceeError::NoSuchProcess { pid }
        } else {
            TraceeError::io(pid, "reading /proc/PID/maps", e)
        }
    })?;
    let regions = super::maps::parse_maps(&text)?;
    read_records(&ProcMem::open(pid)?, &regions)
}

/// Records at the start of anonymous executable mappings. A mapping that starts with the magic
/// but does not decode (someone else's bytes, or damage) is skipped with a warning rather than
/// blocking the undo of every other repair.
fn read_records(mem: &ProcMem, regions: &[MapRegion]) -> Result<Vec<RepairRecord>> {
    let mut out = Vec::new();
    for r in regions.iter().filter(|r| r.exec && r.path.is_empty()) {
        match read_record(mem, r) {
            Ok(Some(rec)) => out.push(rec),
            Ok(None) => {}
            Err(e) => log::warn!("laser: skipping mapping {:#x}: {e}", r.start),
        }
    }
    out.sort_by_key(|r| std::cmp::Reverse(r.seq));
    Ok(out)
}

fn read_record(mem: &ProcMem, r: &MapRegion) -> Result<Option<RepairRecord>> {
    let head = mem.read_partial(r.start, record::FIXED_LEN);
    let Ok(len) = RepairRecord::peek_len(&head) else {
        return Ok(None);
    };
    let bad = |reason: String| TraceeError::BadRecord {
        addr: r.start,
        reason,
    };
    if len > record::MAX_LEN || len as u64 > r.end - r.start {
        return Err(bad(format!("announced length {len} exceeds the mapping")));
    }
    let rec = RepairRecord::decode(&mem.read(r.start, len)?).map_err(|e| bad(e.to_string()))?;
    if rec.map_base != r.start {
        return Err(bad(format!("record says it lives at {:#x}", rec.map_base)));
    }
    Ok(Some(rec))
}

/// Undoes every repair in `pid`, newest first, and unmaps retired caches that are free now.
pub fn undo(pid: i32, opts: &UndoOptions) -> Result<Vec<UndoReport>> {
    undo_where(pid, None, opts)
}

/// Undoes the repair whose cache mapping starts at `map_base`.
pub fn undo_one(pid: i32, map_base: u64, opts: &UndoOptions) -> Result<UndoReport> {
    undo_where(pid, Some(map_base), opts)?
        .pop()
        .ok_or(TraceeError::NoSuchRepair {
            pid,
            addr: map_base,
        })
}

/// Where threads stand relative to the repairs.
struct Plan {
    moves: Vec<Move>,
    /// Threads strictly inside patched bytes: restoring now would cut an instruction.
    in_patch: Option<(i32, u64)>,
    /// Threads inside cache code at an unmapped pc.
    in_cache: usize,
}

fn plan_back(pos: &[ThreadPos], recs: &[RepairRecord]) -> Plan {
    let mut plan = Plan {
        moves: Vec::new(),
        in_patch: None,
        in_cache: 0,
    };
    for t in pos {
        for r in recs {
            if r.state == RecordState::Active
                && r.patches
                    .iter()
                    .any(|p| p.addr < t.rip && t.rip < p.range().end)
            {
                plan.in_patch.get_or_insert((t.tid, t.rip));
            }
            if (r.code_base..r.code_base + r.code_len).contains(&t.rip) {
                match r.pc_map.iter().find(|&&(_, new)| new == t.rip) {
                    Some(&(old, _)) if !t.restart_pending => plan.moves.push(Move {
                        tid: t.tid,
                        from: t.rip,
                        to: old,
                    }),
                    _ => plan.in_cache += 1,
                }
            }
        }
    }
    plan
}

fn undo_where(pid: i32, only: Option<u64>, opts: &UndoOptions) -> Result<Vec<UndoReport>> {
    // Look before stopping anything: no repair, no pause. (Without ptrace rights over the
    // target, reading its memory needs the hold below; go ahead then.)
    match find_repairs(pid) {
        Ok(present) => match only {
            Some(base) if !present.iter().any(|r| r.map_base == base) => {
                return Err(TraceeError::NoSuchRepair { pid, addr: base })
            }
            None if present.is_empty() => return Ok(Vec::new()),
            _ => {}
        },
        Err(e @ TraceeError::NoSuchProcess { .. }) => return Err(e),
        Err(_) => {}
    }
    let mut pause = PauseStats::default();
    let attempts = opts.max_attempts.max(1);
    for attempt in 1..=attempts {
        let mut txn = Txn::begin(pid, opts.apply.syscall_thread)?;
        let regions = txn.maps()?;
        let mut recs = read_records(&txn.mem, &regions)?;
        if let Some(base) = only {
            recs.retain(|r| r.map_base == base);
            if recs.is_empty() {
                return Err(TraceeError::NoSuchRepair { pid, addr: base });
            }
        }
        let plan = plan_back(&txn.positions()?, &recs);
        let last = attempt == attempts;
        if plan.in_patch.is_some() || plan.in_cache > 0 {
            if !last {
                pause.add(&txn.commit());
                std::thread::sleep(opts.retry_delay);
                continue;
            }
            if let Some((tid, rip)) = plan.in_patch {
                return Err(TraceeError::NoSafePoint { tid, rip, attempts });
            }
        }
        let mut reports = Vec::new();
        for (i, r) in recs.iter().enumerate() {
            let mut restored = 0;
            if r.state == RecordState::Active {
                for p in &r.patches {
                    txn.patch(p.addr, &p.new_bytes, &p.old_bytes)?;
                    restored += 1;
                    if i == 0 && restored == 1 {
                        hook(&opts.apply, FailPoint::UndoAfterFirstRestore)?;
                    }
                }
            }
            reports.push(UndoReport {
                map_base: r.map_base,
                restored_patches: restored,
                moved: Vec::new(),
                unmapped: false,
                threads_left_in_cache: 0,
                pause: PauseStats::default(),
            });
        }
        for m in &plan.moves {
            txn.move_thread(m.tid, m.to)?;
            if let Some(rep) = recs
                .iter()
                .zip(reports.iter_mut())
                .find(|(r, _)| (r.code_base..r.code_base + r.code_len).contains(&m.from))
                .map(|(_, rep)| rep)
            {
                rep.moved.push(*m);
            }
        }
        // Mark caches that cannot go yet; logged, so a failure below restores `Active`.
        let mut free = Vec::new();
        for (r, rep) in recs.iter().zip(reports.iter_mut()) {
            let users = users_of(&txn, &regions, r.map_base..r.map_base + r.map_len)?;
            if users == 0 {
                free.push((r.map_base, r.map_len));
                continue;
            }
            rep.threads_left_in_cache = users;
            if r.state == RecordState::Active {
                let at = r.map_base + record::STATE_OFFSET;
                txn.patch(
                    at,
                    &RecordState::Active.to_u32().to_le_bytes(),
                    &RecordState::Retired.to_u32().to_le_bytes(),
                )?;
            }
        }
        // Unmapping cannot be undone: last, after every fallible step.
        for (base, len) in free {
            let ok = match txn.unmap(base, len) {
                Ok(()) => true,
                Err(e) => {
                    log::warn!("laser: unmapping code cache {base:#x} of process {pid}: {e}");
                    false
                }
            };
            if let Some(rep) = reports.iter_mut().find(|r| r.map_base == base) {
                rep.unmapped = ok;
            }
        }
        pause.add(&txn.commit());
        for rep in &mut reports {
            rep.pause = pause;
        }
        return Ok(reports);
    }
    unreachable!("the last attempt always returns")
}

/// How many held threads still refer to `range` by RIP, a register, or a word on their stack.
fn users_of(txn: &Txn, regions: &[MapRegion], range: std::ops::Range<u64>) -> Result<usize> {
    let lock = txn.lock_ref();
    let mut users = 0;
    for tid in lock.tids() {
        let r = lock.regs(tid)?;
        let gprs = [
            r.rip, r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi, r.rbp, r.r8, r.r9, r.r10, r.r11,
            r.r12, r.r13, r.r14, r.r15,
        ];
        if gprs.iter().any(|v| range.contains(v)) {
            users += 1;
            continue;
        }
        // From the bottom of the red zone to the top of the stack mapping, at most 1 MiB.
        let lo = r.rsp.saturating_sub(128) & !7;
        let Some(stack) = regions.iter().find(|m| m.contains(r.rsp)) else {
            continue;
        };
        let hi = stack.end.min(lo + (1 << 20));
        let words = txn.mem.read_partial(lo, (hi - lo) as usize);
        if words
            .chunks_exact(8)
            .any(|w| range.contains(&u64::from_le_bytes(w.try_into().expect("8 bytes"))))
        {
            users += 1;
        }
    }
    Ok(users)
}
