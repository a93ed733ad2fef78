//! Opening a window when the threads it is for run together.
//!
//! A read+write window on a line counts a transfer only when two threads access it within
//! the window, and a hot reader fills the window's trap cap in under a millisecond. A
//! window that opens while the line's other thread is blocked (a sleep, a page fault on a
//! mapped file, a lock) sees the reader alone, and its cooldown then takes the next ~100 ms
//! from the line: stalling_writer's writer sleeps half its time in ~1 ms spells, and ~10% of
//! its runs went unreported, each with one-thread windows on the line (forty-sixth session).
//!
//! So a window may name its *company*: the threads that contend on what it watches. When the
//! window is due (its turn armed from idle, or the cooldown before it paid) and fewer than
//! two of those threads are runnable *on different CPUs*, it waits, looking again every
//! [`POLL`], for at most [`MAX_WAIT`]; then it opens anyway. A wait spends no trap budget: it
//! only moves the window to where the threads meet. A thread's state and the CPU it is on
//! are one read of `/proc/TID/stat`.
//!
//! Runnable is not enough: two threads that take turns on one CPU are both runnable, and the
//! window sees whichever runs first fill its cap in a fraction of a millisecond. With
//! idx4_rw_false's two threads held on one CPU for 150 ms of every 300 (taskset, as a busy
//! host or a CPU quota does), the windows due in those spells saw one thread each and 8 of
//! 10 runs found nothing; a recording showed every window opened while both threads' recent
//! samples were on two CPUs see both.

use std::time::{Duration, Instant};

/// How often a waiting window looks at its company's threads again.
pub const POLL: Duration = Duration::from_millis(1);
/// The longest a window waits for its company: then it opens whatever the threads do (a
/// line whose threads never run together again is watched as before).
pub const MAX_WAIT: Duration = Duration::from_millis(10);

/// Threads a window is for, and whether it waits for them.
#[derive(Debug, Default)]
pub struct Company {
    tids: Vec<i32>,
    /// When the window began to wait (it was due then).
    since: Option<Instant>,
    /// Windows that waited, and for how long in all.
    pub waits: u64,
    pub waited: Duration,
}

impl Company {
    /// The window's threads from now on (none: it never waits).
    pub fn set(&mut self, tids: &[i32]) {
        if self.tids != tids {
            self.tids = tids.to_vec();
            self.since = None;
        }
    }

    /// Whether the window, due at `now`, waits for its threads: it has two or more, fewer
    /// than two of them can run on different CPUs, and it has not waited [`MAX_WAIT`] yet.
    pub fn waits_at(&mut self, now: Instant) -> bool {
        self.waits_with(now, runnable_on)
    }

    /// `state(tid)`: the CPU the thread can run on now (`Some(None)`: not runnable), `None`
    /// when it is gone.
    fn waits_with(&mut self, now: Instant, state: impl Fn(i32) -> Option<Option<u32>>) -> bool {
        if self.tids.len() < 2 {
            return false;
        }
        if self
            .since
            .is_some_and(|s| now.saturating_duration_since(s) >= MAX_WAIT)
        {
            return false;
        }
        let states: Vec<Option<u32>> = self.tids.iter().filter_map(|&t| state(t)).collect();
        let mut cpus: Vec<u32> = states.iter().flatten().copied().collect();
        cpus.sort_unstable();
        cpus.dedup();
        // Fewer than two alive: they cannot meet any more, so no wait.
        let wait = states.len() >= 2 && cpus.len() < 2;
        if wait {
            self.since.get_or_insert(now);
        }
        wait
    }

    /// The window opened at `now`: its wait, if it had one, is over.
    pub fn opened(&mut self, now: Instant) {
        if let Some(since) = self.since.take() {
            let d = now.saturating_duration_since(since);
            if !d.is_zero() {
                self.waits += 1;
                self.waited += d;
            }
        }
    }

    /// Whether a window is waiting now (the reader looks again after [`POLL`]).
    pub fn waiting(&self) -> bool {
        self.since.is_some()
    }
}

/// The CPU thread `tid` runs or waits to run on when it is runnable (state `R`; `Some(None)`
/// when it is not), `None` if it is gone.
fn runnable_on(tid: i32) -> Option<Option<u32>> {
    let stat = std::fs::read_to_string(format!("/proc/{tid}/stat")).ok()?;
    Some(parse_stat(&stat))
}

/// [`runnable_on`] from the text of `/proc/TID/stat`.
fn parse_stat(stat: &str) -> Option<u32> {
    // The state follows the command name, which is in parentheses and may hold anything;
    // `processor` is field 39 of proc(5), the 37th after the name.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    if fields.next()? != "R" {
        return None;
    }
    fields.nth(35)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_waits_while_fewer_than_two_of_its_threads_run_and_not_for_long() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut c = Company::default();
        let asleep = |t: i32| Some((t == 1).then_some(0));
        assert!(!c.waits_with(t0, asleep), "no company: never waits");
        c.set(&[1, 2]);
        assert!(c.waits_with(t0, asleep));
        assert!(c.waits_with(t0 + ms(5), asleep));
        assert!(!c.waits_with(t0 + MAX_WAIT, asleep), "then it opens anyway");
        c.opened(t0 + MAX_WAIT);
        assert_eq!((c.waits, c.waited), (1, MAX_WAIT));
        assert!(!c.waiting());
        // Both runnable on two CPUs: no wait, and none counted.
        assert!(!c.waits_with(t0, |t| Some(Some(t as u32))));
        assert!(!c.waiting());
        c.opened(t0);
        assert_eq!(c.waits, 1);
        // Both runnable, taking turns on one CPU: they do not meet there.
        assert!(c.waits_with(t0, |_| Some(Some(3))));
        c.opened(t0);
        // One thread gone: the other has no one to meet.
        assert!(!c.waits_with(t0, |t| (t == 1).then_some(None)));
    }

    #[test]
    fn a_threads_state_and_cpu_come_from_its_stat() {
        let me = unsafe { libc::gettid() };
        assert!(
            runnable_on(me).unwrap().is_some(),
            "this thread runs, on some CPU"
        );
        assert_eq!(runnable_on(i32::MAX), None);
        let fields: Vec<String> = (4..=52).map(|i| i.to_string()).collect();
        let stat = |state: &str| format!("7 (a) b) c) {state} {}", fields.join(" "));
        // Field 39 (processor) holds "39" here; a name with `)` and spaces is skipped whole.
        assert_eq!(parse_stat(&stat("R")), Some(39));
        assert_eq!(parse_stat(&stat("S")), None);
        assert_eq!(parse_stat("7 (a) R 1 2"), None, "cut short");
    }
}
