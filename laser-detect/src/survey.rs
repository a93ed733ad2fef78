//! Finding contention that timer samples miss: where to point the debug registers when no
//! sample has shown two threads on a line yet (issue 11, class 2).
//!
//! A store executed 80,000 times a second between long computations is a hot line, yet a
//! 500 Hz timer lands on that one instruction in some runs and not in others. The line model
//! needs *two* sampled accesses of different threads to the line, so discovery by samples
//! alone is luck. Watchpoints see every access to the bytes they cover, so a short survey
//! window on the right bytes finds such a line for certain; the question is which bytes.
//!
//! ```text
//!   source (priority order)                         words watched per turn (4 × 8 B)
//!   1. sampled lines two threads touch or one writes  the line in halves: [0,32) [32,64)
//!   2. the program's writable globals (ELF symbols)   the 8-byte slots objects cover, 4 a turn
//!   3. sampled lines one thread only reads            the line in halves
//! ```
//! Every target is a (line, ≤ 4 words) turn; the CLI's steering rotates through them inside
//! the watchpoint trap budget and starts over when all were surveyed. What a window sees goes
//! through the same stream as every other watch hit, so a line found here becomes an ordinary
//! contended line (estimate, report, fix) and a recording replays to the same result.
//!
//! Coverage, stated in every report that surveyed: the lines and bytes watched, and what they
//! were. Not covered: heap lines no sample touched, and bytes of large global arrays beyond
//! their first and last lines.

use hashbrown::HashMap;

use crate::candidates::WatchCandidate;

/// Lines whose sampled accesses are counted at most; beyond it the least sampled half goes.
const MAX_HOT_LINES: usize = 4096;
/// Global lines surveyed at most (the first and last line of big objects count once each).
const MAX_GLOBAL_LINES: usize = 512;
/// Objects up to this size are surveyed whole; larger ones at their edges only (the lines
/// they share with their neighbours).
const WHOLE_OBJECT_MAX: u64 = 256;
/// Sampled accesses a one-thread, read-only line needs before it is worth a survey turn.
const MIN_READ_SAMPLES: u32 = 3;

/// Sampled accesses to one line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HotLine {
    pub samples: u32,
    pub writes: u32,
    /// The first two threads seen (0 = none).
    pub tids: [u32; 2],
    /// Bytes sampled accesses touched (bit n = byte n of the line).
    pub bytes: u128,
}

impl HotLine {
    pub fn threads(&self) -> usize {
        self.tids.iter().filter(|&&t| t != 0).count()
    }
}

/// Sampled accesses per line, bounded.
#[derive(Clone, Debug, Default)]
pub struct HotLines {
    map: HashMap<u64, HotLine>,
}

impl HotLines {
    pub fn note(&mut self, line: u64, tid: u32, write: bool, bytes: u128) {
        if self.map.len() >= MAX_HOT_LINES && !self.map.contains_key(&line) {
            self.shrink();
        }
        let h = self.map.entry(line).or_default();
        h.samples = h.samples.saturating_add(1);
        h.writes = h.writes.saturating_add(u32::from(write));
        h.bytes |= bytes;
        if !h.tids.contains(&tid) {
            if let Some(slot) = h.tids.iter_mut().find(|t| **t == 0) {
                *slot = tid;
            }
        }
    }

    /// Drops the less sampled half (ties: all of them), so a long run keeps its hot lines.
    fn shrink(&mut self) {
        let mut counts: Vec<u32> = self.map.values().map(|h| h.samples).collect();
        let mid = counts.len() / 2;
        let (_, median, _) = counts.select_nth_unstable(mid);
        let median = *median;
        self.map.retain(|_, h| h.samples > median);
    }

    pub fn get(&self, line: u64) -> Option<&HotLine> {
        self.map.get(&line)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn clear(&mut self) {
        self.map.clear();
    }
}

/// Why a line is surveyed, in priority order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SurveySource {
    /// Samples saw two threads on it, or a write, but no contention event.
    SampledShared,
    /// A writable global of the program (ELF data symbol).
    Global,
    /// Samples saw one thread read it, repeatedly.
    SampledRead,
}

impl SurveySource {
    pub fn as_str(self) -> &'static str {
        match self {
            SurveySource::SampledShared => "sampled line",
            SurveySource::Global => "global",
            SurveySource::SampledRead => "sampled read-only line",
        }
    }
}

/// One survey turn: a line and the ≤ 4 words to watch on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SurveyTarget {
    pub source: SurveySource,
    pub watch: WatchCandidate,
}

impl SurveyTarget {
    /// Identity across calls (a line surveyed in several turns has one key per turn).
    pub fn key(&self) -> (u64, u64) {
        (
            self.watch.line_addr,
            self.watch.words.first().map_or(0, |w| w.0),
        )
    }
}

/// 8-byte slots of a line, as `(address, 8)` words.
fn slots(line: u64, line_size: u32) -> impl Iterator<Item = u64> {
    (0..u64::from(line_size / 8)).map(move |k| line + 8 * k)
}

/// Splits `words` into turns of at most 4 (the debug registers).
fn turns(line: u64, words: Vec<u64>, source: SurveySource, out: &mut Vec<SurveyTarget>) {
    for chunk in words.chunks(crate::candidates::MAX_WORDS) {
        out.push(SurveyTarget {
            source,
            watch: WatchCandidate {
                line_addr: line,
                words: chunk.iter().map(|&a| (a, 8)).collect(),
            },
        });
    }
}

/// A sampled line's turns: the half (quarter, with 128-byte lines) holding the sampled bytes
/// first, then the rest, each a turn of 4 slots.
fn line_turns(
    line: u64,
    h: &HotLine,
    line_size: u32,
    source: SurveySource,
    out: &mut Vec<SurveyTarget>,
) {
    let all: Vec<u64> = slots(line, line_size).collect();
    let mut chunks: Vec<&[u64]> = all.chunks(crate::candidates::MAX_WORDS).collect();
    let touched = |c: &&[u64]| c.iter().any(|&a| h.bytes & (0xffu128 << (a - line)) != 0);
    chunks.sort_by_key(|c| !touched(c)); // stable: sampled halves first, in address order
    for c in chunks {
        turns(line, c.to_vec(), source, out);
    }
}

/// The lines of the program's globals and, per line, the slots objects cover. Small objects
/// are covered whole; a large one only on its first and last line, where it meets its
/// neighbours.
fn global_lines(globals: &[(u64, u64)], line_size: u32) -> Vec<(u64, Vec<u64>)> {
    let ls = u64::from(line_size);
    let mut slots: Vec<u64> = Vec::new();
    for &(addr, size) in globals {
        if size == 0 {
            continue;
        }
        let end = addr.saturating_add(size);
        let mut add_range = |lo: u64, hi: u64| {
            let mut s = lo & !7;
            while s < hi {
                slots.push(s);
                s += 8;
            }
        };
        if size <= WHOLE_OBJECT_MAX {
            add_range(addr, end);
        } else {
            let first_end = ((addr & !(ls - 1)) + ls).min(end);
            add_range(addr, first_end);
            let last_start = ((end - 1) & !(ls - 1)).max(first_end);
            add_range(last_start, end);
        }
    }
    slots.sort_unstable();
    slots.dedup();
    let mut out: Vec<(u64, Vec<u64>)> = Vec::new();
    for s in slots {
        let line = s & !(ls - 1);
        match out.last_mut() {
            Some((l, v)) if *l == line => v.push(s),
            _ => {
                if out.len() == MAX_GLOBAL_LINES {
                    break;
                }
                out.push((line, vec![s]));
            }
        }
    }
    out
}

/// Every survey turn worth taking now, highest priority first. `skip(line)`: lines that need
/// no survey (already contended in the line model: they get ordinary watch turns).
pub fn plan(
    hot: &HotLines,
    globals: &[(u64, u64)],
    line_size: u32,
    skip: impl Fn(u64) -> bool,
) -> Vec<SurveyTarget> {
    let mut sampled: Vec<(&u64, &HotLine)> = hot.map.iter().filter(|(l, _)| !skip(**l)).collect();
    sampled.sort_by(|a, b| b.1.samples.cmp(&a.1.samples).then(a.0.cmp(b.0)));
    let mut out = Vec::new();
    for (&line, h) in &sampled {
        if h.threads() >= 2 || h.writes > 0 {
            line_turns(line, h, line_size, SurveySource::SampledShared, &mut out);
        }
    }
    for (line, words) in global_lines(globals, line_size) {
        let sampled_shared = hot
            .get(line)
            .is_some_and(|h| h.threads() >= 2 || h.writes > 0);
        if !skip(line) && !sampled_shared {
            turns(line, words, SurveySource::Global, &mut out);
        }
    }
    for (&line, h) in &sampled {
        if h.threads() < 2 && h.writes == 0 && h.samples >= MIN_READ_SAMPLES {
            line_turns(line, h, line_size, SurveySource::SampledRead, &mut out);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::line_model::byte_mask;

    fn words(t: &SurveyTarget) -> Vec<u64> {
        t.watch.words.iter().map(|w| w.0).collect()
    }

    #[test]
    fn shared_sampled_lines_first_then_globals_then_read_only_lines() {
        let mut hot = HotLines::default();
        // 0x1000: one thread reads it a lot; 0x2000: two threads read it; 0x3000: written once.
        for _ in 0..10 {
            hot.note(0x1000, 1, false, byte_mask(0, 4));
        }
        hot.note(0x2000, 1, false, byte_mask(40, 4));
        hot.note(0x2000, 2, false, byte_mask(0, 4));
        hot.note(0x3000, 1, true, byte_mask(8, 8));
        let globals = [(0x4010, 4), (0x4014, 4)];
        let p = plan(&hot, &globals, 64, |_| false);
        let order: Vec<(u64, SurveySource)> =
            p.iter().map(|t| (t.watch.line_addr, t.source)).collect();
        use SurveySource::*;
        assert_eq!(
            order,
            [
                (0x2000, SampledShared),
                (0x2000, SampledShared),
                (0x3000, SampledShared),
                (0x3000, SampledShared),
                (0x4000, Global),
                (0x1000, SampledRead),
                (0x1000, SampledRead),
            ]
        );
        // Two threads on 0x2000 touched both halves: address order; 0x3000's sampled half
        // [0,32) first. The two 4-byte globals share one slot.
        assert_eq!(words(&p[0]), [0x2000, 0x2008, 0x2010, 0x2018]);
        assert_eq!(words(&p[1]), [0x2020, 0x2028, 0x2030, 0x2038]);
        assert_eq!(words(&p[4]), [0x4010]);
    }

    #[test]
    fn the_sampled_half_of_a_line_comes_first() {
        let mut hot = HotLines::default();
        hot.note(0x1000, 1, true, byte_mask(48, 4));
        let p = plan(&hot, &[], 64, |_| false);
        assert_eq!(words(&p[0]), [0x1020, 0x1028, 0x1030, 0x1038]);
        assert_eq!(words(&p[1]), [0x1000, 0x1008, 0x1010, 0x1018]);
    }

    #[test]
    fn contended_lines_and_rare_reads_are_skipped() {
        let mut hot = HotLines::default();
        hot.note(0x1000, 1, true, 1);
        hot.note(0x2000, 1, false, 1); // one read: not worth a turn
        let p = plan(&hot, &[(0x1008, 8)], 64, |l| l == 0x1000);
        assert!(p.is_empty(), "{p:?}");
    }

    #[test]
    fn big_globals_are_surveyed_at_their_edges() {
        // A 4 KiB array at 0x10020 shares its first line with a counter at 0x10000 and its
        // last line (0x11000) with a flag at 0x11020.
        let g = [(0x10000, 8), (0x10020, 4096), (0x11020, 4)];
        let lines = global_lines(&g, 64);
        let l: Vec<u64> = lines.iter().map(|x| x.0).collect();
        assert_eq!(l, [0x10000, 0x11000]);
        assert_eq!(lines[0].1, [0x10000, 0x10020, 0x10028, 0x10030, 0x10038]);
        assert_eq!(lines[1].1, [0x11000, 0x11008, 0x11010, 0x11018, 0x11020]);
        // 5 slots on a line: two turns.
        let p = plan(&HotLines::default(), &g, 64, |_| false);
        assert_eq!(p.len(), 4);
        assert_eq!(words(&p[1]), [0x10038]);
    }

    #[test]
    fn hot_lines_stay_bounded_and_keep_the_hot_ones() {
        let mut hot = HotLines::default();
        for _ in 0..5 {
            hot.note(0x40, 7, false, 1);
        }
        for i in 0..(MAX_HOT_LINES as u64 * 3) {
            hot.note(0x1_0000 + 64 * i, 1, false, 1);
        }
        assert!(hot.len() <= MAX_HOT_LINES);
        assert_eq!(hot.get(0x40).map(|h| h.samples), Some(5));
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
