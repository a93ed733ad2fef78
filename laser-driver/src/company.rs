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
//! two of those threads are runnable, it waits, looking again every [`POLL`], for at most
//! [`MAX_WAIT`]; then it opens anyway. A wait spends no trap budget: it only moves the
//! window to where the threads meet. A thread's state is one read of `/proc/TID/stat`.

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
    /// than two of them can run, and it has not waited [`MAX_WAIT`] yet.
    pub fn waits_at(&mut self, now: Instant) -> bool {
        self.waits_with(now, runnable)
    }

    fn waits_with(&mut self, now: Instant, state: impl Fn(i32) -> Option<bool>) -> bool {
        if self.tids.len() < 2 {
            return false;
        }
        if self
            .since
            .is_some_and(|s| now.saturating_duration_since(s) >= MAX_WAIT)
        {
            return false;
        }
        let states: Vec<bool> = self.tids.iter().filter_map(|&t| state(t)).collect();
        // Fewer than two alive: they cannot meet any more, so no wait.
        let wait = states.len() >= 2 && states.iter().filter(|&&r| r).count() < 2;
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

/// Whether thread `tid` is runnable (state `R`), `None` if it is gone.
fn runnable(tid: i32) -> Option<bool> {
    let stat = std::fs::read_to_string(format!("/proc/{tid}/stat")).ok()?;
    // The state follows the command name, which is in parentheses and may hold anything.
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.trim_start().starts_with('R'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_waits_while_fewer_than_two_of_its_threads_run_and_not_for_long() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut c = Company::default();
        let asleep = |t: i32| Some(t == 1);
        assert!(!c.waits_with(t0, asleep), "no company: never waits");
        c.set(&[1, 2]);
        assert!(c.waits_with(t0, asleep));
        assert!(c.waits_with(t0 + ms(5), asleep));
        assert!(!c.waits_with(t0 + MAX_WAIT, asleep), "then it opens anyway");
        c.opened(t0 + MAX_WAIT);
        assert_eq!((c.waits, c.waited), (1, MAX_WAIT));
        assert!(!c.waiting());
        // Both runnable: no wait, and none counted.
        assert!(!c.waits_with(t0, |_| Some(true)));
        assert!(!c.waiting());
        c.opened(t0);
        assert_eq!(c.waits, 1);
        // One thread gone: the other has no one to meet.
        assert!(!c.waits_with(t0, |t| (t == 1).then_some(false)));
    }

    #[test]
    fn this_thread_is_runnable_and_a_gone_one_is_not_there() {
        let me = unsafe { libc::gettid() };
        assert_eq!(runnable(me), Some(true));
        assert_eq!(runnable(i32::MAX), None);
    }
}
