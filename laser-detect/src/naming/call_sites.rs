//! Where the program called the library a contended access was sampled in: a lock word's
//! contention shows up in `pthread_mutex_lock`, and the line a user can change is the call of
//! it. The driver hands each sample up to four words of its stack that point into another
//! module's code ([`laser_driver::Callers`]); the first one that follows a call instruction
//! is the return address of the call out of the program, as far as a stack scan can tell
//! (a stale return address left in an uninitialised slot passes the same test: rare, and
//! the report says "called from", a share per site, not a proof).

use hashbrown::HashMap;
use iced_x86::{Decoder, DecoderOptions, FlowControl};

use crate::decode::code::CodeSource;

/// Distinct call sites kept per (line, instruction); more are counted as `other`.
pub const SITES_PER_SOURCE: usize = 4;

/// Bound on the (line, instruction) pairs with call sites, so a long run's table stays
/// small; pairs first seen after it is full are not given call sites.
const MAX_KEYS: usize = 1 << 16;

/// Bound on remembered return-address checks (each is one small decode).
const MAX_CHECKED: usize = 1 << 16;

/// Whether the instruction ending right before `ret` is a call (direct, through memory or a
/// register, with any prefix): what makes `ret` a return address. Call encodings are 2 to 7
/// bytes long; every length that decodes to a call ending exactly at `ret` counts.
pub fn follows_call<C: CodeSource + ?Sized>(code: &C, ret: u64) -> bool {
    const MAX_LEN: usize = 7;
    (2..=MAX_LEN).any(|len| {
        // Read per length: the code known may begin less than 7 bytes before `ret`.
        let Some(start) = ret.checked_sub(len as u64) else {
            return false;
        };
        let mut buf = [0u8; MAX_LEN];
        let bytes = &mut buf[..len];
        if code.read_code(start, bytes) < len {
            return false;
        }
        let mut d = Decoder::with_ip(64, bytes, start, DecoderOptions::NONE);
        let ins = d.decode();
        !ins.is_invalid()
            && ins.len() == len
            && matches!(
                ins.flow_control(),
                FlowControl::Call | FlowControl::IndirectCall
            )
    })
}

/// A shared object by its file name (`libc.so.6`, `ld-linux-x86-64.so.2`, `libfoo.so`): code
/// a program calls into, whose contended instructions are best shown with the call site.
pub fn is_shared_library(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.match_indices(".so")
        .any(|(i, _)| matches!(name.as_bytes().get(i + 3), None | Some(b'.')))
}

/// Sample counts per call site of one (line, instruction).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SiteCounts {
    /// (return address, samples), in order of first sight.
    pub sites: Vec<(u64, u64)>,
    /// Samples from call sites past [`SITES_PER_SOURCE`].
    pub other: u64,
}

impl SiteCounts {
    fn add(&mut self, ret: u64) {
        if let Some(s) = self.sites.iter_mut().find(|s| s.0 == ret) {
            s.1 += 1;
        } else if self.sites.len() < SITES_PER_SOURCE {
            self.sites.push((ret, 1));
        } else {
            self.other += 1;
        }
    }

    pub fn total(&self) -> u64 {
        self.sites.iter().map(|s| s.1).sum::<u64>() + self.other
    }
}

/// The call sites seen per (line address, instruction).
#[derive(Debug, Default)]
pub struct CallSites {
    by_source: HashMap<(u64, u64), SiteCounts>,
    /// Return-address checks already made (run-time address → follows a call).
    checked: HashMap<u64, bool>,
}

impl CallSites {
    /// The first of `candidates` that `is_other_module` accepts and that follows a call.
    pub fn pick<C: CodeSource + ?Sized>(
        &mut self,
        code: &C,
        candidates: &[u64],
        mut is_other_module: impl FnMut(u64) -> bool,
    ) -> Option<u64> {
        candidates.iter().copied().find(|&c| {
            if !is_other_module(c) {
                return false;
            }
            if let Some(&ok) = self.checked.get(&c) {
                return ok;
            }
            let ok = follows_call(code, c);
            if self.checked.len() < MAX_CHECKED {
                self.checked.insert(c, ok);
            }
            ok
        })
    }

    /// One sample of instruction `pc` on line `line` was called from `ret`.
    pub fn note(&mut self, line: u64, pc: u64, ret: u64) {
        let full = self.by_source.len() >= MAX_KEYS;
        match self.by_source.get_mut(&(line, pc)) {
            Some(c) => c.add(ret),
            None if !full => self.by_source.entry((line, pc)).or_default().add(ret),
            None => {}
        }
    }

    pub fn get(&self, line: u64, pc: u64) -> Option<&SiteCounts> {
        self.by_source.get(&(line, pc))
    }

    /// New program image (exec): addresses mean other code now.
    pub fn clear_checks(&mut self) {
        self.checked.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::code::MemoryCode;

    /// App code at 0x1000: `call rel32; nop; call [rip+0]; nop; call rax; nop; mov eax,1`
    /// and bytes that end in an `e8` without being a call.
    fn app() -> MemoryCode {
        let mut m = MemoryCode::new();
        let mut code = vec![0x90; 16];
        code.extend_from_slice(&[0xe8, 0x10, 0x20, 0x00, 0x00]); // 0x1010 call → ret 0x1015
        code.push(0x90);
        code.extend_from_slice(&[0xff, 0x15, 0, 0, 0, 0]); // 0x1016 call [rip] → ret 0x101c
        code.push(0x90);
        code.extend_from_slice(&[0xff, 0xd0]); // 0x101d call rax → ret 0x101f
        code.push(0x90);
        code.extend_from_slice(&[0xb8, 0x01, 0, 0, 0]); // 0x1020 mov eax, 1 → "ret" 0x1025
        code.extend_from_slice(&[0x90; 8]);
        m.add(0x1000, code);
        m
    }

    #[test]
    fn return_addresses_are_those_right_after_a_call() {
        let m = app();
        assert!(follows_call(&m, 0x1015), "call rel32");
        assert!(follows_call(&m, 0x101c), "call [rip+disp32]");
        assert!(follows_call(&m, 0x101f), "call rax");
        assert!(!follows_call(&m, 0x1025), "after a mov");
        assert!(!follows_call(&m, 0x1017), "inside a call");
        assert!(!follows_call(&m, 0x1003), "code not known before it");
        assert!(!follows_call(&m, 0x9000), "no code");
        assert!(!follows_call(&m, 3), "below the address space");
    }

    #[test]
    fn the_first_candidate_in_another_module_after_a_call_wins() {
        let m = app();
        let mut cs = CallSites::default();
        let other = |a: u64| a != 0x7f00;
        // 0x7f00 is the sampled module's own; 0x1025 follows no call; 0x101c does.
        assert_eq!(
            cs.pick(&m, &[0x7f00, 0x1025, 0x101c, 0x1015], other),
            Some(0x101c)
        );
        assert_eq!(cs.pick(&m, &[0x7f00, 0x1025], other), None);
        assert_eq!(cs.pick(&m, &[], other), None);
    }

    #[test]
    fn shared_libraries_are_told_by_file_name() {
        for lib in [
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            "/lib64/ld-linux-x86-64.so.2",
            "/opt/app/libwork.so",
        ] {
            assert!(is_shared_library(lib), "{lib}");
        }
        for exe in ["/usr/bin/app", "/opt/so.d/app", "/tmp/x.sock", "[vdso]"] {
            assert!(!is_shared_library(exe), "{exe}");
        }
    }

    #[test]
    fn sites_are_counted_per_line_and_instruction_with_a_bounded_list() {
        let mut cs = CallSites::default();
        for ret in [1, 2, 1, 3, 4, 5, 6, 1] {
            cs.note(0x40, 0x99, ret);
        }
        cs.note(0x80, 0x99, 7);
        let c = cs.get(0x40, 0x99).unwrap();
        assert_eq!(c.sites, vec![(1, 3), (2, 1), (3, 1), (4, 1)]);
        assert_eq!(c.other, 2);
        assert_eq!(c.total(), 8);
        assert_eq!(cs.get(0x80, 0x99).unwrap().sites, vec![(7, 1)]);
        assert!(cs.get(0x40, 0x98).is_none());
    }
}
