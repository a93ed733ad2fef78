//! Record payloads: [`Event`] ⇄ bytes, and the frame (kind, length, CRC) around them.
//! Fixed-width little-endian fields: samples dominate a recording and decode with a handful of
//! unaligned loads, no varint loops. The layout of each kind is in `TRACE_FORMAT.md`.

use super::cursor::Cur;
use super::sample::{decode_sample_into, encode_sample};
use super::{kind, TraceError, TraceFooter, FRAME_HEAD, FRAME_TAIL, MAX_RECORD_LEN};
use crate::event::{Event, Mmap, StreamStats};

/// Why a payload does not decode; the reader adds offset and kind.
pub(crate) type Why = &'static str;
pub(crate) const SHORT: Why = "payload ends before its fields";

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
        Event::WatchSet {
            time,
            words,
            write_only,
            exec,
            front,
            look,
        } => {
            out.extend_from_slice(&time.to_le_bytes());
            // At most 4 debug registers; a u8 count is plenty and keeps the frame tiny.
            let n = u8::try_from(words.len()).map_err(|_| TraceError::FieldTooLarge {
                len: words.len(),
                max: u8::MAX as usize,
            })?;
            out.push(n);
            for (addr, len) in words {
                out.extend_from_slice(&addr.to_le_bytes());
                out.push(*len);
            }
            // After the fields older readers know: they ignore it and read every word as
            // read+write (which is what they were before this byte existed).
            if *write_only != 0 || *exec != 0 || *front != 0 || *look != 0 {
                out.push(*write_only);
            }
            // Likewise the code-window mask, one byte later (an older reader would open a
            // data window on the instruction's bytes: harmless, nothing stores there).
            if *exec != 0 || *front != 0 || *look != 0 {
                out.push(*exec);
            }
            // And the front-window mask (an older reader rates the line as any data window).
            if *front != 0 || *look != 0 {
                out.push(*front);
            }
            // And the look-window mask (an older reader rates a look as any data window).
            if *look != 0 {
                out.push(*look);
            }
            kind::WATCH_SET
        }
        Event::WatchCost { time, hit_ns } => {
            out.extend_from_slice(&time.to_le_bytes());
            out.extend_from_slice(&hit_ns.to_le_bytes());
            kind::WATCH_COST
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
    (kind::SAMPLE..=kind::WATCH_COST).contains(&k)
}

/// Decodes the payload of a record of kind `k` (one [`is_known`]) that starts at byte
/// `offset` into `slot`. Bytes after the fields a kind defines are ignored, so later versions
/// may append fields. Decoding into a slot the caller keeps (rather than returning an
/// `Event`, 280 bytes) lets a sample overwrite the previous one in place.
#[inline(always)]
pub(crate) fn decode_event_into(
    k: u8,
    p: &[u8],
    offset: u64,
    slot: &mut Event,
) -> Result<(), TraceError> {
    let r = if k == kind::SAMPLE {
        decode_sample_into(p, slot)
    } else {
        decode_other(k, p).map(|e| *slot = e)
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
        kind::WATCH_SET => {
            let (time, n) = (|| Some((c.u64()?, c.u8()?)))().ok_or(SHORT)?;
            let words = (0..n)
                .map(|_| Some((c.u64()?, c.u8()?)))
                .collect::<Option<Vec<_>>>()
                .ok_or(SHORT)?;
            let write_only = c.u8().unwrap_or(0);
            let exec = c.u8().unwrap_or(0);
            let front = c.u8().unwrap_or(0);
            let look = c.u8().unwrap_or(0);
            Event::WatchSet {
                time,
                words,
                write_only,
                exec,
                front,
                look,
            }
        }
        kind::WATCH_COST => {
            let (time, hit_ns) = (|| Some((c.u64()?, c.u64()?)))().ok_or(SHORT)?;
            Event::WatchCost { time, hit_ns }
        }
        _ => return Err("unknown record kind"),
    };
    Ok(e)
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
            // Not recorded: samples that were dropped as read were never in the stream.
            foreign: 0,
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
