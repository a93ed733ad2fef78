//! The `--fail-on` expression language: comparisons of report metrics joined by `&&`, `||`,
//! `!` and parentheses.
//!
//! ```text
//! expr  := and ('||' and)*
//! and   := unary ('&&' unary)*
//! unary := '!' unary | '(' expr ')' | metric OP value
//! OP    := '>' | '>=' | '<' | '<=' | '==' | '!='
//! value := number | word | "quoted" | 'quoted'       (words may hold globs: *.c, worker_*)
//! ```
//!
//! Parsing takes the text, never a file; errors carry the 1-based column (in characters) so the
//! CLI can point at it.

use std::fmt;

use super::metric::{Context, Metric, MetricType};

/// A comparison operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    Gt,
    Ge,
    Lt,
    Le,
    Eq,
    Ne,
}

impl CmpOp {
    pub fn as_str(self) -> &'static str {
        match self {
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Eq => "==",
            CmpOp::Ne => "!=",
        }
    }
}

/// The right-hand side of a comparison.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Number(f64),
    /// A glob (`*`, `?`, `[...]`) or plain word, for text metrics.
    Pattern(String),
}

/// One `metric OP value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    pub metric: Metric,
    pub op: CmpOp,
    pub value: Value,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    Or(Box<Expr>, Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Cmp(Comparison),
}

impl Expr {
    /// Every metric the expression mentions, in order of appearance, without repeats.
    pub fn metrics(&self) -> Vec<Metric> {
        fn walk(e: &Expr, out: &mut Vec<Metric>) {
            match e {
                Expr::Or(a, b) | Expr::And(a, b) => {
                    walk(a, out);
                    walk(b, out);
                }
                Expr::Not(a) => walk(a, out),
                Expr::Cmp(c) => {
                    if !out.contains(&c.metric) {
                        out.push(c.metric);
                    }
                }
            }
        }
        let mut out = Vec::new();
        walk(self, &mut out);
        out
    }
}

/// A malformed expression: what is wrong and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// The whole expression as given.
    pub expr: String,
    /// 1-based, in characters.
    pub column: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    /// `MESSAGE at column N` and the expression with a caret under the column.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at column {}\n  {}\n  {}^",
            self.message,
            self.column,
            self.expr,
            " ".repeat(self.column.saturating_sub(1))
        )
    }
}

impl std::error::Error for ParseError {}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    LParen,
    RParen,
    Not,
    And,
    Or,
    Op(CmpOp),
    Word(String),
    Quoted(String),
    End,
}

impl Tok {
    fn describe(&self) -> String {
        match self {
            Tok::LParen => "`(`".into(),
            Tok::RParen => "`)`".into(),
            Tok::Not => "`!`".into(),
            Tok::And => "`&&`".into(),
            Tok::Or => "`||`".into(),
            Tok::Op(o) => format!("`{}`", o.as_str()),
            Tok::Word(w) => format!("`{w}`"),
            Tok::Quoted(w) => format!("{w:?}"),
            Tok::End => "the end".into(),
        }
    }
}

/// Characters that end a bare word.
fn is_special(c: char) -> bool {
    c.is_whitespace() || "()!=<>&|\"'".contains(c)
}

fn lex(text: &str) -> Result<Vec<(Tok, usize)>, ParseError> {
    let chars: Vec<char> = text.chars().collect();
    let err = |column: usize, message: String| ParseError {
        expr: text.to_owned(),
        column,
        message,
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let col = i + 1;
        let next = chars.get(i + 1).copied();
        let (tok, len) = match (c, next) {
            (c, _) if c.is_whitespace() => {
                i += 1;
                continue;
            }
            ('(', _) => (Tok::LParen, 1),
            (')', _) => (Tok::RParen, 1),
            ('&', Some('&')) => (Tok::And, 2),
            ('|', Some('|')) => (Tok::Or, 2),
            ('&', _) => return Err(err(col, "`&` alone: use `&&` for and".into())),
            ('|', _) => return Err(err(col, "`|` alone: use `||` for or".into())),
            ('>', Some('=')) => (Tok::Op(CmpOp::Ge), 2),
            ('<', Some('=')) => (Tok::Op(CmpOp::Le), 2),
            ('=', Some('=')) => (Tok::Op(CmpOp::Eq), 2),
            ('!', Some('=')) => (Tok::Op(CmpOp::Ne), 2),
            ('>', _) => (Tok::Op(CmpOp::Gt), 1),
            ('<', _) => (Tok::Op(CmpOp::Lt), 1),
            ('!', _) => (Tok::Not, 1),
            ('=', _) => return Err(err(col, "`=` alone: use `==` to compare".into())),
            ('"' | '\'', _) => {
                let end = chars[i + 1..]
                    .iter()
                    .position(|&d| d == c)
                    .ok_or_else(|| err(col, format!("unterminated {c}quote{c}")))?;
                let s: String = chars[i + 1..i + 1 + end].iter().collect();
                (Tok::Quoted(s), end + 2)
            }
            _ => {
                let len = chars[i..]
                    .iter()
                    .position(|&d| is_special(d))
                    .unwrap_or(chars.len() - i);
                (Tok::Word(chars[i..i + len].iter().collect()), len)
            }
        };
        out.push((tok, col));
        i += len;
    }
    out.push((Tok::End, chars.len() + 1));
    Ok(out)
}

struct Parser<'a> {
    text: &'a str,
    toks: Vec<(Tok, usize)>,
    pos: usize,
    context: Context,
}

impl Parser<'_> {
    fn peek(&self) -> &(Tok, usize) {
        &self.toks[self.pos]
    }

    fn bump(&mut self) -> (Tok, usize) {
        let t = self.toks[self.pos].clone();
        if t.0 != Tok::End {
            self.pos += 1;
        }
        t
    }

    fn err(&self, column: usize, message: impl Into<String>) -> ParseError {
        ParseError {
            expr: self.text.to_owned(),
            column,
            message: message.into(),
        }
    }

    fn or(&mut self) -> Result<Expr, ParseError> {
        let mut left = self.and()?;
        while self.peek().0 == Tok::Or {
            self.bump();
            left = Expr::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, ParseError> {
        let mut left = self.unary()?;
        while self.peek().0 == Tok::And {
            self.bump();
            left = Expr::And(Box::new(left), Box::new(self.unary()?));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr, ParseError> {
        let (tok, col) = self.bump();
        match tok {
            Tok::Not => Ok(Expr::Not(Box::new(self.unary()?))),
            Tok::LParen => {
                let inner = self.or()?;
                let (close, ccol) = self.bump();
                if close != Tok::RParen {
                    return Err(self.err(
                        ccol,
                        format!(
                            "expected `)` closing the `(` at column {col}, found {}",
                            close.describe()
                        ),
                    ));
                }
                Ok(inner)
            }
            Tok::Word(name) => self.comparison(&name, col).map(Expr::Cmp),
            other => Err(self.err(
                col,
                format!(
                    "expected a metric (e.g. false_sharing_rate), `(` or `!`, found {}",
                    other.describe()
                ),
            )),
        }
    }

    fn comparison(&mut self, name: &str, col: usize) -> Result<Comparison, ParseError> {
        let metric = Metric::from_name(name).ok_or_else(|| {
            self.err(
                col,
                format!(
                    "unknown metric `{name}` (known here: {})",
                    Metric::names(self.context).join(", ")
                ),
            )
        })?;
        if !metric.allowed_in(self.context) {
            return Err(self.err(
                col,
                format!("`{name}` compares two reports: it is only for `laser diff`"),
            ));
        }
        let (tok, ocol) = self.bump();
        let Tok::Op(op) = tok else {
            return Err(self.err(
                ocol,
                format!(
                    "expected a comparison (>, >=, <, <=, ==, !=) after `{name}`, found {}",
                    tok.describe()
                ),
            ));
        };
        let (tok, vcol) = self.bump();
        let raw = match tok {
            Tok::Word(w) | Tok::Quoted(w) => w,
            other => {
                return Err(self.err(
                    vcol,
                    format!(
                        "expected a value after `{name} {}`, found {}",
                        op.as_str(),
                        other.describe()
                    ),
                ))
            }
        };
        let value = match metric.value_type() {
            MetricType::Number => {
                let n = raw
                    .replace('_', "")
                    .parse::<f64>()
                    .ok()
                    .filter(|n| n.is_finite());
                Value::Number(n.ok_or_else(|| {
                    self.err(vcol, format!("`{name}` is a number: `{raw}` is not one"))
                })?)
            }
            MetricType::Text(allowed) => {
                if !matches!(op, CmpOp::Eq | CmpOp::Ne) {
                    return Err(self.err(
                        ocol,
                        format!(
                            "`{name}` is text: compare it with == or !=, not {}",
                            op.as_str()
                        ),
                    ));
                }
                if !allowed.is_empty() && !allowed.contains(&raw.as_str()) {
                    return Err(self.err(
                        vcol,
                        format!("`{name}` is one of {}, not `{raw}`", allowed.join(", ")),
                    ));
                }
                if let Err(e) = glob::Pattern::new(&raw) {
                    return Err(self.err(vcol + e.pos, format!("bad pattern `{raw}`: {}", e.msg)));
                }
                Value::Pattern(raw)
            }
        };
        Ok(Comparison { metric, op, value })
    }
}

/// Parses one `--fail-on` expression for a command of `context`.
pub fn parse(text: &str, context: Context) -> Result<Expr, ParseError> {
    let mut p = Parser {
        text,
        toks: lex(text)?,
        pos: 0,
        context,
    };
    if p.peek().0 == Tok::End {
        return Err(p.err(
            1,
            "empty expression: expected e.g. `false_sharing_rate > 1000`",
        ));
    }
    let e = p.or()?;
    let (tok, col) = p.bump();
    if tok != Tok::End {
        return Err(p.err(
            col,
            format!("expected `&&`, `||` or the end, found {}", tok.describe()),
        ));
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tree in prefix form, for compact assertions.
    fn show(e: &Expr) -> String {
        match e {
            Expr::Or(a, b) => format!("(or {} {})", show(a), show(b)),
            Expr::And(a, b) => format!("(and {} {})", show(a), show(b)),
            Expr::Not(a) => format!("(not {})", show(a)),
            Expr::Cmp(c) => format!(
                "{}{}{}",
                c.metric.name(),
                c.op.as_str(),
                match &c.value {
                    Value::Number(n) => n.to_string(),
                    Value::Pattern(p) => p.clone(),
                }
            ),
        }
    }

    fn tree(text: &str) -> String {
        show(&parse(text, Context::Diff).unwrap())
    }

    #[test]
    fn and_binds_tighter_than_or_and_not_binds_tightest() {
        assert_eq!(
            tree("findings > 0 || lost > 0 && samples < 10"),
            "(or findings>0 (and lost>0 samples<10))"
        );
        assert_eq!(
            tree("(findings > 0 || lost > 0) && samples < 1_000"),
            "(and (or findings>0 lost>0) samples<1000)"
        );
        assert_eq!(
            tree("!finding.data == 'a b' && finding.file != *.h"),
            "(and (not finding.data==a b) finding.file!=*.h)"
        );
        assert_eq!(tree("finding.rate>=5e3"), "finding.rate>=5000");
        assert_eq!(tree("regressed.rate_ratio > 2"), "regressed.rate_ratio>2");
    }

    #[test]
    fn columns_count_characters_not_bytes() {
        // `≥` is 3 bytes in UTF-8 but one column.
        let e = parse("findings ≥ 1", Context::Report).unwrap_err();
        assert_eq!(e.column, 10, "{e}");
        let e = parse("finding.data == ünïcode && x > 1", Context::Report).unwrap_err();
        assert_eq!(e.column, 28, "{e}");
    }

    #[test]
    fn diff_metrics_are_refused_outside_diff() {
        let e = parse("findings > 0 || regressed.rate_ratio > 2", Context::Report).unwrap_err();
        assert_eq!(e.column, 17);
        assert!(e.message.contains("only for `laser diff`"), "{e}");
    }
}
