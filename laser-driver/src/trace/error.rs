//! Errors of the recording file. Every message carries the byte offset and the numbers
//! involved, so a user can tell "cut off" from "overwritten" from "not ours".

use super::{MAGIC, VERSION};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    #[error("empty file (0 bytes): not a laser recording")]
    Empty,

    #[error(
        "not a laser recording (magic {}, expected {})",
        hex(found),
        hex(&MAGIC)
    )]
    NotLaser { found: Vec<u8> },

    #[error("version {found} is newer than this laser ({VERSION}); upgrade laser to read it")]
    NewerVersion { found: u16 },

    #[error("version {found} is not a valid laser recording version")]
    BadVersion { found: u16 },

    #[error("file ends at byte {len} inside the header, which needs {need} bytes")]
    TruncatedHeader { len: u64, need: u64 },

    #[error("header length {len} at byte 12 exceeds the limit of {max} bytes")]
    HeaderTooLarge { len: u32, max: u32 },

    #[error("header: checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    HeaderChecksum { stored: u32, computed: u32 },

    #[error("header field at byte {offset}: {why}")]
    BadHeader { offset: u64, why: String },

    #[error("record at byte {offset}: checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum {
        offset: u64,
        stored: u32,
        computed: u32,
    },

    #[error("record at byte {offset}: length {len} exceeds the limit of {max} bytes")]
    RecordTooLarge { offset: u64, len: u32, max: u32 },

    #[error("record at byte {offset} (kind {kind}): {why}")]
    BadRecord { offset: u64, kind: u8, why: String },

    #[error("footer at byte {offset}: {why}")]
    BadFooter { offset: u64, why: String },

    #[error("footer counts {footer} records but {written} were written")]
    FooterMismatch { footer: u64, written: u64 },

    #[error("a field of {len} bytes does not fit the format's {max}-byte limit")]
    FieldTooLarge { len: usize, max: usize },

    #[error("an earlier write to the recording failed; it ends at or after byte {offset}")]
    WriterFailed { offset: u64 },

    #[error("I/O error on the recording: {0}")]
    Io(#[from] std::io::Error),
}

impl TraceError {
    /// The byte offset the error points at, when it points at one.
    pub fn offset(&self) -> Option<u64> {
        match self {
            TraceError::BadHeader { offset, .. }
            | TraceError::Checksum { offset, .. }
            | TraceError::RecordTooLarge { offset, .. }
            | TraceError::BadRecord { offset, .. }
            | TraceError::BadFooter { offset, .. } => Some(*offset),
            _ => None,
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
