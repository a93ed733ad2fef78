//! `--fail-on` gates: expressions over a report's metrics that turn a run into a CI verdict
//! (exit 3 when one trips). `parse` reads the expression, `metric` names what it may use,
//! `eval` decides (with the metrics' intervals: a verdict a rerun could flip says so),
//! `report` gives one report's metrics and `diff.rs` a comparison's.

pub mod eval;
pub mod metric;
pub mod parse;
pub mod report;

pub use metric::Context;
pub use parse::ParseError;

use eval::{describe_value, eval, value, Subject, Truth};
use parse::Expr;

/// One parsed `--fail-on` expression and its text.
#[derive(Clone, Debug, PartialEq)]
pub struct Gate {
    pub text: String,
    pub expr: Expr,
}

impl Gate {
    pub fn parse(text: &str, context: Context) -> Result<Gate, ParseError> {
        Ok(Gate {
            text: text.trim().to_owned(),
            expr: parse::parse(text, context)?,
        })
    }

    /// Whether the expression is evaluated once per finding.
    fn per_finding(&self) -> bool {
        self.expr.metrics().iter().any(|m| m.per_finding())
    }

    /// Evaluates the gate on `s`.
    pub fn check(&self, s: &dyn Subject) -> Verdict {
        let mut unsure = Vec::new();
        let (truth, hits) = if self.per_finding() {
            // Any finding: an OR over them, in Kleene logic too.
            let mut acc = Truth {
                point: false,
                sure: Some(false),
            };
            let mut hits = Vec::new();
            for i in 0..s.items() {
                let mut notes = Vec::new();
                let t = eval(&self.expr, s, Some(i), &mut notes);
                if t.point {
                    hits.push(i);
                }
                if t.sure.is_none() {
                    unsure.extend(notes.into_iter().map(|n| format!("{}: {n}", s.describe(i))));
                }
                acc = Truth {
                    point: acc.point || t.point,
                    sure: match (acc.sure, t.sure) {
                        (Some(true), _) | (_, Some(true)) => Some(true),
                        (Some(false), Some(false)) => Some(false),
                        _ => None,
                    },
                };
            }
            (acc, hits)
        } else {
            (eval(&self.expr, s, None, &mut unsure), Vec::new())
        };
        let mut details: Vec<String> = Vec::new();
        let shown = hits.first().copied();
        if self.per_finding() && shown.is_none() {
            details.push(format!("no finding satisfies it, {} checked", s.items()));
        }
        if let Some(i) = shown {
            let more = match hits.len() {
                1 => String::new(),
                n => format!(" (+{} more)", n - 1),
            };
            details.push(format!("{}{more}", s.describe(i)));
        }
        for m in self.expr.metrics() {
            if m.per_finding() && shown.is_none() {
                continue;
            }
            details.push(describe_value(m, &value(s, m, shown)));
        }
        Verdict {
            gate: self.text.clone(),
            tripped: truth.point,
            unstable: truth.sure.is_none(),
            details: details.join(", "),
            unsure: if truth.sure.is_none() {
                unsure
            } else {
                Vec::new()
            },
            findings: hits,
        }
    }
}

/// What one gate decided.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub gate: String,
    pub tripped: bool,
    /// A value inside the metrics' 95% intervals would decide the other way.
    pub unstable: bool,
    /// The values the decision was made on (and the first finding that tripped it).
    pub details: String,
    /// Why it is unstable: each comparison whose interval straddles its threshold.
    pub unsure: Vec<String>,
    /// Indices of the findings (or diff entries) that satisfied a per-finding gate.
    pub findings: Vec<usize>,
}

impl Verdict {
    /// The one line printed for this gate.
    pub fn line(&self) -> String {
        let mut s = format!(
            "{}: {} ({})",
            if self.tripped {
                "gate tripped"
            } else {
                "gate passed"
            },
            self.gate,
            self.details
        );
        if self.unstable {
            s.push_str(&format!(
                "; UNSTABLE: {}; a rerun may {}",
                self.unsure.join("; "),
                if self.tripped { "pass" } else { "trip" }
            ));
        }
        s
    }
}

/// Every gate's verdict, and whether any tripped (the gates OR together).
pub fn check_all(gates: &[Gate], s: &dyn Subject) -> (bool, Vec<Verdict>) {
    let verdicts: Vec<Verdict> = gates.iter().map(|g| g.check(s)).collect();
    (verdicts.iter().any(|v| v.tripped), verdicts)
}

/// The exit status after gates: a non-zero status of the program (or of laser's own work)
/// wins; otherwise a tripped gate gives [`crate::exit::GATE`].
pub fn exit_code(status: i32, tripped: bool) -> i32 {
    if status == crate::exit::OK && tripped {
        crate::exit::GATE
    } else {
        status
    }
}
