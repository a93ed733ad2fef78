//! Decoding `perf_mem_data_src`, the word PEBS and IBS samples carry to say where a load or
//! store was served from — and, for contention, whether another core held the line modified
//! (HITM) or handed it over (peer). The layout is the kernel's
//! `include/uapi/linux/perf_event.h` (little-endian bitfield order):
//!
//! ```text
//!  63        46 45 43 42 40 39 38 37 36   33 32     26 25 24 23  19 18            5 4    0
//! ┌────────────┬─────┬─────┬─────┬──┬───────┬─────────┬─────┬──────┬───────────────┬──────┐
//! │  reserved  │hops │ blk │snpx │rm│lvl_num│  dtlb   │lock │snoop │     lvl       │  op  │
//! └────────────┴─────┴─────┴─────┴──┴───────┴─────────┴─────┴──────┴───────────────┴──────┘
//! ```
//!
//! What counts as contention follows `perf c2c` (`c2c_decode_stats` in perf's
//! `util/mem-events.c`) exactly, so laser's counts and `perf c2c report`'s agree.

use std::fmt;

/// Shifts of each field, as `PERF_MEM_*_SHIFT` in the kernel header.
pub mod shift {
    pub const OP: u32 = 0;
    pub const LVL: u32 = 5;
    pub const SNOOP: u32 = 19;
    pub const LOCK: u32 = 24;
    pub const TLB: u32 = 26;
    pub const LVLNUM: u32 = 33;
    pub const REMOTE: u32 = 37;
    pub const SNOOPX: u32 = 38;
    pub const BLK: u32 = 40;
    pub const HOPS: u32 = 43;
}

/// A bit set over one field, with the kernel's names for its bits.
macro_rules! flags {
    ($(#[$m:meta])* $name:ident: $ty:ty, width $w:literal { $($(#[$fm:meta])* $f:ident = $v:literal => $label:literal,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub $ty);

        impl $name {
            $($(#[$fm])* pub const $f: $name = $name($v);)*
            /// Bits of the field, in bit order, with the names perf prints.
            pub const NAMES: &'static [($name, &'static str)] = &[$(($name($v), $label)),*];
            const MASK: u64 = (1 << $w) - 1;

            pub fn bits(self) -> $ty {
                self.0
            }
            pub fn contains(self, other: $name) -> bool {
                self.0 & other.0 == other.0 && other.0 != 0
            }
            pub fn is_empty(self) -> bool {
                self.0 == 0
            }
        }

        impl std::ops::BitOr for $name {
            type Output = $name;
            fn bitor(self, o: $name) -> $name {
                $name(self.0 | o.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let names: Vec<&str> = Self::NAMES
                    .iter()
                    .filter(|(b, _)| self.contains(*b))
                    .map(|(_, n)| *n)
                    .collect();
                write!(f, "{}({:#x}: {})", stringify!($name), self.0, names.join("|"))
            }
        }
    };
}

flags!(
    /// `mem_op`: what kind of access.
    MemOp: u8, width 5 {
        NA = 0x01 => "N/A",
        LOAD = 0x02 => "LOAD",
        STORE = 0x04 => "STORE",
        PFETCH = 0x08 => "PFETCH",
        EXEC = 0x10 => "EXEC",
    }
);

flags!(
    /// `mem_lvl`: the old (still filled) level bit set; perf prints the set bits joined by
    /// " or ", then " hit" or " miss".
    MemLvl: u16, width 14 {
        NA = 0x01 => "N/A",
        HIT = 0x02 => "HIT",
        MISS = 0x04 => "MISS",
        L1 = 0x08 => "L1",
        /// Line fill buffer (Intel) / miss address buffer (AMD).
        LFB = 0x10 => "LFB/MAB",
        L2 = 0x20 => "L2",
        L3 = 0x40 => "L3",
        LOC_RAM = 0x80 => "Local RAM",
        REM_RAM1 = 0x100 => "Remote RAM (1 hop)",
        REM_RAM2 = 0x200 => "Remote RAM (2 hops)",
        REM_CCE1 = 0x400 => "Remote Cache (1 hop)",
        REM_CCE2 = 0x800 => "Remote Cache (2 hops)",
        IO = 0x1000 => "I/O",
        UNC = 0x2000 => "Uncached",
    }
);

flags!(
    /// `mem_snoop`.
    MemSnoop: u8, width 5 {
        NA = 0x01 => "N/A",
        NONE = 0x02 => "None",
        HIT = 0x04 => "Hit",
        MISS = 0x08 => "Miss",
        /// Snoop hit a line another core held Modified: the signature of contention.
        HITM = 0x10 => "HitM",
    }
);

flags!(
    /// `mem_snoopx`: extended snoop (AMD, ARM, POWER).
    MemSnoopX: u8, width 2 {
        FWD = 0x01 => "Fwd",
        /// Transferred from a peer core's cache.
        PEER = 0x02 => "Peer",
    }
);

flags!(
    /// `mem_lock`.
    MemLock: u8, width 2 {
        NA = 0x01 => "N/A",
        LOCKED = 0x02 => "Yes",
    }
);

flags!(
    /// `mem_dtlb`.
    MemTlb: u8, width 7 {
        NA = 0x01 => "N/A",
        HIT = 0x02 => "HIT",
        MISS = 0x04 => "MISS",
        L1 = 0x08 => "L1",
        L2 = 0x10 => "L2",
        WK = 0x20 => "Walker",
        OS = 0x40 => "Fault",
    }
);

flags!(
    /// `mem_blk`: why the access was blocked.
    MemBlk: u8, width 3 {
        NA = 0x01 => "N/A",
        DATA = 0x02 => "Data",
        ADDR = 0x04 => "Addr",
    }
);

/// `mem_lvl_num`: the level as a number (newer kernels fill this; 0 = not filled in).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LvlNum {
    Unset,
    L1,
    L2,
    L3,
    L4,
    /// L2 miss handling buffer.
    L2Mhb,
    /// Memory-side cache.
    Msc,
    Unc,
    Cxl,
    Io,
    AnyCache,
    /// Line fill buffer / miss address buffer.
    Lfb,
    Ram,
    Pmem,
    Na,
    /// A value this laser does not know (7, or a newer kernel's).
    Other(u8),
}

impl LvlNum {
    pub fn from_bits(b: u8) -> LvlNum {
        match b {
            0x00 => LvlNum::Unset,
            0x01 => LvlNum::L1,
            0x02 => LvlNum::L2,
            0x03 => LvlNum::L3,
            0x04 => LvlNum::L4,
            0x05 => LvlNum::L2Mhb,
            0x06 => LvlNum::Msc,
            0x08 => LvlNum::Unc,
            0x09 => LvlNum::Cxl,
            0x0a => LvlNum::Io,
            0x0b => LvlNum::AnyCache,
            0x0c => LvlNum::Lfb,
            0x0d => LvlNum::Ram,
            0x0e => LvlNum::Pmem,
            0x0f => LvlNum::Na,
            o => LvlNum::Other(o),
        }
    }

    pub fn bits(self) -> u8 {
        match self {
            LvlNum::Unset => 0x00,
            LvlNum::L1 => 0x01,
            LvlNum::L2 => 0x02,
            LvlNum::L3 => 0x03,
            LvlNum::L4 => 0x04,
            LvlNum::L2Mhb => 0x05,
            LvlNum::Msc => 0x06,
            LvlNum::Unc => 0x08,
            LvlNum::Cxl => 0x09,
            LvlNum::Io => 0x0a,
            LvlNum::AnyCache => 0x0b,
            LvlNum::Lfb => 0x0c,
            LvlNum::Ram => 0x0d,
            LvlNum::Pmem => 0x0e,
            LvlNum::Na => 0x0f,
            LvlNum::Other(o) => o & 0x0f,
        }
    }

    /// perf's `mem_lvlnum[]` names; `None` where perf prints "Unknown level N".
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            LvlNum::L1 => "L1",
            LvlNum::L2 => "L2",
            LvlNum::L3 => "L3",
            LvlNum::L4 => "L4",
            LvlNum::L2Mhb => "L2 MHB",
            LvlNum::Msc => "Memory-side Cache",
            LvlNum::Unc => "Uncached",
            LvlNum::Cxl => "CXL",
            LvlNum::Io => "I/O",
            LvlNum::AnyCache => "Any cache",
            LvlNum::Lfb => "LFB/MAB",
            LvlNum::Ram => "RAM",
            LvlNum::Pmem => "PMEM",
            LvlNum::Na => "N/A",
            LvlNum::Unset | LvlNum::Other(_) => return None,
        })
    }
}

/// A decoded `perf_mem_data_src`. `raw` keeps the word (reserved bits included).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DataSrc {
    pub raw: u64,
    pub op: MemOp,
    pub lvl: MemLvl,
    pub snoop: MemSnoop,
    pub lock: MemLock,
    pub dtlb: MemTlb,
    pub lvl_num: LvlNum,
    /// `mem_remote`: served from another node (or, on POWER with `hops` 0, another core).
    pub remote: bool,
    pub snoopx: MemSnoopX,
    pub blk: MemBlk,
    /// `mem_hops`: 0 none/unknown, 1 remote core same node, 2 remote node same socket,
    /// 3 remote socket same board, 4 remote board.
    pub hops: u8,
}

/// What `perf c2c` counts a sample as. A load can count as both a HITM and a peer transfer
/// (an L3 hit with snoop HITM and snoopx PEER), exactly as in perf.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct C2cClass {
    /// `lcl_hitm`: load hit L3 on a line modified in another core's cache, same node.
    pub lcl_hitm: bool,
    /// `rmt_hitm`: load served by a remote cache holding the line modified.
    pub rmt_hitm: bool,
    /// `lcl_peer`: load hit L2/L3 via a peer core's cache (snoopx PEER), same node.
    pub lcl_peer: bool,
    /// `rmt_peer`: load served by a remote cache via a peer transfer.
    pub rmt_peer: bool,
}

impl C2cClass {
    pub fn hitm(self) -> bool {
        self.lcl_hitm || self.rmt_hitm
    }
    pub fn peer(self) -> bool {
        self.lcl_peer || self.rmt_peer
    }
}

fn field(raw: u64, shift: u32, mask: u64) -> u64 {
    (raw >> shift) & mask
}

const HOPS_NAMES: [&str; 5] = [
    "N/A",
    "core, same node",
    "node, same socket",
    "socket, same board",
    "board",
];

impl DataSrc {
    pub fn decode(raw: u64) -> DataSrc {
        DataSrc {
            raw,
            op: MemOp(field(raw, shift::OP, MemOp::MASK) as u8),
            lvl: MemLvl(field(raw, shift::LVL, MemLvl::MASK) as u16),
            snoop: MemSnoop(field(raw, shift::SNOOP, MemSnoop::MASK) as u8),
            lock: MemLock(field(raw, shift::LOCK, MemLock::MASK) as u8),
            dtlb: MemTlb(field(raw, shift::TLB, MemTlb::MASK) as u8),
            lvl_num: LvlNum::from_bits(field(raw, shift::LVLNUM, 0xf) as u8),
            remote: field(raw, shift::REMOTE, 1) != 0,
            snoopx: MemSnoopX(field(raw, shift::SNOOPX, MemSnoopX::MASK) as u8),
            blk: MemBlk(field(raw, shift::BLK, MemBlk::MASK) as u8),
            hops: field(raw, shift::HOPS, 0x7) as u8,
        }
    }

    /// The word for these fields (reserved bits of `raw` kept). `decode(x).encode() == x`.
    pub fn encode(&self) -> u64 {
        let reserved = self.raw & !((1u64 << 46) - 1);
        reserved
            | (u64::from(self.op.0) & MemOp::MASK) << shift::OP
            | (u64::from(self.lvl.0) & MemLvl::MASK) << shift::LVL
            | (u64::from(self.snoop.0) & MemSnoop::MASK) << shift::SNOOP
            | (u64::from(self.lock.0) & MemLock::MASK) << shift::LOCK
            | (u64::from(self.dtlb.0) & MemTlb::MASK) << shift::TLB
            | u64::from(self.lvl_num.bits()) << shift::LVLNUM
            | u64::from(self.remote) << shift::REMOTE
            | (u64::from(self.snoopx.0) & MemSnoopX::MASK) << shift::SNOOPX
            | (u64::from(self.blk.0) & MemBlk::MASK) << shift::BLK
            | (u64::from(self.hops) & 0x7) << shift::HOPS
    }

    pub fn is_load(&self) -> bool {
        self.op.contains(MemOp::LOAD)
    }

    pub fn is_store(&self) -> bool {
        self.op.contains(MemOp::STORE)
    }

    /// The word says where the access was served from (a level hit or miss, or a level
    /// number): without that, it says nothing about whether a transfer happened.
    pub fn names_a_level(&self) -> bool {
        self.lvl.contains(MemLvl::HIT)
            || self.lvl.contains(MemLvl::MISS)
            || !matches!(self.lvl_num, LvlNum::Unset | LvlNum::Na)
    }

    /// A locked (atomic RMW) access; c2c counts `lock & LOCKED` whatever else is set.
    pub fn is_locked(&self) -> bool {
        self.lock.contains(MemLock::LOCKED)
    }

    /// perf c2c's classification of this sample, following `c2c_decode_stats` branch for
    /// branch. Only loads are classified (c2c counts no store as HITM); the caller is
    /// responsible for c2c's other precondition, a non-zero data address.
    pub fn c2c(&self) -> C2cClass {
        let mut c = C2cClass::default();
        if !self.is_load() {
            return c;
        }
        let lvl = self.lvl;
        let peer = self.snoopx.contains(MemSnoopX::PEER);
        // Skylake may report an unknown remote level through `remote` alone; on POWER
        // `remote` with hops also marks another core of the same node, so c2c takes
        // `remote` as "remote cache" only when hops is 0.
        let mrem = self.remote && self.hops == 0;
        if lvl.contains(MemLvl::HIT) {
            if lvl.contains(MemLvl::L2) && peer {
                c.lcl_peer = true;
            }
            if lvl.contains(MemLvl::L3) {
                if self.snoop.contains(MemSnoop::HITM) {
                    c.lcl_hitm = true;
                }
                if peer {
                    c.lcl_peer = true;
                }
            }
        }
        if lvl.contains(MemLvl::REM_CCE1) || lvl.contains(MemLvl::REM_CCE2) || mrem {
            if self.snoop.contains(MemSnoop::HIT) {
                // A remote clean hit: no contention.
            } else if self.snoop.contains(MemSnoop::HITM) {
                c.rmt_hitm = true;
            } else if peer {
                c.rmt_peer = true;
            }
        }
        c
    }

    /// The sample shows a cache line moving between cores the way c2c counts it: a HITM
    /// (Intel: snoop hit modified) or, where the hardware reports transfers rather than
    /// HITM (AMD IBS, ARM SPE), a peer transfer. See [`DataSrc::c2c`] for which.
    pub fn is_hitm(&self) -> bool {
        let c = self.c2c();
        c.hitm() || c.peer()
    }

    /// perf's `perf_mem__lvl_scnprintf`: e.g. "L1 hit", "Remote L3 hit", "LFB/MAB hit",
    /// "Local RAM hit", "L3 miss", "N/A".
    pub fn level_str(&self) -> String {
        let hit_miss = if self.lvl.contains(MemLvl::HIT) {
            "hit"
        } else if self.lvl.contains(MemLvl::MISS) {
            "miss"
        } else {
            ""
        };
        let num = self.lvl_num.bits();
        if num != 0 && self.lvl_num != LvlNum::Na {
            let mut s = String::new();
            if self.remote {
                s.push_str("Remote ");
            }
            if let Some(h) = HOPS_NAMES
                .get(self.hops as usize)
                .filter(|_| self.hops != 0)
            {
                s.push_str(h);
                s.push(' ');
            }
            match self.lvl_num.name() {
                Some(n) => s.push_str(n),
                None => s.push_str(&format!("Unknown level {num}")),
            }
            s.push(' ');
            s.push_str(hit_miss);
            return s;
        }
        let levels = MemLvl(self.lvl.0 & !(MemLvl::NA.0 | MemLvl::HIT.0 | MemLvl::MISS.0));
        let names = names_of(
            levels.0.into(),
            MemLvl::NAMES.iter().map(|(b, n)| (b.0.into(), *n)),
        );
        if names.is_empty() {
            return "N/A".to_owned();
        }
        format!("{names} {hit_miss}")
    }

    /// perf's `perf_mem__snp_scnprintf`: snoop and snoopx bits joined by " or ".
    pub fn snoop_str(&self) -> String {
        let mut parts = Vec::new();
        for (b, n) in MemSnoop::NAMES {
            if self.snoop.contains(*b) {
                parts.push(*n);
            }
        }
        for (b, n) in MemSnoopX::NAMES {
            if self.snoopx.contains(*b) {
                parts.push(*n);
            }
        }
        if parts.is_empty() {
            "N/A".to_owned()
        } else {
            parts.join(" or ")
        }
    }

    /// perf's `perf_mem__op_scnprintf`.
    pub fn op_str(&self) -> &'static str {
        [
            (MemOp::NA, "N/A"),
            (MemOp::LOAD, "LOAD"),
            (MemOp::STORE, "STORE"),
            (MemOp::PFETCH, "PFETCH"),
            (MemOp::EXEC, "EXEC"),
        ]
        .into_iter()
        .find(|(b, _)| self.op.contains(*b))
        .map_or("No", |(_, n)| n)
    }

    /// perf's `perf_mem__tlb_scnprintf`: e.g. "L1 or L2 hit", "Walker miss".
    pub fn tlb_str(&self) -> String {
        let m = self.dtlb.0 & !(MemTlb::HIT.0 | MemTlb::MISS.0);
        let mut s = names_of(
            m.into(),
            MemTlb::NAMES.iter().map(|(b, n)| (b.0.into(), *n)),
        );
        if s.is_empty() {
            s.push_str("N/A");
        }
        if self.dtlb.contains(MemTlb::HIT) {
            s.push_str(" hit");
        }
        if self.dtlb.contains(MemTlb::MISS) {
            s.push_str(" miss");
        }
        s
    }
}

/// Names of the bits of `m`, in bit order, joined by " or " (perf's style).
fn names_of(m: u64, names: impl Iterator<Item = (u64, &'static str)>) -> String {
    names
        .filter(|(b, _)| m & b != 0)
        .map(|(_, n)| n)
        .collect::<Vec<_>>()
        .join(" or ")
}

/// One line for people: "LOAD L3 hit, snoop HitM, locked". The snoop is shown only when it
/// says something (not N/A / None), like `perf mem report`'s interesting columns.
impl fmt::Display for DataSrc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.op_str(), self.level_str())?;
        let quiet = MemSnoop(MemSnoop::NA.0 | MemSnoop::NONE.0);
        if (self.snoop.0 & !quiet.0) != 0 || !self.snoopx.is_empty() {
            write!(f, ", snoop {}", self.snoop_str())?;
        }
        if self.is_locked() {
            f.write_str(", locked")?;
        }
        Ok(())
    }
}

impl From<u64> for DataSrc {
    fn from(raw: u64) -> Self {
        DataSrc::decode(raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The kernel's PERF_MEM_* values, written out again here so the decoder is checked
    // against the header rather than against itself.
    const OP_LOAD: u64 = 0x02;
    const OP_STORE: u64 = 0x04;
    const LVL_HIT: u64 = 0x02 << 5;
    const LVL_MISS: u64 = 0x04 << 5;
    const LVL_L1: u64 = 0x08 << 5;
    const LVL_LFB: u64 = 0x10 << 5;
    const LVL_L2: u64 = 0x20 << 5;
    const LVL_L3: u64 = 0x40 << 5;
    const LVL_LOC_RAM: u64 = 0x80 << 5;
    const LVL_REM_CCE1: u64 = 0x400 << 5;
    const SNOOP_NA: u64 = 0x01 << 19;
    const SNOOP_NONE: u64 = 0x02 << 19;
    const SNOOP_HIT: u64 = 0x04 << 19;
    const SNOOP_HITM: u64 = 0x10 << 19;
    const LOCK_LOCKED: u64 = 0x02 << 24;
    const TLB_HIT: u64 = 0x02 << 26;
    const TLB_L1: u64 = 0x08 << 26;
    const TLB_L2: u64 = 0x10 << 26;
    const LVLNUM_L1: u64 = 0x01 << 33;
    const LVLNUM_L2: u64 = 0x02 << 33;
    const LVLNUM_L3: u64 = 0x03 << 33;
    const LVLNUM_LFB: u64 = 0x0c << 33;
    const LVLNUM_RAM: u64 = 0x0d << 33;
    const REMOTE: u64 = 1 << 37;
    const SNOOPX_FWD: u64 = 0x01 << 38;
    const SNOOPX_PEER: u64 = 0x02 << 38;
    const BLK_ADDR: u64 = 0x04 << 40;
    const HOPS_1: u64 = 0x02 << 43;

    /// Intel `pebs_data_source[0x07]` ("L3 hit, snoop hitm"): OP_LH | LVL(L3) | LEVEL(L3) |
    /// SNOOP(HITM) — the word a PEBS load from a line another core on this socket modified
    /// carries.
    const PEBS_LOCAL_HITM: u64 = 0x6_0080_0842;
    /// `pebs_data_source[0x09]` ("L3 miss snoop hitm"): OP_LH | LVL(REM_CCE1) | REM |
    /// LEVEL(L3) | SNOOP(HITM).
    const PEBS_REMOTE_HITM: u64 = 0x26_0080_8042;

    #[test]
    fn known_pebs_words_are_what_the_table_builds() {
        assert_eq!(
            PEBS_LOCAL_HITM,
            OP_LOAD | LVL_HIT | LVL_L3 | LVLNUM_L3 | SNOOP_HITM
        );
        assert_eq!(
            PEBS_REMOTE_HITM,
            OP_LOAD | LVL_HIT | LVL_REM_CCE1 | REMOTE | LVLNUM_L3 | SNOOP_HITM
        );
    }

    #[test]
    fn local_hitm_load() {
        let d = DataSrc::decode(PEBS_LOCAL_HITM);
        assert!(d.is_load() && !d.is_store() && !d.is_locked());
        assert_eq!(d.lvl, MemLvl::HIT | MemLvl::L3);
        assert_eq!(d.snoop, MemSnoop::HITM);
        assert_eq!(d.lvl_num, LvlNum::L3);
        assert!(!d.remote);
        let c = d.c2c();
        assert_eq!(
            c,
            C2cClass {
                lcl_hitm: true,
                ..C2cClass::default()
            }
        );
        assert!(d.is_hitm());
        assert_eq!(d.to_string(), "LOAD L3 hit, snoop HitM");
    }

    #[test]
    fn remote_hitm_load() {
        let d = DataSrc::decode(PEBS_REMOTE_HITM);
        assert!(d.remote);
        assert_eq!(
            d.c2c(),
            C2cClass {
                rmt_hitm: true,
                ..C2cClass::default()
            }
        );
        assert_eq!(d.level_str(), "Remote L3 hit");
    }

    #[test]
    fn remote_snoop_hit_beats_hitm_as_in_c2c() {
        // c2c's else-if chain: a remote clean hit is counted as rmt_hit, never rmt_hitm.
        let d = DataSrc::decode(OP_LOAD | LVL_HIT | LVL_REM_CCE1 | SNOOP_HIT | SNOOP_HITM);
        assert!(!d.c2c().hitm());
        assert!(!d.is_hitm());
    }

    #[test]
    fn remote_bit_without_hops_counts_as_remote_cache() {
        let d = DataSrc::decode(OP_LOAD | LVL_HIT | REMOTE | SNOOP_HITM);
        assert!(d.c2c().rmt_hitm);
        // With hops set (POWER: another core of this node), `remote` alone is not a remote
        // cache for c2c.
        let d = DataSrc::decode(OP_LOAD | LVL_HIT | REMOTE | HOPS_1 | SNOOP_HITM);
        assert_eq!(d.c2c(), C2cClass::default());
    }

    #[test]
    fn peer_transfers_count_where_c2c_counts_them() {
        let l2_peer = DataSrc::decode(OP_LOAD | LVL_HIT | LVL_L2 | LVLNUM_L2 | SNOOPX_PEER);
        assert_eq!(
            l2_peer.c2c(),
            C2cClass {
                lcl_peer: true,
                ..C2cClass::default()
            }
        );
        assert!(l2_peer.is_hitm());
        assert_eq!(l2_peer.to_string(), "LOAD L2 hit, snoop Peer");

        let rmt = DataSrc::decode(OP_LOAD | LVL_REM_CCE1 | SNOOPX_PEER);
        assert_eq!(
            rmt.c2c(),
            C2cClass {
                rmt_peer: true,
                ..C2cClass::default()
            }
        );

        // L3 hit that is both HITM and peer counts as both, as in perf.
        let both = DataSrc::decode(OP_LOAD | LVL_HIT | LVL_L3 | SNOOP_HITM | SNOOPX_PEER);
        assert!(both.c2c().lcl_hitm && both.c2c().lcl_peer);

        // FWD is printed but not counted by c2c; an L1 hit with PEER is not counted either.
        assert!(!DataSrc::decode(OP_LOAD | LVL_HIT | LVL_L3 | SNOOPX_FWD).is_hitm());
        assert!(!DataSrc::decode(OP_LOAD | LVL_HIT | LVL_L1 | SNOOPX_PEER).is_hitm());
        // A peer transfer that missed (no HIT bit) at L2 is not local.
        assert!(!DataSrc::decode(OP_LOAD | LVL_MISS | LVL_L2 | SNOOPX_PEER).is_hitm());
    }

    #[test]
    fn stores_are_never_hitm() {
        let d = DataSrc::decode(OP_STORE | LVL_HIT | LVL_L3 | SNOOP_HITM | LOCK_LOCKED);
        assert!(d.is_store() && !d.is_load());
        assert!(d.is_locked());
        assert!(!d.is_hitm());
        assert_eq!(d.to_string(), "STORE L3 hit, snoop HitM, locked");
    }

    #[test]
    fn level_strings_match_perf() {
        let s = |w| DataSrc::decode(w).level_str();
        assert_eq!(s(OP_LOAD | LVL_HIT | LVL_L1 | LVLNUM_L1), "L1 hit");
        assert_eq!(s(OP_LOAD | LVL_HIT | LVL_LFB | LVLNUM_LFB), "LFB/MAB hit");
        // Old kernels fill only mem_lvl: perf falls back to the bit names.
        assert_eq!(s(OP_LOAD | LVL_HIT | LVL_LOC_RAM), "Local RAM hit");
        assert_eq!(s(OP_LOAD | LVL_HIT | LVL_LOC_RAM | LVLNUM_RAM), "RAM hit");
        assert_eq!(s(OP_LOAD | LVL_MISS | LVL_L3 | LVLNUM_L3), "L3 miss");
        assert_eq!(s(OP_LOAD | LVL_HIT | LVL_L2 | LVL_L3), "L2 or L3 hit");
        assert_eq!(
            s(OP_LOAD | LVL_HIT | REMOTE | HOPS_1 | LVLNUM_RAM),
            "Remote node, same socket RAM hit"
        );
        assert_eq!(s(0), "N/A");
        assert_eq!(s(7 << 33), "Unknown level 7 ");
    }

    #[test]
    fn other_strings_match_perf() {
        let d = DataSrc::decode(OP_LOAD | TLB_HIT | TLB_L1 | TLB_L2 | SNOOP_NA | BLK_ADDR);
        assert_eq!(d.tlb_str(), "L1 or L2 hit");
        assert_eq!(d.snoop_str(), "N/A");
        assert_eq!(d.blk, MemBlk::ADDR);
        assert_eq!(d.op_str(), "LOAD");
        assert_eq!(DataSrc::decode(0).op_str(), "No");
        assert_eq!(
            DataSrc::decode(SNOOP_NONE | SNOOP_HIT).snoop_str(),
            "None or Hit"
        );
        assert_eq!(
            DataSrc::decode(OP_LOAD | LVL_HIT | LVL_L1 | SNOOP_NONE).to_string(),
            "LOAD L1 hit"
        );
    }

    #[test]
    fn every_field_decodes_from_its_documented_bits() {
        // One field at a time, all ones: nothing leaks into a neighbour.
        let full = |shift: u32, width: u32| ((1u64 << width) - 1) << shift;
        let d = DataSrc::decode(full(shift::SNOOP, 5));
        assert_eq!((d.snoop.0, d.lvl.0, d.lock.0), (0x1f, 0, 0));
        let d = DataSrc::decode(full(shift::TLB, 7));
        assert_eq!((d.dtlb.0, d.lock.0, d.lvl_num), (0x7f, 0, LvlNum::Unset));
        let d = DataSrc::decode(full(shift::LVLNUM, 4));
        assert_eq!((d.lvl_num, d.remote), (LvlNum::Na, false));
        let d = DataSrc::decode(full(shift::SNOOPX, 2));
        assert_eq!((d.snoopx.0, d.remote, d.blk.0), (3, false, 0));
        let d = DataSrc::decode(full(shift::HOPS, 3));
        assert_eq!((d.hops, d.blk.0), (7, 0));
        let d = DataSrc::decode(full(shift::LVL, 14));
        assert_eq!((d.lvl.0, d.op.0, d.snoop.0), (0x3fff, 0, 0));
    }

    /// The kernel's Intel load data-source table (`arch/x86/events/intel/ds.c`,
    /// `pebs_data_source[]`, built with its `OP_LH`/`LEVEL`/`REM`/`P(SNOOP, …)` macros), with
    /// Skylake's remote entries (`__intel_pmu_pebs_data_source_skl`), and what `perf c2c`
    /// counts each as: only the two HITM encodings are contention; a remote forward (FWD) is
    /// not.
    #[test]
    fn intel_pebs_table_classifies_as_c2c_does() {
        const OP_LH: u64 = OP_LOAD | LVL_HIT;
        const LVL_NA: u64 = 0x01 << 5;
        const LVL_REM_RAM1: u64 = 0x100 << 5;
        const LVL_IO: u64 = 0x1000 << 5;
        const LVL_UNC: u64 = 0x2000 << 5;
        const LVLNUM_NA: u64 = 0x0f << 33;
        const LVLNUM_L4: u64 = 0x04 << 33;
        const LVLNUM_ANY_CACHE: u64 = 0x0b << 33;
        const SNOOP_MISS: u64 = 0x08 << 19;
        let none = C2cClass::default();
        let lcl = C2cClass {
            lcl_hitm: true,
            ..none
        };
        let rmt = C2cClass {
            rmt_hitm: true,
            ..none
        };
        let table: [(&str, u64, C2cClass); 18] = [
            ("0x00 unknown", OP_LH | LVL_NA | LVLNUM_NA | SNOOP_NA, none),
            ("0x01 L1", OP_LH | LVL_L1 | LVLNUM_L1 | SNOOP_NONE, none),
            ("0x02 LFB", OP_LH | LVL_LFB | LVLNUM_LFB | SNOOP_NONE, none),
            ("0x03 L2", OP_LH | LVL_L2 | LVLNUM_L2 | SNOOP_NONE, none),
            ("0x04 L3", OP_LH | LVL_L3 | LVLNUM_L3 | SNOOP_NONE, none),
            (
                "0x05 L3 snoop miss",
                OP_LH | LVL_L3 | LVLNUM_L3 | SNOOP_MISS,
                none,
            ),
            (
                "0x06 L3 snoop hit",
                OP_LH | LVL_L3 | LVLNUM_L3 | SNOOP_HIT,
                none,
            ),
            ("0x07 L3 snoop hitm", PEBS_LOCAL_HITM, lcl),
            (
                "0x08 remote cache hit",
                OP_LH | LVL_REM_CCE1 | REMOTE | LVLNUM_L3 | SNOOP_HIT,
                none,
            ),
            ("0x09 remote cache hitm", PEBS_REMOTE_HITM, rmt),
            (
                "0x0a local RAM shared",
                OP_LH | LVL_LOC_RAM | LVLNUM_RAM | SNOOP_HIT,
                none,
            ),
            (
                "0x0b remote RAM shared",
                OP_LH | LVL_REM_RAM1 | REMOTE | LVLNUM_L3 | SNOOP_HIT,
                none,
            ),
            (
                "0x0c local RAM excl",
                OP_LH | LVL_LOC_RAM | LVLNUM_RAM | SNOOP_NONE | SNOOP_MISS,
                none,
            ),
            ("0x0e I/O", OP_LH | LVL_IO | LVLNUM_NA | SNOOP_NONE, none),
            (
                "0x0f uncached",
                OP_LH | LVL_UNC | LVLNUM_NA | SNOOP_NONE,
                none,
            ),
            ("skl 0x08 L4 hit", OP_LH | LVLNUM_L4 | SNOOP_HIT, none),
            (
                "skl 0x0c remote FWD",
                OP_LH | LVLNUM_ANY_CACHE | REMOTE | SNOOPX_FWD,
                none,
            ),
            (
                "skl 0x0d remote HITM",
                OP_LH | LVLNUM_ANY_CACHE | REMOTE | SNOOP_HITM,
                rmt,
            ),
        ];
        for (name, word, want) in table {
            let d = DataSrc::decode(word);
            assert_eq!(d.c2c(), want, "{name}: {d:?}");
            assert_eq!(d.is_hitm(), want.hitm(), "{name}");
            assert_eq!(d.encode(), word, "{name}");
        }
        // Loads that hit a line another core held modified are found, locked or not.
        assert!(DataSrc::decode(PEBS_LOCAL_HITM | LOCK_LOCKED).is_hitm());
    }

    #[test]
    fn encode_inverts_decode() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..1000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            assert_eq!(DataSrc::decode(x).encode(), x, "{x:#x}");
        }
    }
}
