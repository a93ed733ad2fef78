//! Turns raw ring records into [`Event`]s, using `linux-perf-event-reader` for the layouts.
//! Which backend wrote a sample is told by its `PERF_SAMPLE_IDENTIFIER` id.

use std::collections::{BTreeSet, HashMap};

use linux_perf_event_reader::{
    constants::PERF_RECORD_MISC_MMAP_BUILD_ID, EventRecord, Mmap2FileId, RawData, RawEventRecord,
    RecordParseInfo, RecordType,
};

use crate::event::{BackendKind, Callers, Event, Mmap, Sample, UserRegs, NUM_REGS};
use crate::exec_ranges::ExecRanges;
use crate::ring::RawRecord;

/// Which of laser's events an id belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Soft,
    /// Watchpoint in slot `n` of the armed set.
    Watch(u8),
    /// The dummy tracking event: it never samples.
    Tracking,
    /// A precise memory event (PEBS load/store, IBS op) whose samples have their own layout
    /// (`attr::MEM_SAMPLE_TYPE`, with WEIGHT and DATA_SRC) and share the ring of the tracking
    /// event. Its `sample_id_all` trailer has the same fields as every other event's.
    Precise(BackendKind),
}

/// Decoder state: the record layout, the id → source map and the executable mappings seen
/// (for the return addresses on a sample's stack).
#[derive(Debug, Clone)]
pub struct Decoder {
    info: RecordParseInfo,
    sources: HashMap<u64, Source>,
    /// Sample layouts of [`Source::Precise`] ids.
    precise: HashMap<u64, crate::import::sample::SampleLayout>,
    default_source: Source,
    exec: ExecRanges,
    /// The target's processes: the one laser launched and those it forks, followed as their
    /// Fork records are decoded ([`Decoder::follow`]).
    target: BTreeSet<u32>,
    /// The rings carry every process's records (CPU-wide leaders): a fork joins `target`
    /// only when its parent is in it, and only `target`'s mappings are noted in `exec`.
    by_parent: bool,
    /// Records that failed to parse (kernel/parser mismatch or corruption).
    pub malformed: u64,
}

impl Decoder {
    /// `default_source` is used for samples whose id is unknown (e.g. synthetic input).
    pub fn new(info: RecordParseInfo, default_source: Source) -> Self {
        Decoder {
            info,
            sources: HashMap::new(),
            precise: HashMap::new(),
            default_source,
            exec: ExecRanges::default(),
            target: BTreeSet::new(),
            by_parent: false,
            malformed: 0,
        }
    }

    /// Follows `pid` and the processes it forks. With `by_parent` (CPU-wide leaders, whose
    /// rings carry every process's records) a fork is followed only when its parent is, and
    /// only the followed processes' mappings are noted, so return addresses are recognised
    /// by the target's own code ranges; without, every fork read is the target's. (A child
    /// forked on one CPU whose first mappings are read from another CPU's ring before its
    /// fork record is not followed then.)
    pub fn follow(&mut self, pid: u32, by_parent: bool) {
        self.target = BTreeSet::from([pid]);
        self.by_parent = by_parent;
    }

    /// Adds `pid` to the target's processes (one it forked before the records counted).
    pub fn add_target(&mut self, pid: u32) {
        self.target.insert(pid);
    }

    /// Whether `pid` is one of the target's processes as far as the records decoded so far
    /// tell ([`Decoder::follow`]).
    pub fn is_target(&self, pid: u32) -> bool {
        self.target.contains(&pid)
    }

    pub fn add_source(&mut self, id: u64, source: Source) {
        self.sources.insert(id, source);
    }

    /// Forgets a closed event's id (its records have all been decoded).
    pub fn remove_source(&mut self, id: u64) {
        self.sources.remove(&id);
    }

    /// A precise memory event's id, with the `sample_type` its samples are written with.
    pub fn add_precise(&mut self, id: u64, backend: BackendKind, sample_type: u64) {
        self.sources.insert(id, Source::Precise(backend));
        self.precise.insert(
            id,
            crate::import::sample::SampleLayout {
                sample_type,
                ..Default::default()
            },
        );
    }

    /// A precise event's sample: every laser sample type starts with IDENTIFIER, so the id
    /// is the first word whatever the layout. `None`: not a precise event's sample.
    fn precise_sample(&self, kind: RecordType, body: &[u8]) -> Option<Result<Event, ()>> {
        if kind != RecordType::SAMPLE {
            return None;
        }
        let id = u64::from_le_bytes(*body.first_chunk::<8>()?);
        let Some(Source::Precise(backend)) = self.sources.get(&id).copied() else {
            return None;
        };
        let layout = self.precise.get(&id)?;
        let Some(s) = crate::import::sample::parse(body, layout) else {
            return Some(Err(()));
        };
        Some(Ok(Event::Sample(Sample {
            backend,
            pid: s.pid.unwrap_or(0),
            tid: s.tid.unwrap_or(0),
            cpu: s.cpu.unwrap_or(0),
            time: s.time.unwrap_or(0),
            ip: s.ip.unwrap_or(0),
            addr: s.addr.filter(|&a| a != 0),
            data_src: s.data_src,
            weight: s.period.unwrap_or(1).max(1),
            regs: s.regs,
            watch_slot: None,
            callers: Callers::default(),
        })))
    }

    /// A mapping that exists without a record in the rings (attach: read from
    /// `/proc/PID/maps`), so return addresses into it are recognised.
    pub fn note_mmap(&mut self, m: &Mmap) {
        let exec = m.prot & libc::PROT_EXEC as u32 != 0;
        self.exec
            .note(m.addr, m.addr.saturating_add(m.len), exec, &m.path);
    }

    /// Decodes one record; `None` for record types laser does not use, or malformed ones
    /// (counted in `malformed`).
    pub fn decode(&mut self, raw: RawRecord<'_>) -> Option<Event> {
        let r = self.decode_inner(raw);
        match &r {
            Err(()) => self.malformed += 1,
            Ok(Some(Event::Mmap(m))) => {
                if !self.by_parent || self.is_target(m.pid) {
                    self.note_mmap(m)
                }
            }
            Ok(Some(Event::Fork { pid, ppid, .. })) => {
                if !self.by_parent || self.is_target(*ppid) {
                    self.target.insert(*pid);
                }
            }
            Ok(_) => {}
        }
        r.ok().flatten()
    }

    fn decode_inner(&self, raw: RawRecord<'_>) -> Result<Option<Event>, ()> {
        let kind = RecordType(raw.kind);
        if let Some(r) = self.precise_sample(kind, raw.body) {
            return r.map(Some);
        }
        if !parser_safe(kind, raw.misc, raw.body) {
            return Err(());
        }
        let rec = RawEventRecord::new(kind, raw.misc, RawData::from(raw.body), self.info);
        let time = rec.timestamp().unwrap_or(0);
        let parsed = rec.parse().map_err(|_| ())?;
        Ok(Some(match parsed {
            EventRecord::Sample(s) => {
                let source =
                    s.id.and_then(|id| self.sources.get(&id).copied())
                        .unwrap_or(self.default_source);
                let (backend, slot) = match source {
                    Source::Soft => (BackendKind::Soft, None),
                    Source::Watch(n) => (BackendKind::Watch, Some(n)),
                    Source::Tracking => return Ok(None),
                    // Only reached for ids registered without a layout.
                    Source::Precise(_) => return Err(()),
                };
                let regs = s.user_regs.map(|r| {
                    let mut u = UserRegs::default();
                    for i in 0..NUM_REGS {
                        if let Some(v) = r.get(i as u64) {
                            u.mask |= 1 << i;
                            u.values[i] = v;
                        }
                    }
                    u
                });
                let ip = s.ip.unwrap_or(0);
                let mut callers = Callers::default();
                if let Some((stack, dyn_size)) = &s.user_stack {
                    // `dyn_size`: how much of the copy is real stack (the rest is zeros
                    // when the stack top is closer than the requested size).
                    let n = (*dyn_size as usize).min(stack.len());
                    if let Some(top) = stack.get(0..n) {
                        self.exec.callers(ip, &top.as_slice(), &mut callers);
                    }
                }
                Event::Sample(Sample {
                    backend,
                    pid: s.pid.unwrap_or(-1) as u32,
                    tid: s.tid.unwrap_or(-1) as u32,
                    cpu: s.cpu.unwrap_or(0),
                    time: s.timestamp.unwrap_or(time),
                    ip,
                    addr: if backend == BackendKind::Watch {
                        s.addr
                    } else {
                        None
                    },
                    data_src: None,
                    weight: match backend {
                        BackendKind::Watch => 1,
                        _ => s.period.unwrap_or(1),
                    },
                    regs,
                    watch_slot: slot,
                    callers,
                })
            }
            other => return Ok(side_band(other, time)),
        }))
    }
}

/// Whether `linux-perf-event-reader` can parse this record without panicking: its MMAP2
/// parser asserts that an in-record build-id is at most 20 bytes, so a forged length byte
/// must be refused before it gets there.
pub(crate) fn parser_safe(kind: RecordType, misc: u16, body: &[u8]) -> bool {
    !(kind == RecordType::MMAP2
        && misc & PERF_RECORD_MISC_MMAP_BUILD_ID != 0
        && body.get(32).is_none_or(|&n| n > 20))
}

/// The event of a non-sample record (mmaps, thread names, forks, exits, losses,
/// throttling), `time` being the record's `sample_id_all` timestamp (0 without one). Shared
/// by the live rings and `import::perf_data`, so both emit the same events for the same record.
pub(crate) fn side_band(parsed: EventRecord<'_>, time: u64) -> Option<Event> {
    Some(match parsed {
        EventRecord::Mmap2(m) => Event::Mmap(Mmap {
            pid: m.pid as u32,
            tid: m.tid as u32,
            time,
            addr: m.address,
            len: m.length,
            pgoff: m.page_offset,
            prot: m.protection,
            flags: m.flags,
            path: String::from_utf8_lossy(&m.path.as_slice()).into_owned(),
            build_id: match m.file_id {
                Mmap2FileId::BuildId(b) => Some(b),
                Mmap2FileId::InodeAndVersion(_) => None,
            },
        }),
        EventRecord::Mmap(m) => Event::Mmap(Mmap {
            pid: m.pid as u32,
            tid: m.tid as u32,
            time,
            addr: m.address,
            len: m.length,
            pgoff: m.page_offset,
            prot: if m.is_executable {
                (libc::PROT_READ | libc::PROT_EXEC) as u32
            } else {
                libc::PROT_READ as u32
            },
            flags: 0,
            path: String::from_utf8_lossy(&m.path.as_slice()).into_owned(),
            build_id: None,
        }),
        EventRecord::Comm(c) => Event::Comm {
            pid: c.pid as u32,
            tid: c.tid as u32,
            time,
            name: String::from_utf8_lossy(&c.name.as_slice()).into_owned(),
            exec: c.is_execve,
        },
        EventRecord::Fork(f) => Event::Fork {
            pid: f.pid as u32,
            ppid: f.ppid as u32,
            tid: f.tid as u32,
            ptid: f.ptid as u32,
            time: f.timestamp,
        },
        EventRecord::Exit(f) => Event::Exit {
            pid: f.pid as u32,
            ppid: f.ppid as u32,
            tid: f.tid as u32,
            ptid: f.ptid as u32,
            time: f.timestamp,
        },
        EventRecord::Lost(l) => Event::Lost {
            count: l.count,
            time,
        },
        EventRecord::Throttle(t) => Event::Throttle {
            time: t.timestamp,
            throttled: true,
        },
        EventRecord::Unthrottle(t) => Event::Throttle {
            time: t.timestamp,
            throttled: false,
        },
        _ => return None,
    })
}

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;
