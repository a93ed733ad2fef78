//! `/proc/PID/maps` parsing and the search for a hole near the code (pure: text in, numbers out).
//!
//! The code cache must be reachable with rel32 jumps from every byte of the code it replaces:
//!
//! ```text
//!   span.start        span.end                    cache            cache+len
//!      |== code ==========|          ...             |==== cache ====|
//!      |<------------------ ≤ 2^31 - 1 ------------------------------>|
//! ```
//!
//! so `cache + len - span.start` and `span.end - cache` (or the mirror image when the cache lies
//! below the code) must both stay within `i32::MAX`. The hole also keeps a guard page from each
//! neighbour, so the kernel never merges the cache into an adjacent anonymous mapping (the undo
//! path finds the cache by the record at the *start* of its mapping), and keeps well clear of the
//! downward-growing main stack.

use std::ops::Range;

use super::error::{Result, TraceeError};

pub const PAGE: u64 = 4096;
/// Largest rel32 distance.
pub const REACH: u64 = i32::MAX as u64;
/// Lowest address we place anything at (above any `vm.mmap_min_addr`).
pub const MIN_ADDR: u64 = 1 << 20;
/// Top of the x86-64 4-level user address space (what mmap hands out without a high hint).
pub const MAX_ADDR: u64 = 0x7fff_ffff_f000;
/// Space kept free below `[stack]`, beyond the kernel's own stack guard gap.
const STACK_CLEARANCE: u64 = 64 << 20;

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapRegion {
    pub start: u64,
    pub end: u64,
    pub read: bool,
    pub write: bool,
    pub exec: bool,
    pub offset: u64,
    /// Path or pseudo-name (`[stack]`, `[vdso]`); empty for anonymous memory.
    pub path: String,
}

impl MapRegion {
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }
}

/// Parses the text of `/proc/PID/maps`.
pub fn parse_maps(text: &str) -> Result<Vec<MapRegion>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |reason: &str| TraceeError::Maps {
            line: i + 1,
            reason: format!("{reason}: {line:?}"),
        };
        let mut fields = line.splitn(6, ' ');
        let range = fields.next().ok_or_else(|| bad("no range"))?;
        let perms = fields.next().ok_or_else(|| bad("no permissions"))?;
        let offset = fields.next().ok_or_else(|| bad("no offset"))?;
        let _dev = fields.next().ok_or_else(|| bad("no device"))?;
        let _inode = fields.next().ok_or_else(|| bad("no inode"))?;
        let path = fields.next().unwrap_or("").trim_start().to_string();
        let (s, e) = range
            .split_once('-')
            .ok_or_else(|| bad("range without '-'"))?;
        let hex = |t: &str| u64::from_str_radix(t, 16).map_err(|_| bad("bad hex number"));
        let (start, end) = (hex(s)?, hex(e)?);
        if end < start || perms.len() < 4 {
            return Err(bad("bad range or permissions"));
        }
        let p = perms.as_bytes();
        out.push(MapRegion {
            start,
            end,
            read: p[0] == b'r',
            write: p[1] == b'w',
            exec: p[2] == b'x',
            offset: hex(offset)?,
            path,
        });
    }
    out.sort_by_key(|r| r.start);
    Ok(out)
}

/// Whether every byte of `[addr, addr+len)` is within rel32 reach of every byte of `span`.
pub fn reachable(addr: u64, len: u64, span: &Range<u64>) -> bool {
    let end = addr.saturating_add(len);
    let far_up = end.saturating_sub(span.start);
    let far_down = span.end.saturating_sub(addr);
    far_up <= REACH && far_down <= REACH
}

/// Page-aligned start addresses for a `len`-byte mapping in the free gaps of `regions`, each
/// within rel32 reach of all of `span`, nearest first (at most one candidate per gap).
pub fn hole_candidates(regions: &[MapRegion], span: &Range<u64>, len: u64) -> Vec<u64> {
    let len = round_up(len, PAGE);
    let mut gaps = Vec::new();
    let mut prev_end = MIN_ADDR;
    for r in regions {
        let stack_below = if r.path == "[stack]" {
            STACK_CLEARANCE
        } else {
            0
        };
        let gap_end = r.start.saturating_sub(stack_below);
        if gap_end > prev_end {
            gaps.push((prev_end, gap_end));
        }
        prev_end = prev_end.max(r.end);
    }
    if MAX_ADDR > prev_end {
        gaps.push((prev_end, MAX_ADDR));
    }
    let mid = span.start / 2 + span.end / 2;
    let mut cands: Vec<(u64, u64)> = Vec::new();
    for (gs, ge) in gaps {
        // One guard page each side keeps the cache its own VMA.
        let lo = round_up(gs + PAGE, PAGE);
        let hi = (ge.saturating_sub(PAGE)) & !(PAGE - 1);
        if hi < lo || hi - lo < len {
            continue;
        }
        // The spot in [lo, hi-len] nearest to the code.
        let want = if mid > len {
            (mid - len / 2) & !(PAGE - 1)
        } else {
            0
        };
        let addr = want.clamp(lo, hi - len);
        if reachable(addr, len, span) {
            cands.push((addr.abs_diff(mid), addr));
        }
    }
    cands.sort();
    cands.into_iter().map(|(_, a)| a).collect()
}

pub fn round_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to) * to
}

/// Offset of the first `syscall` instruction bytes (`0f 05`) in `code`.
pub fn find_syscall_bytes(code: &[u8]) -> Option<usize> {
    code.windows(2).position(|w| w == [0x0f, 0x05])
}

/// `Seccomp:` mode from the text of `/proc/PID/task/TID/status` (0 = none, 1 = strict,
/// 2 = filter); `None` when the kernel does not report it.
pub fn seccomp_mode(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .and_then(|v| v.trim().parse().ok())
}

/// `TracerPid:` from the text of `/proc/PID/task/TID/status`.
pub fn tracer_pid(status: &str) -> Option<i32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Whether a task is a zombie or dead (`State:` Z or X), i.e. gone for our purposes.
pub fn is_dead(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("State:"))
        .map(|v| matches!(v.trim_start().chars().next(), Some('Z' | 'X')))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
555555554000-555555555000 r--p 00000000 08:01 123 /usr/bin/app
555555555000-555555556000 r-xp 00001000 08:01 123 /usr/bin/app
555555556000-555555558000 rw-p 00002000 08:01 123 /usr/bin/app
555555558000-555555579000 rw-p 00000000 00:00 0                          [heap]
7ffff7dd0000-7ffff7f50000 r-xp 00028000 08:01 456 /usr/lib/x86_64-linux-gnu/libc.so.6
7ffffffde000-7ffffffff000 rw-p 00000000 00:00 0                          [stack]
";

    #[test]
    fn parses_fields_and_paths() {
        let r = parse_maps(MAPS).unwrap();
        assert_eq!(r.len(), 6);
        assert_eq!(r[1].start, 0x5555_5555_5000);
        assert!(r[1].exec && r[1].read && !r[1].write);
        assert_eq!(r[1].offset, 0x1000);
        assert_eq!(r[1].path, "/usr/bin/app");
        assert_eq!(r[3].path, "[heap]");
        assert!(parse_maps("zzz r-xp").is_err());
        assert!(parse_maps("10-5 r-xp 0 0:0 0").is_err());
    }

    #[test]
    fn holes_are_near_free_and_reachable() {
        let regions = parse_maps(MAPS).unwrap();
        let span = 0x5555_5555_5100..0x5555_5555_5200;
        let c = hole_candidates(&regions, &span, 3 * PAGE);
        assert!(!c.is_empty());
        for &a in &c {
            assert_eq!(a % PAGE, 0);
            assert!(reachable(a, 3 * PAGE, &span), "{a:#x}");
            for r in &regions {
                // Guard page on each side: no overlap and no adjacency.
                assert!(
                    a + 3 * PAGE + PAGE <= r.start || r.end + PAGE <= a,
                    "{a:#x} vs {r:?}"
                );
            }
        }
        // Nearest: right below the executable (guard page kept); next: right above the heap.
        assert_eq!(c[0], 0x5555_5555_4000 - PAGE - 3 * PAGE);
        assert_eq!(c[1], 0x5555_5557_9000 + PAGE);
        // Code near libc gets a hole within reach of libc, never inside the stack clearance.
        let span = 0x7fff_f7dd_0000..0x7fff_f7f5_0000;
        let c = hole_candidates(&regions, &span, PAGE);
        assert!(c
            .iter()
            .all(|&a| a + PAGE <= 0x7fff_fffd_e000 - STACK_CLEARANCE));
        assert!(c.iter().all(|&a| reachable(a, PAGE, &span)));
    }

    #[test]
    fn no_hole_when_everything_near_is_taken() {
        // One mapping covering ±3 GiB around the code: nothing within reach.
        let regions = vec![MapRegion {
            start: 0x1_0000_0000,
            end: 0x3_0000_0000,
            read: true,
            write: false,
            exec: true,
            offset: 0,
            path: String::new(),
        }];
        let span = 0x2_0000_0000..0x2_0000_1000;
        assert!(hole_candidates(&regions, &span, PAGE).is_empty());
    }

    #[test]
    fn reach_is_checked_for_both_ends() {
        let span = 0x1000_0000..0x1000_1000;
        assert!(reachable(0x1000_2000, PAGE, &span));
        assert!(!reachable(0x1000_0000 + REACH, PAGE, &span));
        assert!(!reachable(0, PAGE, &(REACH + 0x2000..REACH + 0x3000)));
    }

    #[test]
    fn status_fields() {
        let s = "Name:\tapp\nState:\tS (sleeping)\nTracerPid:\t42\nSeccomp:\t2\n";
        assert_eq!(seccomp_mode(s), Some(2));
        assert_eq!(tracer_pid(s), Some(42));
        assert!(!is_dead(s));
        assert!(is_dead("State:\tZ (zombie)\n"));
        assert_eq!(seccomp_mode("Name: x\n"), None);
        assert_eq!(find_syscall_bytes(&[0x90, 0x0f, 0x05, 0xc3]), Some(1));
        assert_eq!(find_syscall_bytes(&[0x0f, 0x90, 0x05]), None);
    }
}
