//! The perf.data file header (`tools/perf/util/header.h`, `struct perf_file_header`) and the
//! feature sections after the data, validated against the file's length so that a damaged or
//! hostile file can only produce an error, never an out-of-range read or a huge allocation:
//!
//! ```text
//!  0   "PERFILE2"  header size  attr_size
//!  24  attrs  {offset, size}        ← attr_size bytes each
//!  40  data   {offset, size}        ← the records
//!  56  event_types {offset, size}   (obsolete)
//!  72  feature bits [256]           ← one {offset, size} per set bit, at data.offset+data.size
//! ```

use super::ImportError;

/// `HEADER_*` feature numbers read here (`tools/perf/util/header.h`).
pub mod feature {
    pub const BUILD_ID: u32 = 2;
    pub const HOSTNAME: u32 = 3;
    pub const OSRELEASE: u32 = 4;
    pub const VERSION: u32 = 5;
    pub const NRCPUS: u32 = 7;
    pub const CPUDESC: u32 = 8;
    pub const CPUID: u32 = 9;
    pub const CMDLINE: u32 = 11;
    pub const EVENT_DESC: u32 = 12;
    pub const NUMA_TOPOLOGY: u32 = 14;
    pub const PMU_MAPPINGS: u32 = 16;
    pub const MEM_TOPOLOGY: u32 = 22;
}

const HEADER_SIZE: u64 = 104;
/// `PERF_ATTR_SIZE_VER0`: the smallest attr any perf wrote.
const ATTR_SIZE_MIN: u64 = 64;
/// Attrs have grown to 136 bytes (VER8); leave room for growth but not for nonsense.
const ATTR_SIZE_MAX: u64 = 4096;

/// The checked header: every range lies inside the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub attr_size: u64,
    pub data: (u64, u64),
    /// (feature number, offset, size) of each feature section present.
    pub features: Vec<(u32, u64, u64)>,
}

fn u32_at(b: &[u8], off: u64) -> Option<u32> {
    let o = usize::try_from(off).ok()?;
    Some(u32::from_le_bytes(
        b.get(o..o.checked_add(4)?)?.try_into().ok()?,
    ))
}

pub(crate) fn u64_at(b: &[u8], off: u64) -> Option<u64> {
    let o = usize::try_from(off).ok()?;
    Some(u64::from_le_bytes(
        b.get(o..o.checked_add(8)?)?.try_into().ok()?,
    ))
}

fn within(len: u64, what: &str, off: u64, size: u64) -> Result<(), ImportError> {
    match off.checked_add(size) {
        Some(end) if end <= len => Ok(()),
        _ => Err(ImportError::Layout(format!(
            "{what} section [{off}, +{size}) lies outside the {len}-byte file"
        ))),
    }
}

/// Reads and checks the header, the section table and the `EVENT_DESC` section's structure.
pub fn check(bytes: &[u8]) -> Result<Layout, ImportError> {
    let len = bytes.len() as u64;
    match bytes.get(..8) {
        Some(b"PERFILE2") => {}
        Some(b"2ELIFREP") => return Err(ImportError::BigEndian),
        Some(b"PERFFILE") => {
            return Err(ImportError::NotPerfData(
                "a perf.data version 1 file (perf before 2.6.36); re-record with a newer perf"
                    .into(),
            ))
        }
        _ if len < 8 => {
            return Err(ImportError::NotPerfData(format!(
                "only {len} bytes, shorter than the magic"
            )))
        }
        _ => {
            return Err(ImportError::NotPerfData(
                "no PERFILE2 magic at the start (pipe-mode output, `perf record -o -`, is not \
                 supported: record to a file)"
                    .into(),
            ))
        }
    }
    let short = || ImportError::Layout(format!("the file ends inside the header ({len} bytes)"));
    let header_size = u64_at(bytes, 8).ok_or_else(short)?;
    if len < HEADER_SIZE {
        return Err(short());
    }
    if !(HEADER_SIZE..=len).contains(&header_size) {
        return Err(ImportError::Layout(format!(
            "header size {header_size} is not between {HEADER_SIZE} and the file size {len}"
        )));
    }
    let attr_size = u64_at(bytes, 16).ok_or_else(short)?;
    if !(ATTR_SIZE_MIN..=ATTR_SIZE_MAX).contains(&attr_size) {
        return Err(ImportError::Layout(format!(
            "attr size {attr_size} is not between {ATTR_SIZE_MIN} and {ATTR_SIZE_MAX}"
        )));
    }
    let sec = |at: u64| -> Result<(u64, u64), ImportError> {
        Ok((
            u64_at(bytes, at).ok_or_else(short)?,
            u64_at(bytes, at + 8).ok_or_else(short)?,
        ))
    };
    let attrs = sec(24)?;
    let data = sec(40)?;
    let event_types = sec(56)?;
    within(len, "attrs", attrs.0, attrs.1)?;
    within(len, "data", data.0, data.1)?;
    within(len, "event_types", event_types.0, event_types.1)?;
    let mut features = Vec::new();
    let mut at = data.0 + data.1;
    for word in 0..4u32 {
        let bits = u64_at(bytes, 72 + 8 * u64::from(word)).ok_or_else(short)?;
        for bit in 0..64 {
            if bits & (1 << bit) == 0 {
                continue;
            }
            let (off, size) = sec(at).map_err(|_| {
                ImportError::Layout(format!(
                    "the feature section table ends outside the {len}-byte file"
                ))
            })?;
            let n = word * 64 + bit;
            within(len, &format!("feature {n}"), off, size)?;
            features.push((n, off, size));
            at += 16;
        }
    }
    let layout = Layout {
        attr_size,
        data,
        features,
    };
    if let Some(desc) = layout.section(bytes, feature::EVENT_DESC) {
        check_event_desc(desc)?;
    }
    Ok(layout)
}

impl Layout {
    /// The bytes of feature section `n`, if present.
    pub fn section<'a>(&self, bytes: &'a [u8], n: u32) -> Option<&'a [u8]> {
        let &(_, off, size) = self.features.iter().find(|f| f.0 == n)?;
        bytes.get(usize::try_from(off).ok()?..usize::try_from(off + size).ok()?)
    }
}

/// Walks `EVENT_DESC` (`nr`, `attr_size`, then per event: attr, `nr_ids`, a header string,
/// the ids) so the reader, which allocates by these counts, only ever sees consistent ones.
fn check_event_desc(s: &[u8]) -> Result<(), ImportError> {
    let bad = |why: &str| ImportError::Layout(format!("EVENT_DESC section: {why}"));
    let nr = u32_at(s, 0).ok_or_else(|| bad("too short"))?;
    let attr_size = u64::from(u32_at(s, 4).ok_or_else(|| bad("too short"))?);
    if !(ATTR_SIZE_MIN..=ATTR_SIZE_MAX).contains(&attr_size) {
        return Err(bad(&format!("attr size {attr_size}")));
    }
    let mut at = 8u64;
    for i in 0..nr {
        let end = |what: &str| bad(&format!("event {i} of {nr}: {what} past the end"));
        // The attr's own size field must not claim more than attr_size.
        let own = u32_at(s, at + 4).ok_or_else(|| end("attr"))?;
        if u64::from(own) > attr_size {
            return Err(bad(&format!("event {i}: attr size {own} > {attr_size}")));
        }
        at += attr_size;
        let nr_ids = u64::from(u32_at(s, at).ok_or_else(|| end("nr_ids"))?);
        let str_len = u64::from(u32_at(s, at + 4).ok_or_else(|| end("name"))?);
        at += 8 + str_len;
        at += nr_ids * 8;
        if at > s.len() as u64 {
            return Err(end("ids"));
        }
    }
    Ok(())
}

/// A `perf_header_string` (u32 length, then that many bytes, NUL-padded) at the start of `s`,
/// and the rest after it.
pub fn header_string(s: &[u8]) -> Option<(String, &[u8])> {
    let n = u32_at(s, 0)? as usize;
    let body = s.get(4..4usize.checked_add(n)?)?;
    let text = body.split(|&b| b == 0).next().unwrap_or_default();
    Some((String::from_utf8_lossy(text).into_owned(), &s[4 + n..]))
}

/// A `perf_header_string_list` (`CMDLINE`): u32 count, then strings.
pub fn string_list(s: &[u8]) -> Vec<String> {
    let Some(n) = u32_at(s, 0) else {
        return Vec::new();
    };
    let mut rest = &s[4..];
    let mut out = Vec::new();
    for _ in 0..n {
        let Some((t, r)) = header_string(rest) else {
            break;
        };
        out.push(t);
        rest = r;
    }
    out
}

/// `PMU_MAPPINGS`: (type, name) pairs, e.g. (4, "cpu"), (11, "ibs_op").
pub fn pmu_mappings(s: &[u8]) -> Vec<(u32, String)> {
    let Some(n) = u32_at(s, 0) else {
        return Vec::new();
    };
    let mut rest = &s[4..];
    let mut out = Vec::new();
    for _ in 0..n {
        let Some(t) = u32_at(rest, 0) else {
            break;
        };
        let Some((name, r)) = header_string(&rest[4..]) else {
            break;
        };
        out.push((t, name));
        rest = r;
    }
    out
}

/// `BUILD_ID`: records of `{header, pid, build_id[24], filename}`; (path, build-id) pairs.
/// The build-id's length is not stored in old files: trailing zero bytes are trimmed (a
/// 20-byte SHA-1 id in its 24-byte slot), as perf does when it has no size.
pub fn build_ids(s: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while let (Some(h), true) = (s.get(at..at + 8), out.len() < 1 << 16) {
        let misc = u16::from_le_bytes([h[4], h[5]]);
        let size = u16::from_le_bytes([h[6], h[7]]) as usize;
        let Some(rec) = s.get(at..at + size).filter(|_| size >= 8 + 4 + 24) else {
            break;
        };
        // `build_id[24]` at 12; since perf 5.x, with PERF_RECORD_MISC_BUILD_ID_SIZE, its
        // length in byte 32 (`data[20]; size`); older files hold a 20-byte SHA-1 id.
        let n = if misc & (1 << 15) != 0 {
            usize::from(rec[32]).min(20)
        } else {
            20
        };
        let id = rec[12..12 + n].to_vec();
        let name = rec[36..].split(|&b| b == 0).next().unwrap_or_default();
        out.push((String::from_utf8_lossy(name).into_owned(), id));
        at += size;
    }
    out
}

/// `PERF_RECORD_AUXTRACE`: its data follows the record, `size` bytes not counted in the header.
const PERF_RECORD_AUXTRACE: u32 = 71;
/// A user record type no perf writes, for filler (the reader reads and passes it on; the
/// importer skips user records).
pub const FILLER_RECORD: u32 = 99;

/// Where the damage in the data section starts, if any: (the offset from the data start after
/// the last whole record, the offset of that record). A record cut off (perf killed, disk full), a header claiming less
/// than itself, or an AUXTRACE record whose data runs past the end all count as damage.
pub fn damage(bytes: &[u8], data: (u64, u64)) -> Option<(u64, u64)> {
    let (off, size) = data;
    let (mut at, mut prev) = (0u64, 0u64);
    while at < size {
        let h = usize::try_from(off + at)
            .ok()
            .and_then(|o| bytes.get(o..o.checked_add(16)?));
        let whole = h.and_then(|h| {
            let kind = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
            let mut n = u64::from(u16::from_le_bytes([h[6], h[7]]));
            if kind == PERF_RECORD_AUXTRACE {
                n = n.checked_add(u64::from_le_bytes(h[8..16].try_into().ok()?))?;
            }
            (n >= 8 && at.checked_add(n)? <= size).then_some(n)
        });
        // A final 8-byte record (FINISHED_ROUND) has no 16 bytes to look at.
        let whole = whole.or_else(|| {
            let o = usize::try_from(off + at).ok()?;
            let h = bytes.get(o..o + 8)?;
            let n = u64::from(u16::from_le_bytes([h[6], h[7]]));
            (n == 8 && at + 8 <= size).then_some(8)
        });
        match whole {
            Some(n) => {
                prev = at;
                at += n;
            }
            None => return Some((at, prev)),
        }
    }
    None
}

/// Overwrites the damaged tail of the data section (from [`damage`]) with filler records, so
/// a reader sees every record before the damage and then nothing. A tail too short for a
/// record (< 8 bytes) is added to the last whole record instead (readers ignore bytes after
/// the fields they read).
pub fn fill(bytes: &mut [u8], data: (u64, u64), (keep, prev): (u64, u64)) {
    let (off, size) = data;
    let tail = size - keep;
    if tail < 8 && keep > prev {
        let o = (off + prev) as usize;
        let n = u16::from_le_bytes([bytes[o + 6], bytes[o + 7]]);
        if let Some(m) = n.checked_add(tail as u16) {
            bytes[o + 6..o + 8].copy_from_slice(&m.to_le_bytes());
            return;
        }
    }
    let mut at = keep;
    while at < size {
        let left = size - at;
        if left < 8 {
            // Only a data section shorter than one header gets here: the reader's own error
            // for it is the right answer.
            break;
        }
        // Largest record size is 65535; never leave a tail under 8.
        let n = if left <= 0xffff {
            left
        } else if left - 0xfff8 >= 8 {
            0xfff8
        } else {
            0xfff0
        };
        let o = (off + at) as usize;
        let rec = &mut bytes[o..o + n as usize];
        rec.fill(0);
        rec[..4].copy_from_slice(&FILLER_RECORD.to_le_bytes());
        rec[6..8].copy_from_slice(&(n as u16).to_le_bytes());
        at += n;
    }
}
