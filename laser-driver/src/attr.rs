//! `perf_event_attr` builders for every event laser opens, and their byte form (stored in
//! recording headers and fed back to the record parser, so the parser and the kernel read the
//! very same attr).
//!
//! All events that share a ring buffer use one `sample_type` ([`SAMPLE_TYPE`]), so one
//! `RecordParseInfo` parses every record in it, and `PERF_SAMPLE_IDENTIFIER` tells which event
//! (cpu-clock, or which watchpoint slot) wrote a sample. Inherited child events report their
//! parent's id, so the id map needs only the events laser opened itself.

use linux_perf_event_reader::{Endianness, PerfEventAttr, RecordParseInfo};
use perf_event_open_sys::bindings as b;

use crate::event::SOFT_REGS_MASK;

/// IDENTIFIER | IP | TID | TIME | ADDR | CPU | PERIOD | REGS_USER | STACK_USER. `ADDR` is 0
/// for cpu-clock and the watched address for breakpoints; regs on watch hits let the detector
/// see the registers after the access too. The top of the user stack
/// ([`STACK_USER_BYTES`] for cpu-clock samples, [`WATCH_STACK_USER_BYTES`] for watchpoint
/// hits) is scanned by the decoder for return addresses (`Sample::callers`) and not kept.
pub const SAMPLE_TYPE: u64 = (b::PERF_SAMPLE_IDENTIFIER
    | b::PERF_SAMPLE_IP
    | b::PERF_SAMPLE_TID
    | b::PERF_SAMPLE_TIME
    | b::PERF_SAMPLE_ADDR
    | b::PERF_SAMPLE_CPU
    | b::PERF_SAMPLE_PERIOD
    | b::PERF_SAMPLE_REGS_USER
    | b::PERF_SAMPLE_STACK_USER) as u64;

/// Bytes of user stack copied into each sample, from the stack pointer up: enough for a few
/// library frames (glibc's mutex lock and its futex wait keep ~100 bytes each) above the
/// program's call site. The kernel copies them with the sample (≈ 0.1 µs); a multiple of 8.
pub const STACK_USER_BYTES: u32 = 512;

/// Bytes of user stack copied into each watchpoint hit: enough for the program's call site
/// above a short library frame. glibc's `rand()` takes its lock in `__random` (0x18 bytes of
/// locals) called from `rand` (8), so the program's return address is 0x28 bytes up at the
/// `lock cmpxchg`, 0x30 in `__lll_lock_wait_private` and `__random_r`; `pthread_mutex_lock`
/// has it 0x18 up. Without it a lock that only code windows saw had no call site (rand_lock's
/// `rand()` line missing in 2 of 20 runs, forty-seventh session): samples land in such a
/// function about once a second. Each hit's record grows from 224 to 296 bytes, which
/// [`crate::watch`]'s thread rings are sized for.
pub const WATCH_STACK_USER_BYTES: u32 = 64;

/// The largest `wakeup_events` that means what it says. The kernel compares the ring's sample
/// count against the field read as a signed `int` (`perf_output_sample`), so any value above
/// `i32::MAX` is negative and wakes the reader on every sample: the irq_work behind each
/// wake-up doubled a watchpoint hit's cost here (13 µs without, 27 µs with, measured on this
/// KVM guest; sixteenth session).
pub const MAX_WAKEUP_EVENTS: u32 = i32::MAX as u32;

/// Where a watchpoint points while it is not armed. Page 0 is never mapped in a user process,
/// is 8-aligned (valid for every length) and lies in user space (no privilege needed).
pub const PARKED_ADDR: u64 = 0x1000;

/// What a watchpoint traps on. x86 debug registers cannot trap reads alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WatchKind {
    /// Stores to the watched bytes.
    Write,
    /// Loads and stores of the watched bytes.
    ReadWrite,
    /// Every execution of the instruction at the watched address (a code window): the trap
    /// comes before the instruction runs, so the sample's registers give the address it is
    /// about to access, whatever data that is.
    Exec,
}

/// How an event is bound to the target: the launch (per CPU, inherited, enabled at exec)
/// or attach (per thread, enabled now) shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binding {
    Launch,
    Attach,
}

fn base(binding: Binding) -> b::perf_event_attr {
    let mut a = b::perf_event_attr {
        size: std::mem::size_of::<b::perf_event_attr>() as u32,
        sample_type: SAMPLE_TYPE,
        sample_regs_user: SOFT_REGS_MASK,
        sample_stack_user: STACK_USER_BYTES,
        ..Default::default()
    };
    a.set_exclude_kernel(1);
    a.set_exclude_hv(1);
    a.set_sample_id_all(1);
    // Timestamps in CLOCK_MONOTONIC (what `Event::time` documents), so they line up with
    // laser's own clock (rates, repair timing) rather than the kernel's sched_clock.
    a.set_use_clockid(1);
    a.clockid = libc::CLOCK_MONOTONIC;
    match binding {
        Binding::Launch => {
            // Counting starts at execve of the target, not in laser's forked child.
            a.set_disabled(1);
            a.set_enable_on_exec(1);
            a.set_inherit(1);
        }
        Binding::Attach => {}
    }
    a
}

/// Asks for the side-band records the detector needs to follow the target: new mappings
/// (dlopen, JIT), thread names, exec, thread creation and exit.
fn set_tracking(a: &mut b::perf_event_attr, wakeup_bytes: u32) {
    a.set_mmap(1);
    a.set_mmap2(1);
    a.set_mmap_data(1);
    a.set_comm(1);
    a.set_comm_exec(1);
    a.set_task(1);
    // Wake the reader when a quarter of the buffer is full rather than per record.
    a.set_watermark(1);
    a.__bindgen_anon_2.wakeup_watermark = wakeup_bytes;
}

/// `cpu-clock` sampling at `freq` Hz with user registers: the soft backend, and the owner of
/// the ring buffer (tracking records ride on it).
pub fn soft(binding: Binding, freq: u64, wakeup_bytes: u32) -> b::perf_event_attr {
    let mut a = base(binding);
    a.type_ = b::PERF_TYPE_SOFTWARE;
    a.config = b::PERF_COUNT_SW_CPU_CLOCK as u64;
    a.set_freq(1);
    a.__bindgen_anon_1.sample_freq = freq;
    set_tracking(&mut a, wakeup_bytes);
    a
}

/// `cpu-clock` sampling at `freq` Hz of everything that runs on one CPU (opened with pid -1),
/// disabled until laser enables it: the launch sampler with `Config::sample_cpus`, where the
/// machine allows CPU-wide events. A task's own cpu-clock event starts its timer whenever the task is switched in and
/// cancels it when it is switched out, and on a virtual machine each of those reprograms the
/// timer through a VM exit: two threads meeting at a barrier (one switch per round of
/// ~35 µs) took 3.5–10 µs more per round with one each, median 7.3 µs
/// (`scripts/switch-cost --event cpu-clock`, sixteenth session). A CPU's timer runs on
/// whatever runs; samples of other processes are dropped by the reader.
/// No side-band records: the leader of its CPU ([`tracking_cpu_wide`]) carries those, and
/// this event writes into its ring.
pub fn soft_cpu_wide(freq: u64) -> b::perf_event_attr {
    let mut a = base(Binding::Attach);
    a.type_ = b::PERF_TYPE_SOFTWARE;
    a.config = b::PERF_COUNT_SW_CPU_CLOCK as u64;
    a.set_freq(1);
    a.__bindgen_anon_1.sample_freq = freq;
    a.set_disabled(1);
    a
}

/// The frequency CPU `cpu`'s whole-CPU sampler runs at: `freq` on CPU 0, up to 10% lower on
/// the others (the golden-ratio fraction of `cpu` picks where in that range), so no two
/// CPUs' timers keep one phase. Opened together at one frequency, the CPUs' hrtimers fired
/// within 0.1 ms of each other for a whole run (every sample of a recorded Phoenix
/// linear_regression -O0 run, both CPUs): each sample caught both threads at the same
/// instant, the same few instructions of the loop came up run after run, and in some runs
/// never the reading thread's loads of the contended line (7 of 30 runs missed it where one
/// timer per thread, whose phases are the threads' own, missed 0 of 20). With periods
/// that differ by ~6%, the CPUs' relative phase sweeps the whole period every ~16 samples.
pub fn cpu_wide_frequency(freq: u64, cpu: u32) -> u64 {
    // frac(cpu * 0.618…) in thousandths, scaled to 0–100 (permille of extra period).
    let golden = (u64::from(cpu) * 618_034) % 1_000_000;
    let extra_permille = golden / 10_000;
    (freq * 1000 / (1000 + extra_permille)).max(1)
}

/// A counting (never sampling) cpu-clock event that carries the tracking records and owns
/// the ring buffer when the session does not sample (watch-only sessions). (The watchpoint
/// duty cycle reads the target's CPU time from its process clock, not from this count:
/// reading an inherited counter interrupts every CPU the target runs on.)
pub fn tracking(binding: Binding, wakeup_bytes: u32) -> b::perf_event_attr {
    let mut a = base(binding);
    a.type_ = b::PERF_TYPE_SOFTWARE;
    a.config = b::PERF_COUNT_SW_CPU_CLOCK as u64;
    a.__bindgen_anon_1.sample_period = 0;
    set_tracking(&mut a, wakeup_bytes);
    a
}

/// The tracking records of everything that runs on one CPU (opened with pid -1), on a dummy
/// event that counts nothing: the leader of a launch that samples whole CPUs, enabled by
/// laser before the target's exec (the records of other processes are dropped by the
/// reader). Bound to no task, so a launch that samples whole CPUs opens no task event at
/// all: the first task event after a second without one turns the kernel's context-switch
/// hooks on (`perf_sched_events`, a code patch and an RCU grace period: 5–19 ms here before
/// the program could start), none is copied into each thread the program creates, and no
/// context switch of the program runs the hooks.
pub fn tracking_cpu_wide(wakeup_bytes: u32) -> b::perf_event_attr {
    let mut a = base(Binding::Attach);
    a.type_ = b::PERF_TYPE_SOFTWARE;
    a.config = b::PERF_COUNT_SW_DUMMY as u64;
    a.__bindgen_anon_1.sample_period = 0;
    a.set_disabled(1);
    set_tracking(&mut a, wakeup_bytes);
    a
}

/// The owner of one thread's watch ring (launch): a dummy software event on that thread
/// alone (`cpu = -1`), which counts nothing and writes no record of its own; the thread's
/// window events (`cpu = -1` too) write into its ring. The kernel lets an event write into
/// another's ring only on the same CPU, or, for `cpu = -1`, of the same thread: without a
/// ring per thread, a window needs one event per slot *and CPU* on every thread, each of
/// them an open, an enable and a close that interrupt the thread's CPU. Same sample layout
/// as [`watch`], so one parser reads every record (lost-record trailers included).
pub fn watch_ring() -> b::perf_event_attr {
    let mut a = base(Binding::Attach);
    a.type_ = b::PERF_TYPE_SOFTWARE;
    a.config = b::PERF_COUNT_SW_DUMMY as u64;
    a.__bindgen_anon_1.sample_period = 0;
    a.sample_stack_user = WATCH_STACK_USER_BYTES;
    a
}

/// A hardware data watchpoint. Opened disabled (and, for launch, without enable_on_exec) at
/// [`PARKED_ADDR`]; `arm` re-points it with `PERF_EVENT_IOC_MODIFY_ATTRIBUTES`, which demands
/// that every field except bp_addr/bp_type/bp_len/disabled equal the opened attr — so
/// [`repoint`] starts from the attr returned here.
///
/// Not inherited, launch included: the kernel caps a window's traps itself only on an event
/// that is not (`PERF_EVENT_IOC_REFRESH`, see `watch::Watcher::open_slot`), and a launch
/// window opens events on threads created while it counts as their creation is read. (An
/// inherited window, `Watcher::set_inherit`, sets the bit on the returned attr.)
pub fn watch(binding: Binding, wakeup_events: u32) -> b::perf_event_attr {
    let mut a = base(binding);
    a.type_ = b::PERF_TYPE_BREAKPOINT;
    a.set_disabled(1);
    a.set_enable_on_exec(0);
    a.set_inherit(0);
    a.__bindgen_anon_1.sample_period = 1;
    a.bp_type = b::HW_BREAKPOINT_RW;
    a.__bindgen_anon_3.bp_addr = PARKED_ADDR;
    a.__bindgen_anon_4.bp_len = b::HW_BREAKPOINT_LEN_8 as u64;
    a.__bindgen_anon_2.wakeup_events = wakeup_events.clamp(1, MAX_WAKEUP_EVENTS);
    // A short stack copy, not the samples' 512 bytes: a burst of hits the reader is late for
    // must fit the ring (an attached thread's ring is 128 KiB; 512 bytes more per hit would
    // make a 500-hit burst overflow it, 72 more leave room for ~440).
    a.sample_stack_user = WATCH_STACK_USER_BYTES;
    a
}

/// The attr a MODIFY_ATTRIBUTES ioctl needs to point `opened` (from [`watch`]) at a new
/// address, enabled (`disabled = false`) or not.
pub fn repoint(
    opened: &b::perf_event_attr,
    addr: u64,
    len: u8,
    kind: WatchKind,
    disabled: bool,
) -> b::perf_event_attr {
    let mut a = *opened;
    a.__bindgen_anon_3.bp_addr = addr;
    a.__bindgen_anon_4.bp_len = len as u64;
    a.bp_type = match kind {
        WatchKind::Write => b::HW_BREAKPOINT_W,
        WatchKind::ReadWrite => b::HW_BREAKPOINT_RW,
        WatchKind::Exec => {
            // The kernel takes exactly sizeof(long) for an x86 instruction breakpoint.
            a.__bindgen_anon_4.bp_len = std::mem::size_of::<u64>() as u64;
            b::HW_BREAKPOINT_X
        }
    };
    a.set_disabled(disabled as u64);
    a
}

/// IDENTIFIER | IP | TID | TIME | ADDR | CPU | PERIOD | WEIGHT | DATA_SRC: what a precise
/// memory sample (PEBS load latency / store, IBS op) carries — the layout `perf mem record`
/// asks for, minus callchains. No registers or stack: the hardware gives the data address and
/// the precise IP, so nothing has to be recomputed. (`PHYS_ADDR` is left out: the kernel
/// fills it only for CAP_SYS_ADMIN.) `WEIGHT` is the load latency in cycles, not a count.
pub const MEM_SAMPLE_TYPE: u64 = (b::PERF_SAMPLE_IDENTIFIER
    | b::PERF_SAMPLE_IP
    | b::PERF_SAMPLE_TID
    | b::PERF_SAMPLE_TIME
    | b::PERF_SAMPLE_ADDR
    | b::PERF_SAMPLE_CPU
    | b::PERF_SAMPLE_PERIOD
    | b::PERF_SAMPLE_WEIGHT
    | b::PERF_SAMPLE_DATA_SRC) as u64;

/// A raw PMU event (`type_` from sysfs, config words from the PMU's formats) sampling every
/// `period`-th occurrence with [`MEM_SAMPLE_TYPE`]; `period` 0 makes a counting event (the
/// `mem-loads-aux` group leader). `precise_ip` is set by the caller, which tries 3 down.
pub fn memory(
    binding: Binding,
    type_: u32,
    config: u64,
    config1: u64,
    config2: u64,
    period: u64,
) -> b::perf_event_attr {
    let mut a = base(binding);
    a.type_ = type_;
    a.config = config;
    a.__bindgen_anon_3.config1 = config1;
    a.__bindgen_anon_4.config2 = config2;
    a.sample_type = if period == 0 { 0 } else { MEM_SAMPLE_TYPE };
    a.sample_regs_user = 0;
    a.sample_stack_user = 0;
    a.__bindgen_anon_1.sample_period = period;
    a
}

/// The attr's bytes as the kernel reads them (`size` bytes, native endian).
pub fn to_bytes(a: &b::perf_event_attr) -> Vec<u8> {
    let n = std::mem::size_of::<b::perf_event_attr>();
    // SAFETY: perf_event_attr is a plain-old-data #[repr(C)] struct (integers, unions of
    // integers, bitfield bytes) with no padding holes the kernel does not also define; it is
    // initialised from Default (all zero) so every byte is initialised.
    let bytes = unsafe { std::slice::from_raw_parts(a as *const _ as *const u8, n) };
    bytes.to_vec()
}

/// Parse info for records written by events with this attr (all of laser's events share
/// [`SAMPLE_TYPE`], so any of them gives the same layout).
pub fn parse_info(attr_bytes: &[u8]) -> Result<RecordParseInfo, std::io::Error> {
    let (attr, _) = PerfEventAttr::parse::<_, byteorder::LittleEndian>(attr_bytes)?;
    Ok(RecordParseInfo::new(&attr, Endianness::LittleEndian))
}

/// A one-line human description of an attr, for recording headers and `--verbose`.
pub fn describe(a: &b::perf_event_attr) -> String {
    // SAFETY: reading a u64 union member; every member of these unions is a plain u64 (or
    // u32 at the same offset) so any bit pattern is a valid value.
    let (period_or_freq, bp_len) =
        unsafe { (a.__bindgen_anon_1.sample_period, a.__bindgen_anon_4.bp_len) };
    let what = match (a.type_, a.config as u32) {
        (b::PERF_TYPE_SOFTWARE, b::PERF_COUNT_SW_CPU_CLOCK) => "cpu-clock".to_string(),
        (b::PERF_TYPE_SOFTWARE, b::PERF_COUNT_SW_DUMMY) => "dummy".to_string(),
        (b::PERF_TYPE_BREAKPOINT, _) => format!(
            "breakpoint {}{} len {bp_len}",
            if a.bp_type & b::HW_BREAKPOINT_R != 0 {
                "r"
            } else {
                ""
            },
            if a.bp_type & b::HW_BREAKPOINT_W != 0 {
                "w"
            } else {
                ""
            },
        ),
        (t, _) => {
            // SAFETY: config1/config2 share their unions with u64 bp fields; any bits are valid.
            let (c1, c2) = unsafe { (a.__bindgen_anon_3.config1, a.__bindgen_anon_4.config2) };
            format!(
                "type {t} config {:#x} config1 {c1:#x} config2 {c2:#x} precise_ip {}",
                a.config,
                a.precise_ip()
            )
        }
    };
    let rate = if a.freq() != 0 {
        format!("freq {period_or_freq} Hz")
    } else if period_or_freq == 0 {
        "counting only".to_string()
    } else {
        format!("period {period_or_freq}")
    };
    format!(
        "{what}, {rate}, sample_type {:#x}, regs_user {:#x}, inherit {}, enable_on_exec {}, \
         exclude_kernel {}, tracking {}",
        a.sample_type,
        a.sample_regs_user,
        a.inherit(),
        a.enable_on_exec(),
        a.exclude_kernel(),
        a.task()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use linux_perf_event_reader::SampleFormat;

    #[test]
    fn whole_cpu_samplers_run_at_frequencies_that_keep_no_common_phase() {
        assert_eq!(cpu_wide_frequency(500, 0), 500);
        let f: Vec<u64> = (0..16).map(|c| cpu_wide_frequency(500, c)).collect();
        // Never above the requested rate (the kernel's maximum), at most 10% below it.
        assert!(f.iter().all(|&x| (450..=500).contains(&x)), "{f:?}");
        // The two CPUs of a small machine differ by several percent: their relative phase
        // moves by that share of a period every sample.
        assert!(f[0] - f[1] >= 20, "{f:?}");
        // Eight CPUs: eight different periods.
        let mut eight = f[..8].to_vec();
        eight.sort_unstable();
        eight.dedup();
        assert_eq!(eight.len(), 8, "{f:?}");
        assert_eq!(cpu_wide_frequency(1, 3), 1);
    }

    #[test]
    fn soft_attr_round_trips_through_the_parser() {
        let a = soft(Binding::Launch, 999, 4096);
        let bytes = to_bytes(&a);
        assert_eq!(bytes.len(), a.size as usize);
        let info = parse_info(&bytes).unwrap();
        assert!(info.sample_format.contains(SampleFormat::REGS_USER));
        assert!(info.sample_format.contains(SampleFormat::IDENTIFIER));
        assert!(info.sample_format.contains(SampleFormat::STACK_USER));
        assert_eq!(a.sample_stack_user, STACK_USER_BYTES);
        assert_eq!(info.sample_regs_user, SOFT_REGS_MASK);
        assert_eq!(info.user_regs_count as u32, SOFT_REGS_MASK.count_ones());
        assert_eq!(a.inherit(), 1);
        assert_eq!(a.enable_on_exec(), 1);
        assert!(describe(&a).contains("cpu-clock, freq 999 Hz"));
    }

    #[test]
    fn repoint_changes_only_breakpoint_fields() {
        let w = watch(Binding::Launch, 8);
        let r = repoint(&w, 0x601040, 4, WatchKind::Write, false);
        let (wb, rb) = (to_bytes(&w), to_bytes(&r));
        let diff: Vec<usize> = (0..wb.len()).filter(|&i| wb[i] != rb[i]).collect();
        // bp_type (offset 52), bp_addr (56), bp_len (64), and the disabled bit (flags, 40).
        assert!(
            diff.iter()
                .all(|&i| i == 40 || (52..56).contains(&i) || (56..72).contains(&i)),
            "{diff:?}"
        );
        assert_eq!(r.disabled(), 0);
        assert_eq!(
            (w.sample_type, w.sample_stack_user),
            (SAMPLE_TYPE, WATCH_STACK_USER_BYTES)
        );
        assert_eq!(w.disabled(), 1);
        assert_eq!(w.inherit(), 0, "REFRESH refuses inherited events");
        assert!(describe(&r).contains("breakpoint w len 4"));
    }
}
