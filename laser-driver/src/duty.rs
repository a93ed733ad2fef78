//! The watchpoint duty cycle: a pure state machine (times and CPU totals are passed in), so
//! it is tested with synthetic clocks.
//!
//! Each hit is a debug trap plus a sample written to the ring (≈ 4.5 µs for the bare trap on
//! an idle KVM guest; 11–16 µs with the sample write on the same guest under load, 25–35 µs
//! with a wake-up of laser per hit too, measured at run time by `watch::measure_hit_cost`).
//! Each window also costs laser's own work on its events (opening them on every thread,
//! renewing spent limits, closing them: ≈ 0.5 ms for 4 words on 2 threads here) and a
//! debug-register reload at every context switch of a watched thread: [`CostModel`] says
//! which of these the budget is charged with. A hot watched word could trap continuously, so watchpoints are armed in windows:
//!
//! ```text
//!  target CPU time ─────────────────────────────────────────────────────────────▶
//!   ├── ARMED (until max_hits, or ≥ window) ─────┼── COOLING ──────────────┼── ARMED …
//!   cpu0                               hits·cost ┘   until the target has used
//!                                                    hits·cost·(1+s)/s of CPU since cpu0
//! ```
//!
//! The bound holds on the target's *CPU time* and on *wall time*, both:
//!
//! - CPU time: on a loaded machine a thread that gets 20 % of a CPU pays a trap at five times
//!   its wall-clock weight, so a wall-time budget alone would under-count (measured: 21 % CPU
//!   overhead while a wall-time budget claimed 6 %).
//! - Wall time: a trap stalls the thread that took it, and in a program whose threads wait
//!   for each other (barriers, locks, a pipeline) the others wait for it too, so a trap costs
//!   its whole duration in wall time however many threads run. A CPU budget alone lets a
//!   target busy on N CPUs take N times the traps: measured with `scripts/watch-cost` (two
//!   threads in barrier rounds), the rounds that overlapped a window took 2.7 % of the run's
//!   wall time longer, exactly hits × calibrated cost, while the CPU budget counted 1.4 %.
//!
//! Per cycle, traps (and laser's work on the events) ≤ s/(1+s) of the target's CPU time and
//! of the wall time since the window began, i.e. traps ≤ s × useful work: the target needs at most `max_slowdown` more CPU, and
//! at most that much longer, than without watchpoints. Every hit counts against the whole
//! target. The last cycle of a run may end before its cooldown is paid: one window of slack,
//! `max_hits_per_window · hit_cost`.
//!
//! A thread with armed breakpoints also pays at every context switch, where the kernel
//! reloads the debug registers (a VM exit here, ≈ 7 µs): with [`CostModel::Full`] the
//! watcher charges the watched threads' switches while armed too (`crate::switches`).
//!
//! What the duty cycle costs laser itself matters too: `laser run` shares the machine with
//! the target, so every wake-up and every enable/disable, open or close of a watchpoint
//! (which interrupts the CPU its thread runs on) slows it. Hence few, long cycles: windows end on
//! their hit cap (the hits wake the reader) rather than on a timer, and a cooldown is
//! re-checked when the target can first have paid for it.

use std::time::{Duration, Instant};

/// Default bound on what the watch windows cost the target: 1 %, charged with everything a
/// window costs ([`CostModel::Full`]). `laser run` adds soft sampling and its own start and
/// reader on top, and the whole must stay within the product's goal (≤ 2 % geomean, ≤ 5 %
/// worst, on the real programs); 5 % for traps alone left no room for the rest, and 2 %
/// (traps priced at twice their cost, `CostModel::Traps`) put the geomean at 1.02–1.03
/// (benchmarks/RESULTS.md, twenty-seventh session). A window's trap cap stays what it was:
/// the trap alone is priced at about half the `Traps` price.
pub const DEFAULT_MAX_SLOWDOWN: f64 = 0.01;

/// Default window: 100 ms at 2 % and a 30 µs trap (measured here with the sample's ring
/// write and a wake-up, see `watch::measure_hit_cost`) allow 66 hits per window. Each window of a hot line ends in a disable and a re-enable of every
/// armed slot (launch: a close and an open), each of which interrupts the CPU its thread runs
/// on: 20 ms windows (26 hits) made a hot line cycle ~100 times a second; 100 ms windows cut
/// that fivefold for the same trap budget. A burst of 66 traps stalls a thread ≈ 2 ms.
pub const DEFAULT_WINDOW: Duration = Duration::from_millis(100);

/// Shortest cooldown re-check interval: below this, waking the reader costs more than
/// finding out a little late that the cooldown is over.
const MIN_RECHECK: Duration = Duration::from_millis(1);

/// The policy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DutyCycle {
    /// Span (wall time) over which `max_hits_per_window` applies: a window ends at its cap,
    /// or at the first tick after this long (then it rolls over at once if it was cheap).
    pub window: Duration,
    /// Hits after which a window ends early.
    pub max_hits_per_window: u64,
    /// Bound on extra target CPU time from traps, as a fraction of its useful CPU time.
    pub max_slowdown: f64,
    /// Cost of one hit. A floor: with `calibrate`, opening the watchpoints measures the real cost
    /// (`watch::measure_hit_cost`) and uses the larger of the two.
    pub hit_cost: Duration,
    /// Measure the hit cost when the watchpoints are opened (100 traps on laser's own thread).
    pub calibrate: bool,
    /// What the budget is charged with ([`CostModel`]).
    pub model: CostModel,
}

/// What a window is charged with against the budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CostModel {
    /// Traps only, each priced as calibrated with a wake-up of the reader per hit
    /// (`watch::measure_hit_cost`): about twice the trap alone here, which stands in for the
    /// window's other costs. The default until the twenty-seventh session (every figure in
    /// RESULTS before it was measured with it).
    Traps,
    /// The trap alone (no wake-up per hit), plus laser's own work on the window events
    /// ([`DutyState::charge`]) and the watched threads' context switches while armed
    /// ([`DutyState::charge_switches`], `crate::switches`): what a window really costs. On
    /// two threads in barrier rounds (`scripts/watch-cost`) the measured extra wall time is
    /// 2.2–2.7% under a 2% budget, against 3.6–5.1% with `Traps`. The default: in the
    /// sixteenth session it cost parsec streamcluster its phase-contended line in 2–4 runs
    /// of 5; with what the survey and the estimator have learnt since, the real programs
    /// and the suites are found as often as with `Traps` (RESULTS, twenty-seventh session).
    #[default]
    Full,
}

impl Default for DutyCycle {
    fn default() -> Self {
        DutyCycle::new(
            DEFAULT_WINDOW,
            DEFAULT_MAX_SLOWDOWN,
            Duration::from_nanos(4500),
        )
    }
}

impl DutyCycle {
    /// A policy whose per-window cap alone keeps a fully busy window within `max_slowdown`.
    pub fn new(window: Duration, max_slowdown: f64, hit_cost: Duration) -> Self {
        let cap = (window.as_secs_f64() * max_slowdown / hit_cost.as_secs_f64().max(1e-9))
            .floor()
            .max(1.0) as u64;
        DutyCycle {
            window,
            max_hits_per_window: cap,
            max_slowdown,
            hit_cost,
            calibrate: true,
            model: CostModel::default(),
        }
    }

    /// The same policy with a (measured) hit cost: the per-window cap shrinks to match.
    pub fn with_hit_cost(&self, hit_cost: Duration) -> Self {
        DutyCycle {
            calibrate: self.calibrate,
            model: self.model,
            ..DutyCycle::new(self.window, self.max_slowdown, hit_cost)
        }
    }

    /// Target CPU time, and wall time, a cycle with `hits` must span: traps ≤ s/(1+s) of it.
    pub fn cpu_needed(&self, hits: u64) -> Duration {
        self.cost_needed(hits, Duration::ZERO)
    }

    /// [`DutyCycle::cpu_needed`] for a cycle whose traps came with `ops` of laser's own work
    /// on its events (opening, enabling, closing them): that too ≤ s/(1+s) of the span.
    pub fn cost_needed(&self, hits: u64, ops: Duration) -> Duration {
        let s = self.max_slowdown.max(1e-6);
        let cost = self.hit_cost.as_secs_f64() * hits as f64 + ops.as_secs_f64();
        Duration::from_secs_f64(cost * (1.0 + s) / s)
    }
}

/// Counters for reports: how much of the run was watched, at what cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchStats {
    /// Armed windows started.
    pub windows: u64,
    pub hits: u64,
    pub armed_time: Duration,
    pub cooldown_time: Duration,
    /// CPU time the target used during armed windows and cooldowns.
    pub target_cpu: Duration,
    /// Hits of the last window whose cooldown was not (fully) served when watching stopped
    /// (target exited or disarmed). All other hits were paid for by their cooldown.
    pub unpaid_hits: u64,
    /// CPU time laser spent opening, enabling, renewing and closing window events
    /// ([`DutyState::charge`]), paid for by cooldowns like the traps.
    pub ops_time: Duration,
    /// CPU time laser's reader spent between polls while a window counted (draining and
    /// decoding the rings, the detector, steering: [`DutyState::note_reader`]): reported, not
    /// charged.
    pub reader_time: Duration,
    /// Context switches of watched threads while a window was armed, and what they cost
    /// ([`DutyState::charge_switches`]), paid for the same way.
    pub switches: u64,
    pub switch_time: Duration,
    /// Launch windows opened for whole CPUs (`Watcher::set_cpu_wide`), and per thread.
    pub cpu_wide_opens: u64,
    pub thread_opens: u64,
    /// Windows that waited to open until two of the threads they watch for could run, and
    /// how long in all ([`crate::company`]).
    pub company_waits: u64,
    pub company_waited: Duration,
}

/// What the watcher must do to its events after a tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Nothing,
    Enable,
    Disable,
    /// A cheap window that had hits ended and the next began at once, its events left
    /// enabled: those the kernel stopped at their limit must be given a new one.
    Rollover,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    Idle,
    Armed {
        since: Instant,
        cpu0: Duration,
        hits: u64,
        /// An event spent its share of the cap: the window stopped counting at that hit and
        /// ends at the next tick, whatever its hits ([`DutyState::limit_spent`]).
        spent: bool,
        /// laser's work on the window's events so far ([`DutyState::charge`]).
        ops: Duration,
    },
    Cooling {
        since: Instant,
        cpu0: Duration,
        /// Target CPU at the start of the window being paid for.
        win_cpu0: Duration,
        /// Wall time at the start of the window being paid for.
        win_since: Instant,
        /// That window's hits, including stragglers read after it was disabled.
        hits: u64,
        /// laser's work on that window's events, its closing included.
        ops: Duration,
    },
}

/// Where in the cycle we are, plus the totals.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DutyState {
    phase: Phase,
    pub stats: WatchStats,
}

impl Default for DutyState {
    fn default() -> Self {
        DutyState {
            phase: Phase::Idle,
            stats: WatchStats::default(),
        }
    }
}

impl DutyState {
    /// Watchpoints were (re)armed: a window starts now.
    pub fn start(&mut self, now: Instant, cpu: Duration) {
        self.stop(now, cpu);
        self.stats.windows += 1;
        self.phase = Phase::Armed {
            since: now,
            cpu0: cpu,
            hits: 0,
            spent: false,
            ops: Duration::ZERO,
        };
    }

    /// Watchpoints were armed from idle, but the window is to wait before it opens
    /// ([`crate::company`]): a cooldown that owes nothing, so the next tick may open it.
    pub fn start_waiting(&mut self, now: Instant, cpu: Duration) {
        self.stop(now, cpu);
        self.phase = Phase::Cooling {
            since: now,
            cpu0: cpu,
            win_cpu0: cpu,
            win_since: now,
            hits: 0,
            ops: Duration::ZERO,
        };
    }

    /// Whether a cooldown is over by `now`, the target having used `cpu` (the next tick
    /// would open the window).
    pub fn cooldown_paid(&self, duty: &DutyCycle, now: Instant, cpu: Duration) -> bool {
        self.paid_at(duty)
            .is_some_and(|(cpu_at, wall_at)| cpu >= cpu_at && now >= wall_at)
    }

    /// While cooling: the target CPU time and the wall time by which the cooldown is paid
    /// (both must be reached).
    fn paid_at(&self, duty: &DutyCycle) -> Option<(Duration, Instant)> {
        match self.phase {
            Phase::Cooling {
                win_cpu0,
                win_since,
                hits,
                ops,
                ..
            } => {
                let need = duty.cost_needed(hits, ops);
                Some((win_cpu0 + need, win_since + need))
            }
            _ => None,
        }
    }

    /// laser spent `d` of wall time on the events of the window armed or being paid for
    /// (opening them on every thread, renewing spent limits, closing them). On a target
    /// busy on every CPU that time is taken from one of its threads (the reader runs
    /// real-time), and in a program whose threads wait for each other from all of them: it
    /// is a cost of watching like the traps, and the cooldown pays for it too. Measured
    /// with `scripts/watch-cost` (two threads in barrier rounds, sixteenth session): opening
    /// a window of 4 words on 2 threads × 2 CPUs took the reader 0.54 ms, as long as 40
    /// traps; counted nowhere before, the watch windows cost 4.2% of the wall time under a
    /// 2% budget.
    pub fn charge(&mut self, d: Duration) {
        self.stats.ops_time += d;
        self.add_cost(d);
    }

    /// laser's own work between two polls while a window counted: noted for the report, not
    /// charged. laser reads at real-time priority while a window counts, so each of its
    /// wake-ups takes a CPU from a target thread, and on parsec streamcluster this work was as
    /// large as the window events' (laser's thread used 33–39 ms with the watch, 8 without,
    /// 4 of them charged as window-event work). Charged, it cut the windows of a program that
    /// starts its threads afresh every few milliseconds enough to lose its flag's true
    /// sharing in 6 of 8 runs (`round_threads`, where 8 of 8 found it uncharged; it found
    /// streamcluster and the suites as before; benchmarks/RESULTS.md, thirtieth session).
    pub fn note_reader(&mut self, d: Duration) {
        self.stats.reader_time += d;
    }

    /// `n` context switches of watched threads while armed, at `each` (`crate::switches`):
    /// paid for like [`DutyState::charge`].
    pub fn charge_switches(&mut self, n: u64, each: Duration) {
        let d = each.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX));
        self.stats.switches += n;
        self.stats.switch_time += d;
        self.add_cost(d);
    }

    fn add_cost(&mut self, d: Duration) {
        match &mut self.phase {
            Phase::Armed { ops, .. } | Phase::Cooling { ops, .. } => *ops += d,
            Phase::Idle => {}
        }
    }

    /// Disarmed or target gone: account the phase in progress and go idle.
    pub fn stop(&mut self, now: Instant, cpu: Duration) {
        match self.phase {
            Phase::Armed {
                since, cpu0, hits, ..
            } => {
                self.stats.armed_time += now.saturating_duration_since(since);
                self.stats.target_cpu += cpu.saturating_sub(cpu0);
                self.stats.unpaid_hits += hits;
            }
            Phase::Cooling {
                since, cpu0, hits, ..
            } => {
                self.stats.cooldown_time += now.saturating_duration_since(since);
                self.stats.target_cpu += cpu.saturating_sub(cpu0);
                self.stats.unpaid_hits += hits;
            }
            Phase::Idle => {}
        }
        self.phase = Phase::Idle;
    }

    /// An event of the armed window spent its kernel limit, its share of the cap
    /// (`Watcher::note_hit`): that thread's accesses to that word are no longer trapped, so
    /// the window has stopped counting, and the next tick ends it (a rollover if its hits are
    /// paid for already, a cooldown if not) rather than leaving it armed and blind until
    /// the other events spend theirs or the window's time runs out.
    pub fn limit_spent(&mut self) {
        if let Phase::Armed { spent, .. } = &mut self.phase {
            *spent = true;
        }
    }

    /// The events' limits were set anew (a re-armed set opens fresh events): a spent one is
    /// no longer in force.
    pub fn limits_renewed(&mut self) {
        if let Phase::Armed { spent, .. } = &mut self.phase {
            *spent = false;
        }
    }

    pub fn is_armed(&self) -> bool {
        matches!(self.phase, Phase::Armed { .. })
    }

    pub fn is_idle(&self) -> bool {
        self.phase == Phase::Idle
    }

    pub fn is_cooling(&self) -> bool {
        matches!(self.phase, Phase::Cooling { .. })
    }

    /// When the next tick is due, given the target's CPU time so far (`cpu`) and how many
    /// CPUs it can run on at once (`cpus`).
    ///
    /// - Armed: never on a timer. A window ends when its hits reach the cap or an event
    ///   spends its share of it ([`DutyState::limit_spent`]), and the hits themselves wake
    ///   the reader (`wakeup_events`, see `Watcher::limit`); a window with
    ///   fewer hits simply runs on (its traps are cheaper than the cap allows), and whatever
    ///   poll comes next rolls it over. A timer at every window end would wake laser 50 times
    ///   a second for nothing, and each wakeup takes a CPU from the target for a moment.
    /// - Cooling: at the earliest moment the target can have used the CPU time the cooldown
    ///   needs, running on every CPU: (needed − used) / cpus from now, and not before the
    ///   window's wall time is paid too (at least [`MIN_RECHECK`] from now). A target that
    ///   runs slower than that is re-checked again then.
    pub fn next_deadline(
        &self,
        duty: &DutyCycle,
        now: Instant,
        cpu: Duration,
        cpus: u32,
    ) -> Option<Instant> {
        let (cpu_at, wall_at) = self.paid_at(duty)?;
        let cpu_left = cpu_at.saturating_sub(cpu) / cpus.max(1);
        let wall_left = wall_at.saturating_duration_since(now);
        Some(now + cpu_left.max(wall_left).max(MIN_RECHECK))
    }

    /// `new_hits` watch samples were read; the target has used `cpu` in total so far.
    pub fn tick(&mut self, duty: &DutyCycle, now: Instant, new_hits: u64, cpu: Duration) -> Action {
        self.stats.hits += new_hits;
        match self.phase {
            Phase::Idle => {
                // Stragglers of a window that was stopped: never paid for.
                self.stats.unpaid_hits += new_hits;
                Action::Nothing
            }
            Phase::Armed {
                since,
                cpu0,
                hits,
                spent,
                ops,
            } => {
                let hits = hits + new_hits;
                let armed = now.saturating_duration_since(since);
                if hits < duty.max_hits_per_window && armed < duty.window && !spent {
                    self.phase = Phase::Armed {
                        since,
                        cpu0,
                        hits,
                        spent,
                        ops,
                    };
                    return Action::Nothing;
                }
                self.stats.armed_time += armed;
                let used = cpu.saturating_sub(cpu0);
                self.stats.target_cpu += used;
                let need = duty.cost_needed(hits, ops);
                if used >= need && armed >= need {
                    // Cheap window: the next one starts at once, events stay enabled.
                    self.stats.windows += 1;
                    self.phase = Phase::Armed {
                        since: now,
                        cpu0: cpu,
                        hits: 0,
                        spent: false,
                        ops: Duration::ZERO,
                    };
                    if hits > 0 {
                        Action::Rollover
                    } else {
                        Action::Nothing
                    }
                } else {
                    self.phase = Phase::Cooling {
                        since: now,
                        cpu0: cpu,
                        win_cpu0: cpu0,
                        win_since: since,
                        hits,
                        ops,
                    };
                    Action::Disable
                }
            }
            Phase::Cooling {
                since,
                cpu0,
                win_cpu0,
                win_since,
                hits,
                ops,
            } => {
                // Hits read now were written before the disable took effect (the reader can
                // be preempted between draining and disabling): they belong to the window.
                let hits = hits + new_hits;
                let need = duty.cost_needed(hits, ops);
                if cpu < win_cpu0 + need || now < win_since + need {
                    self.phase = Phase::Cooling {
                        since,
                        cpu0,
                        win_cpu0,
                        win_since,
                        hits,
                        ops,
                    };
                    return Action::Nothing;
                }
                self.stats.cooldown_time += now.saturating_duration_since(since);
                self.stats.target_cpu += cpu.saturating_sub(cpu0);
                self.stats.windows += 1;
                self.phase = Phase::Armed {
                    since: now,
                    cpu0: cpu,
                    hits: 0,
                    spent: false,
                    ops: Duration::ZERO,
                };
                Action::Enable
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn default_cap_keeps_a_busy_window_under_the_bound() {
        let d = DutyCycle::default();
        assert_eq!(d.max_slowdown, 0.01);
        assert_eq!(d.model, CostModel::Full);
        // 100 ms · 1 % / 4.5 µs = 222.2 → 222 hits.
        assert_eq!(d.max_hits_per_window, 222);
        let m = d.with_hit_cost(d.hit_cost * 4);
        assert_eq!(m.max_hits_per_window, 55);
        assert!(m.calibrate);
        assert_eq!(m.model, CostModel::Full);
    }

    /// A 20 ms, 2% policy at 10 µs a hit (cap 40) whose first window reached its cap 1 ms
    /// after it began, with 2 ms of target CPU used: it is cooling.
    fn capped_window() -> (DutyCycle, DutyState, Instant) {
        let d = DutyCycle::new(20 * MS, 0.02, Duration::from_micros(10));
        let mut st = DutyState::default();
        let t0 = Instant::now();
        st.start(t0, Duration::ZERO);
        assert_eq!(st.tick(&d, t0 + MS, 40, 2 * MS), Action::Disable);
        (d, st, t0)
    }

    /// The cooldown is re-checked when the target could first have paid for it, in CPU time
    /// running on all its CPUs and in wall time since the window began, not on a fixed short
    /// timer.
    #[test]
    fn cooldown_recheck_waits_for_the_cpu_and_wall_time_still_owed() {
        let (d, mut st, t0) = capped_window();
        // 40 hits · 10 µs = 0.4 ms of traps → 20.4 ms of target CPU and of wall time per
        // cycle; 2 ms of CPU and 1 ms of wall time used.
        let need = d.cpu_needed(40);
        assert_eq!(need, Duration::from_micros(20_400));
        // 18.4 ms of CPU owed on 2 CPUs is 9.2 ms, but 19.4 ms of wall time is owed too.
        let at = st.next_deadline(&d, t0 + MS, 2 * MS, 2).unwrap();
        assert_eq!(at - (t0 + MS), Duration::from_micros(19_400));
        // Later, CPU time is what is owed: (20.4 − 4) / 2 = 8.2 ms against 5.4 ms of wall.
        let cpu_bound = st.next_deadline(&d, t0 + 15 * MS, 4 * MS, 2).unwrap();
        assert_eq!(cpu_bound - (t0 + 15 * MS), Duration::from_micros(8_200));
        // One CPU: twice as long. Almost paid: the floor, not a busy loop.
        let one = st.next_deadline(&d, t0 + 15 * MS, 4 * MS, 1).unwrap();
        assert_eq!(one - (t0 + 15 * MS), Duration::from_micros(16_400));
        let late = st.next_deadline(&d, t0 + need, need, 2).unwrap();
        assert_eq!(late - (t0 + need), MIN_RECHECK);
        // A target slower than that is simply re-checked again.
        assert_eq!(st.tick(&d, at, 0, 12 * MS), Action::Nothing);
        assert!(st.next_deadline(&d, at, 12 * MS, 2).unwrap() > at);
        assert_eq!(st.tick(&d, at + 10 * MS, 0, need), Action::Enable);
    }

    /// A hot word on a target busy on two CPUs: its CPU time pays the cooldown in half the
    /// wall time, but a trap costs a program whose threads wait for each other its whole
    /// duration, so the cooldown lasts until the wall time is paid too.
    #[test]
    fn busy_parallel_target_cools_down_on_wall_time_too() {
        let (d, mut st, t0) = capped_window();
        // 20.4 ms of CPU and of wall time per cycle.
        let need = d.cpu_needed(40);
        // CPU paid at 10.2 ms of wall time (2 CPUs busy): not enough.
        assert_eq!(st.tick(&d, t0 + 11 * MS, 0, need), Action::Nothing);
        assert_eq!(st.tick(&d, t0 + 20 * MS, 0, 40 * MS), Action::Nothing);
        assert_eq!(st.tick(&d, t0 + need, 0, 41 * MS), Action::Enable);
        // A window whose cap is reached only after its wall time is paid rolls over at once.
        assert_eq!(
            st.tick(&d, t0 + need + 25 * MS, 40, 100 * MS),
            Action::Rollover
        );
        assert!(st.is_armed());
        let traps = d.hit_cost * 40;
        assert!(traps.as_secs_f64() <= 0.02 / 1.02 * need.as_secs_f64() + 1e-12);
    }

    #[test]
    fn cpu_needed_makes_traps_at_most_s_of_useful_work() {
        let d = DutyCycle::new(10 * MS, 0.02, Duration::from_micros(5));
        let need = d.cpu_needed(1000); // 5 ms of traps
        let traps = 5e-3;
        let useful = need.as_secs_f64() - traps;
        assert!((traps / useful - 0.02).abs() < 1e-9, "{need:?}");
    }

    /// A hot word on a target that gets a quarter of a CPU: the window hits its cap after
    /// 1 ms; cooling lasts until the target has used enough CPU, not wall time.
    #[test]
    fn hot_window_cools_down_on_target_cpu_time() {
        let d = DutyCycle::new(20 * MS, 0.05, Duration::from_micros(10)); // cap 100
        let mut st = DutyState::default();
        let t0 = Instant::now();
        st.start(t0, Duration::ZERO);
        assert_eq!(st.tick(&d, t0 + MS, 50, MS / 4), Action::Nothing);
        assert_eq!(st.tick(&d, t0 + 2 * MS, 60, MS / 2), Action::Disable);
        assert!(!st.is_armed());
        // 110 hits · 10 µs = 1.1 ms of traps → 23.1 ms of target CPU per cycle.
        let need = d.cpu_needed(110);
        assert_eq!(need, Duration::from_micros(23_100));
        // Wall time alone does not end the cooldown.
        assert_eq!(st.tick(&d, t0 + 80 * MS, 0, 20 * MS), Action::Nothing);
        // A straggler read after the disable extends it (110 → 120 hits: 25.2 ms).
        assert_eq!(st.tick(&d, t0 + 90 * MS, 10, 24 * MS), Action::Nothing);
        assert_eq!(st.tick(&d, t0 + 95 * MS, 0, 25 * MS), Action::Nothing);
        assert_eq!(st.tick(&d, t0 + 96 * MS, 0, 26 * MS), Action::Enable);
        assert!(st.is_armed());
        assert_eq!(st.stats.windows, 2);
        assert_eq!(st.stats.hits, 120);
        assert_eq!(st.stats.target_cpu, 26 * MS);
        assert_eq!(st.stats.unpaid_hits, 0);
        // Stopping mid-window leaves that window's hits unpaid.
        st.tick(&d, t0 + 97 * MS, 7, 26 * MS);
        st.stop(t0 + 98 * MS, 27 * MS);
        assert_eq!(st.stats.unpaid_hits, 7);
        let traps = d.hit_cost * 120;
        assert!(traps.as_secs_f64() <= 0.05 / 1.05 * st.stats.target_cpu.as_secs_f64() + 1e-12);
    }

    #[test]
    fn quiet_window_rolls_over_without_touching_events() {
        let d = DutyCycle::new(20 * MS, 0.05, Duration::from_nanos(4500));
        let mut st = DutyState::default();
        let t0 = Instant::now();
        st.start(t0, Duration::ZERO);
        // Its 3 hits may have spent an event's kernel limit (the watcher renews it).
        assert_eq!(st.tick(&d, t0 + 25 * MS, 3, 40 * MS), Action::Rollover);
        assert!(st.is_armed());
        assert_eq!(st.stats.windows, 2);
        // No timer while armed: the hits wake the reader when the cap is near.
        assert_eq!(st.next_deadline(&d, t0 + 25 * MS, 40 * MS, 2), None);
        st.stop(t0 + 30 * MS, 45 * MS);
        assert!(st.is_idle());
        assert_eq!(st.stats.armed_time, 30 * MS);
        assert_eq!(st.stats.target_cpu, 45 * MS);
        assert_eq!(st.next_deadline(&d, t0, 45 * MS, 2), None);
        assert_eq!(st.tick(&d, t0 + 40 * MS, 0, 50 * MS), Action::Nothing);
    }

    /// laser's own work on a window's events is paid for by its cooldown like its traps, and
    /// a cooldown closing the events carries what the closing cost.
    #[test]
    fn work_on_the_events_lengthens_the_cooldown() {
        let d = DutyCycle::new(20 * MS, 0.05, Duration::from_micros(10)); // cap 100
        let mut st = DutyState::default();
        let t0 = Instant::now();
        st.start(t0, Duration::ZERO);
        st.charge(Duration::from_micros(500)); // opening the window
        assert_eq!(st.tick(&d, t0 + MS, 100, MS), Action::Disable);
        st.charge(Duration::from_micros(100)); // closing it
        let ops = Duration::from_micros(600);
        let need = d.cost_needed(100, ops);
        assert_eq!(need, d.cpu_needed(160), "600 µs is the price of 60 hits");
        let short = d.cpu_needed(100);
        assert_eq!(st.tick(&d, t0 + short, 0, short), Action::Nothing);
        assert_eq!(st.tick(&d, t0 + need, 0, need), Action::Enable);
        assert_eq!(st.stats.ops_time, ops);
        // Idle: nothing to pay for, but the total keeps it.
        st.stop(t0 + need, need);
        st.charge(Duration::from_micros(50));
        assert_eq!(st.stats.ops_time, ops + Duration::from_micros(50));
    }

    /// An event that spent its share of the cap ends the window at the next tick whatever
    /// its hits: a cooldown for them (a rollover if they were paid for). Fresh limits (a
    /// re-armed set) take that back.
    #[test]
    fn a_spent_limit_ends_the_window_at_the_next_tick() {
        let d = DutyCycle::new(20 * MS, 0.05, Duration::from_micros(10)); // cap 100
        let mut st = DutyState::default();
        let t0 = Instant::now();
        st.start(t0, Duration::ZERO);
        st.limit_spent();
        st.limits_renewed();
        assert_eq!(st.tick(&d, t0 + MS, 30, MS), Action::Nothing, "renewed");
        st.limit_spent();
        assert_eq!(st.tick(&d, t0 + 2 * MS, 20, 2 * MS), Action::Disable);
        assert!(st.is_cooling());
        // 50 hits, not the cap of 100: the cooldown is what those cost.
        let need = d.cpu_needed(50);
        assert_eq!(st.tick(&d, t0 + need, 0, need), Action::Enable);
        // Paid for already (a quiet word): a spent window rolls over at once.
        st.limit_spent();
        assert_eq!(
            st.tick(&d, t0 + need + 30 * MS, 2, need + 30 * MS),
            Action::Rollover
        );
        assert_eq!(
            st.tick(&d, t0 + need + 31 * MS, 1, need + 31 * MS),
            Action::Nothing
        );
    }

    /// A window without hits spent no event's limit: its rollover leaves the events alone.
    #[test]
    fn a_window_armed_to_wait_opens_at_the_next_tick_and_counts_once() {
        let d = DutyCycle::default();
        let t0 = Instant::now();
        let mut st = DutyState::default();
        st.start_waiting(t0, Duration::ZERO);
        assert!(st.is_cooling());
        assert!(st.cooldown_paid(&d, t0, Duration::ZERO), "it owes nothing");
        assert_eq!(st.stats.windows, 0);
        assert_eq!(st.tick(&d, t0 + MS, 0, Duration::ZERO), Action::Enable);
        assert!(st.is_armed());
        assert_eq!(st.stats.windows, 1);
        // A cooldown that owes time is not paid before it.
        let (d, st, t0) = capped_window();
        assert!(st.is_cooling());
        let need = d.cpu_needed(40);
        assert!(!st.cooldown_paid(&d, t0 + need / 2, need));
        assert!(!st.cooldown_paid(&d, t0 + need, need / 2));
        assert!(st.cooldown_paid(&d, t0 + need, need));
    }

    #[test]
    fn a_rollover_without_hits_touches_nothing() {
        let d = DutyCycle::new(20 * MS, 0.05, Duration::from_nanos(4500));
        let mut st = DutyState::default();
        let t0 = Instant::now();
        st.start(t0, Duration::ZERO);
        assert_eq!(st.tick(&d, t0 + 25 * MS, 0, 40 * MS), Action::Nothing);
        assert!(st.is_armed());
        assert_eq!(st.stats.windows, 2);
    }
}
