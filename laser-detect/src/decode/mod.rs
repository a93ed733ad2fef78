//! Stage 1: from raw samples and watch hits to exact memory accesses. Which addresses belong
//! to the target, what each instruction does to memory, and which bytes an access touched.

pub mod access;
pub mod classify;
pub mod code;
pub mod effaddr;
pub mod frame_slots;
pub mod maps;
pub mod pccache;
pub mod skid;
pub mod store_pair;
