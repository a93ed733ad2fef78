//! Record payloads: [`Event`] ⇄ bytes, and the frame (kind, length, CRC) around them.
//! Fixed-width little-endian fields: samples dominate a recording and decode with a handful of
//! unaligned loads, no varint loops. The layout of each kind is in `TRACE_FORMAT.md`.

use super::{kind, TraceError, TraceFooter, FRAME_HEAD, FRAME_TAIL, MAX_RECORD_LEN};
use crate::event::{BackendKind, Event, Mmap, Sample, StreamStats, UserRegs, NUM_REGS};

/// Sample flag bits: which optional fields follow the fixed part.
const F_ADDR: u8 = 1;
const F_DATA_SRC: u8 = 2;
const F_REGS: u8 = 4;
const F_WATCH: u8 = 8;

/// Register slots that carry a value in the file: those `UserRegs` can hold.
const REG_SLOTS: u64 = (1 << NUM_REGS) - 1;

/// Bytes of a sample before its optional fields.
pub(crate) const SAMPLE_FIXED: usize = 38;

/// A bounds-checked little-endian reader over a payload. Every getter returns `None` at the
/// end instead of panicking; callers turn that into a typed error with the record's offset.
pub(crate) struct Cur<'a> {
    b: &'a [u8],
}

impl<'a> Cur<'a> {
    #[inline]
    pub(crate) fn new(b: &'a [u8]) -> Self {
        Cur { b }
    }

    #[inline]
    pub(crate) fn arr<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, tail) = self.b.split_first_chunk::<N>()?;
        self.b = tail;
        Some(*head)
    }

    #[inline]
    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.arr::<1>().map(|a| a[0])
    }

    #[inline]
    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.arr().map(u16::from_le_bytes)
    }

    #[inline]
    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.arr().map(u32::from_le_bytes)
    }

    #[inline]
    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.arr().map(u64::from_le_bytes)
    }

    #[inline]
    pub(crate) fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.b.len() {
            return None;
        }
        let (head, tail) = self.b.split_at(n);
        self.b = tail;
        Some(head)
    }

    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.b)
    }

    pub(crate) fn rest_len(&self) -> usize {
        self.b.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.b.is_empty()
    }

    /// A `u32` length followed by that many bytes.
    pub(crate) fn blob32(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.bytes(n)
    }
}

type Why = &'static str;
const SHORT: Why = "payload ends before its fields";

fn bool_of(b: u8) -> Result<bool, Why> {
    match b {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err("boolean field is neither 0 nor 1"),
    }
}

fn string_of(b: &[u8]) -> Result<String, Why> {
    std::str::from_utf8(b)
        .map(str::to_owned)
        .map_err(|_| "string is not valid UTF-8")
}

pub(crate) fn put_blob32(out: &mut Vec<u8>, b: &[u8]) -> Result<(), TraceError> {
    let n = u32::try_from(b.len())
        .ok()
        .filter(|&n| n <= MAX_RECORD_LEN)
        .ok_or(TraceError::FieldTooLarge {
            len: b.len(),
            max: MAX_RECORD_LEN as usize,
        })?;
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(b);
    Ok(())
}

/// Appends one whole frame (kind, len, payload, crc) for `e` to `out`.
pub(crate) fn encode_event(e: &Event, out: &mut Vec<u8>) -> Result<(), TraceError> {
    let start = out.len();
    out.push(0);
    out.extend_from_slice(&[0; 4]);
    let k = match e {
        Event::Sample(s) => {
            encode_sample(s, out);
            kind::SAMPLE
        }
        Event::Mmap(m) => {
            encode_mmap(m, out)?;
            kind::MMAP
        }
        Event::Comm {
            pid,
            tid,
            time,
            name,
            exec,
        } => {
            out.extend_from_slice(&pid.to_le_bytes());
            out.extend_from_slice(&tid.to_le_bytes());
            out.extend_from_slice(&time.to_le_bytes());
            out.push(u8::from(*exec));
            put_blob32(out, name.as_bytes())?;
            kind::COMM
        }
        Event::Fork {
            pid,
            ppid,
            tid,
            ptid,
            time,
        }
        | Event::Exit {
            pid,
            ppid,
            tid,
            ptid,
            time,
        } => {
            for v in [pid, ppid, tid, ptid] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&time.to_le_bytes());
            if matches!(e, Event::Fork { .. }) {
                kind::FORK
            } else {
                kind::EXIT
            }
        }
        Event::Lost { count, time } => {
            out.extend_from_slice(&count.to_le_bytes());
            out.extend_from_slice(&time.to_le_bytes());
            kind::LOST
        }
        Event::Throttle { time, throttled } => {
            out.extend_from_slice(&time.to_le_bytes());
            out.push(u8::from(*throttled));
            kind::THROTTLE
        }
    };
    finish_frame(out, start, k)
}

/// Appends the footer frame.
pub(crate) fn encode_footer(f: &TraceFooter, out: &mut Vec<u8>) -> Result<(), TraceError> {
    let start = out.len();
    out.push(0);
    out.extend_from_slice(&[0; 4]);
    let s = &f.stats;
    for v in [s.samples, s.lost, s.throttles, s.records, f.duration_ns] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    finish_frame(out, start, kind::FOOTER)
}

/// Fills in kind and length of the frame started at `start` and appends its CRC.
fn finish_frame(out: &mut Vec<u8>, start: usize, k: u8) -> Result<(), TraceError> {
    let len = out.len() - start - FRAME_HEAD;
    let len32 = u32::try_from(len)
        .ok()
        .filter(|&n| n <= MAX_RECORD_LEN)
        .ok_or(TraceError::FieldTooLarge {
            len,
            max: MAX_RECORD_LEN as usize,
        })?;
    out[start] = k;
    out[start + 1..start + FRAME_HEAD].copy_from_slice(&len32.to_le_bytes());
    let crc = crc32fast::hash(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(())
}

fn encode_sample(s: &Sample, out: &mut Vec<u8>) {
    let mut flags = 0;
    if s.addr.is_some() {
        flags |= F_ADDR;
    }
    if s.data_src.is_some() {
        flags |= F_DATA_SRC;
    }
    if s.regs.is_some() {
        flags |= F_REGS;
    }
    if s.watch_slot.is_some() {
        flags |= F_WATCH;
    }
    out.push(s.backend.code());
    out.push(flags);
    out.extend_from_slice(&s.pid.to_le_bytes());
    out.extend_from_slice(&s.tid.to_le_bytes());
    out.extend_from_slice(&s.cpu.to_le_bytes());
    out.extend_from_slice(&s.time.to_le_bytes());
    out.extend_from_slice(&s.ip.to_le_bytes());
    out.extend_from_slice(&s.weight.to_le_bytes());
    if let Some(a) = s.addr {
        out.extend_from_slice(&a.to_le_bytes());
    }
    if let Some(d) = s.data_src {
        out.extend_from_slice(&d.to_le_bytes());
    }
    if let Some(w) = s.watch_slot {
        out.push(w);
    }
    if let Some(r) = &s.regs {
        out.extend_from_slice(&r.mask.to_le_bytes());
        // Only slots the mask names are stored: unrecorded slots read back as 0, which is
        // what `UserRegs` promises for them anyway.
        let mut m = r.mask & REG_SLOTS;
        while m != 0 {
            let i = m.trailing_zeros() as usize;
            out.extend_from_slice(&r.values[i].to_le_bytes());
            m &= m - 1;
        }
    }
}

fn encode_mmap(m: &Mmap, out: &mut Vec<u8>) -> Result<(), TraceError> {
    out.extend_from_slice(&m.pid.to_le_bytes());
    out.extend_from_slice(&m.tid.to_le_bytes());
    out.extend_from_slice(&m.time.to_le_bytes());
    out.extend_from_slice(&m.addr.to_le_bytes());
    out.extend_from_slice(&m.len.to_le_bytes());
    out.extend_from_slice(&m.pgoff.to_le_bytes());
    out.extend_from_slice(&m.prot.to_le_bytes());
    out.extend_from_slice(&m.flags.to_le_bytes());
    match &m.build_id {
        Some(id) => {
            out.push(1);
            put_blob32(out, id)?;
        }
        None => out.push(0),
    }
    put_blob32(out, m.path.as_bytes())
}

/// Decodes the payload of a record of kind `k`. `Ok(None)` for kinds this version does not
/// know (a newer writer's): the frame's length lets the reader skip them. Bytes after the
/// fields a kind defines are ignored, so later versions may append fields.
#[inline]
pub(crate) fn decode_event(k: u8, p: &[u8]) -> Result<Option<Event>, Why> {
    let mut c = Cur::new(p);
    let e = match k {
        kind::SAMPLE => Event::Sample(decode_sample(p)?),
        kind::MMAP => Event::Mmap(decode_mmap(&mut c).ok_or(SHORT)??),
        kind::COMM => {
            let (pid, tid, time, exec) =
                (|| Some((c.u32()?, c.u32()?, c.u64()?, c.u8()?)))().ok_or(SHORT)?;
            let name = string_of(c.blob32().ok_or(SHORT)?)?;
            Event::Comm {
                pid,
                tid,
                time,
                name,
                exec: bool_of(exec)?,
            }
        }
        kind::FORK | kind::EXIT => {
            let (pid, ppid, tid, ptid, time) =
                (|| Some((c.u32()?, c.u32()?, c.u32()?, c.u32()?, c.u64()?)))().ok_or(SHORT)?;
            if k == kind::FORK {
                Event::Fork {
                    pid,
                    ppid,
                    tid,
                    ptid,
                    time,
                }
            } else {
                Event::Exit {
                    pid,
                    ppid,
                    tid,
                    ptid,
                    time,
                }
            }
        }
        kind::LOST => {
            let (count, time) = (|| Some((c.u64()?, c.u64()?)))().ok_or(SHORT)?;
            Event::Lost { count, time }
        }
        kind::THROTTLE => {
            let (time, t) = (|| Some((c.u64()?, c.u8()?)))().ok_or(SHORT)?;
            Event::Throttle {
                time,
                throttled: bool_of(t)?,
            }
        }
        _ => return Ok(None),
    };
    Ok(Some(e))
}

#[inline]
fn decode_sample(p: &[u8]) -> Result<Sample, Why> {
    let (fx, rest) = p.split_first_chunk::<SAMPLE_FIXED>().ok_or(SHORT)?;
    let backend = BackendKind::from_code(fx[0]).ok_or("unknown backend code")?;
    let flags = fx[1];
    let le32 = |o: usize| u32::from_le_bytes([fx[o], fx[o + 1], fx[o + 2], fx[o + 3]]);
    let le64 = |o: usize| {
        u64::from_le_bytes([
            fx[o],
            fx[o + 1],
            fx[o + 2],
            fx[o + 3],
            fx[o + 4],
            fx[o + 5],
            fx[o + 6],
            fx[o + 7],
        ])
    };
    let mut c = Cur::new(rest);
    let addr = if flags & F_ADDR != 0 {
        Some(c.u64().ok_or(SHORT)?)
    } else {
        None
    };
    let data_src = if flags & F_DATA_SRC != 0 {
        Some(c.u64().ok_or(SHORT)?)
    } else {
        None
    };
    let watch_slot = if flags & F_WATCH != 0 {
        Some(c.u8().ok_or(SHORT)?)
    } else {
        None
    };
    let regs = if flags & F_REGS != 0 {
        let mask = c.u64().ok_or(SHORT)?;
        let mut r = UserRegs {
            mask,
            values: [0; NUM_REGS],
        };
        let slots = mask & REG_SLOTS;
        let vals = c.bytes(slots.count_ones() as usize * 8).ok_or(SHORT)?;
        let mut m = slots;
        for v in vals.chunks_exact(8) {
            let i = m.trailing_zeros() as usize;
            let mut b = [0u8; 8];
            b.copy_from_slice(v);
            // `i` < NUM_REGS because `m` ⊆ REG_SLOTS and has one bit per chunk.
            if let Some(slot) = r.values.get_mut(i) {
                *slot = u64::from_le_bytes(b);
            }
            m &= m.wrapping_sub(1);
        }
        Some(r)
    } else {
        None
    };
    Ok(Sample {
        backend,
        pid: le32(2),
        tid: le32(6),
        cpu: le32(10),
        time: le64(14),
        ip: le64(22),
        weight: le64(30),
        addr,
        data_src,
        regs,
        watch_slot,
    })
}

fn decode_mmap(c: &mut Cur<'_>) -> Option<Result<Mmap, Why>> {
    let pid = c.u32()?;
    let tid = c.u32()?;
    let time = c.u64()?;
    let addr = c.u64()?;
    let len = c.u64()?;
    let pgoff = c.u64()?;
    let prot = c.u32()?;
    let flags = c.u32()?;
    let has_id = c.u8()?;
    let build_id = match bool_of(has_id) {
        Ok(true) => Some(c.blob32()?.to_vec()),
        Ok(false) => None,
        Err(e) => return Some(Err(e)),
    };
    let path = match string_of(c.blob32()?) {
        Ok(p) => p,
        Err(e) => return Some(Err(e)),
    };
    Some(Ok(Mmap {
        pid,
        tid,
        time,
        addr,
        len,
        pgoff,
        prot,
        flags,
        path,
        build_id,
    }))
}

/// Decodes a footer payload.
pub(crate) fn decode_footer(p: &[u8]) -> Result<TraceFooter, Why> {
    let mut c = Cur::new(p);
    let (samples, lost, throttles, records, duration_ns) =
        (|| Some((c.u64()?, c.u64()?, c.u64()?, c.u64()?, c.u64()?)))().ok_or(SHORT)?;
    Ok(TraceFooter {
        stats: StreamStats {
            samples,
            lost,
            throttles,
            records,
        },
        duration_ns,
    })
}

/// One frame split off the front of `buf`.
pub(crate) enum Frame<'a> {
    /// A whole frame whose CRC matches; `len` is the frame's total size.
    Ok {
        kind: u8,
        payload: &'a [u8],
        len: usize,
    },
    /// Fewer bytes than the frame needs: the file was cut here.
    Short,
    /// The length field is beyond any real record.
    TooLarge(u32),
    /// Whole frame, wrong checksum.
    BadCrc { stored: u32, computed: u32 },
}

#[inline]
pub(crate) fn split_frame(buf: &[u8]) -> Frame<'_> {
    let Some((head, _)) = buf.split_first_chunk::<FRAME_HEAD>() else {
        return Frame::Short;
    };
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
    if len > MAX_RECORD_LEN {
        return Frame::TooLarge(len);
    }
    let body = FRAME_HEAD + len as usize;
    let total = body + FRAME_TAIL;
    if buf.len() < total {
        return Frame::Short;
    }
    let (framed, tail) = buf.split_at(body);
    let Some((crc, _)) = tail.split_first_chunk::<FRAME_TAIL>() else {
        return Frame::Short;
    };
    let stored = u32::from_le_bytes(*crc);
    let computed = crc32fast::hash(framed);
    if stored != computed {
        return Frame::BadCrc { stored, computed };
    }
    Frame::Ok {
        kind: head[0],
        payload: &framed[FRAME_HEAD..],
        len: total,
    }
}
