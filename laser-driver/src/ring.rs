//! Reading records out of a perf ring buffer.
//!
//! The kernel writes records at `data_head` and never overwrites bytes the reader has not
//! released by advancing `data_tail`:
//!
//! ```text
//!   data area (size 2^n bytes), offsets taken modulo size
//!   ┌──────────────┬──────────────────────────────┬───────────┐
//!   │ rec C (tail) │        free (kernel writes)  │ rec A  rec│ B…
//!   └──────────────┴──────────────────────────────┴───────────┘
//!        ▲ record B wraps: its first bytes are at the end,    ▲ tail
//!          the rest at the start → copied into a scratch buffer
//! ```
//!
//! [`drain`] works on anything implementing [`RingMemory`]: the live mmap
//! ([`crate::mmap_ring::MmapRing`]) or an in-memory [`SliceRing`] in tests.

/// A ring buffer's shared state. Implementations decide how `data_head`/`data_tail` are
/// loaded and stored (atomics with acquire/release for the live mapping).
pub trait RingMemory {
    /// Size of the data area in bytes (a power of two).
    fn data_size(&self) -> usize;
    /// `data_head`: bytes ever written. Must be an acquire load so record bytes written before
    /// the kernel advanced it are visible.
    fn head(&self) -> u64;
    /// `data_tail`: bytes ever consumed.
    fn tail(&self) -> u64;
    /// Publishes `data_tail`. Must be a release store so our reads of the records complete
    /// before the kernel may reuse their space.
    fn set_tail(&mut self, tail: u64);
    /// Bytes `[off, off + len)` of the data area (`off + len <= data_size`). Only asked for
    /// bytes between tail and head, which the kernel does not touch.
    fn bytes(&self, off: usize, len: usize) -> &[u8];
}

/// One record as found in the ring: header fields and the body after the 8-byte header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawRecord<'a> {
    pub kind: u32,
    pub misc: u16,
    pub body: &'a [u8],
}

/// Corrupt ring state. The reader skips to `data_head` after reporting one of these, so a
/// single bad record cannot wedge the stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RingError {
    #[error("data_head {head} is behind data_tail {tail}")]
    HeadBehindTail { head: u64, tail: u64 },
    #[error("{avail} bytes readable but the data area holds only {size}")]
    Overrun { avail: u64, size: u64 },
    #[error("record at byte {pos} claims {size} bytes (header is 8, {avail} bytes readable)")]
    BadRecordSize { pos: u64, size: u64, avail: u64 },
    #[error("ring data area of {0} bytes is not a power of two")]
    BadDataSize(usize),
}

/// Calls `f` for every complete record between tail and head, then publishes the new tail.
/// Returns the number of records. On corruption, releases everything up to head (the bytes
/// cannot be framed any more) and returns the error after the records read so far.
pub fn drain<M: RingMemory + ?Sized>(
    mem: &mut M,
    scratch: &mut Vec<u8>,
    mut f: impl FnMut(RawRecord<'_>),
) -> Result<usize, RingError> {
    let size = mem.data_size();
    if !size.is_power_of_two() {
        return Err(RingError::BadDataSize(size));
    }
    let size64 = size as u64;
    let head = mem.head();
    let mut tail = mem.tail();
    let mut n = 0;
    let result = (|| {
        if head < tail {
            return Err(RingError::HeadBehindTail { head, tail });
        }
        if head - tail > size64 {
            return Err(RingError::Overrun {
                avail: head - tail,
                size: size64,
            });
        }
        while tail < head {
            let avail = head - tail;
            let off = (tail & (size64 - 1)) as usize;
            let mut hdr = [0u8; 8];
            if avail < 8 {
                return Err(RingError::BadRecordSize {
                    pos: tail,
                    size: avail,
                    avail,
                });
            }
            copy_wrapped(mem, off, &mut hdr);
            let kind = u32::from_le_bytes(hdr[0..4].try_into().unwrap_or_default());
            let misc = u16::from_le_bytes([hdr[4], hdr[5]]);
            let rec_len = u16::from_le_bytes([hdr[6], hdr[7]]) as usize;
            if rec_len < 8 || rec_len as u64 > avail {
                return Err(RingError::BadRecordSize {
                    pos: tail,
                    size: rec_len as u64,
                    avail,
                });
            }
            if off + rec_len <= size {
                let body = mem.bytes(off + 8, rec_len - 8);
                f(RawRecord { kind, misc, body });
            } else {
                scratch.clear();
                scratch.resize(rec_len, 0);
                copy_wrapped(mem, off, scratch);
                f(RawRecord {
                    kind,
                    misc,
                    body: &scratch[8..],
                });
            }
            n += 1;
            tail += rec_len as u64;
        }
        Ok(())
    })();
    match result {
        Ok(()) => {
            mem.set_tail(tail);
            Ok(n)
        }
        Err(e) => {
            mem.set_tail(head.max(mem.tail()));
            Err(e)
        }
    }
}

/// Copies `out.len()` bytes starting at data offset `off`, wrapping at the end.
fn copy_wrapped<M: RingMemory + ?Sized>(mem: &M, off: usize, out: &mut [u8]) {
    let size = mem.data_size();
    let first = out.len().min(size - off);
    out[..first].copy_from_slice(mem.bytes(off, first));
    let rest = out.len() - first;
    if rest > 0 {
        out[first..].copy_from_slice(mem.bytes(0, rest));
    }
}

/// An in-memory ring for tests and replay: a data area plus plain head/tail counters.
#[derive(Debug, Clone)]
pub struct SliceRing {
    pub data: Vec<u8>,
    pub head: u64,
    pub tail: u64,
}

impl SliceRing {
    /// An empty ring of `size` bytes (must be a power of two for `drain` to accept it),
    /// with head and tail both at `start` (so tests can place records across the end).
    pub fn new(size: usize, start: u64) -> Self {
        SliceRing {
            data: vec![0; size],
            head: start,
            tail: start,
        }
    }

    /// Writes one record (header + body) at head, wrapping, as the kernel would.
    /// Returns false (and writes nothing) if it does not fit in the free space.
    pub fn push(&mut self, kind: u32, misc: u16, body: &[u8]) -> bool {
        let len = 8 + body.len();
        let size = self.data.len();
        if len > u16::MAX as usize || (self.head - self.tail) as usize + len > size {
            return false;
        }
        let mut rec = Vec::with_capacity(len);
        rec.extend_from_slice(&kind.to_le_bytes());
        rec.extend_from_slice(&misc.to_le_bytes());
        rec.extend_from_slice(&(len as u16).to_le_bytes());
        rec.extend_from_slice(body);
        for (i, byte) in rec.into_iter().enumerate() {
            let at = (self.head as usize + i) % size;
            self.data[at] = byte;
        }
        self.head += len as u64;
        true
    }
}

impl RingMemory for SliceRing {
    fn data_size(&self) -> usize {
        self.data.len()
    }
    fn head(&self) -> u64 {
        self.head
    }
    fn tail(&self) -> u64 {
        self.tail
    }
    fn set_tail(&mut self, tail: u64) {
        self.tail = tail;
    }
    fn bytes(&self, off: usize, len: usize) -> &[u8] {
        &self.data[off..off + len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Rec = (u32, u16, Vec<u8>);

    fn collect(ring: &mut SliceRing) -> (Result<usize, RingError>, Vec<Rec>) {
        let mut out = Vec::new();
        let mut scratch = Vec::new();
        let r = drain(ring, &mut scratch, |r| {
            out.push((r.kind, r.misc, r.body.to_vec()))
        });
        (r, out)
    }

    #[test]
    fn record_split_at_every_byte_position() {
        let body: Vec<u8> = (0..40u8).collect(); // 48-byte record
        for split in 0..=48u64 {
            // Start so the record's first `split` bytes lie before the end of a 64-byte area.
            let mut ring = SliceRing::new(64, 64 * 3 - split);
            assert!(ring.push(9, 0x1234, &body));
            let (r, recs) = collect(&mut ring);
            assert_eq!(r, Ok(1), "split {split}");
            assert_eq!(recs, vec![(9, 0x1234, body.clone())], "split {split}");
            assert_eq!(ring.tail, ring.head);
        }
    }

    #[test]
    fn many_records_across_many_wraps_keep_order() {
        let mut ring = SliceRing::new(128, 0);
        let mut next = 0u32;
        let mut seen = Vec::new();
        for round in 0..50 {
            // Varying lengths so wrap points move around.
            while ring.push(next, 0, &vec![next as u8; 8 * (1 + (next as usize % 5))]) {
                next += 1;
            }
            let (r, recs) = collect(&mut ring);
            assert!(r.is_ok(), "round {round}: {r:?}");
            seen.extend(recs.into_iter().map(|(k, _, b)| {
                assert!(b.iter().all(|&x| x == k as u8));
                k
            }));
        }
        assert_eq!(seen, (0..next).collect::<Vec<_>>());
    }

    #[test]
    fn empty_ring_reads_nothing() {
        let mut ring = SliceRing::new(64, 1000);
        assert_eq!(collect(&mut ring).0, Ok(0));
    }

    #[test]
    fn corrupt_sizes_are_errors_not_panics() {
        // size field 0
        let mut ring = SliceRing::new(64, 0);
        ring.head = 16;
        let (r, recs) = collect(&mut ring);
        assert!(matches!(r, Err(RingError::BadRecordSize { size: 0, .. })));
        assert!(recs.is_empty());
        assert_eq!(ring.tail, 16, "skips to head");

        // record claims more than is readable
        let mut ring = SliceRing::new(64, 0);
        ring.push(1, 0, &[0; 8]);
        ring.data[6] = 40;
        let (r, _) = collect(&mut ring);
        assert!(matches!(
            r,
            Err(RingError::BadRecordSize {
                size: 40,
                avail: 16,
                ..
            })
        ));

        // head behind tail, and more readable than the area holds
        let mut ring = SliceRing::new(64, 100);
        ring.head = 50;
        assert!(matches!(
            collect(&mut ring).0,
            Err(RingError::HeadBehindTail { .. })
        ));
        let mut ring = SliceRing::new(64, 0);
        ring.head = 65;
        assert!(matches!(
            collect(&mut ring).0,
            Err(RingError::Overrun { avail: 65, .. })
        ));
        let mut ring = SliceRing::new(48, 0);
        assert_eq!(collect(&mut ring).0, Err(RingError::BadDataSize(48)));
    }

    #[test]
    fn partial_trailing_header_is_an_error() {
        let mut ring = SliceRing::new(64, 0);
        ring.push(1, 0, &[0; 8]);
        ring.head += 4;
        let (r, recs) = collect(&mut ring);
        assert_eq!(recs.len(), 1);
        assert!(matches!(r, Err(RingError::BadRecordSize { avail: 4, .. })));
    }
}

#[cfg(test)]
mod prop {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any sequence of records, starting anywhere in any power-of-two ring, drains in
        /// order with identical contents, however the wraps fall.
        #[test]
        fn records_survive_any_placement(
            size_log in 7u32..12,
            start in 0u64..100_000,
            lens in proptest::collection::vec(0usize..30, 1..40),
        ) {
            let size = 1usize << size_log;
            let mut ring = SliceRing::new(size, start);
            let mut want = Vec::new();
            for (i, l) in lens.iter().enumerate() {
                let body: Vec<u8> = (0..l * 8).map(|j| (i * 31 + j) as u8).collect();
                if !ring.push(i as u32, i as u16, &body) {
                    break;
                }
                want.push((i as u32, i as u16, body));
            }
            let mut got = Vec::new();
            let n = drain(&mut ring, &mut Vec::new(), |r| got.push((r.kind, r.misc, r.body.to_vec())));
            prop_assert_eq!(n, Ok(want.len()));
            prop_assert_eq!(got, want);
            prop_assert_eq!(ring.tail, ring.head);
        }

        /// Garbage in the data area and arbitrary head/tail never panic, and the reader always
        /// ends at head (or keeps its tail when head is behind).
        #[test]
        fn garbage_never_panics(
            data in proptest::collection::vec(any::<u8>(), 256),
            tail in 0u64..1000,
            ahead in 0u64..600,
        ) {
            let mut ring = SliceRing { data, head: tail + ahead, tail };
            let _ = drain(&mut ring, &mut Vec::new(), |_| {});
            prop_assert_eq!(ring.tail, tail + ahead);
        }
    }
}
