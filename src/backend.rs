//! `--backend` resolution and the `laser backends` command.

use anyhow::Result;
use laser_driver::probe::{self, Facts, Request};
use laser_driver::BackendKind;

use crate::cli::BackendArg;

pub fn request(arg: BackendArg) -> Request {
    match arg {
        BackendArg::Auto => Request::Auto,
        BackendArg::Pebs => Request::Backend(BackendKind::Pebs),
        BackendArg::Ibs => Request::Backend(BackendKind::Ibs),
        BackendArg::Soft => Request::Backend(BackendKind::Soft),
    }
}

/// Resolves the backend and says which one and why (on stderr, so reports stay clean).
pub fn choose(arg: BackendArg) -> Result<BackendKind> {
    let choice = probe::probe(request(arg))?;
    eprintln!("laser: backend {}: {}", choice.backend, choice.reason);
    Ok(choice.backend)
}

/// `laser backends`: every backend, whether it works here, and why.
pub fn list() -> Result<()> {
    let facts = Facts::gather();
    for b in BackendKind::ALL {
        match probe::decide(&facts, Request::Backend(b)) {
            Ok(c) => println!("{:<6} available    {}", b, c.reason),
            Err(e) => println!("{:<6} unavailable  {}", b, e),
        }
    }
    let auto = probe::decide(&facts, Request::Auto)?;
    println!("auto   → {} ({})", auto.backend, auto.reason);
    Ok(())
}
