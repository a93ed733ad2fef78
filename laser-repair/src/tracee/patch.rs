//! What a repair changes (the input from `plan`), the cache layout, and the pure checks run before
//! anything in the target is touched: patch-set validation and which threads move where.

use std::ops::Range;

use super::error::{Result, TraceeError};
use super::maps::{round_up, PAGE};

/// Bytes at `addr` to replace: `old_bytes` must be there now, `new_bytes` replace them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Patch {
    pub addr: u64,
    pub old_bytes: Vec<u8>,
    pub new_bytes: Vec<u8>,
}

impl Patch {
    pub fn range(&self) -> Range<u64> {
        self.addr..self.addr + self.old_bytes.len() as u64
    }
}

/// A repair with every address resolved for one cache placement.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PatchSet {
    /// Code placed at [`CacheAddrs::code_base`].
    pub code: Vec<u8>,
    /// Initial contents of the data area (zero-filled up to `data_len`); may be empty.
    pub data: Vec<u8>,
    pub patches: Vec<Patch>,
    /// `(old_pc, new_pc)`: equivalent points. At apply, a thread stopped exactly at `old_pc`
    /// resumes at `new_pc` (the first pair for that `old_pc`); at undo, a thread stopped at any
    /// listed `new_pc` goes back to its `old_pc`. Every instruction boundary inside patched bytes
    /// that a thread may stop at must be here; extra pairs for cache-only instructions whose
    /// effect is harmless to repeat or drop give undo more safe points. New pcs are unique.
    pub pc_map: Vec<(u64, u64)>,
}

/// Bytes a repair needs, known before the cache is placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheSizes {
    /// Upper bound on the code length (the plan may emit less once it knows the address).
    pub code: usize,
    /// Writable, zero-filled data after the code (thread-private SSB state); may be 0.
    pub data: usize,
    /// Room for the undo record (see `record`); 0 picks a default.
    pub record: usize,
}

/// Default room for the undo record: ~250 pc-map pairs plus patches.
pub const DEFAULT_RECORD_ROOM: usize = 8192;

/// Where the cache landed. Offsets are page-aligned, so record, data and code have their own
/// protections:
///
/// ```text
///  map_base      data_base (= plan's `cache_addr`)   code_base (= data_base + data_len)
///  │ record r-x  │ data rw-, zero-filled              │ code r-x                       │
/// ```
///
/// Data comes before code because that is the layout the `plan` runtime assumes: its
/// `cache_addr` is `data_base`, and it puts code at `cache_addr + data_len` (page-rounded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheAddrs {
    pub map_base: u64,
    pub map_len: u64,
    pub record_cap: usize,
    pub code_base: u64,
    pub code_cap: usize,
    pub data_base: u64,
    pub data_len: usize,
}

impl CacheAddrs {
    /// The layout of a cache for `sizes` placed at `map_base`.
    pub fn layout(sizes: &CacheSizes, map_base: u64) -> Self {
        let record = if sizes.record == 0 {
            DEFAULT_RECORD_ROOM
        } else {
            sizes.record
        };
        let record_cap = round_up(record as u64, PAGE);
        let code_cap = round_up(sizes.code.max(1) as u64, PAGE);
        let data_len = round_up(sizes.data as u64, PAGE);
        CacheAddrs {
            map_base,
            map_len: record_cap + code_cap + data_len,
            record_cap: record_cap as usize,
            code_base: map_base + record_cap + data_len,
            code_cap: code_cap as usize,
            data_base: map_base + record_cap,
            data_len: data_len as usize,
        }
    }

    pub fn code_range(&self) -> Range<u64> {
        self.code_base..self.code_base + self.code_cap as u64
    }

    pub fn map_range(&self) -> Range<u64> {
        self.map_base..self.map_base + self.map_len
    }
}

/// Checks a patch set against its cache before anything is written.
pub fn validate(set: &PatchSet, cache: &CacheAddrs) -> Result<()> {
    let bad = |m: String| Err(TraceeError::InvalidPatchSet(m));
    if set.code.len() > cache.code_cap {
        return bad(format!(
            "{} code bytes exceed the {} reserved",
            set.code.len(),
            cache.code_cap
        ));
    }
    if set.data.len() > cache.data_len {
        return bad(format!(
            "{} data bytes exceed the {} reserved",
            set.data.len(),
            cache.data_len
        ));
    }
    if set.patches.is_empty() {
        return bad("no patches".into());
    }
    let mut ranges: Vec<Range<u64>> = Vec::new();
    for p in &set.patches {
        if p.old_bytes.is_empty() || p.old_bytes.len() != p.new_bytes.len() {
            return bad(format!(
                "patch at {:#x}: {} old vs {} new bytes",
                p.addr,
                p.old_bytes.len(),
                p.new_bytes.len()
            ));
        }
        let r = p.range();
        if r.start < cache.map_range().end && cache.map_base < r.end {
            return bad(format!("patch at {:#x} lies inside the cache", p.addr));
        }
        if let Some(o) = ranges.iter().find(|o| o.start < r.end && r.start < o.end) {
            return bad(format!(
                "patches at {:#x} and {:#x} overlap",
                p.addr, o.start
            ));
        }
        ranges.push(r);
    }
    let code = cache.code_base..cache.code_base + set.code.len() as u64;
    for (i, &(old, new)) in set.pc_map.iter().enumerate() {
        if !code.contains(&new) {
            return bad(format!(
                "pc map {old:#x} -> {new:#x} points outside the code {:#x}..{:#x}",
                code.start, code.end
            ));
        }
        if set.pc_map[..i].iter().any(|&(_, n)| n == new) {
            return bad(format!("new pc {new:#x} mapped twice"));
        }
    }
    Ok(())
}

/// A held thread's position, as far as moving it is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadPos {
    pub tid: i32,
    pub rip: u64,
    /// Stopped in a syscall the kernel will restart by moving RIP back 2 bytes on resume.
    pub restart_pending: bool,
}

/// Kernel-internal restart codes (include/linux/errno.h) seen in RAX of a thread stopped in an
/// interrupted syscall.
const RESTART_CODES: [i64; 4] = [-512, -513, -514, -516];

impl ThreadPos {
    pub fn from_regs(tid: i32, regs: &libc::user_regs_struct) -> Self {
        ThreadPos {
            tid,
            rip: regs.rip,
            restart_pending: (regs.orig_rax as i64) >= 0
                && RESTART_CODES.contains(&(regs.rax as i64)),
        }
    }
}

/// One thread to move: `tid` from `from` to `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    pub tid: i32,
    pub from: u64,
    pub to: u64,
}

/// Which threads move where when `patches` go in.
///
/// A thread exactly at a mapped old pc moves (wherever that pc is); a thread inside patched bytes
/// at an unmapped address refuses the whole repair, since it would resume in the middle of the
/// new instructions. A thread in a restartable syscall is never moved (the kernel's RIP -= 2
/// would land it before the wrong instruction); inside patched bytes that refuses the repair.
pub fn plan_moves(
    threads: &[ThreadPos],
    patches: &[Patch],
    pc_map: &[(u64, u64)],
) -> Result<Vec<Move>> {
    let mut moves = Vec::new();
    for t in threads {
        let inside = patches.iter().find(|p| p.range().contains(&t.rip));
        let mapped = pc_map.iter().find(|&&(o, _)| o == t.rip).map(|&(_, n)| n);
        match (inside, mapped) {
            (Some(_), _) if t.restart_pending => {
                return Err(TraceeError::ThreadInSyscall {
                    tid: t.tid,
                    rip: t.rip,
                })
            }
            (_, Some(_)) if t.restart_pending => {}
            (_, Some(to)) => moves.push(Move {
                tid: t.tid,
                from: t.rip,
                to,
            }),
            (Some(p), None) => {
                return Err(TraceeError::UnmappedThread {
                    tid: t.tid,
                    rip: t.rip,
                    start: p.range().start,
                    end: p.range().end,
                })
            }
            (None, None) => {}
        }
    }
    Ok(moves)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache() -> CacheAddrs {
        CacheAddrs::layout(
            &CacheSizes {
                code: 100,
                data: 10,
                record: 0,
            },
            0x7000_0000,
        )
    }

    fn patch(addr: u64, len: usize) -> Patch {
        Patch {
            addr,
            old_bytes: vec![0x90; len],
            new_bytes: vec![0xcc; len],
        }
    }

    #[test]
    fn layout_is_page_aligned() {
        let c = cache();
        assert_eq!(c.record_cap, 8192);
        assert_eq!(c.data_base, 0x7000_2000);
        assert_eq!(c.code_base, 0x7000_3000);
        assert_eq!(c.code_cap, 4096);
        assert_eq!(c.data_len, 4096);
        assert_eq!(c.map_len, 0x4000);
    }

    #[test]
    fn validation_catches_each_mistake() {
        let c = cache();
        let ok = PatchSet {
            code: vec![0xc3; 10],
            data: vec![],
            patches: vec![patch(0x40_1000, 7), patch(0x40_1007, 2)],
            pc_map: vec![(0x40_1000, c.code_base)],
        };
        validate(&ok, &c).unwrap();
        let mut s = ok.clone();
        s.patches.push(patch(0x40_1006, 2));
        assert!(validate(&s, &c)
            .unwrap_err()
            .to_string()
            .contains("overlap"));
        let mut s = ok.clone();
        s.code = vec![0; 5000];
        assert!(validate(&s, &c).is_err());
        let mut s = ok.clone();
        s.pc_map.push((0x40_1001, c.code_base + 10));
        assert!(validate(&s, &c)
            .unwrap_err()
            .to_string()
            .contains("outside"));
        let mut s = ok.clone();
        s.pc_map.push((0x40_1004, c.code_base));
        assert!(validate(&s, &c).unwrap_err().to_string().contains("twice"));
        // One old pc may have several equivalent new pcs (extra safe points for undo).
        let mut s = ok.clone();
        s.pc_map.push((0x40_1000, c.code_base + 1));
        validate(&s, &c).unwrap();
        let mut s = ok.clone();
        s.patches[0].new_bytes.pop();
        assert!(validate(&s, &c).is_err());
        let mut s = ok;
        s.patches = vec![patch(c.code_base, 1)];
        assert!(validate(&s, &c)
            .unwrap_err()
            .to_string()
            .contains("inside the cache"));
    }

    #[test]
    fn moves_follow_the_map_and_refuse_unmapped_interior_pcs() {
        let patches = [patch(0x1000, 7)];
        let map = [(0x1000, 0x9000), (0x2000, 0x9010)];
        let pos = |tid, rip| ThreadPos {
            tid,
            rip,
            restart_pending: false,
        };
        let m = plan_moves(
            &[pos(1, 0x1000), pos(2, 0x1007), pos(3, 0x2000)],
            &patches,
            &map,
        )
        .unwrap();
        assert_eq!(
            m,
            vec![
                Move {
                    tid: 1,
                    from: 0x1000,
                    to: 0x9000
                },
                Move {
                    tid: 3,
                    from: 0x2000,
                    to: 0x9010
                }
            ]
        );
        assert!(matches!(
            plan_moves(&[pos(1, 0x1003)], &patches, &map),
            Err(TraceeError::UnmappedThread {
                tid: 1,
                rip: 0x1003,
                ..
            })
        ));
        let sys = ThreadPos {
            tid: 4,
            rip: 0x1000,
            restart_pending: true,
        };
        assert!(matches!(
            plan_moves(&[sys], &patches, &map),
            Err(TraceeError::ThreadInSyscall { tid: 4, .. })
        ));
        // Outside the patched bytes a thread in a syscall simply stays where it is.
        let sys = ThreadPos { rip: 0x2000, ..sys };
        assert_eq!(plan_moves(&[sys], &patches, &map).unwrap(), vec![]);
    }

    #[test]
    fn restart_detection_reads_rax_and_orig_rax() {
        // SAFETY-free: user_regs_struct is plain data; zeroed is a valid value.
        let mut r: libc::user_regs_struct = unsafe_zeroed();
        r.rip = 0x1234;
        r.orig_rax = 0; // read
        r.rax = (-512i64) as u64; // -ERESTARTSYS
        assert!(ThreadPos::from_regs(1, &r).restart_pending);
        r.rax = (-4i64) as u64; // -EINTR: already failed, no restart
        assert!(!ThreadPos::from_regs(1, &r).restart_pending);
        r.rax = (-516i64) as u64;
        r.orig_rax = u64::MAX; // not in a syscall
        assert!(!ThreadPos::from_regs(1, &r).restart_pending);
    }

    fn unsafe_zeroed() -> libc::user_regs_struct {
        // SAFETY: user_regs_struct is a C struct of integers; all-zero is a valid value.
        unsafe { std::mem::zeroed() }
    }
}
