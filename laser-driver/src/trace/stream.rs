//! Reading a recording from any `Read` (a pipe, stdin, a file too large to map). Same checks
//! and same end states as the in-memory [`Reader`](super::Reader). The source is buffered
//! here (256 KiB): frames that lie whole in the buffer decode straight from it; only a frame
//! split across refills is copied out first.

use std::io::{BufRead, BufReader, ErrorKind, Read};

use super::codec::{decode_event_into, is_known, split_frame, Frame};
use super::header::{self, TraceHeader};
use super::reader::{check_footer, FooterCheck};
use super::{
    kind, EndState, TraceError, FILE_HEAD, FRAME_HEAD, FRAME_TAIL, MAX_RECORD_LEN, TRAILER_LEN,
};
use crate::event::Event;

/// Read buffer size: many frames per `read` call.
const BUFFER: usize = 256 * 1024;

pub struct StreamReader<R: Read> {
    src: BufReader<R>,
    header: TraceHeader,
    buf: Vec<u8>,
    offset: u64,
    records: u64,
    end: Option<EndState>,
    /// Decode target, reused (see `Reader::next`).
    slot: Event,
}

/// Reads until `buf` is full or EOF; returns how many bytes were read.
fn read_full<R: Read>(src: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match src.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

impl<R: Read> StreamReader<R> {
    pub fn new(src: R) -> Result<Self, TraceError> {
        let mut src = BufReader::with_capacity(BUFFER, src);
        let mut head = vec![0u8; FILE_HEAD];
        let n = read_full(&mut src, &mut head)?;
        head.truncate(n);
        let len = header::parse_file_head(&head)? as usize;
        head.resize(FILE_HEAD + len + 4, 0);
        let m = read_full(&mut src, &mut head[FILE_HEAD..])?;
        head.truncate(FILE_HEAD + m);
        let (header, used) = header::decode(&head)?;
        Ok(StreamReader {
            src,
            header,
            buf: Vec::with_capacity(4096),
            offset: used as u64,
            records: 0,
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
        self.offset
    }

    fn corrupt(&mut self, err: TraceError) -> Option<Result<Event, TraceError>> {
        self.end = Some(EndState::Corrupt {
            offset: self.offset,
            why: err.to_string(),
        });
        Some(Err(err))
    }

    fn truncated(&mut self) -> Option<Result<Event, TraceError>> {
        self.end = Some(EndState::Truncated {
            offset: self.offset,
        });
        None
    }

    /// Reads the next whole frame into `self.buf`; `Ok(false)` if the source ends first.
    fn fill_frame(&mut self) -> Result<bool, TraceError> {
        self.buf.clear();
        self.buf.resize(FRAME_HEAD, 0);
        if read_full(&mut self.src, &mut self.buf)? < FRAME_HEAD {
            return Ok(false);
        }
        let len = u32::from_le_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
        if len > MAX_RECORD_LEN {
            return Err(TraceError::RecordTooLarge {
                offset: self.offset,
                len,
                max: MAX_RECORD_LEN,
            });
        }
        let total = FRAME_HEAD + len as usize + FRAME_TAIL;
        self.buf.resize(total, 0);
        Ok(read_full(&mut self.src, &mut self.buf[FRAME_HEAD..])? == total - FRAME_HEAD)
    }
}

impl<R: Read> Iterator for StreamReader<R> {
    type Item = Result<Event, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.end.is_some() {
                return None;
            }
            // Fast path: the next frame lies whole in the read buffer. Anything else (a frame
            // split across refills, the footer, damage, an I/O error) takes the path below,
            // which reads the frame out and reports what it finds.
            if let Ok(avail) = self.src.fill_buf() {
                if let Frame::Ok { kind, payload, len } = split_frame(avail) {
                    if kind != kind::FOOTER {
                        let known = is_known(kind);
                        if known {
                            let r = decode_event_into(kind, payload, self.offset, &mut self.slot);
                            if let Err(e) = r {
                                return self.corrupt(e);
                            }
                        }
                        self.src.consume(len);
                        self.offset += len as u64;
                        self.records += 1;
                        if known {
                            return Some(Ok(self.slot.clone()));
                        }
                        continue;
                    }
                }
            }
            match self.fill_frame() {
                Ok(true) => {}
                Ok(false) => return self.truncated(),
                Err(e) => return self.corrupt(e),
            }
            let offset = self.offset;
            let (kind, len, payload) = match split_frame(&self.buf) {
                Frame::Ok {
                    kind: kind::FOOTER,
                    payload,
                    len,
                } => {
                    // One byte more than a trailer tells "exactly the trailer" from "more".
                    let mut rest = [0u8; TRAILER_LEN + 1];
                    let n = match read_full(&mut self.src, &mut rest) {
                        Ok(n) => n,
                        Err(e) => return self.corrupt(e.into()),
                    };
                    let check = check_footer(offset, payload, &rest[..n], self.records);
                    return match check {
                        Ok(FooterCheck::Complete(footer)) => {
                            self.end = Some(EndState::Complete { footer });
                            None
                        }
                        Ok(FooterCheck::TrailerCut) => {
                            self.offset += len as u64;
                            self.truncated()
                        }
                        Err(e) => self.corrupt(e),
                    };
                }
                Frame::Ok { kind, payload, len } => (kind, len, payload),
                // `fill_frame` read the whole frame, so only the checksum can fail here.
                Frame::Short => return self.truncated(),
                Frame::TooLarge(len) => {
                    return self.corrupt(TraceError::RecordTooLarge {
                        offset,
                        len,
                        max: MAX_RECORD_LEN,
                    })
                }
                Frame::BadCrc { stored, computed } => {
                    return self.corrupt(TraceError::Checksum {
                        offset,
                        stored,
                        computed,
                    })
                }
            };
            if !is_known(kind) {
                self.offset += len as u64;
                self.records += 1;
                continue;
            }
            return match decode_event_into(kind, payload, offset, &mut self.slot) {
                Ok(()) => {
                    self.offset += len as u64;
                    self.records += 1;
                    Some(Ok(self.slot.clone()))
                }
                Err(e) => self.corrupt(e),
            };
        }
    }
}
