//! The seam through which `plan` reads code: a byte slice in tests, process memory in `tracee`.

/// Reads code bytes at run-time addresses. Implementations must not panic on unmapped ranges.
pub trait CodeSource {
    /// Fills `buf` with the bytes at `addr`; returns the number of bytes read (0 when unmapped).
    /// A short read means the range ends inside `buf`.
    fn read_code(&self, addr: u64, buf: &mut [u8]) -> usize;
}

/// Code held in memory, as it sits at `base` in the target.
#[derive(Debug, Clone, Copy)]
pub struct CodeBytes<'a> {
    pub base: u64,
    pub bytes: &'a [u8],
}

impl CodeSource for CodeBytes<'_> {
    fn read_code(&self, addr: u64, buf: &mut [u8]) -> usize {
        let Some(off) = addr.checked_sub(self.base) else {
            return 0;
        };
        let Ok(off) = usize::try_from(off) else {
            return 0;
        };
        if off >= self.bytes.len() {
            return 0;
        }
        let n = buf.len().min(self.bytes.len() - off);
        buf[..n].copy_from_slice(&self.bytes[off..off + n]);
        n
    }
}

/// Reads `[start, end)` from `src`; `None` if any of it is missing.
pub(crate) fn read_range(src: &dyn CodeSource, start: u64, end: u64) -> Option<Vec<u8>> {
    let len = usize::try_from(end.checked_sub(start)?).ok()?;
    let mut buf = vec![0u8; len];
    (src.read_code(start, &mut buf) == len).then_some(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_inside_and_refuses_outside() {
        let bytes = [1u8, 2, 3, 4];
        let src = CodeBytes {
            base: 0x1000,
            bytes: &bytes,
        };
        let mut b = [0u8; 2];
        assert_eq!(src.read_code(0x1002, &mut b), 2);
        assert_eq!(b, [3, 4]);
        assert_eq!(src.read_code(0x1003, &mut b), 1);
        assert_eq!(src.read_code(0xfff, &mut b), 0);
        assert_eq!(read_range(&src, 0x1001, 0x1004), Some(vec![2, 3, 4]));
        assert_eq!(read_range(&src, 0x1001, 0x1005), None);
    }
}
