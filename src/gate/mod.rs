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
            // Only a pass can be wrong for want of contention to see.
            blind: if truth.point { None } else { s.blind() },
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
    /// The gate passed on a run that could not have shown contention: why (the program's
    /// threads barely ran at the same time). The exit status is still that of a pass.
    pub blind: Option<String>,
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
        if let Some(why) = &self.blind {
            s.push_str(&format!(
                "; COULD NOT OBSERVE: {why}; this pass is no evidence that there is none, a \
                 rerun may trip (exit status as passed)"
            ));
        }
        s
    }

    /// The verdict is one a rerun could reverse: its interval straddles the threshold, or it
    /// passed on a run that could not observe contention.
    pub fn doubtful(&self) -> bool {
        self.unstable || self.blind.is_some()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interval::Estimate;
    use metric::Metric;

    /// A report with no findings, `findings` = 0, and the given blindness.
    struct Empty(Option<&'static str>);

    impl Subject for Empty {
        fn total(&self, m: Metric) -> eval::Val {
            eval::Val::Num(Estimate::exact(if m == Metric::Overlap {
                0.09
            } else {
                0.0
            }))
        }
        fn items(&self) -> usize {
            0
        }
        fn item(&self, _: usize, _: Metric) -> eval::Val {
            unreachable!("no findings")
        }
        fn describe(&self, _: usize) -> String {
            unreachable!("no findings")
        }
        fn blind(&self) -> Option<String> {
            self.0.map(String::from)
        }
    }

    fn gate(text: &str) -> Gate {
        Gate::parse(text, Context::Report).unwrap()
    }

    #[test]
    fn a_pass_on_a_run_that_could_not_observe_says_so_and_stays_a_pass() {
        let v = gate("findings > 0").check(&Empty(Some("threads took turns")));
        assert!(!v.tripped && !v.unstable && v.doubtful());
        assert_eq!(
            v.line(),
            "gate passed: findings > 0 (findings = 0); COULD NOT OBSERVE: threads took turns; \
             this pass is no evidence that there is none, a rerun may trip (exit status as \
             passed)"
        );
        assert_eq!(exit_code(crate::exit::OK, v.tripped), crate::exit::OK);
    }

    #[test]
    fn a_run_that_could_observe_passes_plainly() {
        let v = gate("findings > 0").check(&Empty(None));
        assert!(!v.doubtful());
        assert_eq!(v.line(), "gate passed: findings > 0 (findings = 0)");
    }

    #[test]
    fn a_tripped_gate_is_not_doubted_for_low_overlap() {
        // Contention seen despite little overlap is still contention.
        let v = gate("overlap < 0.5").check(&Empty(Some("threads took turns")));
        assert!(v.tripped && v.blind.is_none());
        assert_eq!(v.line(), "gate tripped: overlap < 0.5 (overlap = 0.09)");
    }
}
