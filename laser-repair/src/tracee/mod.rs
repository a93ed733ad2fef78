//! `tracee`: the only ptrace code in laser. It puts a repair built by `plan` into a running
//! process and takes it out again.
//!
//! Every change to the target is undone if a later step fails (see `txn`), threads are seized
//! and released by a guard (`threads::ThreadLock`), and syscalls run inside the target restore
//! the thread's registers, including an interrupted syscall's restart state (see `remote`).
//!
//! Entry points: [`apply`] with a [`RepairSource`], [`AppliedRepair::undo`], [`undo`] for
//! `laser repair -p PID --undo` from a later invocation, [`find_repairs`] to list what is in
//! force. Parsers and decisions (`maps`, `record`, `patch`) are pure and tested on bytes.
//!
//! ```no_run
//! use laser_repair::tracee::{self, ApplyOptions, FnSource, CacheSizes, PatchSet, UndoOptions};
//! # fn plan_bytes(_: &tracee::CacheAddrs) -> Result<PatchSet, String> { unimplemented!() }
//! # fn main() -> Result<(), tracee::TraceeError> {
//! let pid = 1234;
//! // The plan knows the function span and a size bound; it emits bytes once the cache is placed.
//! let src = FnSource {
//!     span: 0x401000..0x401200,
//!     sizes: CacheSizes { code: 4096, data: 4096, record: 0 },
//!     build: plan_bytes,
//! };
//! let applied = tracee::apply(pid, &src, &ApplyOptions::default())?;
//! eprintln!("target paused {:?}", applied.pause.paused);
//! // Later, from this or another laser process (`laser repair -p PID --undo`):
//! for r in tracee::undo(pid, &UndoOptions::default())? {
//!     eprintln!("undid cache {:#x}: {} patches", r.map_base, r.restored_patches);
//! }
//! # Ok(()) }
//! ```
//!
//! The pause (`PauseStats::paused`) runs from the first `PTRACE_INTERRUPT` to the last
//! `PTRACE_DETACH` and includes `RepairSource::materialize`: a plan should do its heavy work
//! before `apply` and only resolve addresses there.

pub mod apply;
pub mod error;
pub mod maps;
pub mod mem;
pub mod patch;
pub mod record;
pub mod remote;
pub mod sys;
pub mod threads;
mod txn;
pub mod undo;

pub use apply::{
    apply, AppliedRepair, ApplyOptions, FailPoint, FnSource, PauseStats, RepairSource,
};
pub use error::TraceeError;
pub use mem::ProcMem;
pub use patch::{CacheAddrs, CacheSizes, Move, Patch, PatchSet};
pub use record::{RecordState, RepairRecord};
pub use threads::{HoldPhases, LockStats, RealTime, StopKind, ThreadLock};
pub use undo::{find_repairs, undo, undo_one, UndoOptions, UndoReport};
