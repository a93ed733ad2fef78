//! Where to arm watchpoints: the top contended lines and, per line, up to 4 naturally aligned
//! words (x86 debug registers watch 1, 2, 4 or 8 aligned bytes; 4 per thread) that different
//! threads touched.
//!
//! ```text
//!   line:   |w0 . . . . . . .|w1 . . . . . . .|w2 …        8-byte aligned slots
//!   T1:      ████                                          → (line+0, 4)
//!   T2:                       ████████                     → (line+8, 8)
//! ```
//! Each slot is shrunk to the smallest aligned word covering the bytes touched in it. Slots are
//! picked so that every thread seen gets one before any thread gets two, busiest first.

use crate::model::line_model::LineStat;

/// Watchpoint targets for one contended line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchCandidate {
    pub line_addr: u64,
    /// (address, length) pairs, length 1, 2, 4 or 8, address aligned to length.
    pub words: Vec<(u64, u32)>,
}

impl WatchCandidate {
    /// Identity of a set of words on a line across calls: the line and its first word (a
    /// line watched in several turns has one key per turn).
    pub fn key(&self) -> (u64, u64) {
        (self.line_addr, self.words.first().map_or(0, |w| w.0))
    }
}

/// Maximum watchpoints per line (x86 has 4 debug address registers).
pub const MAX_WORDS: usize = 4;

/// Smallest naturally aligned word inside the 8-byte slot at `slot` covering `bits` (the slot's
/// 8 byte bits, nonzero): returns (offset within the slot, length).
fn shrink(bits: u8) -> (u32, u32) {
    debug_assert!(bits != 0);
    let lo = bits.trailing_zeros();
    let hi = 8 - bits.leading_zeros(); // one past the last byte
    for len in [1u32, 2, 4, 8] {
        let start = lo / len * len;
        if hi <= start + len {
            return (start, len);
        }
    }
    (0, 8)
}

struct Slot {
    off: u32,
    bits: u8,
    threads: Vec<u32>,
    events: u64,
}

fn slots(l: &LineStat) -> Vec<Slot> {
    let n = l.threads.iter().map(|t| t.1).fold(0u128, |a, b| a | b);
    let mut out = Vec::new();
    for k in 0..16u32 {
        let bits = (n >> (8 * k)) as u8;
        if bits == 0 {
            continue;
        }
        let slot_mask = 0xffu128 << (8 * k);
        let threads = l
            .threads
            .iter()
            .filter(|t| t.1 & slot_mask != 0)
            .map(|t| t.0)
            .collect();
        let events = l
            .sources
            .iter()
            .filter(|s| s.offsets & slot_mask != 0)
            .map(|s| s.events)
            .sum();
        out.push(Slot {
            off: 8 * k,
            bits,
            threads,
            events,
        });
    }
    out
}

pub fn candidates<'a>(
    lines: impl IntoIterator<Item = &'a LineStat>,
    max_lines: usize,
) -> Vec<WatchCandidate> {
    let mut order: Vec<&LineStat> = lines.into_iter().collect();
    order.sort_by(|a, b| b.events.cmp(&a.events).then(a.line_addr.cmp(&b.line_addr)));
    order
        .into_iter()
        .take(max_lines)
        .map(|l| {
            let mut s = slots(l);
            s.sort_by(|a, b| {
                b.threads
                    .len()
                    .cmp(&a.threads.len())
                    .then(b.events.cmp(&a.events))
                    .then(a.off.cmp(&b.off))
            });
            let mut covered: Vec<u32> = Vec::new();
            let mut picked: Vec<usize> = Vec::new();
            // First pass: slots adding a thread not yet covered; second: the rest.
            for pass in 0..2 {
                for (i, slot) in s.iter().enumerate() {
                    if picked.len() == MAX_WORDS || picked.contains(&i) {
                        continue;
                    }
                    let new = slot.threads.iter().any(|t| !covered.contains(t));
                    if pass == 1 || new {
                        picked.push(i);
                        covered.extend(slot.threads.iter().copied());
                    }
                }
            }
            picked.sort_by_key(|&i| s[i].off);
            let words = picked
                .into_iter()
                .map(|i| {
                    let (o, len) = shrink(s[i].bits);
                    (l.line_addr + (s[i].off + o) as u64, len)
                })
                .collect();
            WatchCandidate {
                line_addr: l.line_addr,
                words,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::findings::Op;
    use crate::model::line_model::{byte_mask, SourceStat};

    fn line(addr: u64, events: u64, threads: &[(u32, u128)]) -> LineStat {
        LineStat {
            line_addr: addr,
            events,
            true_events: 0,
            false_events: events,
            exchange_events: 0,
            recent: Default::default(),
            sources: threads
                .iter()
                .map(|&(t, b)| SourceStat {
                    pc: t as u64,
                    op: Op::Store,
                    offsets: b,
                    events: events / threads.len() as u64,
                    true_events: 0,
                    false_events: 0,
                    threads: vec![t],
                })
                .collect(),
            threads: threads.to_vec(),
        }
    }

    #[test]
    fn shrink_to_aligned_words() {
        assert_eq!(shrink(0b0000_1111), (0, 4));
        assert_eq!(shrink(0b1111_0000), (4, 4));
        assert_eq!(shrink(0b0000_0001), (0, 1));
        assert_eq!(shrink(0b0000_1100), (2, 2));
        assert_eq!(
            shrink(0b0001_1000),
            (0, 8),
            "bytes 3..5 cross a 4-byte boundary"
        );
        assert_eq!(shrink(0xff), (0, 8));
    }

    #[test]
    fn one_word_per_thread_on_false_sharing() {
        let l = line(0x1000, 10, &[(1, byte_mask(0, 4)), (2, byte_mask(8, 8))]);
        let c = candidates([&l], 4);
        assert_eq!(c[0].words, vec![(0x1000, 4), (0x1008, 8)]);
    }

    #[test]
    fn every_thread_covered_before_seconds_and_at_most_four() {
        // T1 touches 5 slots; T2 and T3 one each, at the end: they must be in the 4.
        let t1: u128 = (0..5).map(|k| byte_mask(8 * k, 8)).fold(0, |a, b| a | b);
        let l = line(
            0x2000,
            100,
            &[(1, t1), (2, byte_mask(48, 8)), (3, byte_mask(56, 2))],
        );
        let c = candidates([&l], 1);
        let w = &c[0].words;
        assert_eq!(w.len(), 4);
        assert!(w.contains(&(0x2030, 8)));
        assert!(w.contains(&(0x2038, 2)));
        assert!(w.windows(2).all(|p| p[0].0 < p[1].0), "sorted by address");
    }

    #[test]
    fn top_lines_by_events() {
        let a = line(0x1000, 5, &[(1, 0xff), (2, 0xff00)]);
        let b = line(0x2000, 50, &[(1, 0xff), (2, 0xff00)]);
        let c = candidates([&a, &b], 1);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].line_addr, 0x2000);
    }
}
