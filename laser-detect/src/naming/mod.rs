//! Stage 3: names for what the model found. Source lines and inlined frames, the program's own
//! frame, global and heap data with their DWARF types and fields, and library call sites.

pub mod access_type;
pub mod alloc_history;
pub mod alloc_record;
pub mod alloc_site;
pub mod call_sites;
pub mod dataname;
pub mod debug_module;
pub(crate) mod dwarf_types;
pub mod heap_blocks;
pub mod heap_names;
pub mod own_frame;
pub mod prefetch;
pub(crate) mod reg_track;
pub(crate) mod scope_vars;
pub mod symbolize;
pub(crate) mod unit_lines;
