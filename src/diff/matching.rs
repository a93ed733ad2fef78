//! Matching findings of two runs. Addresses move between runs (ASLR, allocation order), so a
//! finding is identified by what stays: its data (a global's name; "heap" for any heap line,
//! whose names hold block addresses) and the source lines that contend on it.
//!
//! ```text
//!   base #1 counters {fs.c:13, fs.c:22}  ──score 1.0──  new #2 counters {fs.c:13, fs.c:22}
//!   base #2 heap     {q.c:40}            ──score 0.5──  new #1 heap     {q.c:40, q.c:41}
//! ```
//!
//! The score of a pair is the Jaccard overlap of their source sets (0 when the data differ);
//! pairs are taken greedily, best score first, each finding at most once.

use std::collections::BTreeSet;

use laser_detect::report::{Finding, Source};

/// What identifies a finding's data across runs.
pub fn data_key(f: &Finding) -> String {
    match f.data.kind.as_str() {
        "heap" => "heap".into(),
        kind => format!("{kind}:{}", f.data.name),
    }
}

/// The last `n` components of a path: the same source built in two checkouts still matches.
fn tail(path: &str, n: usize) -> &str {
    let mut idx = path.len();
    for _ in 0..n {
        match path[..idx].rfind('/') {
            Some(i) => idx = i,
            None => return path,
        }
    }
    &path[idx + 1..]
}

/// What identifies one source across runs: `dir/file.c:13`, or `libc.so.6+0x9a0f0` without a
/// line table.
pub fn source_key(s: &Source) -> Option<String> {
    if let (Some(file), Some(line)) = (&s.file, s.line) {
        return Some(format!("{}:{line}", tail(file, 2)));
    }
    let module = s.module.as_deref()?;
    Some(format!("{}+{:#x}", tail(module, 1), s.offset?))
}

fn sources(f: &Finding) -> BTreeSet<String> {
    f.sources.iter().filter_map(source_key).collect()
}

/// How alike two findings are, 0..=1.
pub fn score(a: &Finding, b: &Finding) -> f64 {
    if data_key(a) != data_key(b) {
        return 0.0;
    }
    let (sa, sb) = (sources(a), sources(b));
    if sa.is_empty() && sb.is_empty() {
        // Same data, no code known on either side: a weak but real match.
        return 0.25;
    }
    let common = sa.intersection(&sb).count();
    common as f64 / sa.union(&sb).count() as f64
}

/// Pairs `(base index, new index)`, best matches first, each index at most once.
pub fn pair(base: &[Finding], new: &[Finding]) -> Vec<(usize, usize)> {
    let mut candidates: Vec<(f64, usize, usize)> = Vec::new();
    for (i, b) in base.iter().enumerate() {
        for (j, n) in new.iter().enumerate() {
            let s = score(b, n);
            if s > 0.0 {
                candidates.push((s, i, j));
            }
        }
    }
    // Best score first; ties by rank in both reports, so the result is deterministic.
    candidates.sort_by(|a, b| b.0.total_cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
    let (mut used_b, mut used_n) = (vec![false; base.len()], vec![false; new.len()]);
    let mut out = Vec::new();
    for (_, i, j) in candidates {
        if !used_b[i] && !used_n[j] {
            used_b[i] = true;
            used_n[j] = true;
            out.push((i, j));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tails_keep_the_last_components() {
        assert_eq!(tail("/a/b/c/fs.c", 2), "c/fs.c");
        assert_eq!(tail("c/fs.c", 2), "c/fs.c");
        assert_eq!(tail("fs.c", 1), "fs.c");
        assert_eq!(tail("/lib/x86_64/libc.so.6", 1), "libc.so.6");
    }
}
