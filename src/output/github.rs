//! `--format github`: GitHub Actions workflow commands, so a run's findings show on the source
//! lines of the pull request (`::warning file=src/x.c,line=13,title=…::message`).
//!
//! GitHub resolves `file=` against the repository checkout, so absolute DWARF paths under the
//! current directory (the checkout, in a workflow) are made relative to it.

use laser_detect::report::{Finding, Report};

use crate::gate::eval::fmt_num;
use crate::gate::Verdict;

/// `%`, CR and LF are escaped in every part; `:` and `,` also end a property value.
fn escape(s: &str, property: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '%' => out.push_str("%25"),
            '\r' => out.push_str("%0D"),
            '\n' => out.push_str("%0A"),
            ':' if property => out.push_str("%3A"),
            ',' if property => out.push_str("%2C"),
            c => out.push(c),
        }
    }
    out
}

/// `path` relative to `base` when inside it.
fn relative<'a>(path: &'a str, base: Option<&str>) -> &'a str {
    base.and_then(|b| path.strip_prefix(b.trim_end_matches('/')))
        .and_then(|rest| rest.strip_prefix('/'))
        .unwrap_or(path)
}

fn command(level: &str, props: &[(&str, String)], message: &str) -> String {
    let props: Vec<String> = props
        .iter()
        .map(|(k, v)| format!("{k}={}", escape(v, true)))
        .collect();
    let sep = if props.is_empty() { "" } else { " " };
    format!(
        "::{level}{sep}{}::{}\n",
        props.join(","),
        escape(message, false)
    )
}

/// The (file, line) places of a finding to annotate: each source's own line and, for library
/// code, the program's call site; each place once.
fn places(f: &Finding) -> Vec<(String, u32)> {
    let mut out: Vec<(String, u32)> = Vec::new();
    for s in &f.sources {
        let own = s.file.clone().zip(s.line);
        let call = s
            .called_from
            .first()
            .and_then(|c| c.file.clone().zip(c.line));
        let lib = s.module.as_deref().is_some_and(|m| m.contains(".so"));
        let place = if lib { call.or(own) } else { own.or(call) };
        if let Some(p) = place.filter(|p| !out.contains(p)) {
            out.push(p);
        }
    }
    out
}

/// One annotation per source line of each finding: `error` for findings a gate tripped on
/// (`gated`: their indices), `warning` for the rest.
pub fn annotations(report: &Report, gated: &[usize]) -> String {
    let cwd = std::env::current_dir().ok();
    let base = cwd.as_deref().and_then(|p| p.to_str());
    let mut out = String::new();
    for (i, f) in report.findings.iter().enumerate() {
        let level = if gated.contains(&i) {
            "error"
        } else {
            "warning"
        };
        let title = format!(
            "laser: {} on {}",
            f.kind.as_str().replace('_', " "),
            f.data.name
        );
        let message = format!(
            "{} contention events/s ({:.1}% of all contention) on a cache line shared by \
             threads {}. {}",
            fmt_num(f.rate_per_s),
            f.share * 100.0,
            f.threads
                .iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            f.fix
        );
        let spots = places(f);
        if spots.is_empty() {
            out.push_str(&command(level, &[("title", title.clone())], &message));
        }
        for (file, line) in spots {
            let props = [
                ("file", relative(&file, base).to_owned()),
                ("line", line.to_string()),
                ("title", title.clone()),
            ];
            out.push_str(&command(level, &props, &message));
        }
    }
    out
}

/// One `::error` per tripped gate, `::notice` for a passed gate whose verdict is unstable or
/// that could not observe.
pub fn verdicts(verdicts: &[Verdict]) -> String {
    verdicts
        .iter()
        .filter(|v| v.tripped || v.doubtful())
        .map(|v| {
            let level = if v.tripped { "error" } else { "notice" };
            command(level, &[("title", "laser gate".into())], &v.line())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_escape_their_separators_and_messages_their_newlines() {
        let c = command(
            "warning",
            &[("file", "a,b:c.c".into()), ("line", "3".into())],
            "50% done\nnext",
        );
        assert_eq!(c, "::warning file=a%2Cb%3Ac.c,line=3::50%25 done%0Anext\n");
        assert_eq!(command("error", &[], "x"), "::error::x\n");
    }

    #[test]
    fn paths_under_the_checkout_become_relative() {
        assert_eq!(relative("/w/repo/src/a.c", Some("/w/repo")), "src/a.c");
        assert_eq!(relative("/w/repo/src/a.c", Some("/w/repo/")), "src/a.c");
        assert_eq!(
            relative("/w/repository/a.c", Some("/w/repo")),
            "/w/repository/a.c"
        );
        assert_eq!(relative("/usr/include/x.h", None), "/usr/include/x.h");
    }
}
