//! The sample record: the one that dominates every recording, so the one whose decoding is
//! tuned. Layout in `TRACE_FORMAT.md` ("1 — Sample").

use super::codec::{Why, SHORT};
use super::cursor::Cur;
use crate::event::{BackendKind, Callers, Event, Sample, UserRegs, MAX_CALLERS, NUM_REGS};

/// Sample flag bits: which optional fields follow the fixed part.
const F_ADDR: u8 = 1;
const F_DATA_SRC: u8 = 2;
const F_REGS: u8 = 4;
const F_WATCH: u8 = 8;
/// Candidate return addresses (`Sample::callers`): a count byte, then that many u64. After
/// the registers, so a reader that predates them skips them as trailing bytes.
const F_CALLERS: u8 = 16;

/// Register slots that carry a value in the file: those `UserRegs` can hold.
const REG_SLOTS: u64 = (1 << NUM_REGS) - 1;

/// Bytes of a sample before its optional fields.
const SAMPLE_FIXED: usize = 38;

pub(crate) fn encode_sample(s: &Sample, out: &mut Vec<u8>) {
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
    if !s.callers.is_empty() {
        flags |= F_CALLERS;
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
    if !s.callers.is_empty() {
        let pcs = s.callers.as_slice();
        out.push(pcs.len() as u8);
        pcs.iter()
            .for_each(|pc| out.extend_from_slice(&pc.to_le_bytes()));
    }
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
    callers: Callers,
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
    let mut callers = Callers::default();
    if flags & F_CALLERS != 0 {
        let n = c.u8().ok_or(SHORT)? as usize;
        if n > MAX_CALLERS {
            return Err("more callers than a sample holds");
        }
        for _ in 0..n {
            callers.push(c.u64().ok_or(SHORT)?);
        }
    }
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
        callers,
    })
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

/// Decodes into `slot`, overwriting fields in place when it already holds a sample: no
/// `Event` is built or moved. Slots outside a register mask stay 0 (as `UserRegs` promises)
/// because the array is cleared whenever the mask changes.
#[inline(always)]
pub(crate) fn decode_sample_into(p: &[u8], slot: &mut Event) -> Result<(), Why> {
    let r = parse_sample(p)?;
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
            callers: Callers::default(),
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
        s.callers = r.callers;
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
