//! Writing recordings during a live run, and replaying them into the detector.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use laser_detect::Detector;
use laser_driver::trace::{EndState, PerfAttr, Reader, TraceFooter, TraceHeader, Writer};
use laser_driver::{Event, HeaderInfo};

/// A recording being written.
pub struct Recorder {
    path: PathBuf,
    writer: Writer<BufWriter<File>>,
}

impl Recorder {
    pub fn create(path: &Path, info: &HeaderInfo) -> Result<Recorder> {
        let file = crate::private_file::create(path)
            .with_context(|| format!("creating the recording {}", path.display()))?;
        let writer = Writer::new(BufWriter::new(file), &header(info))
            .with_context(|| format!("writing the header of {}", path.display()))?;
        Ok(Recorder {
            path: path.to_owned(),
            writer,
        })
    }

    pub fn write(&mut self, e: &Event) -> Result<()> {
        self.writer
            .write(e)
            .with_context(|| format!("writing to the recording {}", self.path.display()))
    }

    /// Writes the footer; a recording without one reads back as truncated.
    pub fn finish(self, duration_ns: u64) -> Result<()> {
        let footer = self.writer.footer(duration_ns);
        let mut out = self
            .writer
            .finish(footer)
            .with_context(|| format!("finishing the recording {}", self.path.display()))?;
        std::io::Write::flush(&mut out)
            .with_context(|| format!("flushing the recording {}", self.path.display()))?;
        Ok(())
    }
}

fn header(info: &HeaderInfo) -> TraceHeader {
    let mut h = TraceHeader::new(info.backend);
    h.attrs = info
        .attrs
        .iter()
        .map(|a| PerfAttr {
            description: a.description.clone(),
            raw: a.bytes.clone(),
        })
        .collect();
    h.sample_freq = info.frequency;
    h.cpu_model = info.cpu_model.clone().unwrap_or_default();
    h.cmdline = info.command.clone();
    h.pid = info.pid;
    h.start_time_unix_ns = info.start_time_unix_ns;
    h.start_time_perf_ns = info.start_time_perf_ns;
    h.maps = info.maps.clone();
    h.build_ids = info.build_ids.clone();
    h
}

/// The recording's bytes, mapped (the reader parses bytes; the file stays at the edge).
fn map_recording(path: &Path) -> Result<memmap2::Mmap> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: the mapping is read-only and private; a recording being appended to by another
    // laser would at worst show up as a truncated file, which the reader handles.
    unsafe { memmap2::Mmap::map(&file) }.with_context(|| format!("mapping {}", path.display()))
}

/// What replaying a recording found besides its events.
pub struct Replay {
    pub header: TraceHeader,
    pub end: EndState,
    pub footer: Option<TraceFooter>,
}

/// Feeds every event of the recording at `path` to `detector` (if any) and says how the file
/// ended. A truncated or corrupt file still yields everything before the damage.
pub fn replay(
    path: &Path,
    mut detector: Option<&mut Detector<crate::analyze::Code>>,
) -> Result<Replay> {
    let map = map_recording(path)?;
    let mut reader = Reader::new(&map).with_context(|| format!("reading {}", path.display()))?;
    let header = reader.header().clone();
    if let Some(d) = detector.as_deref_mut() {
        d.add_maps(header.pid, &header.maps);
    }
    while let Some(r) = reader.next_ref() {
        match r {
            Ok(e) => {
                if let Some(d) = detector.as_deref_mut() {
                    d.feed(e);
                }
            }
            // The end state below says where and why; everything before it was fed.
            Err(_) => break,
        }
    }
    let Some(end) = reader.end_state().cloned() else {
        bail!(
            "{}: the reader stopped without an end state",
            path.display()
        );
    };
    let footer = match &end {
        EndState::Complete { footer } => Some(*footer),
        _ => None,
    };
    Ok(Replay {
        header,
        end,
        footer,
    })
}

/// The warning to print for a recording that did not end cleanly.
pub fn end_warning(path: &Path, end: &EndState) -> Option<String> {
    match end {
        EndState::Complete { .. } => None,
        EndState::Truncated { offset } => Some(format!(
            "{} is truncated at byte {offset} (laser was killed or the disk filled): \
             analysing the events before it",
            path.display()
        )),
        EndState::Corrupt { offset, why } => Some(format!(
            "{} is corrupt at byte {offset} ({why}): analysing the events before it",
            path.display()
        )),
    }
}

/// `laser dump`: the header, then one event per line (Debug form), then how the file ended.
pub fn dump(path: &Path, limit: Option<u64>) -> Result<()> {
    use std::io::Write;
    let map = map_recording(path)?;
    let mut reader = Reader::new(&map).with_context(|| format!("reading {}", path.display()))?;
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    let h = reader.header();
    let _ = writeln!(
        out,
        "# backend {} pid {} freq {} cpu {:?} cmd {:?}",
        h.backend, h.pid, h.sample_freq, h.cpu_model, h.cmdline
    );
    let mut n = 0u64;
    while let Some(r) = reader.next_ref() {
        if limit.is_some_and(|l| n >= l) {
            break;
        }
        match r {
            Ok(e) => {
                if writeln!(out, "{e:?}").is_err() {
                    return Ok(()); // stdout closed (e.g. piped into `head`)
                }
            }
            Err(_) => break,
        }
        n += 1;
    }
    if let Some(end) = reader.end_state() {
        let _ = writeln!(out, "# end: {end:?}");
    }
    Ok(())
}
