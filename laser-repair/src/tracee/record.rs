//! The undo record kept at the start of every code-cache mapping (pure encode/decode).
//!
//! `laser repair -p PID --undo` runs in a fresh process that knows nothing of the repair, so
//! everything undo needs lives in the target itself, in the first page(s) of the cache mapping:
//!
//! ```text
//!  cache mapping (r-x; data part rw-):
//!  ┌──────────────────┬───────────────┬────────────────────────┐
//!  │ record (this)    │ data (zeroed) │ code (plan's bytes)    │
//!  └──────────────────┴───────────────┴────────────────────────┘
//!   map_base           data_base       code_base
//! ```
//!
//! Undo scans `/proc/PID/maps` for anonymous executable mappings starting with [`MAGIC`], checks
//! the checksum, and gets the patched addresses, the original and new bytes and the pc map. The
//! record lives and dies with the mapping: no state file to go stale when the process exits or
//! is repaired by two laser invocations.
//!
//! Layout (little-endian): magic[8] version:u32 state:u32 record_len:u64 checksum:u64 |
//! seq:u64 map_base map_len code_base code_len data_base data_len:u64 n_patches:u32
//! n_pc_map:u32 | per patch: addr:u64 len:u32 0:u32 old[len] new[len] | per pc pair: old:u64
//! new:u64. The checksum (FNV-1a 64) covers everything after itself; `state` sits before it so
//! undo can flip it in place with one 4-byte write.

use super::patch::Patch;

pub const MAGIC: [u8; 8] = *b"LASERRPR";
pub const VERSION: u32 = 1;
/// Byte offset of the `state` field.
pub const STATE_OFFSET: u64 = 12;
/// Bytes before the variable part.
pub const FIXED_LEN: usize = 96;
/// Largest record undo will read.
pub const MAX_LEN: usize = 1 << 20;

/// Whether a repair is in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    /// Patches in place.
    Active,
    /// Patches undone, but the mapping was kept because some thread might still use it (its RIP
    /// or a word on its stack points into it); a later undo unmaps it when that is safe.
    Retired,
}

impl RecordState {
    pub fn to_u32(self) -> u32 {
        match self {
            RecordState::Active => 1,
            RecordState::Retired => 2,
        }
    }
    fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(RecordState::Active),
            2 => Some(RecordState::Retired),
            _ => None,
        }
    }
}

/// Everything needed to undo one repair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairRecord {
    pub state: RecordState,
    /// Apply order (nanoseconds since the epoch): undo goes newest first.
    pub seq: u64,
    pub map_base: u64,
    pub map_len: u64,
    pub code_base: u64,
    pub code_len: u64,
    pub data_base: u64,
    pub data_len: u64,
    pub patches: Vec<Patch>,
    pub pc_map: Vec<(u64, u64)>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("no laser magic")]
    NoMagic,
    #[error("record version {0}, this laser reads {VERSION}")]
    Version(u32),
    #[error("record of {need} bytes, only {have} available")]
    Truncated { need: usize, have: usize },
    #[error("checksum {found:#x} does not match computed {computed:#x}")]
    Checksum { found: u64, computed: u64 },
    #[error("unknown state {0}")]
    State(u32),
    #[error("inconsistent contents: {0}")]
    Inconsistent(&'static str),
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl RepairRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(FIXED_LEN + 64);
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&self.state.to_u32().to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes()); // record_len, below
        b.extend_from_slice(&0u64.to_le_bytes()); // checksum, below
        for v in [
            self.seq,
            self.map_base,
            self.map_len,
            self.code_base,
            self.code_len,
            self.data_base,
            self.data_len,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&(self.patches.len() as u32).to_le_bytes());
        b.extend_from_slice(&(self.pc_map.len() as u32).to_le_bytes());
        for p in &self.patches {
            b.extend_from_slice(&p.addr.to_le_bytes());
            b.extend_from_slice(&(p.old_bytes.len() as u32).to_le_bytes());
            b.extend_from_slice(&0u32.to_le_bytes());
            b.extend_from_slice(&p.old_bytes);
            b.extend_from_slice(&p.new_bytes);
        }
        for &(o, n) in &self.pc_map {
            b.extend_from_slice(&o.to_le_bytes());
            b.extend_from_slice(&n.to_le_bytes());
        }
        let len = b.len() as u64;
        b[16..24].copy_from_slice(&len.to_le_bytes());
        let sum = fnv1a(&b[32..]);
        b[24..32].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// Total record length announced by a header (the first [`FIXED_LEN`] bytes suffice).
    pub fn peek_len(head: &[u8]) -> Result<usize, RecordError> {
        if head.len() < 32 || head[..8] != MAGIC {
            return Err(RecordError::NoMagic);
        }
        Ok(u64::from_le_bytes(head[16..24].try_into().expect("8 bytes")) as usize)
    }

    pub fn decode(b: &[u8]) -> Result<Self, RecordError> {
        let len = Self::peek_len(b)?;
        let version = u32_at(b, 8);
        if version != VERSION {
            return Err(RecordError::Version(version));
        }
        if !(FIXED_LEN..=MAX_LEN).contains(&len) || b.len() < len {
            return Err(RecordError::Truncated {
                need: len.max(FIXED_LEN),
                have: b.len(),
            });
        }
        let b = &b[..len];
        let found = u64_at(b, 24);
        let computed = fnv1a(&b[32..]);
        if found != computed {
            return Err(RecordError::Checksum { found, computed });
        }
        let state_raw = u32_at(b, 12);
        let state = RecordState::from_u32(state_raw).ok_or(RecordError::State(state_raw))?;
        let f = |i: usize| u64_at(b, 32 + 8 * i);
        let n_patches = u32_at(b, 88) as usize;
        let n_pc = u32_at(b, 92) as usize;
        let mut pos = FIXED_LEN;
        let short = RecordError::Inconsistent("counts run past the record");
        let mut patches = Vec::new();
        for _ in 0..n_patches {
            if pos + 16 > len {
                return Err(short);
            }
            let addr = u64_at(b, pos);
            let plen = u32_at(b, pos + 8) as usize;
            pos += 16;
            if pos + 2 * plen > len {
                return Err(short);
            }
            patches.push(Patch {
                addr,
                old_bytes: b[pos..pos + plen].to_vec(),
                new_bytes: b[pos + plen..pos + 2 * plen].to_vec(),
            });
            pos += 2 * plen;
        }
        let mut pc_map = Vec::new();
        for _ in 0..n_pc {
            if pos + 16 > len {
                return Err(short);
            }
            pc_map.push((u64_at(b, pos), u64_at(b, pos + 8)));
            pos += 16;
        }
        if pos != len {
            return Err(RecordError::Inconsistent("trailing bytes"));
        }
        Ok(RepairRecord {
            state,
            seq: f(0),
            map_base: f(1),
            map_len: f(2),
            code_base: f(3),
            code_len: f(4),
            data_base: f(5),
            data_len: f(6),
            patches,
            pc_map,
        })
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RepairRecord {
        RepairRecord {
            state: RecordState::Active,
            seq: 42,
            map_base: 0x7000_0000,
            map_len: 0x3000,
            code_base: 0x7000_1000,
            code_len: 12,
            data_base: 0x7000_2000,
            data_len: 0x1000,
            patches: vec![
                Patch {
                    addr: 0x40_1000,
                    old_bytes: vec![0x48, 0xc7, 0xc0, 1, 0, 0, 0],
                    new_bytes: vec![0xe9, 1, 2, 3, 4, 0x66, 0x90],
                },
                Patch {
                    addr: 0x40_2000,
                    old_bytes: vec![0x90],
                    new_bytes: vec![0xcc],
                },
            ],
            pc_map: vec![(0x40_1000, 0x7000_1000), (0x40_1007, 0x7000_1007)],
        }
    }

    #[test]
    fn round_trips() {
        let r = sample();
        let b = r.encode();
        assert_eq!(RepairRecord::peek_len(&b).unwrap(), b.len());
        assert_eq!(RepairRecord::decode(&b).unwrap(), r);
        // Trailing bytes beyond record_len (the rest of the page) are ignored.
        let mut padded = b.clone();
        padded.resize(4096, 0);
        assert_eq!(RepairRecord::decode(&padded).unwrap(), r);
    }

    #[test]
    fn state_flips_in_place_without_breaking_the_checksum() {
        let mut b = sample().encode();
        let at = STATE_OFFSET as usize;
        b[at..at + 4].copy_from_slice(&RecordState::Retired.to_u32().to_le_bytes());
        assert_eq!(
            RepairRecord::decode(&b).unwrap().state,
            RecordState::Retired
        );
        b[at..at + 4].copy_from_slice(&7u32.to_le_bytes());
        assert_eq!(RepairRecord::decode(&b), Err(RecordError::State(7)));
    }

    #[test]
    fn rejects_damage() {
        let b = sample().encode();
        assert_eq!(
            RepairRecord::decode(&b[..50]).unwrap_err(),
            RecordError::Truncated {
                need: b.len(),
                have: 50
            }
        );
        let mut c = b.clone();
        c[100] ^= 1;
        assert!(matches!(
            RepairRecord::decode(&c),
            Err(RecordError::Checksum { .. })
        ));
        let mut m = b.clone();
        m[0] = b'X';
        assert_eq!(RepairRecord::decode(&m), Err(RecordError::NoMagic));
        let mut v = b.clone();
        v[8] = 9;
        assert_eq!(RepairRecord::decode(&v), Err(RecordError::Version(9)));
        assert_eq!(RepairRecord::decode(&[0u8; 4]), Err(RecordError::NoMagic));
    }
}
