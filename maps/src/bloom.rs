//! Bloom filters: a value goes in by push and is tested by peek, which says "maybe
//! there" (0) or "surely not" (-ENOENT), as the kernel's `BPF_MAP_TYPE_BLOOM_FILTER`
//! does. The bits are shared memory words set with atomic ORs, so programs in several
//! processes and the tool push and test at once without a lock.
//!
//! Sizing follows the kernel's: `max_entries * hashes / ln 2` bits rounded up to a power
//! of two (at least 64), `hashes` from the low 4 bits of `map_extra` (5 when 0). The
//! hash functions are jhash over the value with seeds 0, 1, ..: which values collide
//! differs from the kernel's (its seed is random), never whether a pushed value is found.

use super::stack_trace::jhash2;
use super::{err, Map};
use crate::Result;
use bpftime_isa::uapi::update_flags;
use std::sync::atomic::{AtomicU64, Ordering};

/// Hash functions when `map_extra` asks for none.
const DEFAULT_HASHES: u32 = 5;

/// The number of hash functions and the bits of a filter for `max_entries` values.
pub(super) fn shape(max_entries: u32, map_extra: u64) -> Result<(u32, u64)> {
    if map_extra & !0xf != 0 {
        return Err(err(
            libc::EINVAL,
            "a bloom filter's map_extra holds only the number of hash functions (1-15)",
        ));
    }
    let hashes = match (map_extra & 0xf) as u32 {
        0 => DEFAULT_HASHES,
        n => n,
    };
    // n * k / ln 2 bits, as the kernel sizes them (7/5 approximates 1 / ln 2).
    let want = u64::from(max_entries) * u64::from(hashes) * 7 / 5;
    let bits = want
        .max(64)
        .checked_next_power_of_two()
        .filter(|&b| b <= 1 << 35)
        .ok_or_else(|| err(libc::E2BIG, "bloom filter too large"))?;
    Ok((hashes, bits))
}

/// The bytes a filter's bits take.
pub(super) fn bytes(bits: u64) -> usize {
    (bits / 8) as usize
}

fn words(map: &Map, bits: u64) -> &[AtomicU64] {
    // SAFETY: the data area holds the filter's bits (`bytes(bits)`, made at creation
    // from the same shape) as 8-byte aligned words of shared memory, only ever touched
    // atomically.
    unsafe { std::slice::from_raw_parts(map.data().cast::<AtomicU64>(), (bits / 64) as usize) }
}

/// Calls `f` with the filter's bits and each bit position of `value` (its bytes hashed
/// as 32-bit words, zero-padded; on the stack for values up to 256 bytes, as a
/// program's push or peek runs at every hit).
fn for_each_position(map: &Map, value: &[u8], mut f: impl FnMut(u64, u64) -> bool) -> bool {
    let n = value.len().div_ceil(4).max(1);
    let mut small = [0u32; 64];
    let mut large = Vec::new();
    let words: &mut [u32] = if n <= small.len() {
        &mut small[..n]
    } else {
        large.resize(n, 0);
        &mut large
    };
    for (w, c) in words.iter_mut().zip(value.chunks(4)) {
        let mut b = [0u8; 4];
        b[..c.len()].copy_from_slice(c);
        *w = u32::from_ne_bytes(b);
    }
    // The shape was checked at creation.
    let (hashes, bits) = shape(map.max_entries(), map.map_extra()).unwrap_or((DEFAULT_HASHES, 64));
    (0..hashes).all(|seed| f(bits, u64::from(jhash2(words, seed)) & (bits - 1)))
}

/// Push: `BPF_ANY` only, as the kernel takes.
pub(super) fn push(map: &Map, value: &[u8], flags: u64) -> Result<()> {
    if flags != update_flags::ANY {
        return Err(err(libc::EINVAL, "bloom filters take BPF_ANY"));
    }
    for_each_position(map, value, |bits, p| {
        words(map, bits)[(p / 64) as usize].fetch_or(1 << (p % 64), Ordering::AcqRel);
        true
    });
    Ok(())
}

/// Peek: Ok when `value` may be in the filter, ENOENT when it is not.
pub(super) fn peek(map: &Map, value: &[u8]) -> Result<()> {
    let all = for_each_position(map, value, |bits, p| {
        words(map, bits)[(p / 64) as usize].load(Ordering::Acquire) & (1 << (p % 64)) != 0
    });
    if all {
        Ok(())
    } else {
        Err(err(libc::ENOENT, "not in the bloom filter"))
    }
}
