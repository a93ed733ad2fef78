//! `laser`: find and repair cache-line contention in multithreaded x86-64 Linux programs.

mod alloc_history;
mod alloc_shim;
mod analyze;
mod backend;
mod cli;
mod commands;
mod diff;
mod exit;
mod export;
mod gate;
mod import;
mod interval;
mod live_heap;
mod live_view;
mod monitor;
mod output;
mod private_file;
mod recording;
mod repair;
mod steering;
mod trap_guard_exe;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};
use laser_driver::DriverError;

fn main() {
    grow_heaps_in_large_steps();
    let matches = cli::Cli::command().get_matches();
    let cli = cli::Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // `laser report saved.json` keeps the saved report's threshold unless one is given.
    let threshold_given = matches
        .subcommand_matches("report")
        .and_then(|m| m.value_source("threshold"))
        == Some(ValueSource::CommandLine);
    monitor::install_signal_handlers();
    let result = match cli.command {
        cli::Command::Run(a) => commands::run(a.0),
        cli::Command::Record(a) => commands::record(a.0),
        cli::Command::Report(a) => commands::report(a.0, threshold_given),
        cli::Command::Attach(a) => commands::attach(a.0),
        cli::Command::Backends => backend::list().map(|()| exit::OK),
        cli::Command::Dump(a) => recording::dump(&a.0.input, a.0.limit).map(|()| exit::OK),
        cli::Command::Repair(a) => repair::run(a.0),
        cli::Command::Diff(a) => diff::run(a.0),
        cli::Command::Import(a) => import::run(a.0),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("laser: error: {}", error_text(&e));
            std::process::exit(error_code(&e));
        }
    }
}

/// Every heap laser's threads allocate from grows 1 MiB at a time (untouched pages cost no
/// memory). By default glibc grows a thread's arena a page per `mprotect` as it fills: the
/// start-up work that parses the decoder tables and ELF images (`analyze::warm_up`, then on a
/// thread of its own) made ~80 such calls, and a trivial `laser run` took 0.3 ms longer
/// (medians of 100 side by side, `benchmarks/RESULTS.md`). One arena for all threads saves
/// as much but would share its lock between the monitor and the SCHED_IDLE DWARF
/// prefetcher, which the program's threads can keep off the CPU while it holds it.
/// (Setting the pad turns off glibc's sliding mmap threshold, so blocks of 128 KiB and more
/// are mapped afresh each time; laser's page faults over a kmeans run were the same with the
/// threshold raised to 32 MiB: 660 and 661.)
fn grow_heaps_in_large_steps() {
    // SAFETY: mallopt only sets a tunable; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_TOP_PAD, 1 << 20);
    }
}

/// The error and its causes joined by ": ", each cause left out when the text so far already
/// says it: several errors print their source in their own message and also hand it on as
/// their source ("… failed: No space left on device (os error 28): No space left on device
/// (os error 28)").
fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if text.contains(&s) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&s);
    }
    text
}

/// Maps a failure to laser's exit codes (see `exit.rs`).
fn error_code(e: &anyhow::Error) -> i32 {
    match e.downcast_ref::<DriverError>() {
        Some(DriverError::ProgramNotFound { .. }) => exit::NOT_FOUND,
        Some(DriverError::Exec { .. }) => exit::CANNOT_EXECUTE,
        _ if e.chain().any(|c| c.to_string() == "monitoring failed") => exit::MONITOR_FAILED,
        _ => exit::FAILED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_text_says_each_cause_once() {
        let io = std::io::Error::from_raw_os_error(libc::ENOSPC);
        let e = anyhow::Error::new(DriverError::Open {
            what: "watchpoint slot 0".into(),
            pid: 7,
            cpu: -1,
            source: io,
        })
        .context("monitoring failed");
        let t = error_text(&e);
        assert_eq!(t.matches("No space left on device").count(), 1, "{t}");
        assert!(
            t.starts_with("monitoring failed: perf_event_open for watchpoint slot 0"),
            "{t}"
        );
    }
}
