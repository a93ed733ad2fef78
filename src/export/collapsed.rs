//! Collapsed stacks (`--collapsed`): `caller;function;leaf count` lines for flame graphs. The
//! leaf frame is the data, so a flame graph shows which code contends on what:
//!
//! ```text
//!   worker;bump_b fs.c:13;[false_sharing counters] 20
//! ```

use std::collections::BTreeMap;

use laser_detect::report::Report;

use super::{frames, weighted};

/// `;` separates frames and the last space the count: keep both out of frame names.
fn clean(s: &str) -> String {
    s.replace(';', ":").replace('\n', " ")
}

pub fn render(report: &Report) -> String {
    // Identical stacks (two PCs on one source line) are merged; sorted output is stable.
    let mut stacks: BTreeMap<String, u64> = BTreeMap::new();
    for w in weighted(report) {
        let mut parts: Vec<String> = match w.source {
            Some(s) => frames(s)
                .into_iter()
                .map(|(func, file, line)| match (file, line) {
                    (Some(file), Some(line)) => {
                        let name = file.rsplit('/').next().unwrap_or(&file).to_owned();
                        clean(&format!("{func} {name}:{line}"))
                    }
                    _ => clean(&func),
                })
                .collect(),
            None => vec!["[unattributed]".into()],
        };
        parts.push(clean(&format!(
            "[{} {}]",
            w.finding.kind.as_str(),
            w.finding.data.name
        )));
        *stacks.entry(parts.join(";")).or_default() += w.events;
    }
    stacks
        .into_iter()
        .map(|(stack, n)| format!("{stack} {n}\n"))
        .collect()
}
