//! Writes the crafted perf.data fixtures of `tests/fixtures/perf_data/` (see the README
//! there): memory samples of the golden `fs` program (tests/fixtures/golden/fs, build-id
//! b2c6f761…) as `perf c2c record` on an Intel part and `perf mem record` on a Zen 4 part
//! would store them, with HITM and non-HITM `data_src` words.
//!
//! ```sh
//! cargo run -p laser-driver --example craft_perf_data -- laser-driver/tests/fixtures/perf_data
//! ```

use laser_driver::import::craft::{CraftAttr, PerfDataWriter};
use laser_driver::import::layout::feature;
use laser_driver::import::sample::{bits, RawSample, SampleLayout};

/// Where the crafted process mapped `fs` (a PIE): a typical x86-64 PIE base.
const BASE: u64 = 0x5599_3a20_0000;
/// Module offsets in `fs`, from `objdump -d tests/fixtures/golden/fs`:
///   11c0: mov (%rcx),%rax     counters.a++ load   (fs.c:22, main)
///   11c7: mov %rax,(%rcx)     counters.a++ store
///   13a0: mov 0x2d21(%rip),%rax   counters.b++ load  (fs.c:13, bump_b)
///   13ab: mov %rax,0x2d16(%rip)   counters.b++ store
const A_LOAD: u64 = 0x11c0;
const A_STORE: u64 = 0x11c7;
const B_LOAD: u64 = 0x13a0;
const B_STORE: u64 = 0x13ab;
/// `nm fs`: 40c0 B counters (`a` at +0, `b` at +8).
const COUNTERS: u64 = 0x40c0;
const BUILD_ID: [u8; 20] = [
    0xb2, 0xc6, 0xf7, 0x61, 0x2a, 0xd2, 0xfb, 0xcc, 0x7c, 0xc8, 0xfc, 0xb7, 0xe6, 0x9b, 0xe0, 0x68,
    0x86, 0x4f, 0x3f, 0x0a,
];
/// The path `fs` had on the machine that "recorded" the file.
const PATH: &str = "/build/app/fs";
const PID: u32 = 4000;
const T1: u32 = 4000; // main: counters.a
const T2: u32 = 4001; // bump_b: counters.b

/// `perf_mem_data_src` words (include/uapi/linux/perf_event.h), as the kernel's Intel
/// `pebs_data_source[]` and AMD `perf_ibs_get_data_src` fill them.
mod ds {
    const OP_LOAD: u64 = 0x02;
    const OP_STORE: u64 = 0x04;
    const LVL_HIT: u64 = 0x02 << 5;
    const LVL_L1: u64 = 0x08 << 5;
    const LVL_L3: u64 = 0x40 << 5;
    const LVL_REM_CCE1: u64 = 0x400 << 5;
    const SNOOP_NONE: u64 = 0x02 << 19;
    const SNOOP_HITM: u64 = 0x10 << 19;
    const LVLNUM_L1: u64 = 0x01 << 33;
    const LVLNUM_L3: u64 = 0x03 << 33;
    const LVLNUM_ANY_CACHE: u64 = 0x0b << 33;
    const REMOTE: u64 = 1 << 37;
    const SNOOPX_FWD: u64 = 0x01 << 38;
    const SNOOPX_PEER: u64 = 0x02 << 38;
    /// Intel "L3 hit, snoop HITM" (pebs_data_source[0x07]).
    pub const LOCAL_HITM: u64 = OP_LOAD | LVL_HIT | LVL_L3 | LVLNUM_L3 | SNOOP_HITM;
    /// Intel "L3 miss, snoop HITM" (pebs_data_source[0x09], remote cache).
    pub const REMOTE_HITM: u64 = OP_LOAD | LVL_HIT | LVL_REM_CCE1 | REMOTE | LVLNUM_L3 | SNOOP_HITM;
    /// An L1 hit: no transfer.
    pub const L1_HIT: u64 = OP_LOAD | LVL_HIT | LVL_L1 | LVLNUM_L1 | SNOOP_NONE;
    /// L3 hit forwarded by another core holding the line clean/owned: not HITM for c2c.
    pub const FWD: u64 = OP_LOAD | LVL_HIT | LVL_L3 | LVLNUM_L3 | SNOOPX_FWD;
    /// Intel stores: level only (`PERF_MEM_OP_STORE | L1 hit`).
    pub const STORE: u64 = OP_STORE | LVL_HIT | LVL_L1;
    /// AMD IBS (Zen 4): hit in a peer core's cache in Modified state.
    pub const IBS_PEER_HITM: u64 =
        OP_LOAD | LVL_HIT | LVL_L3 | LVLNUM_ANY_CACHE | SNOOP_HITM | SNOOPX_PEER;
    pub const IBS_STORE: u64 = OP_STORE | LVL_HIT | LVL_L1 | LVLNUM_L1;
}

const MEM_SAMPLE: u64 = bits::PERF_MEM;

fn layout() -> SampleLayout {
    SampleLayout {
        sample_type: MEM_SAMPLE,
        ..Default::default()
    }
}

fn header(w: &mut PerfDataWriter, cpu_desc: &str, cpuid: &str, cmd: &[&str]) {
    w.string(feature::HOSTNAME, "crafted");
    w.string(feature::OSRELEASE, "6.1.0-crafted");
    w.string(feature::VERSION, "6.1.187");
    w.string(feature::CPUDESC, cpu_desc);
    w.string(feature::CPUID, cpuid);
    w.cmdline(cmd);
    w.build_id(PID, PATH, &BUILD_ID);
}

/// The process's side-band: exec, the second thread's name, and `fs`'s mappings as
/// `/proc/PID/maps` shows them (text, rodata, relro, data+bss).
fn process(w: &mut PerfDataWriter, t0: u64) {
    w.comm(PID, T1, t0, "fs", true);
    let r = libc_prot(true, false);
    w.mmap2(PID, t0, BASE, 0x1000, 0, r, PATH);
    w.mmap2(
        PID,
        t0,
        BASE + 0x1000,
        0x1000,
        0x1000,
        libc_prot(true, true),
        PATH,
    );
    w.mmap2(PID, t0, BASE + 0x2000, 0x1000, 0x2000, r, PATH);
    w.mmap2(PID, t0, BASE + 0x3000, 0x1000, 0x2000, r, PATH);
    w.mmap2(PID, t0, BASE + 0x4000, 0x1000, 0x3000, 3, PATH);
    w.comm(PID, T2, t0 + 1, "fs", false);
}

fn libc_prot(read: bool, exec: bool) -> u32 {
    u32::from(read) | if exec { 4 } else { 0 }
}

struct Step {
    tid: u32,
    pc: u64,
    off: u64,
    data_src: u64,
    store: bool,
}

fn s(tid: u32, pc: u64, off: u64, data_src: u64, store: bool) -> Step {
    Step {
        tid,
        pc,
        off,
        data_src,
        store,
    }
}

/// Round A: every load is a HITM (T2 local, T1 remote): two contention events.
/// Round B: the same accesses with an L1 hit and a forwarded load: no contention event —
/// counted only if the importer mistook non-HITM loads for transfers.
fn rounds(hitm: &[u64; 2], quiet: &[u64; 2], store: u64, n_a: usize, n_b: usize) -> Vec<Step> {
    let mut v = Vec::new();
    let (mut a, mut b) = (n_a, n_b);
    for i in 0..n_a + n_b {
        let quiet_round = b > 0 && (i % 2 == 1 || a == 0);
        let (l2, l1) = if quiet_round {
            b -= 1;
            (quiet[0], quiet[1])
        } else {
            a -= 1;
            (hitm[0], hitm[1])
        };
        v.push(s(T1, A_STORE, 0, store, true));
        v.push(s(T2, B_LOAD, 8, l2, false));
        v.push(s(T2, B_STORE, 8, store, true));
        v.push(s(T1, A_LOAD, 0, l1, false));
    }
    v
}

fn emit(w: &mut PerfDataWriter, loads: usize, stores: usize, steps: &[Step], t0: u64) {
    for (i, st) in steps.iter().enumerate() {
        let addr = BASE + COUNTERS + st.off;
        let sample = RawSample {
            ip: Some(BASE + st.pc),
            pid: Some(PID),
            tid: Some(st.tid),
            time: Some(t0 + 1000 + i as u64 * 10_000),
            addr: Some(addr),
            cpu: Some(if st.tid == T1 { 0 } else { 1 }),
            weight: Some(if st.store { 0 } else { 180 }),
            data_src: Some(st.data_src),
            phys_addr: Some(0x1_2345_6000 | (addr & 0xfff)),
            ..Default::default()
        };
        let (attr, period) = if st.store {
            (stores, 10007)
        } else {
            (loads, 1009)
        };
        w.sample(
            attr,
            &RawSample {
                period: Some(period),
                ..sample
            },
        );
        if i % 64 == 63 {
            w.finished_round();
        }
    }
    w.finished_round();
}

/// Intel (Sapphire Rapids) `perf c2c record`: mem-loads-aux, mem-loads, mem-stores.
fn c2c_intel() -> Vec<u8> {
    let mut w = PerfDataWriter::default();
    let mk = |name: &str, config, config1, period, ids: Vec<u64>, precise| CraftAttr {
        name: name.into(),
        type_: 4,
        config,
        config1,
        sample_period: period,
        precise_ip: precise,
        layout: layout(),
        ids,
    };
    w.attr(mk("cpu/mem-loads-aux/", 0x8203, 0, 1009, vec![101, 102], 0));
    let loads = w.attr(mk(
        "cpu/mem-loads,ldlat=30/P",
        0x01cd,
        30,
        1009,
        vec![103, 104],
        3,
    ));
    let stores = w.attr(mk("cpu/mem-stores/P", 0x02cd, 0, 10007, vec![105, 106], 3));
    w.pmu(4, "cpu");
    w.pmu(1, "software");
    header(
        &mut w,
        "Intel(R) Xeon(R) Platinum 8480+",
        "GenuineIntel-6-8F-8",
        &["/usr/bin/perf", "c2c", "record", "--", "./fs", "0.5"],
    );
    let t0 = 7_000_000_000;
    process(&mut w, t0);
    let steps = rounds(
        &[ds::LOCAL_HITM, ds::REMOTE_HITM],
        &[ds::L1_HIT, ds::FWD],
        ds::STORE,
        30,
        20,
    );
    emit(&mut w, loads, stores, &steps, t0);
    w.finish()
}

/// AMD Zen 4 `perf mem record` (IBS op): one event, loads and stores.
fn mem_ibs() -> Vec<u8> {
    let mut w = PerfDataWriter::default();
    let ibs = w.attr(CraftAttr {
        name: "ibs_op//".into(),
        type_: 11,
        config: 1 << 19,
        config1: 0,
        sample_period: 100_000,
        precise_ip: 0,
        layout: layout(),
        ids: vec![201, 202],
    });
    w.pmu(11, "ibs_op");
    w.pmu(10, "ibs_fetch");
    w.pmu(4, "cpu");
    header(
        &mut w,
        "AMD EPYC 9654 96-Core Processor",
        "AuthenticAMD,25,17,1",
        &["/usr/bin/perf", "mem", "record", "--", "./fs", "0.5"],
    );
    let t0 = 9_000_000_000;
    process(&mut w, t0);
    let steps = rounds(
        &[ds::IBS_PEER_HITM, ds::IBS_PEER_HITM],
        &[ds::L1_HIT, ds::FWD],
        ds::IBS_STORE,
        25,
        10,
    );
    emit(&mut w, ibs, ibs, &steps, t0);
    w.finish()
}

fn main() {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "laser-driver/tests/fixtures/perf_data".into());
    for (name, bytes) in [
        ("fs-c2c-spr.perf.data", c2c_intel()),
        ("fs-mem-zen4-ibs.perf.data", mem_ibs()),
    ] {
        let p = std::path::Path::new(&dir).join(name);
        std::fs::write(&p, bytes).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        println!("wrote {}", p.display());
    }
}
