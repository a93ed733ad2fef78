//! The names a `--fail-on` expression can use, their types, and where they make sense.

/// Which command evaluates the expression.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Context {
    /// One report: `run`, `report`, `attach`.
    Report,
    /// Two reports: `diff` (totals and `finding.*` then refer to the new report).
    Diff,
}

/// What a metric compares against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricType {
    Number,
    /// Text matched with a glob; a non-empty list is the complete set of values.
    Text(&'static [&'static str]),
}

pub const KINDS: &[&str] = &["false_sharing", "true_sharing", "mixed"];
pub const STATUSES: &[&str] = &["new", "gone", "worse", "better", "unchanged"];

macro_rules! metrics {
    ($($var:ident = $name:literal, $ty:expr, $finding:literal, $diff_only:literal, $doc:literal;)*) => {
        /// A metric of a report (or of a comparison of two).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Metric { $($var),* }

        const ALL: &[(Metric, &str, MetricType, bool, bool, &str)] =
            &[$((Metric::$var, $name, $ty, $finding, $diff_only, $doc)),*];
    };
}

metrics! {
    FalseSharingRate = "false_sharing_rate", MetricType::Number, false, false,
        "false-sharing events/s summed over the listed findings (a mixed line counts its false share)";
    TrueSharingRate = "true_sharing_rate", MetricType::Number, false, false,
        "true-sharing events/s summed over the listed findings";
    ContentionRate = "contention_rate", MetricType::Number, false, false,
        "all contention events/s summed over the listed findings";
    Findings = "findings", MetricType::Number, false, false,
        "number of findings at or above the threshold";
    Lost = "lost", MetricType::Number, false, false, "samples the kernel dropped";
    Samples = "samples", MetricType::Number, false, false, "samples received";
    Overlap = "overlap", MetricType::Number, false, false,
        "share (0..1) of the time two or more of the program's threads were alive in which two ran at once on different CPUs (1 with one thread); below 0.5 (or under 0.2 s of threads running at once) a passed gate says COULD NOT OBSERVE";
    FindingKind = "finding.kind", MetricType::Text(KINDS), true, false,
        "false_sharing, true_sharing or mixed";
    FindingRate = "finding.rate", MetricType::Number, true, false, "the finding's events/s";
    FindingEvents = "finding.events", MetricType::Number, true, false,
        "contention events counted on the line";
    FindingShare = "finding.share", MetricType::Number, true, false,
        "share of all contention, 0..1";
    FindingFile = "finding.file", MetricType::Text(&[]), true, false,
        "any source's file (a pattern without / matches the file name alone)";
    FindingFunction = "finding.function", MetricType::Text(&[]), true, false,
        "any source's function";
    FindingData = "finding.data", MetricType::Text(&[]), true, false,
        "the data's name (`counters`, `heap`, …)";
    FindingStatus = "finding.status", MetricType::Text(STATUSES), true, true,
        "new, gone, worse, better or unchanged";
    FindingBaseRate = "finding.base_rate", MetricType::Number, true, true,
        "the finding's events/s in the base report (0 if new)";
    FindingRateRatio = "finding.rate_ratio", MetricType::Number, true, true,
        "new rate / base rate (0 if gone, infinite if new)";
    NewFindings = "new.findings", MetricType::Number, false, true,
        "findings only the new report has";
    GoneFindings = "gone.findings", MetricType::Number, false, true,
        "findings only the base report has";
    WorseFindings = "worse.findings", MetricType::Number, false, true,
        "matched findings whose rate rose beyond both intervals";
    RegressedFindings = "regressed.findings", MetricType::Number, false, true,
        "same as worse.findings";
    BetterFindings = "better.findings", MetricType::Number, false, true,
        "matched findings whose rate fell beyond both intervals";
    RegressedRateRatio = "regressed.rate_ratio", MetricType::Number, false, true,
        "the largest new/base rate ratio of a matched finding (0 with none)";
}

impl Metric {
    pub fn from_name(name: &str) -> Option<Metric> {
        ALL.iter().find(|m| m.1 == name).map(|m| m.0)
    }

    fn entry(self) -> &'static (Metric, &'static str, MetricType, bool, bool, &'static str) {
        ALL.iter()
            .find(|m| m.0 == self)
            .expect("every metric has an entry")
    }

    pub fn name(self) -> &'static str {
        self.entry().1
    }

    pub fn value_type(self) -> MetricType {
        self.entry().2
    }

    /// Evaluated once per finding (the expression trips if any finding satisfies it).
    pub fn per_finding(self) -> bool {
        self.entry().3
    }

    pub fn allowed_in(self, context: Context) -> bool {
        context == Context::Diff || !self.entry().4
    }

    /// Names usable in `context`, in documentation order.
    pub fn names(context: Context) -> Vec<&'static str> {
        ALL.iter()
            .filter(|m| m.0.allowed_in(context))
            .map(|m| m.1)
            .collect()
    }

    /// `name  meaning` lines for `--help`.
    pub fn help(context: Context) -> String {
        ALL.iter()
            .filter(|m| m.0.allowed_in(context))
            .map(|m| format!("  {:<22} {}\n", m.1, m.5))
            .collect()
    }
}
