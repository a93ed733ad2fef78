//! `laser`: find and repair cache-line contention in multithreaded x86-64 Linux programs.

mod cli;

use clap::Parser;

fn main() {
    let cli = cli::Cli::parse();
    eprintln!("laser: {:?} is not implemented yet", cli.command);
    std::process::exit(1);
}
