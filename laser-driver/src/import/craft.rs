//! Writing perf.data files: the fixture generator for `laser import` tests and the fuzz
//! corpus. It writes what perf 6.x writes for `perf mem record` / `perf c2c record` (an attr
//! section, `EVENT_DESC` with ids, sample ids on every record, header strings, PMU mappings,
//! build-ids) — only the parts the importer reads, byte for byte in perf's layout, so a file
//! written here is one the real tool could have produced: `perf report`, `perf script` and
//! `perf c2c report` (perf 6.1) read them, which the tests use as an independent check.

use super::layout::feature;
use super::sample::{self, bits, RawSample, SampleLayout};

const PERF_RECORD_MMAP2: u32 = 10;
const PERF_RECORD_COMM: u32 = 3;
const PERF_RECORD_SAMPLE: u32 = 9;
const PERF_RECORD_FINISHED_ROUND: u32 = 68;
const MISC_USER: u16 = 2;
const MISC_COMM_EXEC: u16 = 1 << 13;
/// `sizeof(struct perf_event_attr)` at `PERF_ATTR_SIZE_VER7` (128), what perf 5.13–6.2
/// writes; perf 6.1 refuses larger attrs ("more recent and unsupported ABI").
const ATTR_SIZE: usize = 128;

/// One event of the file.
#[derive(Clone, Debug)]
pub struct CraftAttr {
    /// `cpu/mem-loads,ldlat=30/P`.
    pub name: String,
    pub type_: u32,
    pub config: u64,
    pub config1: u64,
    pub sample_period: u64,
    pub precise_ip: u8,
    pub layout: SampleLayout,
    /// Sample ids of this event (one per CPU in a real file); the first is used in records.
    pub ids: Vec<u64>,
}

/// A perf.data file being assembled in memory.
#[derive(Default)]
pub struct PerfDataWriter {
    attrs: Vec<CraftAttr>,
    data: Vec<u8>,
    strings: Vec<(u32, String)>,
    cmdline: Vec<String>,
    pmus: Vec<(u32, String)>,
    build_ids: Vec<(u32, String, Vec<u8>)>,
}

fn pad8(v: &mut Vec<u8>) {
    while !v.len().is_multiple_of(8) {
        v.push(0);
    }
}

fn header_string(out: &mut Vec<u8>, s: &str) {
    // perf pads header strings to a multiple of NAME_ALIGN (64) with NULs.
    let len = (s.len() + 1).div_ceil(64) * 64;
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
    out.resize(out.len() + len - s.len(), 0);
}

impl PerfDataWriter {
    /// Adds an event; returns its index for [`PerfDataWriter::sample`].
    pub fn attr(&mut self, a: CraftAttr) -> usize {
        self.attrs.push(a);
        self.attrs.len() - 1
    }

    /// A header string feature (`HOSTNAME`, `OSRELEASE`, `VERSION`, `CPUDESC`, `CPUID`).
    pub fn string(&mut self, feature: u32, s: &str) {
        self.strings.push((feature, s.to_string()));
    }

    pub fn cmdline(&mut self, args: &[&str]) {
        self.cmdline = args.iter().map(|s| s.to_string()).collect();
    }

    pub fn pmu(&mut self, type_: u32, name: &str) {
        self.pmus.push((type_, name.to_string()));
    }

    pub fn build_id(&mut self, pid: u32, path: &str, id: &[u8]) {
        self.build_ids.push((pid, path.to_string(), id.to_vec()));
    }

    /// The `sample_id_all` trailer of a non-sample record, for event 0.
    fn sample_id(&self, pid: u32, tid: u32, time: u64, cpu: u32) -> Vec<u8> {
        let a = &self.attrs[0];
        let st = a.layout.sample_type;
        let mut v = Vec::new();
        let mut put = |x: u64| v.extend_from_slice(&x.to_le_bytes());
        if st & bits::TID != 0 {
            put(u64::from(pid) | u64::from(tid) << 32);
        }
        if st & bits::TIME != 0 {
            put(time);
        }
        if st & bits::ID != 0 {
            put(a.ids[0]);
        }
        if st & bits::CPU != 0 {
            put(u64::from(cpu));
        }
        if st & bits::IDENTIFIER != 0 {
            put(a.ids[0]);
        }
        v
    }

    fn record(&mut self, type_: u32, misc: u16, body: &[u8]) {
        let size = 8 + body.len();
        self.data.extend_from_slice(&type_.to_le_bytes());
        self.data.extend_from_slice(&misc.to_le_bytes());
        self.data.extend_from_slice(&(size as u16).to_le_bytes());
        self.data.extend_from_slice(body);
    }

    /// `PERF_RECORD_COMM` (with `exec`, the name a process got at execve).
    pub fn comm(&mut self, pid: u32, tid: u32, time: u64, name: &str, exec: bool) {
        let mut b = Vec::new();
        b.extend_from_slice(&pid.to_le_bytes());
        b.extend_from_slice(&tid.to_le_bytes());
        b.extend_from_slice(name.as_bytes());
        b.push(0);
        pad8(&mut b);
        b.extend(self.sample_id(pid, tid, time, 0));
        let misc = MISC_USER | if exec { MISC_COMM_EXEC } else { 0 };
        self.record(PERF_RECORD_COMM, misc, &b);
    }

    /// `PERF_RECORD_MMAP2` (inode form; build-ids go in the `BUILD_ID` section, as perf
    /// writes them without `--buildid-mmap`).
    #[allow(clippy::too_many_arguments)]
    pub fn mmap2(
        &mut self,
        pid: u32,
        time: u64,
        addr: u64,
        len: u64,
        pgoff: u64,
        prot: u32,
        path: &str,
    ) {
        let mut b = Vec::new();
        for v in [u64::from(pid) | u64::from(pid) << 32, addr, len, pgoff] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&8u32.to_le_bytes()); // maj
        b.extend_from_slice(&1u32.to_le_bytes()); // min
        b.extend_from_slice(&4242u64.to_le_bytes()); // ino
        b.extend_from_slice(&0u64.to_le_bytes()); // ino_generation
        b.extend_from_slice(&prot.to_le_bytes());
        b.extend_from_slice(&2u32.to_le_bytes()); // MAP_PRIVATE
        b.extend_from_slice(path.as_bytes());
        b.push(0);
        pad8(&mut b);
        b.extend(self.sample_id(pid, pid, time, 0));
        self.record(PERF_RECORD_MMAP2, MISC_USER, &b);
    }

    /// A sample of event `attr` (its first id is filled in).
    pub fn sample(&mut self, attr: usize, s: &RawSample) {
        let a = &self.attrs[attr];
        let s = RawSample {
            id: Some(a.ids[0]),
            ..*s
        };
        let body = sample::write(&s, &a.layout);
        self.record(PERF_RECORD_SAMPLE, MISC_USER, &body);
    }

    /// `PERF_RECORD_FINISHED_ROUND`: everything before may be sorted and emitted.
    pub fn finished_round(&mut self) {
        self.record(PERF_RECORD_FINISHED_ROUND, 0, &[]);
    }

    fn attr_bytes(a: &CraftAttr) -> Vec<u8> {
        let mut v = vec![0u8; ATTR_SIZE];
        let mut put = |off: usize, bytes: &[u8]| v[off..off + bytes.len()].copy_from_slice(bytes);
        put(0, &a.type_.to_le_bytes());
        put(4, &(ATTR_SIZE as u32).to_le_bytes());
        put(8, &a.config.to_le_bytes());
        put(16, &a.sample_period.to_le_bytes());
        put(24, &a.layout.sample_type.to_le_bytes());
        put(32, &a.layout.read_format.to_le_bytes());
        // Flags: disabled, inherit, mmap, comm, enable_on_exec, task, precise_ip (bits
        // 15–16), mmap_data, sample_id_all, mmap2, comm_exec — what perf mem record sets.
        let flags: u64 = 1
            | 1 << 1
            | 1 << 8
            | 1 << 9
            | 1 << 12
            | 1 << 13
            | u64::from(a.precise_ip & 3) << 15
            | 1 << 17
            | 1 << 18
            | 1 << 23
            | 1 << 24;
        put(40, &flags.to_le_bytes());
        put(56, &a.config1.to_le_bytes());
        put(72, &a.layout.branch_sample_type.to_le_bytes());
        put(80, &a.layout.regs_user.to_le_bytes());
        put(96, &a.layout.regs_intr.to_le_bytes());
        v
    }

    /// The file's bytes.
    pub fn finish(&self) -> Vec<u8> {
        const HEADER: usize = 104;
        let file_attr = ATTR_SIZE + 16;
        // Layout: header | ids | attrs | data | feature table | feature sections.
        let mut ids = Vec::new();
        let mut id_secs = Vec::new();
        for a in &self.attrs {
            id_secs.push(((HEADER + ids.len()) as u64, (a.ids.len() * 8) as u64));
            for id in &a.ids {
                ids.extend_from_slice(&id.to_le_bytes());
            }
        }
        let attrs_off = HEADER + ids.len();
        let mut attrs = Vec::new();
        for (a, (off, size)) in self.attrs.iter().zip(&id_secs) {
            attrs.extend(Self::attr_bytes(a));
            attrs.extend_from_slice(&off.to_le_bytes());
            attrs.extend_from_slice(&size.to_le_bytes());
        }
        let data_off = attrs_off + attrs.len();
        let mut features: Vec<(u32, Vec<u8>)> = Vec::new();
        if !self.build_ids.is_empty() {
            let mut s = Vec::new();
            for (pid, path, id) in &self.build_ids {
                let mut name = path.as_bytes().to_vec();
                name.push(0);
                name.resize(name.len().div_ceil(64) * 64, 0);
                let size = 8 + 4 + 24 + name.len();
                s.extend_from_slice(&0u32.to_le_bytes());
                s.extend_from_slice(&(MISC_USER | 1 << 15).to_le_bytes());
                s.extend_from_slice(&(size as u16).to_le_bytes());
                s.extend_from_slice(&pid.to_le_bytes());
                let mut slot = [0u8; 24];
                let n = id.len().min(20);
                slot[..n].copy_from_slice(&id[..n]);
                slot[20] = n as u8;
                s.extend_from_slice(&slot);
                s.extend(name);
            }
            features.push((feature::BUILD_ID, s));
        }
        for (f, text) in &self.strings {
            let mut s = Vec::new();
            header_string(&mut s, text);
            features.push((*f, s));
        }
        if !self.cmdline.is_empty() {
            let mut s = (self.cmdline.len() as u32).to_le_bytes().to_vec();
            for a in &self.cmdline {
                header_string(&mut s, a);
            }
            features.push((feature::CMDLINE, s));
        }
        let mut desc = (self.attrs.len() as u32).to_le_bytes().to_vec();
        desc.extend_from_slice(&(ATTR_SIZE as u32).to_le_bytes());
        for a in &self.attrs {
            desc.extend(Self::attr_bytes(a));
            desc.extend_from_slice(&(a.ids.len() as u32).to_le_bytes());
            header_string(&mut desc, &a.name);
            for id in &a.ids {
                desc.extend_from_slice(&id.to_le_bytes());
            }
        }
        features.push((feature::EVENT_DESC, desc));
        // A 2-CPU, 1-node machine: `perf c2c report` refuses files without the topology.
        let mut nr = 2u32.to_le_bytes().to_vec();
        nr.extend_from_slice(&2u32.to_le_bytes());
        features.push((feature::NRCPUS, nr));
        let mut numa = 1u32.to_le_bytes().to_vec();
        numa.extend_from_slice(&0u32.to_le_bytes()); // node 0
        numa.extend_from_slice(&(16u64 << 20).to_le_bytes()); // mem_total (kB)
        numa.extend_from_slice(&(8u64 << 20).to_le_bytes()); // mem_free
        header_string(&mut numa, "0-1");
        features.push((feature::NUMA_TOPOLOGY, numa));
        // One memory node of 128 blocks of 128 MiB (16 GiB) holding every physical address
        // the samples carry: version, block size, node count, then node, size, bitmap.
        let mut mem = Vec::new();
        for v in [1u64, 128 << 20, 1, 0, 128, 128, u64::MAX, u64::MAX] {
            mem.extend_from_slice(&v.to_le_bytes());
        }
        features.push((feature::MEM_TOPOLOGY, mem));
        if !self.pmus.is_empty() {
            let mut s = (self.pmus.len() as u32).to_le_bytes().to_vec();
            for (t, n) in &self.pmus {
                s.extend_from_slice(&t.to_le_bytes());
                header_string(&mut s, n);
            }
            features.push((feature::PMU_MAPPINGS, s));
        }
        features.sort_by_key(|f| f.0);

        let mut out = Vec::new();
        out.extend_from_slice(b"PERFILE2");
        let mut bits_words = [0u64; 4];
        for (f, _) in &features {
            bits_words[(*f / 64) as usize] |= 1 << (f % 64);
        }
        for v in [
            HEADER as u64,
            file_attr as u64,
            attrs_off as u64,
            attrs.len() as u64,
            data_off as u64,
            self.data.len() as u64,
            0,
            0,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for w in bits_words {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend(ids);
        out.extend(attrs);
        out.extend(&self.data);
        let table_len = features.len() * 16;
        let mut off = out.len() + table_len;
        for (_, s) in &features {
            out.extend_from_slice(&(off as u64).to_le_bytes());
            out.extend_from_slice(&(s.len() as u64).to_le_bytes());
            off += s.len();
        }
        for (_, s) in &features {
            out.extend(s);
        }
        out
    }
}
