//! From an [`AllocRecord`] to the allocation's call stack and its site in the program.
//!
//! The recorder copied the caller's stack at the call to malloc. [`unwind`] walks it with the
//! modules' `.eh_frame` call-frame information (the CFA rule and where the return address
//! and `rbp` were saved at each return address), so it is exact at -O0 (rbp frames) and
//! -O2 (no frame pointer) alike, and stops where the copy ends:
//!
//! ```text
//!   rec.sp ──▶ ┌──────────────┐  frame of the malloc caller (e.g. xmalloc), pc = rec.ret
//!              │ locals       │  CFA = sp + off (or rbp + off), from .eh_frame at pc − 1
//!              │ ret → main   │  at CFA − 8: the next pc
//!   CFA   ──▶  ├──────────────┤  frame of main: sp = CFA
//!              │ …            │
//! ```
//!
//! The *site* is the first frame in the program's own code that is not an allocator
//! wrapper ([`is_alloc_wrapper`]): frames in system libraries (`operator new` in
//! libstdc++, glibc's `strdup`) and functions that only obtain memory and hand it back
//! (`xmalloc`, `safe_malloc`) are skipped.

use std::collections::HashMap;
use std::path::Path;

use iced_x86::{Code, Decoder, DecoderOptions, FlowControl, Instruction, OpKind, Register};

use crate::decode::code::ElfImage;
use crate::decode::maps::{load_bias, Region};
use crate::naming::alloc_record::AllocRecord;

/// How to find the caller's frame at one pc (ELF `.eh_frame` row, simplified to what x86-64
/// code needs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameRule {
    /// The CFA is this register plus `cfa_offset`.
    pub cfa_from_bp: bool,
    pub cfa_offset: i64,
    /// Where the caller's `rbp` was saved (CFA-relative), if it was.
    pub bp_saved_at: Option<i64>,
    /// Where the return address is (CFA-relative; −8 on x86-64).
    pub ra_at: i64,
}

/// Frames at most in an unwound allocation stack.
pub const MAX_FRAMES: usize = 16;

/// The return addresses of the allocation's stack, innermost first: `rec.ret` (in the
/// function that called malloc), then its caller's, … until the stack copy ends, a pc has
/// no rule, or [`MAX_FRAMES`].
pub fn unwind(rec: &AllocRecord, mut rule_at: impl FnMut(u64) -> Option<FrameRule>) -> Vec<u64> {
    let mut out = vec![rec.ret];
    let (mut pc, mut sp, mut bp) = (rec.ret, rec.sp, rec.bp);
    while out.len() < MAX_FRAMES {
        // The rule of the call instruction: a return address may be the first byte of the
        // next function (a call to a noreturn function ends its caller).
        let Some(r) = rule_at(pc.wrapping_sub(1)) else {
            break;
        };
        let base = if r.cfa_from_bp { bp } else { sp };
        let cfa = base.wrapping_add_signed(r.cfa_offset);
        let Some(ra) = rec.stack_word(cfa.wrapping_add_signed(r.ra_at)) else {
            break;
        };
        if let Some(at) = r.bp_saved_at {
            match rec.stack_word(cfa.wrapping_add_signed(at)) {
                Some(v) => bp = v,
                None => break,
            }
        }
        if ra == 0 || cfa <= sp {
            break; // the outermost frame, or a loop: stacks grow down
        }
        (pc, sp) = (ra, cfa);
        out.push(pc);
    }
    out
}

/// Whether a module is system code (not the program's own): frames there are not a site.
pub fn is_system_module(path: &str) -> bool {
    [
        "/lib/",
        "/lib64/",
        "/usr/lib/",
        "/usr/lib64/",
        "/usr/local/lib/",
    ]
    .iter()
    .any(|p| path.starts_with(p))
        || is_recorder(path)
}

/// laser's own recorder (`laser-alloc-PID.so` in the temp directory).
fn is_recorder(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with("laser-alloc-") && name.ends_with(".so")
}

/// Whether the function whose machine code is `code` (at ELF vaddr `start`) is an allocator
/// wrapper: it calls something, every call goes to a library function through the PLT
/// (`in_plt`) or to another wrapper (`is_wrapper`), it writes memory only through `rsp`/`rbp`
/// (so it does not initialize the object, it only obtains it), and it returns a 64-bit value
/// that came from a call or from a 64-bit register or stack slot (`mov rax, [rbp-8]` at -O0)
/// — not a constant or a 32-bit result, which is what `main` and `int` functions return.
/// `xmalloc` (malloc, abort on NULL, return) passes; `node_new` (malloc, then store fields)
/// and `main` do not.
pub fn is_alloc_wrapper(
    code: &[u8],
    start: u64,
    in_plt: &dyn Fn(u64) -> bool,
    is_wrapper: &mut dyn FnMut(u64) -> bool,
) -> bool {
    let mut dec = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    let insns: Vec<Instruction> = dec.iter().collect();
    if insns.iter().any(|i| i.code() == Code::INVALID) {
        return false;
    }
    let mut calls = 0;
    let mut info = iced_x86::InstructionInfoFactory::new();
    for (n, i) in insns.iter().enumerate() {
        match i.flow_control() {
            FlowControl::Call | FlowControl::UnconditionalBranch
                if i.op0_kind() == OpKind::NearBranch64 =>
            {
                let t = i.near_branch_target();
                let inside = t >= start && t < start + code.len() as u64;
                if i.flow_control() == FlowControl::Call || !inside {
                    if !in_plt(t) && !is_wrapper(t) {
                        return false;
                    }
                    calls += 1;
                }
            }
            FlowControl::IndirectCall | FlowControl::IndirectBranch => return false,
            FlowControl::Return if !returns_pointer(&insns[..n]) => return false,
            _ => {}
        }
        for m in info.info(i).used_memory() {
            let writes = matches!(
                m.access(),
                iced_x86::OpAccess::Write
                    | iced_x86::OpAccess::ReadWrite
                    | iced_x86::OpAccess::CondWrite
                    | iced_x86::OpAccess::ReadCondWrite
            );
            let stack = matches!(m.base(), Register::RSP | Register::RBP);
            if writes && !stack {
                return false;
            }
        }
    }
    calls > 0
}

/// Whether the value in `rax` at the `ret` after `before` is a pointer the function got: the
/// last writer of `rax` (searched back a few instructions) is a call or a 64-bit move.
fn returns_pointer(before: &[Instruction]) -> bool {
    for i in before.iter().rev().take(12) {
        if i.flow_control() == FlowControl::Call {
            return true;
        }
        let writes_ax = (0..i.op_count()).next().is_some_and(|_| {
            i.op0_kind() == OpKind::Register
                && matches!(
                    i.op0_register(),
                    Register::RAX | Register::EAX | Register::AX | Register::AL
                )
        }) && !matches!(
            i.mnemonic(),
            iced_x86::Mnemonic::Test | iced_x86::Mnemonic::Cmp | iced_x86::Mnemonic::Push
        );
        if writes_ax {
            let from = i.op1_kind();
            return i.mnemonic() == iced_x86::Mnemonic::Mov
                && i.op0_register() == Register::RAX
                && (from == OpKind::Register || from == OpKind::Memory);
        }
    }
    false
}

/// One frame of an allocation stack, placed in its module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocFrame {
    /// Run-time return address.
    pub pc: u64,
    pub module: Option<String>,
    /// ELF vaddr of `pc` in `module`.
    pub vaddr: Option<u64>,
    /// Why this frame is not the site: `library` (system module), `wrapper`, or `None`.
    pub skipped: Option<&'static str>,
}

/// An allocation's stack and site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocSite {
    pub requested_size: u64,
    pub frames: Vec<AllocFrame>,
    /// Index into `frames` of the site, if any frame qualifies.
    pub site: Option<usize>,
}

/// The target's executable modules, opened on demand: unwind rules, code and PLT ranges.
pub struct ModuleSet {
    /// Executable mappings: `[start, end)`, path, load bias.
    maps: Vec<(u64, u64, String, u64)>,
    images: HashMap<String, Option<ElfImage>>,
}

impl ModuleSet {
    /// From the target's parsed `/proc/PID/maps`.
    pub fn new(regions: &[Region]) -> ModuleSet {
        let mut set = ModuleSet {
            maps: Vec::new(),
            images: HashMap::new(),
        };
        for r in regions.iter().filter(|r| r.exec && r.path.starts_with('/')) {
            let bias = match set.image(&r.path) {
                Some(img) => load_bias(r.start, r.offset, &img.segments),
                None => continue,
            };
            set.maps.push((r.start, r.end, r.path.clone(), bias));
        }
        set
    }

    fn image(&mut self, path: &str) -> Option<&ElfImage> {
        self.images
            .entry(path.to_string())
            .or_insert_with(|| ElfImage::open(Path::new(path)))
            .as_ref()
    }

    /// The module and ELF vaddr of run-time address `pc`.
    pub fn place(&self, pc: u64) -> Option<(String, u64)> {
        self.maps
            .iter()
            .find(|m| m.0 <= pc && pc < m.1)
            .map(|m| (m.2.clone(), pc.wrapping_sub(m.3)))
    }

    fn rule(&mut self, pc: u64) -> Option<FrameRule> {
        let (path, vaddr) = self.place(pc)?;
        let img = self.image(&path)?;
        eh_frame_rule(img, vaddr)
    }

    /// Whether the function holding ELF vaddr `vaddr` of `path` is an allocator wrapper
    /// (`depth` bounds wrappers calling wrappers).
    fn wrapper(&mut self, path: &str, vaddr: u64, depth: u32) -> bool {
        let Some(img) = self.image(path) else {
            return false;
        };
        let i = img.functions.partition_point(|f| f.0 <= vaddr);
        let Some(&(start, end)) = i.checked_sub(1).and_then(|i| img.functions.get(i)) else {
            return false;
        };
        if vaddr >= end || end - start > 4096 {
            return false; // wrappers are small; a big function is not one
        }
        let mut code = vec![0u8; (end - start) as usize];
        if img.read_vaddr(start, &mut code) != code.len() {
            return false;
        }
        let plts: Vec<(u64, u64)> = [".plt", ".plt.sec", ".plt.got"]
            .iter()
            .filter_map(|n| img.section(n).map(|(a, b)| (a, a + b.len() as u64)))
            .collect();
        let in_plt = |t: u64| plts.iter().any(|&(a, b)| a <= t && t < b);
        let path = path.to_string();
        let mut inner = |t: u64| depth > 0 && t != start && self.wrapper(&path, t, depth - 1);
        is_alloc_wrapper(&code, start, &in_plt, &mut inner)
    }

    /// How the instruction before `ip` (a watchpoint's sample IP) touched memory.
    pub fn touch(&mut self, ip: u64) -> Option<crate::naming::alloc_history::Touch> {
        let (path, vaddr) = self.place(ip)?;
        let img = self.image(&path)?;
        let i = img.functions.partition_point(|f| f.0 < vaddr);
        let &(start, end) = img.functions.get(i.checked_sub(1)?)?;
        if vaddr > end || end - start > 1 << 20 {
            return None;
        }
        let mut code = vec![0u8; (end - start) as usize];
        let n = img.read_vaddr(start, &mut code);
        crate::naming::alloc_history::touch_before(&code[..n], start, vaddr)
    }

    /// The allocation's stack and site.
    pub fn site(&mut self, rec: &AllocRecord) -> AllocSite {
        let pcs = unwind(rec, |pc| self.rule(pc));
        let mut frames = Vec::new();
        let mut site = None;
        for pc in pcs {
            let placed = self.place(pc);
            let skipped = match &placed {
                None => Some("library"),
                Some((m, _)) if is_system_module(m) => Some("library"),
                Some(_) if site.is_some() => None,
                Some((m, v)) => self.wrapper(m, v.wrapping_sub(1), 2).then_some("wrapper"),
            };
            if skipped.is_none() && site.is_none() {
                site = Some(frames.len());
            }
            frames.push(AllocFrame {
                pc,
                module: placed.as_ref().map(|p| p.0.clone()),
                vaddr: placed.map(|p| p.1),
                skipped,
            });
        }
        AllocSite {
            requested_size: rec.size,
            frames,
            site,
        }
    }
}

/// The `.eh_frame` row covering `vaddr` of `img`, reduced to a [`FrameRule`].
pub fn eh_frame_rule(img: &ElfImage, vaddr: u64) -> Option<FrameRule> {
    use gimli::{
        BaseAddresses, CfaRule, EhFrame, LittleEndian, RegisterRule, UnwindSection, X86_64,
    };
    let (eh_addr, eh) = img.section(".eh_frame")?;
    let eh_frame = EhFrame::new(eh, LittleEndian);
    let mut bases = BaseAddresses::default().set_eh_frame(eh_addr);
    if let Some((text, _)) = img.section(".text") {
        bases = bases.set_text(text);
    }
    let mut ctx = gimli::UnwindContext::new();
    let row = eh_frame
        .unwind_info_for_address(&bases, &mut ctx, vaddr, EhFrame::cie_from_offset)
        .ok()?;
    let (cfa_from_bp, cfa_offset) = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } if *register == X86_64::RSP => {
            (false, *offset)
        }
        CfaRule::RegisterAndOffset { register, offset } if *register == X86_64::RBP => {
            (true, *offset)
        }
        _ => return None,
    };
    let bp_saved_at = match row.register(X86_64::RBP) {
        Some(RegisterRule::Offset(o)) => Some(o),
        None | Some(RegisterRule::Undefined | RegisterRule::SameValue) => None,
        Some(_) => return None,
    };
    let ra_at = match row.register(X86_64::RA) {
        Some(RegisterRule::Offset(o)) => o,
        _ => return None,
    };
    Some(FrameRule {
        cfa_from_bp,
        cfa_offset,
        bp_saved_at,
        ra_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::code_asm::*;

    fn assemble(f: impl FnOnce(&mut CodeAssembler) -> Result<(), IcedError>, at: u64) -> Vec<u8> {
        let mut a = CodeAssembler::new(64).unwrap();
        f(&mut a).unwrap();
        a.assemble(at).unwrap()
    }

    const PLT: u64 = 0x1000;
    fn in_plt(t: u64) -> bool {
        (PLT..PLT + 0x100).contains(&t)
    }

    #[test]
    fn system_modules_and_the_recorder_are_not_program_code() {
        assert!(is_system_module("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(is_system_module("/tmp/laser-alloc-1234.so"));
        assert!(!is_system_module("/tmp/laser-alloc-sites-O0-1/wrapped"));
        assert!(!is_system_module("/home/u/app"));
    }

    #[test]
    fn xmalloc_at_o2_and_o0_is_a_wrapper() {
        // -O2: sub rsp,8; call malloc@plt; test rax,rax; je err; add rsp,8; ret; err: call abort@plt
        let o2 = assemble(
            |a| {
                let mut err = a.create_label();
                a.sub(rsp, 8)?;
                a.call(PLT + 0x10)?;
                a.test(rax, rax)?;
                a.je(err)?;
                a.add(rsp, 8)?;
                a.ret()?;
                a.set_label(&mut err)?;
                a.call(PLT + 0x20)
            },
            0x2000,
        );
        assert!(is_alloc_wrapper(&o2, 0x2000, &in_plt, &mut |_| false));
        // -O0: push rbp; mov rbp,rsp; sub rsp,32; mov [rbp-20],rdi; mov rdi,[rbp-20];
        // call malloc@plt; mov [rbp-8],rax; mov rax,[rbp-8]; leave; ret
        let o0 = assemble(
            |a| {
                a.push(rbp)?;
                a.mov(rbp, rsp)?;
                a.sub(rsp, 32)?;
                a.mov(qword_ptr(rbp - 20), rdi)?;
                a.mov(rdi, qword_ptr(rbp - 20))?;
                a.call(PLT + 0x10)?;
                a.mov(qword_ptr(rbp - 8), rax)?;
                a.mov(rax, qword_ptr(rbp - 8))?;
                a.leave()?;
                a.ret()
            },
            0x2000,
        );
        assert!(is_alloc_wrapper(&o0, 0x2000, &in_plt, &mut |_| false));
    }

    #[test]
    fn constructors_and_main_are_not_wrappers() {
        // node_new: p = malloc(16); p->next = 0; return p
        let ctor = assemble(
            |a| {
                a.sub(rsp, 8)?;
                a.call(PLT + 0x10)?;
                a.mov(qword_ptr(rax), 0)?;
                a.add(rsp, 8)?;
                a.ret()
            },
            0x2000,
        );
        assert!(!is_alloc_wrapper(&ctor, 0x2000, &in_plt, &mut |_| false));
        // main: call malloc@plt; ... xor eax,eax; ret
        let main = assemble(
            |a| {
                a.sub(rsp, 8)?;
                a.call(PLT + 0x10)?;
                a.xor(eax, eax)?;
                a.add(rsp, 8)?;
                a.ret()
            },
            0x2000,
        );
        assert!(!is_alloc_wrapper(&main, 0x2000, &in_plt, &mut |_| false));
        // a call to a program function that is no wrapper
        let other = assemble(
            |a| {
                a.call(0x3000u64)?;
                a.ret()
            },
            0x2000,
        );
        assert!(!is_alloc_wrapper(&other, 0x2000, &in_plt, &mut |_| false));
        assert!(is_alloc_wrapper(&other, 0x2000, &in_plt, &mut |t| t == 0x3000));
    }

    /// Drawn: malloc was called from xmalloc (frame: 8 bytes of alignment + return address
    /// into main), main's frame is rbp-based (saved rbp at CFA-16).
    #[test]
    fn unwinds_sp_and_bp_frames_in_the_copy() {
        let rec = AllocRecord {
            ptr: 0x5000,
            size: 24,
            ret: 0x2005,                                              // in xmalloc
            sp: 0x7000,                                               // xmalloc: CFA = sp + 16
            bp: 0x7040,                                               // main's rbp
            stack: vec![0, 0x3010, 0, 0, 0, 0, 0, 0, 0x7100, 0x9999], // 0x7008: ret into main
        };
        let pcs = unwind(&rec, |pc| match pc {
            0x2000..=0x2fff => Some(FrameRule {
                cfa_from_bp: false,
                cfa_offset: 16,
                bp_saved_at: None,
                ra_at: -8,
            }),
            // main: CFA = rbp + 16, rbp saved at CFA-16, ra at CFA-8 (0x7048)
            0x3000..=0x3fff => Some(FrameRule {
                cfa_from_bp: true,
                cfa_offset: 16,
                bp_saved_at: Some(-16),
                ra_at: -8,
            }),
            _ => None,
        });
        assert_eq!(pcs, vec![0x2005, 0x3010, 0x9999]);
    }
}
