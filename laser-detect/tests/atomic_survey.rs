//! Integration: a real C program that calls `rand()` between long computations, compiled with
//! gcc, and the machine's own glibc, both read through `ElfCode` at load biases. Timer samples
//! of two threads in the computation (a leaf function) must put glibc's `rand()` lock, which no
//! sample touched, into the watch survey's plan: the leaf's caller calls a helper beside it,
//! the helper calls `rand@plt`, the PLT stub names `rand`, glibc's `rand` calls `__random`, and
//! `__random` updates the lock with a `lock cmpxchg` at a RIP-relative address (issue 11,
//! class 2).

mod elf_common;

use std::path::PathBuf;

use iced_x86::{Decoder, DecoderOptions};
use laser_detect::model::survey::SurveySource;
use laser_detect::{Config, Detector, ElfCode};
use laser_driver::{Event, Reg, Sample, UserRegs};
use object::{Object, ObjectSegment, ObjectSymbol};

const SRC: &str = r#"
#include <stdlib.h>
unsigned long __attribute__((noinline)) work(unsigned long h, int k) {
    for (int i = 0; i < k; i++)
        h = h * 6364136223846793005UL + 1442695040888963407UL;
    return h;
}
unsigned long __attribute__((noinline)) draw(unsigned long acc) {
    return acc + (unsigned long)rand();
}
unsigned long __attribute__((noinline)) run(long n, int k) {
    unsigned long h = 1, acc = 0;
    for (long i = 0; i < n; i++) {
        h = work(h, k);
        acc = draw(acc);
    }
    return acc ^ h;
}
int main(int argc, char **argv) { (void)argv; return (int)run(argc, argc); }
"#;

fn build() -> PathBuf {
    elf_common::gcc_pie("atomic-survey", SRC, "-O2")
}

/// The C library the test program runs with: the one gcc links against on this machine.
/// (This test is linked statically, so its own maps have none.)
fn own_libc() -> String {
    let out = std::process::Command::new("gcc")
        .arg("-print-file-name=libc.so.6")
        .output()
        .expect("gcc runs");
    let named = String::from_utf8(out.stdout).unwrap();
    let path = std::fs::canonicalize(named.trim()).expect("gcc names an existing libc.so.6");
    path.to_str().unwrap().to_string()
}

/// ELF vaddrs of the words the function `name` of `data` updates with a locked instruction at
/// a RIP-relative address.
fn locked_words(data: &[u8], name: &str) -> Vec<u64> {
    let f = object::File::parse(data).unwrap();
    let s = f
        .dynamic_symbols()
        .find(|s| s.name() == Ok(name))
        .unwrap_or_else(|| panic!("{name} in glibc's dynamic symbols"));
    let seg = f
        .segments()
        .find(|g| g.address() <= s.address() && s.address() < g.address() + g.size())
        .unwrap();
    let at = (seg.file_range().0 + s.address() - seg.address()) as usize;
    let mut d = Decoder::with_ip(
        64,
        &data[at..at + s.size() as usize],
        s.address(),
        DecoderOptions::NONE,
    );
    let mut out = Vec::new();
    while d.can_decode() {
        let i = d.decode();
        if i.has_lock_prefix() && i.is_ip_rel_memory_operand() {
            out.push(i.ip_rel_memory_address());
        }
    }
    out
}

fn sample_at(ip: u64, tid: u32) -> Event {
    let mut regs = UserRegs::default();
    for r in [Reg::Ax, Reg::Cx, Reg::Dx, Reg::Si, Reg::Di] {
        regs.set(r, 0);
    }
    regs.set(Reg::Sp, 0x7ffd_0000_1000);
    Event::Sample(Sample::soft(7, tid, tid, 1_000_000, ip, regs))
}

#[test]
fn a_sample_in_the_computation_puts_glibcs_rand_lock_in_the_survey() {
    let exe = build();
    let path = exe.to_str().unwrap().to_string();
    let data = std::fs::read(&exe).unwrap();
    let libc = own_libc();
    let libc_data = std::fs::read(&libc).unwrap();
    // glibc's `random` (`__random`) locks around `random_r`: the lock word, as an ELF vaddr.
    let lock = locked_words(&libc_data, "random");
    assert!(!lock.is_empty(), "glibc's random() takes a lock");

    let (bias, libc_bias) = (0x5555_5555_0000u64, 0x7f00_0000_0000u64);
    let file = object::File::parse(&*data).unwrap();
    let work = file
        .symbols()
        .find(|s| s.name() == Ok("work"))
        .unwrap()
        .address();
    let plan_after = |samples: &[(u64, u32)]| {
        let mut d = Detector::new(Config::default(), ElfCode::new());
        // The program first, then its C library: the order the loader maps them.
        d.add_maps(
            7,
            &(elf_common::maps_text(&path, &data, bias)
                + &elf_common::maps_text(&libc, &libc_data, libc_bias)),
        );
        for &(ip, tid) in samples {
            d.feed(&sample_at(ip, tid));
        }
        d.survey_plan(&[])
            .into_iter()
            .filter(|t| t.source == SurveySource::Atomic)
            .flat_map(|t| t.watch.words.into_iter().map(|w| w.0))
            .collect::<Vec<u64>>()
    };
    // A PC inside `work`, one instruction in (the sample's PC follows the instruction that
    // ran: the first one's end is an instruction boundary).
    let at = file
        .segments()
        .find(|g| g.address() <= work && work < g.address() + g.size())
        .map(|g| (g.file_range().0 + work - g.address()) as usize)
        .unwrap();
    let next = Decoder::with_ip(64, &data[at..at + 16], work, DecoderOptions::NONE)
        .decode()
        .next_ip();
    let ip = bias + next;
    let words = plan_after(&[(ip, 7), (ip, 8)]);
    let slots: Vec<u64> = lock.iter().map(|&v| (v + libc_bias) & !7).collect();
    assert!(
        slots.iter().any(|s| words.contains(s)),
        "the lock's slot {slots:x?} among the atomic survey words {words:x?}"
    );
    // One thread sampled there, however often, cannot contend with itself: no such words
    // (Phoenix kmeans draws its points with rand() in the main thread alone).
    assert!(plan_after(&[(ip, 7), (ip, 7), (ip, 7)]).is_empty());
    assert!(plan_after(&[]).is_empty());
    let _ = std::fs::remove_dir_all(exe.parent().unwrap());
}
