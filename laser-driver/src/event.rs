//! The one stream type that flows from every backend (live perf ring buffers, watchpoints,
//! recordings) into the detector. The detector must not be able to tell where an event came
//! from: a recording replays through exactly the code a live run uses.
//!
//! Field layouts follow the kernel's `perf_event.h` where they mirror a perf record, so a reader
//! who knows perf can map one onto the other.

use std::fmt;

/// Which kind of sampling produced a stream. Stored in recordings and reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendKind {
    /// Intel PEBS precise load/store events with `data_src` (HITM).
    Pebs,
    /// AMD IBS op sampling; `data_src` decoded by the kernel.
    Ibs,
    /// `cpu-clock` timer sampling with user registers: works with no PMU at all.
    Soft,
    /// Hardware data watchpoints (`PERF_TYPE_BREAKPOINT`) on chosen addresses.
    Watch,
}

impl BackendKind {
    pub const ALL: [BackendKind; 4] = [Self::Pebs, Self::Ibs, Self::Soft, Self::Watch];

    pub fn name(self) -> &'static str {
        match self {
            Self::Pebs => "pebs",
            Self::Ibs => "ibs",
            Self::Soft => "soft",
            Self::Watch => "watch",
        }
    }

    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|b| b.name() == s)
    }

    /// Stable one-byte code used by the recording format.
    pub fn code(self) -> u8 {
        match self {
            Self::Pebs => 1,
            Self::Ibs => 2,
            Self::Soft => 3,
            Self::Watch => 4,
        }
    }

    pub fn from_code(c: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|b| b.code() == c)
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// x86-64 user registers in the kernel's `perf_regs.h` numbering
/// (`PERF_REG_X86_AX` = 0 … `PERF_REG_X86_R15` = 23). Segment selectors (CS…GS, 10–15) are
/// kept for completeness but carry no base address: `%fs`/`%gs`-relative accesses cannot be
/// resolved from a sample and the detector treats them as thread-local.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Reg {
    Ax = 0,
    Bx = 1,
    Cx = 2,
    Dx = 3,
    Si = 4,
    Di = 5,
    Bp = 6,
    Sp = 7,
    Ip = 8,
    Flags = 9,
    Cs = 10,
    Ss = 11,
    Ds = 12,
    Es = 13,
    Fs = 14,
    Gs = 15,
    R8 = 16,
    R9 = 17,
    R10 = 18,
    R11 = 19,
    R12 = 20,
    R13 = 21,
    R14 = 22,
    R15 = 23,
}

/// Number of slots in [`UserRegs`]: `PERF_REG_X86_64_MAX`.
pub const NUM_REGS: usize = 24;

/// The registers the soft backend asks for: every general-purpose register, ip and flags
/// (no segment selectors, which are useless for addressing in 64-bit user code).
pub const SOFT_REGS_MASK: u64 = 0x00ff_03ff;

/// A sampled user register set. `mask` says which slots were recorded (bit N = `Reg` N);
/// unrecorded slots read as 0 and must not be trusted.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct UserRegs {
    pub mask: u64,
    pub values: [u64; NUM_REGS],
}

impl UserRegs {
    pub fn get(&self, r: Reg) -> Option<u64> {
        let i = r as usize;
        (self.mask & (1 << i) != 0).then(|| self.values[i])
    }

    pub fn set(&mut self, r: Reg, v: u64) {
        let i = r as usize;
        self.mask |= 1 << i;
        self.values[i] = v;
    }
}

impl fmt::Debug for UserRegs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut m = f.debug_map();
        for i in 0..NUM_REGS {
            if self.mask & (1 << i) != 0 {
                m.entry(&i, &format_args!("{:#x}", self.values[i]));
            }
        }
        m.finish()
    }
}

/// Most candidate return addresses a sample carries (see [`Callers`]).
pub const MAX_CALLERS: usize = 4;

/// Candidate return addresses found on a sample's user stack: words, lowest address (innermost
/// frame) first, that point into executable code of a module other than the one the sample's
/// IP is in. The detector keeps the first that follows a call instruction: the call site in
/// the program of a sample taken inside a library (glibc's mutex code has no frame pointers,
/// so a frame-pointer walk would skip exactly that caller). Empty when the stack was not
/// recorded or held no such word.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Callers {
    len: u8,
    pcs: [u64; MAX_CALLERS],
}

impl Callers {
    /// Adds `pc` unless it is already there; returns false (and adds nothing) when full.
    pub fn push(&mut self, pc: u64) -> bool {
        if self.as_slice().contains(&pc) {
            return true;
        }
        let Some(slot) = self.pcs.get_mut(self.len as usize) else {
            return false;
        };
        *slot = pc;
        self.len += 1;
        true
    }

    pub fn as_slice(&self) -> &[u64] {
        &self.pcs[..self.len as usize]
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }
}

impl<'a> FromIterator<&'a u64> for Callers {
    fn from_iter<I: IntoIterator<Item = &'a u64>>(it: I) -> Self {
        let mut c = Callers::default();
        for &pc in it {
            if !c.push(pc) {
                break;
            }
        }
        c
    }
}

impl fmt::Debug for Callers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut l = f.debug_list();
        for pc in self.as_slice() {
            l.entry(&format_args!("{pc:#x}"));
        }
        l.finish()
    }
}

/// One sample: an instruction observed in a thread, possibly with the data address it touched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    pub backend: BackendKind,
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    /// `perf_clock` nanoseconds (CLOCK_MONOTONIC unless the attr says otherwise).
    pub time: u64,
    /// For `soft`: the interrupted instruction (not yet executed). For `watch`: the instruction
    /// *after* the access (debug traps fire after retirement). For `pebs`/`ibs`: the precise IP.
    pub ip: u64,
    /// Data address, where the hardware supplies one (`pebs`, `ibs`, `watch`).
    pub addr: Option<u64>,
    /// Raw `perf_mem_data_src` word, where the backend supplies one.
    pub data_src: Option<u64>,
    /// How many events this sample stands for (the sampling period, or 1 for exact backends).
    pub weight: u64,
    /// User registers at the sample (`soft`; optional elsewhere).
    pub regs: Option<UserRegs>,
    /// For `watch`: which armed watchpoint slot fired (index into the armed set).
    pub watch_slot: Option<u8>,
    /// Candidate return addresses into other modules, from the sampled user stack.
    pub callers: Callers,
}

impl Sample {
    /// A timer sample (`soft`) of thread `tid` at `ip` with registers `regs`, standing for one
    /// event: what tests and synthetic streams feed a detector.
    pub fn soft(pid: u32, tid: u32, cpu: u32, time: u64, ip: u64, regs: UserRegs) -> Sample {
        Sample {
            backend: BackendKind::Soft,
            pid,
            tid,
            cpu,
            time,
            ip,
            addr: None,
            data_src: None,
            weight: 1,
            regs: Some(regs),
            watch_slot: None,
            callers: Callers::default(),
        }
    }
}

/// A new executable or data mapping in the target (`PERF_RECORD_MMAP2`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mmap {
    pub pid: u32,
    pub tid: u32,
    pub time: u64,
    pub addr: u64,
    pub len: u64,
    pub pgoff: u64,
    /// `PROT_*` bits.
    pub prot: u32,
    /// `MAP_*` bits.
    pub flags: u32,
    pub path: String,
    /// GNU build-id of the mapped file, if the kernel reported it or the driver read it.
    pub build_id: Option<Vec<u8>>,
}

/// Everything the detector consumes.
// Samples are nearly every event and the largest: boxing them would allocate per sample,
// while the rare small variants only waste the difference.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Sample(Sample),
    Mmap(Mmap),
    /// A thread's name changed; `exec` is true when it changed because of `execve`.
    Comm {
        pid: u32,
        tid: u32,
        time: u64,
        name: String,
        exec: bool,
    },
    /// A thread or process was created (`PERF_RECORD_FORK`).
    Fork {
        pid: u32,
        ppid: u32,
        tid: u32,
        ptid: u32,
        time: u64,
    },
    /// A thread or process exited (`PERF_RECORD_EXIT`).
    Exit {
        pid: u32,
        ppid: u32,
        tid: u32,
        ptid: u32,
        time: u64,
    },
    /// The kernel dropped `count` records because a ring buffer was full.
    Lost {
        count: u64,
        time: u64,
    },
    /// The kernel throttled (`throttled = true`) or unthrottled sampling.
    Throttle {
        time: u64,
        throttled: bool,
    },
    /// From `time` on, exactly `words` (address, length) are watched in every thread of the
    /// target; empty = nothing is. Emitted by the `watch` backend at every arm, disarm and
    /// duty-cycle transition, so a consumer knows how long each word was watched (the watch
    /// estimator turns hit counts into rates with it), live or replayed from a recording.
    WatchSet {
        time: u64,
        words: Vec<(u64, u8)>,
        /// Bit i set: word i traps on writes only (a survey window, see laser-detect's
        /// `survey`); clear: on reads and writes.
        write_only: u8,
        /// Bit i set: word i is an instruction (a code window: it traps on every execution
        /// of the instruction at that address, whatever it accesses), not data.
        exec: u8,
        /// Bit i set: word i is data on a line a code window has just seen contended (a
        /// *front* window: it follows contention that moves from line to line, see
        /// laser-detect's `model::estimate`), armed to measure that line while it is hot.
        front: u8,
        /// Bit i set: word i is in a *look* window: words of a line already rated that no
        /// sample showed, watched to see who else accesses the line there. Its hits are
        /// accesses like any, but the window is not rated (laser's steering,
        /// `unsampled_look`).
        look: u8,
    },
    /// The `watch` backend measured what one watchpoint hit costs the trapping thread (the
    /// debug trap, the sample written to the ring, the resume): `hit_ns` nanoseconds. Emitted
    /// once, when the first watchpoint opens. The estimator subtracts each thread's trap time
    /// from the armed time with it; recorded, so a replay corrects rates as the live run did.
    WatchCost {
        time: u64,
        hit_ns: u64,
    },
}

impl Event {
    /// Timestamp of the event, if it has one (every kind does; `Lost` may carry 0).
    pub fn time(&self) -> u64 {
        match self {
            Event::Sample(s) => s.time,
            Event::Mmap(m) => m.time,
            Event::Comm { time, .. }
            | Event::Fork { time, .. }
            | Event::Exit { time, .. }
            | Event::Lost { time, .. }
            | Event::Throttle { time, .. }
            | Event::WatchSet { time, .. }
            | Event::WatchCost { time, .. } => *time,
        }
    }
}

/// Totals every consumer of a stream must surface: a run that lost samples says so.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamStats {
    pub samples: u64,
    pub lost: u64,
    pub throttles: u64,
    pub records: u64,
    /// Samples of other processes that CPU-wide sampling took and the reader dropped
    /// (`Session::launch`); not in `samples` or `records`.
    pub foreign: u64,
}

impl StreamStats {
    /// Counts `e`. Saturating throughout: a corrupt or forged `Lost` count (recordings are
    /// untrusted input) must not panic a debug build.
    pub fn account(&mut self, e: &Event) {
        self.records = self.records.saturating_add(1);
        match e {
            Event::Sample(_) => self.samples = self.samples.saturating_add(1),
            Event::Lost { count, .. } => self.lost = self.lost.saturating_add(*count),
            Event::Throttle {
                throttled: true, ..
            } => self.throttles = self.throttles.saturating_add(1),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regs_mask_controls_visibility() {
        let mut r = UserRegs::default();
        assert_eq!(r.get(Reg::Cx), None);
        r.set(Reg::Cx, 0x1234);
        assert_eq!(r.get(Reg::Cx), Some(0x1234));
        assert_eq!(r.get(Reg::R15), None);
        r.set(Reg::R15, 7);
        assert_eq!(r.values[23], 7);
    }

    #[test]
    fn soft_mask_covers_gprs_ip_flags_only() {
        for r in [Reg::Ax, Reg::Sp, Reg::Ip, Reg::Flags, Reg::R8, Reg::R15] {
            assert_ne!(SOFT_REGS_MASK & (1 << r as u8), 0, "{r:?}");
        }
        for r in [Reg::Cs, Reg::Fs, Reg::Gs] {
            assert_eq!(SOFT_REGS_MASK & (1 << r as u8), 0, "{r:?}");
        }
    }

    #[test]
    fn backend_codes_round_trip() {
        for b in BackendKind::ALL {
            assert_eq!(BackendKind::from_code(b.code()), Some(b));
            assert_eq!(BackendKind::from_name(b.name()), Some(b));
        }
        assert_eq!(BackendKind::from_code(0), None);
    }

    #[test]
    fn stats_count_lost_and_throttle() {
        let mut s = StreamStats::default();
        s.account(&Event::Lost { count: 5, time: 0 });
        s.account(&Event::Throttle {
            time: 1,
            throttled: true,
        });
        s.account(&Event::Throttle {
            time: 2,
            throttled: false,
        });
        assert_eq!((s.lost, s.throttles, s.records), (5, 1, 3));
    }
}
