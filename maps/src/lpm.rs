//! Longest-prefix-match maps (`BPF_MAP_TYPE_LPM_TRIE`) over the hash map: an entry is
//! stored under its key with the data past the prefix cleared, and a lookup tries the
//! key's own prefix length, then each shorter one, until an entry answers: at most
//! `8 * data bytes + 1` hash probes (33 for IPv4, 129 for IPv6), lock-free as the hash
//! map is. The kernel's trie gives the same answers. `BPF_MAP_GET_NEXT_KEY` walks in the
//! trie's order, as the kernel's does (more specific prefixes before the ones that hold
//! them, the 0 side of a differing bit first), by sorting the keys: a whole walk costs
//! O(n² log n), fine for the few thousand prefixes a tool keeps.
//!
//! A key is `struct bpf_lpm_trie_key`: a host-order `u32` prefix length, then the data,
//! most significant bit first.

use super::{err, hash, Map};
use crate::Result;

/// The key's data bits, and its prefix length if it is one the map can hold.
fn split(map: &Map, key: &[u8]) -> Result<(u32, u32)> {
    let bits = (map.key_size() - 4) * 8;
    let prefix = u32::from_ne_bytes(key[..4].try_into().expect("4-byte prefix length"));
    if prefix > bits {
        return Err(err(libc::EINVAL, "prefix longer than the key's data"));
    }
    Ok((prefix, bits))
}

/// `key` with prefix length `prefix` and every data bit past it cleared.
fn masked(key: &[u8], prefix: u32) -> Vec<u8> {
    let mut k = key.to_vec();
    k[..4].copy_from_slice(&prefix.to_ne_bytes());
    for (i, b) in k[4..].iter_mut().enumerate() {
        let first = i as u32 * 8;
        *b &= match prefix.saturating_sub(first) {
            0 => 0,
            n if n >= 8 => 0xff,
            n => 0xffu8 << (8 - n),
        };
    }
    k
}

/// The longest stored prefix of `key` (up to its own prefix length): the key it is
/// stored under and its value. One buffer serves every length tried: going one bit
/// shorter clears that bit.
fn longest(map: &Map, key: &[u8]) -> Result<Option<(Vec<u8>, *mut u8)>> {
    let (prefix, _) = split(map, key)?;
    let mut k = masked(key, prefix);
    for p in (0..=prefix).rev() {
        if p < prefix {
            k[4 + p as usize / 8] &= !(0x80u8 >> (p % 8));
        }
        k[..4].copy_from_slice(&p.to_ne_bytes());
        // SAFETY: `k` holds key_size bytes.
        let v = unsafe { hash::find_value(map, k.as_ptr()) };
        if !v.is_null() {
            return Ok(Some((k, v)));
        }
    }
    Ok(None)
}

pub(super) fn lookup(map: &Map, key: &[u8], value: &mut [u8]) -> Result<()> {
    match longest(map, key)? {
        Some((k, _)) => hash::lookup(map, &k, value),
        None => Err(err(libc::ENOENT, "no prefix of the key is in the map")),
    }
}

/// The value of the longest stored prefix of `key`, or null.
///
/// # Safety
/// `key` must point to `key_size` readable bytes.
pub(super) unsafe fn prog_lookup(map: &Map, key: *const u8) -> *mut u8 {
    // SAFETY: forwarded caller obligation.
    let key = unsafe { std::slice::from_raw_parts(key, map.key_size() as usize) };
    match longest(map, key) {
        Ok(Some((_, v))) => v,
        _ => std::ptr::null_mut(),
    }
}

pub(super) fn update(
    map: &Map,
    key: &[u8],
    value: *const u8,
    flags: u64,
    syscall: bool,
) -> Result<()> {
    let (prefix, _) = split(map, key)?;
    hash::update(map, &masked(key, prefix), value, flags, syscall)
}

pub(super) fn delete(map: &Map, key: &[u8]) -> Result<()> {
    let (prefix, _) = split(map, key)?;
    hash::delete(map, masked(key, prefix).as_ptr())
}

/// Whether `a` comes before `b` in the kernel's trie walk (post-order): a key after
/// every key its prefix holds, and at the first data bit they differ in (within both
/// prefixes), the one with a 0 there first.
fn walk_order(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    // Keys read back from a damaged store may claim more prefix than they carry data:
    // a prefix counts no further than the key's own bits.
    let len = |k: &[u8]| {
        let prefix = u32::from_ne_bytes(k[..4].try_into().expect("4-byte prefix length"));
        prefix.min((k.len().saturating_sub(4) * 8) as u32)
    };
    let (la, lb) = (len(a), len(b));
    let bit = |k: &[u8], i: u32| (k[4 + i as usize / 8] >> (7 - i % 8)) & 1;
    for i in 0..la.min(lb) {
        match (bit(a, i), bit(b, i)) {
            (0, 1) => return Ordering::Less,
            (1, 0) => return Ordering::Greater,
            _ => {}
        }
    }
    // One holds the other (or they are equal): the longer, more specific, first.
    lb.cmp(&la)
}

/// `BPF_MAP_GET_NEXT_KEY` in the trie's order; a missing or invalid key gives the first.
pub(super) fn next_key(map: &Map, key: Option<&[u8]>, out: &mut [u8]) -> Result<()> {
    let mut keys = hash::keys(map);
    keys.sort_by(|a, b| walk_order(a, b));
    let after = key
        .filter(|k| split(map, k).is_ok())
        .map(|k| {
            let (prefix, _) = split(map, k).expect("checked");
            masked(k, prefix)
        })
        .and_then(|k| keys.iter().position(|x| *x == k));
    let next = match after {
        Some(i) => keys.get(i + 1),
        None => keys.first(),
    };
    let Some(next) = next else {
        return Err(err(libc::ENOENT, "no more keys"));
    };
    out.copy_from_slice(next);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::masked;

    #[test]
    fn keys_claiming_more_prefix_than_they_carry_are_ordered_not_a_panic() {
        // Found by the store_files fuzzer: a damaged LPM map's stored key said 0x2500
        // bits of prefix over 4 bytes of data.
        let mut long = 0x2500u32.to_ne_bytes().to_vec();
        long.extend_from_slice(&[0xff, 0, 0, 0]);
        let mut short = 8u32.to_ne_bytes().to_vec();
        short.extend_from_slice(&[0xff, 0, 0, 0]);
        assert_eq!(super::walk_order(&long, &short), std::cmp::Ordering::Less);
        assert_eq!(
            super::walk_order(&short, &long),
            std::cmp::Ordering::Greater
        );
        let mut other = 0x2500u32.to_ne_bytes().to_vec();
        other.extend_from_slice(&[0x7f, 0, 0, 0]);
        assert_eq!(super::walk_order(&other, &long), std::cmp::Ordering::Less);
        assert_eq!(super::walk_order(&long, &long), std::cmp::Ordering::Equal);
        let lone = 64u32.to_ne_bytes().to_vec();
        assert_eq!(super::walk_order(&lone, &lone), std::cmp::Ordering::Equal);
    }

    #[test]
    fn data_past_the_prefix_is_cleared_most_significant_bit_first() {
        let key = |p: u32, d: [u8; 4]| [p.to_ne_bytes().as_slice(), &d].concat();
        assert_eq!(masked(&key(32, [10, 1, 2, 3]), 24), key(24, [10, 1, 2, 0]));
        assert_eq!(
            masked(&key(32, [10, 0xff, 2, 3]), 12),
            key(12, [10, 0xf0, 0, 0])
        );
        assert_eq!(masked(&key(8, [192, 168, 0, 1]), 0), key(0, [0, 0, 0, 0]));
        assert_eq!(masked(&key(0, [1, 2, 3, 4]), 32), key(32, [1, 2, 3, 4]));
    }
}

#[cfg(test)]
mod walk_tests {
    use super::walk_order;

    fn key(prefix: u32, ip: [u8; 4]) -> Vec<u8> {
        [prefix.to_ne_bytes().to_vec(), ip.to_vec()].concat()
    }

    #[test]
    fn walks_as_the_kernels_trie_does() {
        // The kernel's own example (lpm_trie.c): /24s in address order, then the /16.
        let mut keys = vec![
            key(16, [192, 168, 0, 0]),
            key(24, [192, 168, 128, 0]),
            key(24, [192, 168, 1, 0]),
            key(24, [192, 168, 0, 0]),
            key(0, [0, 0, 0, 0]),
        ];
        keys.sort_by(|a, b| walk_order(a, b));
        assert_eq!(
            keys,
            vec![
                key(24, [192, 168, 0, 0]),
                key(24, [192, 168, 1, 0]),
                key(24, [192, 168, 128, 0]),
                key(16, [192, 168, 0, 0]),
                key(0, [0, 0, 0, 0]),
            ]
        );
    }
}
