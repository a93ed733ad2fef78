//! A perf.data file (as `perf record`, `perf mem record` and `perf c2c record` write it) to
//! laser's [`Event`] stream, through `linux-perf-data` for the file structure and record order
//! (it sorts records by time between `FINISHED_ROUND` markers, as perf's ordered-events does)
//! and [`super::sample`] for sample bodies.
//!
//! Which backend a sample counts as follows from its attr:
//! - a PMU event with `DATA_SRC` (`mem-loads,ldlat=N`, `mem-stores`, `ibs_op//`): a precise
//!   memory sample — `ibs` when the attr's PMU is `ibs_op` (from the `PMU_MAPPINGS` section),
//!   `pebs` otherwise. Weight = the sample's period.
//! - anything else (e.g. `cpu-clock`): a `soft` sample; with `--user-regs` recorded its
//!   registers give the data address exactly as a live soft run's do.

use std::io::Cursor;

use linux_perf_data::{PerfFileReader, PerfFileRecord};
use linux_perf_event_reader::{PerfEventType, RecordType, SamplingPolicy};

use super::layout::{self, feature};
use super::sample::{self, SampleLayout};
use super::ImportError;
use crate::datasrc::DataSrc;
use crate::decode::{parser_safe, side_band};
use crate::event::{BackendKind, Callers, Event, Sample};

/// What the file says about where and how it was recorded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PerfInfo {
    pub hostname: Option<String>,
    pub os_release: Option<String>,
    pub perf_version: Option<String>,
    pub cpu_desc: Option<String>,
    /// e.g. `GenuineIntel-6-8F-8`.
    pub cpuid: Option<String>,
    /// The perf command line.
    pub cmdline: Vec<String>,
    /// Per attr: its name (`cpu/mem-loads,ldlat=30/P`) and the backend its samples count as.
    pub events: Vec<(String, BackendKind)>,
    pub pmus: Vec<(u32, String)>,
    /// (path, build-id) of every binary perf found samples in.
    pub build_ids: Vec<(String, Vec<u8>)>,
}

/// Counts over the whole file, c2c's way for memory samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImportCounts {
    pub records: u64,
    pub samples: u64,
    /// Samples with a `data_src`.
    pub memory_samples: u64,
    pub loads: u64,
    pub stores: u64,
    /// Loads `perf c2c` counts as local or remote HITM (non-zero data address).
    pub hitm: u64,
    /// Loads c2c counts as peer transfers (AMD, ARM) and not HITM.
    pub peer: u64,
    /// Loads whose `data_src` names where they were served from without a transfer (L1/L2/
    /// LFB hits, forwards, memory): not contention, and dropped by the detector.
    pub no_transfer: u64,
    /// Records that could not be parsed (skipped).
    pub malformed: u64,
}

#[derive(Clone, Debug, Default)]
pub struct PerfImport {
    pub info: PerfInfo,
    /// In time order.
    pub events: Vec<Event>,
    pub counts: ImportCounts,
    /// Why reading stopped before the end of the data, if it did: everything before is kept.
    pub stopped: Option<String>,
    /// First and last sample time (perf clock, ns).
    pub time_span: Option<(u64, u64)>,
}

impl PerfImport {
    /// Seconds between the first and the last sample (0 with fewer than two).
    pub fn duration_s(&self) -> f64 {
        self.time_span
            .map_or(0.0, |(a, b)| b.saturating_sub(a) as f64 / 1e9)
    }
}

struct AttrPlan {
    layout: SampleLayout,
    backend: BackendKind,
    fixed_period: Option<u64>,
}

/// Reads a whole perf.data file. Errors only when the header or attrs are unusable; damage
/// in the records ends the import there ([`PerfImport::stopped`]).
pub fn read(bytes: &[u8]) -> Result<PerfImport, ImportError> {
    let lay = layout::check(bytes)?;
    let mut info = PerfInfo::default();
    let string = |n| {
        lay.section(bytes, n)
            .and_then(layout::header_string)
            .map(|(s, _)| s)
    };
    info.hostname = string(feature::HOSTNAME);
    info.os_release = string(feature::OSRELEASE);
    info.perf_version = string(feature::VERSION);
    info.cpu_desc = string(feature::CPUDESC);
    info.cpuid = string(feature::CPUID);
    info.cmdline = lay
        .section(bytes, feature::CMDLINE)
        .map(layout::string_list)
        .unwrap_or_default();
    info.pmus = lay
        .section(bytes, feature::PMU_MAPPINGS)
        .map(layout::pmu_mappings)
        .unwrap_or_default();
    info.build_ids = lay
        .section(bytes, feature::BUILD_ID)
        .map(layout::build_ids)
        .unwrap_or_default();

    // Damage inside the data section (a cut-off last record, a forged size) is overwritten
    // with filler records in a copy, so the reader returns every record before it instead of
    // failing in the middle of a sorting round (losing the round) or trusting the size.
    let cut = layout::damage(bytes, lay.data);
    let filled;
    let reader_bytes = match cut {
        Some(d) => {
            let mut t = bytes.to_vec();
            layout::fill(&mut t, lay.data, d);
            filled = t;
            &filled[..]
        }
        None => bytes,
    };
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = PerfFileReader::parse_file(Cursor::new(reader_bytes))
        .map_err(|e| ImportError::Reader(e.to_string()))?;
    let plans: Vec<AttrPlan> = perf_file
        .event_attributes()
        .iter()
        .map(|d| {
            let a = &d.attr;
            // `perf record -d` adds DATA_SRC to any event, cpu-clock included (the kernel
            // leaves it 0 there): only PMU events carry a real one.
            let memory = a.sample_format.bits() & sample::bits::DATA_SRC != 0
                && matches!(
                    a.type_,
                    PerfEventType::DynamicPmu(..)
                        | PerfEventType::Hardware(..)
                        | PerfEventType::HwCache(..)
                );
            let pmu = match a.type_ {
                PerfEventType::DynamicPmu(t, ..) => info
                    .pmus
                    .iter()
                    .find(|(pt, _)| *pt == t)
                    .map(|(_, n)| n.as_str()),
                _ => None,
            };
            let backend = match (memory, pmu) {
                (true, Some("ibs_op")) => BackendKind::Ibs,
                (true, _) => BackendKind::Pebs,
                (false, _) => BackendKind::Soft,
            };
            AttrPlan {
                layout: SampleLayout {
                    sample_type: a.sample_format.bits(),
                    read_format: a.read_format.bits(),
                    branch_sample_type: a.branch_sample_format.bits(),
                    regs_user: a.sample_regs_user,
                    regs_intr: a.sample_regs_intr,
                },
                backend,
                fixed_period: match a.sampling_policy {
                    SamplingPolicy::Period(p) => Some(p.get()),
                    _ => None,
                },
            }
        })
        .collect();
    info.events = perf_file
        .event_attributes()
        .iter()
        .zip(&plans)
        .map(|(d, p)| (d.name().unwrap_or("?").to_string(), p.backend))
        .collect();

    let mut out = PerfImport {
        info,
        stopped: cut.map(|(keep, _)| {
            format!(
                "the record at byte {keep} of the data section is cut off or malformed; the \
                 records before it were read"
            )
        }),
        ..Default::default()
    };
    loop {
        let rec = match record_iter.next_record(&mut perf_file) {
            Ok(Some(r)) => r,
            Ok(None) => break,
            Err(e) => {
                out.stopped.get_or_insert(e.to_string());
                break;
            }
        };
        out.counts.records += 1;
        let PerfFileRecord::EventRecord { attr_index, record } = rec else {
            continue; // perf's own records (finished round, build ids, …)
        };
        if record.record_type == RecordType::SAMPLE {
            let Some(plan) = plans.get(attr_index) else {
                out.counts.malformed += 1;
                continue;
            };
            let body = record.data.as_slice();
            let Some(s) = sample::parse(&body, &plan.layout) else {
                out.counts.malformed += 1;
                continue;
            };
            let e = to_sample(&s, plan, &mut out.counts);
            let t = e.time;
            out.time_span = Some(match out.time_span {
                Some((a, b)) => (a.min(t), b.max(t)),
                None => (t, t),
            });
            out.events.push(Event::Sample(e));
        } else {
            if !parser_safe(record.record_type, record.misc, &record.data.as_slice()) {
                out.counts.malformed += 1;
                continue;
            }
            let time = record.timestamp().unwrap_or(0);
            match record.parse() {
                Ok(p) => out.events.extend(side_band(p, time)),
                Err(_) => out.counts.malformed += 1,
            }
        }
    }
    Ok(out)
}

fn to_sample(s: &sample::RawSample, plan: &AttrPlan, counts: &mut ImportCounts) -> Sample {
    counts.samples += 1;
    let memory = plan.backend != BackendKind::Soft;
    if let (true, Some(ds)) = (memory, s.data_src) {
        counts.memory_samples += 1;
        let d = DataSrc::decode(ds);
        counts.loads += u64::from(d.is_load());
        counts.stores += u64::from(d.is_store());
        // c2c counts only samples with a data address.
        if s.addr.is_some_and(|a| a != 0) {
            let c = d.c2c();
            counts.hitm += u64::from(c.hitm());
            counts.peer += u64::from(c.peer() && !c.hitm());
        }
        if d.is_load() && !d.is_store() && !d.is_hitm() && d.names_a_level() {
            counts.no_transfer += 1;
        }
    }
    Sample {
        backend: plan.backend,
        pid: s.pid.unwrap_or(0),
        tid: s.tid.unwrap_or(0),
        cpu: s.cpu.unwrap_or(0),
        time: s.time.unwrap_or(0),
        ip: s.ip.unwrap_or(0),
        addr: if memory {
            s.addr.filter(|&a| a != 0)
        } else {
            None
        },
        data_src: if memory { s.data_src } else { None },
        weight: s.period.or(plan.fixed_period).unwrap_or(1).max(1),
        regs: s.regs,
        watch_slot: None,
        callers: Callers::default(),
    }
}
