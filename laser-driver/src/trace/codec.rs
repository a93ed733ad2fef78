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

/// Whether this version can decode records of kind `k`. Others (a newer writer's) are
/// skipped using the frame's length.
#[inline(always)]
pub(crate) fn is_known(k: u8) -> bool {
    (kind::SAMPLE..=kind::THROTTLE).contains(&k)
}

/// Decodes the payload of a record of kind `k` (one [`is_known`]) that starts at byte
/// `offset`. Bytes after the fields a kind defines are ignored, so later versions may append
/// fields. Returns the iterator's item type directly: every extra `Option`/`Result` layer
/// around a 280-byte `Event` costs a copy on the hot path.
#[inline(always)]
pub(crate) fn decode_event(k: u8, p: &[u8], offset: u64) -> Result<Event, TraceError> {
    let r = if k == kind::SAMPLE {
        decode_sample(p)
    } else {
        decode_other(k, p)
    };
    r.map_err(|why| TraceError::BadRecord {
        offset,
        kind: k,
        why: why.to_owned(),
    })
}

#[inline(never)]
fn decode_other(k: u8, p: &[u8]) -> Result<Event, Why> {
    let mut c = Cur::new(p);
    let e = match k {
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
        _ => return Err("unknown record kind"),
    };
    Ok(e)
}

/// A sample's fields, parsed and checked but not yet placed in an `Event` (which is 280
/// bytes: where it is built decides how often it is copied).
struct RawSample<'a> {
    backend: BackendKind,
    pid: u32,
    tid: u32,
    cpu: u32,
    time: u64,
    ip: u64,
    weight: u64,
    addr: Option<u64>,
    data_src: Option<u64>,
    watch_slot: Option<u8>,
    mask: Option<u64>,
    /// One LE u64 per bit of `mask & REG_SLOTS`, ascending.
    vals: &'a [u8],
}

#[inline(always)]
fn parse_sample(p: &[u8]) -> Result<RawSample<'_>, Why> {
    let (fx, rest) = p.split_first_chunk::<SAMPLE_FIXED>().ok_or(SHORT)?;
    let backend = match fx[0] {
        1 => BackendKind::Pebs,
        2 => BackendKind::Ibs,
        3 => BackendKind::Soft,
        4 => BackendKind::Watch,
        _ => return Err("unknown backend code"),
    };
    debug_assert_eq!(Some(backend), BackendKind::from_code(fx[0]));
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
    let (mask, vals) = if flags & F_REGS != 0 {
        let mask = c.u64().ok_or(SHORT)?;
        let n = (mask & REG_SLOTS).count_ones() as usize;
        (Some(mask), c.bytes(n * 8).ok_or(SHORT)?)
    } else {
        (None, &[][..])
    };
    Ok(RawSample {
        backend,
        pid: le32(2),
        tid: le32(6),
        cpu: le32(10),
        time: le64(14),
        ip: le64(22),
        weight: le64(30),
        addr,
        data_src,
        watch_slot,
        mask,
        vals,
    })
}

#[inline(always)]
fn decode_sample(p: &[u8]) -> Result<Event, Why> {
    let r = parse_sample(p)?;
    let mut values = [0u64; NUM_REGS];
    if let Some(mask) = r.mask {
        fill_regs(&mut values, mask & REG_SLOTS, r.vals);
    }
    Ok(Event::Sample(Sample {
        backend: r.backend,
        pid: r.pid,
        tid: r.tid,
        cpu: r.cpu,
        time: r.time,
        ip: r.ip,
        weight: r.weight,
        addr: r.addr,
        data_src: r.data_src,
        regs: r.mask.map(|mask| UserRegs { mask, values }),
        watch_slot: r.watch_slot,
    }))
}

/// Decodes into `slot`, overwriting fields in place when it already holds a sample: no
/// `Event` is built or moved. Slots outside a register mask stay 0 (as `UserRegs` promises)
/// because the array is cleared whenever the mask changes.
#[inline(always)]
pub(crate) fn decode_event_into(
    k: u8,
    p: &[u8],
    offset: u64,
    slot: &mut Event,
) -> Result<(), TraceError> {
    let bad = |why: Why| TraceError::BadRecord {
        offset,
        kind: k,
        why: why.to_owned(),
    };
    if k != kind::SAMPLE {
        *slot = decode_other(k, p).map_err(bad)?;
        return Ok(());
    }
    let r = parse_sample(p).map_err(bad)?;
    if !matches!(slot, Event::Sample(_)) {
        *slot = Event::Sample(Sample {
            backend: r.backend,
            pid: 0,
            tid: 0,
            cpu: 0,
            time: 0,
            ip: 0,
            addr: None,
            data_src: None,
            weight: 0,
            regs: None,
            watch_slot: None,
        });
    }
    if let Event::Sample(s) = slot {
        s.backend = r.backend;
        s.pid = r.pid;
        s.tid = r.tid;
        s.cpu = r.cpu;
        s.time = r.time;
        s.ip = r.ip;
        s.weight = r.weight;
        s.addr = r.addr;
        s.data_src = r.data_src;
        s.watch_slot = r.watch_slot;
        match (r.mask, &mut s.regs) {
            (None, regs) => *regs = None,
            (Some(mask), Some(regs)) => {
                if regs.mask & REG_SLOTS != mask & REG_SLOTS {
                    regs.values = [0; NUM_REGS];
                }
                regs.mask = mask;
                fill_regs(&mut regs.values, mask & REG_SLOTS, r.vals);
            }
            (Some(mask), regs) => {
                let mut values = [0u64; NUM_REGS];
                fill_regs(&mut values, mask & REG_SLOTS, r.vals);
                *regs = Some(UserRegs { mask, values });
            }
        }
    }
    Ok(())
}

/// Stores `vals` (one LE u64 per set bit of `slots`, ascending) into `values`. Copies runs
/// of adjacent registers at once: the soft backend's mask is two runs (ax…flags, r8…r15).
#[inline(always)]
fn fill_regs(values: &mut [u64; NUM_REGS], slots: u64, mut vals: &[u8]) {
    let mut m = slots;
    while m != 0 {
        let start = m.trailing_zeros() as usize;
        let run = (m >> start).trailing_ones() as usize;
        let (chunk, rest) = vals.split_at(run.min(vals.len() / 8) * 8);
        if let Some(dst) = values.get_mut(start..start + run) {
            for (d, s) in dst.iter_mut().zip(chunk.chunks_exact(8)) {
                let mut b = [0u8; 8];
                b.copy_from_slice(s);
                *d = u64::from_le_bytes(b);
            }
        }
        vals = rest;
        m &= !(((1u64 << run) - 1) << start);
    }
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
