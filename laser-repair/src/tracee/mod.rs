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
pub use threads::{LockStats, StopKind, ThreadLock};
pub use undo::{find_repairs, undo, undo_one, UndoOptions, UndoReport};
