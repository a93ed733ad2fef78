//! laser-repair: `plan` (pure code rewriting) and `tracee` (the only ptrace code).

pub mod plan;
pub mod tracee;
