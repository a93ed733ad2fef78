//! Shared by the plan_* integration tests: executable memory, assembling test functions at a
//! chosen address, and installing a plan in-process (what `tracee` does to another process).

#![allow(dead_code)]

use iced_x86::code_asm::CodeAssembler;
use laser_repair::plan::{plan, CodeBytes, PlanOptions, PlanRequest, Refusal, RepairPlan};

/// An RWX anonymous mapping. Tests put original code, rewritten copies and code caches in
/// one mapping so everything is within ±2 GiB.
pub struct ExecArea {
    pub base: u64,
    pub len: usize,
}

impl ExecArea {
    pub fn new(len: usize) -> ExecArea {
        // SAFETY: a fresh anonymous private mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap RWX failed");
        ExecArea {
            base: p as u64,
            len,
        }
    }

    pub fn write(&self, addr: u64, bytes: &[u8]) {
        assert!(addr >= self.base && addr + bytes.len() as u64 <= self.base + self.len as u64);
        // SAFETY: the range was checked to lie inside our own mapping; no Rust reference
        // aliases it (code is only reached through raw function pointers).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len()) };
    }

    pub fn bytes(&self, addr: u64, len: usize) -> &[u8] {
        // SAFETY: inside our mapping (checked by the caller's layout), read-only view.
        unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
    }
}

impl Drop for ExecArea {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping created in `new`.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// Assembles `build` at `addr` and writes it there; returns its length.
pub fn place(area: &ExecArea, addr: u64, build: &dyn Fn(&mut CodeAssembler)) -> usize {
    let mut a = CodeAssembler::new(64).unwrap();
    build(&mut a);
    let bytes = a.assemble(addr).unwrap();
    area.write(addr, &bytes);
    bytes.len()
}

/// One test function placed twice: `native` untouched, `repaired` rewritten by the plan.
pub struct Twin {
    pub area: ExecArea,
    pub native: u64,
    pub repaired: u64,
    pub len: usize,
    pub plan: RepairPlan,
}

const COPY_GAP: u64 = 0x1_0000;
const CACHE_OFF: u64 = 0x10_0000;

/// Places the function built by `build` at two addresses, plans a repair of the second copy
/// for the PCs `pcs(copy_base)` gives, writes cache and patches. `pcs` gets the copy's base.
pub fn twin(
    build: &dyn Fn(&mut CodeAssembler),
    pcs: &dyn Fn(u64, &[u8]) -> Vec<u64>,
    opts: PlanOptions,
) -> Result<Twin, Refusal> {
    // The cache's data grows with the log capacity and thread slots.
    let area = ExecArea::new((CACHE_OFF + opts.cache_reservation()).max(4 << 20) as usize);
    let native = area.base;
    let repaired = area.base + COPY_GAP;
    let len = place(&area, native, build);
    place(&area, repaired, build);
    let code = area.bytes(repaired, len).to_vec();
    let src = CodeBytes {
        base: repaired,
        bytes: &code,
    };
    let pcs = pcs(repaired, &code);
    let req = PlanRequest {
        code: &src,
        function: Some((repaired, repaired + len as u64)),
        contending_pcs: &pcs,
        cache_addr: area.base + CACHE_OFF,
        options: opts,
    };
    let p = plan(&req)?;
    install(&area, &p);
    Ok(Twin {
        area,
        native,
        repaired,
        len,
        plan: p,
    })
}

/// What `tracee` does, in-process: cache first, then the entry patches.
pub fn install(area: &ExecArea, p: &RepairPlan) {
    area.write(p.cache.code_addr, &p.cache.code);
    for patch in &p.patches {
        assert_eq!(
            area.bytes(patch.addr, patch.old_bytes.len()),
            &patch.old_bytes[..]
        );
        area.write(patch.addr, &patch.new_bytes);
    }
}

/// PCs of every instruction in `code` (at `base`) that writes memory explicitly.
pub fn store_pcs(base: u64, code: &[u8]) -> Vec<u64> {
    use iced_x86::{Decoder, DecoderOptions, InstructionInfoFactory, OpAccess};
    let mut f = InstructionInfoFactory::new();
    Decoder::with_ip(64, code, base, DecoderOptions::NONE)
        .into_iter()
        .filter(|i| {
            f.info(i).used_memory().iter().any(|m| {
                matches!(m.access(), OpAccess::Write | OpAccess::ReadWrite)
                    && m.base() != iced_x86::Register::RSP
            })
        })
        .map(|i| i.ip())
        .collect()
}

pub type Fn2 = extern "C" fn(u64, u64) -> u64;
pub type Fn3 = extern "C" fn(u64, u64, u64) -> u64;

pub fn fn2(addr: u64) -> Fn2 {
    // SAFETY: `addr` is the entry of a function we assembled with the SysV ABI, 2 args.
    unsafe { std::mem::transmute::<usize, Fn2>(addr as usize) }
}

pub fn fn3(addr: u64) -> Fn3 {
    // SAFETY: as `fn2`, 3 args.
    unsafe { std::mem::transmute::<usize, Fn3>(addr as usize) }
}

/// Options that accept any region (litmus bodies are straight-line code with 1–3 stores).
pub fn permissive() -> PlanOptions {
    PlanOptions {
        min_stores_per_flush: 0.0,
        ..PlanOptions::default()
    }
}

/// A start line: each of `n` threads calls this once, and all return together, so the
/// threads run the code under test at the same time.
pub fn start_line(ready: &std::sync::atomic::AtomicU32, n: u32) {
    use std::sync::atomic::Ordering;
    // ATOMICS: AcqRel/Acquire so each thread sees every arrival before it leaves.
    ready.fetch_add(1, Ordering::AcqRel);
    while ready.load(Ordering::Acquire) < n {
        std::hint::spin_loop();
    }
}

/// `fn(counter: *mut u64, n: u64)`: n times `*counter += 1` through a register, the
/// false-sharing loop of DESIGN.md. One store location the loop never moves: a
/// fixed-address region.
pub fn counter_loop(a: &mut CodeAssembler) {
    use iced_x86::code_asm::*;
    let mut top = a.create_label();
    a.set_label(&mut top).unwrap();
    a.mov(rax, qword_ptr(rdi)).unwrap();
    a.add(rax, 1).unwrap();
    a.mov(qword_ptr(rdi), rax).unwrap();
    a.dec(rsi).unwrap();
    a.jnz(top).unwrap();
    a.ret().unwrap();
}

/// `len` pseudo-random bytes from `seed` (an LCG: the same on every run).
pub fn seeded(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 56) as u8
        })
        .collect()
}

/// This thread's CPU time in seconds (the lreg tests time their workers by it: wall time on a
/// shared 2-vCPU machine counts other processes' time too).
pub fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into a valid local.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
