//! One `PERF_RECORD_SAMPLE` body, read in the kernel's order (`perf_output_sample` in
//! `kernel/events/core.c`; the layout comment in `include/uapi/linux/perf_event.h`):
//!
//! ```text
//!  IDENTIFIER IP TID TIME ADDR ID STREAM_ID CPU PERIOD READ CALLCHAIN RAW BRANCH_STACK
//!  REGS_USER STACK_USER WEIGHT|WEIGHT_STRUCT DATA_SRC TRANSACTION REGS_INTR PHYS_ADDR …
//! ```
//!
//! `linux-perf-event-reader` 0.10 reads past `WEIGHT` and `DATA_SRC` without keeping them —
//! and they are what a memory sample is for — so the body is read here, every field bounds
//! checked: a short or forged body yields `None`, never a panic.

use crate::event::{UserRegs, NUM_REGS};

/// `PERF_SAMPLE_*` bits (`perf_event.h`).
pub mod bits {
    pub const IP: u64 = 1 << 0;
    pub const TID: u64 = 1 << 1;
    pub const TIME: u64 = 1 << 2;
    pub const ADDR: u64 = 1 << 3;
    pub const READ: u64 = 1 << 4;
    pub const CALLCHAIN: u64 = 1 << 5;
    pub const ID: u64 = 1 << 6;
    pub const CPU: u64 = 1 << 7;
    pub const PERIOD: u64 = 1 << 8;
    pub const STREAM_ID: u64 = 1 << 9;
    pub const RAW: u64 = 1 << 10;
    pub const BRANCH_STACK: u64 = 1 << 11;
    pub const REGS_USER: u64 = 1 << 12;
    pub const STACK_USER: u64 = 1 << 13;
    pub const WEIGHT: u64 = 1 << 14;
    pub const DATA_SRC: u64 = 1 << 15;
    pub const IDENTIFIER: u64 = 1 << 16;
    pub const TRANSACTION: u64 = 1 << 17;
    pub const REGS_INTR: u64 = 1 << 18;
    pub const PHYS_ADDR: u64 = 1 << 19;
    pub const WEIGHT_STRUCT: u64 = 1 << 24;

    /// What `perf mem record` / `perf c2c record` ask of each memory sample (perf 5.x/6.x).
    pub const PERF_MEM: u64 =
        IDENTIFIER | IP | TID | TIME | ADDR | CPU | PERIOD | WEIGHT | DATA_SRC | PHYS_ADDR;
}

/// `PERF_FORMAT_*` bits of `read_format`.
mod read_fmt {
    pub const TOTAL_TIME_ENABLED: u64 = 1 << 0;
    pub const TOTAL_TIME_RUNNING: u64 = 1 << 1;
    pub const ID: u64 = 1 << 2;
    pub const GROUP: u64 = 1 << 3;
    pub const LOST: u64 = 1 << 4;
}

/// `PERF_SAMPLE_BRANCH_HW_INDEX`: branch stacks carry an extra u64.
const BRANCH_HW_INDEX: u64 = 1 << 17;

/// What an attr says about its samples' layout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleLayout {
    pub sample_type: u64,
    pub read_format: u64,
    pub branch_sample_type: u64,
    pub regs_user: u64,
    pub regs_intr: u64,
}

/// The fields laser uses from one sample.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawSample {
    pub id: Option<u64>,
    pub ip: Option<u64>,
    pub pid: Option<u32>,
    pub tid: Option<u32>,
    pub time: Option<u64>,
    pub addr: Option<u64>,
    pub cpu: Option<u32>,
    pub period: Option<u64>,
    pub regs: Option<UserRegs>,
    /// `WEIGHT` (or the low 32 bits of `WEIGHT_STRUCT`): the access latency in cycles for
    /// memory events.
    pub weight: Option<u64>,
    pub data_src: Option<u64>,
    pub phys_addr: Option<u64>,
}

struct Cur<'a>(&'a [u8]);

impl Cur<'_> {
    fn u64(&mut self) -> Option<u64> {
        let (h, t) = self.0.split_first_chunk::<8>()?;
        self.0 = t;
        Some(u64::from_le_bytes(*h))
    }
    fn skip(&mut self, n: u64) -> Option<()> {
        let n = usize::try_from(n).ok()?;
        self.0 = self.0.get(n..)?;
        Some(())
    }
    fn skip_words(&mut self, n: u64) -> Option<()> {
        self.skip(n.checked_mul(8)?)
    }
}

fn regs(c: &mut Cur<'_>, mask: u64) -> Option<Option<UserRegs>> {
    let abi = c.u64()?;
    if abi == 0 {
        return Some(None); // PERF_SAMPLE_REGS_ABI_NONE: no registers follow
    }
    let mut r = UserRegs::default();
    for bit in 0..64usize {
        if mask & (1 << bit) != 0 {
            let v = c.u64()?;
            if bit < NUM_REGS {
                r.mask |= 1 << bit;
                r.values[bit] = v;
            }
        }
    }
    Some(Some(r))
}

/// Reads `body` (the record after its 8-byte header) as laid out by `l`.
pub fn parse(body: &[u8], l: &SampleLayout) -> Option<RawSample> {
    let st = l.sample_type;
    let has = |b: u64| st & b != 0;
    let mut c = Cur(body);
    let mut s = RawSample::default();
    if has(bits::IDENTIFIER) {
        s.id = Some(c.u64()?);
    }
    if has(bits::IP) {
        s.ip = Some(c.u64()?);
    }
    if has(bits::TID) {
        let w = c.u64()?;
        s.pid = Some(w as u32);
        s.tid = Some((w >> 32) as u32);
    }
    if has(bits::TIME) {
        s.time = Some(c.u64()?);
    }
    if has(bits::ADDR) {
        s.addr = Some(c.u64()?);
    }
    if has(bits::ID) {
        let id = c.u64()?;
        s.id = s.id.or(Some(id));
    }
    if has(bits::STREAM_ID) {
        c.u64()?;
    }
    if has(bits::CPU) {
        s.cpu = Some(c.u64()? as u32);
    }
    if has(bits::PERIOD) {
        s.period = Some(c.u64()?);
    }
    if has(bits::READ) {
        let rf = l.read_format;
        let per_value = 1 + u64::from(rf & read_fmt::ID != 0) + u64::from(rf & read_fmt::LOST != 0);
        let times = u64::from(rf & read_fmt::TOTAL_TIME_ENABLED != 0)
            + u64::from(rf & read_fmt::TOTAL_TIME_RUNNING != 0);
        if rf & read_fmt::GROUP != 0 {
            let nr = c.u64()?;
            c.skip_words(times)?;
            c.skip_words(nr.checked_mul(per_value)?)?;
        } else {
            c.skip_words(per_value + times)?;
        }
    }
    if has(bits::CALLCHAIN) {
        let nr = c.u64()?;
        c.skip_words(nr)?;
    }
    if has(bits::RAW) {
        // u32 size, then the data; the kernel pads size+data to a multiple of 8.
        let n = u32::from_le_bytes(*c.0.first_chunk::<4>()?);
        c.skip(4 + u64::from(n))?;
    }
    if has(bits::BRANCH_STACK) {
        let nr = c.u64()?;
        if l.branch_sample_type & BRANCH_HW_INDEX != 0 {
            c.u64()?;
        }
        c.skip_words(nr.checked_mul(3)?)?;
    }
    if has(bits::REGS_USER) {
        s.regs = regs(&mut c, l.regs_user)?;
    }
    if has(bits::STACK_USER) {
        let size = c.u64()?;
        c.skip(size)?;
        if size != 0 {
            c.u64()?; // dyn_size
        }
    }
    if has(bits::WEIGHT) || has(bits::WEIGHT_STRUCT) {
        let w = c.u64()?;
        // WEIGHT_STRUCT: var1_dw (u32, the latency) in the low half.
        s.weight = Some(if has(bits::WEIGHT_STRUCT) {
            w & 0xffff_ffff
        } else {
            w
        });
    }
    if has(bits::DATA_SRC) {
        s.data_src = Some(c.u64()?);
    }
    if has(bits::TRANSACTION) {
        c.u64()?;
    }
    if has(bits::REGS_INTR) {
        regs(&mut c, l.regs_intr)?;
    }
    if has(bits::PHYS_ADDR) {
        s.phys_addr = Some(c.u64()?);
    }
    Some(s)
}

/// Writes a sample body for `l` from `s` (the inverse of [`parse`] for the fields laser
/// crafts: no READ, CALLCHAIN, RAW, BRANCH_STACK, STACK_USER or REGS_INTR). Used by the
/// fixture generator and tests.
pub fn write(s: &RawSample, l: &SampleLayout) -> Vec<u8> {
    let st = l.sample_type;
    let has = |b: u64| st & b != 0;
    let mut out = Vec::new();
    let mut put = |v: u64| out.extend_from_slice(&v.to_le_bytes());
    if has(bits::IDENTIFIER) {
        put(s.id.unwrap_or(0));
    }
    if has(bits::IP) {
        put(s.ip.unwrap_or(0));
    }
    if has(bits::TID) {
        put(u64::from(s.pid.unwrap_or(0)) | u64::from(s.tid.unwrap_or(0)) << 32);
    }
    if has(bits::TIME) {
        put(s.time.unwrap_or(0));
    }
    if has(bits::ADDR) {
        put(s.addr.unwrap_or(0));
    }
    if has(bits::ID) {
        put(s.id.unwrap_or(0));
    }
    if has(bits::CPU) {
        put(u64::from(s.cpu.unwrap_or(0)));
    }
    if has(bits::PERIOD) {
        put(s.period.unwrap_or(1));
    }
    if has(bits::REGS_USER) {
        match &s.regs {
            Some(r) => {
                put(2); // PERF_SAMPLE_REGS_ABI_64
                for bit in 0..64usize {
                    if l.regs_user & (1 << bit) != 0 {
                        put(if bit < NUM_REGS { r.values[bit] } else { 0 });
                    }
                }
            }
            None => put(0),
        }
    }
    if has(bits::WEIGHT) || has(bits::WEIGHT_STRUCT) {
        put(s.weight.unwrap_or(0));
    }
    if has(bits::DATA_SRC) {
        put(s.data_src.unwrap_or(0));
    }
    if has(bits::PHYS_ADDR) {
        put(s.phys_addr.unwrap_or(0));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem_layout() -> SampleLayout {
        SampleLayout {
            sample_type: bits::PERF_MEM,
            ..Default::default()
        }
    }

    #[test]
    fn memory_sample_round_trips_and_every_truncation_is_none() {
        let s = RawSample {
            id: Some(7),
            ip: Some(0x401000),
            pid: Some(100),
            tid: Some(101),
            time: Some(5),
            addr: Some(0x601040),
            cpu: Some(1),
            period: Some(19),
            regs: None,
            weight: Some(250),
            data_src: Some(0x6_0080_0842),
            phys_addr: Some(0x1234_5000),
        };
        let l = mem_layout();
        let body = write(&s, &l);
        assert_eq!(body.len(), 10 * 8);
        assert_eq!(parse(&body, &l), Some(s));
        for n in 0..body.len() {
            assert_eq!(parse(&body[..n], &l), None, "{n}");
        }
    }

    #[test]
    fn fields_before_weight_are_skipped_by_their_sizes() {
        // READ (group, 2 values with ids, both times), CALLCHAIN of 3, RAW of 4 bytes,
        // BRANCH_STACK with hw_index and 1 entry, STACK_USER of 16 bytes, then WEIGHT/DATA_SRC.
        let l = SampleLayout {
            sample_type: bits::IP
                | bits::READ
                | bits::CALLCHAIN
                | bits::RAW
                | bits::BRANCH_STACK
                | bits::STACK_USER
                | bits::WEIGHT_STRUCT
                | bits::DATA_SRC,
            read_format: read_fmt::GROUP
                | read_fmt::ID
                | read_fmt::TOTAL_TIME_ENABLED
                | read_fmt::TOTAL_TIME_RUNNING,
            branch_sample_type: BRANCH_HW_INDEX,
            ..Default::default()
        };
        let mut b: Vec<u64> = vec![0x401000];
        b.extend([2, 10, 11, 1, 100, 2, 200]); // nr, enabled, running, (value, id) × 2
        b.extend([3, 1, 2, 3]); // callchain
        b.push(4 | (0xdead_beef << 32)); // raw: size 4, 4 bytes of data
        b.extend([1, 9, 0xa, 0xb, 0xc]); // branch stack: nr, hw_idx, (from, to, flags)
        b.extend([16, 0, 0, 16]); // stack: size, 16 bytes, dyn_size
        b.extend([(7u64 << 32) | 300, 0x42]); // weight struct, data_src
        let body: Vec<u8> = b.iter().flat_map(|w| w.to_le_bytes()).collect();
        let s = parse(&body, &l).unwrap();
        assert_eq!(
            (s.ip, s.weight, s.data_src),
            (Some(0x401000), Some(300), Some(0x42))
        );
    }
}
