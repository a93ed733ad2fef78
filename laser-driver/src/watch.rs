//! Hardware data watchpoints on chosen addresses in every thread of the target.
//!
//! x86 has 4 debug registers per thread, so laser opens [`MAX_WATCHES`] breakpoint events per
//! CPU (launch: `inherit`, so every thread the program creates gets child events) or per
//! thread (attach), all parked at an unmapped address and disabled. [`Watcher::arm`]
//! re-points them with `PERF_EVENT_IOC_MODIFY_ATTRIBUTES` — the kernel applies it to every
//! inherited child too (`perf_event_modify_attr` walks `child_list`; the integration test
//! `watchpoints_hit_in_both_threads` would see hits from the main thread only otherwise).
//!
//! ## Duty cycle
//! Each hit is a debug trap, ≈ 4.5 µs here. A hot watched word could trap millions of times
//! per second, so watchpoints are armed in windows:
//!
//! ```text
//!   armed ≤ window, ≤ max_hits ─┐   cooldown = hits·hit_cost/max_slowdown − armed time
//!   ├──────────────┤            ▼   ├─────────────────────────────┤
//!   ───[ARMED]─────────────────────[COOLING]──────────────────────[ARMED]──…
//! ```
//!
//! Over each armed+cooldown cycle the trap time is at most `max_slowdown` of the wall time
//! (counting every hit as if it delayed the whole program; with several threads the real
//! slowdown is lower). Within a window the hit count can overshoot `max_hits_per_window` by
//! what arrives before the reader wakes (watch events wake it every `max_hits/4` records);
//! the cooldown then grows to pay for the overshoot, so the average bound still holds.

use std::os::fd::{OwnedFd, RawFd};
use std::time::{Duration, Instant};

use perf_event_open_sys::bindings::perf_event_attr;

use crate::attr::{self, Binding, WatchKind};
use crate::error::DriverError;
use crate::sys;

/// Debug registers per thread on x86-64.
pub const MAX_WATCHES: usize = 4;

/// Largest user-space address + 1 on x86-64 (47-bit user half).
const USER_END: u64 = 0x0000_8000_0000_0000;

/// One watched range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WatchSpec {
    pub addr: u64,
    /// 1, 2, 4 or 8 bytes, and `addr` aligned to it (a debug-register rule).
    pub len: u8,
    pub kind: WatchKind,
}

impl WatchSpec {
    pub fn validate(&self) -> Result<(), DriverError> {
        let bad = |reason| DriverError::BadWatch {
            addr: self.addr,
            len: self.len,
            reason,
        };
        if !matches!(self.len, 1 | 2 | 4 | 8) {
            return Err(bad("length must be 1, 2, 4 or 8 bytes"));
        }
        if !self.addr.is_multiple_of(self.len as u64) {
            return Err(bad("address must be aligned to the length"));
        }
        if self.addr.saturating_add(self.len as u64) > USER_END {
            return Err(bad("address is not in user space"));
        }
        Ok(())
    }
}

/// The duty-cycle policy (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DutyCycle {
    /// Longest armed window.
    pub window: Duration,
    /// Hits after which a window ends early.
    pub max_hits_per_window: u64,
    /// Bound on trap time / wall time, averaged over each window and its cooldown.
    pub max_slowdown: f64,
    /// Cost of one hit (measured ≈ 4.5 µs on the KVM guest this was built on).
    pub hit_cost: Duration,
}

impl Default for DutyCycle {
    fn default() -> Self {
        DutyCycle::new(Duration::from_millis(20), 0.05, Duration::from_nanos(4500))
    }
}

impl DutyCycle {
    /// A policy whose per-window cap alone keeps the window within `max_slowdown`.
    pub fn new(window: Duration, max_slowdown: f64, hit_cost: Duration) -> Self {
        let cap = (window.as_secs_f64() * max_slowdown / hit_cost.as_secs_f64().max(1e-9))
            .floor()
            .max(1.0) as u64;
        DutyCycle {
            window,
            max_hits_per_window: cap,
            max_slowdown,
            hit_cost,
        }
    }

    /// How long to stay disarmed after a window that was armed for `armed` and saw `hits`.
    pub fn cooldown(&self, hits: u64, armed: Duration) -> Duration {
        let cost = self.hit_cost.as_secs_f64() * hits as f64;
        let total = cost / self.max_slowdown.max(1e-6);
        Duration::from_secs_f64((total - armed.as_secs_f64()).max(0.0))
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    Idle,
    Armed { since: Instant, hits: u64 },
    Cooling { until: Instant },
}

/// Counters for reports: how much of the run was watched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchStats {
    pub windows: u64,
    pub hits: u64,
    pub armed_time: Duration,
    pub cooldown_time: Duration,
}

struct WatchEvent {
    key: i64,
    slot: u8,
    fd: OwnedFd,
    attr: perf_event_attr,
}

/// The watchpoints of one session. Obtained from `Session::watch_mut`.
pub struct Watcher {
    binding: Binding,
    events: Vec<WatchEvent>,
    specs: Vec<WatchSpec>,
    duty: DutyCycle,
    phase: Phase,
    stats: WatchStats,
}

impl Watcher {
    pub(crate) fn new(binding: Binding, duty: DutyCycle) -> Self {
        Watcher {
            binding,
            events: Vec::new(),
            specs: Vec::new(),
            duty,
            phase: Phase::Idle,
            stats: WatchStats::default(),
        }
    }

    /// Opens the parked events for one CPU (`cpu >= 0`, launch) or one thread (`pid` = tid,
    /// `cpu = -1`, attach), writing into `leader`'s ring. Returns (id, slot) pairs for the
    /// decoder. New events take the current state (armed/cooling) at once.
    pub(crate) fn add(
        &mut self,
        pid: i32,
        cpu: i32,
        key: i64,
        leader: RawFd,
    ) -> Result<Vec<(u64, u8)>, DriverError> {
        let wake = (self.duty.max_hits_per_window / 4).clamp(1, u32::MAX as u64) as u32;
        let mut ids = Vec::new();
        let first_new = self.events.len();
        for slot in 0..MAX_WATCHES as u8 {
            let a = attr::watch(self.binding, wake);
            let what = format!("watchpoint slot {slot} (pid {pid}, cpu {cpu})");
            let fd = sys::open(&a, pid, cpu, &what)?;
            sys::set_output(&fd, leader)?;
            ids.push((sys::event_id(&fd)?, slot));
            self.events.push(WatchEvent {
                key,
                slot,
                fd,
                attr: a,
            });
        }
        let enabled = matches!(self.phase, Phase::Armed { .. });
        if !self.specs.is_empty() {
            for ev in &self.events[first_new..] {
                apply_one(ev, &self.specs, enabled)?;
            }
        }
        Ok(ids)
    }

    /// Closes the events of a thread that exited (attach).
    pub(crate) fn remove(&mut self, key: i64) {
        self.events.retain(|e| e.key != key);
    }

    /// Points the first `specs.len()` slots at `specs` and starts a window. Replaces whatever
    /// was armed before.
    pub fn arm(&mut self, specs: &[WatchSpec]) -> Result<(), DriverError> {
        if specs.len() > MAX_WATCHES {
            return Err(DriverError::TooManyWatches {
                requested: specs.len(),
                max: MAX_WATCHES,
            });
        }
        specs.iter().try_for_each(WatchSpec::validate)?;
        self.close_window(Instant::now());
        self.specs = specs.to_vec();
        for ev in &self.events {
            apply_one(ev, &self.specs, true)?;
        }
        self.phase = if specs.is_empty() {
            Phase::Idle
        } else {
            self.stats.windows += 1;
            Phase::Armed {
                since: Instant::now(),
                hits: 0,
            }
        };
        Ok(())
    }

    /// Disables every watchpoint and forgets the armed set.
    pub fn disarm(&mut self) -> Result<(), DriverError> {
        self.close_window(Instant::now());
        self.specs.clear();
        self.phase = Phase::Idle;
        for ev in &self.events {
            sys::disable(&ev.fd)?;
        }
        Ok(())
    }

    /// The armed set (slot n = index n), empty when disarmed.
    pub fn armed(&self) -> &[WatchSpec] {
        &self.specs
    }

    /// True while the watchpoints are counting (armed and not cooling down).
    pub fn is_counting(&self) -> bool {
        matches!(self.phase, Phase::Armed { .. })
    }

    pub fn duty_cycle(&self) -> DutyCycle {
        self.duty
    }

    pub fn set_duty_cycle(&mut self, duty: DutyCycle) {
        self.duty = duty;
    }

    pub fn stats(&self) -> WatchStats {
        self.stats
    }

    fn close_window(&mut self, now: Instant) {
        match self.phase {
            Phase::Armed { since, .. } => self.stats.armed_time += now - since,
            Phase::Cooling { until } => {
                self.stats.cooldown_time += until.saturating_duration_since(now)
            }
            Phase::Idle => {}
        }
    }

    /// When `tick` next needs to run (end of window or of cooldown).
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        match self.phase {
            Phase::Idle => None,
            Phase::Armed { since, .. } => Some(since + self.duty.window),
            Phase::Cooling { until } => Some(until),
        }
    }

    /// Advances the duty cycle: `new_hits` watch samples were just read.
    pub(crate) fn tick(&mut self, now: Instant, new_hits: u64) -> Result<(), DriverError> {
        self.stats.hits += new_hits;
        match self.phase {
            Phase::Idle => {}
            Phase::Armed { since, hits } => {
                let hits = hits + new_hits;
                let armed = now.saturating_duration_since(since);
                if hits >= self.duty.max_hits_per_window || armed >= self.duty.window {
                    for ev in &self.events {
                        sys::disable(&ev.fd)?;
                    }
                    self.stats.armed_time += armed;
                    let cool = self.duty.cooldown(hits, armed);
                    self.stats.cooldown_time += cool;
                    self.phase = if cool.is_zero() {
                        self.enable_all()?;
                        self.stats.windows += 1;
                        Phase::Armed {
                            since: now,
                            hits: 0,
                        }
                    } else {
                        Phase::Cooling { until: now + cool }
                    };
                } else {
                    self.phase = Phase::Armed { since, hits };
                }
            }
            Phase::Cooling { until } => {
                if now >= until {
                    self.enable_all()?;
                    self.stats.windows += 1;
                    self.phase = Phase::Armed {
                        since: now,
                        hits: 0,
                    };
                }
            }
        }
        Ok(())
    }

    fn enable_all(&self) -> Result<(), DriverError> {
        for ev in self
            .events
            .iter()
            .filter(|e| (e.slot as usize) < self.specs.len())
        {
            sys::enable(&ev.fd)?;
        }
        Ok(())
    }
}

/// Re-points one event at its slot's spec (enabled or not), or disables an unused slot.
fn apply_one(ev: &WatchEvent, specs: &[WatchSpec], enabled: bool) -> Result<(), DriverError> {
    match specs.get(ev.slot as usize) {
        Some(s) => sys::modify(
            &ev.fd,
            &attr::repoint(&ev.attr, s.addr, s.len, s.kind, !enabled),
        ),
        None => sys::disable(&ev.fd),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_validated() {
        let ok = |addr, len| {
            WatchSpec {
                addr,
                len,
                kind: WatchKind::ReadWrite,
            }
            .validate()
            .is_ok()
        };
        assert!(ok(0x601040, 8));
        assert!(ok(0x601041, 1));
        assert!(!ok(0x601044, 8), "misaligned");
        assert!(!ok(0x601040, 3), "bad length");
        assert!(!ok(0, 16), "bad length");
        assert!(!ok(USER_END - 4, 8), "kernel half");
        assert!(!ok(u64::MAX - 7, 8), "overflow");
    }

    #[test]
    fn default_duty_cycle_keeps_each_window_under_the_bound() {
        let d = DutyCycle::default();
        // 20 ms · 5 % / 4.5 µs = 222 hits.
        assert_eq!(d.max_hits_per_window, 222);
        let cost = d.hit_cost * d.max_hits_per_window as u32;
        assert!(cost.as_secs_f64() / d.window.as_secs_f64() <= d.max_slowdown + 1e-9);
    }

    #[test]
    fn cooldown_pays_for_overshoot() {
        let d = DutyCycle::new(Duration::from_millis(10), 0.02, Duration::from_micros(5));
        // 10 hits in a full window: 50 µs of traps, well within 2 % of 10 ms.
        assert_eq!(d.cooldown(10, Duration::from_millis(10)), Duration::ZERO);
        // 1000 hits in 1 ms: 5 ms of traps → cycle must last 250 ms.
        let c = d.cooldown(1000, Duration::from_millis(1));
        assert!((c.as_secs_f64() - 0.249).abs() < 1e-6, "{c:?}");
        let slowdown = 5e-3 / (c + Duration::from_millis(1)).as_secs_f64();
        assert!(slowdown <= 0.02 + 1e-9);
    }

    #[test]
    fn too_many_watches_is_an_error_without_touching_events() {
        let mut w = Watcher::new(Binding::Attach, DutyCycle::default());
        let s = WatchSpec {
            addr: 0x1000,
            len: 8,
            kind: WatchKind::Write,
        };
        assert!(matches!(
            w.arm(&[s; 5]),
            Err(DriverError::TooManyWatches { requested: 5, .. })
        ));
        w.arm(&[s]).unwrap();
        assert!(w.is_counting());
        assert_eq!(w.armed(), &[s]);
        w.disarm().unwrap();
        assert!(!w.is_counting());
    }
}
