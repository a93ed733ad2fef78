//! Writing a recording. Records are batched into 64 KiB writes; whatever reached the file
//! when laser dies is readable up to the last whole record, so there is nothing to repair.

use std::io::Write;

use super::codec::{encode_event, encode_footer};
use super::header::{self, TraceHeader};
use super::{TraceError, TraceFooter, END_MAGIC};
use crate::event::{Event, StreamStats};

/// Flush to the underlying writer once this much is buffered.
const BATCH: usize = 64 * 1024;

/// Writes a recording to `W` (no need to wrap it in a `BufWriter`: this batches).
///
/// Dropping a `Writer` without [`Writer::finish`] (an error path, Ctrl-C handling) still
/// pushes the buffered records out, best effort: the file then reads as truncated, with
/// every event written so far.
pub struct Writer<W: Write> {
    /// `None` only after `finish` has taken it back.
    out: Option<W>,
    buf: Vec<u8>,
    /// Bytes already handed to `out`.
    written: u64,
    stats: StreamStats,
    /// A write to `out` failed: it may hold part of a batch, and appending more would put
    /// records after a torn one. Everything after the failure is refused.
    failed: bool,
}

impl<W: Write> Writer<W> {
    /// Writes the file header immediately, so even a recording killed before its first
    /// sample says what it was.
    pub fn new(mut out: W, header: &TraceHeader) -> Result<Self, TraceError> {
        let head = header::encode(header)?;
        out.write_all(&head)?;
        out.flush()?;
        Ok(Writer {
            out: Some(out),
            buf: Vec::with_capacity(BATCH + 4096),
            written: head.len() as u64,
            stats: StreamStats::default(),
            failed: false,
        })
    }

    /// Appends one event.
    pub fn write(&mut self, e: &Event) -> Result<(), TraceError> {
        if self.failed {
            return Err(self.refused());
        }
        let mark = self.buf.len();
        if let Err(err) = encode_event(e, &mut self.buf) {
            // Leave no half-encoded frame behind.
            self.buf.truncate(mark);
            return Err(err);
        }
        self.stats.account(e);
        if self.buf.len() >= BATCH {
            self.flush_buf()?;
        }
        Ok(())
    }

    /// What has been written so far.
    pub fn stats(&self) -> StreamStats {
        self.stats
    }

    /// The footer for what has been written, given the run's duration.
    pub fn footer(&self, duration_ns: u64) -> TraceFooter {
        TraceFooter {
            stats: self.stats,
            duration_ns,
        }
    }

    /// Pushes buffered records to the underlying writer and flushes it (e.g. once a second,
    /// so a killed laser loses at most that much).
    pub fn flush(&mut self) -> Result<(), TraceError> {
        self.flush_buf()?;
        if let Some(out) = self.out.as_mut() {
            if let Err(e) = out.flush() {
                self.failed = true;
                return Err(e.into());
            }
        }
        Ok(())
    }

    fn refused(&self) -> TraceError {
        TraceError::WriterFailed {
            offset: self.written,
        }
    }

    fn flush_buf(&mut self) -> Result<(), TraceError> {
        if self.failed {
            return Err(self.refused());
        }
        if self.buf.is_empty() {
            return Ok(());
        }
        let Some(out) = self.out.as_mut() else {
            return Err(self.refused());
        };
        if let Err(e) = out.write_all(&self.buf) {
            self.failed = true;
            return Err(e.into());
        }
        self.written += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }

    /// Writes the footer and end marker and returns the underlying writer. `footer.stats.
    /// records` must equal the number of events written (use [`Writer::footer`]); the reader
    /// uses it to detect records lost from the middle of a file.
    pub fn finish(mut self, footer: TraceFooter) -> Result<W, TraceError> {
        if footer.stats.records != self.stats.records {
            return Err(TraceError::FooterMismatch {
                footer: footer.stats.records,
                written: self.stats.records,
            });
        }
        let footer_offset = self.written + self.buf.len() as u64;
        encode_footer(&footer, &mut self.buf)?;
        self.buf.extend_from_slice(&footer_offset.to_le_bytes());
        self.buf.extend_from_slice(&END_MAGIC);
        self.flush()?;
        self.out.take().ok_or(TraceError::WriterFailed {
            offset: self.written,
        })
    }
}

impl<W: Write> Drop for Writer<W> {
    fn drop(&mut self) {
        // Best effort: an error here has nowhere to go, and the file reads as truncated
        // either way.
        let _ = self.flush();
    }
}
