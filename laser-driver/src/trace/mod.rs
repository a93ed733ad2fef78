//! The recording file (`laser record -o run.laser`, `laser report run.laser`): the `trace`
//! backend. A recording replays through exactly the code a live run uses, so it stores the
//! [`Event`](crate::Event) stream losslessly, plus what the analysis needs to run on another
//! machine (maps, build-ids, CPU model, the attrs used).
//!
//! The byte layout is specified in `laser-driver/TRACE_FORMAT.md`. In short:
//!
//! ```text
//!  magic, version, hdr_len │ tagged header fields │ crc     file head: what was recorded, where
//!  kind │ len │ payload │ crc                              one frame per Event
//!  kind │ len │ payload │ crc                              …
//!  0xff │ len │ totals  │ crc                              footer
//!  footer offset │ "LASEREND"                             trailer
//! ```
//!
//! Every record carries its own length and CRC-32, so a file cut off at any byte (laser killed,
//! disk full) reads cleanly up to the last whole record, and a flipped byte is detected rather
//! than turned into an event that never happened.

mod codec;
mod cursor;
mod error;
mod header;
mod reader;
mod sample;
mod stream;
mod writer;

pub use error::TraceError;
pub use header::{PerfAttr, TraceHeader};
pub use reader::Reader;
pub use stream::StreamReader;
pub use writer::Writer;

use crate::event::StreamStats;

/// First 8 bytes of every recording. Like PNG's signature: a high byte and a CR-LF pair so a
/// file mangled by a text-mode transfer is recognized as such, not misread.
pub const MAGIC: [u8; 8] = *b"\x89LASER\r\n";

/// Last 8 bytes of a completely written recording (after the footer offset).
pub const END_MAGIC: [u8; 8] = *b"LASEREND";

/// Format version this laser writes and the newest it reads.
pub const VERSION: u16 = 1;

/// Upper bound on one record's payload. Real records are < 8 KiB (an mmap path is at most
/// `PATH_MAX`); a length field beyond this is corruption, not a record to allocate for.
pub const MAX_RECORD_LEN: u32 = 1 << 20;

/// Upper bound on the header's TLV area (maps text of a big process is ~1 MiB).
pub const MAX_HEADER_LEN: u32 = 64 << 20;

/// Totals written at the end of a complete recording.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceFooter {
    /// What the writer wrote (`records` must equal the number of records in the file).
    pub stats: StreamStats,
    /// Wall-clock length of the recorded run, nanoseconds.
    pub duration_ns: u64,
}

/// How a read ended. A consumer must surface anything but `Complete`: a run whose recording
/// was cut short says so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndState {
    /// Footer and end marker present and consistent.
    Complete { footer: TraceFooter },
    /// The file ends inside the record starting at `offset` (or right before the footer):
    /// every event before `offset` was read; the footer is missing.
    Truncated { offset: u64 },
    /// The record at `offset` fails its checksum or does not decode; reading stopped there.
    Corrupt { offset: u64, why: String },
}

impl EndState {
    pub fn is_complete(&self) -> bool {
        matches!(self, EndState::Complete { .. })
    }
}

/// What the CLI prints (as a warning unless complete).
impl std::fmt::Display for EndState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EndState::Complete { footer } => write!(
                f,
                "complete: {} records, {} samples, {} lost, {} throttles",
                footer.stats.records,
                footer.stats.samples,
                footer.stats.lost,
                footer.stats.throttles
            ),
            EndState::Truncated { offset } => write!(
                f,
                "recording truncated at byte {offset} (laser stopped early or the disk filled): \
                 every record before it was read, the footer with totals is missing"
            ),
            EndState::Corrupt { offset, why } => write!(
                f,
                "recording damaged at byte {offset}: {why}; every record before it was read"
            ),
        }
    }
}

/// Record kind bytes (first byte of each frame).
pub(crate) mod kind {
    pub const SAMPLE: u8 = 1;
    pub const MMAP: u8 = 2;
    pub const COMM: u8 = 3;
    pub const FORK: u8 = 4;
    pub const EXIT: u8 = 5;
    pub const LOST: u8 = 6;
    pub const THROTTLE: u8 = 7;
    pub const WATCH_SET: u8 = 8;
    pub const WATCH_COST: u8 = 9;
    pub const FOOTER: u8 = 0xff;
}

/// Bytes before a record's payload: kind u8 + len u32.
pub(crate) const FRAME_HEAD: usize = 5;
/// Bytes after a record's payload: crc32.
pub(crate) const FRAME_TAIL: usize = 4;
/// Fixed file header: magic + version + reserved + header length.
pub(crate) const FILE_HEAD: usize = 16;
/// Trailer after the footer record: footer offset u64 + END_MAGIC.
pub(crate) const TRAILER_LEN: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_states_explain_themselves_with_numbers() {
        let t = EndState::Truncated { offset: 4096 }.to_string();
        assert!(t.starts_with("recording truncated at byte 4096"), "{t}");
        let c = EndState::Corrupt {
            offset: 77,
            why: "checksum mismatch".into(),
        }
        .to_string();
        assert!(c.contains("byte 77: checksum mismatch"), "{c}");
        let mut footer = TraceFooter::default();
        footer.stats.lost = 5;
        let k = EndState::Complete { footer }.to_string();
        assert!(k.contains("5 lost"), "{k}");
    }
}
