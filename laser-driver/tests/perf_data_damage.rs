//! Damaged perf.data: random bytes, random byte overwrites of a real fixture, and fixtures cut
//! off inside their data section (as a perf killed mid-write leaves them, header sizes fixed up
//! to match). The promise: an error or a read of a prefix — never a panic, never a sample that
//! was not in the file.

use std::path::PathBuf;

use laser_driver::import;
use laser_driver::Event;
use proptest::prelude::*;

fn fixture(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/perf_data")
        .join(name);
    std::fs::read(p).unwrap()
}

const FIXTURES: [&str; 3] = [
    "fs-c2c-spr.perf.data",
    "fs-mem-zen4-ibs.perf.data",
    "fs-cpu-clock.perf.data",
];

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// `f` cut `keep` bytes into its data section, with the header's data size and feature bits
/// rewritten so the file is self-consistent again (perf writes the header last; a killed perf
/// leaves a file like this).
fn cut_in_data(f: &[u8], keep: u64) -> Vec<u8> {
    let data_off = u64_at(f, 40);
    let data_size = u64_at(f, 48);
    let keep = keep.min(data_size);
    let mut g = f[..(data_off + keep) as usize].to_vec();
    g[48..56].copy_from_slice(&keep.to_le_bytes());
    // The feature sections were after the data: gone. EVENT_DESC carried the ids, so multi-
    // event files can no longer map samples to events: that must be an error, not a panic.
    for w in 0..4 {
        g[72 + 8 * w..80 + 8 * w].copy_from_slice(&0u64.to_le_bytes());
    }
    g
}

#[test]
fn every_cut_in_the_data_section_reads_a_prefix() {
    let f = fixture("fs-cpu-clock.perf.data");
    let full = import::read(&f).unwrap();
    let data_size = u64_at(&f, 48);
    let all: std::collections::HashSet<(u64, u32, u64)> = full
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Sample(s) => Some((s.time, s.tid, s.ip)),
            _ => None,
        })
        .collect();
    // Every byte of the first 4 KiB of records, then every 61st: all record boundaries of the
    // start and a spread of every kind of cut through the rest.
    let cuts = (0..4096).chain((4096..data_size).step_by(61));
    let mut last = 0;
    for keep in cuts {
        let imp = import::read(&cut_in_data(&f, keep))
            .unwrap_or_else(|e| panic!("cut at {keep}: single-event file must read: {e}"));
        assert!(imp.counts.samples <= full.counts.samples, "{keep}");
        assert!(
            imp.counts.samples >= last,
            "{keep}: a longer prefix lost samples"
        );
        last = imp.counts.samples;
        // Every sample read is one the full file has (order may differ: records are sorted
        // by time within rounds, and a cut can end a round early).
        for e in &imp.events {
            if let Event::Sample(s) = e {
                assert!(
                    all.contains(&(s.time, s.tid, s.ip)),
                    "{keep}: invented {s:?}"
                );
            }
        }
    }
}

proptest! {
    // 256 cases by default; PROPTEST_CASES=N for a longer hunt.
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = import::read(&bytes);
        // The same after a valid magic and header size.
        let mut b = b"PERFILE2\x68\0\0\0\0\0\0\0".to_vec();
        b.extend(&bytes);
        let _ = import::read(&b);
    }

    #[test]
    fn overwritten_bytes_never_panic(
        which in 0..FIXTURES.len(),
        edits in proptest::collection::vec((any::<u32>(), any::<u8>()), 1..16),
    ) {
        let mut f = fixture(FIXTURES[which]);
        let full = import::read(&f).unwrap().counts.samples;
        for (at, v) in edits {
            let i = at as usize % f.len();
            f[i] = v;
        }
        if let Ok(imp) = import::read(&f) {
            // Corrupt records may be skipped or end the read; none are invented beyond the
            // number of records the data section can hold.
            prop_assert!(imp.counts.samples <= full + f.len() as u64 / 8);
        }
    }

    #[test]
    fn header_fields_set_to_anything_never_panic(
        which in 0..FIXTURES.len(),
        field in 0usize..13,
        value in prop_oneof![any::<u64>(), Just(0u64), Just(u64::MAX), 0u64..0x10000],
    ) {
        let mut f = fixture(FIXTURES[which]);
        let o = 8 + field * 8;
        f[o..o + 8].copy_from_slice(&value.to_le_bytes());
        let _ = import::read(&f);
    }
}
