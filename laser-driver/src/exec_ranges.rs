//! The target's executable mappings as the decoder has seen them (MMAP2 records, and for
//! attach the maps read at start), to pick return-address candidates out of a sample's copy
//! of the user stack without keeping the stack itself: 512 bytes per sample would multiply a
//! recording's size, while the few words that point into code are what the detector needs.
//!
//! The set is the union over the target's processes (a forked child's mappings replace
//! whatever overlapped them). A wrong guess costs nothing but a candidate: the detector checks
//! each one against its own per-process maps and the instruction before it.

use crate::event::Callers;

/// Executable mappings, sorted by start, never overlapping.
#[derive(Debug, Default, Clone)]
pub struct ExecRanges {
    /// (start, end, index into `files`).
    ranges: Vec<(u64, u64, u32)>,
    files: Vec<String>,
}

impl ExecRanges {
    /// A mapping appeared at `[start, end)`: whatever it overlaps is gone; it is kept only if
    /// executable.
    pub fn note(&mut self, start: u64, end: u64, exec: bool, path: &str) {
        if end <= start {
            return;
        }
        self.ranges.retain(|&(s, e, _)| e <= start || end <= s);
        if !exec {
            return;
        }
        let file = match self.files.iter().position(|f| f == path) {
            Some(i) => i as u32,
            None => {
                self.files.push(path.to_string());
                (self.files.len() - 1) as u32
            }
        };
        let at = self.ranges.partition_point(|&(s, _, _)| s < start);
        self.ranges.insert(at, (start, end, file));
    }

    /// Which file's code `addr` lies in.
    pub fn file_of(&self, addr: u64) -> Option<u32> {
        let i = self.ranges.partition_point(|&(s, _, _)| s <= addr);
        let &(_, end, file) = self.ranges.get(i.checked_sub(1)?)?;
        (addr < end).then_some(file)
    }

    /// The words of `stack` (the top of a user stack, as the kernel copies it: lowest address
    /// first, 8-byte aligned) that point into code of a file other than the one `ip` is in,
    /// innermost first, up to [`crate::event::MAX_CALLERS`]. Words into the sampled code's own
    /// file are the library's internal frames (and its saved pointers); skipping them is what
    /// lets a few slots reach the program's frame.
    pub fn callers(&self, ip: u64, stack: &[u8], out: &mut Callers) {
        out.clear();
        if self.ranges.is_empty() {
            return;
        }
        let own = self.file_of(ip);
        for w in stack.chunks_exact(8) {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            let v = u64::from_le_bytes(b);
            match self.file_of(v) {
                Some(f) if Some(f) != own && !out.push(v) => return,
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[u64]) -> Vec<u8> {
        w.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn ranges() -> ExecRanges {
        let mut r = ExecRanges::default();
        r.note(0x5000_1000, 0x5000_3000, true, "/app");
        r.note(0x7f00_0000, 0x7f10_0000, true, "/lib/libc.so.6");
        r.note(0x5000_4000, 0x5000_5000, false, "/app"); // data: not code
        r.note(0x7f20_0000, 0x7f20_1000, true, "/lib/ld-linux-x86-64.so.2");
        r
    }

    #[test]
    fn lookups_respect_bounds_and_data_mappings() {
        let r = ranges();
        assert_eq!(r.file_of(0x5000_0fff), None);
        assert_eq!(r.file_of(0x5000_1000), Some(0));
        assert_eq!(r.file_of(0x5000_2fff), Some(0));
        assert_eq!(r.file_of(0x5000_3000), None);
        assert_eq!(r.file_of(0x5000_4100), None);
        assert_eq!(r.file_of(0x7f0f_ffff), Some(1));
        assert_eq!(r.file_of(0x7f20_0010), Some(2));
    }

    #[test]
    fn a_new_mapping_replaces_what_it_overlaps() {
        let mut r = ranges();
        // munmap + mmap of data over libc's code (or a child's exec): the old code is gone.
        r.note(0x7f08_0000, 0x7f09_0000, false, "[anon]");
        assert_eq!(r.file_of(0x7f00_0010), None);
        r.note(0x7f00_0000, 0x7f00_1000, true, "/lib/libm.so.6");
        assert_eq!(r.file_of(0x7f00_0010), Some(3));
        assert_eq!(r.file_of(0x5000_1000), Some(0), "others untouched");
    }

    #[test]
    fn callers_skip_the_sampled_files_own_frames_and_data() {
        let r = ranges();
        let ip = 0x7f00_0100; // in libc
        let stack = words(&[
            0x7f00_0200,      // libc return address (internal frame): skipped
            0x5000_4010,      // pointer to the app's data: not code
            0x7ffd_0000_0000, // stack pointer: nowhere
            0x5000_1234,      // the app's call site
            0x5000_1234,      // the same again (a saved copy): once
            0x7f20_0005,      // ld.so
            0x5000_2000,
            0x5000_2008,
            0x5000_2010, // fifth candidate: no room
        ]);
        let mut c = Callers::default();
        r.callers(ip, &stack, &mut c);
        assert_eq!(
            c.as_slice(),
            &[0x5000_1234, 0x7f20_0005, 0x5000_2000, 0x5000_2008]
        );
        // Sampled in the app: libc words are candidates, the app's own are not.
        r.callers(0x5000_1100, &words(&[0x5000_1234, 0x7f00_0300]), &mut c);
        assert_eq!(c.as_slice(), &[0x7f00_0300]);
        // No code seen yet (a recording's first sample): nothing, and no panic on odd lengths.
        ExecRanges::default().callers(ip, &stack[..13], &mut c);
        assert!(c.is_empty());
    }
}
