//! Where the 4 debug registers point during a live run: the detector's top candidate lines in
//! turn, each until its watch estimate is good, then nothing until it is due for a refresh;
//! between those turns, survey turns over lines no sample has shown contended yet
//! ([`laser_detect::model::survey`]), each surveyed once per [`SURVEY_REFRESH`].
//!
//! ```text
//!   line A  [watch]   [watch]......settled (≥ 400 transfers)......[watch] refresh after 5 s
//!   survey         [s1]      [s2][s3][s4]...[s1][s2]…  each again ≥ 300 ms later
//!   traps   ███████████████████                                 ███
//! ```
//! Watching costs the target a trap per access to the watched words; once an estimate has
//! ±5% statistical error, more of the same adds cost, not knowledge. A survey turn lasts
//! [`SURVEY_TURN`] of *counting* time (a cooldown of the trap budget does not use it up) or
//! [`SURVEY_WINDOWS`] windows' worth of hits: enough to see two threads on a line contended
//! at the report threshold, little enough to fit many lines into the budget.
//!
//! A candidate line's turn watches the words samples showed accessed on it; the debug
//! registers those leave free watch its other words, nearest first and in turn from one turn
//! to the next ([`Steering::with_unsampled_words`]): an access too rare in its loop for a
//! timer sample to show still traps there. Once its windows have seen it contended, its other
//! words also get looks of their own in the survey's place, alone and then with one sampled
//! word's stores ([`Steering::unsampled_look`]): a hot line's windows fill at their cap with
//! its hot accesses, and an access made once every few hundred iterations is in few of them.
//!
//! Two views a single kind of window lacks:
//! - a store-only survey window that one thread filled with its stores is followed by one
//!   read+write *probe* window on the words around those stores (`Detector::edge_probe`):
//!   a neighbour that only reads there is invisible to store-only windows. The survey turn
//!   ends at such a window (its next windows would see the same thread's stores). A probe
//!   that did not see two threads is followed by one on the words around the stores it did
//!   not watch (the word a neighbour reads need not be the one next to the stores), and
//!   tried again later (the neighbour may have been off its CPU, waiting on a page fault,
//!   for that window). A probe takes the survey's slot: while a candidate line is due, a
//!   candidate turn comes first;
//! - a candidate line whose read+write windows are filled by reads (trap time over half the
//!   armed time, or windows that end at their cap early: [`filled_at_cap`]) and see few
//!   stores alternates between read+write and store-only turns: stores that come a few
//!   times a millisecond fall between read-filled windows.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use laser_detect::model::line_model::byte_mask;
use laser_detect::model::survey::{SurveySource, SurveyTarget};
use laser_detect::{Detector, LineEstimate, WatchCandidate};
use laser_driver::{Session, WatchKind, WatchSpec, MAX_WATCHES};

use crate::live_heap::ProcMem;
use std::collections::HashMap;

/// How long one candidate line keeps the watchpoints before the next one gets them, once a
/// window of its turn has counted.
const TURN: Duration = Duration::from_millis(100);
/// The longest a candidate turn waits for a window that counts (a cooldown of a window
/// that overshot its cap can be longer).
const MAX_CANDIDATE_TURN: Duration = Duration::from_millis(400);
/// Transfers after which a line's estimate is good enough (±1/√n ≈ ±5%).
const ENOUGH_TRANSFERS: u64 = 400;
/// Armed time after which a line with few transfers is known to be quiet.
const ENOUGH_ARMED_S: f64 = 0.3;
/// A settled line is watched again after this long (contention can change by phase).
const REFRESH: Duration = Duration::from_secs(5);
/// Looks at a contended line's unsampled words per [`REFRESH`] at most
/// ([`Steering::unsampled_look`]): every group of them with two anchors and with none, on a
/// 64-byte line whose samples showed two words.
const LOOKS_PER_LINE: usize = 6;
/// Transfers a line's windows must have seen before its unsampled words get looks: its
/// contention is confirmed, so the look's cost goes where the report will show a line.
const LOOK_AFTER_TRANSFERS: u64 = 20;
/// Fewer transfers confirm it too, when even the rate less two standard errors is above the
/// report threshold: a lock word taken by two threads that seldom run side by side fills
/// every window at its cap with one thread's accesses, and a run had 15 transfers on a line
/// rated at 14 times the threshold, and no look.
const LOOK_AFTER_TRANSFERS_CLEAR: u64 = 8;
/// Counting time of one survey turn: a line contended at the default threshold (1,000
/// transfers/s) shows ~20 transfers in it. Store-only windows on quiet words cost no traps,
/// so turns are short and many.
pub const SURVEY_TURN: Duration = Duration::from_millis(20);
/// Trap-budget windows a survey turn spans at most. A line one thread reads hot fills a
/// window in microseconds; the other thread's rare store shows up in some windows, not all,
/// so a turn spans several (each after its cooldown), then moves on.
const SURVEY_WINDOWS: u64 = 4;
/// A surveyed target is surveyed again after this long at the earliest: contention that
/// comes in phases (a flag stored while one loop runs, not the next) is caught in a later
/// window. A small set of targets is not watched back to back.
const SURVEY_REFRESH: Duration = Duration::from_millis(300);
/// Share of the run's wall time that armed watchpoints may cost the target in slowed work
/// with no trap to show for it (fast strings off: [`laser_detect::model::armed_cost`]). The
/// trap budget covers the traps; this covers the rest. Sampling costs ~1%; with this the
/// whole run stays within the 2–3% goal on programs that copy with `rep movs`. As a share of
/// the trap budget (`--watch-budget`): 0.75% at the default 1%.
const ARMED_COST_SHARE: f64 = 0.75;
/// A survey target whose turn ended early with one thread alone trapped (a window it filled
/// with its stores) is surveyed again after this long at the earliest, ahead of the plan's
/// order: the threads that share it may have been off their CPUs for that window. In
/// round_threads (2 150) the flag's line had one 1.2 ms window a run, filled by one assign
/// thread's 47 stores while its twin waited 3 ms for a CPU, and the line was due again only
/// after the run had ended (2 misses in 20 runs, 3 in 15).
const SURVEY_RETRY_AFTER: Duration = SURVEY_TURN;
/// Such retries of one target within a [`SURVEY_REFRESH`]: a line one thread alone stores to
/// (its own counters) costs a few more windows, not a turn in every round.
const SURVEY_RETRIES: u32 = 2;
/// A line probed around one thread's stores ([`Detector::edge_probe`]) is probed again
/// after this long at the earliest.
const PROBE_REFRESH: Duration = Duration::from_secs(1);
/// Probes a line may have within one [`PROBE_REFRESH`] while none of them has seen two
/// threads, each [`SURVEY_REFRESH`] after the last at the earliest. Phoenix histogram -O0's
/// reading thread filled a probe alone while the storing one waited 24 ms on page faults of
/// its mmapped input, and with one probe per second that run (0.7 s) never saw the pair.
const PROBE_TRIES: u32 = 3;
/// Windows a code turn spans at most (or [`SURVEY_TURN`] of counting time, or
/// [`SURVEY_WINDOWS`] windows' worth of hits, whichever comes first).
const CODE_WINDOWS: u64 = SURVEY_WINDOWS;
/// How often the globals are read again for heap pointers (programs allocate as they go).
const POINTERS_EVERY: Duration = Duration::from_millis(200);
/// An instruction given a code turn gets the next one this long after at the earliest: a few
/// turns over a run are enough to rate the loop (each window sees it on whichever line is hot
/// then), and every execution traps while it is watched.
const CODE_REFRESH: Duration = Duration::from_millis(150);
/// The report threshold code turns aim at when steering is not told one (`--threshold`'s
/// default).
const DEFAULT_THRESHOLD: f64 = 1000.0;
/// Counting time of one front window: long enough for a few hundred exact accesses on a line
/// that stays hot for milliseconds, short enough to be back on the moving code before it has
/// moved far.
const FRONT_TURN: Duration = Duration::from_millis(8);
/// Front windows one code turn leads to before steering moves on (code turn, front, code
/// turn, front, …): enough to rate several of the lines the code moves along.
const FRONTS_PER_CHAIN: u32 = 4;
/// How often steering looks at a code turn while it counts: a code window reaches its hit
/// cap about a millisecond after it opens (every execution traps), and the front window must
/// start inside that window, on what is left of its budget.
const MOVING_POLL: Duration = Duration::from_micros(50);
/// The longest wait between looks at a code turn that has seen no new hit: each look that
/// finds none doubles the wait from [`MOVING_POLL`] up to this. Code that runs rarely would
/// otherwise wake laser, real-time on the target's CPUs, every 50 µs of its window for
/// nothing (a program that starts its threads afresh every few milliseconds: ~1,000 wake-ups
/// and ~10 ms of laser's CPU a second). A burst after a quiet spell is seen within this, or at
/// the window's hit cap, which wakes the reader anyway.
const MOVING_POLL_MAX: Duration = Duration::from_micros(1600);

/// Store-only turns in a row, each ending on a window that one thread alone trapped, after
/// which a line's alternation skips its store-only turns for [`STORES_ALONE_FOR`]: such
/// windows see one thread's stores and nothing they could contend with, and each one's
/// cooldown delays the line's read+write windows, which see both. Phoenix histogram -O0 on
/// its false-sharing input (thread 0 stores a counter on every pixel, thread 1 reads its
/// header from that line every iteration): 5–6 store-only windows a run, each of one thread,
/// against 1–2 read+write windows with both threads' 45 hits each (recordings, thirty-first
/// session); 4 runs in 10 rated the line from one short window (10–13 events) and about one
/// in eight missed it. With this, 44–126 events in 10 of 10. Phoenix kmeans' `modified`,
/// which both threads store, keeps its store-only turns.
const STORES_ALONE_TURNS: u32 = 2;
/// How long a line's store-only turns are skipped once [`STORES_ALONE_TURNS`] is reached:
/// then one is tried again, in case the stores of another thread have come.
const STORES_ALONE_FOR: Duration = Duration::from_secs(1);

/// The shortest wait before the next look at a survey or probe turn: what is left of its
/// counting time, but not less ([`Steering::poll_wait`]).
const SURVEY_POLL_MIN: Duration = Duration::from_millis(1);

/// The longest wait of the monitor loop between two steps: a turn whose look has no time
/// of its own (a code turn's cooldown, a front window) is looked at after this, or at its
/// hits.
pub const MAX_POLL: Duration = Duration::from_millis(50);

/// The wait before steering's first step: the launch's trap guard is started
/// `laser_driver::GUARD_DELAY` (5 ms) after the launch and windows open once it runs. At the
/// loop's idle poll ([`MAX_POLL`]) Phoenix histogram -O0's first window opened 63 ms after
/// its threads started, of a 0.4 s run.
const FIRST_STEP: Duration = Duration::from_millis(8);
/// How long the loop polls every [`FIRST_STEP`] at most: windows that cannot open (the trap
/// guard failed, the debug registers refused) must not wake laser 125 times a second for
/// the whole run.
const FIRST_STEP_FOR: Duration = Duration::from_millis(250);

/// The longest wait between looks while watchpoints count and their fast-string cost is not
/// known yet (`Detector::armed_slowdown` is `None`): a program that copies with `rep movs`
/// runs ~2x slower armed, and a survey turn, looked at 20 ms after it was armed and ended
/// at the look after (its first look counts no time: `note_step`), paid ~40 ms of that
/// before the estimate could stop it. At ~250 samples/s a CPU, 4 ms brings a sample or two
/// a look; a run has a few such looks, until its estimate forms.
const ARMED_COST_LOOK: Duration = Duration::from_millis(4);

/// The wait before the next look at a counting code turn, after a look that waited `wait`
/// and did or did not find new hits ([`MOVING_POLL_MAX`]).
fn moving_poll_after(wait: Duration, new_hits: bool) -> Duration {
    if new_hits {
        MOVING_POLL
    } else {
        (wait * 2).clamp(MOVING_POLL, MOVING_POLL_MAX)
    }
}

/// A line whose estimate was good at `at`, with the totals it had then.
#[derive(Clone, Copy, Debug)]
struct Settled {
    line: u64,
    at: Instant,
    transfers: u64,
    armed_s: f64,
}

/// What the armed turn is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Turn {
    Candidate,
    Survey,
    /// Instruction breakpoints on code that contends on lines too briefly hot for a data
    /// window ([`Detector::code_candidates`]).
    Code,
    /// A data window on the line a code turn has just seen contended, while it is hot
    /// ([`Detector::code_front`]); the code turn resumes after it.
    Front,
    /// One read+write window around what one thread stored in a store-only survey
    /// turn ([`Detector::edge_probe`]).
    Probe,
    /// One window on a contended line's unsampled words and an anchor
    /// ([`Steering::unsampled_look`]).
    Look,
}

#[derive(Default)]
pub struct Steering {
    /// The armed turn and when it started (`None`: nothing armed by a turn).
    turn: Option<(Turn, Instant)>,
    next: usize,
    settled: Vec<Settled>,
    idle: bool,
    /// Survey targets (by key) and when each was last surveyed.
    surveyed: HashMap<(u64, u64), Instant>,
    /// The survey turn's counting time so far, the time it was last added up, and the
    /// watcher's hit count at the turn's start.
    counted: Duration,
    last_step: Option<Instant>,
    hits_at_start: u64,
    /// The watcher's window count when the armed code turn was armed ([`CODE_WINDOWS`]).
    code_windows_from: u64,
    /// Heap blocks the program's globals pointed to at the last look, and when that was.
    pointed: Vec<(u64, u64)>,
    pointers_read: Option<Instant>,
    mem: Option<ProcMem>,
    /// Candidate lines whose read+write windows trapped on most accesses: watched for
    /// stores only from then on.
    read_hot: Vec<u64>,
    /// Candidate lines whose read+write windows trapped on most accesses where windows end
    /// at their cap: their turns alternate between store-only (`true`: the last one was)
    /// and read+write windows.
    alternating: HashMap<u64, bool>,
    /// The survey tier ([`SurveySource::ALL`] index) whose turn is next.
    next_tier: usize,
    /// When steering started, and the time watchpoints have counted since: the time they
    /// were in the debug registers, which is when fast strings run slow. A turn's cooldowns
    /// do not count (a launch window's events are closed then, an attached thread's are
    /// disabled). Counted with them, a turn armed the whole run was charged for all of it:
    /// one `rep movs` sample among 132 armed ones (an estimated 0.8% slowdown) put
    /// streamcluster's steering to sleep for a second of its 1.7 s, and its false sharing
    /// went unrated.
    started: Option<Instant>,
    armed: Duration,
    /// Instructions given code turns, and when each last was.
    coded: HashMap<u64, Instant>,
    /// The report's threshold (`None`: the default), which code turns aim at.
    threshold: Option<f64>,
    /// The instructions of the code turn being followed, and how many more front windows it
    /// may lead to in this chain.
    following: Option<(Vec<u64>, u32)>,
    /// The armed code turn looks at instructions on the strength of neighbouring stores
    /// alone (`Detector::neighbour_candidates`): one window, then the rotation goes on.
    exploring: bool,
    /// The next survey slot goes to such a look, if one is due.
    explore_next: bool,
    /// Whether the watchpoints were counting at the last step (not cooling down).
    counting: bool,
    /// When the window the last step armed began to count, for the next step to count the
    /// turn's time from (`note_step`: that step found it counting, but not the one before).
    counts_from: Option<Instant>,
    /// The loop will call [`Steering::step`] ([`Steering::expect_steps`]): until the first
    /// step has armed, and until this, it polls every [`FIRST_STEP`].
    steps_expected: Option<Instant>,
    /// Whether the watchpoints counted when the last step ended (after it re-pointed them),
    /// and the time up to which their armed time is in `armed`.
    armed_after_step: bool,
    armed_mark: Option<Instant>,
    /// When the loop's wait, cut short for the armed cost's look, ends, and when the turn's
    /// own look is due ([`Self::poll_wait`]; `None`: from the next wait on).
    cost_look_at: Option<Instant>,
    turn_look_at: Option<Instant>,
    /// The detector's estimate of how much slower the program runs armed, at the last step
    /// (`Detector::armed_slowdown`: fast strings), and the share of the run's time that
    /// slowdown may cost ([`ARMED_COST_SHARE`] of the trap budget).
    slowdown: Option<f64>,
    armed_budget: f64,
    /// The wait before the next look at a counting code turn, and the watcher's hit count
    /// at the last look ([`MOVING_POLL_MAX`]).
    moving_poll: Duration,
    hits_at_look: u64,
    /// What the armed store-only survey turn watches (a target from the plan).
    surveying: Option<WatchCandidate>,
    /// Why the last survey target was chosen (its plan tier): for `LASER_TRACE_STEERING`.
    survey_source: Option<SurveySource>,
    /// Whether that target watches loads too (`SurveyTarget::reads`).
    survey_reads: bool,
    /// What the armed probe watches, and the lines probed so far.
    probing: Option<WatchCandidate>,
    probed: HashMap<u64, Probed>,
    /// A probe due, waiting for the survey's slot ([`Steering::step_turn`]).
    pending_probe: Option<WatchCandidate>,
    /// The alternating line whose store-only candidate turn is armed, if one is.
    storing: Option<u64>,
    /// Alternating lines whose store-only turns in a row each ended on a window one thread
    /// alone trapped, how many, and when the last did ([`STORES_ALONE_TURNS`]).
    stores_alone: HashMap<u64, (u32, Instant)>,
    /// Survey targets (by key) whose turns one thread alone filled ([`SURVEY_RETRIES`]).
    alone: HashMap<(u64, u64), Alone>,
    /// Per candidate line and kind of window, where its next turn's free debug registers
    /// start in the line's unsampled words ([`Steering::with_unsampled_words`]).
    unsampled_next: HashMap<(u64, WatchKind), usize>,
    /// Per contended line, its looks at its unsampled words since the first of them
    /// ([`Steering::unsampled_look`]).
    looked: HashMap<u64, Looks>,
}

/// A survey target's turns that one thread alone filled with its stores, in a row.
#[derive(Clone, Copy, Debug)]
struct Alone {
    /// When the first of them ended.
    first: Instant,
    turns: u32,
}

impl Alone {
    /// One more such turn ended at `now` (the count starts again each [`SURVEY_REFRESH`]).
    fn note(entry: Option<Alone>, now: Instant) -> Alone {
        match entry {
            Some(a) if now.duration_since(a.first) < SURVEY_REFRESH => Alone {
                turns: a.turns + 1,
                ..a
            },
            _ => Alone {
                first: now,
                turns: 1,
            },
        }
    }

    /// Whether the target is due for a retry at `now`, last surveyed at `last`. The first
    /// retry stays due until it is taken: the cooldown that pays for a busy window can
    /// outlast [`SURVEY_REFRESH`] (kmeans_flag: 140 hits on the barrier's line in the next
    /// window, and no window for 400 ms); the others only within it.
    fn retry_due(&self, last: Option<Instant>, now: Instant) -> bool {
        self.turns <= SURVEY_RETRIES
            && (self.turns == 1 || now.duration_since(self.first) < SURVEY_REFRESH)
            && last.is_none_or(|at| now.duration_since(at) >= SURVEY_RETRY_AFTER)
    }
}

/// A line's probes within the current [`PROBE_REFRESH`].
#[derive(Clone, Copy, Debug)]
struct Probed {
    first: Instant,
    last: Instant,
    tries: u32,
    /// Whether a probe saw two threads trap.
    saw_two: bool,
}

impl Probed {
    /// Whether the line may be probed again at `now`.
    fn due(&self, now: Instant) -> bool {
        now.duration_since(self.first) >= PROBE_REFRESH
            || (!self.saw_two
                && self.tries < PROBE_TRIES
                && now.duration_since(self.last) >= SURVEY_REFRESH)
    }
}

impl Steering {
    /// Steering for a report at `threshold` events/s.
    pub fn with_threshold(threshold: f64) -> Self {
        Self {
            threshold: Some(threshold),
            ..Self::default()
        }
    }

    /// The watchpoints were disarmed from outside (the monitor loop returned): the armed
    /// turn is over; settled lines, survey history and the tier order are kept, so a loop
    /// that stops and resumes (`run --repair` checks) does not start its survey again.
    pub fn suspend(&mut self) {
        self.turn = None;
        self.surveying = None;
        self.probing = None;
        self.storing = None;
        self.idle = false;
        self.last_step = None;
    }

    /// The loop will step: poll soon until the first step (see [`FIRST_STEP`]). A loop that
    /// never steps (`--watch false`, an access history) keeps the longest wait.
    pub fn expect_steps(&mut self) {
        self.steps_expected = Some(Instant::now() + FIRST_STEP_FOR);
    }

    /// How long the monitor loop waits for the next `step` at most: the turn's own wait
    /// ([`Self::turn_poll_hint`]), [`MAX_POLL`] without one. When the armed cost's look
    /// comes before the turn's ([`Self::cost_look_wait`]), a step that finds the loop woken
    /// by that wait alone looks at the cost only.
    pub fn poll_wait(&mut self) -> Duration {
        let now = Instant::now();
        // Before the first step, only until the first window can open: a program that runs
        // for 0.4 s must not lose its first 50 ms to the loop's idle poll.
        let idle = if self.started.is_none() && self.steps_expected.is_some_and(|t| now < t) {
            FIRST_STEP
        } else {
            MAX_POLL
        };
        let wait = self.turn_poll_hint().map_or(idle, |h| h.min(idle));
        // After cost looks, the turn's look is due when it was after the last whole step:
        // they do not put it off.
        let turn = self
            .turn_look_at
            .map_or(wait, |at| at.saturating_duration_since(now));
        match self.cost_look_wait().filter(|&c| c < turn) {
            Some(cost) => {
                self.turn_look_at.get_or_insert(now + wait);
                self.cost_look_at = Some(now + cost);
                cost
            }
            None => {
                // Kept only while cost looks cut the waits short: a loop that never steps
                // (no steering: `--watch false`, an access history) must not find it past.
                self.turn_look_at = None;
                self.cost_look_at = None;
                turn
            }
        }
    }

    /// How long the loop may wait before the turn's next look: during a survey or probe
    /// turn, what is left of its counting time, so turns are not stretched to the loop's idle
    /// poll. (Half a turn, as before, woke laser twice a turn, a look in the middle that ends
    /// nothing: parsec streamcluster's reader slept 104 times in 10 ms polls a run, most of
    /// its wake-ups, and each took a CPU from the program at real-time priority. A window's
    /// hits wake the reader anyway, at its events' limit.)
    fn turn_poll_hint(&self) -> Option<Duration> {
        match self.turn {
            // Only while the window counts: a cooldown is waited out at the duty cycle's
            // own deadline.
            Some((Turn::Code, _)) if self.counting => Some(self.moving_poll.max(MOVING_POLL)),
            Some((Turn::Code | Turn::Front, _)) => None,
            Some((Turn::Survey | Turn::Probe | Turn::Look, _)) => Some(
                SURVEY_TURN
                    .saturating_sub(self.counted)
                    .max(SURVEY_POLL_MIN),
            ),
            _ => None,
        }
    }

    /// Called between polls: re-points the watchpoints when a turn is over.
    pub fn step(
        &mut self,
        session: &mut Session,
        detector: &Detector<crate::analyze::Code>,
        forced: &[WatchCandidate],
    ) -> Result<()> {
        let out = self.step_turn(session, detector, forced);
        if let Ok(w) = session.watch_mut() {
            let armed = w.is_counting();
            if armed && !self.armed_after_step {
                // Armed by this step: from now, after the events were opened (an open can
                // wait several ms for the kernel's breakpoint slots).
                self.armed_mark = Some(Instant::now());
                self.counts_from = self.armed_mark;
            }
            self.armed_after_step = armed;
        }
        out
    }

    fn step_turn(
        &mut self,
        session: &mut Session,
        detector: &Detector<crate::analyze::Code>,
        forced: &[WatchCandidate],
    ) -> Result<()> {
        let now = Instant::now();
        let pid = session.pid();
        let Ok(watcher) = session.watch_mut() else {
            return Ok(());
        };
        let (counting, hits) = (watcher.is_counting(), watcher.stats().hits);
        self.slowdown = detector.armed_slowdown();
        self.armed_budget = ARMED_COST_SHARE * watcher.duty_cycle().max_slowdown;
        // Woken before the turn's own look by `ARMED_COST_LOOK` alone: the armed cost is
        // all there is to look at. The turn's counting time is added up at its own looks,
        // as without these.
        if self.cost_look_only(now, hits) {
            self.note_armed(now, counting);
            if self.armed_cost_spent(now) {
                self.go_idle(watcher)?;
                self.trace_armed_cost(now);
            }
            return Ok(());
        }
        self.turn_look_at = None;
        self.note_step(now, counting);
        self.moving_poll = moving_poll_after(self.moving_poll, hits != self.hits_at_look);
        self.hits_at_look = hits;
        self.started.get_or_insert(now);
        // Armed watchpoints slow code that copies with fast strings even when nothing traps:
        // once that has cost the budget's share of the run so far, nothing is armed until
        // the run has grown enough to pay for more.
        if self.armed_cost_spent(now) {
            if self.turn.is_some() {
                self.trace_armed_cost(now);
            }
            return self.go_idle(watcher);
        }
        // A code turn that has seen its instructions contend hands the debug registers to a
        // front window on that line at once: the line is measured while it is hot, at a trap
        // per access to it instead of one per execution of the code.
        // Only while the window counts: armed in a cooldown it would open on a line that has
        // long cooled.
        let front = match self.turn {
            Some((Turn::Code, _)) if counting => detector.code_front(),
            _ => None,
        };
        if let Some(front) = front {
            let kind = if self.read_hot.contains(&front.line_addr) {
                WatchKind::Write
            } else {
                WatchKind::ReadWrite
            };
            let specs = watch_specs(&front, kind);
            watcher
                .arm_front(&specs)
                .with_context(|| format!("arming a front window on line {:#x}", front.line_addr))?;
            self.begin_turn(Turn::Front, now, hits, &specs);
            return Ok(());
        }
        let over = match self.turn {
            // A front window ends with its duty window: after the cooldown the line it
            // watched is cold, and the code turn must find the new one.
            Some((Turn::Front, _)) => {
                !counting
                    || self.counted >= FRONT_TURN
                    || hits.saturating_sub(self.hits_at_start)
                        >= SURVEY_WINDOWS * watcher.duty_cycle().max_hits_per_window
            }
            // One window. A probe: its edges are all it asks about. An exploring code turn:
            // where the threads' stores go (a front window follows if they meet on a line);
            // longer, on code whose parts never meet (stalling_writer's per-thread
            // counters), it took the four windows of the 0.6 s in which the line known to be
            // contended could have been watched.
            Some((Turn::Probe | Turn::Look, _)) => self.one_window_over(counting, hits, watcher),
            // A read+write survey turn (`SurveyTarget::reads`), like a probe: its threads'
            // loads fill each window, and one shows whether their accesses meet (four windows'
            // worth of hits held one line's survey slot for 560 ms of a 0.9 s run).
            Some((Turn::Survey, _)) if self.survey_reads => {
                self.one_window_over(counting, hits, watcher)
            }
            Some((Turn::Code, _)) if self.exploring => {
                self.one_window_over(counting, hits, watcher)
            }
            // A code turn's windows end at one CPU's share of the cap, in well under a
            // millisecond, each with its cooldown: counted by hits, its turn took twice the
            // windows meant (stalling_writer: 8 windows, 530 ms of its 0.5 s of contention,
            // on an instruction whose lines never meet).
            Some((Turn::Code, _))
                if !counting
                    && watcher
                        .stats()
                        .windows
                        .saturating_sub(self.code_windows_from)
                        >= CODE_WINDOWS =>
            {
                true
            }
            Some((Turn::Survey | Turn::Code, _)) => {
                self.turn_spent(hits, watcher.duty_cycle().max_hits_per_window)
                    // A survey window has ended (a cooldown) with one thread alone trapped:
                    // the turn's next windows would watch the same thread's stores to the
                    // same words, each after a cooldown (Phoenix histogram -O0: four windows
                    // filled by one thread's own counters took 500 ms of a 0.6 s run, and the
                    // line the other thread shares was never surveyed). Its edge probe, if
                    // due, comes in the survey's next slot, then the plan's next target.
                    || (!counting && self.one_thread_trapped(watcher, hits))
            }
            // A candidate turn armed in a cooldown has no window until it is paid: its time
            // counts from then. Over by wall time alone, a turn after a survey or probe of
            // ~50 hits (a 100 ms cooldown) ended as its window opened, and the window went
            // to the next turn's words: stalling_writer's line had turns of 0.06 ms.
            Some((Turn::Candidate, t)) => candidate_turn_over(
                now.duration_since(t),
                hits > self.hits_at_start || !self.counted.is_zero(),
            ),
            None => true,
        };
        if !over {
            return Ok(());
        }
        self.trace_over(now, hits, watcher.last_hitters());
        // A store-only candidate turn is over: did its last window see one thread alone?
        // (A turn without hits says nothing either way.)
        if let Some(line) = self.storing.take().filter(|_| hits > self.hits_at_start) {
            if watcher.last_hitters() == 1 {
                let (n, at) = self.stores_alone.entry(line).or_insert((0, now));
                (*n, *at) = (*n + 1, now);
            } else {
                self.stores_alone.remove(&line);
            }
        }
        // After a front window, back to the code it came from while the chain lasts.
        if matches!(self.turn, Some((Turn::Front, _))) {
            if let Some((pcs, left)) = self.following.take().filter(|f| f.1 > 0) {
                self.arm_code(watcher, &pcs, now, hits)?;
                self.following = Some((pcs, left - 1));
                return Ok(());
            }
        }
        self.following = None;
        // The probe is over: what it saw decides when the line is probed again. A first
        // probe that saw the storer alone is followed by one on the words around
        // the stores it did not watch (`Detector::edge_probe` picks those once a probe has
        // watched the line): the word a neighbour reads need not be next to the stores, and
        // the line's next survey turn can be most of a second away. Once only: each window
        // on a line one thread uses delays the survey of the others.
        if let Some(probe) = self.probing.take() {
            if let Some(p) = self.probed.get_mut(&probe.line_addr) {
                p.saw_two |= hits > self.hits_at_start && watcher.last_hitters() >= 2;
                if !p.saw_two && p.tries == 1 {
                    if let Some(c) = detector
                        .edge_probe(probe.line_addr)
                        .filter(|c| c.words != probe.words)
                    {
                        self.pending_probe = Some(c);
                    }
                }
            }
        }
        if let Some(w) = &self.surveying {
            let key = w.key();
            // Only a window the thread filled before the turn's time was up: one that
            // counted its whole turn had the other threads' chance too (the main thread's
            // few stores of a round counter in 20 ms took the retries from the flag's line).
            if self.one_thread_trapped(watcher, hits) && self.counted < SURVEY_TURN {
                let a = Alone::note(self.alone.get(&key).copied(), now);
                self.alone.insert(key, a);
            } else {
                self.alone.remove(&key);
            }
        }
        // A store-only survey window that one thread filled with its stores: a read+write
        // window around those stores next (`Detector::edge_probe`), for a neighbour
        // that only reads, which store-only windows cannot see (Phoenix histogram -O0: one
        // thread reads its header every pixel from the line where the other increments a
        // counter on 4% of them).
        // (`surveying` is set only while a survey turn from the plan is armed: no probe is
        // due without one.)
        if let Some(c) = self.edge_probe_due(watcher, detector, hits, now) {
            self.pending_probe = Some(c);
        }
        self.surveying = None;
        // Lines the user named come first; a detector candidate on the same line is dropped
        // (the user's words are the ones to watch there).
        let mut candidates = forced.to_vec();
        // The detector's own candidates (the lines the user did not name), for looks too.
        let detected: Vec<WatchCandidate> = detector
            .candidates(4)
            .into_iter()
            .filter(|c| !forced.iter().any(|f| f.line_addr == c.line_addr))
            .collect();
        candidates.extend(detected.iter().cloned());
        let estimates = detector.estimates();
        let due = self.due(&estimates, candidates, now);
        self.trace_due(now, &due);
        // Candidates and surveys take turns; either alone takes every turn. Every other
        // survey turn, while some are due, is a look at stores two threads' samples showed
        // going into neighbouring memory (`Detector::neighbour_candidates`): a search for
        // contention no sample showed, as a survey is, so in the survey's place. Taking a
        // code turn's place instead, such looks came first in every run and took a third
        // of the windows in which stalling_writer's contended line could be watched (2 of 5
        // runs found it).
        let survey_slot = due.is_empty() || matches!(self.turn, Some((Turn::Candidate, _)));
        // A probe is a search of the survey's, so it takes the survey's slot: at once while
        // no candidate line is due, after the next candidate turn while one is. Taken at once
        // always, a survey turn and the two probes that follow it on a line one thread alone
        // stores to (its own counters: each probe filled by its stores in 0.7 ms, then a
        // cooldown) took 200 ms of stalling_writer's 0.5 s of contention from the one line
        // known to be contended, and its read+write windows there got one turn. Before a
        // code turn: one in between took the probe's chance of Phoenix histogram -O0's
        // line (its reading thread is done in ~0.3 s), in 8 of 30 runs.
        if survey_slot {
            if let Some(c) = self.pending_probe.take() {
                return self.arm_probe(watcher, c, now, hits);
            }
        }
        // Code turns take every other turn while an instruction is due for one.
        if !matches!(self.turn, Some((Turn::Code | Turn::Front, _))) {
            let threshold = self.threshold.unwrap_or(DEFAULT_THRESHOLD);
            let pcs = detector.code_candidates(threshold, MAX_WATCHES);
            // A probe still waiting for the survey's slot takes a code turn's place (the
            // code turn comes right after it): a code turn on an instruction that runs all
            // the time spends the trap budget in a few milliseconds and then waits for it,
            // and one such turn between a survey and its probe lasted ~415 ms of Phoenix
            // histogram -O0's ~700 ms. Its line's reading thread, which only the probe can
            // see, was done by then: the program went unreported in 4 runs of 100 (1 of 160
            // after). A probe is one short window; candidate turns keep their place.
            if self.pending_probe.is_some() && !self.code_due(&pcs, now).is_empty() {
                let c = self.pending_probe.take().expect("checked just above");
                return self.arm_probe(watcher, c, now, hits);
            }
            let pcs = self.take_code_due(pcs, now);
            if !pcs.is_empty() {
                self.arm_code(watcher, &pcs, now, hits)?;
                self.following = Some((pcs, FRONTS_PER_CHAIN));
                return Ok(());
            }
        }
        // A survey target whose last turn one thread filled alone is retried before the
        // explorations and looks that share the survey's slot: it is the one search there
        // that can find a line no window has seen two threads on, where those look again at
        // what is known. Looks at the contended line of kmeans_flag's barrier took every
        // survey slot, and the retry of its flag's line (one worker's 17 stores filled that
        // window) never came: the flag went unreported in ~1 run of 10.
        let retry = if survey_slot {
            self.survey_retry(detector, now)
        } else {
            None
        };
        if retry.is_none() && survey_slot && std::mem::take(&mut self.explore_next) {
            let threshold = self.threshold.unwrap_or(DEFAULT_THRESHOLD);
            let pcs =
                self.take_code_due(detector.neighbour_candidates(threshold, MAX_WATCHES), now);
            if !pcs.is_empty() {
                self.arm_code(watcher, &pcs, now, hits)?;
                self.exploring = true;
                return Ok(());
            }
        }
        // A contended line's words no sample showed get a look of their own
        // (`unsampled_look`), in the survey's place: a search for accesses no sample showed,
        // as a survey is.
        if retry.is_none() && survey_slot {
            if let Some((line, specs)) = self.unsampled_look(detector, &detected, &estimates, now) {
                watcher.arm_look(&specs).with_context(|| {
                    format!("arming a look at line {line:#x}'s unsampled words")
                })?;
                self.idle = false;
                self.begin_turn(Turn::Look, now, hits, &specs);
                return Ok(());
            }
        }
        let survey = if survey_slot {
            self.explore_next = true;
            retry.or_else(|| self.next_survey(pid, detector, now))
        } else {
            None
        };
        let (c, turn) = match survey {
            Some(c) => (c, Turn::Survey),
            None if !due.is_empty() => {
                let c = due[self.next % due.len()].clone();
                self.next = self.next.wrapping_add(1);
                (c, Turn::Candidate)
            }
            None => {
                if !self.idle {
                    // Nothing to learn right now: no traps at all until something is due.
                    watcher.disarm().context("disarming watchpoints")?;
                    self.idle = true;
                }
                self.turn = None;
                return Ok(());
            }
        };
        self.idle = false;
        // Survey windows trap on stores only: a line one thread reads hot would otherwise
        // spend a window's trap budget in microseconds on reads that cannot contend, before
        // the other thread's rare store comes by. Stores by two threads contend with each
        // other; a store next to data samples show another thread reading contends with
        // those reads (the line model merges both by time).
        // A candidate line whose read+write windows trapped on most accesses (a thread reads
        // it hot) cannot be measured that way where the kernel does not stop a window at its
        // cap (inherited windows): each such window overshoots its hit cap and its cooldown
        // stops every other turn for a long while. Its stores still can be, and are from then
        // on. Where it does (launch and attach windows), read+write windows go on: a line one thread stores to and another
        // reads hot is contended by those reads, and store-only windows see one thread only
        // (Phoenix linear_regression -O0 missed 1 run in 16 that way; 0 in 12 without).
        // But read+write windows on a line two threads read hot are filled by those reads in
        // a fraction of a millisecond, and a store that comes a few times a millisecond
        // (Phoenix kmeans' `modified`, on the line of the `dim` both threads read in their
        // inner loop) falls between them: one run in ten had a dozen such windows and no
        // transfer, while store-only windows see both threads' stores. Such a line's turns
        // alternate between the two kinds; each kind is rated apart and the larger rate is
        // the line's (`laser_detect::model::estimate`, "Store-only windows").
        // Filled by reads shows in the trap time (`clamped`) and, more surely, in windows
        // that end at their cap in a fraction of their span: kmeans' read+write windows
        // filled in 0.5 ms with the loads of `dim` stayed under the trap-time test in 1 run of
        // ~30 and never alternated, and the stores of `modified` went unseen.
        // But not a line whose read+write windows see its stores (`stores_seen`), filled as
        // they are: store-only windows there see nothing the read+write ones miss, and
        // stalling_writer's (one storer; the reader's loads fill each window) saw the storer
        // alone in one of its ~5 windows of contention, where a read+write one sees both.
        let demote = !watcher.caps_windows();
        let duty = watcher.duty_cycle();
        for e in &estimates {
            // (Both tests look at the line's read+write windows alone: a code window that
            // watched one of its instructions fills at its cap with that instruction's
            // executions, and says nothing of how the line's loads fill a data window.)
            let read_filled = e.rw_clamped;
            if demote && read_filled && !self.read_hot.contains(&e.line_addr) {
                self.read_hot.push(e.line_addr);
            } else if !demote && e.stores_seen() {
                self.alternating.remove(&e.line_addr);
            } else if !demote
                && (read_filled || filled_at_cap(e, &duty))
                // Not a line one thread alone was seen storing to: store-only windows there
                // see that thread alone, and its stores contend with loads they do not see.
                // stalling_writer's reader filled a read+write window, its next turn went to
                // stores only, and the line has ~4 turns while both threads run.
                && detector.storing_threads(e.line_addr) != 1
            {
                self.alternating.entry(e.line_addr).or_insert(false);
            }
        }
        // Where the kernel does not end a window at its cap, a read+write survey is a
        // store-only one, with the turns of those.
        self.survey_reads &= !demote;
        let kind = match turn {
            Turn::Candidate if self.read_hot.contains(&c.line_addr) => WatchKind::Write,
            Turn::Candidate => self.alternate(c.line_addr, now),
            // A survey of a line two threads were sampled on apart (`SurveyTarget::reads`),
            // where the kernel ends a window at its cap.
            Turn::Survey if self.survey_reads => WatchKind::ReadWrite,
            _ => WatchKind::Write,
        };
        // (The user's words are the ones to watch on a line they named.)
        let c = match turn {
            Turn::Candidate if !forced.iter().any(|f| f.line_addr == c.line_addr) => {
                self.with_unsampled_words(c, kind, detector.line_size())
            }
            _ => c,
        };
        let specs = watch_specs(&c, kind);
        // A candidate line's windows wait for two of the threads that contend there to run
        // (`laser_driver::company`): one that opens while the other is blocked sees one
        // thread, and its cooldown takes the line's next chance.
        let company: Vec<i32> = match turn {
            Turn::Candidate => detector
                .line_threads(c.line_addr)
                .into_iter()
                .filter_map(|t| i32::try_from(t).ok())
                .collect(),
            _ => Vec::new(),
        };
        watcher
            .arm_for(&specs, &company)
            .with_context(|| format!("arming watchpoints on line {:#x}", c.line_addr))?;
        self.begin_turn(turn, now, hits, &specs);
        self.storing = (turn == Turn::Candidate
            && kind == WatchKind::Write
            && self.alternating.contains_key(&c.line_addr))
        .then_some(c.line_addr);
        if turn == Turn::Survey {
            self.surveying = Some(c);
        }
        Ok(())
    }

    /// `c` with its line's words no sample has shown in the debug registers its sampled
    /// words leave free, nearest to those first and in turn from one turn of the line to the
    /// next of the same kind (so a few turns watch all of it for loads, a few for stores: an
    /// alternating line's store-only turns would otherwise take the turn of the word only a
    /// load reaches every other time round). Samples show an access in proportion to its
    /// share of the loop that makes it: one load among dozens of instructions can go unseen
    /// for a whole run on a line other accesses already show contended (asm-test
    /// body_big_rw_false: its fourth line was missing in ~1 run of 10, and the line's byte
    /// map with it). A window sees every access to the words it watches, so the free
    /// registers find such an access at no extra budget: the duty cycle caps a window's
    /// traps whatever it watches.
    fn with_unsampled_words(
        &mut self,
        mut c: WatchCandidate,
        kind: WatchKind,
        line_size: u32,
    ) -> WatchCandidate {
        let room = MAX_WATCHES.saturating_sub(c.words.len());
        let free = unsampled_slots(c.line_addr, line_size, &c.words);
        if room == 0 || free.is_empty() {
            return c;
        }
        let next = self.unsampled_next.entry((c.line_addr, kind)).or_insert(0);
        let take = room.min(free.len());
        c.words
            .extend((0..take).map(|i| (free[(*next + i) % free.len()], 8)));
        *next = (*next + take) % free.len();
        c.words.sort_unstable();
        c
    }

    /// A look at words no sample showed on a line its windows have seen contended (one of
    /// `detected`, the detector's candidates the user did not name): one window (a one-window
    /// turn, as a probe's) on up to three of them, read+write, and one sampled word another
    /// thread stores to, stores only (the *anchor*). A candidate turn's free registers
    /// ([`Self::with_unsampled_words`]) share its windows with the sampled words, whose traps
    /// slow every thread that makes them, and a hot line fills such a window at its trap cap
    /// in a millisecond or less: a load made once every few hundred iterations of a loop is in
    /// few of those windows, if any (and a line settles after a turn or two). A look traps on
    /// the rare words' accesses and on the anchor's stores only, so the thread making the rare
    /// access runs at its own pace and its accesses meet the other thread's stores in the
    /// window. Looks go round the groups of rare words, then the
    /// anchors (a rare access contends only with another thread's stores), at most
    /// [`LOOKS_PER_LINE`] per line per [`REFRESH`]. The detector rates no line from a look
    /// (`Event::WatchSet::look`): it watches the line's rare words, not its hot ones.
    fn unsampled_look(
        &mut self,
        detector: &Detector<crate::analyze::Code>,
        detected: &[WatchCandidate],
        estimates: &[LineEstimate],
        now: Instant,
    ) -> Option<(u64, Vec<WatchSpec>)> {
        let line_size = detector.line_size();
        let threshold = self.threshold.unwrap_or(DEFAULT_THRESHOLD);
        for c in detected {
            let line = c.line_addr;
            let rated = estimates
                .iter()
                .any(|e| e.line_addr == line && contention_confirmed(e, threshold));
            if !rated {
                continue;
            }
            let free = unsampled_slots(line, line_size, &c.words);
            let stored = detector.stored_bytes(line);
            // (A candidate's words lie on its line: offsets below the line size.)
            let anchors: Vec<(u64, u32)> = c
                .words
                .iter()
                .filter(|&&(a, len)| byte_mask((a - line) as u32, len) & stored != 0)
                .copied()
                .collect();
            let entry = self.looked.entry(line).or_insert(Looks::new(now));
            if now.duration_since(entry.since) >= REFRESH {
                *entry = Looks::new(now);
            }
            let seen = detector.accessed_bytes(line);
            let Some(specs) = entry.next(line, &free, &anchors, seen) else {
                continue;
            };
            return Some((line, specs));
        }
        None
    }

    /// The kind of an alternating candidate line's next turn (read+write for any other line):
    /// store-only and read+write by turns, but read+write only while its store-only turns
    /// see one thread alone ([`STORES_ALONE_TURNS`]).
    fn alternate(&mut self, line: u64, now: Instant) -> WatchKind {
        let alone = self
            .stores_alone
            .get(&line)
            .is_some_and(|&(n, at)| stores_alone_now(n, at, now));
        match self.alternating.get_mut(&line) {
            Some(stores) => {
                *stores = !*stores && !alone;
                if *stores {
                    WatchKind::Write
                } else {
                    WatchKind::ReadWrite
                }
            }
            None => WatchKind::ReadWrite,
        }
    }

    /// Disarms (if armed) and ends the turn: nothing is armed until the next step arms it.
    fn go_idle(&mut self, watcher: &mut laser_driver::Watcher) -> Result<()> {
        if !self.idle {
            watcher.disarm().context("disarming watchpoints")?;
            self.idle = true;
        }
        self.turn = None;
        self.surveying = None;
        self.probing = None;
        Ok(())
    }

    /// Whether the armed time so far has cost the target more in fast-string slowdown
    /// ([`Self::slowdown`]) than its share of the budget for the run so far.
    fn armed_cost_spent(&self, now: Instant) -> bool {
        let (Some(slowdown), Some(started)) = (self.slowdown, self.started) else {
            return false;
        };
        let cost = self.armed.as_secs_f64() * (slowdown - 1.0);
        cost > self.armed_budget * now.duration_since(started).as_secs_f64()
    }

    /// Adds the armed time up to `now`: since the last mark, when the watchpoints counted
    /// at the end of the last step and count now. Armed time counts from the step that
    /// armed the window (it slowed the program from then): counted from the next step, as
    /// a turn's counting time is, a survey turn's first 20 ms went uncharged.
    fn note_armed(&mut self, now: Instant, counting: bool) {
        if let Some(mark) = self
            .armed_mark
            .filter(|_| counting && self.armed_after_step)
        {
            self.armed += now.saturating_duration_since(mark);
        }
        self.armed_mark = Some(now);
    }

    /// Whether this step was woken for the armed cost alone: the loop waited the cost's
    /// look ([`Self::poll_wait`]) out, shorter than the turn's, and no hit came meanwhile.
    /// Woken earlier (the rings, a hit, the duty cycle's deadline), the step is a whole one,
    /// as it was without these looks.
    fn cost_look_only(&mut self, now: Instant, hits: u64) -> bool {
        let timed_out = self.cost_look_at.take().is_some_and(|at| now >= at);
        timed_out && self.turn.is_some() && hits == self.hits_at_look
    }

    /// How long the loop may wait before the armed cost must be looked at again, while
    /// watchpoints count: [`ARMED_COST_LOOK`] while there is no estimate of what they cost
    /// in fast-string slowdown, and with one above 1, the armed time left before that cost
    /// reaches its budget (the budget grows with the run, at `armed_budget` of it).
    fn cost_look_wait(&self) -> Option<Duration> {
        if !self.armed_after_step {
            return None;
        }
        let Some(slowdown) = self.slowdown else {
            return Some(ARMED_COST_LOOK);
        };
        let (Some(started), Some(last)) = (self.started, self.armed_mark) else {
            return None;
        };
        // Armed r longer from the mark: (armed + r)(s - 1) ≤ b (elapsed + r).
        let rate = slowdown - 1.0 - self.armed_budget;
        if rate <= 0.0 {
            return None;
        }
        let elapsed = last.duration_since(started).as_secs_f64();
        let left =
            (self.armed_budget * elapsed - self.armed.as_secs_f64() * (slowdown - 1.0)) / rate;
        Some(Duration::from_secs_f64(left.max(0.0)).max(SURVEY_POLL_MIN))
    }

    /// Accounts the time since the last step: counting time is the time since the last step
    /// when the window counted then and counts now. Counted whenever it counts now, the first
    /// step after a cooldown took the whole cooldown for counting time and ended a survey turn
    /// whose window had just opened (Phoenix kmeans: the one survey window on `modified` in a
    /// run, armed 7 ms of its 20 ms after a 124 ms cooldown, fell in a phase without its
    /// stores, and the line went unreported).
    fn note_step(&mut self, now: Instant, counting: bool) {
        self.note_armed(now, counting);
        let was_counting = std::mem::replace(&mut self.counting, counting);
        // The window armed by the last step has counted since it was armed: a survey turn of
        // 20 ms took 40 (its first look counted nothing) and a quiet global's survey took a
        // tenth of a 0.4 s run.
        let from = match (self.counts_from.take(), was_counting) {
            (Some(armed), false) => Some(armed),
            _ => self.last_step.filter(|_| was_counting),
        };
        if let (Some(from), true) = (from, counting) {
            self.counted += now.saturating_duration_since(from);
        }
        self.last_step = Some(now);
    }

    /// Whether a survey (or code) turn has used its counting time or its windows' worth of
    /// hits (`cap` a window).
    fn turn_spent(&self, hits: u64, cap: u64) -> bool {
        self.counted >= SURVEY_TURN
            || hits.saturating_sub(self.hits_at_start) >= SURVEY_WINDOWS * cap
    }

    /// Whether a one-window turn is over: its window ended, or counted a survey turn's time
    /// or a window's hits. (Armed in a cooldown, it waits for the cooldown's end before it
    /// counts.)
    fn one_window_over(&self, counting: bool, hits: u64, watcher: &laser_driver::Watcher) -> bool {
        (!counting && self.counted > Duration::ZERO)
            || self.counted >= SURVEY_TURN
            || hits.saturating_sub(self.hits_at_start) >= watcher.duty_cycle().max_hits_per_window
    }

    /// Whether the armed survey turn's last window trapped one thread alone.
    fn one_thread_trapped(&self, watcher: &laser_driver::Watcher, hits: u64) -> bool {
        self.surveying.is_some() && hits > self.hits_at_start && watcher.last_hitters() == 1
    }

    /// The edge probe due after the armed survey turn's last window, if one thread filled it
    /// with stores and the line may be probed now ([`Probed::due`]).
    fn edge_probe_due(
        &self,
        watcher: &laser_driver::Watcher,
        detector: &Detector<crate::analyze::Code>,
        hits: u64,
        now: Instant,
    ) -> Option<WatchCandidate> {
        let line = self.surveying.as_ref()?.line_addr;
        if !self.one_thread_trapped(watcher, hits)
            || self.probed.get(&line).is_some_and(|p| !p.due(now))
        {
            return None;
        }
        detector.edge_probe(line)
    }

    /// Arms the read+write probe `c` (`Detector::edge_probe`), one more of its line's tries.
    fn arm_probe(
        &mut self,
        watcher: &mut laser_driver::Watcher,
        c: WatchCandidate,
        now: Instant,
        hits: u64,
    ) -> Result<()> {
        let line = c.line_addr;
        let fresh = Probed {
            first: now,
            last: now,
            tries: 0,
            saw_two: false,
        };
        let p = self.probed.entry(line).or_insert(fresh);
        if now.duration_since(p.first) >= PROBE_REFRESH {
            *p = fresh;
        }
        p.last = now;
        p.tries += 1;
        let specs = watch_specs(&c, WatchKind::ReadWrite);
        watcher
            .arm(&specs)
            .with_context(|| format!("arming an edge probe on line {line:#x}"))?;
        self.idle = false;
        self.probing = Some(c);
        self.begin_turn(Turn::Probe, now, hits, &specs);
        Ok(())
    }

    /// `turn` holds the watchpoints (`specs`) from `now`; its time and hits count from here.
    fn begin_turn(&mut self, turn: Turn, now: Instant, hits: u64, specs: &[WatchSpec]) {
        self.turn = Some((turn, now));
        self.exploring = false;
        self.counted = Duration::ZERO;
        self.hits_at_start = hits;
        self.moving_poll = MOVING_POLL;
        self.hits_at_look = hits;
        self.trace(now, turn, specs);
    }

    /// With `LASER_TRACE_STEERING` set in laser's environment: one line on stderr per turn
    /// (time since steering began, the turn, the kind and words watched), to see which lines
    /// a live run watched when (a recording has the windows, not why they were chosen).
    fn trace(&self, now: Instant, turn: Turn, specs: &[WatchSpec]) {
        if !trace_on() {
            return;
        }
        let ms = self.ms_since_start(now);
        let kind = specs.first().map(|s| s.kind);
        let words: Vec<String> = specs
            .iter()
            .map(|s| format!("{:#x}/{}", s.addr, s.len))
            .collect();
        let why = match (turn, self.survey_source) {
            (Turn::Survey, Some(s)) => format!(" ({})", s.as_str()),
            _ => String::new(),
        };
        eprintln!(
            "laser steering: {ms:9.1} ms {turn:?} {kind:?} [{}]{why}",
            words.join(" ")
        );
    }

    /// With `LASER_TRACE_STEERING`: a line when a turn is over (its hits, the threads its
    /// last window trapped, its counting time): what each turn saw, beside why it was taken.
    fn trace_over(&self, now: Instant, hits: u64, hitters: usize) {
        if let Some((turn, _)) = self.turn.filter(|_| trace_on()) {
            eprintln!(
                "laser steering: {:9.1} ms {turn:?} over: {} hits, last window {hitters} \
                 thread(s), {:.1} ms counted",
                self.ms_since_start(now),
                hits.saturating_sub(self.hits_at_start),
                self.counted.as_secs_f64() * 1e3
            );
        }
    }

    /// With `LASER_TRACE_STEERING`: the candidate lines due when the next turn is chosen (a
    /// line not among them gets no candidate turn: samples have not shown it shared, or its
    /// estimate is settled until the refresh).
    fn trace_due(&self, now: Instant, due: &[WatchCandidate]) {
        if trace_on() {
            let lines: Vec<String> = due.iter().map(|c| format!("{:#x}", c.line_addr)).collect();
            eprintln!(
                "laser steering: {:9.1} ms due: [{}]",
                self.ms_since_start(now),
                lines.join(" ")
            );
        }
    }

    /// With `LASER_TRACE_STEERING`: a line when the fast-string cost of armed time ends a
    /// turn (the estimate and the armed time so far).
    fn trace_armed_cost(&self, now: Instant) {
        if trace_on() {
            eprintln!(
                "laser steering: {:9.1} ms disarmed: {:.1} ms armed at an estimated {:.2}x \
                 (fast strings) cost more than the run so far allows",
                self.ms_since_start(now),
                self.armed.as_secs_f64() * 1e3,
                self.slowdown.unwrap_or(1.0)
            );
        }
    }

    fn ms_since_start(&self, now: Instant) -> f64 {
        self.started
            .map_or(0.0, |s| now.duration_since(s).as_secs_f64() * 1e3)
    }

    /// The instructions of `pcs` a code turn may watch now: those not watched within
    /// [`CODE_REFRESH`]. Marks nothing ([`Self::take_code_due`] does).
    fn code_due(&self, pcs: &[u64], now: Instant) -> Vec<u64> {
        pcs.iter()
            .copied()
            .filter(|pc| {
                self.coded
                    .get(pc)
                    .is_none_or(|at| now.duration_since(*at) >= CODE_REFRESH)
            })
            .collect()
    }

    /// The instructions of `pcs` whose last code turn was [`CODE_REFRESH`] ago or more,
    /// marked as given one now (the caller arms them).
    fn take_code_due(&mut self, pcs: Vec<u64>, now: Instant) -> Vec<u64> {
        let due = self.code_due(&pcs, now);
        for &pc in &due {
            self.coded.insert(pc, now);
        }
        due
    }

    /// A code turn: instruction breakpoints on `pcs`.
    fn arm_code(
        &mut self,
        watcher: &mut laser_driver::Watcher,
        pcs: &[u64],
        now: Instant,
        hits: u64,
    ) -> Result<()> {
        let specs: Vec<WatchSpec> = pcs
            .iter()
            .map(|&addr| WatchSpec {
                addr,
                len: 8,
                kind: WatchKind::Exec,
            })
            .collect();
        self.code_windows_from = watcher.stats().windows;
        watcher
            .arm(&specs)
            .with_context(|| format!("arming code watchpoints on {pcs:#x?}"))?;
        self.counting = watcher.is_counting();
        self.idle = false;
        self.begin_turn(Turn::Code, now, hits, &specs);
        Ok(())
    }

    /// The highest-priority survey target not surveyed within [`SURVEY_REFRESH`], marked as
    /// surveyed now.
    fn next_survey(
        &mut self,
        pid: i32,
        detector: &Detector<crate::analyze::Code>,
        now: Instant,
    ) -> Option<WatchCandidate> {
        if self
            .pointers_read
            .is_none_or(|t| now.duration_since(t) >= POINTERS_EVERY)
        {
            self.pointers_read = Some(now);
            if self.mem.is_none() {
                self.mem = ProcMem::open(pid).ok();
            }
            if let Some(mem) = self.mem.as_mut() {
                self.pointed = detector.pointed_heap_blocks(mem);
            }
        }
        // (A due retry came first, in the survey's slot: `survey_retry`.)
        let plan = detector.survey_plan(&self.pointed);
        // The tiers take turns (a tier whose lines change as samples come in, the hot lines,
        // must not starve the globals); within a tier, least recently surveyed first (never
        // surveyed before all), then plan order.
        let eligible = |t: &SurveyTarget| {
            self.surveyed
                .get(&t.key())
                .is_none_or(|at| now.duration_since(*at) >= SURVEY_REFRESH)
        };
        let tiers = SurveySource::ALL.len();
        let (tier, t) = (0..tiers)
            .map(|k| (self.next_tier + k) % tiers)
            .find_map(|tier| {
                plan.iter()
                    .enumerate()
                    .filter(|(_, t)| t.source == SurveySource::ALL[tier] && eligible(t))
                    .min_by_key(|(i, t)| (self.surveyed.get(&t.key()).copied(), *i))
                    .map(|(_, t)| (tier, t.clone()))
            })?;
        self.next_tier = tier + 1;
        self.take_survey(&t, now);
        Some(t.watch)
    }

    /// `t` is the survey's next turn: surveyed now, and what it is for the arming.
    fn take_survey(&mut self, t: &SurveyTarget, now: Instant) {
        self.surveyed.insert(t.key(), now);
        self.survey_source = Some(t.source);
        self.survey_reads = t.reads;
    }

    /// A survey target whose last turn saw one thread alone, due to be tried again (see
    /// [`SURVEY_RETRY_AFTER`]), the longest waiting first; marked surveyed now.
    fn survey_retry(
        &mut self,
        detector: &Detector<crate::analyze::Code>,
        now: Instant,
    ) -> Option<WatchCandidate> {
        // The targets due, by key; the plan (which the survey slot makes again when none is
        // taken) only when there are some, to find which are still in it.
        let due: Vec<(u64, u64)> = self
            .alone
            .iter()
            .filter(|(k, a)| a.retry_due(self.surveyed.get(k).copied(), now))
            .map(|(k, _)| *k)
            .collect();
        if due.is_empty() {
            return None;
        }
        let plan = detector.survey_plan(&self.pointed);
        let t = plan
            .iter()
            .filter(|t| due.contains(&t.key()))
            .min_by_key(|t| self.surveyed.get(&t.key()).copied())?;
        self.take_survey(t, now);
        Some(t.watch.clone())
    }

    /// The candidates still worth watching at `now`; settles lines whose estimate has become
    /// good since they were last settled.
    fn due(
        &mut self,
        estimates: &[LineEstimate],
        candidates: Vec<WatchCandidate>,
        now: Instant,
    ) -> Vec<WatchCandidate> {
        for e in estimates {
            let prev = self.settled.iter().position(|s| s.line == e.line_addr);
            let (t0, a0) = prev.map_or((0, 0.0), |i| {
                (self.settled[i].transfers, self.settled[i].armed_s)
            });
            let good = e.transfers.saturating_sub(t0) >= ENOUGH_TRANSFERS
                || e.armed_s - a0 >= ENOUGH_ARMED_S;
            if good {
                let s = Settled {
                    line: e.line_addr,
                    at: now,
                    transfers: e.transfers,
                    armed_s: e.armed_s,
                };
                match prev {
                    Some(i) => self.settled[i] = s,
                    None => self.settled.push(s),
                }
            }
        }
        candidates
            .into_iter()
            .filter(|c| {
                !self
                    .settled
                    .iter()
                    .any(|s| s.line == c.line_addr && now.duration_since(s.at) < REFRESH)
            })
            .collect()
    }
}

/// Whether `LASER_TRACE_STEERING` is set in laser's environment.
fn trace_on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("LASER_TRACE_STEERING").is_some())
}

/// The 8-byte words of the line at `line` (`line_size` bytes) that none of `words` falls in,
/// nearest to one of them first, then by offset.
fn unsampled_slots(line: u64, line_size: u32, words: &[(u64, u32)]) -> Vec<u64> {
    let used: Vec<u64> = words
        .iter()
        .map(|&(a, _)| a.wrapping_sub(line) / 8)
        .collect();
    let mut free: Vec<(u64, u64)> = (0..u64::from(line_size / 8))
        .filter(|k| !used.contains(k))
        .map(|k| (used.iter().map(|&u| u.abs_diff(k)).min().unwrap_or(0), k))
        .collect();
    free.sort_unstable();
    free.into_iter().map(|(_, k)| line + 8 * k).collect()
}

/// Whether a line's windows have confirmed its contention, for looks at its rare words:
/// [`LOOK_AFTER_TRANSFERS`], or [`LOOK_AFTER_TRANSFERS_CLEAR`] at a rate that, less two
/// standard errors (1/√transfers each), is still at `threshold` or above.
fn contention_confirmed(e: &LineEstimate, threshold: f64) -> bool {
    e.transfers >= LOOK_AFTER_TRANSFERS
        || (e.transfers >= LOOK_AFTER_TRANSFERS_CLEAR
            && e.rate_per_s * (1.0 - 2.0 / (e.transfers as f64).sqrt()) >= threshold)
}

/// One line's looks at its unsampled words since `since` ([`Steering::unsampled_look`]).
#[derive(Clone, Copy, Debug)]
struct Looks {
    since: Instant,
    /// Looks taken, anchored ones included.
    taken: usize,
    /// Anchored looks taken.
    anchored: usize,
    /// The words (bit k: the 8 bytes at offset 8k) looked at without an anchor.
    alone: u64,
    /// Each look without an anchor, as its words.
    groups: [u64; LOOKS_PER_LINE],
    /// Words put back once: their look without an anchor named another of its words but
    /// not them.
    retried: u64,
}

impl Looks {
    fn new(since: Instant) -> Self {
        Looks {
            since,
            taken: 0,
            anchored: 0,
            alone: 0,
            groups: [0; LOOKS_PER_LINE],
            retried: 0,
        }
    }

    /// The next look at the line at `line`, whose unsampled words are `free` (nearest first)
    /// and whose sampled words stored to are `anchors`, where named accesses touched the
    /// bytes `seen` (bit n = byte n); `None` once every pairing was looked at or
    /// [`LOOKS_PER_LINE`] looks were (and with no anchor: the line has no stores to meet).
    ///
    /// First every free word without an anchor, three at a time: such a look traps on its
    /// words alone, what it names it names from the words' own history
    /// (`LineModel::share_word`), and with no hot anchor to fill its trap cap it sees a word
    /// used once every few hundred passes (the slot of a ring buffer that shares the lock's
    /// line) where an anchored look sees none. The words are kept by address, not by their
    /// place in `free`: which words samples showed changes from look to look as samples come
    /// in, and counted by place, locked_queue's `slots[0]` (read at line 48 once in 256 pops)
    /// was left to anchored looks alone in the runs that missed that line. Words no named
    /// access touched go first, and a look takes words of one kind only: a word already seen
    /// may be a busy one (locked_queue's `head`, loaded and stored in every pop), and one
    /// such word in a look fills its cap before a rare word's access comes. For the same
    /// reason a look that named some of its words but not others is taken again once, on
    /// those others (with words not yet looked at). Then each group
    /// of three free words with each anchor's stores in turn (a rare access contends with
    /// another thread's stores, and which anchor is another thread's is not known).
    fn next(
        &mut self,
        line: u64,
        free: &[u64],
        anchors: &[(u64, u32)],
        seen: u128,
    ) -> Option<Vec<WatchSpec>> {
        let per = MAX_WATCHES - 1;
        if anchors.is_empty() || free.is_empty() || self.taken >= LOOKS_PER_LINE {
            return None;
        }
        let bit = |a: u64| 1u64 << (a.wrapping_sub(line) / 8).min(63);
        let rw = |a: u64| WatchSpec {
            addr: a,
            len: 8,
            kind: WatchKind::ReadWrite,
        };
        let named = |a: u64| byte_mask((a.wrapping_sub(line) % 128) as u32, 8) & seen != 0;
        // Words a named access touched, or that samples have shown since (no longer free).
        let free_words = free.iter().fold(0u64, |m, &a| m | bit(a));
        let named_words = (0..16u64)
            .map(|k| line + 8 * k)
            .filter(|&a| named(a))
            .fold(!free_words, |m, a| m | bit(a));
        for &g in &self.groups[..self.taken - self.anchored] {
            let hit = g & named_words;
            if hit != 0 && hit != g {
                let back = g & !named_words & !self.retried;
                self.alone &= !back;
                self.retried |= back;
            }
        }
        let mut left: Vec<u64> = free
            .iter()
            .copied()
            .filter(|&a| self.alone & bit(a) == 0)
            .collect();
        // (A stable sort: nearest first within each kind.)
        left.sort_by_key(|&a| named(a));
        let alone: Vec<u64> = left
            .iter()
            .copied()
            .filter(|&a| left.first().is_some_and(|&f| named(f) == named(a)))
            .take(per)
            .collect();
        if !alone.is_empty() {
            let group = alone.iter().fold(0u64, |m, &a| m | bit(a));
            self.alone |= group;
            self.groups[self.taken - self.anchored] = group;
            self.taken += 1;
            return Some(alone.into_iter().map(rw).collect());
        }
        let groups = free.len().div_ceil(per);
        if self.anchored >= groups * anchors.len() {
            return None;
        }
        let (addr, len) = anchors[self.anchored / groups];
        let mut specs = vec![WatchSpec {
            addr,
            len: len as u8,
            kind: WatchKind::Write,
        }];
        specs.extend(
            free.iter()
                .skip((self.anchored % groups) * per)
                .take(per)
                .map(|&a| rw(a)),
        );
        self.anchored += 1;
        self.taken += 1;
        Some(specs)
    }
}

/// The watchpoints for a candidate's words (at most the debug registers' count).
fn watch_specs(c: &WatchCandidate, kind: WatchKind) -> Vec<WatchSpec> {
    c.words
        .iter()
        .take(MAX_WATCHES)
        .map(|&(addr, len)| WatchSpec {
            addr,
            len: len as u8,
            kind,
        })
        .collect()
}

/// Whether a line whose store-only turns ended on one thread's window `n` times in a row, the
/// last at `at`, skips them at `now` ([`STORES_ALONE_TURNS`]).
fn stores_alone_now(n: u32, at: Instant, now: Instant) -> bool {
    n >= STORES_ALONE_TURNS && now.saturating_duration_since(at) < STORES_ALONE_FOR
}

/// Whether a candidate turn armed `since` ago is over: [`TURN`] once a window of it has
/// counted (`window`: it had hits, or counting time), [`MAX_CANDIDATE_TURN`] if none has.
fn candidate_turn_over(since: Duration, window: bool) -> bool {
    since >= TURN && (window || since >= MAX_CANDIDATE_TURN)
}

/// Whether a line's read+write windows mostly end at their hit cap: on average under a
/// quarter of the duty window's span long, with at least half a cap of hits each (short
/// windows with few hits were cut short by the end of a turn).
fn filled_at_cap(e: &LineEstimate, duty: &laser_driver::DutyCycle) -> bool {
    let windows = f64::from(e.rw_windows);
    e.rw_windows > 0
        && e.rw_armed_s < duty.window.as_secs_f64() / 4.0 * windows
        && e.rw_accesses as f64 >= windows * duty.max_hits_per_window as f64 / 2.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line's other words, nearest to the sampled ones first (body_big_rw_false's line:
    /// samples at offsets 0, 8 and 16; its fourth access, a load at 24, had none).
    #[test]
    fn unsampled_words_nearest_first() {
        let words = [(0x1000, 8), (0x1008, 8), (0x1010, 4)];
        let free = unsampled_slots(0x1000, 64, &words);
        assert_eq!(free, vec![0x1018, 0x1020, 0x1028, 0x1030, 0x1038]);
        // Both sides of a word in the middle, then outwards; 128-byte lines have 16 words.
        let free = unsampled_slots(0x2000, 64, &[(0x2020, 8)]);
        assert_eq!(&free[..3], &[0x2018, 0x2028, 0x2010]);
        assert_eq!(unsampled_slots(0x2000, 128, &[(0x2000, 8)]).len(), 15);
        let all: Vec<(u64, u32)> = (0..8).map(|k| (0x3000 + 8 * k, 8)).collect();
        assert!(unsampled_slots(0x3000, 64, &all).is_empty());
    }

    /// Looks take every unsampled word without an anchor first, three at a time and by
    /// address (the free words change as samples come in), then every group of them with each
    /// anchor in turn (a rare access contends with another thread's stores, and which anchor
    /// is another thread's is not known), up to the cap.
    #[test]
    fn looks_take_each_word_alone_then_go_round_the_groups_and_anchors() {
        let line = 0x1000;
        let free: Vec<u64> = (2..8).map(|k| line + 8 * k).collect();
        let anchors = [(0x1000, 8), (0x1008, 8)];
        let show = |s: Option<Vec<WatchSpec>>| {
            s.map(|s| {
                s.iter()
                    .map(|w| (w.addr, w.kind == WatchKind::Write))
                    .collect::<Vec<_>>()
            })
        };
        let w = |a: u64| (a, false);
        let mut looks = Looks::new(Instant::now());
        let mut look = || show(looks.next(line, &free, &anchors, 0));
        assert_eq!(look(), Some(vec![w(0x1010), w(0x1018), w(0x1020)]));
        assert_eq!(look(), Some(vec![w(0x1028), w(0x1030), w(0x1038)]));
        assert_eq!(
            look(),
            Some(vec![(0x1000, true), w(0x1010), w(0x1018), w(0x1020)])
        );
        assert_eq!(look().unwrap()[..2], [(0x1000, true), w(0x1028)]);
        assert_eq!(look().unwrap()[..2], [(0x1008, true), w(0x1010)]);
        assert_eq!(look().unwrap()[..2], [(0x1008, true), w(0x1028)]);
        assert_eq!(look(), None, "{LOOKS_PER_LINE} looks a line");

        // The free words' order changed after the first look: the word it did not cover
        // comes next, alone, wherever it now sits in the list.
        let mut looks = Looks::new(Instant::now());
        assert!(looks.next(line, &free[..4], &anchors, 0).is_some());
        let now_free = [0x1028, 0x1010, 0x1018, 0x1020];
        assert_eq!(
            show(looks.next(line, &now_free, &anchors, 0)),
            Some(vec![w(0x1028)])
        );
        assert_eq!(
            show(looks.next(line, &now_free, &anchors, 0)).map(|s| s[0]),
            Some((0x1000, true))
        );

        // Words a named access touched (0x1018, 0x1028) wait until the others were looked at,
        // and never share a look with them.
        let seen = byte_mask(0x18, 8) | byte_mask(0x28, 4);
        let mut looks = Looks::new(Instant::now());
        let mut look = || show(looks.next(line, &free, &anchors, seen));
        assert_eq!(look(), Some(vec![w(0x1010), w(0x1020), w(0x1030)]));
        assert_eq!(look(), Some(vec![w(0x1038)]));
        assert_eq!(look(), Some(vec![w(0x1018), w(0x1028)]));
        assert_eq!(look().unwrap()[0], (0x1000, true));

        // A look that named one of its words but not the others takes those again, once.
        let mut looks = Looks::new(Instant::now());
        assert_eq!(
            show(looks.next(line, &free, &anchors, 0)),
            Some(vec![w(0x1010), w(0x1018), w(0x1020)])
        );
        let seen = byte_mask(0x18, 8);
        let mut look = || show(looks.next(line, &free, &anchors, seen));
        assert_eq!(look(), Some(vec![w(0x1010), w(0x1020), w(0x1028)]));
        assert_eq!(look(), Some(vec![w(0x1030), w(0x1038)]));
        assert_eq!(look().unwrap()[0], (0x1000, true));

        // One group and one anchor: a look without it, one with it, then none.
        let mut looks = Looks::new(Instant::now());
        assert_eq!(
            looks
                .next(line, &free[..2], &anchors[..1], 0)
                .map(|s| s.len()),
            Some(2)
        );
        assert_eq!(
            looks
                .next(line, &free[..2], &anchors[..1], 0)
                .map(|s| s.len()),
            Some(3)
        );
        assert!(looks.next(line, &free[..2], &anchors[..1], 0).is_none());
        assert!(Looks::new(Instant::now())
            .next(line, &[], &anchors, 0)
            .is_none());
        assert!(Looks::new(Instant::now())
            .next(line, &free, &[], 0)
            .is_none());
    }

    /// A candidate's free registers go round the line's unsampled words turn by turn; a
    /// candidate that fills the four keeps its own words.
    #[test]
    fn a_candidates_free_registers_take_the_unsampled_words_in_turn() {
        let mut st = Steering::default();
        let c = WatchCandidate {
            line_addr: 0x1000,
            words: vec![(0x1000, 8), (0x1010, 4)],
        };
        // Nearest first: 0x1008 and 0x1018, then 0x1020 and 0x1028, then the last two.
        let want = [[0x1008, 0x1018], [0x1020, 0x1028], [0x1030, 0x1038]];
        for (turn, extra) in want.iter().cycle().take(4).enumerate() {
            let w = st.with_unsampled_words(c.clone(), WatchKind::ReadWrite, 64);
            // Store-only turns in between go round on their own, so the read+write turns
            // do not skip the words next to the sampled ones.
            st.with_unsampled_words(c.clone(), WatchKind::Write, 64);
            let mut expect = c.words.clone();
            expect.extend(extra.iter().map(|&a| (a, 8)));
            expect.sort_unstable();
            assert_eq!(w.words, expect, "read+write turn {turn}");
        }
        let full = WatchCandidate {
            line_addr: 0x2000,
            words: (0..4).map(|k| (0x2000 + 16 * k, 8)).collect(),
        };
        assert_eq!(
            st.with_unsampled_words(full.clone(), WatchKind::ReadWrite, 64)
                .words,
            full.words
        );
    }

    /// Asking whether a code turn is due (a waiting probe then takes its place) marks no
    /// instruction; taking the turn does, until the refresh.
    #[test]
    fn asking_for_due_code_marks_nothing_and_taking_it_does() {
        let now = Instant::now();
        let mut s = Steering::default();
        s.coded.insert(0x20, now);
        assert_eq!(s.code_due(&[0x10, 0x20], now), [0x10]);
        assert_eq!(
            s.code_due(&[0x10, 0x20], now),
            [0x10],
            "asking again: the same"
        );
        assert_eq!(s.take_code_due(vec![0x10, 0x20], now), [0x10]);
        assert!(s.code_due(&[0x10, 0x20], now).is_empty());
        assert_eq!(s.code_due(&[0x10, 0x20], now + CODE_REFRESH), [0x10, 0x20]);
    }

    /// A code turn whose window sees no new hit is looked at less and less often (a window
    /// on code that runs rarely woke laser every 50 µs: ~1,000 wake-ups a second of a
    /// program that starts threads every few milliseconds); one new hit brings the looks
    /// back to every 50 µs, and the poll hint follows.
    #[test]
    fn looks_at_a_quiet_code_turn_back_off_and_a_hit_resets_them() {
        let mut wait = MOVING_POLL;
        let mut waits = Vec::new();
        for _ in 0..7 {
            wait = moving_poll_after(wait, false);
            waits.push(wait.as_micros());
        }
        assert_eq!(waits, [100, 200, 400, 800, 1600, 1600, 1600]);
        assert_eq!(moving_poll_after(wait, true), MOVING_POLL);
        let s = Steering {
            turn: Some((Turn::Code, Instant::now())),
            counting: true,
            moving_poll: wait,
            ..Steering::default()
        };
        assert_eq!(s.turn_poll_hint(), Some(MOVING_POLL_MAX));
        let fresh = Steering {
            turn: Some((Turn::Code, Instant::now())),
            counting: true,
            ..Steering::default()
        };
        assert_eq!(
            fresh.turn_poll_hint(),
            Some(MOVING_POLL),
            "never below 50 µs"
        );
    }

    /// An alternating line's turns go store-only, read+write, … until two store-only turns
    /// in a row ended on one thread's window; then read+write only for a second, then a
    /// store-only turn is tried again.
    #[test]
    fn store_only_turns_that_see_one_thread_give_way_to_read_write_ones() {
        let line = 0x1000;
        let t0 = Instant::now();
        let mut s = Steering::default();
        s.alternating.insert(line, false);
        let kinds: Vec<WatchKind> = (0..4).map(|_| s.alternate(line, t0)).collect();
        use WatchKind::{ReadWrite as Rw, Write as W};
        assert_eq!(kinds, [W, Rw, W, Rw]);
        assert_eq!(s.alternate(0x2000, t0), Rw, "not alternating: read+write");
        s.stores_alone.insert(line, (STORES_ALONE_TURNS - 1, t0));
        assert_eq!(s.alternate(line, t0), W, "one such turn is not enough");
        s.stores_alone.insert(line, (STORES_ALONE_TURNS, t0));
        let kinds: Vec<WatchKind> = (0..3).map(|_| s.alternate(line, t0)).collect();
        assert_eq!(kinds, [Rw, Rw, Rw]);
        let later = t0 + STORES_ALONE_FOR;
        assert_eq!(s.alternate(line, later), W, "tried again after a while");
    }

    #[test]
    fn a_survey_turn_is_looked_at_when_its_counting_time_is_up() {
        let at = |turn, counted| Steering {
            turn: Some((turn, Instant::now())),
            counted,
            ..Steering::default()
        };
        assert_eq!(
            at(Turn::Survey, Duration::ZERO).turn_poll_hint(),
            Some(SURVEY_TURN)
        );
        let ms = Duration::from_millis;
        assert_eq!(
            at(Turn::Probe, ms(15)).turn_poll_hint(),
            Some(SURVEY_TURN - ms(15))
        );
        assert_eq!(
            at(Turn::Survey, ms(25)).turn_poll_hint(),
            Some(SURVEY_POLL_MIN)
        );
    }

    /// While armed watchpoints' fast-string cost is unknown, the loop looks at it every
    /// few ms, not only at the turn's end; once known to slow the program, at the armed
    /// time its budget has left; known to cost nothing, only at the turn's end.
    #[test]
    fn armed_time_is_looked_at_until_its_cost_is_known_and_within_it() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let armed = |slowdown, run: Duration, armed| Steering {
            turn: Some((Turn::Survey, t0)),
            armed_after_step: true,
            armed_mark: Some(t0 + run),
            started: Some(t0),
            armed,
            slowdown,
            armed_budget: 0.0075,
            ..Steering::default()
        };
        assert_eq!(armed(None, ms(0), ms(0)).poll_wait(), ARMED_COST_LOOK);
        assert_eq!(armed(Some(1.0), ms(0), ms(0)).poll_wait(), SURVEY_TURN);
        // 2x slower armed, after 1 s of run and 2 ms armed: 7.5 - 2 = 5.5 ms of cost left,
        // which the budget's growth while armed stretches to 5.5 / (1 - 0.0075).
        let left = armed(Some(2.0), ms(1000), ms(2)).poll_wait();
        assert!(
            (left.as_secs_f64() - 5.5e-3 / 0.9925).abs() < 1e-6,
            "{left:?}"
        );
        // Spent: looked at again soon (the step disarms).
        assert_eq!(
            armed(Some(2.0), ms(1000), ms(10)).poll_wait(),
            SURVEY_POLL_MIN
        );
        // Not armed: the turn's own wait, and the loop's longest without a turn.
        let mut idle = Steering {
            armed_after_step: false,
            ..armed(None, ms(0), ms(0))
        };
        assert_eq!(idle.poll_wait(), SURVEY_TURN);
        // A loop that never steps (no steering) waits its longest every time, not what is
        // left of a first wait (which spun the loop at 0 ms: `--watch false` ran 1.43x).
        let mut unsteered = Steering::default();
        for _ in 0..3 {
            assert_eq!(unsteered.poll_wait(), MAX_POLL);
            std::thread::sleep(ms(1));
        }
    }

    /// Armed time counts from the mark the arming step left, while the window counts at
    /// both ends; a look between the turn's own looks leaves the turn's counting time alone.
    #[test]
    fn armed_time_counts_from_the_arming_and_a_cost_look_is_no_turn_look() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = Steering {
            turn: Some((Turn::Survey, t0)),
            armed_after_step: true,
            armed_mark: Some(t0),
            last_step: Some(t0),
            counting: false,
            started: Some(t0),
            ..Steering::default()
        };
        // No estimate yet: the loop waits ARMED_COST_LOOK, not the turn's 20 ms.
        assert_eq!(s.poll_wait(), ARMED_COST_LOOK);
        let at = s.cost_look_at.unwrap();
        let turn_at = s.turn_look_at.unwrap();
        assert_eq!(turn_at - at, SURVEY_TURN - ARMED_COST_LOOK);
        // Woken early (the rings, a deadline): a whole step; the next wait is set anew.
        assert!(!s.cost_look_only(at - ms(1), 0));
        assert!(!s.cost_look_only(at + ms(1), 0), "taken");
        // Woken by the wait: the cost alone, unless hits came.
        s.poll_wait();
        let at = s.cost_look_at.unwrap();
        assert!(!s.cost_look_only(at, 1));
        s.poll_wait();
        let at = s.cost_look_at.unwrap();
        assert!(s.cost_look_only(at, 0));
        s.note_armed(t0 + ms(4), true);
        assert_eq!(s.armed, ms(4));
        assert_eq!(s.counted, Duration::ZERO);
        // Estimate known at 1.0: the turn's own look, where it was before the cost looks.
        s.slowdown = Some(1.0);
        let wait = s.poll_wait();
        assert!(
            wait <= SURVEY_TURN && wait > SURVEY_TURN - ms(10),
            "{wait:?}"
        );
        assert!(wait <= turn_at.saturating_duration_since(Instant::now()) + ms(1));
        assert_eq!((s.turn_look_at, s.cost_look_at), (None, None), "used up");
        // That step counts the armed time since the look, not since the last step.
        s.note_step(t0 + ms(20), true);
        assert_eq!(s.armed, ms(20));
        // A window not counting at either end adds nothing.
        s.armed_after_step = false;
        s.note_step(t0 + ms(30), true);
        assert_eq!(s.armed, ms(20));
        // The cost: 20 ms at 1.5x is 10 ms, over 0.75% of a 30 ms run.
        s.slowdown = Some(1.5);
        s.armed_budget = 0.0075;
        assert!(s.armed_cost_spent(t0 + ms(30)));
        assert!(!s.armed_cost_spent(t0 + ms(1400)));
    }

    /// A turn's counting time runs from when its window was armed: the step after the
    /// arming one counts the time since (it alone finds the window counting), then each step
    /// the time since the last; a cooldown in between counts nothing.
    #[test]
    fn a_turn_counts_from_its_arming() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = Steering {
            turn: Some((Turn::Survey, t0)),
            last_step: Some(t0),
            counting: false,
            counts_from: Some(t0 + ms(3)),
            ..Steering::default()
        };
        s.note_step(t0 + ms(20), true);
        assert_eq!(s.counted, ms(17), "from the arming, after its opens");
        s.note_step(t0 + ms(25), true);
        assert_eq!(s.counted, ms(22));
        s.note_step(t0 + ms(30), false);
        s.note_step(t0 + ms(40), true);
        assert_eq!(
            s.counted,
            ms(22),
            "cooling, then counting again from this step"
        );
        s.note_step(t0 + ms(41), true);
        assert_eq!(s.counted, ms(23));
    }

    /// The loop polls every FIRST_STEP until steering's first step, when it steps at all,
    /// and for FIRST_STEP_FOR at most.
    #[test]
    fn the_first_step_comes_soon_when_the_loop_steps() {
        let mut s = Steering::default();
        assert_eq!(s.poll_wait(), MAX_POLL);
        s.expect_steps();
        assert_eq!(s.poll_wait(), FIRST_STEP);
        s.started = Some(Instant::now());
        assert_eq!(s.poll_wait(), MAX_POLL);
        let mut s = Steering::default();
        s.expect_steps();
        s.steps_expected = s.steps_expected.map(|t| t - FIRST_STEP_FOR);
        assert_eq!(s.poll_wait(), MAX_POLL, "no window came: the idle poll");
    }

    fn est(line: u64, transfers: u64, armed_s: f64) -> LineEstimate {
        LineEstimate {
            line_addr: line,
            transfers,
            true_transfers: 0,
            false_transfers: transfers,
            accesses: transfers * 2,
            rw_accesses: transfers * 2,
            rw_stores: 0,
            rw_windows: 1,
            rw_armed_s: armed_s,
            rw_clamped: false,
            outside: 0,
            windows: 1,
            inferred: false,
            armed_s,
            effective_s: armed_s,
            stand_in_s: 0.0,
            clamped: false,
            stores_only: false,
            code: false,
            front: false,
            shared_windows: 1,
            quiet_windows: 0,
            rate_per_s: transfers as f64 / armed_s.max(1e-9),
            rel_error: 0.1,
            per_pc: Vec::new(),
        }
    }

    fn cand(line: u64) -> WatchCandidate {
        WatchCandidate {
            line_addr: line,
            words: vec![(line, 8)],
        }
    }

    fn lines(v: &[WatchCandidate]) -> Vec<u64> {
        v.iter().map(|c| c.line_addr).collect()
    }

    #[test]
    fn a_cooldown_is_not_counting_time() {
        let mut s = Steering::default();
        let t = Instant::now();
        let ms = Duration::from_millis;
        s.note_step(t, true);
        s.note_step(t + ms(5), true);
        assert_eq!(s.counted, ms(5));
        // A cooldown from 5 ms to 129 ms; the next window counts when the step comes.
        s.note_step(t + ms(10), false);
        s.note_step(t + ms(129), true);
        assert_eq!(s.counted, ms(5));
        s.note_step(t + ms(139), true);
        assert_eq!(s.counted, ms(15));
        assert!(!s.turn_spent(0, 100));
    }

    #[test]
    fn a_line_is_left_alone_once_its_estimate_is_good_until_refresh() {
        let mut s = Steering::default();
        let t = Instant::now();
        // A: 50 transfers so far, B: none yet → both due.
        let due = s.due(&[est(0x40, 50, 0.05)], vec![cand(0x40), cand(0x80)], t);
        assert_eq!(lines(&due), [0x40, 0x80]);
        // A reaches 400 transfers: settled; B still due.
        let due = s.due(&[est(0x40, 450, 0.1)], vec![cand(0x40), cand(0x80)], t);
        assert_eq!(lines(&due), [0x80]);
        // B watched 0.3 s with few transfers: quiet, settled too → nothing to watch.
        let t1 = t + Duration::from_secs(1);
        let due = s.due(
            &[est(0x40, 450, 0.1), est(0x80, 3, 0.35)],
            vec![cand(0x40), cand(0x80)],
            t1,
        );
        assert!(due.is_empty(), "{:?}", lines(&due));
        // After REFRESH, A is due again; its old transfers don't re-settle it at once.
        let t2 = t + REFRESH + Duration::from_millis(1);
        let due = s.due(&[est(0x40, 460, 0.12)], vec![cand(0x40)], t2);
        assert_eq!(lines(&due), [0x40]);
        // 400 new transfers since the refresh began: settled again.
        let due = s.due(&[est(0x40, 860, 0.2)], vec![cand(0x40)], t2);
        assert!(due.is_empty());
    }

    #[test]
    fn windows_that_end_at_their_cap_early_are_told_from_cut_short_ones() {
        let duty = laser_driver::DutyCycle::default();
        let cap = duty.max_hits_per_window;
        let span = duty.window.as_secs_f64();
        let mut e = est(0x40, 0, 0.0);
        // kmeans: ten read+write windows of 0.5 ms, each a cap of loads.
        (e.rw_windows, e.rw_armed_s, e.rw_accesses) = (10, 10.0 * 0.0005, 10 * cap);
        assert!(filled_at_cap(&e, &duty));
        // Windows that ran their span: not filled, whatever their hits.
        e.rw_armed_s = 10.0 * span;
        assert!(!filled_at_cap(&e, &duty));
        // Short windows with few hits: cut short by the end of turns.
        (e.rw_armed_s, e.rw_accesses) = (10.0 * 0.0001, 10);
        assert!(!filled_at_cap(&e, &duty));
        e.rw_windows = 0;
        assert!(!filled_at_cap(&e, &duty));
        // Code windows that end at their cap, and no read+write window yet: nothing is
        // known of how the line's loads fill one.
        (e.windows, e.armed_s, e.accesses) = (10, 10.0 * 0.0005, 10 * cap);
        assert!(!filled_at_cap(&e, &duty));
    }

    #[test]
    fn a_candidate_turn_lasts_until_a_window_of_it_has_counted() {
        let ms = Duration::from_millis;
        assert!(!candidate_turn_over(ms(50), true));
        assert!(candidate_turn_over(TURN, true));
        // Armed in a cooldown: the turn waits for its window…
        assert!(!candidate_turn_over(TURN, false));
        assert!(!candidate_turn_over(ms(300), false));
        // …but not for ever.
        assert!(candidate_turn_over(MAX_CANDIDATE_TURN, false));
    }

    #[test]
    fn a_survey_turn_one_thread_filled_is_retried_soon_a_few_times() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        let a = Alone::note(None, t);
        assert_eq!(a.turns, 1);
        // Not in the turn right after, but after SURVEY_RETRY_AFTER, not SURVEY_REFRESH.
        assert!(!a.retry_due(Some(t), t + ms(5)));
        assert!(a.retry_due(Some(t), t + SURVEY_RETRY_AFTER));
        assert!(SURVEY_RETRY_AFTER < SURVEY_REFRESH);
        // The first retry waits for its turn however long the budget keeps windows shut.
        assert!(a.retry_due(Some(t), t + 2 * SURVEY_REFRESH));
        // Up to SURVEY_RETRIES retries that one thread fills too, then none until the
        // refresh, when the count starts again.
        let mut a = a;
        for k in 1..=SURVEY_RETRIES {
            let at = t + ms(30 * u64::from(k));
            a = Alone::note(Some(a), at);
            assert_eq!(a.retry_due(Some(at), at + ms(25)), k < SURVEY_RETRIES);
        }
        let later = t + SURVEY_REFRESH;
        assert!(!a.retry_due(Some(t + ms(60)), later));
        let a = Alone::note(Some(a), later);
        assert_eq!(a.turns, 1);
        assert!(a.retry_due(Some(later), later + SURVEY_RETRY_AFTER));
    }

    #[test]
    fn a_probe_that_saw_one_thread_is_tried_again_a_few_times() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        let mut p = Probed {
            first: t,
            last: t,
            tries: 1,
            saw_two: false,
        };
        // Not back to back: the next try waits for a survey refresh.
        assert!(!p.due(t + ms(100)));
        assert!(p.due(t + SURVEY_REFRESH));
        // Up to PROBE_TRIES within a PROBE_REFRESH, then not until it has passed.
        p.tries = PROBE_TRIES;
        p.last = t + ms(600);
        assert!(!p.due(t + ms(600) + SURVEY_REFRESH));
        assert!(p.due(t + PROBE_REFRESH));
        // One that saw two threads has told what a probe can: once per PROBE_REFRESH.
        let seen = Probed {
            first: t,
            last: t,
            tries: 1,
            saw_two: true,
        };
        assert!(!seen.due(t + SURVEY_REFRESH));
        assert!(seen.due(t + PROBE_REFRESH));
    }
}
