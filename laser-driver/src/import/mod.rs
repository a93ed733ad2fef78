//! `laser import`: recordings made elsewhere with `perf c2c record` / `perf mem record` (or any
//! `perf record`), turned into the same [`crate::Event`] stream a live run produces.
//!
//! - [`layout`]: the perf.data header and section table, checked before anything trusts an
//!   offset or a count in it; header strings and PMU names read from feature sections.
//! - [`sample`]: one `PERF_RECORD_SAMPLE` body read field by field, including the `weight`
//!   and `data_src` that `linux-perf-event-reader` skips.
//! - [`perf_data`]: the whole file, through `linux-perf-data` (sections, attrs, record order).

pub mod craft;
pub mod layout;
pub mod perf_data;
pub mod sample;

pub use perf_data::{read, ImportCounts, PerfImport, PerfInfo};

/// Why a perf.data file could not be read at all. (Damage after the header is not an error:
/// the import keeps what came before it and says where it stopped.)
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    #[error("not a perf.data file: {0}")]
    NotPerfData(String),
    #[error("perf.data header is damaged: {0}")]
    Layout(String),
    #[error("big-endian perf.data (recorded on another architecture) is not supported")]
    BigEndian,
    #[error("perf.data could not be read: {0}")]
    Reader(String),
}

/// The GNU build-id of an ELF image, to check that a binary found here is the one a recording
/// names (a rebuilt binary at the same path would give wrong source lines).
pub fn build_id_of(elf: &[u8]) -> Option<Vec<u8>> {
    use object::Object;
    object::File::parse(elf)
        .ok()?
        .build_id()
        .ok()
        .flatten()
        .map(<[u8]>::to_vec)
}

/// Where perf's build-id cache keeps a binary: `<cache>/.build-id/b2/c6f7…/elf`.
pub fn build_id_cache_path(cache: &std::path::Path, id: &[u8]) -> std::path::PathBuf {
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let (head, tail) = hex.split_at(2.min(hex.len()));
    cache.join(".build-id").join(head).join(tail).join("elf")
}
