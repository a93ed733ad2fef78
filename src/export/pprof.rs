//! `--pprof FILE`: the report as a pprof profile (profile.proto, gzipped).
//!
//! One sample per contending instruction of each finding, its value the contention events
//! the report credits it with (sample type `contention`/`count`), its stack the instruction's
//! location (file:line and function, inlined frames as extra lines of that location, as
//! pprof's format wants them) under the program's call site for library code. Labels say
//! which line and data it contended on: `kind`, `data`, `cache_line` (run-time address, hex),
//! `op`. Encoding is prost's (`proto.rs`); nothing here writes protobuf by hand.

use std::collections::HashMap;
use std::io::Write;

use flate2::write::GzEncoder;
use flate2::Compression;
use laser_detect::report::{Report, Source};
use prost::Message;

use super::proto::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};
use super::{frames, weighted};

/// Interns strings, functions, mappings and locations by value, as pprof's tables want.
#[derive(Default)]
struct Builder {
    profile: Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(i64, i64), u64>,
    mappings: HashMap<String, u64>,
    locations: HashMap<(u64, Vec<(u64, i64)>), u64>,
}

impl Builder {
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.profile.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    fn function(&mut self, name: &str, file: Option<&str>) -> u64 {
        let key = (self.string(name), self.string(file.unwrap_or("")));
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        self.profile.function.push(Function {
            id,
            name: key.0,
            system_name: key.0,
            filename: key.1,
            start_line: 0,
        });
        self.functions.insert(key, id);
        id
    }

    fn mapping(&mut self, module: Option<&str>) -> u64 {
        let Some(module) = module else {
            return 0; // code in no file (JIT): pprof allows no mapping
        };
        if let Some(&id) = self.mappings.get(module) {
            return id;
        }
        let id = self.profile.mapping.len() as u64 + 1;
        let filename = self.string(module);
        self.profile.mapping.push(Mapping {
            id,
            filename,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
            ..Default::default()
        });
        self.mappings.insert(module.to_owned(), id);
        id
    }

    /// A location at `address` with `lines` (function, line), innermost first.
    fn location(&mut self, mapping_id: u64, address: u64, lines: Vec<(u64, i64)>) -> u64 {
        let key = (address, lines);
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let id = self.profile.location.len() as u64 + 1;
        self.profile.location.push(Location {
            id,
            mapping_id,
            address,
            line: key
                .1
                .iter()
                .map(|&(function_id, line)| Line { function_id, line })
                .collect(),
            is_folded: false,
        });
        self.locations.insert(key, id);
        id
    }

    /// Location ids of a source's stack, leaf first (pprof's order).
    fn stack(&mut self, s: &Source) -> Vec<u64> {
        let frames = frames(s);
        let inner = frames.len() - 1 - s.inlined.len();
        // The instruction's own location: its function and the functions inlined around it.
        let lines: Vec<(u64, i64)> = frames[inner..]
            .iter()
            .rev()
            .map(|(func, file, line)| {
                (
                    self.function(func, file.as_deref()),
                    line.map_or(0, i64::from),
                )
            })
            .collect();
        let mapping = self.mapping(s.module.as_deref());
        let mut ids = vec![self.location(mapping, s.pc, lines)];
        if let (Some(c), Some((func, file, line))) = (s.called_from.first(), frames.first()) {
            if inner == 1 {
                let f = self.function(func, file.as_deref());
                let m = self.mapping(c.module.as_deref());
                ids.push(self.location(m, c.ret, vec![(f, line.map_or(0, i64::from))]));
            }
        }
        ids
    }

    fn label(&mut self, key: &str, value: &str) -> Label {
        Label {
            key: self.string(key),
            str: self.string(value),
            ..Default::default()
        }
    }
}

/// The profile of a report.
pub fn profile(report: &Report) -> Profile {
    let mut b = Builder::default();
    b.string(""); // string_table[0] must be ""
    let ty = ValueType {
        ty: b.string("contention"),
        unit: b.string("count"),
    };
    b.profile.sample_type = vec![ty.clone()];
    b.profile.period_type = Some(ty);
    b.profile.period = 1;
    b.profile.duration_nanos = (report.duration_s * 1e9) as i64;
    let comment = format!(
        "laser {}: backend {}, threshold {} events/s; values are contention events",
        report.schema, report.backend, report.threshold
    );
    b.profile.comment = vec![b.string(&comment)];
    for w in weighted(report) {
        let f = w.finding;
        let location_id = match w.source {
            Some(s) => b.stack(s),
            None => {
                let func = b.function("[unattributed]", None);
                vec![b.location(0, 0, vec![(func, 0)])]
            }
        };
        let mut label = vec![
            b.label("kind", f.kind.as_str()),
            b.label("data", &f.data.name),
            b.label("cache_line", &format!("{:#x}", f.line_addr)),
        ];
        if let Some(s) = w.source {
            label.push(b.label("op", s.op.as_str()));
        }
        b.profile.sample.push(Sample {
            location_id,
            value: vec![w.events as i64],
            label,
        });
    }
    b.profile
}

/// The gzipped profile bytes, as `go tool pprof` and fleet backends read them.
pub fn gzipped(report: &Report) -> std::io::Result<Vec<u8>> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(&profile(report).encode_to_vec())?;
    gz.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use laser_detect::report::{CalledFrom, Inlined};

    /// A libc instruction inlined twice, called from the program: pprof wants one location
    /// for the instruction with its inlined frames as extra lines (innermost first) and the
    /// call site as the next location up.
    #[test]
    fn inlined_frames_are_lines_of_one_location_and_call_sites_are_callers() {
        let json = include_str!("../../tests/fixtures/gates/two.report.json");
        let mut report = Report::from_json(json).unwrap();
        report.findings.truncate(1);
        let f = &mut report.findings[0];
        f.sources.truncate(1);
        let s = &mut f.sources[0];
        s.module = Some("/lib/libc.so.6".into());
        s.function = Some("inner".into());
        s.line = Some(5);
        s.inlined = vec![
            Inlined {
                function: Some("middle".into()),
                file: Some("m.c".into()),
                line: Some(6),
            },
            Inlined {
                function: Some("outer".into()),
                file: Some("o.c".into()),
                line: Some(7),
            },
        ];
        s.called_from = vec![CalledFrom {
            ret: 0x1234,
            module: Some("/bin/app".into()),
            offset: Some(0x234),
            file: Some("app.c".into()),
            line: Some(99),
            function: Some("worker".into()),
            symbol: None,
            samples: 3,
            share: 1.0,
        }];
        let p = profile(&report);
        let name = |fid: u64| {
            let f = p.function.iter().find(|f| f.id == fid).unwrap();
            p.string_table[f.name as usize].clone()
        };
        let loc = |id: u64| p.location.iter().find(|l| l.id == id).unwrap();
        let sample = &p.sample[0];
        assert_eq!(sample.location_id.len(), 2, "{p:?}");
        let leaf = loc(sample.location_id[0]);
        let lines: Vec<(String, i64)> = leaf
            .line
            .iter()
            .map(|l| (name(l.function_id), l.line))
            .collect();
        assert_eq!(
            lines,
            [
                ("inner".into(), 5),
                ("middle".into(), 6),
                ("outer".into(), 7)
            ]
        );
        let caller = loc(sample.location_id[1]);
        assert_eq!(caller.address, 0x1234);
        assert_eq!(
            (name(caller.line[0].function_id), caller.line[0].line),
            ("worker".into(), 99)
        );
        // Collapsed stacks read the same, outermost first.
        let folded = crate::export::collapsed::render(&report);
        let lines: Vec<&str> = folded.lines().collect();
        assert_eq!(
            lines,
            [
                // The finding's 55 events less the 20 of the one source kept.
                "[unattributed];[false_sharing counters] 35",
                "worker app.c:99;outer o.c:7;middle m.c:6;inner fs.c:5;[false_sharing counters] 20"
            ],
        );
    }
}
