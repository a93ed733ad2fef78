//! Finding contention that timer samples miss: where to point the debug registers when no
//! sample has shown two threads on a line yet (issue 11, class 2).
//!
//! A store executed 80,000 times a second between long computations is a hot line, yet a
//! 250 Hz timer lands on that one instruction in some runs and not in others. The line model
//! needs *two* sampled accesses of different threads to the line, so discovery by samples
//! alone is luck. Watchpoints see every access to the bytes they cover, so a short survey
//! window on the right bytes finds such a line for certain; the question is which bytes.
//!
//! ```text
//!   source (priority order)                         words watched per turn (4 × 8 B)
//!   1. sampled lines two threads touch, one writing   the line in halves: [0,32) [32,64)
//!   2. the program's writable globals (ELF symbols)   the 8-byte slots objects cover, 4 a turn
//!   3. heap blocks a global points to (one level)     the same, for the block
//!   4. lines samples saw read, never written, most    the line in halves (top 16 lines)
//!      sampled first
//! ```
//! Lines of tier 4 are where one thread works hard on data it only reads (its own header,
//! every iteration): the other thread's rare store there is what a survey can catch, and the
//! more a line is sampled the likelier it is worth a turn. A line samples saw one thread
//! write is not surveyed: a store-only window there traps on that thread's every store (its
//! own buffer, most likely) and buys nothing with the trap budget (measured: phx_string_match
//! 1.19x under laser with such windows, 1.02x without).
//! Source 3 is what C programs share most: `counts = malloc(n * sizeof *counts)` at start-up,
//! one slot per thread, reached through a global pointer. The pointer is read from the live
//! target (a word of a writable global that points into a heap mapping); the block's size from
//! its malloc chunk header when that reads sane, else one line.
//! Every target is a (line, ≤ 4 words) turn; [`plan`] lists them with the tiers interleaved
//! (one of each in turn), so a program with many globals still gets its sampled lines
//! surveyed early. The CLI's steering rotates through them inside the watchpoint trap budget,
//! again and again: contention that comes in phases is caught in some window. What a window sees goes
//! through the same stream as every other watch hit, so a line found here becomes an ordinary
//! contended line (estimate, report, fix) and a recording replays to the same result.
//!
//! Coverage, stated in every report that surveyed: the lines and bytes watched, and what they
//! were. Not covered: heap lines no sample touched, and bytes of large global arrays beyond
//! their first and last lines.

use crate::model::candidates::WatchCandidate;
use crate::naming::heap_blocks::Memory;

/// Slots of the sampled-lines table (a power of two).
const MAX_HOT_LINES: usize = 4096;
/// Global lines surveyed at most (the first and last line of big objects count once each).
const MAX_GLOBAL_LINES: usize = 512;
/// Objects up to this size are surveyed whole; larger ones at their edges only (the lines
/// they share with their neighbours).
const WHOLE_OBJECT_MAX: u64 = 256;
/// Sampled accesses a tier-4 line needs before it is worth a survey turn.
const MIN_HOT_SAMPLES: u32 = 3;
/// Tier-4 lines surveyed at most (the most sampled).
const MAX_HOT_SURVEYED: usize = 16;

/// Sampled accesses to one line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HotLine {
    pub samples: u32,
    pub writes: u32,
    /// The first two threads seen (0 = none).
    pub tids: [u32; 2],
    /// Bytes sampled accesses touched (bit n = byte n of the line).
    pub bytes: u128,
    /// Bytes each of `tids` was sampled touching.
    pub tid_bytes: [u128; 2],
}

impl HotLine {
    pub fn threads(&self) -> usize {
        self.tids.iter().filter(|&&t| t != 0).count()
    }
}

/// Sampled accesses per line, in a fixed table of [`MAX_HOT_LINES`] slots indexed by a hash
/// of the line: a line whose slot holds another gets in only once the incumbent's count has
/// been worn down to 0 by such collisions (one per colliding sample), so lines sampled often
/// stay and one-off lines pass through. O(1) per access with no allocation: this runs on
/// every sampled access (the detector's replay goal is ≥ 10 M samples/s; a hash map that
/// halved itself when full took it to 8 M/s with a million distinct lines).
#[derive(Clone, Debug, Default)]
pub struct HotLines {
    /// Empty until the first sample: 200 KB written before the target starts would delay
    /// every `laser run` by ≈ 0.2 ms.
    slots: Vec<(u64, HotLine)>,
}

/// A line address no access has (lines are aligned): marks an empty slot.
const EMPTY: u64 = u64::MAX;

impl HotLines {
    fn slot(line: u64) -> usize {
        // Fibonacci hashing of the line number; MAX_HOT_LINES is a power of two.
        let bits = MAX_HOT_LINES.trailing_zeros();
        ((line >> 6).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - bits)) as usize
    }

    pub fn note(&mut self, line: u64, tid: u32, write: bool, bytes: u128) {
        if self.slots.is_empty() {
            self.slots = vec![(EMPTY, HotLine::default()); MAX_HOT_LINES];
        }
        let (owner, h) = &mut self.slots[Self::slot(line)];
        if *owner != line {
            if *owner != EMPTY && h.samples > 0 {
                h.samples -= 1;
                return;
            }
            *owner = line;
            *h = HotLine::default();
        }
        h.samples = h.samples.saturating_add(1);
        h.writes = h.writes.saturating_add(u32::from(write));
        h.bytes |= bytes;
        if !h.tids.contains(&tid) {
            if let Some(slot) = h.tids.iter_mut().find(|t| **t == 0) {
                *slot = tid;
            }
        }
        if let Some(i) = h.tids.iter().position(|&t| t == tid) {
            h.tid_bytes[i] |= bytes;
        }
    }

    pub fn get(&self, line: u64) -> Option<&HotLine> {
        let (owner, h) = self.slots.get(Self::slot(line))?;
        (*owner == line).then_some(h)
    }

    /// Lines held, with their counts.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &HotLine)> + '_ {
        self.slots
            .iter()
            .filter(|(l, _)| *l != EMPTY)
            .map(|(l, h)| (*l, h))
    }

    pub fn len(&self) -> usize {
        self.iter().count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why a line is surveyed, in priority order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SurveySource {
    /// Samples saw two threads on it, one of them writing, but no contention event.
    SampledShared,
    /// A writable global of the program (ELF data symbol).
    Global,
    /// A word that code samples landed in updates atomically at a fixed address, in the
    /// program or a library (a lock word, a shared counter).
    Atomic,
    /// A heap block a global of the program points to.
    PointedHeap,
    /// Samples saw it read often, and never written.
    SampledHot,
}

impl SurveySource {
    /// Every source, in priority order.
    pub const ALL: [SurveySource; 5] = [
        SurveySource::SampledShared,
        SurveySource::Global,
        SurveySource::Atomic,
        SurveySource::PointedHeap,
        SurveySource::SampledHot,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SurveySource::SampledShared => "sampled line",
            SurveySource::Global => "global",
            SurveySource::Atomic => "word sampled code updates atomically",
            SurveySource::PointedHeap => "heap block a global points to",
            SurveySource::SampledHot => "hot sampled line",
        }
    }
}

/// One survey turn: a line and the ≤ 4 words to watch on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SurveyTarget {
    pub source: SurveySource,
    pub watch: WatchCandidate,
    /// Watch loads too ([`pair_turn`]); survey windows watch stores only otherwise.
    pub reads: bool,
}

impl SurveyTarget {
    /// Identity across calls (a line surveyed in several turns has one key per turn).
    pub fn key(&self) -> (u64, u64) {
        self.watch.key()
    }
}

/// 8-byte slots of a line, as `(address, 8)` words.
fn slots(line: u64, line_size: u32) -> impl Iterator<Item = u64> {
    (0..u64::from(line_size / 8)).map(move |k| line + 8 * k)
}

/// Turns of at most 4 slots (the debug registers), in the order given; slots of one turn may
/// lie on different lines (each line is its own window in the stream), and the turn is keyed
/// by its first slot's line.
fn turns(slots: &[u64], line_size: u32, source: SurveySource, out: &mut Vec<SurveyTarget>) {
    let mask = !(u64::from(line_size) - 1);
    for chunk in slots.chunks(crate::model::candidates::MAX_WORDS) {
        out.push(SurveyTarget {
            source,
            watch: WatchCandidate {
                line_addr: chunk[0] & mask,
                words: chunk.iter().map(|&a| (a, 8)).collect(),
            },
            reads: false,
        });
    }
}

/// A sampled line's turns, 4 slots each: the half (quarter, with 128-byte lines) holding the
/// sampled bytes go to `first`, the rest to `rest`. A tier lists every line's `first` turns
/// before any line's `rest`: which of two lines read equally hot is the shared one is a coin
/// toss of the samples, and the other line's unsampled half must not come between (Phoenix
/// histogram -O0: each thread reads its own argument line on every pixel, and one of the two
/// also holds the other thread's counters; a survey that took both halves of the wrong line
/// first reached the right one 400 ms later, at the end of the run).
fn line_turns(
    line: u64,
    h: &HotLine,
    line_size: u32,
    source: SurveySource,
    first: &mut Vec<SurveyTarget>,
    rest: &mut Vec<SurveyTarget>,
) {
    let all: Vec<u64> = slots(line, line_size).collect();
    let touched = |c: &[u64]| c.iter().any(|&a| h.bytes & (0xffu128 << (a - line)) != 0);
    let (sampled, other): (Vec<&[u64]>, Vec<&[u64]>) = all
        .chunks(crate::model::candidates::MAX_WORDS)
        .partition(|c| touched(c));
    let mut halves = Vec::new();
    turns(&sampled.concat(), line_size, source, &mut halves);
    first.extend(pair_turn(line, h, line_size, source, &halves));
    first.append(&mut halves);
    turns(&other.concat(), line_size, source, rest);
}

/// Slots (bit k = the 8-byte slot k of the line) that `bytes` touch.
fn slot_bits(bytes: u128, line_size: u32) -> u64 {
    (0..line_size / 8)
        .filter(|k| bytes & (0xffu128 << (8 * k)) != 0)
        .fold(0, |b, k| b | 1 << k)
}

/// A read+write turn over what each of two threads was sampled on, when samples showed them
/// on different 8-byte slots of the line and on none in common: the mark of false sharing
/// whose stores no sample caught (an `x++` sampled at its load, a store between long
/// computations). A store-only window there sees the storing thread alone, and only a
/// read+write window around its stores afterwards (a probe, one cooldown later) sees the
/// other thread's loads: Phoenix histogram -O0 on a 0.4 s run (thread 0's counters, thread
/// 1's header read every pixel) had its store-only survey window filled by thread 0 alone at
/// ~50 ms, and the probe's window opened ~150 ms later, after thread 1 had ended, in 6 runs
/// of 15. Up to two slots of each thread, those nearest the other thread's, in turn. `None`
/// otherwise, or when its key would be one of the line's store-only turns' (`halves`).
fn pair_turn(
    line: u64,
    h: &HotLine,
    line_size: u32,
    source: SurveySource,
    halves: &[SurveyTarget],
) -> Option<SurveyTarget> {
    if h.threads() < 2 {
        return None;
    }
    let [a, b] = h.tid_bytes.map(|t| slot_bits(t, line_size));
    if a == 0 || b == 0 || a & b != 0 {
        return None;
    }
    // A thread's slots, nearest the other thread's first.
    let nearest = |mine: u64, other: u64| -> Vec<u64> {
        let dist = |k: u32| {
            (0..64)
                .filter(|j| other & (1 << j) != 0)
                .map(|j: u32| k.abs_diff(j))
                .min()
                .unwrap_or(u32::MAX)
        };
        let mut ks: Vec<u32> = (0..64).filter(|k| mine & (1 << k) != 0).collect();
        ks.sort_by_key(|&k| (dist(k), k));
        ks.into_iter()
            .take(2)
            .map(|k| line + 8 * u64::from(k))
            .collect()
    };
    let (na, nb) = (nearest(a, b), nearest(b, a));
    let mut words: Vec<u64> = Vec::new();
    for i in 0..2 {
        words.extend(na.get(i));
        words.extend(nb.get(i));
    }
    // A key of its own (the line and its first word): the survey's clocks are per key.
    let taken: Vec<u64> = halves
        .iter()
        .filter_map(|t| t.watch.words.first().map(|w| w.0))
        .collect();
    let first = words.iter().position(|w| !taken.contains(w))?;
    words.rotate_left(first);
    Some(SurveyTarget {
        source,
        watch: WatchCandidate {
            line_addr: line,
            words: words.into_iter().map(|a| (a, 8)).collect(),
        },
        reads: true,
    })
}

/// The 8-byte slots of `objects` worth a survey, best first, with the line each lies on:
/// slots of scalars (≤ 8 bytes: flags, counters, pointers) first, then of small objects, then
/// of large objects' first and last lines (where they meet their neighbours; a large object's
/// inside is the heap's problem, not a survey's), each group in address order.
fn object_slots(objects: &[(u64, u64)], line_size: u32) -> Vec<u64> {
    let ls = u64::from(line_size);
    let mut ranked: Vec<(u8, u64)> = Vec::new();
    for &(addr, size) in objects {
        if size == 0 {
            continue;
        }
        let end = addr.saturating_add(size);
        let mut add_range = |rank: u8, lo: u64, hi: u64| {
            let mut s = lo & !7;
            while s < hi {
                ranked.push((rank, s));
                s += 8;
            }
        };
        if size <= 8 {
            add_range(0, addr, end);
        } else if size <= WHOLE_OBJECT_MAX {
            add_range(1, addr, end);
        } else {
            let first_end = ((addr & !(ls - 1)) + ls).min(end);
            add_range(2, addr, first_end);
            let last_start = ((end - 1) & !(ls - 1)).max(first_end);
            add_range(2, last_start, end);
        }
    }
    // Each slot once, at its best rank.
    ranked.sort_unstable_by_key(|&(rank, s)| (s, rank));
    ranked.dedup_by_key(|r| r.1);
    ranked.sort_unstable();
    let mut lines: Vec<u64> = Vec::new();
    ranked
        .into_iter()
        .map(|(_, s)| s)
        .filter(|s| {
            let line = s & !(ls - 1);
            if lines.contains(&line) {
                return true;
            }
            if lines.len() == MAX_GLOBAL_LINES {
                return false;
            }
            lines.push(line);
            true
        })
        .collect()
}

/// Words of writable globals read for pointers at most, per look.
const MAX_POINTER_WORDS: usize = 1024;
/// Blocks larger than this are not believed (a chunk header misread); one line is surveyed.
const MAX_BLOCK: u64 = 1 << 20;

/// Heap blocks `(address, size)` the program's globals point to: every 8-byte aligned word of
/// a global of at most [`WHOLE_OBJECT_MAX`] bytes whose value `is_heap`, read through `mem`.
/// The size comes from the glibc chunk header before the block (size field, low 3 bits are
/// flags; usable = chunk − 8) when it reads between 16 bytes and 1 MiB, else 8.
pub fn pointed_blocks(
    globals: &[(u64, u64)],
    mem: &mut dyn Memory,
    is_heap: impl Fn(u64) -> bool,
) -> Vec<(u64, u64)> {
    let words = globals
        .iter()
        .filter(|g| g.1 >= 8 && g.1 <= WHOLE_OBJECT_MAX)
        .flat_map(|&(a, n)| {
            (a.next_multiple_of(8)..a + n)
                .step_by(8)
                .filter(move |w| w + 8 <= a + n)
        })
        .take(MAX_POINTER_WORDS);
    let mut out = Vec::new();
    let mut buf = [0u8; 8];
    for w in words {
        if mem.read(w, &mut buf) != 8 {
            continue;
        }
        let p = u64::from_le_bytes(buf);
        if p == 0 || !p.is_multiple_of(8) || !is_heap(p) {
            continue;
        }
        let size = if mem.read(p - 8, &mut buf) == 8 {
            let chunk = u64::from_le_bytes(buf) & !7;
            if (24..=MAX_BLOCK).contains(&chunk) {
                chunk - 8
            } else {
                8
            }
        } else {
            8
        };
        out.push((p, size));
    }
    out.sort_unstable();
    out.dedup_by_key(|b| b.0);
    out
}

/// Every survey turn worth taking now, highest priority first. `skip(line)`: lines that need
/// no survey (already contended in the line model: they get ordinary watch turns). `pointed`:
/// heap blocks the globals point to ([`pointed_blocks`]).
pub fn plan(
    hot: &HotLines,
    globals: &[(u64, u64)],
    atomics: &[(u64, u64)],
    pointed: &[(u64, u64)],
    line_size: u32,
    skip: impl Fn(u64) -> bool,
) -> Vec<SurveyTarget> {
    let mut sampled: Vec<(u64, &HotLine)> = hot.iter().filter(|(l, _)| !skip(*l)).collect();
    sampled.sort_by(|a, b| b.1.samples.cmp(&a.1.samples).then(a.0.cmp(&b.0)));
    let (mut tier1, mut tier1_rest) = (Vec::new(), Vec::new());
    let shared = |h: &HotLine| h.threads() >= 2 && h.writes > 0;
    for &(line, h) in &sampled {
        if shared(h) {
            let source = SurveySource::SampledShared;
            line_turns(line, h, line_size, source, &mut tier1, &mut tier1_rest);
        }
    }
    tier1.append(&mut tier1_rest);
    let sampled_shared = |line: u64| hot.get(line).is_some_and(shared);
    let ls = u64::from(line_size);
    let keep = |s: &u64| !skip(s & !(ls - 1)) && !sampled_shared(s & !(ls - 1));
    // The program's globals keep their own turns even on a line tier 1 lists: there they
    // queue behind every busier sampled line (a program's heap arrays), and a global flag
    // on a line two threads were sampled on is the class this survey is for (Phoenix kmeans:
    // `modified` behind three heap lines, never surveyed in a run of 1.3 s).
    let global_slots: Vec<u64> = object_slots(globals, line_size)
        .into_iter()
        .filter(|s| !skip(s & !(ls - 1)))
        .collect();
    // Like the globals, atomically updated words keep their turns on lines tier 1 lists: a
    // lock word's line is sampled by both threads whenever the lock is (glibc's `rand()`).
    let atomic_slots: Vec<u64> = object_slots(atomics, line_size)
        .into_iter()
        .filter(|s| !skip(s & !(ls - 1)) && !global_slots.contains(s))
        .collect();
    let pointed_slots: Vec<u64> = object_slots(pointed, line_size)
        .into_iter()
        .filter(|s| keep(s) && !global_slots.contains(s) && !atomic_slots.contains(s))
        .collect();
    let covered = |line: u64| {
        global_slots
            .iter()
            .chain(&atomic_slots)
            .chain(&pointed_slots)
            .any(|s| s & !(ls - 1) == line)
    };
    let mut tier2 = Vec::new();
    turns(&global_slots, line_size, SurveySource::Global, &mut tier2);
    let mut tier2b = Vec::new();
    turns(&atomic_slots, line_size, SurveySource::Atomic, &mut tier2b);
    let mut tier3 = Vec::new();
    turns(
        &pointed_slots,
        line_size,
        SurveySource::PointedHeap,
        &mut tier3,
    );
    let hot_lines = sampled
        .iter()
        .filter(|(l, h)| h.writes == 0 && h.samples >= MIN_HOT_SAMPLES && !covered(*l))
        .take(MAX_HOT_SURVEYED);
    let (mut tier4, mut tier4_rest) = (Vec::new(), Vec::new());
    for &(line, h) in hot_lines {
        let source = SurveySource::SampledHot;
        line_turns(line, h, line_size, source, &mut tier4, &mut tier4_rest);
    }
    tier4.append(&mut tier4_rest);
    interleave([tier1, tier2, tier2b, tier3, tier4])
}

/// One target of each tier in turn, in tier order, until all are taken.
fn interleave(tiers: [Vec<SurveyTarget>; 5]) -> Vec<SurveyTarget> {
    let n = tiers.iter().map(Vec::len).sum();
    let mut its = tiers.map(Vec::into_iter);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        for it in &mut its {
            out.extend(it.next());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::line_model::byte_mask;

    fn words(t: &SurveyTarget) -> Vec<u64> {
        t.watch.words.iter().map(|w| w.0).collect()
    }

    #[test]
    fn shared_sampled_lines_first_then_globals_then_read_only_lines() {
        let mut hot = HotLines::default();
        // 0x1000: one thread reads it a lot; 0x2000: two threads, one writes; 0x3000: two
        // threads write it; 0x5000: two threads read it (3 samples).
        for _ in 0..10 {
            hot.note(0x1000, 1, false, byte_mask(0, 4));
        }
        hot.note(0x2000, 1, false, byte_mask(40, 4));
        hot.note(0x2000, 2, true, byte_mask(0, 4));
        hot.note(0x3000, 1, true, byte_mask(8, 8));
        hot.note(0x3000, 2, true, byte_mask(8, 8));
        for t in [1, 2, 1] {
            hot.note(0x5000, t, false, byte_mask(0, 8));
        }
        let globals = [(0x4010, 4), (0x4014, 4)];
        let p = plan(&hot, &globals, &[], &[], 64, |_| false);
        let order: Vec<(u64, SurveySource)> =
            p.iter().map(|t| (t.watch.line_addr, t.source)).collect();
        use SurveySource::*;
        assert_eq!(
            order,
            [
                (0x2000, SampledShared),
                (0x4000, Global),
                (0x1000, SampledHot),
                (0x2000, SampledShared),
                (0x5000, SampledHot),
                (0x2000, SampledShared),
                (0x1000, SampledHot),
                (0x3000, SampledShared),
                (0x5000, SampledHot),
                (0x3000, SampledShared),
            ]
        );
        // Two threads on 0x2000 apart (slots 5 and 0): a read+write turn on both first; then
        // the halves they touched, in address order, stores only. On 0x3000 and 0x5000 the
        // threads share a slot: no such turn. The two 4-byte globals share one slot.
        assert_eq!(words(&p[0]), [0x2028, 0x2000]);
        assert!(p[0].reads);
        assert_eq!(words(&p[3]), [0x2000, 0x2008, 0x2010, 0x2018]);
        assert_eq!(words(&p[5]), [0x2020, 0x2028, 0x2030, 0x2038]);
        assert!(p.iter().filter(|t| t.reads).count() == 1);
        assert_eq!(words(&p[1]), [0x4010]);
    }

    /// Two threads sampled on different slots of a line (one reads its header, the other
    /// increments counters: nothing sampled in common): a read+write turn on up to two slots
    /// of each, nearest the other's, keyed apart from the line's store-only turns. Not for
    /// one thread, nor for two on a common slot.
    #[test]
    fn two_threads_sampled_apart_on_a_line_get_a_read_write_turn() {
        let mut hot = HotLines::default();
        // Thread 1: slots 0, 1, 2, 4 (bytes 4, 12, 16, 36); thread 2: slots 6 and 7.
        for b in [4, 12, 16, 36] {
            hot.note(0x1000, 1, false, byte_mask(b, 4));
        }
        hot.note(0x1000, 2, false, byte_mask(48, 8));
        hot.note(0x1000, 2, false, byte_mask(56, 8));
        let p = plan(&hot, &[], &[], &[], 64, |_| false);
        let pair: Vec<&SurveyTarget> = p.iter().filter(|t| t.reads).collect();
        assert_eq!(pair.len(), 1);
        // Thread 1's slots 4 and 2, thread 2's 6 and 7, in turn, from the first word that
        // starts no half (slot 4 starts the second).
        assert_eq!(words(pair[0]), [0x1030, 0x1010, 0x1038, 0x1020]);
        assert_eq!(pair[0].source, SurveySource::SampledHot);
        assert!(p
            .iter()
            .filter(|t| !t.reads)
            .all(|t| t.key() != pair[0].key()));
        assert!(p[0].reads, "before the line's store-only turns");
        // The pair's first word would be a half's first (slot 0, slot 4): rotated.
        let mut hot = HotLines::default();
        for _ in 0..3 {
            hot.note(0x2000, 1, false, byte_mask(0, 8));
        }
        hot.note(0x2000, 2, false, byte_mask(32, 8));
        let p = plan(&hot, &[], &[], &[], 64, |_| false);
        let pair: Vec<&SurveyTarget> = p.iter().filter(|t| t.reads).collect();
        assert!(
            pair.is_empty(),
            "both slots start a half: no key of its own"
        );
        // One thread, or two on one slot: store-only turns alone.
        let mut hot = HotLines::default();
        for t in [1, 1, 1, 2] {
            hot.note(0x3000, t, false, byte_mask(8, 8));
        }
        for _ in 0..3 {
            hot.note(0x4000, 1, false, byte_mask(8, 8));
        }
        let p = plan(&hot, &[], &[], &[], 64, |_| false);
        assert!(p.iter().all(|t| !t.reads));
    }

    #[test]
    fn a_global_on_a_sampled_shared_line_keeps_its_own_turn() {
        let mut hot = HotLines::default();
        // Three busy heap lines two threads were sampled on, and the globals' line with one
        // sampled store of each thread.
        for line in [0x9000, 0xa000, 0xb000] {
            for t in [1, 2, 1, 2] {
                hot.note(line, t, true, byte_mask(0, 8));
            }
        }
        hot.note(0x4000, 1, true, byte_mask(12, 4));
        hot.note(0x4000, 2, true, byte_mask(12, 4));
        let globals = [(0x400c, 4), (0x4018, 4)];
        let p = plan(&hot, &globals, &[], &[], 64, |_| false);
        let second = p.iter().position(|t| t.source == SurveySource::Global);
        assert_eq!(
            second,
            Some(1),
            "{:?}",
            p.iter().map(|t| t.source).collect::<Vec<_>>()
        );
        assert_eq!(words(&p[1]), [0x4008, 0x4018]);
    }

    #[test]
    fn the_sampled_half_of_a_line_comes_first() {
        let mut hot = HotLines::default();
        for _ in 0..3 {
            hot.note(0x1000, 1, false, byte_mask(48, 4));
        }
        let p = plan(&hot, &[], &[], &[], 64, |_| false);
        assert_eq!(words(&p[0]), [0x1020, 0x1028, 0x1030, 0x1038]);
        assert_eq!(words(&p[1]), [0x1000, 0x1008, 0x1010, 0x1018]);
    }

    /// Two lines read hot, each in one half: both sampled halves are surveyed before either
    /// line's other half, whichever line the samples favoured.
    #[test]
    fn every_lines_sampled_half_before_any_lines_other_half() {
        let mut hot = HotLines::default();
        for _ in 0..5 {
            hot.note(0x1000, 1, false, byte_mask(8, 8));
        }
        for _ in 0..4 {
            hot.note(0x2000, 2, false, byte_mask(40, 8));
        }
        let p = plan(&hot, &[], &[], &[], 64, |_| false);
        let w: Vec<u64> = p.iter().map(|t| t.watch.words[0].0).collect();
        assert_eq!(w, [0x1000, 0x2020, 0x1020, 0x2000]);
    }

    #[test]
    fn contended_lines_rare_reads_and_one_writers_lines_are_skipped() {
        let mut hot = HotLines::default();
        hot.note(0x1000, 1, true, 1);
        hot.note(0x1000, 2, true, 1);
        hot.note(0x2000, 1, false, 1); // one read: not worth a turn
        for _ in 0..10 {
            hot.note(0x3000, 1, true, 1); // one thread's own stores: not either
        }
        let p = plan(&hot, &[(0x1008, 8)], &[], &[], 64, |l| l == 0x1000);
        assert!(p.is_empty(), "{p:?}");
    }

    #[test]
    fn scalars_first_then_small_objects_then_the_edges_of_big_ones() {
        // A 4 KiB array at 0x10020 shares its first line with a counter at 0x10000 and its
        // last line (0x11000) with a flag at 0x11020; a 16-byte struct at 0x12000.
        let g = [(0x10000, 8), (0x10020, 4096), (0x11020, 4), (0x12000, 16)];
        let slots = object_slots(&g, 64);
        assert_eq!(
            slots,
            [
                0x10000, 0x11020, // scalars
                0x12000, 0x12008, // the small struct
                0x10020, 0x10028, 0x10030, 0x10038, 0x11000, 0x11008, 0x11010, 0x11018,
            ]
        );
        // 4 slots a turn, whatever lines they are on.
        let p = plan(&HotLines::default(), &g, &[], &[], 64, |_| false);
        assert_eq!(p.len(), 3);
        assert_eq!(words(&p[0]), [0x10000, 0x11020, 0x12000, 0x12008]);
        assert!(p.iter().all(|t| t.source == SurveySource::Global));
    }

    #[test]
    fn hot_lines_stay_bounded_and_keep_the_hot_ones() {
        let mut hot = HotLines::default();
        for _ in 0..50 {
            hot.note(0x40, 7, false, 1);
        }
        for i in 0..(MAX_HOT_LINES as u64 * 3) {
            hot.note(0x1_0000 + 64 * i, 1, false, 1);
        }
        assert!(hot.len() <= MAX_HOT_LINES);
        // Worn down by the few one-off lines that share its slot, but still held.
        let h = hot.get(0x40).map(|h| h.samples).unwrap();
        assert!((40..=50).contains(&h), "{h}");
        // A line sampled once loses its slot to a colliding line sampled twice.
        let mut t = HotLines::default();
        let a = 0x1000;
        let b = (1..)
            .map(|k| a + 64 * k)
            .find(|&l| HotLines::slot(l) == HotLines::slot(a))
            .unwrap();
        t.note(a, 1, false, 1);
        t.note(b, 1, false, 1);
        t.note(b, 1, false, 1);
        assert!(t.get(a).is_none());
        assert_eq!(t.get(b).map(|h| h.samples), Some(1));
    }

    /// A global `int *use_len` pointing at an 8-byte malloc block (chunk size 0x21), a global
    /// pointing into the module itself (not heap), a null pointer and a misaligned value.
    #[test]
    fn heap_blocks_pointed_to_by_globals_are_surveyed() {
        use crate::naming::heap_blocks::Image;
        let data_base = 0x4000u64;
        let heap_base = 0x9000u64;
        let mut data = vec![0u8; 64];
        data[0..8].copy_from_slice(&(heap_base + 0x10).to_le_bytes()); // use_len
        data[8..16].copy_from_slice(&(data_base + 0x20).to_le_bytes()); // &other global
        data[24..32].copy_from_slice(&(heap_base + 0x13).to_le_bytes()); // misaligned
        let mut heap = vec![0u8; 256];
        heap[8..16].copy_from_slice(&0x21u64.to_le_bytes()); // chunk header: 32 | PREV_INUSE
        let mut both = vec![0u8; (heap_base - data_base) as usize + heap.len()];
        both[..64].copy_from_slice(&data);
        both[(heap_base - data_base) as usize..].copy_from_slice(&heap);
        let mut mem = Image {
            base: data_base,
            bytes: &both,
        };
        let globals = [(0x4000, 8), (0x4008, 8), (0x4010, 8), (0x4018, 8)];
        let is_heap = |a: u64| (heap_base..heap_base + 0x1000).contains(&a);
        let blocks = pointed_blocks(&globals, &mut mem, is_heap);
        assert_eq!(blocks, [(heap_base + 0x10, 24)]);
        let p = plan(&HotLines::default(), &[], &[], &blocks, 64, |_| false);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].source, SurveySource::PointedHeap);
        assert_eq!(words(&p[0]), [0x9010, 0x9018, 0x9020]);
    }

    #[test]
    fn threads_are_counted_up_to_two() {
        let mut hot = HotLines::default();
        for t in [3, 3, 4, 5] {
            hot.note(0, t, false, 1);
        }
        let h = hot.get(0).unwrap();
        assert_eq!(h.threads(), 2);
        assert_eq!(h.tids, [3, 4]);
        assert_eq!(h.samples, 4);
    }
}
