//! Shared helpers for laser's benchmark binaries.
