//! Unit tests of the chunk walker on synthetic heap images built here.

use super::*;

/// Builds a heap image: chunks back to back, `(size, prev_inuse)` each; the size field gets
/// PREV_INUSE when the flag says the previous chunk is in use, plus `extra` flag bits.
fn image(chunks: &[(u64, bool)], extra: u64) -> Vec<u8> {
    let mut b = Vec::new();
    for &(size, prev_inuse) in chunks {
        let at = b.len();
        b.resize(at + size as usize, 0xaa);
        b[at..at + 8].copy_from_slice(&0u64.to_le_bytes());
        let field = size | extra | u64::from(prev_inuse);
        b[at + 8..at + 16].copy_from_slice(&field.to_le_bytes());
    }
    b
}

fn maps(lines: &[(u64, u64, &str)]) -> Vec<Region> {
    let text: String = lines
        .iter()
        .map(|(s, e, p)| format!("{s:x}-{e:x} rw-p 00000000 00:00 0 {p}\n"))
        .collect();
    crate::decode::maps::parse(&text)
}

const BASE: u64 = 0x5555_5555_9000;

#[test]
fn main_arena_block_sizes_states_and_offsets() {
    //   0x000 tcache 0x290 | 0x290 A 0x20 | 0x2b0 B 0x20 (freed to a bin) | 0x2d0 C 0x30
    //   0x300 top
    // B free: C's PREV_INUSE clear, B looks free; A in use (B's PREV_INUSE set).
    let bytes = image(
        &[
            (0x290, true),
            (0x20, true),
            (0x20, true),
            (0x30, false),
            (0x1000 - 0x300, true),
        ],
        0,
    );
    let r = maps(&[(BASE, BASE + 0x1000, "[heap]")]);
    let mut mem = Image {
        base: BASE,
        bytes: &bytes,
    };
    // Line 0x280..0x2c0: the tail of the tcache struct, A, and B's header (not a block).
    let got = blocks_on_line(&r, &mut mem, BASE + 0x280, 64, 1 << 20).unwrap();
    let summary: Vec<(u64, u64, BlockState)> = got
        .iter()
        .map(|b| (b.user - BASE, b.usable, b.state))
        .collect();
    assert_eq!(
        summary,
        [
            (0x10, 0x288, BlockState::InUse),
            (0x2a0, 0x18, BlockState::InUse)
        ]
    );
    assert!(got.iter().all(|b| b.arena == ArenaKind::Main));
    assert!(got[1].contains(BASE + 0x2a0) && !got[1].contains(BASE + 0x2b8));
    // Line 0x2c0..0x300: B (free) and C; the top chunk's user part starts after it.
    let got = blocks_on_line(&r, &mut mem, BASE + 0x2c0, 64, 1 << 20).unwrap();
    let states: Vec<BlockState> = got.iter().map(|b| b.state).collect();
    assert_eq!(states, [BlockState::Free, BlockState::InUse]);
    let got = blocks_on_line(&r, &mut mem, BASE + 0x300, 64, 1 << 20).unwrap();
    assert_eq!(got.last().map(|b| b.state), Some(BlockState::Top));
    assert_eq!(got[0].usable, 0x28, "C owns the top chunk's prev_size");
}

#[test]
fn implausible_chunks_are_typed_errors_not_panics() {
    let r = maps(&[(BASE, BASE + 0x1000, "[heap]")]);
    // A size that is not a multiple of 16.
    let mut bytes = image(&[(0x40, true), (0x1000 - 0x40, true)], 0);
    bytes[0x48..0x50].copy_from_slice(&0x58u64.to_le_bytes());
    let mut mem = Image {
        base: BASE,
        bytes: &bytes,
    };
    let err = blocks_on_line(&r, &mut mem, BASE + 0x80, 64, 1 << 20).unwrap_err();
    assert_eq!(
        err,
        HeapError::BadSize {
            chunk: BASE + 0x40,
            size: 0x58
        }
    );
    assert!(err.to_string().contains("0x58"), "{err}");
    // Zero size (would loop forever if accepted).
    bytes[0x48..0x50].copy_from_slice(&0u64.to_le_bytes());
    let mut mem = Image {
        base: BASE,
        bytes: &bytes,
    };
    assert!(matches!(
        blocks_on_line(&r, &mut mem, BASE + 0x80, 64, 1 << 20),
        Err(HeapError::BadSize { .. })
    ));
    // Past the end of the mapping.
    bytes[0x48..0x50].copy_from_slice(&0x2001u64.to_le_bytes());
    let mut mem = Image {
        base: BASE,
        bytes: &bytes,
    };
    assert!(matches!(
        blocks_on_line(&r, &mut mem, BASE + 0x80, 64, 1 << 20),
        Err(HeapError::PastEnd { end, .. }) if end == BASE + 0x1000
    ));
    // The image is shorter than the mapping: unreadable, not a panic.
    let short = image(&[(0x40, true)], 0);
    let mut mem = Image {
        base: BASE,
        bytes: &short,
    };
    assert!(matches!(
        blocks_on_line(&r, &mut mem, BASE + 0x80, 64, 1 << 20),
        Err(HeapError::Unreadable { .. })
    ));
    // Not heap memory at all.
    assert_eq!(
        blocks_on_line(&r, &mut mem, 0x1000, 64, 1 << 20),
        Err(HeapError::NotHeap { addr: 0x1000 })
    );
}

#[test]
fn random_images_never_panic_or_hang() {
    let r = maps(&[
        (BASE, BASE + 0x2000, "[heap]"),
        (0x7f00_0000_0000, 0x7f00_0000_2000, ""),
    ]);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..300 {
        let mut bytes = vec![0u8; 0x2000];
        for (i, b) in bytes.iter_mut().enumerate() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Small numbers often, so some sizes pass the checks.
            *b = if i % 8 < 2 {
                x as u8
            } else if round % 2 == 0 {
                0
            } else {
                x as u8
            };
        }
        for base in [BASE, 0x7f00_0000_0000] {
            let mut mem = Image {
                base,
                bytes: &bytes,
            };
            for line in (base..base + 0x2000).step_by(0x3c0) {
                let _ = blocks_on_line(&r, &mut mem, line & !63, 64, 1 << 20);
            }
        }
    }
}

#[test]
fn mmapped_blocks_even_when_the_kernel_merged_their_mappings() {
    let start = 0x7f12_3400_0000u64;
    // Two mmapped chunks of 0x21000 and 0x22000 bytes, one VMA.
    let bytes = image(&[(0x21000, false), (0x22000, false)], IS_MMAPPED);
    let end = start + bytes.len() as u64;
    let r = maps(&[(start, end, "")]);
    let mut mem = Image {
        base: start,
        bytes: &bytes,
    };
    let got = blocks_on_line(&r, &mut mem, start, 64, 1 << 20).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].user, got[0].usable, got[0].state, got[0].arena),
        (
            start + 16,
            0x21000 - 16,
            BlockState::Mmapped,
            ArenaKind::Mmapped
        )
    );
    let got = blocks_on_line(&r, &mut mem, start + 0x21040, 64, 1 << 20).unwrap();
    assert_eq!(
        (got[0].chunk, got[0].usable),
        (start + 0x21000, 0x22000 - 16)
    );
    // An anonymous mapping that starts with something else is not guessed at.
    let other = vec![0x11u8; 0x1000];
    let r = maps(&[(start, start + 0x1000, "")]);
    let mut mem = Image {
        base: start,
        bytes: &other,
    };
    assert_eq!(
        blocks_on_line(&r, &mut mem, start + 0x40, 64, 1 << 20),
        Err(HeapError::NotMalloc { start })
    );
}

/// A thread heap: heap_info (48 bytes, glibc ≥ 2.35) + malloc_state (2,200 bytes, full of
/// pointers into itself and zeros), first chunk at 0x8d0, then chunks up to `size`.
fn thread_heap(start: u64, first: u64, chunks: &[(u64, bool)]) -> Vec<u8> {
    let body = image(chunks, NON_MAIN_ARENA);
    let size = first + body.len() as u64;
    let mut b = vec![0u8; first as usize];
    b[0..8].copy_from_slice(&(start + 0x30).to_le_bytes()); // ar_ptr
    b[16..24].copy_from_slice(&size.to_le_bytes()); // size
    b[24..32].copy_from_slice(&size.to_le_bytes()); // mprotect_size
                                                    // Bins point at themselves (empty), as in a fresh malloc_state.
    let mut off = 0x30 + 0x70;
    while off + 8 <= first as usize - 0x40 {
        b[off..off + 8].copy_from_slice(&(start + off as u64 - 16).to_le_bytes());
        off += 8;
    }
    b.extend_from_slice(&body);
    b
}

#[test]
fn thread_heap_first_chunk_found_by_chain_validation() {
    let start = 0x7ff0_0000_0000u64; // 64 MiB aligned
    for first in [0x8d0u64, 0x8c0] {
        let chunks = [
            (0x290, true),
            (0x30, true),
            (0x30, true),
            (0x4000 - first - 0x2f0, true),
        ];
        let bytes = thread_heap(start, first, &chunks);
        let r = maps(&[(start, start + 0x21000, "")]);
        let mut mem = Image {
            base: start,
            bytes: &bytes,
        };
        let a = arena_for(&r, start + first + 0x2a0, &mut mem).unwrap();
        assert_eq!(
            (a.kind, a.first_chunk, a.end),
            (ArenaKind::Thread, start + first, start + 0x4000)
        );
        let line = (start + first + 0x290 + 0x10) & !63;
        let got = blocks_on_line(&r, &mut mem, line, 64, 1 << 20).unwrap();
        let a_user = start + first + 0x2a0;
        let b = got.iter().find(|b| b.user == a_user).expect("block A");
        assert_eq!((b.usable, b.arena), (0x28, ArenaKind::Thread));
    }
}

#[test]
fn thread_heap_fencepost_ends_the_chain() {
    let start = 0x7ff0_0000_0000u64;
    let mut bytes = thread_heap(start, 0x8d0, &[(0x290, true), (0x40, true)]);
    // Fencepost (size 16 | P) and its zero-size follower, as sysmalloc leaves an old heap.
    bytes.extend_from_slice(&0u64.to_le_bytes());
    bytes.extend_from_slice(&(16u64 | 1).to_le_bytes());
    bytes.extend_from_slice(&0u64.to_le_bytes());
    bytes.extend_from_slice(&1u64.to_le_bytes());
    let size = bytes.len() as u64;
    bytes[16..24].copy_from_slice(&size.to_le_bytes());
    let r = maps(&[(start, start + 0x4000, "")]);
    let mut mem = Image {
        base: start,
        bytes: &bytes,
    };
    let last = start + 0x8d0 + 0x290;
    let line = (last + 0x40) & !63; // holds the last chunk's tail and the fencepost
    let got = blocks_on_line(&r, &mut mem, line, 64, 1 << 20).unwrap();
    assert_eq!(got.len(), 1, "{got:x?}");
    assert_eq!((got[0].chunk, got[0].usable), (last, 0x38));
    assert!(matches!(
        blocks_on_line(&r, &mut mem, line + 64, 64, 1 << 20),
        Err(HeapError::EndedBefore { .. })
    ));
}

#[test]
fn a_walk_resumes_across_small_budgets() {
    let mut chunks = vec![(0x20u64, true); 0x800];
    chunks.push((0x1000, true));
    let bytes = image(&chunks, 0);
    let r = maps(&[(BASE, BASE + bytes.len() as u64, "[heap]")]);
    let mut mem = Image {
        base: BASE,
        bytes: &bytes,
    };
    let line = BASE + 0xf000;
    let arena = arena_for(&r, line, &mut mem).unwrap();
    let mut walk = Walk::new(arena, line, 64);
    let mut calls = 0;
    let blocks = loop {
        calls += 1;
        let mut budget = 0x1000;
        match walk.step(&mut mem, &mut budget).unwrap() {
            Step::Done(b) => break b,
            Step::Pending => assert!(calls < 100, "no progress"),
        }
    };
    assert!(calls >= 15, "{calls} calls for 60 KiB at 4 KiB each");
    let users: Vec<i64> = blocks.iter().map(|b| b.user as i64 - line as i64).collect();
    assert_eq!(users, [-0x10, 0x10, 0x30]);
    // One call with too small a budget for the whole walk: a clear error.
    assert!(matches!(
        blocks_on_line(&r, &mut mem, line, 64, 0x1000),
        Err(HeapError::TooFar { .. })
    ));
}

/// A [`Memory`] that counts the bytes asked of it.
struct Counting<'a>(Image<'a>, u64);

impl Memory for Counting<'_> {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> usize {
        self.1 += buf.len() as u64;
        self.0.read(addr, buf)
    }
}

#[test]
fn large_chunks_are_stepped_over_without_reading_them() {
    // 40 chunks of 1 MiB (a program's arrays), a few small ones, and the line after them.
    let mut chunks = vec![(0x10_0000u64, true); 40];
    chunks.extend([(0x20, true); 64]);
    chunks.push((0x1000, true));
    let bytes = image(&chunks, 0);
    let r = maps(&[(BASE, BASE + bytes.len() as u64, "[heap]")]);
    let line = BASE + 40 * 0x10_0000 + 0x400;
    let mut mem = Counting(
        Image {
            base: BASE,
            bytes: &bytes,
        },
        0,
    );
    let got = blocks_on_line(&r, &mut mem, line, 64, 64 << 20).unwrap();
    let users: Vec<i64> = got.iter().map(|b| b.user as i64 - line as i64).collect();
    assert_eq!(users, [-0x10, 0x10, 0x30]);
    // 64 KiB per chunk would be 2.6 MB; the reads shrink to a few hundred bytes per chunk.
    assert!(mem.1 < 200 << 10, "{} bytes read", mem.1);
}
