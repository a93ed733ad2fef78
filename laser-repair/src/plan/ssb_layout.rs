//! The SSB runtime's shape: configuration, the data layout shared by the generated helpers and
//! the inline fast path, and the addresses a plan hands to `tracee`. See `ssb_runtime.rs` for
//! the picture of the code-cache mapping.

/// Sizes of the runtime's tables. `thread_slots` must be a power of two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeConfig {
    pub thread_slots: u32,
    pub log_capacity: u32,
    /// Flush after this many back-edges of the region, so a spinning reader elsewhere sees
    /// this thread's stores within bounded time.
    pub backedges_per_flush: u32,
    /// Transaction attempts before an RTM flush falls back to the in-order FIFO replay.
    pub rtm_retries: u32,
    /// Serialise FIFO replays across threads with a best-effort lock (`flush_lock_offset`).
    /// On by default: live on linear_regression (scripts/bench (c), 5-6 interleaved runs
    /// each) the repaired run took a median ~1.0 s with it and ~1.5 s without (replays of
    /// both threads interleaving on the contended line bounce it on every store). The
    /// in-process plan_lreg fixture, whose contention is far milder, shows no difference.
    pub flush_lock: bool,
    /// Test-only mutation: merge a store into *any* matching entry, not just the tail. This
    /// breaks TSO (MP-like reorderings); it exists so the litmus tests can show they detect it.
    #[doc(hidden)]
    pub merge_any_entry_broken: bool,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            thread_slots: 128,
            log_capacity: 1024,
            backedges_per_flush: 256,
            rtm_retries: 4,
            flush_lock: true,
            merge_any_entry_broken: false,
        }
    }
}

/// Which flush path the runtime chose (read from the mode word at run time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SsbMode {
    /// No thread has claimed a slot yet, so CPUID has not been probed.
    NotYetProbed,
    Fifo,
    Rtm,
}

impl SsbMode {
    pub fn from_word(w: u64) -> SsbMode {
        match w {
            1 => SsbMode::Fifo,
            2 => SsbMode::Rtm,
            _ => SsbMode::NotYetProbed,
        }
    }
}

pub const MODE_OFF: u64 = 0;
pub const NO_SLOT_OFF: u64 = 8;
/// Kill switch: laser writes non-zero here (a plain /proc/PID/mem write, no stop) to send
/// threads to the uninstrumented copy of the region: `ssb_enter` stops loading states and
/// the every-N back-edge flush leaves for the copy's loop header. Used when a trial shows
/// the repair is slower than native, so the slow code stops before the undo's pause.
pub const KILL_OFF: u64 = 16;
pub const KEYS_OFF: u64 = 64;
pub const ST_COUNT: i32 = 0;
/// Back-edges left before a forced flush (`sub 1` per back-edge, flush on borrow; a flush
/// sets `backedges_per_flush - 1`).
pub const ST_BACKEDGES: i32 = 8;
pub const ST_FLUSHES: i32 = 16;
pub const ST_STORES: i32 = 24;
/// Bitmap of the 8-byte words (address bits 3..9) any log entry touches: a load whose words
/// are all clear cannot overlap the log and reads memory directly (the inline fast path).
pub const ST_SUMMARY: i32 = 56;
/// The state register's value from before the region (the entry trampoline saves it, every
/// exit restores it: callers may rely on any register the function does not write, e.g.
/// with gcc's `-fipa-ra`). It sits in the sentinel entry's address field, which is never
/// compared: the sentinel's size never matches.
pub const ST_SAVED_RS: i32 = 32;
/// Offset 32..64 doubles as a sentinel entry "before" entry 0: its size field (offset 40)
/// stays 0, so the inline tail check `entries[count-1]` needs no `count == 0` test.
pub const ST_SENTINEL_SIZE: i32 = 40;
/// `log_capacity * 32`, written whenever a thread looks its state up: the inline append's
/// bound. (It sits in the sentinel's value field, which is never read: the sentinel's size
/// never matches.)
pub const ST_LIMIT: i32 = 48;
pub const ST_ENTRIES: i32 = 64;
pub const ENTRY_SIZE: u64 = 32;
/// The byte-lane index that follows the log: 64 slots of 32 bytes
/// `{ lanes: [u8; 8], word, period, contested }`. Slot `w & 63` describes 8-byte word `w`
/// during flush period `period` (the flush counter): lane `j` holds `(i mod LANE_PERIOD) + 1`
/// for the youngest entry `i` touching byte `j` of the word, 0 for none, 0xff for unknown. `contested` is set
/// when the slot was taken over from another word in the same period (lanes then start
/// unknown); while it is clear, a word other than the owner has no entry at all this period.
/// Only consulted while the summary bit of `w & 63` is set: every append sets the bit and
/// claims the slot, and a flush clears the summary and starts a new period. A reader takes
/// the youngest entry with the lane's residue and checks its address and size (the lanes
/// alone cannot tell entries a period apart), so the log's capacity is not bounded by a byte.
pub const INDEX_SLOTS: u64 = 64;
/// Residues of entry indices kept in a lane (a power of two, below 0xff).
pub const LANE_PERIOD: u64 = 128;
/// Largest log the runtime accepts (entries): the log, index and saved registers of one
/// thread must stay within an i32 displacement, with room to spare.
pub const MAX_LOG_CAPACITY: u32 = 1 << 16;
pub const INDEX_SLOT_SIZE: u64 = 32;

/// Offset of the byte-lane index in a state block.
pub fn index_offset(cfg: &RuntimeConfig) -> i32 {
    ST_ENTRIES + (ENTRY_SIZE * u64::from(cfg.log_capacity)) as i32
}

/// Bytes of one thread's state block (a multiple of [`SCRATCH_ALIGN`], so every block, and
/// its scratch area, stays aligned).
pub fn state_size(cfg: &RuntimeConfig) -> u64 {
    // Slots and their shadow values, the iteration counter on its own line, the scratch area.
    scratch_offset(cfg) as u64 + SCRATCH_SIZE
}

/// Offset of the thread's iteration counter: loop back-edges taken in the rewritten region
/// (inline, fixed and helper paths; not in the uninstrumented copy), cumulative, never
/// reset. laser sums it over the slots from outside to measure a repair's progress rate.
pub fn iters_offset(cfg: &RuntimeConfig) -> i32 {
    fixed_slots_offset(cfg) + 16 * MAX_FIXED_SLOTS as i32
}

/// The scratch area of a state block: an SSE/AVX instruction whose memory operand goes
/// through the SSB (`wide.rs`) runs on this copy of its operand bytes. 32-aligned, so
/// `movaps`/`vmovdqa` and legacy-SSE ALU operands (which must be 16-aligned) never fault on it.
pub fn scratch_offset(cfg: &RuntimeConfig) -> i32 {
    // After the iteration counter's 64 bytes.
    let end = iters_offset(cfg) as u64 + 64;
    round_up(end, SCRATCH_ALIGN) as i32
}

/// Bytes of the scratch area: the widest operand (a `ymm`).
pub const SCRATCH_SIZE: u64 = 32;
pub const SCRATCH_ALIGN: u64 = 32;

/// Locations of a fixed-address region (`fixed.rs`) with a slot each.
pub const MAX_FIXED_SLOTS: u32 = 16;

/// The value of an empty fixed slot: odd, so it never equals a slot value `(i + 1) * 8`.
pub const FIXED_SLOT_EMPTY: i32 = 1;

/// Offset of the fixed-location slots in a state block: slot `s` holds `(i + 1) * 8` for
/// the youngest entry `i` of location `s` this flush period, or [`FIXED_SLOT_EMPTY`].
pub fn fixed_slots_offset(cfg: &RuntimeConfig) -> i32 {
    saved_regs_offset(cfg) + 8 * MAX_RESERVED as i32
}

/// Scratch registers a fast-path region may reserve besides the state register: registers
/// no region instruction mentions, saved here by the entry trampoline and restored at exits,
/// so accesses need no spills.
pub const MAX_RESERVED: usize = 4;

/// Offset of the reserved registers' saved values in a state block.
pub fn saved_regs_offset(cfg: &RuntimeConfig) -> i32 {
    index_offset(cfg) + (INDEX_SLOT_SIZE * INDEX_SLOTS) as i32
}

/// Addresses of everything the rewritten region and the tracee need.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeInfo {
    pub config: RuntimeConfig,
    pub data_addr: u64,
    pub data_len: u64,
    pub code_addr: u64,
    pub code_len: u64,
    /// `load[k]` / `store[k]` serve sizes 1, 2, 4, 8 for k = 0..4.
    pub load: [u64; 4],
    pub store: [u64; 4],
    pub flush: u64,
    pub backedge: u64,
    /// `ssb_enter` (entry trampolines): saves the state register and loads this thread's
    /// state, or sends a slot-less thread to the uninstrumented copy of the region.
    pub enter: u64,
    pub mode_addr: u64,
    pub no_slot_addr: u64,
    pub keys_addr: u64,
    pub states_addr: u64,
    pub state_size: u64,
}

impl RuntimeInfo {
    /// Address of slot `k`'s state block.
    pub fn state_addr(&self, k: u32) -> u64 {
        self.states_addr + u64::from(k) * self.state_size
    }

    /// Address of slot `k`'s iteration counter ([`iters_offset`]).
    pub fn iters_addr(&self, k: u32) -> u64 {
        self.state_addr(k) + iters_offset(&self.config) as u64
    }

    /// Address of the kill switch word ([`KILL_OFF`]).
    pub fn kill_addr(&self) -> u64 {
        self.data_addr + KILL_OFF
    }
}

pub(crate) fn size_index(size: u32) -> usize {
    match size {
        1 => 0,
        2 => 1,
        4 => 2,
        _ => 3,
    }
}

pub(crate) fn round_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// Data bytes the runtime needs at the start of the cache mapping.
pub fn data_len(cfg: &RuntimeConfig) -> u64 {
    let states = states_offset(cfg);
    let state_size = state_size(cfg);
    round_up(states + state_size * u64::from(cfg.thread_slots), 4096)
}

/// Offset of the flush lock: a word on its own cache line after the keys. A thread takes it
/// (best effort, bounded spin) around its FIFO replay, so two threads replaying into the
/// same contended line do not bounce it on every store; correctness never depends on it
/// (delaying a flush is allowed, and a thread that waits too long replays without it).
pub fn flush_lock_offset(cfg: &RuntimeConfig) -> u64 {
    round_up(KEYS_OFF + 8 * u64::from(cfg.thread_slots), 64)
}

/// Offset of the first state block.
pub fn states_offset(cfg: &RuntimeConfig) -> u64 {
    flush_lock_offset(cfg) + 64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scratch_area_is_32_aligned_and_inside_its_block() {
        for log_capacity in [1, 3, 64, 1024, MAX_LOG_CAPACITY] {
            let cfg = RuntimeConfig {
                log_capacity,
                ..RuntimeConfig::default()
            };
            let size = state_size(&cfg);
            let scratch = scratch_offset(&cfg) as u64;
            assert!(scratch + SCRATCH_SIZE <= size, "cap {log_capacity}");
            for k in 0..4u64 {
                // The cache mapping is page-aligned.
                let at = 0x7000_0000_0000 + states_offset(&cfg) + k * size + scratch;
                assert_eq!(at % SCRATCH_ALIGN, 0, "cap {log_capacity}, slot {k}");
            }
        }
    }
}
