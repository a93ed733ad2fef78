//! `--junit FILE`: a JUnit XML file per run, the format CI systems (GitHub, GitLab, Jenkins)
//! list as test results. One test case per `--fail-on` gate (failed when it tripped) and one
//! per finding (failed when a per-finding gate tripped on it; otherwise passed, with the
//! details in `system-out`, so findings are visible without failing the build).
//!
//! Written by hand: the format is five elements, and the only care needed is escaping text
//! and attribute values (`xml_text`).

use laser_detect::report::Report;

use crate::gate::Verdict;
use crate::output::gated_findings;

/// Escapes `&<>"'` and drops characters XML 1.0 cannot hold at all (most C0 controls).
pub fn xml_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => {}
            c => out.push(c),
        }
    }
    out
}

/// One test case.
pub struct Case {
    pub classname: String,
    pub name: String,
    /// `(message, body)` when it failed.
    pub failure: Option<(String, String)>,
    pub output: String,
}

/// The XML for one suite of `cases`.
pub fn suite(title: &str, time_s: f64, cases: &[Case]) -> String {
    let failures = cases.iter().filter(|c| c.failure.is_some()).count();
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    x.push_str(&format!(
        "<testsuites name=\"laser\" tests=\"{}\" failures=\"{failures}\" time=\"{time_s:.3}\">\n",
        cases.len()
    ));
    x.push_str(&format!(
        "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" time=\"{time_s:.3}\">\n",
        xml_text(title),
        cases.len()
    ));
    for c in cases {
        x.push_str(&format!(
            "    <testcase classname=\"{}\" name=\"{}\">\n",
            xml_text(&c.classname),
            xml_text(&c.name)
        ));
        if let Some((message, body)) = &c.failure {
            x.push_str(&format!(
                "      <failure message=\"{}\" type=\"laser\">{}</failure>\n",
                xml_text(message),
                xml_text(body)
            ));
        }
        if !c.output.is_empty() {
            x.push_str(&format!(
                "      <system-out>{}</system-out>\n",
                xml_text(&c.output)
            ));
        }
        x.push_str("    </testcase>\n");
    }
    x.push_str("  </testsuite>\n</testsuites>\n");
    x
}

/// Test cases for the gates' verdicts.
pub fn gate_cases(verdicts: &[Verdict]) -> Vec<Case> {
    verdicts
        .iter()
        .map(|v| Case {
            classname: "laser.gate".into(),
            name: v.gate.clone(),
            failure: v.tripped.then(|| (v.line(), v.details.clone())),
            output: v.line(),
        })
        .collect()
}

/// The JUnit XML of one report and its gates.
pub fn report(title: &str, r: &Report, verdicts: &[Verdict]) -> String {
    let gated = gated_findings(verdicts);
    let mut cases = gate_cases(verdicts);
    for (i, f) in r.findings.iter().enumerate() {
        let name = format!("#{} {}", i + 1, crate::gate::report::describe(f));
        let mut out = format!(
            "{} contention events/s, {:.1}% of contention, threads {:?}\n",
            crate::gate::eval::fmt_num(f.rate_per_s),
            f.share * 100.0,
            f.threads
        );
        for s in &f.sources {
            out.push_str(&format!(
                "  {}:{} in {} ({}, {} events)\n",
                s.file.as_deref().unwrap_or("?"),
                s.line.map_or("?".into(), |l| l.to_string()),
                s.function.as_deref().or(s.symbol.as_deref()).unwrap_or("?"),
                s.op.as_str(),
                s.events
            ));
        }
        out.push_str(&format!("fix: {}\n", f.fix));
        cases.push(Case {
            classname: "laser.finding".into(),
            failure: gated.contains(&i).then(|| {
                (
                    format!("{name}: a --fail-on gate tripped on it"),
                    out.clone(),
                )
            }),
            name,
            output: out,
        });
    }
    suite(title, r.duration_s, &cases)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_illegal_controls_dropped() {
        assert_eq!(
            xml_text("a<b && c>\"d\" 'e'\u{1}\n"),
            "a&lt;b &amp;&amp; c&gt;&quot;d&quot; &apos;e&apos;\n"
        );
    }
}
