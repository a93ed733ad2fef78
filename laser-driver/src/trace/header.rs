//! The file header: what a recording needs to be analysed on another machine. Encoded as
//! tagged fields (tag u16, len u32, value) so a newer laser can add fields that an older one
//! skips, and an older file simply lacks fields a newer reader defaults.

use std::collections::BTreeMap;

use super::codec::put_blob32;
use super::cursor::Cur;
use super::{TraceError, FILE_HEAD, MAGIC, MAX_HEADER_LEN, VERSION};
use crate::event::BackendKind;

/// One `perf_event_attr` the recording was made with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PerfAttr {
    /// What it is for, e.g. `"cpu-clock 4000 Hz, regs 0xff03ff, cpu 1"`.
    pub description: String,
    /// The raw `struct perf_event_attr` bytes as passed to `perf_event_open`.
    pub raw: Vec<u8>,
}

/// Everything about a recording except its events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceHeader {
    pub backend: BackendKind,
    pub attrs: Vec<PerfAttr>,
    /// Samples per second asked for (0 if sampling by period or not sampling).
    pub sample_freq: u64,
    /// `model name` from `/proc/cpuinfo`.
    pub cpu_model: String,
    /// The target's argv.
    pub cmdline: Vec<String>,
    pub pid: u32,
    /// Wall clock at the start, nanoseconds since the Unix epoch.
    pub start_time_unix_ns: u64,
    /// `perf_clock` (sample `time` base) at the same instant, so sample times map to wall time.
    pub start_time_perf_ns: u64,
    /// `/proc/PID/maps` of the target at the start.
    pub maps: String,
    /// GNU build-ids of the target's binaries, by path.
    pub build_ids: BTreeMap<String, Vec<u8>>,
}

impl TraceHeader {
    /// A header with only the backend set; fill in the rest field by field.
    pub fn new(backend: BackendKind) -> Self {
        TraceHeader {
            backend,
            attrs: Vec::new(),
            sample_freq: 0,
            cpu_model: String::new(),
            cmdline: Vec::new(),
            pid: 0,
            start_time_unix_ns: 0,
            start_time_perf_ns: 0,
            maps: String::new(),
            build_ids: BTreeMap::new(),
        }
    }
}

/// Header field tags. Never reuse a number.
mod tag {
    pub const BACKEND: u16 = 1;
    pub const ATTR: u16 = 2;
    pub const SAMPLE_FREQ: u16 = 3;
    pub const CPU_MODEL: u16 = 4;
    pub const CMDLINE_ARG: u16 = 5;
    pub const PID: u16 = 6;
    pub const START_UNIX_NS: u16 = 7;
    pub const START_PERF_NS: u16 = 8;
    pub const MAPS: u16 = 9;
    pub const BUILD_ID: u16 = 10;
}

fn field(out: &mut Vec<u8>, t: u16, value: &[u8]) -> Result<(), TraceError> {
    out.extend_from_slice(&t.to_le_bytes());
    let n = u32::try_from(value.len())
        .ok()
        .filter(|&n| n <= MAX_HEADER_LEN)
        .ok_or(TraceError::FieldTooLarge {
            len: value.len(),
            max: MAX_HEADER_LEN as usize,
        })?;
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(value);
    Ok(())
}

/// A blob32 (u32 length + bytes) followed by the rest of the value.
fn pair(a: &[u8], b: &[u8]) -> Result<Vec<u8>, TraceError> {
    let mut v = Vec::with_capacity(4 + a.len() + b.len());
    put_blob32(&mut v, a)?;
    v.extend_from_slice(b);
    Ok(v)
}

/// The complete file head: magic, version, header length, tagged fields, CRC.
pub(crate) fn encode(h: &TraceHeader) -> Result<Vec<u8>, TraceError> {
    let mut tlv = Vec::with_capacity(256 + h.maps.len());
    field(&mut tlv, tag::BACKEND, &[h.backend.code()])?;
    for a in &h.attrs {
        field(
            &mut tlv,
            tag::ATTR,
            &pair(a.description.as_bytes(), &a.raw)?,
        )?;
    }
    field(&mut tlv, tag::SAMPLE_FREQ, &h.sample_freq.to_le_bytes())?;
    field(&mut tlv, tag::CPU_MODEL, h.cpu_model.as_bytes())?;
    for arg in &h.cmdline {
        field(&mut tlv, tag::CMDLINE_ARG, arg.as_bytes())?;
    }
    field(&mut tlv, tag::PID, &h.pid.to_le_bytes())?;
    field(
        &mut tlv,
        tag::START_UNIX_NS,
        &h.start_time_unix_ns.to_le_bytes(),
    )?;
    field(
        &mut tlv,
        tag::START_PERF_NS,
        &h.start_time_perf_ns.to_le_bytes(),
    )?;
    field(&mut tlv, tag::MAPS, h.maps.as_bytes())?;
    for (path, id) in &h.build_ids {
        field(&mut tlv, tag::BUILD_ID, &pair(path.as_bytes(), id)?)?;
    }
    let len = u32::try_from(tlv.len())
        .ok()
        .filter(|&n| n <= MAX_HEADER_LEN)
        .ok_or(TraceError::FieldTooLarge {
            len: tlv.len(),
            max: MAX_HEADER_LEN as usize,
        })?;
    let mut out = Vec::with_capacity(FILE_HEAD + tlv.len() + 4);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&tlv);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// What the fixed 16-byte file head says: the TLV area's length. Checks magic and version.
/// `bytes` may be shorter than 16 only if the whole file is.
pub(crate) fn parse_file_head(bytes: &[u8]) -> Result<u32, TraceError> {
    if bytes.is_empty() {
        return Err(TraceError::Empty);
    }
    let n = bytes.len().min(MAGIC.len());
    if bytes[..n] != MAGIC[..n] {
        return Err(TraceError::NotLaser {
            found: bytes[..n].to_vec(),
        });
    }
    let mut c = Cur::new(bytes);
    let fixed = (|| Some((c.arr::<8>()?, c.u16()?, c.u16()?, c.u32()?)))();
    let Some((_, version, _reserved, len)) = fixed else {
        return Err(TraceError::TruncatedHeader {
            len: bytes.len() as u64,
            need: FILE_HEAD as u64,
        });
    };
    if version == 0 {
        return Err(TraceError::BadVersion { found: version });
    }
    if version > VERSION {
        return Err(TraceError::NewerVersion { found: version });
    }
    if len > MAX_HEADER_LEN {
        return Err(TraceError::HeaderTooLarge {
            len,
            max: MAX_HEADER_LEN,
        });
    }
    Ok(len)
}

/// Parses the header at the start of `bytes`; returns it and the offset of the first record.
pub(crate) fn decode(bytes: &[u8]) -> Result<(TraceHeader, usize), TraceError> {
    let len = parse_file_head(bytes)? as usize;
    let end = FILE_HEAD + len;
    let need = end + 4;
    let (Some(head), Some(crc)) = (bytes.get(..end), bytes.get(end..need)) else {
        return Err(TraceError::TruncatedHeader {
            len: bytes.len() as u64,
            need: need as u64,
        });
    };
    let stored = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    let computed = crc32fast::hash(head);
    if stored != computed {
        return Err(TraceError::HeaderChecksum { stored, computed });
    }
    Ok((decode_fields(&head[FILE_HEAD..])?, need))
}

fn decode_fields(tlv: &[u8]) -> Result<TraceHeader, TraceError> {
    let mut h = TraceHeader::new(BackendKind::Soft);
    let mut backend = None;
    let mut c = Cur::new(tlv);
    while !c.is_empty() {
        let offset = (FILE_HEAD + tlv.len() - c.rest_len()) as u64;
        let bad = |why: &str| TraceError::BadHeader {
            offset,
            why: why.to_owned(),
        };
        let (t, v) = (|| {
            let t = c.u16()?;
            let n = c.u32()? as usize;
            Some((t, c.bytes(n)?))
        })()
        .ok_or_else(|| bad("field runs past the end of the header"))?;
        let u64_of = |v: &[u8]| {
            <[u8; 8]>::try_from(v)
                .map(u64::from_le_bytes)
                .map_err(|_| bad(&format!("tag {t}: expected 8 bytes, found {}", v.len())))
        };
        let str_of = |v: &[u8]| {
            String::from_utf8(v.to_vec()).map_err(|_| bad(&format!("tag {t}: not UTF-8")))
        };
        let pair_of = |v| -> Result<(&[u8], &[u8]), TraceError> {
            let mut pc = Cur::new(v);
            let a = pc
                .blob32()
                .ok_or_else(|| bad(&format!("tag {t}: inner length past the field")))?;
            Ok((a, pc.rest()))
        };
        match t {
            tag::BACKEND => {
                let code = match v {
                    [c] => *c,
                    _ => return Err(bad("backend field is not 1 byte")),
                };
                backend = Some(
                    BackendKind::from_code(code)
                        .ok_or_else(|| bad(&format!("unknown backend code {code}")))?,
                );
            }
            tag::ATTR => {
                let (d, raw) = pair_of(v)?;
                h.attrs.push(PerfAttr {
                    description: str_of(d)?,
                    raw: raw.to_vec(),
                });
            }
            tag::SAMPLE_FREQ => h.sample_freq = u64_of(v)?,
            tag::CPU_MODEL => h.cpu_model = str_of(v)?,
            tag::CMDLINE_ARG => h.cmdline.push(str_of(v)?),
            tag::PID => {
                h.pid = <[u8; 4]>::try_from(v)
                    .map(u32::from_le_bytes)
                    .map_err(|_| bad("pid field is not 4 bytes"))?
            }
            tag::START_UNIX_NS => h.start_time_unix_ns = u64_of(v)?,
            tag::START_PERF_NS => h.start_time_perf_ns = u64_of(v)?,
            tag::MAPS => h.maps = str_of(v)?,
            tag::BUILD_ID => {
                let (p, id) = pair_of(v)?;
                h.build_ids.insert(str_of(p)?, id.to_vec());
            }
            // A newer writer's field: skipping it is what the tags are for.
            _ => {}
        }
    }
    h.backend = backend.ok_or(TraceError::BadHeader {
        offset: FILE_HEAD as u64,
        why: "no backend field".to_owned(),
    })?;
    Ok(h)
}
