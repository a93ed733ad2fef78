//! Exit codes of `laser` (also printed by `laser --help`).
//!
//! `laser run` passes the program's own status through, so a wrapper script sees what it would
//! have seen without laser: `exit(n)` → n, killed by signal N → 128 + N (the shell's rule).
//! The codes below are laser's own; 125–127 follow `env`/`timeout`/`nohup` conventions.

/// Everything worked (`report`, `record` on a program that exited 0, …).
pub const OK: i32 = 0;
/// laser failed before or after the program ran (bad recording, unreadable file, …).
pub const FAILED: i32 = 1;
/// Bad usage (clap's own code for argument errors, malformed `--fail-on` expressions
/// included).
#[allow(dead_code)]
pub const USAGE: i32 = 2;
/// A `--fail-on` gate tripped, and nothing else failed: the program's own non-zero status
/// (`run`), a refused or failed repair, or laser's own failure take precedence.
pub const GATE: i32 = 3;
/// `laser repair` or `laser attach --repair` refused (the planner's or the tracee's reason is
/// printed); the refused function was left untouched. With several functions to repair, the
/// others may have been repaired: the output says which. (Nothing to repair, everything
/// repaired, or a repair undone again by its trial because it measured no faster than
/// native, is `OK`: the process runs its original code, as with nothing to repair; a
/// failure is `FAILED`. `laser run --repair` exits with the program's
/// status whatever the repair did, and says what it did in its "repaired:" section.)
pub const REPAIR_REFUSED: i32 = 4;
/// laser failed while the program ran (monitoring broke down; the program may still be running).
pub const MONITOR_FAILED: i32 = 125;
/// The program exists but could not be executed.
pub const CANNOT_EXECUTE: i32 = 126;
/// The program was not found.
pub const NOT_FOUND: i32 = 127;

/// The status a shell would report for the program.
pub fn of_program(st: laser_driver::ExitStatus) -> i32 {
    match st {
        laser_driver::ExitStatus::Code(c) => c & 0xff,
        laser_driver::ExitStatus::Signal(s) => 128 + s,
        laser_driver::ExitStatus::Unknown => OK,
    }
}
