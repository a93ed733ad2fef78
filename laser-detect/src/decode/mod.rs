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

/// Builds the instruction decoder's tables (iced-x86 deserializes them at its first decode:
/// ≈ 0.9 ms here), so that a caller can pay for them where it suits it: `laser run` does on
/// another CPU while it starts the program.
pub fn warm_up() {
    let mut d = iced_x86::Decoder::with_ip(
        64,
        &[0x48, 0x8b, 0x07],
        0x1000,
        iced_x86::DecoderOptions::NONE,
    );
    std::hint::black_box(d.decode());
}
