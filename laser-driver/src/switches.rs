//! Context switches of watched threads: what armed breakpoints cost besides their traps.
//!
//! Every time a thread with an armed breakpoint is switched in, the kernel loads the
//! breakpoint into the debug registers (and clears DR7 when it is switched out). In a KVM
//! guest the first debug-register write after any VM exit exits too, so a thread that sleeps
//! and wakes often pays at every wake-up, whether or not it ever touches the watched words.
//! Measured here (sixteenth session, `scripts/switch-cost`): two threads in barrier rounds
//! (one switch per round), each with one armed breakpoint that never trapped, took
//! 40.5–47.3 µs per round against 37.3–40.3 µs without, 2.3–9.6 µs more per switch (median
//! 6.8 µs over 6 alternating pairs). On a barrier-heavy program that made watch windows cost
//! twice what their traps and event work were charged (`scripts/watch-cost`).
//!
//! So the watcher counts the switches of the threads it watches while a window is armed
//! (from `/proc/TID/schedstat`, whose third field counts the times a thread was given a
//! CPU) and charges them to the duty cycle at [`SWITCH_COST`] each.

use std::collections::BTreeMap;
use std::time::Duration;

/// What one switch of a thread with armed breakpoints costs the target in wall time: the
/// debug-register load and clear and the VM exits they cause here, measured as the
/// difference per switch between barrier rounds with and without an armed breakpoint
/// (`scripts/switch-cost`, median 6.8 µs; see the module doc). A machine whose debug
/// registers cost less (no hypervisor) is overcharged: fewer windows, never more cost.
pub const SWITCH_COST: Duration = Duration::from_micros(7);

/// Most threads read per tally: a program of hundreds of threads would otherwise cost
/// laser a file read per thread at every tick. Past this many, the first `MAX_READ` (by
/// thread id, so the same ones each time) stand for all, scaled by their number.
const MAX_READ: usize = 64;

/// Switch-in counts of the watched threads as last read.
#[derive(Debug, Default)]
pub struct SwitchTally {
    seen: BTreeMap<i32, u64>,
}

impl SwitchTally {
    /// Switches of `tids` (distinct, in ascending order: the watcher's sets of them are
    /// ordered already) since they were last read: each thread read for the first time (or
    /// gone) adds none. With more than [`MAX_READ`] threads, an estimate from the first of
    /// them.
    pub fn advance(&mut self, tids: impl ExactSizeIterator<Item = i32>) -> u64 {
        let total = tids.len();
        let read = total.min(MAX_READ);
        let mut switches = 0;
        for tid in tids.take(MAX_READ) {
            match switch_ins(tid) {
                Some(now) => {
                    if let Some(before) = self.seen.insert(tid, now) {
                        switches += now.saturating_sub(before);
                    }
                }
                None => {
                    self.seen.remove(&tid);
                }
            }
        }
        if total > read {
            switches = switches * total as u64 / read as u64;
        }
        switches
    }

    /// Nothing is armed: the next window starts from fresh counts.
    pub fn clear(&mut self) {
        self.seen.clear();
    }
}

/// How many times thread `tid` was given a CPU (`/proc/TID/schedstat`, third field), or
/// `None` when it is gone (or the kernel keeps no such count).
fn switch_ins(tid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{tid}/schedstat")).ok()?;
    parse_schedstat(&text)
}

fn parse_schedstat(text: &str) -> Option<u64> {
    text.split_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_third_field_counts_switch_ins() {
        assert_eq!(parse_schedstat("1718284 66580 17\n"), Some(17));
        assert_eq!(parse_schedstat("1718284 66580\n"), None);
        assert_eq!(parse_schedstat(""), None);
    }

    /// A thread that sleeps 20 times is switched in about 20 times; one read for the first
    /// time, or gone, adds nothing.
    #[test]
    fn a_sleeping_thread_is_counted() {
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        let gone = std::thread::spawn(|| unsafe { libc::gettid() })
            .join()
            .unwrap();
        let mut tally = SwitchTally::default();
        assert_eq!(
            tally.advance([me, gone].into_iter()),
            0,
            "first read: a baseline"
        );
        for _ in 0..20 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let n = tally.advance([me, gone].into_iter());
        assert!((20..200).contains(&n), "{n} switch-ins for 20 sleeps");
        tally.clear();
        assert_eq!(
            tally.advance([me].into_iter()),
            0,
            "cleared: a baseline again"
        );
    }
}
