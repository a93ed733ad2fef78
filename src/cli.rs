//! Command-line surface of `laser` (clap derive). Only parsing lives here; each subcommand's
//! work is in its own module.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgMatches, Args, FromArgMatches, Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "laser",
    version,
    about = "Find and repair cache-line contention (true and false sharing) in x86-64 Linux programs",
    after_help = "Exit status: `laser run` (with or without --repair) exits with the program's own \
status (128+N if a signal N killed it). Otherwise: 0 ok (for `repair` and `attach --repair`: \
everything found was repaired, or nothing needed it), 1 laser failed, 2 bad usage, 3 a --fail-on \
gate tripped (only when nothing else failed: the program's own non-zero status, and laser's \
own failure, win over 3; the report is written either way), 4 a repair was refused (the output says which and why), 125 laser failed while the \
program ran, 126 the program could not be executed, 127 not found."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Launch a program, monitor it, and print a contention report when it exits.
    Run(Deferred<RunArgs>),
    /// Launch a program and record its sample stream to a file for later analysis.
    Record(Deferred<RecordArgs>),
    /// Analyse a recording made by `laser record`.
    Report(Deferred<ReportArgs>),
    /// Monitor a process that is already running.
    Attach(Deferred<AttachArgs>),
    /// Print which sampling backends this machine supports, and why.
    Backends,
    /// Print a recording's header and events, one per line (for debugging and scripts).
    Dump(Deferred<DumpArgs>),
    /// Repair false sharing in a running process (or undo laser's repairs there).
    Repair(Deferred<RepairArgs>),
    /// Compare two JSON reports: findings new, gone, better or worse (matched by source
    /// lines and data name, not addresses).
    Diff(Deferred<DiffArgs>),
    /// Analyse a perf.data recorded elsewhere with `perf c2c record` / `perf mem record`.
    Import(Deferred<ImportArgs>),
}

/// A subcommand's arguments, added to the command line's definition only when that
/// subcommand is the one given (`clap::Command::defer`). Otherwise clap builds every
/// subcommand's arguments at each start: 0.24 ms of every `laser run` here, more than the
/// parsing itself (benchmarks/RESULTS.md, twenty-eighth session). `--help` still lists every
/// subcommand with its summary; `laser SUB --help` builds that one.
#[derive(Debug)]
pub struct Deferred<T>(pub T);

impl<T: Args> Args for Deferred<T> {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        cmd.defer(|c| keeping_about(c, T::augment_args))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        cmd.defer(|c| keeping_about(c, T::augment_args_for_update))
    }

    fn group_id() -> Option<clap::Id> {
        T::group_id()
    }
}

impl<T: FromArgMatches> FromArgMatches for Deferred<T> {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        T::from_arg_matches(m).map(Deferred)
    }

    fn from_arg_matches_mut(m: &mut ArgMatches) -> Result<Self, clap::Error> {
        T::from_arg_matches_mut(m).map(Deferred)
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches(m)
    }

    fn update_from_arg_matches_mut(&mut self, m: &mut ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches_mut(m)
    }
}

/// `augment(cmd)` with `cmd`'s own summary kept: deferred, the arguments are added after the
/// subcommand's `about`, and a flattened group's doc comment would replace it.
fn keeping_about(cmd: clap::Command, augment: fn(clap::Command) -> clap::Command) -> clap::Command {
    let (about, long) = (cmd.get_about().cloned(), cmd.get_long_about().cloned());
    let mut cmd = augment(cmd);
    if let Some(a) = about {
        cmd = cmd.about(a);
    }
    if let Some(l) = long {
        cmd = cmd.long_about(l);
    }
    cmd
}

/// How the report (or diff) is printed on stdout.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// For people.
    Text,
    /// GitHub Actions workflow commands: one `::warning file=…,line=…::` per source line of
    /// each finding (`::error` where a --fail-on gate tripped on it).
    Github,
}

/// `laser diff`'s output formats.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum DiffFormat {
    Text,
    /// The comparison as JSON (schema laser-diff/1).
    Json,
    /// GitHub Actions workflow commands for new and worse findings.
    Github,
}

const GATE_HELP: &str = "Fail (exit 3) when EXPR holds; repeatable, gates OR together. \
EXPR compares metrics with > >= < <= == != and joins them with && || ! ( ): e.g. \
'false_sharing_rate > 1000', 'finding.kind == false_sharing && finding.rate > 5000', \
'finding.file == *.c && finding.function == worker*', 'finding.data == counters'. An \
expression with finding.* trips when any finding satisfies it. Text compares as a glob (a \
pattern without / matches file names alone). Each gate prints one verdict line on stderr; \
one whose rate's 95% interval straddles its threshold says UNSTABLE, and one that passed on \
a run whose threads barely ran at the same time (overlap < 0.5, or under 0.2 s in all) says \
COULD NOT OBSERVE (and \
still exits 0). A malformed EXPR is a \
usage error (exit 2) naming the column. The program's own non-zero status wins over 3.";

/// The --fail-on help with every metric usable there.
fn gate_help(intro: &str, context: crate::gate::Context) -> String {
    format!(
        "{intro}\n\nMetrics (rates in events/s; totals over the findings at or above \
         --threshold):\n{}",
        crate::gate::metric::Metric::help(context)
    )
}

fn parse_report_gate(s: &str) -> Result<crate::gate::Gate, String> {
    crate::gate::Gate::parse(s, crate::gate::Context::Report).map_err(|e| e.to_string())
}

fn parse_diff_gate(s: &str) -> Result<crate::gate::Gate, String> {
    crate::gate::Gate::parse(s, crate::gate::Context::Diff).map_err(|e| e.to_string())
}

#[derive(Args, Debug)]
pub struct DiffArgs {
    /// The base report (e.g. from main), JSON.
    pub base: PathBuf,
    /// The new report, JSON.
    pub new: PathBuf,
    #[arg(long = "fail-on", value_name = "EXPR", value_parser = parse_diff_gate, help = "Fail (exit 3) when EXPR holds (see --help)", long_help = gate_help(DIFF_GATE_HELP, crate::gate::Context::Diff))]
    pub fail_on: Vec<crate::gate::Gate>,
    /// Output format on stdout.
    #[arg(long, value_enum, default_value_t = DiffFormat::Text)]
    pub format: DiffFormat,
    /// Also write the comparison as JSON (laser-diff/1) to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write a JUnit XML file: one test case per gate and per new or worse finding.
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// Print nothing on stdout (gate verdicts still go to stderr).
    #[arg(long, short)]
    pub quiet: bool,
}

const DIFF_GATE_HELP: &str = "Fail (exit 3) when EXPR holds; repeatable, gates OR together. \
Besides every metric of `laser run --fail-on` (evaluated on the new report), EXPR may use \
new.findings, gone.findings, worse.findings (= regressed.findings), better.findings, \
regressed.rate_ratio (largest new/base rate ratio of a matched finding), and per finding \
finding.status (new, gone, worse, better, unchanged), finding.base_rate, finding.rate_ratio. \
E.g. 'new.findings > 0', 'regressed.rate_ratio > 2'. A malformed EXPR is a usage error (exit \
2) naming the column.";

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// The best backend this machine supports (printed with the reason).
    Auto,
    /// Intel PEBS precise loads with data_src (HITM).
    Pebs,
    /// AMD IBS op sampling.
    Ibs,
    /// cpu-clock sampling with user registers: works with no PMU (VMs, containers, CI).
    Soft,
}

#[derive(Args, Debug, Clone)]
pub struct MonitorArgs {
    /// Sampling backend.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// Sampling frequency per CPU, in Hz (soft backend). Default: the measured ≤2%-overhead value.
    #[arg(long)]
    pub freq: Option<u64>,
    /// Launch (soft backend): sample whole CPUs and drop other processes' samples, where the
    /// machine allows CPU-wide events (root, or perf_event_paranoid ≤ 0), instead of one timer
    /// per thread: a thread's own timer restarts at every context switch, which on a virtual
    /// machine costs a program meeting at barriers thousands of times a second several percent.
    /// The default; `--sample-cpus=false` gives every thread its own timer. Each CPU's timer
    /// runs at its own rate (up to 10% under --freq) so the CPUs' samples never line up
    /// (benchmarks/RESULTS.md, twentieth session). The report's `sampling` note says which
    /// was used. The watchpoint windows are then whole-CPU too, while no other laser session
    /// watches on the machine: no debug-register reload at each context switch of a watched
    /// thread, but while a window counts its debug registers are taken on every CPU (a
    /// debugger's hardware watchpoint set meanwhile is refused); the `watchpoint cost` note
    /// says which. Ignored by attach (always per thread).
    #[arg(
        long = "sample-cpus",
        value_name = "BOOL",
        default_value_t = true,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub sample_cpus: bool,
    /// Refine soft-backend estimates with hardware watchpoints on candidate lines.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub watch: bool,
    /// Also point the watchpoints at this word, ADDR[:LEN] (hex address as the program sees
    /// it, LEN 1, 2, 4 or 8, default 8), in turn with the candidate lines: an exact transfer
    /// rate for a variable you suspect, even when timer samples never land on its accesses.
    /// Repeatable; words of one line share its turn (4 debug registers).
    #[arg(long = "watch-addr", value_name = "ADDR[:LEN]", value_parser = parse_watch_addr)]
    pub watch_addr: Vec<(u64, u32)>,
    /// How much longer the watchpoints may make the program take, in percent of its time:
    /// what their windows cost (see --watch-cost-model) at most this, in CPU time and in wall
    /// time, and the slowdown of armed debug registers on string copies at most three
    /// quarters of it. Lower costs less and rates fewer lines per second of run; sampling
    /// and laser's start come on top (the whole run: 2.6% geomean on the real programs,
    /// benchmarks/RESULTS.md).
    #[arg(long = "watch-budget", value_name = "PERCENT", default_value_t = laser_driver::duty::DEFAULT_MAX_SLOWDOWN * 100.0, value_parser = parse_budget_percent)]
    pub watch_budget: f64,
    /// What the watch budget is charged with: `full` (the trap alone, plus laser's work
    /// opening and closing the window events, plus the watched threads' context switches
    /// while armed, each of which reloads the debug registers: what a window really costs,
    /// which keeps barrier-heavy programs within the budget) or `traps` (each trap priced as
    /// measured with a wake-up of laser per hit, about twice the trap alone on a VM, standing
    /// in for the windows' other costs; the default before 2026-11-28).
    #[arg(long = "watch-cost-model", value_name = "MODEL", default_value = "full", value_parser = parse_cost_model)]
    pub watch_cost_model: laser_driver::CostModel,
}

fn parse_cost_model(s: &str) -> Result<laser_driver::CostModel, String> {
    match s {
        "traps" => Ok(laser_driver::CostModel::Traps),
        "full" => Ok(laser_driver::CostModel::Full),
        _ => Err(format!("{s:?}: the models are `traps` and `full`")),
    }
}

#[derive(Args, Debug, Clone)]
pub struct AnalysisArgs {
    /// Report findings at or above this many contention events per second (a rate from one
    /// or two events only if the low end of its 95% interval is: else it is counted with the
    /// lines below it).
    #[arg(long, default_value_t = 1000.0)]
    pub threshold: f64,
    /// Cache-line size for the line model: 64, or 128 to group adjacent-line pairs.
    #[arg(long, default_value_t = 64, value_parser = parse_line_size)]
    pub line: u32,
    /// Also write the report as JSON (schema laser-report/1) to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Do not print the text report.
    #[arg(long, short)]
    pub quiet: bool,
    /// Read files recorded under FROM from TO instead (binaries and sources moved, or a
    /// recording analysed on another machine). Repeatable; the first matching prefix wins.
    #[arg(long = "path-map", value_name = "FROM=TO", value_parser = parse_path_map)]
    pub path_map: Vec<(String, String)>,
    #[arg(long = "fail-on", value_name = "EXPR", value_parser = parse_report_gate, help = "Fail (exit 3) when EXPR holds, e.g. 'false_sharing_rate > 1000' (see --help)", long_help = gate_help(GATE_HELP, crate::gate::Context::Report))]
    pub fail_on: Vec<crate::gate::Gate>,
    /// How the report is printed on stdout.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Write a JUnit XML file: one test case per --fail-on gate and per finding.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Write the report as a pprof profile (profile.proto, gzipped) for fleet backends
    /// (Parca, Pyroscope, `go tool pprof`): samples weighted by contention events, labels
    /// kind, data, cache_line, op.
    #[arg(long, value_name = "FILE")]
    pub pprof: Option<PathBuf>,
    /// Write collapsed stacks (`frame;frame;[kind data] events`) for flame graphs.
    #[arg(long, value_name = "FILE")]
    pub collapsed: Option<PathBuf>,
    /// Print a data-centric view instead of the per-line text report (DProf's data profile):
    /// `type` ranks the data types of the contended accesses by contention events, with
    /// their contended members, threads, source lines, kinds and a fix from the type's
    /// layout; `field` ranks the members. Types come from DWARF (build with -g).
    #[arg(long, value_enum, value_name = "VIEW")]
    pub by: Option<ByView>,
}

/// `--by`: the data-centric views.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum ByView {
    /// Data types ranked by contention events.
    Type,
    /// Members of the data types ranked by contention events.
    Field,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub monitor: MonitorArgs,
    #[command(flatten)]
    pub analysis: AnalysisArgs,
    /// Also keep the recording in this file.
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// Repair false sharing while the program runs: every --repair-after, check whether a
    /// false-sharing line has reached --threshold events/s; the first time one has, repair the
    /// sources of the false-sharing findings seen so far in the live program (once), keep
    /// monitoring to the end, and print the report with a "repaired:" section. The exit
    /// status is still the program's own; repair messages go to stderr (stdout is the
    /// program's). `laser repair -p PID --undo` takes the repair out while it runs.
    #[arg(long)]
    pub repair: bool,
    /// With --repair: how long to monitor before the first check, and between checks (e.g.
    /// 500ms, 2s). A program that exits before the first check is only reported.
    #[arg(long, value_parser = parse_duration, default_value = "250ms", requires = "repair")]
    pub repair_after: Duration,
    #[command(flatten)]
    pub repair_opts: RepairTuning,
    /// Name where each contended heap block was allocated (call stack past allocator
    /// wrappers, requested size): preloads laser's allocation recorder into the program. Off
    /// by default: every malloc/free then goes through the recorder, which costs
    /// allocation-heavy programs up to ~1.2-1.4x (benchmarks/RESULTS.md, "Allocation sites").
    #[arg(long)]
    pub alloc_sites: bool,
    /// Print the access history of objects allocated on this line (FILE:LINE, the line that
    /// calls malloc or a wrapper of it): each new object's first 32 bytes are watched with
    /// the debug registers from its allocation to its free — which threads and functions
    /// read and write which offsets, in order, on which CPU. The program waits briefly at
    /// each such allocation while laser arms the watchpoints; watchpoint steering is off.
    #[arg(long, value_name = "FILE:LINE", conflicts_with_all = ["repair", "history_type"])]
    pub history_site: Option<String>,
    /// Like --history-site, for objects of a type (`struct job`, `job`, a typedef): every
    /// allocation of exactly sizeof(TYPE) bytes (from DWARF) is taken as one; each object's
    /// history says where it was allocated, so one of another type of the same size shows.
    #[arg(long, value_name = "TYPE", conflicts_with = "repair")]
    pub history_type: Option<String>,
    /// With --history-site/--history-type: how many objects to follow, one after the other.
    #[arg(long, default_value_t = 1)]
    pub history_objects: usize,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<OsString>,
}

/// Planner knobs shared by `run --repair` and `attach --repair`.
#[derive(Args, Debug, Clone)]
pub struct RepairTuning {
    /// With --repair: refuse regions whose estimated stores per flush are below this
    /// (default 4; see `laser repair --help`).
    #[arg(
        long = "min-stores-per-flush",
        id = "repair_min_stores_per_flush",
        default_value_t = 4.0,
        value_parser = parse_non_negative,
        requires = "repair"
    )]
    pub min_stores_per_flush: f64,
    #[command(flatten)]
    pub trial: TrialArgs,
}

/// The repair's trial (`laser repair`, `run --repair`, `attach --repair`).
#[derive(Args, Debug, Clone)]
pub struct TrialArgs {
    /// Keep a repair without measuring it. By default laser runs the region with native
    /// accesses and then repaired, --trial-ms each, counting loop iterations, in two
    /// alternating rounds, and undoes a repair that is not at least 5% faster in every round
    /// (a wrong diagnosis or a loop with too little contention would otherwise run several
    /// times slower).
    #[arg(long)]
    pub no_trial: bool,
    /// Milliseconds each of the trial's measurements runs (four of them: two rounds).
    #[arg(long, default_value_t = crate::repair::trial::DEFAULT_TRIAL_MS, value_parser = clap::value_parser!(u64).range(1..=60_000), conflicts_with = "no_trial")]
    pub trial_ms: u64,
    /// Percent of the process's age (when the trial starts) the trial may cost it: its
    /// holds of the target and the time its losing windows lose. A trial starts only when
    /// its holds fit (`run --repair` waits for a later check until they do) and a losing
    /// window ends when it would overrun. 0: no limit.
    #[arg(long, default_value_t = crate::repair::budget::DEFAULT_BUDGET_PERCENT, value_parser = parse_non_negative, conflicts_with = "no_trial")]
    pub trial_budget: f64,
}

impl RepairTuning {
    /// The repair settings of `run --repair` and `attach --repair`.
    pub fn settings(&self) -> crate::repair::Settings {
        crate::repair::Settings {
            min_stores_per_flush: self.min_stores_per_flush,
            trial: self.trial.settings(),
            ..crate::repair::Settings::default()
        }
    }
}

impl TrialArgs {
    pub fn settings(&self) -> Option<crate::repair::TrialSettings> {
        (!self.no_trial).then(|| crate::repair::TrialSettings {
            window: Duration::from_millis(self.trial_ms),
            budget: (self.trial_budget > 0.0).then_some(self.trial_budget / 100.0),
            ..Default::default()
        })
    }
}

#[derive(Args, Debug)]
pub struct RecordArgs {
    #[command(flatten)]
    pub monitor: MonitorArgs,
    /// Where to write the recording.
    #[arg(long, short = 'o', default_value = "run.laser")]
    pub output: PathBuf,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<OsString>,
}

#[derive(Args, Debug)]
pub struct ReportArgs {
    #[command(flatten)]
    pub analysis: AnalysisArgs,
    /// The recording to analyse.
    pub input: PathBuf,
}

#[derive(Args, Debug)]
pub struct ImportArgs {
    #[command(flatten)]
    pub analysis: AnalysisArgs,
    /// The perf.data file (`perf c2c record`, `perf mem record`, or `perf record` with
    /// `--user-regs` for timer samples).
    pub input: PathBuf,
}

#[derive(Args, Debug)]
pub struct DumpArgs {
    /// The recording to print.
    pub input: PathBuf,
    /// Print at most this many events.
    #[arg(long)]
    pub limit: Option<u64>,
}

#[derive(Args, Debug)]
pub struct AttachArgs {
    /// Process id to monitor.
    #[arg(long, short)]
    pub pid: u32,
    /// How long to monitor (e.g. 10s, 500ms, 2m). Default: until the process exits or
    /// Ctrl-C; with --repair, 2s.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    #[command(flatten)]
    pub monitor: MonitorArgs,
    #[command(flatten)]
    pub analysis: AnalysisArgs,
    /// Also keep the recording in this file.
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// Repair false sharing in the running process: after monitoring, repair the sources of
    /// the report's false-sharing findings (at or above --threshold) exactly as
    /// `laser repair --from` would, print what was repaired or refused, and detach. Exit 0 if
    /// everything found was repaired (or nothing needed it), 4 if a repair was refused, 1 if
    /// one failed. `laser repair -p PID --undo` takes the repairs out again.
    #[arg(long)]
    pub repair: bool,
    #[command(flatten)]
    pub repair_opts: RepairTuning,
}

/// How long `attach --repair` monitors when no --duration is given: long enough for the soft
/// backend (250 Hz per thread) to see a falsely shared loop several hundred times and for the
/// watchpoints to settle a line's estimate (0.3 s armed per candidate), short enough that the
/// repair comes while the contention is still there.
pub const ATTACH_REPAIR_DURATION: Duration = Duration::from_secs(2);

#[derive(Args, Debug)]
#[command(group = clap::ArgGroup::new("what").required(true).args(["pc", "from", "undo"]))]
pub struct RepairArgs {
    /// Process id to repair.
    #[arg(long, short)]
    pub pid: i32,
    /// Run-time addresses of contending instructions (hex with 0x, or decimal).
    #[arg(long, num_args = 1.., value_parser = parse_addr)]
    pub pc: Vec<u64>,
    /// A `laser run/attach --json` report: repair the sources of its false-sharing findings.
    #[arg(long)]
    pub from: Option<PathBuf>,
    /// Undo every repair laser made in the process.
    #[arg(long)]
    pub undo: bool,
    /// Print the plan without touching the process.
    #[arg(long, conflicts_with = "undo")]
    pub dry_run: bool,
    /// Refuse regions whose estimated stores per flush are below this (default 4: fewer
    /// cost more than they save). Above 0, loops whose store addresses change (the general
    /// store-buffer path, measured slower than the contended original) are refused too.
    /// 0 repairs any region the rewriter can handle, e.g. straight-line litmus bodies.
    #[arg(long, default_value_t = 4.0, value_parser = parse_non_negative)]
    pub min_stores_per_flush: f64,
    #[command(flatten)]
    pub trial: TrialArgs,
}

fn parse_non_negative(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("'{s}' is not a non-negative number")),
    }
}

fn parse_budget_percent(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 50.0 => Ok(v),
        _ => Err(format!("'{s}' is not a percentage above 0 and at most 50")),
    }
}

fn parse_addr(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let r = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => t.parse(),
    };
    r.map_err(|_| format!("not an address: {s:?} (use 0x-prefixed hex or decimal)"))
}

impl Default for AnalysisArgs {
    /// The same values as the flags' defaults.
    fn default() -> Self {
        AnalysisArgs {
            threshold: 1000.0,
            line: 64,
            json: None,
            quiet: false,
            path_map: Vec::new(),
            fail_on: Vec::new(),
            format: Format::Text,
            junit: None,
            pprof: None,
            collapsed: None,
            by: None,
        }
    }
}

fn parse_path_map(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((from, to)) if !from.is_empty() => Ok((from.to_owned(), to.to_owned())),
        _ => Err(format!("expected FROM=TO, got {s:?}")),
    }
}

fn parse_watch_addr(s: &str) -> Result<(u64, u32), String> {
    let (a, l) = s.split_once(':').unwrap_or((s, "8"));
    let addr = u64::from_str_radix(a.trim_start_matches("0x"), 16)
        .map_err(|e| format!("watch address {a:?} is not hex: {e}"))?;
    let len: u32 = l
        .parse()
        .map_err(|_| format!("watch length {l:?} is not a number"))?;
    if !matches!(len, 1 | 2 | 4 | 8) || addr % u64::from(len) != 0 {
        return Err(format!(
            "watch {addr:#x}:{len}: a debug register watches 1, 2, 4 or 8 bytes aligned to \
             their length"
        ));
    }
    Ok((addr, len))
}

fn parse_line_size(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n @ (64 | 128)) => Ok(n),
        _ => Err(format!("line size must be 64 or 128, not {s:?}")),
    }
}

/// Parses `10s`, `500ms`, `2m`, `1h`, or a bare number of seconds (`1.5`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("not a duration: {s:?} (try 10s, 500ms, 2m)"))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "s" => v,
        "m" | "min" => v * 60.0,
        "h" => v * 3600.0,
        _ => return Err(format!("unknown unit {unit:?} in {s:?} (use ms, s, m, h)")),
    };
    if !(secs.is_finite() && secs > 0.0) {
        return Err(format!("duration must be positive: {s:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn deferred_subcommands_keep_their_summary_and_build_their_arguments_when_asked() {
        let mut cli = Cli::command();
        for (name, about) in [
            ("run", "Launch a program, monitor it"),
            ("attach", "Monitor a process that is already running"),
            ("repair", "Repair false sharing in a running process"),
        ] {
            let sub = cli.find_subcommand_mut(name).unwrap();
            // Rendering the help builds the subcommand, deferred arguments and all.
            let help = sub.render_help().to_string();
            assert!(help.starts_with(about), "{name}: {help}");
            assert!(
                help.contains("--json"),
                "{name}'s arguments were added: {help}"
            );
        }
        // Parsing builds only the subcommand given, and parses it as before.
        let cli = Cli::try_parse_from(["laser", "run", "--freq", "99", "./app"]).unwrap();
        let Command::Run(Deferred(r)) = cli.command else {
            panic!("not run")
        };
        assert_eq!((r.monitor.freq, r.command.len()), (Some(99), 1));
        Cli::command().debug_assert();
    }

    #[test]
    fn watch_addr_takes_aligned_words_of_debug_register_sizes() {
        assert_eq!(parse_watch_addr("0x404040:4"), Ok((0x404040, 4)));
        assert_eq!(
            parse_watch_addr("404048"),
            Ok((0x404048, 8)),
            "8 bytes by default"
        );
        let e = parse_watch_addr("0x404044:8").unwrap_err();
        assert!(e.contains("aligned"), "{e}");
        let e = parse_watch_addr("0x404040:16").unwrap_err();
        assert!(e.contains("1, 2, 4 or 8"), "{e}");
        assert!(parse_watch_addr("slots").unwrap_err().contains("not hex"));
        assert!(parse_watch_addr("0x10:x")
            .unwrap_err()
            .contains("not a number"));
    }

    #[test]
    fn whole_cpu_sampling_is_the_default_and_takes_an_attached_value_only() {
        let run = |args: &[&str]| match Cli::try_parse_from(args).unwrap().command {
            Command::Run(Deferred(r)) => (r.monitor.sample_cpus, r.command),
            _ => panic!("not a run"),
        };
        assert_eq!(
            run(&["laser", "run", "./app"]),
            (true, vec!["./app".into()])
        );
        assert!(!run(&["laser", "run", "--sample-cpus=false", "./app"]).0);
        assert!(run(&["laser", "run", "--sample-cpus=true", "./app"]).0);
        // A bare flag before the program: the program is not taken for its value.
        assert_eq!(
            run(&["laser", "run", "--sample-cpus", "./app", "x"]),
            (true, vec!["./app".into(), "x".into()])
        );
        assert!(Cli::try_parse_from(["laser", "run", "--sample-cpus=maybe", "./app"]).is_err());
    }

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn run_keeps_program_arguments_verbatim() {
        let cli =
            Cli::try_parse_from(["laser", "run", "--", "./app", "-x", "--json", "y"]).unwrap();
        let Command::Run(Deferred(r)) = cli.command else {
            panic!("not run")
        };
        assert_eq!(r.command, ["./app", "-x", "--json", "y"]);
        assert!(r.analysis.json.is_none());
    }

    #[test]
    fn analysis_defaults_match_the_flags() {
        let cli = Cli::try_parse_from(["laser", "report", "x.laser"]).unwrap();
        let Command::Report(Deferred(r)) = cli.command else {
            panic!("not report")
        };
        let d = AnalysisArgs::default();
        assert_eq!(
            (r.analysis.threshold, r.analysis.line),
            (d.threshold, d.line)
        );
    }

    #[test]
    fn path_maps_parse() {
        let cli = Cli::try_parse_from([
            "laser",
            "report",
            "--path-map",
            "/a=/b",
            "--path-map",
            "/c=",
            "x.laser",
        ])
        .unwrap();
        let Command::Report(Deferred(r)) = cli.command else {
            panic!("not report")
        };
        assert_eq!(
            r.analysis.path_map,
            [("/a".into(), "/b".into()), ("/c".into(), String::new())]
        );
        assert!(Cli::try_parse_from(["laser", "report", "--path-map", "nope", "x"]).is_err());
        assert!(Cli::try_parse_from(["laser", "report", "--path-map", "=/b", "x"]).is_err());
    }

    #[test]
    fn repair_takes_hex_or_decimal_pcs_and_one_action() {
        let cli =
            Cli::try_parse_from(["laser", "repair", "-p", "7", "--pc", "0x10", "32"]).unwrap();
        let Command::Repair(Deferred(r)) = cli.command else {
            panic!("not repair")
        };
        assert_eq!((r.pid, r.pc), (7, vec![16, 32]));
        assert_eq!(r.min_stores_per_flush, 4.0);
        let cli = Cli::try_parse_from([
            "laser",
            "repair",
            "-p",
            "7",
            "--pc",
            "1",
            "--min-stores-per-flush",
            "0",
        ])
        .unwrap();
        let Command::Repair(Deferred(r)) = cli.command else {
            panic!("not repair")
        };
        assert_eq!(r.min_stores_per_flush, 0.0);
        for bad in ["-1", "nan", "x"] {
            let args = [
                "laser",
                "repair",
                "-p",
                "7",
                "--pc",
                "1",
                "--min-stores-per-flush",
                bad,
            ];
            assert!(Cli::try_parse_from(args).is_err(), "{bad} accepted");
        }
        assert!(Cli::try_parse_from(["laser", "repair", "-p", "7"]).is_err());
        assert!(Cli::try_parse_from(["laser", "repair", "-p", "7", "--pc", "zz"]).is_err());
        assert!(
            Cli::try_parse_from(["laser", "repair", "-p", "7", "--undo", "--dry-run"]).is_err()
        );
    }

    #[test]
    fn run_and_attach_repair_flags() {
        let cli = Cli::try_parse_from(["laser", "run", "--repair", "--", "./app"]).unwrap();
        let Command::Run(Deferred(r)) = cli.command else {
            panic!("not run")
        };
        assert!(r.repair);
        assert_eq!(r.repair_after, Duration::from_millis(250));
        assert_eq!(r.repair_opts.min_stores_per_flush, 4.0);
        let cli = Cli::try_parse_from([
            "laser",
            "run",
            "--repair",
            "--repair-after",
            "2s",
            "--min-stores-per-flush",
            "0",
            "--",
            "./app",
            "--repair",
        ])
        .unwrap();
        let Command::Run(Deferred(r)) = cli.command else {
            panic!("not run")
        };
        assert_eq!(r.repair_after, Duration::from_secs(2));
        assert_eq!(r.repair_opts.min_stores_per_flush, 0.0);
        assert_eq!(r.command, ["./app", "--repair"], "the program's own flags");
        // Repair knobs without --repair are a usage error, not silently ignored.
        for bad in [
            &["laser", "run", "--repair-after", "2s", "--", "x"][..],
            &["laser", "run", "--min-stores-per-flush", "1", "--", "x"],
            &["laser", "attach", "-p", "1", "--min-stores-per-flush", "1"],
        ] {
            assert!(Cli::try_parse_from(bad).is_err(), "{bad:?} accepted");
        }
        let cli = Cli::try_parse_from(["laser", "attach", "-p", "9", "--repair"]).unwrap();
        let Command::Attach(Deferred(a)) = cli.command else {
            panic!("not attach")
        };
        assert!(a.repair && a.duration.is_none());
        let cli = Cli::try_parse_from(["laser", "attach", "-p", "9"]).unwrap();
        let Command::Attach(Deferred(a)) = cli.command else {
            panic!("not attach")
        };
        assert!(!a.repair);
    }

    #[test]
    fn line_size_must_be_64_or_128() {
        assert!(Cli::try_parse_from(["laser", "run", "--line", "96", "--", "x"]).is_err());
        assert!(Cli::try_parse_from(["laser", "run", "--line", "128", "--", "x"]).is_ok());
    }
}
