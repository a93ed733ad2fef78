//! The placement repair: the contending threads run on one CPU, so the line they share
//! stays in that CPU's cache. It changes no code and no memory, so TSO holds trivially (one
//! CPU runs the threads in turns, each thread's own order intact); the price is parallelism,
//! so it pays only where contention costs more than the second CPU gives (Phoenix
//! linear_regression -O0: 2.45x contended vs aligned on this 2-vCPU machine).
//!
//! ```text
//!  count-only plan applied (the loop's iteration counter, native accesses)
//!  round k: window as placed ─ pin every thread to CPU c ─ window pinned ─ unpin
//!  pinned faster by the margin in every round: pin again and keep it; else leave as found
//! ```
//!
//! Reversible: every thread's affinity mask is saved before it is changed and put back on
//! undo (threads created meanwhile get the mask the process's main thread had); `laser
//! repair -p PID --undo` gives every thread all online CPUs.

use std::time::{Duration, Instant};

use laser_repair::plan::ssb_layout::RuntimeConfig;
use laser_repair::tracee::ProcMem;

use super::budget::{Budget, MIN_LOSS};
use super::trial::{self, Round, TrialOutcome, TrialSettings, Verdict};

/// The threads of `pid` (its /proc task list).
pub fn threads(pid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut t: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    t.sort_unstable();
    t
}

fn get(tid: i32) -> Option<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is plain bits; sched_getaffinity writes at most its size into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        (libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0)
            .then_some(set)
    }
}

fn set(tid: i32, mask: &libc::cpu_set_t) -> bool {
    // SAFETY: reads one cpu_set_t of ours; a thread that exited meanwhile gives ESRCH.
    unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), mask) == 0 }
}

fn only(cpu: usize) -> libc::cpu_set_t {
    // SAFETY: as `get`; CPU_SET only sets a bit of the set.
    unsafe {
        let mut s: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut s);
        s
    }
}

/// Every thread of a process on one CPU, with what it had before.
pub struct Pinning {
    pid: i32,
    pub cpu: usize,
    saved: Vec<(i32, libc::cpu_set_t)>,
}

impl Pinning {
    /// Pins every thread of `pid` to `cpu`. A thread that exits meanwhile is skipped.
    pub fn pin(pid: i32, cpu: usize) -> Pinning {
        let mask = only(cpu);
        let mut saved = Vec::new();
        for tid in threads(pid) {
            if let Some(m) = get(tid) {
                if set(tid, &mask) {
                    saved.push((tid, m));
                }
            }
        }
        Pinning { pid, cpu, saved }
    }

    /// Threads pinned.
    pub fn threads(&self) -> usize {
        self.saved.len()
    }

    /// Puts every thread's mask back; threads created since get the main thread's old mask.
    pub fn undo(&self) {
        let main = self
            .saved
            .iter()
            .find(|(t, _)| *t == self.pid)
            .map(|(_, m)| *m);
        for tid in threads(self.pid) {
            match self.saved.iter().find(|(t, _)| *t == tid) {
                Some((_, m)) => {
                    set(tid, m);
                }
                None => {
                    if let Some(m) = &main {
                        set(tid, m);
                    }
                }
            }
        }
    }
}

/// The one CPU every thread of `pid` is pinned to, if they all are (what a kept placement
/// leaves; `laser repair --undo` takes it for one).
pub fn pinned_cpu(pid: i32) -> Option<usize> {
    let mut cpu = None;
    for tid in threads(pid) {
        let m = get(tid)?;
        // SAFETY: CPU_COUNT / CPU_ISSET read bits of a set we own.
        let (n, c) = unsafe {
            (
                libc::CPU_COUNT(&m),
                (0..libc::CPU_SETSIZE as usize).find(|&c| libc::CPU_ISSET(c, &m)),
            )
        };
        if n != 1 || (cpu.is_some() && cpu != c) {
            return None;
        }
        cpu = c;
    }
    // One CPU on a one-CPU machine is no placement.
    (online_cpus() >= 2).then_some(cpu).flatten()
}

/// CPUs online (a placement needs a second one to take a thread from).
pub fn online_cpus() -> usize {
    // SAFETY: sysconf takes an integer.
    unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize
}

/// Gives every thread of `pid` every online CPU (`laser repair --undo` of a placement).
pub fn unpin_all(pid: i32) -> usize {
    let n = online_cpus();
    // SAFETY: as `only`.
    let all = unsafe {
        let mut s: libc::cpu_set_t = std::mem::zeroed();
        for c in 0..n.min(libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(c, &mut s);
        }
        s
    };
    threads(pid).into_iter().filter(|&t| set(t, &all)).count()
}

/// The CPU the thread `tid` last ran on (/proc/TID/stat field 39), if readable.
pub fn last_cpu(pid: i32, tid: i32) -> Option<usize> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_whitespace().nth(36)?.parse().ok()
}

/// Rounds of (window as placed, window pinned) over the count-only plan's counter at
/// `data_base`; keeps the pinning (returned) only if it won every round.
pub fn trial_rounds(
    pid: i32,
    mem: &ProcMem,
    data_base: u64,
    cfg: &RuntimeConfig,
    t: &TrialSettings,
    budget: &mut Budget,
) -> (TrialOutcome, Option<Pinning>) {
    let start = Instant::now();
    let cpu = threads(pid)
        .last()
        .and_then(|&tid| last_cpu(pid, tid))
        .unwrap_or(0);
    let mut rounds = Vec::new();
    let mut keep = None;
    let mut stopped = None;
    let wanted = t.rounds.max(1);
    for r in 0..wanted {
        // Each round may lose a pinned window; the count-only plan's undo comes after.
        if r > 0 && !budget.affords(0, 1, MIN_LOSS) {
            stopped = Some(format!(
                "ended before round {}: what is left of the budget ({:.1} ms) does not cover \
                 another pinned window",
                r + 1,
                budget.left().as_secs_f64() * 1e3
            ));
            break;
        }
        let n_at = start.elapsed();
        let native = trial::measure(mem, data_base, cfg, t.window, |_| false);
        let pin = Pinning::pin(pid, cpu);
        let p_at = start.elapsed();
        // One CPU for every thread: a pinned window that loses may run at half the rate
        // (the parallelism given up); it ends as soon as its loss would overrun the budget.
        let reserve = budget.estimate(0, 1, Duration::ZERO);
        let pinned = trial::measure(mem, data_base, cfg, t.window, |w| {
            (w.elapsed >= t.window / 5 && trial::clearly_losing(&native, w))
                || budget.must_stop(&native, w, reserve)
        });
        if pinned.elapsed < t.window && budget.must_stop(&native, &pinned, reserve) {
            stopped = Some(format!(
                "round {}'s pinned window ended after {:.0} ms: its loss would overrun the budget",
                r + 1,
                pinned.elapsed.as_secs_f64() * 1e3
            ));
        }
        budget.charge_loss(&native, &pinned);
        rounds.push(Round {
            native,
            repaired: pinned,
            native_at: n_at,
            repaired_at: p_at,
        });
        let won = trial::decide(&native, &pinned, t.margin) == Verdict::Kept;
        if won && r + 1 == t.rounds.max(1) {
            keep = Some(pin);
            break;
        }
        pin.undo();
        if !won || stopped.is_some() {
            break;
        }
    }
    let mut out = TrialOutcome::from_rounds(rounds, wanted, t.margin, Vec::new(), start.elapsed());
    out.stop(stopped);
    (out, keep)
}

/// Which CPU the threads of a kept placement run on and `why`, for the report.
pub fn describe(p: &Pinning, t: &TrialOutcome, why: &str) -> String {
    format!(
        "placement: {} thread(s) pinned to CPU {} ({} {why})",
        p.threads(),
        p.cpu,
        match t.verdict {
            Verdict::Kept => format!("{:.2}x as placed before;", t.speedup()),
            _ => String::new(),
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinning_this_process_is_undone_exactly() {
        let pid = std::process::id() as i32;
        let before: Vec<_> = threads(pid).into_iter().map(|t| (t, get(t))).collect();
        let p = Pinning::pin(pid, 0);
        assert!(p.threads() >= 1);
        let me = get(pid).expect("own mask");
        // SAFETY: CPU_ISSET reads a bit of a set we own.
        assert!(unsafe { libc::CPU_ISSET(0, &me) });
        // SAFETY: as above.
        assert_eq!(unsafe { libc::CPU_COUNT(&me) }, 1);
        p.undo();
        for (t, m) in before {
            let (Some(m), Some(now)) = (m, get(t)) else {
                continue;
            };
            // SAFETY: CPU_EQUAL compares two sets we own.
            assert!(unsafe { libc::CPU_EQUAL(&m, &now) }, "thread {t}");
        }
    }

    #[test]
    fn last_cpu_reads_the_stat_field_after_the_command() {
        let pid = std::process::id() as i32;
        let cpu = last_cpu(pid, pid).expect("own stat");
        // SAFETY: sysconf takes an integer.
        let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) } as usize;
        assert!(cpu < n.max(1), "cpu {cpu} of {n}");
    }
}
