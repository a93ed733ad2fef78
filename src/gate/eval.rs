//! Evaluating a parsed `--fail-on` expression, with a second, three-valued evaluation over the
//! metrics' 95% intervals that says whether a rerun could reach the other verdict.
//!
//! Each comparison yields the verdict of the point estimate and, from the interval's ends,
//! `Some(b)` when every value in the interval gives `b`, `None` when the interval straddles
//! the threshold. `&&`, `||`, `!` combine the second part with Kleene's logic, so an unsure
//! comparison only makes the gate unstable when the outcome depends on it:
//!
//! ```text
//!   false_sharing_rate > 1000 || finding.rate > 50000
//!   └ 12,000 (9,800–14,500): sure true ┘  └ 48,000 (40k–57k): unsure ┘  → sure true: stable
//! ```

use super::metric::Metric;
use super::parse::{CmpOp, Comparison, Expr, Value};
use crate::interval::Estimate;

/// A metric's value for one evaluation.
#[derive(Clone, Debug, PartialEq)]
pub enum Val {
    Num(Estimate),
    /// Text metrics with several values (one per source) match when any value matches.
    Text(Vec<String>),
}

/// What an expression is evaluated on: one report, or a comparison of two.
pub trait Subject {
    /// A metric that is not per-finding.
    fn total(&self, m: Metric) -> Val;
    /// How many findings (or diff entries) per-finding metrics range over.
    fn items(&self) -> usize;
    fn item(&self, i: usize, m: Metric) -> Val;
    /// A short description of finding `i` for the verdict line.
    fn describe(&self, i: usize) -> String;
    /// Why this run could not have shown the contention a gate looks for, when it could not
    /// (the program's threads barely ran at the same time): a pass on it proves little.
    fn blind(&self) -> Option<String> {
        None
    }
}

/// The result of one evaluation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Truth {
    /// With every metric at its point estimate.
    pub point: bool,
    /// The same for every value inside the intervals; `None`: it depends on where in them.
    pub sure: Option<bool>,
}

impl Truth {
    fn not(self) -> Truth {
        Truth {
            point: !self.point,
            sure: self.sure.map(|b| !b),
        }
    }

    fn and(self, o: Truth) -> Truth {
        Truth {
            point: self.point && o.point,
            sure: match (self.sure, o.sure) {
                (Some(false), _) | (_, Some(false)) => Some(false),
                (Some(true), Some(true)) => Some(true),
                _ => None,
            },
        }
    }

    fn or(self, o: Truth) -> Truth {
        self.not().and(o.not()).not()
    }
}

/// Evaluates `e` on the totals and, when given, finding `item`. `unsure` collects a note for
/// each comparison whose interval straddles its threshold.
pub fn eval(e: &Expr, s: &dyn Subject, item: Option<usize>, unsure: &mut Vec<String>) -> Truth {
    match e {
        Expr::Or(a, b) => eval(a, s, item, unsure).or(eval(b, s, item, unsure)),
        Expr::And(a, b) => eval(a, s, item, unsure).and(eval(b, s, item, unsure)),
        Expr::Not(a) => eval(a, s, item, unsure).not(),
        Expr::Cmp(c) => {
            let v = value(s, c.metric, item);
            let t = compare(c, &v);
            if t.sure.is_none() {
                if let (Val::Num(n), Value::Number(x)) = (&v, &c.value) {
                    unsure.push(format!(
                        "{} {} has a 95% interval {}–{} around {}",
                        c.metric.name(),
                        fmt_num(n.value),
                        fmt_num(n.lo),
                        fmt_num(n.hi),
                        fmt_num(*x)
                    ));
                }
            }
            t
        }
    }
}

/// The value of `m` for `item` (totals ignore the item).
pub fn value(s: &dyn Subject, m: Metric, item: Option<usize>) -> Val {
    match item {
        Some(i) if m.per_finding() => s.item(i, m),
        _ => s.total(m),
    }
}

fn compare(c: &Comparison, v: &Val) -> Truth {
    match (v, &c.value) {
        (Val::Num(n), Value::Number(x)) => {
            let at = |y: f64| match c.op {
                CmpOp::Gt => y > *x,
                CmpOp::Ge => y >= *x,
                CmpOp::Lt => y < *x,
                CmpOp::Le => y <= *x,
                CmpOp::Eq => y == *x,
                CmpOp::Ne => y != *x,
            };
            let point = at(n.value);
            let sure = match c.op {
                _ if n.is_exact() => Some(point),
                // Equality over an interval: unsure exactly when the value could be inside it.
                CmpOp::Eq | CmpOp::Ne if n.lo <= *x && *x <= n.hi => None,
                CmpOp::Eq | CmpOp::Ne => Some(point),
                // Ordered comparisons are monotone: the two ends decide.
                _ => Some(at(n.lo)).filter(|&a| a == at(n.hi)),
            };
            Truth { point, sure }
        }
        (Val::Text(values), Value::Pattern(p)) => {
            let pattern = glob::Pattern::new(p).ok();
            let hit = values.iter().any(|v| matches(pattern.as_ref(), p, v));
            let point = if c.op == CmpOp::Ne { !hit } else { hit };
            Truth {
                point,
                sure: Some(point),
            }
        }
        // The parser checks types; a mismatch can only come from a subject bug: no match.
        _ => Truth {
            point: false,
            sure: Some(false),
        },
    }
}

/// Glob match; a pattern with no `/` matches a path's last component alone (`fs.c` matches
/// `/src/fs.c`), so a gate need not know where the build tree was.
fn matches(pattern: Option<&glob::Pattern>, raw: &str, value: &str) -> bool {
    let Some(p) = pattern else {
        return raw == value;
    };
    if p.matches(value) {
        return true;
    }
    !raw.contains('/') && value.contains('/') && p.matches(value.rsplit('/').next().unwrap_or(""))
}

/// `12,345` for large numbers, `1.25` for small ones, `inf`.
pub fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if v.abs() < 10.0 && v.fract() != 0.0 {
        return format!("{v:.2}");
    }
    let digits = format!("{:.0}", v.abs());
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    if v < 0.0 {
        out.insert(0, '-');
    }
    out
}

/// `name = value` or `name = value (95% lo–hi)`.
pub fn describe_value(m: Metric, v: &Val) -> String {
    match v {
        Val::Num(n) if n.is_exact() => format!("{} = {}", m.name(), fmt_num(n.value)),
        Val::Num(n) => format!(
            "{} = {} (95% {}–{})",
            m.name(),
            fmt_num(n.value),
            fmt_num(n.lo),
            fmt_num(n.hi)
        ),
        Val::Text(t) => format!("{} = {}", m.name(), t.join("|")),
    }
}
