//! A bounds-checked little-endian reader: parsers of untrusted bytes get `None` at the end of
//! their input instead of a panic.

/// A bounds-checked little-endian reader over a payload. Every getter returns `None` at the
/// end instead of panicking; callers turn that into a typed error with the record's offset.
pub(crate) struct Cur<'a> {
    b: &'a [u8],
}

impl<'a> Cur<'a> {
    #[inline]
    pub(crate) fn new(b: &'a [u8]) -> Self {
        Cur { b }
    }

    #[inline]
    pub(crate) fn arr<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, tail) = self.b.split_first_chunk::<N>()?;
        self.b = tail;
        Some(*head)
    }

    #[inline]
    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.arr::<1>().map(|a| a[0])
    }

    #[inline]
    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.arr().map(u16::from_le_bytes)
    }

    #[inline]
    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.arr().map(u32::from_le_bytes)
    }

    #[inline]
    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.arr().map(u64::from_le_bytes)
    }

    #[inline]
    pub(crate) fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.b.len() {
            return None;
        }
        let (head, tail) = self.b.split_at(n);
        self.b = tail;
        Some(head)
    }

    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.b)
    }

    pub(crate) fn rest_len(&self) -> usize {
        self.b.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.b.is_empty()
    }

    /// A `u32` length followed by that many bytes.
    pub(crate) fn blob32(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.bytes(n)
    }
}
