//! The live view of a long run on a terminal: one status line on stderr with the elapsed
//! time, samples per second, samples lost, and the current top contended line with its kind
//! and source line. Nothing is drawn when stderr is not a terminal (CI logs, pipes) or with
//! `--quiet`.
//!
//! ```text
//!   ⠙ laser: pid 4242 · 12.3 s · 1,020 samples/s · 0 lost · top: false sharing 48,210 ev/s, line 0x55d0c0a040c0, lr.c:58 in worker
//! ```

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use laser_detect::{Detector, Location, Symbolizer};

use crate::gate::eval::fmt_num;

/// How often the top line is recomputed: `Detector::finish` ranks every contended line, cheap
/// once a second, wasteful at the loop's 20 Hz.
const TOP_EVERY: Duration = Duration::from_secs(1);

pub struct LiveView {
    bar: Option<ProgressBar>,
    pid: i32,
    start: Instant,
    /// (time, samples) at the last rate update, for samples/s over the last interval.
    last: (Instant, u64),
    rate: f64,
    top: String,
    last_top: Option<Instant>,
    symbols: Option<Symbolizer>,
}

impl LiveView {
    /// A view for `pid`; draws only when `enabled` and stderr is a terminal.
    pub fn new(pid: i32, enabled: bool) -> Self {
        let shown = enabled && std::io::IsTerminal::is_terminal(&std::io::stderr());
        let bar = shown.then(|| {
            let pb = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            pb.set_style(
                ProgressStyle::with_template("{spinner} laser: {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            pb.set_message(format!("monitoring pid {pid}"));
            pb.enable_steady_tick(Duration::from_millis(200));
            pb
        });
        let now = Instant::now();
        LiveView {
            bar,
            pid,
            start: now,
            last: (now, 0),
            rate: 0.0,
            top: String::new(),
            last_top: None,
            symbols: None,
        }
    }

    pub fn is_shown(&self) -> bool {
        self.bar.is_some()
    }

    /// Refreshes the line from the session's counters and, once a second, the detector.
    pub fn update<C: laser_detect::CodeSource>(
        &mut self,
        samples: u64,
        lost: u64,
        detector: Option<&Detector<C>>,
    ) {
        if self.bar.is_none() {
            return;
        }
        let now = Instant::now();
        let dt = now.duration_since(self.last.0).as_secs_f64();
        if dt >= 0.5 {
            self.rate = samples.saturating_sub(self.last.1) as f64 / dt;
            self.last = (now, samples);
        }
        if let Some(d) = detector {
            if self
                .last_top
                .is_none_or(|t| now.duration_since(t) >= TOP_EVERY)
            {
                self.last_top = Some(now);
                let analysis = d.finish();
                if let Some(f) = analysis.findings.first() {
                    let place = f
                        .sources
                        .first()
                        .map(|s| self.place(&s.code))
                        .unwrap_or_default();
                    self.top = format!(
                        " · top: {} {} ev/s, line {:#x}{place}",
                        f.kind.as_str().replace('_', " "),
                        fmt_num(f.rate_per_s),
                        laser_detect::decode::maps::split_copy(f.line_addr).1
                    );
                }
            }
        }
        let Some(bar) = &self.bar else { return };
        bar.set_message(format!(
            "pid {} · {:.1} s · {} samples/s · {} lost{}",
            self.pid,
            self.start.elapsed().as_secs_f64(),
            fmt_num(self.rate),
            fmt_num(lost as f64),
            self.top
        ));
    }

    /// `, lr.c:58 in worker` for an instruction (its module's DWARF is loaded once).
    fn place(&mut self, code: &Location) -> String {
        let Location::Module { path, vaddr } = code else {
            return String::new();
        };
        let loc = self
            .symbols
            .get_or_insert_with(Symbolizer::new)
            .symbolize(path, *vaddr);
        match (loc.file, loc.line) {
            (Some(file), Some(line)) => {
                let name = file.rsplit('/').next().unwrap_or(&file).to_owned();
                let func = loc.function.map(|f| format!(" in {f}")).unwrap_or_default();
                format!(", {name}:{line}{func}")
            }
            _ => loc.symbol.map(|s| format!(", {s}")).unwrap_or_default(),
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
