//! Migratory contention (issue 11, class 3): an array processed block by block, or a matrix
//! whose block edges two owners write, makes each cache line hot for a few milliseconds and
//! then never again. Every line stays under a per-line rate threshold while the program as a
//! whole pays for the transfers.
//!
//! ```text
//!   time ─▶   line 0 ███                     rate of each line over the run: low
//!             line 1    ███                  rate of the code that moves along them:
//!             line 2       ███                the sum, as high as one hot line's
//!             …                ███
//! ```
//! The paper's threshold is per source line, not per cache line: lines below the threshold
//! whose contention comes from the same instructions are one finding, with their extent,
//! when their rates add up to the threshold. "Same instructions" is the set of contending PCs:
//! one loop walking an object touches every line of it from the same few instructions.
//!
//! Timer samples alone rate such lines far too low (a line hot for 10 ms gets a handful of
//! samples, and has cooled before a data window can open on it). Steering therefore gives the
//! instructions behind sub-threshold lines code windows (instruction breakpoints, see
//! `model::estimate`), which follow the loop onto whichever line is hot: the lines they rate
//! join their group here whatever their own rate.

use hashbrown::HashMap;

use crate::model::findings::{LineFinding, SourceAccess};
use crate::model::line_kind::line_kind;

/// Which lines one migratory finding spans.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Extent {
    /// The lines, ascending.
    pub lines: Vec<u64>,
}

/// Share of a group's rate above which one line is contention that stays there, not a
/// moving loop's: each code window credits the line the loop was on then, so a loop seen in
/// two windows on two lines gives them half each, while a line that never cools takes
/// (nearly) every window's transfers.
const DOMINANT: f64 = 0.75;

/// Lines under `threshold` grouped by their contending instructions; each group of two or
/// more lines whose rates add up to `threshold` becomes one finding (events and shares
/// summed, sources merged per instruction, the byte offsets of all its lines laid on one
/// line), returned with its extent. Lines are in one group when they share a contending
/// instruction (directly or through other lines of the group): one loop walking an object
/// touches its lines from the same few instructions, and samples see only some of them on
/// each line.
///
/// Lines rated by code windows (`LineFinding::by_code`) or front windows
/// (`LineFinding::front`) join their group whatever their own rate. A code window sees the
/// loop on whichever line is hot while it is watched and credits that line with transfers
/// over the time the loop was watched, so a line hot for one window of a few can come out
/// above the threshold on its own; a front window measures the line the loop is on while it
/// is there. The group's rate is the larger of two lower bounds of the loop's: the sum of
/// its other lines' rates (each over the run, or over the time the loop was watched), and
/// the mean of its front lines' (each the loop's rate while it was on that line). A line
/// that is not a front and holds most of the others' rate ([`DOMINANT`]: contention that
/// stays on one line, with a few stray lines beside it) stands alone, as any line above the
/// threshold does.
pub fn migratory(findings: &[LineFinding], threshold: f64) -> Vec<(LineFinding, Extent)> {
    let eligible: Vec<&LineFinding> = findings
        .iter()
        .filter(|f| f.rate_per_s < threshold || f.by_code || f.front)
        .collect();
    let mut out: Vec<(LineFinding, Extent)> = groups_by_shared_pcs(&eligible)
        .into_iter()
        .map(|mut g| {
            let top = g
                .iter()
                .filter(|f| !f.front)
                .map(|f| f.rate_per_s)
                .fold(0.0, f64::max);
            if top >= threshold && top > DOMINANT * non_front_sum(&g) && !g.iter().any(|f| f.front)
            {
                g.retain(|f| f.rate_per_s < threshold);
            }
            g
        })
        .filter(|g| g.len() >= 2 && group_rate(g) >= threshold)
        .map(merge)
        .collect();
    out.sort_by(|a, b| b.0.rate_per_s.total_cmp(&a.0.rate_per_s));
    out
}

/// The eligible lines partitioned by shared contending instructions (union-find over PCs),
/// each group in `lines` order.
fn groups_by_shared_pcs<'a>(lines: &[&'a LineFinding]) -> Vec<Vec<&'a LineFinding>> {
    let mut parent: Vec<usize> = (0..lines.len()).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    // By instruction and process copy: the same loop in a parent and its forked copy moves
    // along different memory.
    let mut owner: HashMap<(u64, u16), usize> = HashMap::new();
    for (i, f) in lines.iter().enumerate() {
        let copy = crate::decode::maps::split_copy(f.line_addr).0;
        for s in &f.sources {
            match owner.get(&(s.pc, copy)) {
                Some(&j) => {
                    let (a, b) = (root(&mut parent, i), root(&mut parent, j));
                    parent[a.max(b)] = a.min(b);
                }
                None => {
                    owner.insert((s.pc, copy), i);
                }
            }
        }
    }
    let mut groups: HashMap<usize, Vec<&'a LineFinding>> = HashMap::new();
    for (i, f) in lines.iter().enumerate() {
        let r = root(&mut parent, i);
        groups.entry(r).or_default().push(f);
    }
    let mut v: Vec<(usize, Vec<&LineFinding>)> = groups.into_iter().collect();
    v.sort_by_key(|g| g.0);
    v.into_iter().map(|g| g.1).collect()
}

/// The rates of a group's lines that are not fronts, summed.
fn non_front_sum(g: &[&LineFinding]) -> f64 {
    g.iter().filter(|f| !f.front).map(|f| f.rate_per_s).sum()
}

/// A group's rate (see [`migratory`]): the larger of its non-front lines' sum and its front
/// lines' mean.
fn group_rate(g: &[&LineFinding]) -> f64 {
    let sum = non_front_sum(g);
    let fronts: Vec<f64> = g.iter().filter(|f| f.front).map(|f| f.rate_per_s).collect();
    let mean = if fronts.is_empty() {
        0.0
    } else {
        fronts.iter().sum::<f64>() / fronts.len() as f64
    };
    sum.max(mean)
}

fn merge(mut lines: Vec<&LineFinding>) -> (LineFinding, Extent) {
    lines.sort_by_key(|f| f.line_addr);
    let first = lines[0];
    let sum = |g: fn(&LineFinding) -> u64| lines.iter().map(|f| g(f)).sum::<u64>();
    let (true_events, false_events) = (sum(|f| f.true_events), sum(|f| f.false_events));
    let mut threads: Vec<u32> = lines
        .iter()
        .flat_map(|f| f.threads.iter().copied())
        .collect();
    threads.sort_unstable();
    threads.dedup();
    let mut sources: Vec<SourceAccess> = Vec::new();
    for s in lines.iter().flat_map(|f| &f.sources) {
        match sources.iter_mut().find(|m| m.pc == s.pc) {
            Some(m) => {
                m.offsets |= s.offsets;
                m.events += s.events;
                m.threads.extend(s.threads.iter().copied());
                m.threads.sort_unstable();
                m.threads.dedup();
            }
            None => sources.push(s.clone()),
        }
    }
    sources.sort_by(|a, b| b.events.cmp(&a.events).then(a.pc.cmp(&b.pc)));
    let merged = LineFinding {
        line_addr: first.line_addr,
        line_size: first.line_size,
        kind: line_kind(true_events, false_events),
        events: sum(|f| f.events),
        true_events,
        false_events,
        rate_per_s: group_rate(&lines),
        share: lines.iter().map(|f| f.share).sum(),
        threads,
        data: first.data.clone(),
        process: first.process,
        sources,
        by_code: lines.iter().any(|f| f.by_code),
        front: lines.iter().any(|f| f.front),
    };
    let extent = Extent {
        lines: lines.iter().map(|f| f.line_addr).collect(),
    };
    (merged, extent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::findings::{Kind, Location, Op};

    fn line(addr: u64, rate: f64, pcs: &[(u64, u128, u32)]) -> LineFinding {
        LineFinding {
            line_addr: addr,
            line_size: 64,
            kind: Kind::FalseSharing,
            events: rate as u64,
            true_events: 0,
            false_events: rate as u64,
            rate_per_s: rate,
            share: 0.01,
            threads: pcs.iter().map(|p| p.2).collect(),
            data: Location::Heap,
            sources: pcs
                .iter()
                .map(|&(pc, offsets, t)| SourceAccess {
                    pc,
                    code: Location::Unknown,
                    op: Op::Store,
                    offsets,
                    events: rate as u64 / 2,
                    threads: vec![t],
                    called_from: vec![],
                })
                .collect(),
            process: None,
            by_code: false,
            front: false,
        }
    }

    /// ```text
    ///   loop at 0x10/0x20 walks lines 0x1000..0x1c00, 400 ev/s each   → one finding
    ///   another loop (0x30) on 0x9000 and 0x9040, 300 + 300 ev/s      → under 1,000: none
    ///   a hot line at 0x5000 (2,000 ev/s)                             → not migratory
    /// ```
    #[test]
    fn lines_under_the_threshold_from_one_loop_add_up() {
        let mut f: Vec<LineFinding> = (0..4u64)
            .map(|i| {
                line(
                    0x1000 + 0x400 * i,
                    400.0,
                    &[(0x10, 0xff, 1), (0x20, 0xff00, 2)],
                )
            })
            .collect();
        f.push(line(0x9000, 300.0, &[(0x30, 1, 1)]));
        f.push(line(0x9040, 300.0, &[(0x30, 1, 2)]));
        f.push(line(0x5000, 2000.0, &[(0x10, 0xff, 1), (0x20, 0xff00, 2)]));
        let m = migratory(&f, 1000.0);
        assert_eq!(m.len(), 1);
        let (g, e) = &m[0];
        assert_eq!(e.lines, [0x1000, 0x1400, 0x1800, 0x1c00]);
        assert_eq!(g.line_addr, 0x1000);
        assert!((g.rate_per_s - 1600.0).abs() < 1e-9);
        assert_eq!(g.events, 1600);
        assert_eq!(g.threads, [1, 2]);
        assert_eq!(g.sources.len(), 2);
        assert_eq!(g.sources[0].events, 800);
        assert_eq!(g.kind, Kind::FalseSharing);
    }

    #[test]
    fn one_line_alone_is_not_migratory() {
        let f = vec![line(0x1000, 900.0, &[(0x10, 1, 1), (0x20, 2, 2)])];
        assert!(
            migratory(&f, 100.0).is_empty(),
            "above the threshold itself"
        );
        assert!(migratory(&f, 1000.0).is_empty(), "one line under it");
    }

    /// ```text
    ///   a loop moving along 0x1000.. : code windows caught it on 0x1000 and 0x1400
    ///   (1,500 and 1,200 ev/s over the time it was watched), samples saw 0x1800 (80 ev/s)
    ///   → one finding, all three lines, 2,780 ev/s
    ///   a loop on one hot line 0x5000 (code windows: 9,000 ev/s) and a stray 0x5040
    ///   (code windows: 50 ev/s) → 0x5000 is not folded into a group
    /// ```
    #[test]
    fn lines_rated_by_code_windows_join_their_group_whatever_their_rate() {
        let pcs = [(0x10, 0xff, 1), (0x20, 0xff00, 2)];
        let coded = |addr, rate| LineFinding {
            by_code: true,
            ..line(addr, rate, &pcs)
        };
        let f = vec![
            coded(0x1000, 1500.0),
            coded(0x1400, 1200.0),
            line(0x1800, 80.0, &pcs),
        ];
        let m = migratory(&f, 1000.0);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].1.lines, [0x1000, 0x1400, 0x1800]);
        assert!((m[0].0.rate_per_s - 2780.0).abs() < 1e-9);
        assert!(m[0].0.by_code);

        let hot = [(0x30, 0xff, 1), (0x40, 0xff00, 2)];
        let f = vec![
            LineFinding {
                by_code: true,
                ..line(0x5000, 9000.0, &hot)
            },
            LineFinding {
                by_code: true,
                ..line(0x5040, 50.0, &hot)
            },
        ];
        assert!(migratory(&f, 1000.0).is_empty());
    }

    /// ```text
    ///   front windows on 0x2000 (30,000 ev/s) and 0x23c0 (10,000 ev/s), pcs {0x10, 0x20}
    ///   code-rated 0x2780 (600 ev/s), pc {0x20}; sampled 0x2b40 (5 ev/s), pc {0x30, 0x20}
    ///   sampled 0x9000 (200 ev/s), pc {0x40}: another loop
    ///   → one finding over the four lines that share pcs, at the fronts' mean (20,000 ev/s,
    ///     above the 605 ev/s the others add up to); 0x9000 alone
    /// ```
    #[test]
    fn front_lines_join_lines_that_share_an_instruction_at_their_mean_rate() {
        let front = |addr, rate, pcs: &[(u64, u128, u32)]| LineFinding {
            front: true,
            ..line(addr, rate, pcs)
        };
        let f = vec![
            front(0x2000, 30_000.0, &[(0x10, 0xff, 1), (0x20, 0xff00, 2)]),
            front(0x23c0, 10_000.0, &[(0x10, 0xff, 1), (0x20, 0xff00, 2)]),
            LineFinding {
                by_code: true,
                ..line(0x2780, 600.0, &[(0x20, 0xff00, 2)])
            },
            line(0x2b40, 5.0, &[(0x30, 0xff, 1), (0x20, 0xff00, 2)]),
            line(0x9000, 200.0, &[(0x40, 0xff, 1)]),
        ];
        let m = migratory(&f, 1000.0);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].1.lines, [0x2000, 0x23c0, 0x2780, 0x2b40]);
        assert!((m[0].0.rate_per_s - 20_000.0).abs() < 1e-9);
        assert!(m[0].0.front && m[0].0.by_code);
        // One front line and nothing else it shares code with: not a group.
        let lone = vec![front(0x2000, 30_000.0, &[(0x10, 0xff, 1)])];
        assert!(migratory(&lone, 1000.0).is_empty());
    }
}
