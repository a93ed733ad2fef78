//! Reading a recording from bytes (the CLI memory-maps the file; tests pass fixtures).
//!
//! The reader never trusts the file: every frame is length-checked against what is left and
//! CRC-checked before its payload is decoded, so a cut-off file yields exactly the records
//! that were completely written, and a damaged one stops at the damage with an error that
//! names the byte offset. It never yields an event that was not written (up to CRC-32's
//! 2⁻³² chance per damaged record) and never panics.

use super::codec::{decode_event_into, decode_footer, is_known, split_frame, Frame};
use super::header::{self, TraceHeader};
use super::{kind, EndState, TraceError, TraceFooter, END_MAGIC, TRAILER_LEN};
use crate::event::Event;

/// Iterates the events of a recording held in memory.
///
/// ```no_run
/// # fn f(bytes: &[u8]) -> Result<(), laser_driver::trace::TraceError> {
/// let mut r = laser_driver::trace::Reader::new(bytes)?;
/// for e in r.by_ref() {
///     let _event = e?;
/// }
/// if !r.end_state().is_some_and(|s| s.is_complete()) {
///     eprintln!("warning: {:?}", r.end_state());
/// }
/// # Ok(()) }
/// ```
pub struct Reader<'a> {
    bytes: &'a [u8],
    header: TraceHeader,
    pos: usize,
    records: u64,
    skipped: u64,
    end: Option<EndState>,
    /// Where [`Reader::next_ref`] decodes to.
    slot: Event,
}

/// What the next frame is, once framing, checksum and kind have been checked.
enum Step<'a> {
    Record {
        kind: u8,
        payload: &'a [u8],
        len: usize,
        offset: u64,
    },
    /// The read is over; with the error to yield, if it ended in one.
    End(Option<TraceError>),
}

impl<'a> Reader<'a> {
    /// Checks magic and version and parses the header. Fails when even the header is
    /// unusable: empty file, not a recording, newer version, header cut off or damaged.
    pub fn new(bytes: &'a [u8]) -> Result<Self, TraceError> {
        let (header, pos) = header::decode(bytes)?;
        Ok(Reader {
            bytes,
            header,
            pos,
            records: 0,
            skipped: 0,
            end: None,
            slot: Event::Lost { count: 0, time: 0 },
        })
    }

    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    /// How the read ended; `None` while events remain to be read.
    pub fn end_state(&self) -> Option<&EndState> {
        self.end.as_ref()
    }

    /// Byte offset of the next record.
    pub fn offset(&self) -> u64 {
        self.pos as u64
    }

    /// Records read so far (events plus skipped records of unknown kinds).
    pub fn records_read(&self) -> u64 {
        self.records + self.skipped
    }

    /// Records of kinds this laser does not know (written by a newer one), skipped.
    pub fn skipped_unknown(&self) -> u64 {
        self.skipped
    }

    /// The footer of a complete file, found through the trailer without reading the records
    /// (for a quick summary). `None` if the file is not complete; the full read is what says
    /// why. Not validated beyond its checksum: iterate for that.
    pub fn quick_footer(&self) -> Option<TraceFooter> {
        let n = self.bytes.len();
        let trailer = self.bytes.get(n.checked_sub(TRAILER_LEN)?..)?;
        let (off, magic) = trailer.split_first_chunk::<8>()?;
        if magic != END_MAGIC {
            return None;
        }
        let off = usize::try_from(u64::from_le_bytes(*off)).ok()?;
        match split_frame(self.bytes.get(off..)?) {
            Frame::Ok {
                kind: kind::FOOTER,
                payload,
                ..
            } => decode_footer(payload).ok(),
            _ => None,
        }
    }

    /// Like `next`, but decodes into a slot the reader owns and lends it out, so no
    /// 280-byte `Event` is built and moved per record: the fastest way through a recording
    /// when the consumer only looks at each event (see `benchmarks/.../parse_throughput.rs`).
    #[inline]
    pub fn next_ref(&mut self) -> Option<Result<&Event, TraceError>> {
        match self.step() {
            Step::Record {
                kind,
                payload,
                len,
                offset,
            } => match decode_event_into(kind, payload, offset, &mut self.slot) {
                Ok(()) => {
                    self.pos += len;
                    self.records += 1;
                    Some(Ok(&self.slot))
                }
                Err(e) => Some(Err(self.corrupt(e))),
            },
            Step::End(e) => e.map(Err),
        }
    }

    /// Ends the read as corrupt at the current record; returns the error to yield.
    fn corrupt(&mut self, err: TraceError) -> TraceError {
        self.end = Some(EndState::Corrupt {
            offset: self.pos as u64,
            why: err.to_string(),
        });
        err
    }

    /// Frames up to the next record of a known kind, checking each; handles the footer,
    /// truncation and damage by ending the read.
    #[inline(always)]
    fn step(&mut self) -> Step<'a> {
        loop {
            if self.end.is_some() {
                return Step::End(None);
            }
            let bytes = self.bytes;
            let rest = bytes.get(self.pos..).unwrap_or_default();
            let offset = self.pos as u64;
            match split_frame(rest) {
                Frame::Ok {
                    kind: kind::FOOTER,
                    payload,
                    len,
                } => return Step::End(self.footer(payload, len)),
                Frame::Ok { kind, len, .. } if !is_known(kind) => {
                    self.pos += len;
                    self.skipped += 1;
                }
                Frame::Ok { kind, payload, len } => {
                    return Step::Record {
                        kind,
                        payload,
                        len,
                        offset,
                    }
                }
                Frame::Short => {
                    self.end = Some(EndState::Truncated { offset });
                    return Step::End(None);
                }
                Frame::TooLarge(len) => {
                    return Step::End(Some(self.corrupt(TraceError::RecordTooLarge {
                        offset,
                        len,
                        max: super::MAX_RECORD_LEN,
                    })))
                }
                Frame::BadCrc { stored, computed } => {
                    return Step::End(Some(self.corrupt(TraceError::Checksum {
                        offset,
                        stored,
                        computed,
                    })))
                }
            }
        }
    }

    /// The footer frame at `self.pos` decoded to `payload`, `len` bytes long: check it and
    /// the trailer, and end the read.
    fn footer(&mut self, payload: &[u8], len: usize) -> Option<TraceError> {
        let offset = self.pos as u64;
        let rest = self.bytes.get(self.pos + len..).unwrap_or_default();
        match check_footer(offset, payload, rest, self.records_read()) {
            Ok(FooterCheck::Complete(footer)) => {
                self.end = Some(EndState::Complete { footer });
                None
            }
            Ok(FooterCheck::TrailerCut) => {
                self.end = Some(EndState::Truncated {
                    offset: offset + len as u64,
                });
                None
            }
            Err(e) => Some(self.corrupt(e)),
        }
    }
}

pub(crate) enum FooterCheck {
    Complete(TraceFooter),
    /// Footer whole, trailer cut short: every record was read, but the file is not whole.
    TrailerCut,
}

/// Validates a footer payload (at byte `offset`) and the bytes after its frame (`rest`:
/// exactly the trailer when the file is whole) against the number of records read.
pub(crate) fn check_footer(
    offset: u64,
    payload: &[u8],
    rest: &[u8],
    records: u64,
) -> Result<FooterCheck, TraceError> {
    let bad = |why: String| TraceError::BadFooter { offset, why };
    let footer = decode_footer(payload).map_err(|w| bad(w.to_owned()))?;
    if rest.len() < TRAILER_LEN {
        let mut expect = offset.to_le_bytes().to_vec();
        expect.extend_from_slice(&END_MAGIC);
        return if expect.starts_with(rest) {
            Ok(FooterCheck::TrailerCut)
        } else {
            Err(bad("end marker damaged".to_owned()))
        };
    }
    if rest.len() > TRAILER_LEN {
        return Err(bad(format!(
            "{} unexpected bytes after the end marker",
            rest.len() - TRAILER_LEN
        )));
    }
    let (off, magic) = rest
        .split_first_chunk::<8>()
        .ok_or_else(|| bad("end marker missing".to_owned()))?;
    if magic != END_MAGIC {
        return Err(bad("end marker damaged".to_owned()));
    }
    let off = u64::from_le_bytes(*off);
    if off != offset {
        return Err(bad(format!("end marker points at byte {off}")));
    }
    if footer.stats.records != records {
        return Err(bad(format!(
            "footer counts {} records but the file holds {records}",
            footer.stats.records
        )));
    }
    Ok(FooterCheck::Complete(footer))
}

impl Iterator for Reader<'_> {
    type Item = Result<Event, TraceError>;

    /// Decodes in place and clones out: measured faster than building the `Event` by value,
    /// which made the compiler copy it twice (`parse_throughput` here: ~15 vs ~12 M/s).
    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        self.next_ref().map(|r| r.cloned())
    }
}
