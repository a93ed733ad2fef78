//! Hardware data watchpoints on chosen addresses in every thread of the target.
//!
//! x86 has 4 debug registers per thread, so a window points up to [`MAX_WATCHES`] breakpoint
//! events at the chosen words. Hits are rate-limited by the duty cycle in [`crate::duty`].
//!
//! **Attach** (per thread, no `inherit`): every thread gets its events when it is found, all
//! parked at an unmapped address and disabled; [`Watcher::arm`] re-points them with
//! `PERF_EVENT_IOC_MODIFY_ATTRIBUTES`. They are limited to their share of the window's cap like launch
//! events (below): the limit outlives a window, so an event that trapped is replaced by a
//! fresh one before it counts again ([`Watcher::enable_attached`]). A window's events are
//! enabled, as launch ones are, when the reader is about to sleep ([`Watcher::enable_opened`]).
//!
//! **Launch** (per thread, never `inherit`): events exist only while a window counts.
//! A window opens the armed set on every thread of the target then alive, one event per slot
//! writing into the thread's own watch ring ([`ThreadRing`], made at the thread's first
//! window and kept until it exits), and closes them when it ends. (The kernel lets a
//! `cpu = -1` event write only into a ring of the same thread; into the per-CPU leader rings
//! it takes one event per slot *and CPU*, which is what a thread whose ring could not be
//! made, and every inherited window, still gets.) A thread
//! created while a window counts gets its events when its creation record is read (the
//! reader wakes at least every 50 ms); one created between windows costs nothing, and the next
//! window opens events on it.
//!
//! ```text
//!  window     ├──── counting ────┤   cooling / idle   ├── counting ──┤
//!  thread A   ████ own events ████                    ███ own ███████
//!  thread B        (created) ██ own                   ███ own ███████
//!  thread C                            (created: nothing to open)  ███ own
//! ```
//!
//! **Whole-CPU launch windows** ([`Watcher::set_cpu_wide`]; where CPU-wide events are
//! allowed, and while no other laser session watches on the machine, [`crate::peers`]): a
//! window opens one event per slot *and CPU* with `pid = -1`, into that CPU's leader ring, and
//! watches whatever runs there; other processes' hits are dropped as read. No per-thread
//! events, rings or opens at thread creation, every thread watched from its first
//! instruction, and no debug-register reload at each context switch of a watched thread
//! (5–6 µs each on this VM: kmeans 1.12 → 1.06 of its bare time, side by side). A CPU's
//! events are one group led by slot 0's ([`GroupRole`]): the leader's enable starts them all
//! and the members' limits are set without interrupting that CPU, so a window of n slots
//! takes n + 2 cross-CPU calls a CPU instead of 2n + 1. Where another tool's breakpoints
//! leave no room (`ENOSPC`), that window opens per thread.
//!
//! **The kernel ends a window's traps.** Every event is enabled with
//! `PERF_EVENT_IOC_REFRESH(limit)`, its share of the window's hit cap ([`Watcher::limit`]):
//! after that many samples the kernel disables it in its own overflow handler, on the CPU
//! taking the traps, and the window ends at that hit. Without that a window ends only
//! when the reader has read the cap and closed the events, and closing a running thread's
//! event waits for an interrupt on its CPU: a CI recording showed a window trapping for 10 ms
//! past its cap (1,246 hits where the cap was 116) while the reader sat in the closes, and the
//! cooldown those hits bought left the line 2 windows in 1.5 s. The kernel refuses REFRESH on
//! an inherited event, hence events opened per thread rather than inherited (which also
//! spares every thread created during a window the copy: ≈ 20 µs per breakpoint at clone
//! and exit).
//!
//! **Inherited windows** ([`Watcher::set_inherit`], for an object's access history): a thread
//! created while such a window counts inherits its creator's events from its first
//! instruction; the window ends only when the reader closes it. Opening races with thread
//! creation there: a thread created after the listing of `/proc/PID/task` by a thread whose
//! events were not open yet has none. The list is read again until it has nothing new; a
//! thread found that way may instead carry inherited events. The kernel gives a thread at most
//! 4 breakpoints per CPU, so laser opens its own plus parked fillers up to 4: `ENOSPC` says
//! the thread already has events, and only laser's extra ones are closed
//! ([`probe_uncovered`]).

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use perf_event_open_sys::bindings::perf_event_attr;

use crate::attr::{self, Binding, WatchKind};
use crate::company::{self, Company};
use crate::duty::{Action, CostModel, DutyState};
pub use crate::duty::{DutyCycle, WatchStats};
use crate::error::DriverError;
use crate::mmap_ring::MmapRing;
use crate::peers::{self, Peers};
use crate::switches::{SwitchTally, SWITCH_COST};
use crate::sys;
use crate::Event;

/// Debug registers per thread on x86-64.
pub const MAX_WATCHES: usize = 4;

/// Traps the hit-cost calibration takes (see `Watcher::calibrate_once`): enough for a stable
/// mean on the thread's CPU clock, few enough that laser's thread, which takes them while
/// the program runs, takes little CPU from it. 40 calibrations of each size, interleaved
/// (thirty-sixth session): 40 traps gave a median of 10.8 µs (10th–90th percentile
/// 10.6–13.0) and took 468 µs of laser's CPU a call; 16 traps gave 10.7 µs (10.6–13.8) for
/// 205 µs. Under a program's load a call took ~0.9 ms at 40.
const CALIBRATION_TRAPS: u32 = 16;

/// What a launch prices a hit at until a window has trapped and the calibration has run
/// (`Watcher::calibrate_once`): the top of what it measures here (25–35 µs with the sample
/// write and a wake-up per hit), so windows opened before it keep within the budget.
const PROVISIONAL_HIT_COST: Duration = Duration::from_micros(35);

/// How long a breakpoint refused while another session's whole-CPU window is open waits for
/// that window to go: it re-opens per thread at the other session's next poll, but that
/// session's reader may sleep through a quiet window, which ends at the latest after its
/// duty-cycle window ([`crate::duty::DEFAULT_WINDOW`], 100 ms) and a poll (50 ms).
const PEER_WINDOW_WAIT: Duration = Duration::from_millis(300);

/// Largest user-space address + 1 on x86-64 (47-bit user half).
const USER_END: u64 = 0x0000_8000_0000_0000;

/// Measures what one watchpoint hit costs on this machine now: `n` writes to a word of
/// laser's own with a breakpoint on it, on the thread's CPU clock (so time spent preempted on
/// a loaded machine does not count), minus the same writes without. The trap is the same
/// #DB exception + perf handling the target pays, including writing the sample into a ring
/// buffer as the target's events do. The ring is sized to hold all `n` samples.
///
/// Until the sixteenth session this asked for no wake-up with `wakeup_events = u32::MAX`,
/// which the kernel reads as -1 and so woke the reader on *every* sample
/// ([`attr::MAX_WAKEUP_EVENTS`]): 25–35 µs per hit here, where the target's traps (woken once
/// per `limit` hits) cost 11–16 µs.
///
/// With `wake_each`, the measurement keeps that wake-up per hit on purpose
/// ([`CostModel::Traps`]: about twice the trap alone here, standing in for the costs of a
/// window that model does not charge separately).
pub fn measure_hit_cost(n: u32, wake_each: bool) -> Result<Duration, DriverError> {
    keep_lost_traps();
    let word = Box::into_raw(Box::new(0u64));
    let p = word;
    // The target's events wake the reader once per `limit` hits.
    let wakeup = if wake_each {
        1
    } else {
        attr::MAX_WAKEUP_EVENTS
    };
    let base = attr::watch(Binding::Attach, wakeup);
    let a = attr::repoint(&base, p as u64, 8, WatchKind::Write, false);
    let writes = |n: u32| {
        let t0 = thread_cpu_time();
        for i in 0..n {
            // SAFETY: `p` points at the live boxed u64 above; volatile so every store
            // happens (each one is a watchpoint hit).
            unsafe { std::ptr::write_volatile(p, i as u64) };
        }
        thread_cpu_time().saturating_sub(t0)
    };
    let fd = sys::open(&a, 0, -1, "watchpoint hit-cost calibration on laser itself")?;
    // ≈ 200 bytes per sample with the user registers: room for all of them, so none is
    // dropped for a full ring (which would be cheaper than what the target pays).
    let pages = (n as usize * 256).div_ceil(4096).next_power_of_two().max(8);
    let ring = MmapRing::new(&fd, pages)?;
    let with = writes(n);
    drop(ring);
    drop(fd);
    let without = writes(n);
    // SAFETY: `word` came from Box::into_raw above and is freed exactly once, here.
    drop(unsafe { Box::from_raw(word) });
    Ok(with.saturating_sub(without) / n.max(1))
}

/// SIGTRAPs of lost debug exceptions kept from laser's own threads ([`keep_lost_traps`]).
static LOST_TRAPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many lost debug exceptions laser's own calibration traps have taken.
pub fn own_lost_traps() -> u64 {
    LOST_TRAPS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Lets laser's own process survive the SIGTRAP of a lost debug exception
/// ([`crate::trap_guard`] says what that is): the calibration traps on laser's own thread,
/// and the kernel forces the signal through an ignored or blocked SIGTRAP, to its default
/// action, which kills. A handler it honours, so one that counts and returns is installed
/// while SIGTRAP has its default action (a debugger that traces laser still sees every trap
/// first). The target cannot be given one (it is someone else's program); it has the guard.
/// Returning resumes after the store: a data breakpoint traps after the instruction.
fn keep_lost_traps() {
    extern "C" fn lost(_: libc::c_int) {
        LOST_TRAPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    // SAFETY: sigaction reads and writes live sigaction structs; the handler only touches an
    // atomic, which is async-signal-safe.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGTRAP, std::ptr::null(), &mut old) != 0
            || old.sa_sigaction != libc::SIG_DFL
        {
            return;
        }
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = lost as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGTRAP, &sa, std::ptr::null_mut());
    }
}

fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into a live local.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The ring a window event writes into: its descriptor and its wake-up counter.
#[derive(Clone, Copy)]
struct RingOut {
    fd: RawFd,
    wake: RingWake,
}

/// Launch: one CPU's leader, whose ring that CPU's window events write into, and the ring's
/// wake-up counter as laser follows it.
struct RingLeader {
    cpu: i32,
    /// A duplicate of the session's leader descriptor.
    fd: OwnedFd,
    wake: RingWake,
}

impl RingLeader {
    fn out(&self) -> RingOut {
        RingOut {
            fd: self.fd.as_raw_fd(),
            wake: self.wake,
        }
    }
}

/// Data pages of a thread's watch ring ([`ThreadRing`]): 64 KiB, about 220 hits with their
/// registers and stack tops (296 bytes each, [`attr::WATCH_STACK_USER_BYTES`]), where the
/// reader wakes at a window event's limit (~110 hits on this 2-CPU VM).
const THREAD_RING_PAGES: usize = 16;

/// Launch: the ring one thread's window events write into ([`attr::watch_ring`]), made at
/// the first window that opens events on the thread and kept until it exits. With it a
/// window opens one event per slot on a thread, not one per slot and CPU: on this 2-CPU VM
/// half the opens, enables and closes (each one interrupts the thread's CPU), on a 64-CPU
/// machine a 64th.
struct ThreadRing {
    fd: OwnedFd,
    ring: MmapRing,
    wake: RingWake,
    /// Its thread exited (the owner hung up): dropped once drained.
    hup: bool,
}

impl ThreadRing {
    fn out(&self) -> RingOut {
        RingOut {
            fd: self.fd.as_raw_fd(),
            wake: self.wake,
        }
    }

    fn open(tid: i32) -> Result<Self, DriverError> {
        let fd = sys::open(&attr::watch_ring(), tid, -1, "watch ring")?;
        let ring = MmapRing::new(&fd, THREAD_RING_PAGES)?;
        Ok(ThreadRing {
            fd,
            ring,
            wake: RingWake::default(),
            hup: false,
        })
    }
}

/// The kernel's wake-up counter of one leader ring, followed from the samples read.
///
/// Wake-ups are counted per ring, not per event: every watch sample written into a CPU's
/// ring adds one to the ring's count, and when the count reaches the writing event's
/// `wakeup_events`, that much is taken off and the reader is woken. What is left carries into
/// the next window. With `wakeup_events` fixed, the first wake-up of a window came at a point
/// that drifted from window to window, mostly mid-window: a scheduler trace of fs (release
/// build) had the real-time reader on a CPU for 30% of the windows' time, most of it draining
/// those wake-ups, each time keeping a thread of the watched pair off its CPU. So a window's
/// events get `wakeup_events` = what is left + the limit: its first wake-up comes after
/// `limit` hits on the ring, when a thread alone on that CPU spends its limit and the window
/// ends anyway. (Exact while laser has read every sample written before the events opened,
/// as at every window after a cooldown; stragglers of a set re-pointed mid-window make it
/// approximate.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct RingWake {
    /// What the ring's counter holds (below `wake`).
    count: u64,
    /// `wakeup_events` of the events open on the ring (0: none opened yet).
    wake: u32,
}

impl RingWake {
    /// `n` more watch samples were written into the ring.
    fn follow(&mut self, n: u64) {
        if self.wake > 0 {
            self.count = (self.count + n) % u64::from(self.wake);
        }
    }

    /// New events open on the ring: the first wake-up after `limit` more samples.
    fn rearm(&mut self, limit: u32) {
        self.wake = (self.count + u64::from(limit)).min(u64::from(attr::MAX_WAKEUP_EVENTS)) as u32;
    }
}

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
        if self.kind == WatchKind::Exec {
            // An instruction breakpoint covers the instruction starting at `addr`, at any
            // alignment; the kernel wants its length given as 8.
            if self.len != 8 {
                return Err(bad("an instruction watch takes length 8"));
            }
        } else if !matches!(self.len, 1 | 2 | 4 | 8) {
            return Err(bad("length must be 1, 2, 4 or 8 bytes"));
        }
        if self.kind != WatchKind::Exec && !self.addr.is_multiple_of(self.len as u64) {
            return Err(bad("address must be aligned to the length"));
        }
        if self.addr.saturating_add(self.len as u64) > USER_END {
            return Err(bad("address is not in user space"));
        }
        Ok(())
    }
}

/// One process of the target and the CPU time last read from its clock, which stands for it
/// once it has exited (the clock of a reaped process cannot be read), so the sum over the
/// target's processes never goes back.
struct TargetProcess {
    pid: libc::pid_t,
    last: Cell<Duration>,
    live: bool,
}

impl TargetProcess {
    fn cpu(&self) -> Duration {
        if self.live {
            if let Ok(t) = sys::process_cpu_time(self.pid) {
                self.last.set(t.max(self.last.get()));
            }
        }
        self.last.get()
    }
}

struct WatchEvent {
    /// Attach: the thread's leader key; launch: the thread the event was opened on.
    key: i64,
    slot: u8,
    /// The CPU it counts on, -1 for all (attach, and launch events writing into their
    /// thread's own ring).
    cpu: i32,
    fd: OwnedFd,
    /// As opened: `MODIFY_ATTRIBUTES` wants every other field unchanged ([`attr::repoint`]).
    attr: perf_event_attr,
    id: u64,
    /// The kernel stops it at a hit limit (`PERF_EVENT_IOC_REFRESH`). An attached thread's
    /// events are opened without one and given theirs at their first enable.
    limited: bool,
    /// Its place in its CPU's event group (whole-CPU windows, [`Watcher::open_cpu_group`]).
    group: GroupRole,
}

/// A whole-CPU window's events of one CPU form one group: slot 0's event leads, opened
/// disabled, and the others are opened enabled under it, so that the leader's enable starts
/// the whole group with one interrupt of that CPU, and a member's `REFRESH` (its own hit
/// limit) needs none. Opened as separate events, each open, enable and close interrupted the
/// CPU and rescheduled its events: `benchmarks/watch-cost/window_ops.c` (a thread spinning on
/// the events' CPU, a window every ~0.4 ms), mode 3 against mode 0, four slots: 6 cross-CPU
/// calls a window instead of 9, laser's work 133–135 µs instead of 186–188, the spinner 8–11%
/// faster; two slots: 4 calls instead of 5, 75–87 µs instead of 89–103; one slot is the same
/// either way. Members are kept before their leader in [`Watcher::events`] and so close
/// first: a leader closed before its members would leave them as enabled events of their
/// own, counting with no leader to stop them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GroupRole {
    /// An event of its own (per-thread windows, attach, a whole-CPU window of one slot).
    Alone,
    Leader,
    Member,
}

/// The watchpoints of one session. Obtained from `Session::watch_mut`.
pub struct Watcher {
    binding: Binding,
    events: Vec<WatchEvent>,
    specs: Vec<WatchSpec>,
    duty: DutyCycle,
    state: DutyState,
    calibrated: bool,
    /// The hit cost the policy was given, below which no measurement goes.
    floor: Duration,
    /// Launch: hits are priced at [`PROVISIONAL_HIT_COST`] until the calibration.
    provisional: bool,
    /// laser's thread CPU time the calibration took, left out of the window work charged
    /// next ([`Watcher::charge_ops`]).
    calibration_cpu: Duration,
    /// laser's thread CPU clock, and the calibration CPU not yet taken by `charge_ops`, at the
    /// end of the last tick that left a window counting ([`Watcher::note_reader`]).
    reader_mark: Option<(Duration, Duration)>,
    /// The target's processes, whose CPU time the duty cycle budgets against: the one laser
    /// launched or attached to, and (launch) every process it forks, since its windows open
    /// events on those too. Empty: a watcher whose clock stands still (the
    /// state-machine tests).
    procs: Vec<TargetProcess>,
    /// `WatchSet` events not yet handed to the session.
    markers: Vec<Event>,
    /// The last marker said "nothing watched" (or none was sent yet).
    last_marked_empty: bool,
    /// The armed data words are a front window ([`Watcher::arm_front`]) or a look
    /// ([`Watcher::arm_look`]).
    front: bool,
    look: bool,
    /// Online CPUs: how many rings share the hits (launch) and how fast the target can
    /// burn through a cooldown.
    cpus: u32,
    /// Launch: each CPU's leader and its ring's wake-up counter ([`RingLeader`]).
    leaders: Vec<RingLeader>,
    /// Launch: each thread's watch ring once a window opened events on it ([`ThreadRing`]);
    /// `None` where one could not be made (the mlock limit, descriptors): that thread's
    /// events go per CPU into the leaders' rings, as every inherited window's do.
    thread_rings: BTreeMap<i32, Option<ThreadRing>>,
    /// Launch: ids of events opened since the session last asked (for its decoder)…
    opened_ids: Vec<(u64, u8)>,
    /// …and of events closed since: forgotten once the records written before are read.
    closed_ids: Vec<u64>,
    /// Launch: the descriptor limit was raised for window events.
    nofile_raised: bool,
    /// While a window opens ([`Watcher::open_window`]): events open disabled…
    opening: bool,
    /// …and those from this index on are enabled together when the reader is about to sleep
    /// ([`Watcher::enable_opened`]).
    unenabled_from: Option<usize>,
    /// Attach: a window's events wait, disabled, for the reader to be about to sleep
    /// ([`Watcher::enable_opened`]), as a launch window's do.
    attached_enable_due: bool,
    /// Threads left unwatched (at least once), and why: sampled, but their accesses are
    /// missing from every watch window that could not be opened on them.
    unwatched: BTreeMap<i32, Unwatched>,
    /// Hits read per event that trapped since its limit was last set (the window opened, or
    /// it was renewed), by (thread, slot, CPU — `u32::MAX` for an attached thread's one
    /// event per slot): those that may have spent it, and the hit that did ends the counting
    /// window ([`Watcher::note_hit`])…
    trapped: BTreeMap<(i64, u8, u32), u64>,
    /// Threads whose hits the last window that had any was ended with ([`Watcher::last_hitters`]).
    last_hitters: usize,
    /// …unless samples were lost: then any event may have trapped unseen.
    trapped_unknown: bool,
    /// When the events' limits were last all set (sample clock, ns), and later, per
    /// (thread, slot), when one was renewed alone. A hit taken before is a straggler of an
    /// event closed since, read late: it counts toward no current event's limit. Counted,
    /// such stragglers once "spent" a fresh event of a re-armed window, and the end marker
    /// that made left the window announced as ended while it counted, so the real spend
    /// that followed ended nothing: a recording had a 102 ms window with one thread's
    /// first 51 hits and nothing after.
    limits_since: u64,
    renewed_since: BTreeMap<(i64, u8), u64>,
    /// When the counting window was announced (sample clock, ns): a spending hit before
    /// it (in the margin while the events opened) ends no window; the duty cycle ends it.
    counting_since: u64,
    /// Attach: each thread's id and its leader's descriptor, by key, for re-opening the
    /// events that trapped ([`Watcher::enable_attached`]). Not a duplicate (a few hundred
    /// threads would pass the descriptor limit): the session closes a thread's leader only
    /// together with [`Watcher::remove`], which forgets it here.
    thread_leaders: BTreeMap<i64, (i32, RawFd)>,
    /// Launch: threads the open window has tried (events opened, or unwatched), so a thread
    /// both listed and announced by its creation record is opened once.
    window_tids: BTreeSet<i32>,
    /// Launch: windows are inherited into threads created while they count
    /// ([`Watcher::set_inherit`]).
    inherit: bool,
    /// Context switches of the watched threads while a window is armed, charged to the
    /// duty cycle at [`SWITCH_COST`] each ([`crate::switches`]).
    switches: SwitchTally,
    /// Launch: windows open one event per slot and CPU for the whole CPU (`pid = -1`) into
    /// that CPU's leader ring ([`Watcher::set_cpu_wide`]), not per thread, while no other
    /// laser session watches on this machine…
    cpu_wide: bool,
    /// …as this session's lock on the peers file says ([`Peers`]; `None`: unknown).
    peers: Option<Peers>,
    /// …and the open window's events are such (decided as each window opens).
    window_cpu_wide: bool,
    /// Windows opened per thread (`[0]`) and for whole CPUs (`[1]`).
    opens: [u64; 2],
    /// The open window is whole-CPU and says so to the other sessions
    /// ([`Peers::hold_whole_cpu_window`]).
    window_held: bool,
    /// Threads whose hits were read since the limits were last set ([`Watcher::note_hitters`]).
    hit_tids: BTreeSet<u32>,
    /// The threads the armed words are for: a window waits for two of them to run
    /// ([`crate::company`]).
    company: Company,
}

/// Why a thread of the target could not be watched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Unwatched {
    /// `ENOSPC`: the thread's debug registers are taken by another tool (a debugger's
    /// hardware watchpoints, `perf record -e mem:ADDR`, another laser).
    DebugRegistersTaken,
    /// `EMFILE`/`ENFILE`: laser ran out of file descriptors for its events.
    NoDescriptors,
}

impl Unwatched {
    /// The reason behind an event-open error, if it is one that leaves a thread unwatched
    /// while the rest go on.
    fn of(e: &DriverError) -> Option<Unwatched> {
        match e {
            DriverError::Open { source, .. } => match source.raw_os_error() {
                Some(libc::ENOSPC) => Some(Unwatched::DebugRegistersTaken),
                Some(libc::EMFILE | libc::ENFILE) => Some(Unwatched::NoDescriptors),
                _ => None,
            },
            _ => None,
        }
    }
}

impl Watcher {
    pub(crate) fn new(binding: Binding, duty: DutyCycle, target: Option<libc::pid_t>) -> Self {
        let mut w = Watcher {
            binding,
            events: Vec::new(),
            specs: Vec::new(),
            duty,
            state: DutyState::default(),
            calibrated: false,
            floor: duty.hit_cost,
            provisional: false,
            calibration_cpu: Duration::ZERO,
            reader_mark: None,
            procs: Vec::new(),
            markers: Vec::new(),
            last_marked_empty: true,
            front: false,
            look: false,
            cpus: crate::sys::online_cpus().map_or(1, |c| c.len().max(1) as u32),
            leaders: Vec::new(),
            thread_rings: BTreeMap::new(),
            opened_ids: Vec::new(),
            closed_ids: Vec::new(),
            nofile_raised: false,
            opening: false,
            unenabled_from: None,
            attached_enable_due: false,
            unwatched: BTreeMap::new(),
            trapped: BTreeMap::new(),
            last_hitters: 0,
            trapped_unknown: false,
            limits_since: 0,
            renewed_since: BTreeMap::new(),
            counting_since: 0,
            thread_leaders: BTreeMap::new(),
            window_tids: BTreeSet::new(),
            inherit: false,
            switches: SwitchTally::default(),
            cpu_wide: false,
            peers: None,
            window_cpu_wide: false,
            opens: [0; 2],
            window_held: false,
            hit_tids: BTreeSet::new(),
            company: Company::default(),
        };
        if let Some(pid) = target {
            w.add_process(pid);
            // Every watching session says so, whole-CPU or not: its breakpoints find no room
            // while another session's whole-CPU window counts.
            w.peers = Peers::join(&peers::lock_path());
        }
        w
    }

    /// CPU time the target has used so far: the sum over its processes (all their threads,
    /// live and exited) of the kernel's per-process CPU clock. Not from the leaders'
    /// cpu-clock counters: reading an inherited counter sends an IPI to every CPU a thread of
    /// the target runs on, to bring each child event's count up to date, and the duty cycle
    /// reads it on every poll while a line is watched (measured: 2% of a `laser run`'s
    /// samples spent in `smp_call_function_single` on rw_false_sharing). A process clock sums
    /// the threads' runtimes under their run-queue locks: no interrupt to the target.
    pub fn target_cpu(&self) -> Duration {
        self.procs.iter().map(TargetProcess::cpu).sum()
    }

    /// A process the target forked (launch: windows watch its threads too, so its traps count
    /// against the budget and so does its CPU time).
    pub(crate) fn add_process(&mut self, pid: libc::pid_t) {
        if !self.procs.iter().any(|p| p.pid == pid) {
            self.procs.push(TargetProcess {
                pid,
                last: Cell::new(Duration::ZERO),
                live: true,
            });
        }
    }

    /// A process of the target exited: its clock is read a last time and then kept, and its
    /// pid is never read again (the kernel may give it to an unrelated process).
    pub(crate) fn retire_process(&mut self, pid: libc::pid_t) {
        if let Some(p) = self.procs.iter_mut().find(|p| p.pid == pid && p.live) {
            p.cpu();
            p.live = false;
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
        leader: &OwnedFd,
    ) -> Result<Vec<(u64, u8)>, DriverError> {
        if self.binding == Binding::Launch {
            // Events are opened per window (`open_window`), on this CPU into this ring. The
            // hit cost is measured at the first arm, while the program runs: here its exec
            // waits (its traps, 40 then, took ≈ 1.5 ms of every `laser run`'s start).
            let dup = leader
                .try_clone()
                .map_err(|e| DriverError::io("duplicating a leader descriptor", e))?;
            self.leaders.push(RingLeader {
                cpu,
                fd: dup,
                wake: RingWake::default(),
            });
            return Ok(Vec::new());
        }
        // Before opening events, so their wake-up threshold matches the real cap.
        self.calibrate_once()?;
        let wake = self.limit();
        let mut ids = Vec::new();
        let first_new = self.events.len();
        let mut retries = 0;
        let mut slot = 0;
        while slot < MAX_WATCHES as u8 {
            let a = attr::watch(self.binding, wake);
            let what = format!("watchpoint slot {slot}");
            let fd = match sys::open(&a, pid, cpu, &what) {
                Ok(fd) => fd,
                // Another session's whole-CPU window holds the debug registers: once it has
                // re-opened per thread, the thread's slots are tried again from the first.
                Err(e) if is_enospc(&e) && retries < 3 && self.waited_for_peer_windows() => {
                    retries += 1;
                    self.events.truncate(first_new);
                    ids.clear();
                    slot = 0;
                    continue;
                }
                // Another tool holds the thread's debug registers, or descriptors ran out:
                // the thread is sampled but not watched (its slots opened so far close), and
                // the session goes on; the report says so.
                Err(e) => match Unwatched::of(&e) {
                    Some(why) => {
                        self.events.truncate(first_new);
                        self.unwatched.entry(pid).or_insert(why);
                        return Ok(Vec::new());
                    }
                    None => return Err(e),
                },
            };
            sys::set_output(&fd, leader.as_raw_fd())?;
            let id = sys::event_id(&fd)?;
            ids.push((id, slot));
            self.events.push(WatchEvent {
                key,
                slot,
                cpu,
                fd,
                attr: a,
                id,
                limited: false,
                group: GroupRole::Alone,
            });
            slot += 1;
        }
        if !self.specs.is_empty() {
            self.repoint_attached(first_new)?;
            // (A window still waiting to be enabled enables these with the others.)
            if self.state.is_armed() && !self.attached_enable_due {
                self.enable_attached(first_new)?;
            }
        }
        self.thread_leaders.insert(key, (pid, leader.as_raw_fd()));
        Ok(ids)
    }

    /// Measures the hit cost once (`DutyCycle::calibrate`) and adopts it when above the floor.
    ///
    /// A launch measures it only once a window has trapped, as soon as that window has
    /// closed (its own breakpoint needs a free debug register, which a whole-CPU window takes
    /// on every CPU), and prices hits at [`PROVISIONAL_HIT_COST`] until then: the cooldown of
    /// that first window is re-checked at the measured price. Its traps take ≈ 0.2–0.5 ms of
    /// laser's thread while the program runs, and the breakpoint, bound to laser's thread,
    /// is the run's only task event (see `attr::tracking_cpu_wide`): a program whose windows
    /// never trap (a survey of quiet words) pays neither. One that ends before its first
    /// calibration keeps the provisional price in the report.
    fn calibrate_once(&mut self) -> Result<(), DriverError> {
        if !self.duty.calibrate || self.calibrated {
            return Ok(());
        }
        if self.binding == Binding::Launch && self.state.stats.hits == 0 {
            if !self.provisional {
                self.provisional = true;
                self.duty = self
                    .duty
                    .with_hit_cost(PROVISIONAL_HIT_COST.max(self.floor));
                self.push_cost_marker();
            }
            return Ok(());
        }
        // Short (CALIBRATION_TRAPS: ≈ 0.2–0.5 ms): an attached target runs meanwhile, and on
        // laser's first arm so does a launched one, but both share the CPUs with it.
        let t0 = thread_cpu_time();
        let measured = measure_hit_cost(CALIBRATION_TRAPS, self.duty.model == CostModel::Traps);
        self.calibration_cpu += thread_cpu_time().saturating_sub(t0);
        let measured = match measured {
            Ok(m) => m,
            // Another session's whole-CPU window (or a debugger) holds the debug
            // registers: the price so far stands until a later arm finds room.
            Err(e) if Unwatched::of(&e).is_some() => return Ok(()),
            Err(e) => return Err(e),
        };
        self.duty = self.duty.with_hit_cost(measured.max(self.floor));
        self.calibrated = true;
        self.push_cost_marker();
        Ok(())
    }

    /// The estimator corrects armed time with the cost paid per hit (25–35 µs here, not the
    /// floor); recorded so a replay corrects the same way.
    fn push_cost_marker(&mut self) {
        let hit_ns = u64::try_from(self.duty.hit_cost.as_nanos()).unwrap_or(u64::MAX);
        self.markers.push(Event::WatchCost {
            time: now_ns(),
            hit_ns,
        });
    }

    /// Each event's share of a window's hit cap: the kernel limit it is enabled with, and
    /// the hits after which it wakes the reader. The window's hits are spread over the
    /// threads running at once (at most `cpus`), so the first event to spend its share does
    /// so at about the cap, when the window must end anyway, and the window ends at that hit
    /// ([`Watcher::note_hit`]); a look's ends at its whole cap (`count_hit`).
    ///
    /// The kernel counts wake-ups per ring, not per event (`rb->events`: every watch sample
    /// written into a CPU's ring counts, and what is left over carries into the next
    /// window), so this wakes the reader once per `limit` hits taken on a CPU, at a point in
    /// the window that drifts from one window to the next.
    ///
    /// The wake-up and the limit are one number so that the reader mostly sleeps through a
    /// window.
    /// With the limit at the whole cap and the wake-up at the share, a thread that trapped
    /// faster than the others woke the reader mid-window, and on 2 CPUs both busy with the
    /// target the reader took one of them from a thread of the pair being watched while it
    /// drained: a dev build's drain took 1.4 ms of a 1.1 ms window (scheduler trace, fs),
    /// so that window saw one thread only and no transfer (a CI failure, fifteenth session).
    fn limit(&self) -> u32 {
        self.duty
            .max_hits_per_window
            .div_ceil(self.cpus as u64)
            .clamp(1, u64::from(attr::MAX_WAKEUP_EVENTS)) as u32
    }

    /// Closes the events of a thread that exited (attach).
    pub(crate) fn remove(&mut self, key: i64) {
        self.events.retain(|e| e.key != key);
        self.trapped.retain(|k, _| k.0 != key);
        self.renewed_since.retain(|k, _| k.0 != key);
        self.thread_leaders.remove(&key);
    }

    /// Points the first `specs.len()` slots at `specs`. Replaces whatever was armed before.
    ///
    /// The duty cycle carries on across re-arms: from idle a window starts now; an armed
    /// window keeps its hit count (the budget is on traps, whichever words they come from);
    /// during a cooldown the new words are loaded disabled and start counting when it is
    /// paid. A launch window's events open disabled and trap from the session's next poll
    /// on ([`Watcher::open_window`]). Re-arming the set already armed changes nothing and
    /// costs no syscall. (A caller
    /// that re-arms on a timer — the CLI's steering every 100 ms — would otherwise cut
    /// cooldowns short, and every re-point interrupts each CPU the target runs on.)
    pub fn arm(&mut self, specs: &[WatchSpec]) -> Result<(), DriverError> {
        self.company.set(&[]);
        self.arm_as(specs, false, false)
    }

    /// [`Watcher::arm`] for words that threads `company` contend on: each window waits, up to
    /// [`company::MAX_WAIT`], until two of them can run ([`crate::company`]).
    pub fn arm_for(&mut self, specs: &[WatchSpec], company: &[i32]) -> Result<(), DriverError> {
        self.company.set(company);
        self.arm_as(specs, false, false)
    }

    /// [`Watcher::arm`] for a *front* window: data words on a line a code window has just
    /// seen contended, announced as such (`Event::WatchSet::front`) so the estimator can tell
    /// the line's contention moves.
    pub fn arm_front(&mut self, specs: &[WatchSpec]) -> Result<(), DriverError> {
        self.company.set(&[]);
        self.arm_as(specs, true, false)
    }

    /// [`Watcher::arm`] for a *look*: words of a line already rated that no sample showed,
    /// announced as such (`Event::WatchSet::look`) so the estimator does not rate the line
    /// from a window that watches its rare words and not its hot ones.
    pub fn arm_look(&mut self, specs: &[WatchSpec]) -> Result<(), DriverError> {
        self.company.set(&[]);
        self.arm_as(specs, false, true)
    }

    fn arm_as(&mut self, specs: &[WatchSpec], front: bool, look: bool) -> Result<(), DriverError> {
        if specs.len() <= MAX_WATCHES
            && specs == self.specs.as_slice()
            && front == self.front
            && look == self.look
            && !self.state.is_idle()
        {
            return Ok(());
        }
        self.front = front;
        self.look = look;
        // A window counts only while every thread is watched (see `Watcher::mark`): the one
        // counting ends before the first event closes or moves, the new one starts after the
        // last opens.
        self.mark(false, now_ns());
        if self.state.is_armed() {
            self.charge_switches();
        }
        let ops = thread_cpu_time();
        let r = self.arm_inner(specs);
        self.charge_ops(ops);
        self.restart_switches();
        // Announce what is counting now, also after a partial failure (some slots
        // re-pointed).
        self.mark(self.state.is_armed(), now_ns());
        r
    }

    fn arm_inner(&mut self, specs: &[WatchSpec]) -> Result<(), DriverError> {
        if specs.len() > MAX_WATCHES {
            return Err(DriverError::TooManyWatches {
                requested: specs.len(),
                max: MAX_WATCHES,
            });
        }
        specs.iter().try_for_each(WatchSpec::validate)?;
        self.specs = specs.to_vec();
        let (now, cpu) = (Instant::now(), self.target_cpu());
        if specs.is_empty() {
            self.state.stop(now, cpu);
        } else if self.state.is_idle() && self.company.waits_at(now) {
            self.state.start_waiting(now, cpu);
        } else if self.state.is_idle() {
            self.state.start(now, cpu);
        }
        if self.binding == Binding::Launch {
            return self.sync_window();
        }
        self.repoint_attached(0)?;
        self.attached_enable_due = self.state.is_armed();
        Ok(())
    }

    /// Launch: events on every thread, pointed at the armed set, while a window counts; none
    /// otherwise. A new set replaces the window's events rather than re-pointing them: a
    /// re-pointed breakpoint is re-enabled with no limit left (`MODIFY_ATTRIBUTES` enables
    /// it plainly), and fresh events each start from a whole limit.
    fn sync_window(&mut self) -> Result<(), DriverError> {
        self.close_window();
        if !self.state.is_armed() || self.specs.is_empty() {
            return Ok(());
        }
        // No breakpoint of this session is open here.
        self.calibrate_once()?;
        self.open_window()
    }

    /// Launch: closes every event of the window, those that trapped in it first.
    ///
    /// Closing a thread's event while the thread runs waits for an interrupt on its CPU, one
    /// event after another, and a CPU busy taking the window's traps answers slowly (see the
    /// module doc). The kernel stops each event at its limit, but a window whose hits are
    /// spread over several events is still under it: with the hot events closed first its
    /// traps stop at the first interrupt.
    fn close_window(&mut self) {
        let hot = self.take_trapped();
        self.trapped_unknown = false;
        self.unenabled_from = None;
        self.window_tids.clear();
        let (first, rest): (Vec<WatchEvent>, Vec<WatchEvent>) = self
            .events
            .drain(..)
            .partition(|e| e.group == GroupRole::Alone && hot.contains(&(e.key, e.slot)));
        self.closed_ids
            .extend(first.iter().chain(rest.iter()).map(|e| e.id));
        drop(first);
        // Members before their leaders, as they were kept ([`GroupRole`]).
        drop(rest);
        // Only now that its breakpoints are gone: a session waiting for them retries at once.
        self.hold_window(false);
        self.limits_reset();
    }

    /// Every event closed or disabled is past: the next hits count toward fresh limits.
    fn limits_reset(&mut self) {
        self.note_hitters();
        self.trapped.clear();
        self.limits_since = now_ns();
        self.renewed_since.clear();
        self.state.limits_renewed();
    }

    /// A watch hit of thread `tid` on slot `slot` was read, taken on `cpu` at `time`: its
    /// event may have spent its limit (renewed before it counts again), and closes first when
    /// a launch window ends ([`Watcher::close_window`]).
    ///
    /// When this is the hit that spent its event's limit, the window stops counting here and
    /// the marker that says so is returned, for the session to deliver right after the hit.
    /// From this hit on, the kernel no longer traps that thread's accesses to that word on
    /// that CPU, so transfers between it and the others go unseen until the reader ends the
    /// window, up to milliseconds later on a busy machine (a recording of fs had windows of
    /// 10.5 ms whose last 10 ms had no hit at all). Counted as armed, that time biased
    /// rates low, the more the slower the reader. The duty cycle ends its window at the
    /// reader's next tick ([`DutyState::limit_spent`]): a cooldown for the hits it took, or a
    /// rollover if they are paid for (a new counting window starts once the spent events are
    /// renewed).
    pub(crate) fn note_hit(&mut self, tid: u32, cpu: u32, slot: u8, time: u64) -> Option<Event> {
        self.count_hit(Some(tid), cpu, slot, time)
    }

    /// A whole-CPU window's hit in another process ([`Watcher::set_cpu_wide`]): dropped, but
    /// it spent as much of its CPU's limit as the target's own, so it may end the window.
    pub(crate) fn note_foreign_hit(&mut self, cpu: u32, slot: u8, time: u64) -> Option<Event> {
        self.count_hit(None, cpu, slot, time)
    }

    /// [`Watcher::note_hit`]; `tid` is `None` for a hit outside the target.
    fn count_hit(&mut self, tid: Option<u32>, cpu: u32, slot: u8, time: u64) -> Option<Event> {
        let (key, cpu) = match tid {
            _ if self.window_cpu_wide => (cpu_key(cpu as i32), cpu),
            Some(tid) if self.per_thread_events(tid as i32) => (i64::from(tid), u32::MAX),
            Some(tid) => (i64::from(tid), cpu),
            None => return None,
        };
        let since = self
            .renewed_since
            .get(&(key, slot))
            .map_or(self.limits_since, |&t| t.max(self.limits_since));
        if time < since {
            return None;
        }
        if let Some(tid) = tid {
            self.hit_tids.insert(tid);
        }
        let n = self.trapped.entry((key, slot, cpu)).or_default();
        *n += 1;
        // A look ends with its whole cap, not its first event's share: the thread that
        // filled one share may hold a lock the others wait for (a trap inside a critical
        // section holds it ~20 µs), and the accesses a look is there to pair are the others'
        // (locked_queue: 12 of 47 look windows saw both threads). The spent event traps no
        // more; the others' take the rest.
        let spent = *n >= u64::from(self.limit())
            && (!self.look || self.trapped.values().sum::<u64>() >= self.duty.max_hits_per_window);
        if !spent || !self.caps_windows() || !self.state.is_armed() {
            return None;
        }
        self.state.limit_spent();
        if time < self.counting_since {
            return None;
        }
        // Just after the hit, so the hit itself is inside the window.
        self.marker(false, time + 1)
    }

    /// (thread, slot) of the events that trapped, forgetting them: their limits are set anew.
    fn take_trapped(&mut self) -> BTreeSet<(i64, u8)> {
        self.note_hitters();
        let t = std::mem::take(&mut self.trapped);
        t.into_keys().map(|(key, slot, _)| (key, slot)).collect()
    }

    /// The kernel dropped samples: an event may have trapped without a sample to say so, so
    /// every event is renewed before it counts again.
    pub(crate) fn note_lost(&mut self) {
        self.trapped_unknown = true;
    }

    /// Launch: a window rolled over with its events open ([`Action::Rollover`]). Each event
    /// that trapped may have spent its limit, and the kernel cannot restart a breakpoint its
    /// limit stopped: enabled again it traps on without counting or sampling (measured on
    /// 6.18: 10,000 stores took 40 ms and counted nothing after a REFRESH, a DISABLE +
    /// REFRESH or a MODIFY_ATTRIBUTES + REFRESH alike). So the events that trapped are
    /// replaced by fresh ones with a whole limit; the others kept theirs whole.
    fn renew_hot(&mut self) -> Result<(), DriverError> {
        let hot = self.take_trapped();
        if std::mem::take(&mut self.trapped_unknown) {
            return self.sync_window();
        }
        // A whole CPU's events are one group ([`GroupRole`]): a spent member is replaced
        // inside it, but a spent leader stopped the whole group, which then opens anew.
        let regroup: BTreeSet<i64> = self
            .events
            .iter()
            .filter(|e| e.group == GroupRole::Leader && hot.contains(&(e.key, e.slot)))
            .map(|e| e.key)
            .collect();
        let (spent, keep): (Vec<WatchEvent>, Vec<WatchEvent>) = std::mem::take(&mut self.events)
            .into_iter()
            .partition(|e| hot.contains(&(e.key, e.slot)) || regroup.contains(&e.key));
        self.events = keep;
        self.closed_ids.extend(spent.iter().map(|e| e.id));
        // Each is replaced where it counted: on its CPU, or on its thread's own ring.
        let places: BTreeSet<(i64, u8, i32)> = spent
            .iter()
            .filter(|e| !regroup.contains(&e.key))
            .map(|e| (e.key, e.slot, e.cpu))
            .collect();
        let groups: BTreeSet<i32> = spent
            .iter()
            .filter(|e| regroup.contains(&e.key))
            .map(|e| e.cpu)
            .collect();
        // Closed before the new ones open (a thread has 4 debug registers per CPU), members
        // before their leaders, as they were kept.
        drop(spent);
        let now = now_ns();
        for &(key, slot) in &hot {
            self.renewed_since.insert((key, slot), now);
        }
        for &key in &regroup {
            for slot in 0..self.specs.len() {
                self.renewed_since.insert((key, slot as u8), now);
            }
        }
        for cpu in groups {
            let Some(leader) = self.leaders.iter().position(|l| l.cpu == cpu) else {
                continue;
            };
            match open_replacing(|| self.open_cpu_group(leader, true)) {
                Ok(()) => {}
                // Another tool's breakpoints took the room: the window opens again, per
                // thread if they are still there.
                Err(e) if Unwatched::of(&e).is_some() => return self.sync_window(),
                Err(e) => return Err(e),
            }
        }
        let mut gone = BTreeSet::new();
        for (key, slot, cpu) in places {
            let tid = key as i32;
            if slot as usize >= self.specs.len() || gone.contains(&tid) {
                continue; // a straggler of a set armed before, or a thread that exited
            }
            if key < 0 {
                // A member of a whole CPU's group, or a CPU's only event.
                let alone = self.specs.len() == 1;
                let Some(leader) = self.leaders.iter().position(|l| l.cpu == cpu) else {
                    continue;
                };
                let r = if alone {
                    open_replacing(|| self.open_cpu_group(leader, true))
                } else {
                    open_replacing(|| self.open_member(key, slot as usize))
                };
                match r {
                    Ok(()) => {}
                    Err(e) if Unwatched::of(&e).is_some() => return self.sync_window(),
                    Err(e) => return Err(e),
                }
                continue;
            }
            let r = if cpu < 0 {
                let Some(Some(ring)) = self.thread_rings.get(&tid) else {
                    continue; // its thread exited and its ring went
                };
                let out = ring.out();
                open_replacing(|| self.open_slot_to(tid, -1, out, slot as usize))
            } else {
                let Some(leader) = self.leaders.iter().position(|l| l.cpu == cpu) else {
                    continue;
                };
                open_replacing(|| self.open_slot(tid, leader, slot as usize))
            };
            let Some(ev) = self.opened_or_passed_over(tid, r)? else {
                gone.insert(tid);
                continue;
            };
            self.adopt(ev);
        }
        Ok(())
    }

    /// Opens slot `slot` anew in the group of whole-CPU key `key`, whose leader counts, and
    /// keeps it before its leader ([`GroupRole`]). It opens disabled and its `REFRESH` enables
    /// it with its limit: opened enabled into a counting group, a hit between the open and the
    /// `REFRESH` counted toward no limit (the kernel's limit 0 is none): a hot member's
    /// renewed windows took their share + 1, and the live test
    /// `a_whole_cpu_windows_group_stops_at_its_cap_and_rolls_over_fresh` failed in 18 of 30
    /// runs of a dev build (0 of 30 after).
    /// The enable costs that CPU one more cross-call per renewal, a few per second.
    fn open_member(&mut self, key: i64, slot: usize) -> Result<(), DriverError> {
        let Some(at) = self
            .events
            .iter()
            .position(|e| e.key == key && e.group == GroupRole::Leader)
        else {
            return Ok(()); // no group there any more
        };
        let cpu = self.events[at].cpu;
        let Some(out) = self
            .leaders
            .iter()
            .find(|l| l.cpu == cpu)
            .map(RingLeader::out)
        else {
            return Ok(());
        };
        let mut ev = self.open_event(-1, cpu, out, slot, true, Some(&self.events[at].fd))?;
        ev.key = key;
        ev.group = GroupRole::Member;
        sys::refresh(&ev.fd, self.limit())?;
        self.opened_ids.push((ev.id, ev.slot));
        self.events.insert(at, ev);
        Ok(())
    }

    /// Launch: opens the armed set on every thread of every process of the target, until a
    /// listing of their threads finds none without events (see the module doc).
    fn open_window(&mut self) -> Result<(), DriverError> {
        // Every event of the last window is closed: each ring's next wake-up comes after
        // `limit` more hits on it, when a thread alone on that CPU spends its limit.
        let limit = self.limit();
        for l in &mut self.leaders {
            l.wake.rearm(limit);
        }
        for r in self.thread_rings.values_mut().flatten() {
            r.wake.rearm(limit);
        }
        if !self.nofile_raised {
            // A window holds armed slots × CPUs descriptors per thread: 8 per thread here,
            // so a program of a few hundred threads passes a 1,024-descriptor soft limit.
            raise_nofile_limit();
            self.nofile_raised = true;
        }
        // Every event opens disabled, and all are enabled together when the reader is about
        // to sleep ([`Watcher::enable_opened`]). Opened enabled, the first thread's events
        // counted while the others' opened and the reader went on with its other work (a
        // few hundred µs, with one CPU of two taken from the target), and a thread that
        // reads the watched line on every iteration spent its whole limit in that margin,
        // which the estimator drops (a 0.43 ms opening, 30 of its 34 hits: the window
        // counted for 32 µs, and saw that thread alone). Enabling is an interrupt of each
        // running thread's CPU, as an open is, but back to back.
        // (An inherited window's events cannot be limited and are opened enabled, as its
        // threads' creations race with the opening anyway.)
        // An inherited window (an object's access history) stays per thread: its events
        // open enabled, so the thread laser holds until the arm returns is watched when it
        // goes on, and have no cap.
        self.window_cpu_wide =
            self.cpu_wide && !self.inherit && self.peers.as_ref().is_none_or(Peers::alone);
        self.opening = !self.inherit;
        if self.window_cpu_wide {
            // Said before any whole-CPU breakpoint exists: a session whose breakpoint one of
            // them refuses finds it said and waits (`waited_for_peer_windows`). The first
            // open can take tens of milliseconds (an RCU grace period, see `charge_ops`).
            self.hold_window(true);
        }
        let first = self.events.len();
        let r = if self.window_cpu_wide {
            self.open_cpus()
        } else {
            self.open_listed()
        };
        self.opens[usize::from(self.window_cpu_wide)] += 1;
        if !self.window_cpu_wide {
            self.hold_window(false); // fell back to per thread
        }
        if self.opening {
            self.unenabled_from = Some(first);
        }
        self.opening = false;
        r
    }

    /// Enables the events of a window that opened since the reader last slept (launch: see
    /// [`Watcher::open_window`]; attach: [`Watcher::enable_attached`]), each limited to its
    /// share of the window's cap. The session calls this before it waits; a caller may call
    /// it earlier.
    ///
    /// Enabled any earlier, a window counts while the reader still works on the CPU one of
    /// a busy target's threads would run on, and the other threads' bursts fill the cap
    /// alone. Attached windows were enabled as the duty cycle turned them on, before the
    /// caller's work on the batch just read: with a dev build's slower caller, every window
    /// of some runs on an attached fs saw one thread, and `laser attach` missed its false
    /// sharing in 14 of 100 runs (so the CLI's attach test failed in CI); enabled here, in
    /// 0 of 50.
    pub fn enable_opened(&mut self) -> Result<(), DriverError> {
        if std::mem::take(&mut self.attached_enable_due) && self.state.is_armed() {
            self.enable_attached(0)?;
        }
        let Some(first) = self.unenabled_from.take() else {
            return Ok(());
        };
        let limit = self.limit();
        self.events
            .iter()
            .skip(first)
            .filter(|e| e.limited)
            .try_for_each(|e| sys::refresh(&e.fd, limit))
    }

    /// Whole-CPU windows: opens the armed set once per CPU, for whatever runs there, into
    /// that CPU's leader ring. Where another tool holds debug registers on some thread of
    /// the machine (a debugger's watchpoints, `perf record -e mem:ADDR`), the kernel refuses
    /// a whole-CPU breakpoint that would not fit beside them: the window opens per thread
    /// instead, where only that tool's threads go without.
    fn open_cpus(&mut self) -> Result<(), DriverError> {
        let first = self.events.len();
        match self.open_every_cpu() {
            Err(e) if Unwatched::of(&e).is_some() => {
                let gone = self.events.drain(first..).map(|e| e.id);
                self.closed_ids.extend(gone);
                self.window_cpu_wide = false;
                self.open_listed()
            }
            r => r,
        }
    }

    fn open_every_cpu(&mut self) -> Result<(), DriverError> {
        for i in 0..self.leaders.len() {
            self.open_cpu_group(i, false)?;
        }
        Ok(())
    }

    /// Opens the armed set on leader `leader`'s CPU as one group ([`GroupRole`]) and adopts
    /// its events, members first. With `enable`, limits and enables them at once (a group
    /// renewed while its window counts); otherwise they wait for
    /// [`Watcher::enable_opened`], which goes through them in that order too: each member's
    /// limit is set while its leader is still disabled, and the leader's enable starts all.
    fn open_cpu_group(&mut self, leader: usize, enable: bool) -> Result<(), DriverError> {
        let (cpu, out) = (self.leaders[leader].cpu, self.leaders[leader].out());
        let mut head = self.open_event(-1, cpu, out, 0, true, None)?;
        head.key = cpu_key(cpu);
        if self.specs.len() > 1 {
            head.group = GroupRole::Leader;
        }
        let mut members = Vec::with_capacity(self.specs.len().saturating_sub(1));
        for slot in 1..self.specs.len() {
            // On failure the members opened so far close before the leader (`members` is
            // dropped first).
            let mut ev = self.open_event(-1, cpu, out, slot, false, Some(&head.fd))?;
            ev.key = cpu_key(cpu);
            ev.group = GroupRole::Member;
            members.push(ev);
        }
        if enable {
            let limit = self.limit();
            members
                .iter()
                .chain(std::iter::once(&head))
                .try_for_each(|e| sys::refresh(&e.fd, limit))?;
        }
        for ev in members {
            self.adopt(ev);
        }
        self.adopt(head);
        Ok(())
    }

    /// Opens the window's events on every thread of the target.
    fn open_listed(&mut self) -> Result<(), DriverError> {
        // A thread created while this runs is listed again (or announced by its creation
        // record): list until a round finds nothing new.
        for round in 0..64 {
            let tids: Vec<i32> = self
                .procs
                .iter()
                .filter(|p| p.live)
                .filter_map(|p| crate::threads::list_tids(p.pid).ok())
                .flatten()
                .filter(|t| !self.window_tids.contains(t))
                .collect();
            if tids.is_empty() {
                break;
            }
            for tid in tids {
                // Listed before this window had any event: it cannot have inherited one.
                self.open_in_window(tid, self.inherit && round > 0)?;
            }
        }
        Ok(())
    }

    /// Launch: a thread (or process) of the target was created. While a window counts it gets
    /// the armed set now, unless the window has it already.
    /// (An inherited window's events were copied into it at its creation.)
    pub(crate) fn thread_created(&mut self, tid: i32) -> Result<(), DriverError> {
        if !self.covers_new_threads_when_read() || self.window_tids.contains(&tid) {
            return Ok(());
        }
        self.open_in_window(tid, false)
    }

    /// Opens the armed set on `tid` for this window. A thread that exited since it was listed
    /// is skipped; one whose debug registers are taken or for which descriptors ran out goes
    /// unwatched (noted for the report) while the window and the program go on.
    /// With `unless_inherited`, a thread that carries the window's events already (see
    /// [`Watcher::open_unless_inherited`]) is left as it is.
    fn open_in_window(&mut self, tid: i32, unless_inherited: bool) -> Result<(), DriverError> {
        self.window_tids.insert(tid);
        let mut r = self.open_thread_whole(tid, unless_inherited);
        // A few times: another session's window may open between our wait and retry.
        for _ in 0..3 {
            if !(r.as_ref().is_err_and(is_enospc) && self.waited_for_peer_windows()) {
                break;
            }
            r = self.open_thread_whole(tid, unless_inherited);
        }
        self.opened_or_passed_over(tid, r).map(|_| ())
    }

    /// [`Watcher::open_in_window`] once: on failure the thread's slots opened so far close,
    /// so a thread is watched whole or not at all.
    fn open_thread_whole(&mut self, tid: i32, unless_inherited: bool) -> Result<(), DriverError> {
        let first_new = self.events.len();
        let r = if unless_inherited {
            self.open_unless_inherited(tid)
        } else {
            self.open_thread(tid, 0)
        };
        if r.is_err() {
            let gone = self.events.drain(first_new..).map(|e| e.id);
            self.closed_ids.extend(gone);
        }
        r
    }

    /// A breakpoint was refused for want of debug registers: if another laser session's
    /// whole-CPU window holds them, waits for it to close (it re-opens per thread once it
    /// sees this session, at its next poll); whether none is open now, so a retry may pass.
    fn waited_for_peer_windows(&self) -> bool {
        let t = Instant::now();
        let r = self.peers.as_ref().is_some_and(|p| {
            let waited = !p.alone() && p.wait_for_whole_cpu_windows(PEER_WINDOW_WAIT);
            if waited {
                // A window that just closed may still be releasing its last breakpoints.
                std::thread::sleep(Duration::from_millis(2));
            }
            waited
        });
        if std::env::var_os("LASER_TRACE_PEERS").is_some() {
            eprintln!(
                "laser peers: refused breakpoint; peers {:?} alone {:?}, waited {:?}: {r}",
                self.peers.is_some(),
                self.peers.as_ref().map(Peers::alone),
                t.elapsed()
            );
        }
        r
    }

    /// Says to the other sessions that this one has a whole-CPU window open (or no longer).
    fn hold_window(&mut self, open: bool) {
        if open == self.window_held {
            return;
        }
        if let Some(p) = &self.peers {
            p.hold_whole_cpu_window(open);
            self.window_held = open;
        }
    }

    /// Whole-CPU windows: another laser session joined while this one has such a window
    /// open. Its breakpoints find no room until the window closes, so the window re-opens
    /// now, per thread, and stops counting meanwhile (see [`Watcher::mark`]). The session
    /// calls this at every poll; a cheap lock query when a whole-CPU window is open, nothing
    /// otherwise.
    pub(crate) fn yield_to_peers(&mut self) -> Result<(), DriverError> {
        if !self.window_held || self.peers.as_ref().is_none_or(Peers::alone) {
            return Ok(());
        }
        self.mark(false, now_ns());
        let r = self.sync_window();
        self.mark(self.state.is_armed() && !self.specs.is_empty(), now_ns());
        r
    }

    /// What opening events on thread `tid` came to: `Some` when they opened. A thread that
    /// exited since it was found (`ESRCH`) is passed over; one whose debug registers are
    /// taken or for which descriptors ran out goes unwatched (noted for the report) while
    /// the rest go on: both `None`. Any other error is the caller's.
    fn opened_or_passed_over<T>(
        &mut self,
        tid: i32,
        r: Result<T, DriverError>,
    ) -> Result<Option<T>, DriverError> {
        match r {
            Ok(v) => Ok(Some(v)),
            Err(DriverError::Open { source, .. }) if source.raw_os_error() == Some(libc::ESRCH) => {
                Ok(None)
            }
            Err(e) => match Unwatched::of(&e) {
                Some(why) => {
                    self.unwatched.entry(tid).or_insert(why);
                    Ok(None)
                }
                None => Err(e),
            },
        }
    }

    /// Opens the armed set on thread `tid`: one event per slot into the thread's own ring
    /// ([`ThreadRing`]), or, where it has none (inherited windows, or a ring that could not be
    /// made), one per slot and CPU into the leaders' rings, for the leaders from index `from`
    /// on.
    fn open_thread(&mut self, tid: i32, from: usize) -> Result<(), DriverError> {
        if from == 0 {
            if let Some(out) = self.thread_ring(tid)? {
                for slot in 0..self.specs.len() {
                    let ev = self.open_slot_to(tid, -1, out, slot)?;
                    self.adopt(ev);
                }
                return Ok(());
            }
        }
        for i in from..self.leaders.len() {
            for slot in 0..self.specs.len() {
                let ev = self.open_slot(tid, i, slot)?;
                self.adopt(ev);
            }
        }
        Ok(())
    }

    /// Opens one event, limits it to its share of the window's cap (see the module doc) and points
    /// it at its ring. Outside a window's opening (a thread created while it counts) it is
    /// opened enabled and limited at once: the enable of an event whose thread runs is one more
    /// interrupt of its CPU (measured with `scripts/watch-cost`: +0.2 % of the wall time in 5
    /// of 5 pairs), against the few microseconds between the two calls in which a hit would
    /// not count towards the limit. While a window opens it is opened disabled, and
    /// [`Watcher::open_window`] enables it with the others. An inherited window's events have
    /// no limit (the kernel allows none).
    fn open_slot(&self, tid: i32, leader: usize, slot: usize) -> Result<WatchEvent, DriverError> {
        let l = &self.leaders[leader];
        self.open_slot_to(tid, l.cpu, l.out(), slot)
    }

    /// [`Watcher::open_slot`] on `cpu` (-1: wherever the thread runs) into the ring `out`.
    fn open_slot_to(
        &self,
        tid: i32,
        cpu: i32,
        out: RingOut,
        slot: usize,
    ) -> Result<WatchEvent, DriverError> {
        let ev = self.open_event(tid, cpu, out, slot, self.opening, None)?;
        if !self.inherit && !self.opening {
            sys::refresh(&ev.fd, self.limit())?;
        }
        Ok(ev)
    }

    /// Opens one event of slot `slot` on `tid`/`cpu` into the ring `out`, disabled or not,
    /// alone or as a member of `group`'s group (limited by the caller).
    fn open_event(
        &self,
        tid: i32,
        cpu: i32,
        out: RingOut,
        slot: usize,
        disabled: bool,
        group: Option<&OwnedFd>,
    ) -> Result<WatchEvent, DriverError> {
        // Set when the window opened (`open_window`); the limit before any window did.
        let wake = if out.wake.wake == 0 {
            self.limit()
        } else {
            out.wake.wake
        };
        let mut base = attr::watch(Binding::Launch, wake);
        // A whole-CPU event (tid -1) cannot be inherited; its windows never are anyway.
        base.set_inherit(u64::from(self.inherit && tid >= 0));
        let s = self.specs[slot];
        let a = attr::repoint(&base, s.addr, s.len, s.kind, disabled);
        let what = format!("watchpoint slot {slot}");
        let fd = sys::open_in_group(&a, tid, cpu, group, &what)?;
        sys::set_output(&fd, out.fd)?;
        let id = sys::event_id(&fd)?;
        Ok(WatchEvent {
            key: tid as i64,
            slot: slot as u8,
            cpu,
            id,
            fd,
            attr: base,
            limited: !self.inherit,
            group: GroupRole::Alone,
        })
    }

    /// The descriptor and wake-up counter of `tid`'s watch ring, made at its first window
    /// ([`ThreadRing`]). `None`: its events go per CPU into the leaders' rings (attach, an
    /// inherited window, whose events the kernel copies into new threads, or a ring that
    /// could not be made: the reason is the per-CPU events' to report if they fail too). A
    /// thread that exited (`ESRCH`) is the caller's to pass over.
    fn thread_ring(&mut self, tid: i32) -> Result<Option<RingOut>, DriverError> {
        if self.inherit || self.binding != Binding::Launch {
            return Ok(None);
        }
        if let Some(r) = self.thread_rings.get(&tid) {
            return Ok(r.as_ref().map(ThreadRing::out));
        }
        match ThreadRing::open(tid) {
            Ok(mut r) => {
                r.wake.rearm(self.limit());
                let got = r.out();
                self.thread_rings.insert(tid, Some(r));
                Ok(Some(got))
            }
            Err(e) if is_esrch(&e) => Err(e),
            Err(_) => {
                self.thread_rings.insert(tid, None);
                Ok(None)
            }
        }
    }

    /// An event just opened joins the window; its id goes to the decoder.
    fn adopt(&mut self, ev: WatchEvent) {
        self.opened_ids.push((ev.id, ev.slot));
        self.events.push(ev);
    }

    /// Whether `tid`'s window events are one per slot (its own ring, or attach), so its hits
    /// count toward one limit per slot whichever CPU took them.
    fn per_thread_events(&self, tid: i32) -> bool {
        self.binding == Binding::Attach
            || (!self.inherit && matches!(self.thread_rings.get(&tid), Some(Some(_))))
    }

    /// Launch: drains every thread's watch ring with `drain` (which returns how many watch
    /// samples it read there), following each ring's wake-up counter. A ring whose thread
    /// has exited is dropped once drained: nothing more can come into it.
    pub(crate) fn drain_thread_rings(&mut self, mut drain: impl FnMut(&mut MmapRing) -> u64) {
        for r in self.thread_rings.values_mut().flatten() {
            let n = drain(&mut r.ring);
            r.wake.follow(n);
        }
        self.thread_rings
            .retain(|_, r| !r.as_ref().is_some_and(|r| r.hup));
    }

    /// Launch: the descriptors of the thread rings, for the reader's poll (a window's events
    /// wake it through their ring's owner).
    pub(crate) fn thread_ring_fds(&self) -> Vec<RawFd> {
        self.thread_rings
            .values()
            .flatten()
            .map(|r| r.fd.as_raw_fd())
            .collect()
    }

    /// Launch: the ring owned by `fd` hung up (its thread exited); dropped after the next
    /// drain.
    pub(crate) fn thread_ring_hung_up(&mut self, fd: RawFd) {
        if let Some(r) = self
            .thread_rings
            .values_mut()
            .flatten()
            .find(|r| r.fd.as_raw_fd() == fd)
        {
            r.hup = true;
        }
    }

    /// Launch: thread `tid` exited (its exit record was read, after every ring was drained:
    /// whatever it wrote is read). Its ring goes; a later thread given the same id gets its
    /// own.
    pub(crate) fn thread_exited(&mut self, tid: i32) {
        self.thread_rings.remove(&tid);
    }

    /// Opens the armed set on a thread an inherited window found after its first listing,
    /// unless it inherited its creator's events: laser's on the first CPU plus parked fillers
    /// up to the 4 breakpoints the kernel allows a thread per CPU fit only if it has none.
    fn open_unless_inherited(&mut self, tid: i32) -> Result<(), DriverError> {
        if self.leaders.is_empty() {
            return Ok(());
        }
        let mut mine = Vec::new();
        for slot in 0..self.specs.len() {
            match self.open_slot(tid, 0, slot) {
                Ok(ev) => mine.push(ev),
                Err(e) if is_enospc(&e) => return Ok(()), // inherited; `mine` closes
                Err(e) => return Err(e),
            }
        }
        let cpu = self.leaders[0].cpu;
        if !probe_uncovered(tid, cpu, MAX_WATCHES - mine.len())? {
            return Ok(());
        }
        for ev in mine {
            self.adopt(ev);
        }
        self.open_thread(tid, 1)
    }

    /// Launch: makes the windows from the next one on inherited (`true`) or not. An
    /// inherited window's events are copied into every thread created while it counts, from
    /// the thread's first instruction: what the access history of one object needs, whose
    /// allocating thread may hand it to a thread it creates at once. Without, such a thread
    /// is watched from when its creation is read (up to the reader's 50 ms poll later). The
    /// price: the kernel cannot stop an inherited event at the cap, so such a window ends only
    /// when the reader has closed its events (see the module doc).
    pub fn set_inherit(&mut self, inherit: bool) {
        self.inherit = inherit;
    }

    /// Launch: whether windows open for whole CPUs (`pid = -1`, one event per slot and CPU
    /// into that CPU's leader ring) rather than per thread. The session asks for it where the
    /// machine allows CPU-wide events (root, `CAP_PERFMON`, or `perf_event_paranoid` ≤ 0) and
    /// samples whole CPUs; it then drops every other process's hits as it reads them. What it
    /// saves: a breakpoint bound to a thread is loaded into the debug registers at every
    /// switch to that thread, 5–6 µs a switch on this VM (`scripts/switch-cost --event bp`),
    /// where a whole CPU's stays loaded whatever runs (`--event bpcpu`: nothing); a window's
    /// events no longer grow with the thread count (kmeans starts ~600 threads a run, each
    /// given a ring and its events at its first window); and a thread created while a window
    /// counts is watched from its first instruction, without the reader having to read its
    /// creation first. The price: another process's accesses to a watched address trap too
    /// (dropped as read; a different address space has the same address only by chance or in
    /// a copy of the same non-PIE program).
    pub fn set_cpu_wide(&mut self, on: bool) {
        self.cpu_wide = on && self.binding == Binding::Launch;
    }

    /// Whether the open window's events are whole-CPU ([`Watcher::set_cpu_wide`]): not while
    /// another laser session watches on this machine, nor where another tool's breakpoints
    /// leave no room.
    pub fn window_is_cpu_wide(&self) -> bool {
        self.window_cpu_wide
    }

    /// Whether the kernel stops each event of a window at the window's hit cap (every window
    /// but an inherited one): a window on a word some thread accesses without pause then
    /// ends at its cap however late the reader, instead of trapping on until its events are
    /// disabled.
    pub fn caps_windows(&self) -> bool {
        !self.inherit
    }

    /// The open window events as (thread, slot, CPU; -1 for wherever the thread runs; a
    /// whole-CPU event's "thread" is its negative key, [`cpu_key`]): what a window costs in
    /// events, each an open, an enable and a close (tests, diagnostics).
    pub fn window_events(&self) -> Vec<(i32, u8, i32)> {
        self.events
            .iter()
            .map(|e| (e.key as i32, e.slot, e.cpu))
            .collect()
    }

    /// Launch: (id, slot) of the events opened since the last call, for the decoder.
    pub(crate) fn take_opened_ids(&mut self) -> Vec<(u64, u8)> {
        std::mem::take(&mut self.opened_ids)
    }

    /// Launch: ids of the events closed since the last call. Their records are all in the
    /// rings already: forget them after the next drain.
    pub(crate) fn take_closed_ids(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.closed_ids)
    }

    /// Disables every watchpoint and forgets the armed set.
    pub fn disarm(&mut self) -> Result<(), DriverError> {
        // Before the first event stops (see `Watcher::mark`).
        let t = now_ns();
        self.company.set(&[]);
        self.state.stop(Instant::now(), self.target_cpu());
        self.specs.clear();
        self.front = false;
        self.look = false;
        let r = if self.binding == Binding::Launch {
            self.close_window();
            Ok(())
        } else {
            self.events.iter().try_for_each(|ev| sys::disable(&ev.fd))
        };
        self.mark(false, t);
        r
    }

    /// Queues an [`Event::WatchSet`] saying what is being watched from now on (nothing unless
    /// `counting`). The session merges these into the event stream by time.
    ///
    /// A window is announced from after its last event opened (or was enabled) to before its
    /// first one closes (or is disabled): only then is every thread watched. Opening or
    /// closing one running thread's event waits for an interrupt on its CPU, so with a few
    /// threads that takes a few hundred µs: a recording of fs at `--watch-budget 0.5` had
    /// 0.5–0.6 ms windows whose second thread trapped first 340–400 µs in. Stamped around the
    /// opens and closes, such a window counted twice the time in which transfers could be
    /// seen (rates biased low, the more the shorter the windows). Hits in the margins are
    /// outside every window and the estimator drops them.
    fn mark(&mut self, counting: bool, time: u64) {
        if let Some(m) = self.marker(counting, time) {
            self.markers.push(m);
        }
    }

    /// The marker [`Watcher::mark`] queues, unless it would repeat "nothing watched".
    fn marker(&mut self, counting: bool, time: u64) -> Option<Event> {
        let (words, write_only, exec, front, look) = if counting {
            let words = self.specs.iter().map(|s| (s.addr, s.len)).collect();
            let mask = |kind| {
                self.specs
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.kind == kind)
                    .fold(0u8, |m, (i, _)| m | 1 << i)
            };
            let data = !mask(WatchKind::Exec) & ((1u16 << self.specs.len()) - 1) as u8;
            let front = if self.front { data } else { 0 };
            let look = if self.look { data } else { 0 };
            (
                words,
                mask(WatchKind::Write),
                mask(WatchKind::Exec),
                front,
                look,
            )
        } else {
            (Vec::new(), 0, 0, 0, 0)
        };
        if !counting && self.last_marked_empty {
            return None; // already announced as idle; don't flood the stream
        }
        self.last_marked_empty = !counting;
        if counting {
            self.counting_since = time;
        }
        Some(Event::WatchSet {
            time,
            words,
            write_only,
            exec,
            front,
            look,
        })
    }

    /// Launch: `n` watch samples were read from the ring of the leader on `cpu`.
    pub(crate) fn ring_samples(&mut self, cpu: i64, n: u64) {
        if let Some(l) = self.leaders.iter_mut().find(|l| i64::from(l.cpu) == cpu) {
            l.wake.follow(n);
        }
    }

    /// The reader is about to sleep: a window announced since the last drain starts counting
    /// now, not when its last event opened. Until the reader yields its CPU it keeps one
    /// thread of a target that fills every CPU off it: a dev build's reader went on 90 µs
    /// past the stamp of a 400 µs window (scheduler trace of fs), and the thread it kept
    /// waiting trapped first 110–170 µs in, so a third of the window counted one thread
    /// only. Hits before are in the window's opening margin, which the estimator drops.
    pub(crate) fn restamp_start(&mut self, time: u64) {
        if let Some(Event::WatchSet { time: t, words, .. }) = self.markers.last_mut() {
            if !words.is_empty() && self.state.is_armed() && *t < time {
                *t = time;
                self.counting_since = time;
            }
        }
    }

    /// The `WatchSet` markers queued since the last call, oldest first.
    pub(crate) fn take_markers(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.markers)
    }

    /// The armed set (slot n = index n), empty when disarmed.
    pub fn armed(&self) -> &[WatchSpec] {
        &self.specs
    }

    /// Threads that could not be watched (in at least one window), and why, by thread id.
    pub fn unwatched(&self) -> &BTreeMap<i32, Unwatched> {
        &self.unwatched
    }

    /// Before the hit counts are forgotten: how many threads the window's hits came from.
    fn note_hitters(&mut self) {
        if !self.hit_tids.is_empty() {
            self.last_hitters = self.hit_tids.len();
            self.hit_tids.clear();
        }
    }

    /// How many threads trapped in the last window that had hits (counted when its limits
    /// were last reset, at its end or rollover; 0 before any): a survey that filled a
    /// window with one thread's stores has learnt what more of the same would teach.
    pub fn last_hitters(&self) -> usize {
        self.last_hitters
    }

    /// True while the watchpoints are counting (armed and not cooling down).
    pub fn is_counting(&self) -> bool {
        self.state.is_armed()
    }

    /// Whether a window counts now that gives a thread created meanwhile its events only when
    /// its creation record is read ([`Watcher::thread_created`]): a launch window that is not
    /// inherited.
    pub fn covers_new_threads_when_read(&self) -> bool {
        self.binding == Binding::Launch
            && !self.inherit
            && !self.window_cpu_wide
            && self.state.is_armed()
            && !self.specs.is_empty()
    }

    pub fn duty_cycle(&self) -> DutyCycle {
        self.duty
    }

    pub fn set_duty_cycle(&mut self, duty: DutyCycle) {
        self.duty = duty;
    }

    pub fn stats(&self) -> WatchStats {
        WatchStats {
            cpu_wide_opens: self.opens[1],
            thread_opens: self.opens[0],
            company_waits: self.company.waits,
            company_waited: self.company.waited,
            ..self.state.stats
        }
    }

    /// The target exited: close the books on the current window or cooldown.
    pub(crate) fn finish(&mut self, now: Instant) {
        let t = now_ns();
        self.state.stop(now, self.target_cpu());
        if self.binding == Binding::Launch {
            self.close_window();
        }
        self.mark(false, t);
    }

    /// When `tick` next needs to run: only a cooldown needs a timer (see
    /// [`DutyState::next_deadline`]).
    pub(crate) fn next_deadline(&self, now: Instant) -> Option<Instant> {
        if !self.state.is_cooling() {
            return None; // armed windows end on their hits' wake-ups; idle needs nothing
        }
        if self.company.waiting() {
            return Some(now + company::POLL);
        }
        self.state
            .next_deadline(&self.duty, now, self.target_cpu(), self.cpus)
    }

    /// Advances the duty cycle: `new_hits` watch samples were just read.
    pub(crate) fn tick(&mut self, now: Instant, new_hits: u64) -> Result<(), DriverError> {
        self.note_reader();
        if self.state.is_idle() {
            self.state.tick(&self.duty, now, new_hits, Duration::ZERO);
            return Ok(());
        }
        let cpu = self.target_cpu();
        // A window due now waits for its company. (A tick that brings hits, stragglers of
        // the last window, goes on as before: they belong in its cooldown.)
        if new_hits == 0
            && self.state.cooldown_paid(&self.duty, now, cpu)
            && self.company.waits_at(now)
        {
            return Ok(());
        }
        let was_armed = self.state.is_armed();
        let action = self.state.tick(&self.duty, now, new_hits, cpu);
        if action == Action::Enable {
            self.company.opened(now);
        }
        if was_armed {
            // Read before a closing window forgets its threads.
            self.charge_switches();
        }
        let ops = thread_cpu_time();
        let r = match action {
            Action::Nothing => Ok(()),
            Action::Rollover => {
                let r = match self.binding {
                    Binding::Launch if !self.inherit => self.renew_hot(),
                    Binding::Attach => self.renew_attached(),
                    Binding::Launch => Ok(()),
                };
                // A window a spent limit stopped counting (`note_hit`) counts again once the
                // spent events are renewed.
                if self.last_marked_empty {
                    self.mark(true, now_ns());
                }
                r
            }
            Action::Enable => {
                let r = if self.binding == Binding::Launch {
                    self.sync_window()
                } else {
                    self.attached_enable_due = true;
                    Ok(())
                };
                self.mark(true, now_ns());
                r
            }
            Action::Disable => {
                let t = now_ns();
                // Unused slots were disabled when the set was armed (`repoint_attached`).
                let r = if self.binding == Binding::Launch {
                    self.close_window();
                    // The first window that trapped has just closed: the hit cost is
                    // measured now, so its cooldown is priced at what its hits cost rather
                    // than at the provisional price, about three times that here (a code
                    // window's 37 hits of Phoenix histogram -O0 cooled for 150 ms, not ~70,
                    // a third of that 0.4 s run's windows).
                    self.calibrate_once()
                } else {
                    self.events
                        .iter()
                        .filter(|e| (e.slot as usize) < self.specs.len())
                        .try_for_each(|ev| sys::disable(&ev.fd))
                };
                self.mark(false, t);
                r
            }
        };
        // Whatever laser did to its events for this tick is a cost of the window.
        if action != Action::Nothing {
            self.charge_ops(ops);
        }
        self.restart_switches();
        self.mark_reader();
        r
    }

    /// Notes laser's work since the last tick, when a window counted through it
    /// ([`DutyState::note_reader`]): draining and decoding what the window wrote, the
    /// detector and steering. Its own calibration traps are left out, as in
    /// [`Watcher::charge_ops`].
    fn note_reader(&mut self) {
        if let Some((mark, calibration)) = self.reader_mark.take() {
            let own = self.calibration_cpu.saturating_sub(calibration);
            let spent = thread_cpu_time().saturating_sub(mark);
            self.state.note_reader(spent.saturating_sub(own));
        }
    }

    /// Notes laser's thread CPU clock after a tick that leaves a window counting.
    fn mark_reader(&mut self) {
        self.reader_mark = self
            .state
            .is_armed()
            .then(|| (thread_cpu_time(), self.calibration_cpu));
    }

    /// Charges the watched threads' context switches since they were last read, over which
    /// events were armed: each switch-in loaded the debug registers ([`crate::switches`]).
    /// A thread read for the first time is only noted.
    fn charge_switches(&mut self) {
        if self.duty.model != CostModel::Full {
            return;
        }
        // Both sets are ordered by thread id (an attached thread's key is its id).
        let n = match self.binding {
            Binding::Launch => self.switches.advance(self.window_tids.iter().copied()),
            Binding::Attach => self
                .switches
                .advance(self.thread_leaders.values().map(|&(tid, _)| tid)),
        };
        self.state.charge_switches(n, SWITCH_COST);
    }

    /// laser's work on the events since `since`, a reading of this thread's CPU clock
    /// ([`CostModel::Full`]). CPU time, not wall time: what takes a CPU from the target is
    /// laser running (and the interrupts it sends, which it waits for spinning), not laser
    /// asleep — opening the first whole-CPU breakpoint after an idle spell waits ~6 ms here
    /// for an RCU grace period (the kernel's breakpoint-slot lock, `bp_cpuinfo_sem`, taken
    /// for writing), during which the target runs untouched.
    fn charge_ops(&mut self, since: Duration) {
        // A calibration run meanwhile is laser's own trapping, not work on the target's
        // window events.
        let own = std::mem::take(&mut self.calibration_cpu);
        if self.duty.model == CostModel::Full {
            let spent = thread_cpu_time().saturating_sub(since);
            self.state.charge(spent.saturating_sub(own));
        }
    }

    /// After the events changed: armed, the threads watched from now on are noted (those
    /// already noted are charged what they switched since); not armed, the counts start
    /// afresh at the next window.
    fn restart_switches(&mut self) {
        if self.state.is_armed() {
            self.charge_switches();
        } else {
            self.switches.clear();
        }
    }

    /// Attach: points the events from index `from` on at their slots' specs, disabled (an
    /// unused slot is just disabled).
    fn repoint_attached(&self, from: usize) -> Result<(), DriverError> {
        for ev in &self.events[from..] {
            match self.specs.get(ev.slot as usize) {
                Some(s) => sys::modify(
                    &ev.fd,
                    &attr::repoint(&ev.attr, s.addr, s.len, s.kind, true),
                )?,
                None => sys::disable(&ev.fd)?,
            }
        }
        Ok(())
    }

    /// Attach: enables the events from index `from` on whose slot is armed, each for the
    /// share of the window's cap at most (see the module doc). An attached thread's events live
    /// across windows and so does the kernel's limit: an event given one that has not
    /// trapped since still has all of it and is just enabled; one that trapped may have spent
    /// it, and a breakpoint its limit stopped cannot be restarted ([`Watcher::renew_hot`]),
    /// so it is replaced by a fresh one.
    fn enable_attached(&mut self, from: usize) -> Result<(), DriverError> {
        let cap = self.limit();
        let trapped = |key: i64, slot: u8| {
            let events = (key, slot, 0)..=(key, slot, u32::MAX);
            self.trapped_unknown || self.trapped.range(events).next().is_some()
        };
        let spent: Vec<u64> = self.events[from..]
            .iter()
            .filter(|ev| (ev.slot as usize) < self.specs.len())
            .filter(|ev| ev.limited && trapped(ev.key, ev.slot))
            .map(|ev| ev.id)
            .collect();
        // Replaced first and opened disabled: every thread then starts counting within the
        // few ioctls below, not after the others' events were enabled and a trapped thread's
        // open, output and limit came after them (one thread's burst could fill the cap
        // before the thread replaced last counted).
        self.reopen_attached(&spent, false)?;
        for ev in &mut self.events[from..] {
            if ev.slot as usize >= self.specs.len() {
                continue;
            }
            if !ev.limited {
                sys::refresh(&ev.fd, cap)?;
                ev.limited = true;
            } else {
                sys::enable(&ev.fd)?;
            }
        }
        if from == 0 {
            // Not `limits_reset`: the events just enabled keep the limits they were given
            // when they last opened or trapped, so hits taken since still count toward them
            // (a time mark set here, after the enables, once dropped the first hits of a
            // fresh window, and the kernel's spend came unseen: windows of 200 ms counted
            // dead on an attached fs). Renewed events get their own mark (`reopen_attached`).
            self.note_hitters();
            self.trapped.clear();
            self.state.limits_renewed();
            self.trapped_unknown = false;
        }
        Ok(())
    }

    /// Attach: a window rolled over with its events enabled ([`Action::Rollover`]): those
    /// that trapped are replaced by fresh ones with a whole limit, as in launch.
    fn renew_attached(&mut self) -> Result<(), DriverError> {
        let all = std::mem::take(&mut self.trapped_unknown);
        let trapped = self.take_trapped();
        let spent: Vec<u64> = self
            .events
            .iter()
            .filter(|e| (e.slot as usize) < self.specs.len())
            .filter(|e| all || trapped.contains(&(e.key, e.slot)))
            .map(|e| e.id)
            .collect();
        self.reopen_attached(&spent, true)
    }

    /// Attach: replaces the events with ids `spent` by fresh ones pointed at their slots'
    /// specs, enabled with a whole limit (`enable`) or left disabled and unlimited for the
    /// caller to `REFRESH`. A thread that exited is skipped; one whose registers were taken
    /// meanwhile, or for which descriptors ran out, loses that slot (noted).
    fn reopen_attached(&mut self, spent: &[u64], enable: bool) -> Result<(), DriverError> {
        if spent.is_empty() {
            return Ok(());
        }
        let cap = self.limit();
        let (old, keep): (Vec<WatchEvent>, Vec<WatchEvent>) = std::mem::take(&mut self.events)
            .into_iter()
            .partition(|e| spent.contains(&e.id));
        self.events = keep;
        for ev in old {
            let (key, slot) = (ev.key, ev.slot);
            self.closed_ids.push(ev.id);
            // Closed first: a thread has 4 debug registers, spent events included.
            drop(ev);
            self.renewed_since.insert((key, slot), now_ns());
            let (Some((tid, leader)), Some(s)) = (
                self.thread_leaders.get(&key),
                self.specs.get(slot as usize).copied(),
            ) else {
                continue;
            };
            let (tid, leader) = (*tid, *leader);
            let base = attr::watch(Binding::Attach, self.limit());
            let opened = open_replacing(|| {
                sys::open(
                    &attr::repoint(&base, s.addr, s.len, s.kind, true),
                    tid,
                    -1,
                    &format!("watchpoint slot {slot}"),
                )
            })
            .and_then(|fd| {
                sys::set_output(&fd, leader)?;
                let id = sys::event_id(&fd)?;
                if enable {
                    sys::refresh(&fd, cap)?;
                }
                Ok((fd, id))
            });
            if let Some((fd, id)) = self.opened_or_passed_over(tid, opened)? {
                self.opened_ids.push((id, slot));
                self.events.push(WatchEvent {
                    key,
                    slot,
                    cpu: -1,
                    fd,
                    attr: base,
                    id,
                    limited: enable,
                    group: GroupRole::Alone,
                });
            }
        }
        Ok(())
    }
}

/// The sample clock (`Event::time`: CLOCK_MONOTONIC, see `attr::base`) now.
/// The key of a whole-CPU window event on `cpu` ([`Watcher::set_cpu_wide`]): negative, so it
/// is never a thread's.
fn cpu_key(cpu: i32) -> i64 {
    -1 - i64::from(cpu)
}

fn now_ns() -> u64 {
    crate::session::clock_ns(libc::CLOCK_MONOTONIC)
}

/// Raises laser's soft limit on open descriptors to the hard limit (what `perf` does too).
/// Only laser's own: the program was started before and keeps its limits.
fn raise_nofile_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write one rlimit struct, a live local.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Tries to open an event again this often, [`REPLACE_WAIT`] apart, while the kernel refuses
/// it a debug register (see [`open_replacing`]).
const REPLACE_TRIES: u32 = 20;
const REPLACE_WAIT: Duration = Duration::from_micros(200);

/// Opens an event in place of one just closed on the same thread (a spent limit's renewal).
/// The kernel releases a closed breakpoint's debug register a moment later at times. The
/// live attach test beside the other live tests got `ENOSPC` for both renewals of a window
/// about once in 6 runs, and took those threads for ones whose registers another tool held:
/// they went unwatched for the rest of the run. Retried, the open succeeded after 2 waits of
/// 200 µs. So `ENOSPC` is retried for up to 4 ms before it means that.
fn open_replacing<T>(mut open: impl FnMut() -> Result<T, DriverError>) -> Result<T, DriverError> {
    for _ in 0..REPLACE_TRIES {
        match open() {
            Err(e) if is_enospc(&e) => std::thread::sleep(REPLACE_WAIT),
            r => return r,
        }
    }
    open()
}

fn is_esrch(e: &DriverError) -> bool {
    matches!(e, DriverError::Open { source, .. } if source.raw_os_error() == Some(libc::ESRCH))
}

fn is_enospc(e: &DriverError) -> bool {
    matches!(e, DriverError::Open { source, .. } if source.raw_os_error() == Some(libc::ENOSPC))
}

/// Whether thread `tid` can take `n` more breakpoints on `cpu`: parked, disabled fillers
/// (never inherited) are opened and closed again. The kernel reserves a debug register for
/// every breakpoint event of a thread, enabled or not, and refuses the fifth per CPU with
/// `ENOSPC`; so after laser's own `MAX_WATCHES - n`, `false` means the thread carries
/// breakpoints already (inherited from a thread whose window events were open when it was
/// created, or a debugger's).
fn probe_uncovered(tid: i32, cpu: i32, n: usize) -> Result<bool, DriverError> {
    let filler = attr::watch(Binding::Attach, 1);
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        match sys::open(&filler, tid, cpu, "watchpoint slot probe") {
            Ok(fd) => held.push(fd),
            Err(e) if is_enospc(&e) => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
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
    fn hit_cost_is_measurable_here() {
        let c = measure_hit_cost(2000, false).unwrap();
        eprintln!("one watchpoint hit costs {c:?}");
        // A debug trap + perf overflow handling cannot be free, nor take a millisecond.
        assert!(
            c > Duration::from_nanos(100) && c < Duration::from_millis(1),
            "{c:?}"
        );
    }

    /// The lost trap's SIGTRAP is forced on the thread (an ignored or blocked one would be
    /// reset to its default and kill); a handler is honoured, so the one the calibration
    /// installs keeps laser alive. A thread may send itself the same signal.
    #[test]
    fn a_lost_trap_on_laser_itself_is_counted_not_fatal() {
        keep_lost_traps();
        let before = own_lost_traps();
        // SAFETY: tgkill to this thread; the handler only bumps an atomic.
        unsafe {
            libc::syscall(
                libc::SYS_tgkill,
                libc::getpid(),
                libc::gettid(),
                libc::SIGTRAP,
            )
        };
        assert!(own_lost_traps() > before);
    }

    #[test]
    fn too_many_watches_is_an_error_without_touching_events() {
        let mut w = Watcher::new(Binding::Attach, DutyCycle::default(), None);
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

    /// The budget's clock covers every process of a launched target (a shell script's
    /// children do the work), and keeps what a process used after it is gone.
    #[test]
    fn target_cpu_sums_the_processes_and_keeps_what_exited_ones_used() {
        let mut w = Watcher::new(Binding::Launch, DutyCycle::default(), None);
        assert_eq!(
            w.target_cpu(),
            Duration::ZERO,
            "no process: a clock that stands still"
        );
        let mut child = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap();
        let pid = child.id() as libc::pid_t;
        w.add_process(pid);
        w.add_process(pid); // a repeated fork record changes nothing
        let t0 = std::time::Instant::now();
        while sys::process_cpu_time(pid).unwrap() < Duration::from_millis(30)
            && t0.elapsed() < Duration::from_secs(20)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        let seen = w.target_cpu();
        assert!(seen >= Duration::from_millis(30), "{seen:?}");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(
            sys::process_cpu_time(pid).is_err(),
            "reaped: its clock is gone"
        );
        assert!(
            w.target_cpu() >= seen,
            "an exited process's CPU stays counted"
        );
        w.retire_process(pid);
        assert!(w.target_cpu() >= seen);
    }

    /// The race check of an inherited launch window: a thread created after a breakpoint was
    /// opened with `inherit` on its creator carries a copy (fewer slots fit), one created
    /// before does not — whether the breakpoint is enabled or not.
    #[test]
    fn probe_tells_inherited_breakpoints_from_none() {
        use std::sync::mpsc;
        let spawn = || {
            let (tid_tx, tid_rx) = mpsc::channel();
            let (go_tx, go_rx) = mpsc::channel::<()>();
            let h = std::thread::spawn(move || {
                // SAFETY: gettid has no preconditions.
                tid_tx.send(unsafe { libc::gettid() }).unwrap();
                let _ = go_rx.recv();
            });
            (tid_rx.recv().unwrap(), go_tx, h)
        };
        let cpu = sys::online_cpus().unwrap()[0] as i32;
        let (before, go1, h1) = spawn();
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        let mut parked = attr::watch(Binding::Launch, 1);
        parked.set_inherit(1);
        let fd = sys::open(&parked, me, cpu, "inherited breakpoint").unwrap();
        let (after, go2, h2) = spawn();
        assert!(probe_uncovered(before, cpu, MAX_WATCHES).unwrap());
        assert!(!probe_uncovered(after, cpu, MAX_WATCHES).unwrap());
        assert!(probe_uncovered(after, cpu, MAX_WATCHES - 1).unwrap());
        drop(fd);
        for (go, h) in [(go1, h1), (go2, h2)] {
            drop(go);
            h.join().unwrap();
        }
    }

    fn spec(addr: u64) -> WatchSpec {
        WatchSpec {
            addr,
            len: 8,
            kind: WatchKind::ReadWrite,
        }
    }

    /// laser's own work between two polls while a window counts is noted for the report,
    /// its work while none counts is not, and neither delays the next window.
    #[test]
    fn the_readers_work_while_a_window_counts_is_noted() {
        let burn = |d: Duration| {
            let t = thread_cpu_time();
            while thread_cpu_time().saturating_sub(t) < d {
                std::hint::spin_loop();
            }
        };
        let duty = DutyCycle::new(Duration::from_millis(20), 0.02, Duration::from_micros(10));
        let mut w = Watcher::new(Binding::Attach, duty, None);
        w.arm(&[spec(0x1000)]).unwrap();
        w.tick(Instant::now(), 0).unwrap();
        assert!(w.is_counting());
        assert_eq!(w.stats().reader_time, Duration::ZERO);
        burn(Duration::from_millis(3));
        w.tick(Instant::now(), 0).unwrap();
        let noted = w.stats().reader_time;
        assert!(
            noted >= Duration::from_millis(3) && noted < Duration::from_millis(100),
            "{noted:?}"
        );
        w.disarm().unwrap();
        w.tick(Instant::now(), 0).unwrap();
        assert!(!w.is_counting());
        let at_disarm = w.stats().reader_time;
        burn(Duration::from_millis(3));
        w.tick(Instant::now(), 0).unwrap();
        assert_eq!(w.stats().reader_time, at_disarm, "no window counted");
        // What the events' own opening and closing took is charged; the reader's 3 ms not.
        let ops = w.stats().ops_time;
        assert!(
            ops < Duration::from_millis(1),
            "noted, not charged: {ops:?}"
        );
    }

    /// The hit that spends an event's limit ends the counting window right after it; hits
    /// spread over other events do not (no events here: the counting and the marker).
    #[test]
    fn the_hit_that_spends_a_limit_ends_the_window() {
        let duty = DutyCycle::new(Duration::from_millis(20), 0.02, Duration::from_micros(10));
        let mut w = Watcher::new(Binding::Attach, duty, None);
        w.arm(&[spec(0x1000), spec(0x1008)]).unwrap();
        w.take_markers();
        let t0 = now_ns();
        let cap = w.duty_cycle().max_hits_per_window;
        // Each event's limit is its share of the cap: the window's hits come from the
        // threads running at once, so the first share spent comes at about the cap.
        let limit = u64::from(w.limit());
        assert_eq!(limit, cap.div_ceil(u64::from(w.cpus)));
        assert!(limit >= 2, "{limit}");
        // Thread 7 on slot 0 from two CPUs (attached: one event), thread 8 on slot 1.
        for i in 0..limit - 1 {
            assert_eq!(w.note_hit(7, (i % 2) as u32, 0, t0 + 100 + i), None);
            assert_eq!(w.note_hit(8, 0, 1, t0 + 100 + i), None);
        }
        let end = w.note_hit(7, 1, 0, t0 + 5_000);
        assert!(
            matches!(&end, Some(Event::WatchSet { time, words, .. })
                if *time == t0 + 5_001 && words.is_empty()),
            "{end:?}"
        );
        assert_eq!(
            w.note_hit(8, 0, 1, t0 + 5_002),
            None,
            "the window has ended already"
        );
        assert!(w.take_markers().is_empty(), "returned, not queued");
        // The duty cycle ends that window at the next tick although its hits are under the
        // cap: left armed, it would count nothing until the other events spent theirs. Its
        // hits are not paid for (this watcher's target never runs): a cooldown.
        // (Ticked with the spending event's hits alone: under the cap on 2 CPUs or more.)
        w.tick(Instant::now(), limit).unwrap();
        assert!(!w.is_counting(), "the spent window cools down");
        assert!(w.next_deadline(Instant::now()).is_some());
    }

    /// A look's window ends with its whole cap, not with the first share spent: the thread
    /// that spent one share may hold a lock the others wait for, and the look is there for
    /// their accesses. (Without this, the first loop's last hit ended the window.)
    #[test]
    fn a_looks_window_ends_with_its_whole_cap() {
        let duty = DutyCycle::new(Duration::from_millis(20), 0.02, Duration::from_micros(10));
        let mut w = Watcher::new(Binding::Attach, duty, None);
        w.arm_look(&[spec(0x1000)]).unwrap();
        w.take_markers();
        let t0 = now_ns();
        let cap = w.duty_cycle().max_hits_per_window;
        let first = u64::from(w.limit()).min(cap - 1);
        // Thread 7 spends its event's share (on 2 CPUs or more): the window goes on.
        for i in 0..first {
            assert_eq!(w.note_hit(7, 0, 0, t0 + 100 + i), None, "hit {i}");
        }
        // Thread 8's hits take the rest of the cap; the one that reaches it ends the window.
        for i in first..cap - 1 {
            assert_eq!(w.note_hit(8, 1, 0, t0 + 100 + i), None, "hit {i}");
        }
        let end = w.note_hit(8, 1, 0, t0 + 5_000);
        assert!(
            matches!(&end, Some(Event::WatchSet { time, words, .. })
                if *time == t0 + 5_001 && words.is_empty()),
            "{end:?}"
        );
    }

    /// Launch: a re-armed set opens fresh events. Hits of the closed ones read after that
    /// (stragglers) count toward no fresh limit, so they cannot end the new window; the
    /// fresh events' own spend does.
    #[test]
    fn stragglers_of_closed_events_spend_no_limit() {
        let duty = DutyCycle::new(Duration::from_millis(20), 0.02, Duration::from_micros(10));
        let mut w = Watcher::new(Binding::Launch, duty, None);
        w.arm(&[spec(0x1000)]).unwrap();
        let before = now_ns();
        w.arm(&[spec(0x1000), spec(0x1008)]).unwrap();
        w.take_markers();
        let t0 = now_ns();
        let limit = u64::from(w.limit());
        for i in 0..2 * limit {
            assert_eq!(w.note_hit(7, 0, 0, before - 1_000 + i), None, "straggler");
        }
        for i in 0..limit - 1 {
            assert_eq!(w.note_hit(7, 0, 0, t0 + 100 + i), None);
        }
        let end = w.note_hit(7, 0, 0, t0 + 5_000);
        assert!(
            matches!(&end, Some(Event::WatchSet { words, .. }) if words.is_empty()),
            "{end:?}"
        );
    }

    /// The ring's wake-up counter as the kernel keeps it: what is left over carries into the
    /// next window, and a window's events are given what makes their first wake-up come
    /// after `limit` hits on the ring.
    #[test]
    fn a_rings_first_wake_up_comes_at_the_limit() {
        let mut r = RingWake::default();
        r.follow(5); // no events yet: nothing counts
        assert_eq!(r, RingWake::default());
        r.rearm(56);
        assert_eq!(r.wake, 56);
        r.follow(56 + 30); // a wake-up at 56, then 30 left
        assert_eq!(r.count, 30);
        // The next window: a fixed 56 would wake the reader 26 hits in; this wakes it at 56.
        r.rearm(56);
        assert_eq!(r.wake, 86);
        r.follow(55);
        assert_eq!(r.count, 85, "no wake-up yet");
        r.follow(1);
        assert_eq!(r.count, 0, "the wake-up, at the 56th hit");
    }

    /// A window counts from when the reader sleeps: its start marker, still queued, moves
    /// there, and a limit spent before that ends no window (the duty cycle ends it).
    #[test]
    fn a_window_starts_when_the_reader_sleeps() {
        let duty = DutyCycle::new(Duration::from_millis(20), 0.02, Duration::from_micros(10));
        let mut w = Watcher::new(Binding::Attach, duty, None);
        w.arm(&[spec(0x1000)]).unwrap();
        let sleep = now_ns() + 1_000_000;
        w.restamp_start(sleep);
        let m = w.take_markers();
        assert!(
            matches!(&m[..], [Event::WatchSet { time, words, .. }] if *time == sleep && !words.is_empty()),
            "{m:?}"
        );
        // Nothing queued: nothing moves.
        w.restamp_start(sleep + 5);
        assert!(w.take_markers().is_empty());
        let limit = u64::from(w.limit());
        for i in 0..limit {
            assert_eq!(w.note_hit(7, 0, 0, sleep - 500 + i), None, "in the margin");
        }
        w.tick(Instant::now(), limit).unwrap();
        assert!(!w.is_counting(), "ended by the duty cycle");
        let m = w.take_markers();
        assert!(
            matches!(&m[..], [Event::WatchSet { words, .. }] if words.is_empty()),
            "{m:?}"
        );
    }

    /// The CLI re-arms on a timer: the same set again must change nothing, and a new set
    /// during a cooldown must wait for it (no events here: the state machine and markers).
    #[test]
    fn rearming_keeps_the_duty_cycle() {
        let duty = DutyCycle::new(Duration::from_millis(20), 0.02, Duration::from_micros(10));
        let mut w = Watcher::new(Binding::Attach, duty, None);
        w.arm(&[spec(0x1000)]).unwrap();
        assert_eq!(w.take_markers().len(), 1);
        assert_eq!(w.stats().windows, 1);
        w.arm(&[spec(0x1000)]).unwrap();
        assert!(
            w.take_markers().is_empty(),
            "same set: no new window, no marker"
        );
        assert_eq!(w.stats().windows, 1);
        // A new set while counting: the window on the old one ends before its events move,
        // the one on the new set starts after they have (`Watcher::mark`).
        w.arm(&[spec(0x1040)]).unwrap();
        let m = w.take_markers();
        let [Event::WatchSet {
            time: end,
            words: none,
            ..
        }, Event::WatchSet {
            time: start,
            words: new,
            ..
        }] = &m[..]
        else {
            panic!("expected an end and a start marker, got {m:?}");
        };
        assert!(none.is_empty() && new == &[(0x1040, 8)] && end <= start);
        assert_eq!(w.stats().windows, 1, "the duty cycle's window goes on");
        w.arm(&[spec(0x1000)]).unwrap();
        w.take_markers();
        // The window hits its cap: cooling (this watcher has no target, so the target's CPU
        // time never advances and the cooldown never ends).
        let cap = w.duty_cycle().max_hits_per_window;
        w.tick(Instant::now(), cap).unwrap();
        assert!(!w.is_counting());
        let m = w.take_markers();
        assert!(matches!(&m[..], [Event::WatchSet { words, .. }] if words.is_empty()));
        // A new set while cooling: loaded, not counting, nothing announced.
        w.arm(&[spec(0x2000), spec(0x2008)]).unwrap();
        assert_eq!(w.armed(), &[spec(0x2000), spec(0x2008)]);
        assert!(!w.is_counting(), "a re-arm must not cut the cooldown short");
        assert!(w.take_markers().is_empty());
        assert!(w.next_deadline(Instant::now()).is_some());
        // Disarm from cooling: idle; arming again starts a fresh window.
        w.disarm().unwrap();
        w.arm(&[spec(0x2000)]).unwrap();
        assert!(w.is_counting());
        assert_eq!(w.stats().windows, 2);
        assert_eq!(w.stats().unpaid_hits, cap);
    }
}
