//! Integration: a real C program compiled with gcc, its code read through `ElfCode` at a PIE
//! load bias, and synthetic soft samples at the real PCs of its loop. The detector must decode
//! the real instructions, compute the addresses from registers, and name the global's line
//! and the instructions by module + ELF vaddr.

mod elf_common;

use std::path::PathBuf;

use iced_x86::{Decoder, DecoderOptions, OpKind, Register};
use laser_detect::{Config, Detector, ElfCode, Kind, Location};
use laser_driver::{Event, Mmap, Reg, Sample, UserRegs};
use object::{Object, ObjectSegment, ObjectSymbol};

const SRC: &str = r#"
struct pair { long a; long b; } shared;
void __attribute__((noinline)) work(long *p, long n) {
    for (long i = 0; i < n; i++) {
        *p += 1;
        __asm__ volatile("" ::: "memory");
    }
}
int main(int argc, char **argv) { (void)argv; work(&shared.a, argc); work(&shared.b, argc); return 0; }
"#;

fn build(seed: Seed) -> PathBuf {
    elf_common::gcc_pie(&format!("detect-elf-{seed:?}"), SRC, "-O1")
}

/// How the detector learns the address space: maps text (attach, recording header) or Mmap
/// events (launch, dlopen).
#[derive(Clone, Copy, Debug)]
enum Seed {
    MapsText,
    MmapEvents,
}

#[test]
fn real_loop_pcs_through_elf_code_source_from_maps_text() {
    run(Seed::MapsText);
}

#[test]
fn real_loop_pcs_through_elf_code_source_from_mmap_events() {
    run(Seed::MmapEvents);
}

fn run(seed: Seed) {
    let exe = build(seed);
    let path = exe.to_str().unwrap().to_string();
    let data = std::fs::read(&exe).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let sym = |name: &str| {
        file.symbols()
            .find(|s| s.name() == Ok(name))
            .unwrap_or_else(|| panic!("symbol {name}"))
    };
    let work = sym("work");
    let shared = sym("shared").address();
    // Find the loop's memory instruction: `add qword [rdi], 1` or similar RMW through a register.
    let text = file
        .segments()
        .find(|s| s.address() <= work.address() && work.address() < s.address() + s.size())
        .unwrap();
    let (off, _) = text.file_range();
    let start = (off + work.address() - text.address()) as usize;
    let bytes = &data[start..start + work.size() as usize];
    let mut dec = Decoder::with_ip(64, bytes, work.address(), DecoderOptions::NONE);
    let mut target = None;
    while dec.can_decode() {
        let i = dec.decode();
        if i.op0_kind() == OpKind::Memory && i.memory_base() != Register::RSP {
            target = Some((i.ip(), i.memory_base(), i.next_ip()));
            break;
        }
    }
    let (rmw_vaddr, base, next_vaddr) = target.expect("a store through a pointer in work()");
    let base = match base {
        Register::RDI => Reg::Di,
        Register::RAX => Reg::Ax,
        Register::RDX => Reg::Dx,
        Register::RCX => Reg::Cx,
        r => panic!("unexpected base {r:?}"),
    };

    let bias = 0x5555_5555_0000u64;
    let mut d = Detector::new(Config::default(), ElfCode::new());
    let maps = elf_common::maps_text(&path, &data, bias);
    match seed {
        Seed::MapsText => d.add_maps(7, &maps),
        Seed::MmapEvents => {
            for r in laser_detect::decode::maps::parse(&maps) {
                d.feed(&Event::Mmap(Mmap {
                    pid: 7,
                    tid: 7,
                    time: 1,
                    addr: r.start,
                    len: r.end - r.start,
                    pgoff: r.offset,
                    prot: (r.read as u32) | (r.write as u32) << 1 | (r.exec as u32) << 2,
                    flags: 0x2, // MAP_PRIVATE
                    path: r.path.clone(),
                    build_id: None,
                }));
            }
        }
    }
    let mut t = 1_000_000u64;
    for i in 0..100u64 {
        for (tid, field) in [(1u32, 0u64), (2, 8)] {
            // Alternate between sampling AT the RMW and right after it (skid).
            let ip = bias + if i % 2 == 0 { rmw_vaddr } else { next_vaddr };
            let mut regs = UserRegs::default();
            for r in [Reg::Ax, Reg::Cx, Reg::Dx, Reg::Si, Reg::Di, Reg::Sp] {
                regs.set(r, 0);
            }
            regs.set(base, bias + shared + field);
            regs.set(Reg::Sp, 0x7ffd_0000_1000);
            t += 50_000;
            d.feed(&Event::Sample(Sample::soft(7, tid, tid, t, ip, regs)));
        }
    }
    let a = d.finish();
    assert_eq!(a.findings.len(), 1, "{:#?}\n{:?}", a.findings, a.notes);
    let f = &a.findings[0];
    assert_eq!(f.kind, Kind::FalseSharing);
    assert_eq!(f.line_addr, (bias + shared) & !63);
    assert_eq!(
        f.data,
        Location::Module {
            path: path.clone(),
            vaddr: shared & !63
        },
        "the global's line, as an ELF vaddr"
    );
    assert_eq!(f.sources.len(), 1, "{:#?}", f.sources);
    assert_eq!(f.sources[0].pc, bias + rmw_vaddr);
    assert_eq!(
        f.sources[0].code,
        Location::Module {
            path: path.clone(),
            vaddr: rmw_vaddr
        }
    );
    let lo = (shared % 64) as u32;
    assert_eq!(f.sources[0].offsets, 0xffffu128 << lo);
    assert_eq!(a.modules.len(), 1);
    assert_eq!(a.modules[0].bias, bias);
    assert!(a.modules[0].build_id.is_some(), "gcc emits a GNU build-id");
    let _ = std::fs::remove_dir_all(exe.parent().unwrap());
}
