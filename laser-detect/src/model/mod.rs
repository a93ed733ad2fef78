//! Stage 2: accesses to contention. The LASER per-line model, the detector's rates and
//! ranking, where to point the debug registers, and the rates watch windows prove.

pub mod armed_cost;
pub mod candidates;
pub mod concurrency;
pub mod detector;
pub mod estimate;
pub mod findings;
pub mod line_kind;
pub mod line_model;
pub mod line_table;
pub mod migratory;
pub mod neighbours;
pub mod recent;
pub mod survey;
