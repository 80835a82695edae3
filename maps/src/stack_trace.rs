//! Stack trace maps (`BPF_MAP_TYPE_STACK_TRACE`): `bpf_get_stackid` files a
//! call chain under an id derived from a hash of its frames, and user space
//! reads the frames back by that id.
//!
//! The data area is `nbuckets` (max_entries rounded up to a power of two)
//! slots of a [`Slot`] header followed by `value_size` bytes of frames. As in
//! the kernel, at most `max_entries` slots hold a trace at once: a new trace
//! needs a free element before the one it replaces is released, so a full map
//! answers `ENOMEM` even when the new trace would replace an old one.
//!
//! Every access takes the map lock: traces are filed from probes and read by
//! tools, neither on a path where a lock-free scheme would pay off.

use super::{err, Map};
use crate::Result;
use std::sync::atomic::{AtomicU32, Ordering};

/// `BPF_F_SKIP_FIELD_MASK`: how many leading frames to drop.
pub const SKIP_FIELD_MASK: u64 = 0xff;
/// `BPF_F_USER_STACK`: the user-space stack rather than the kernel's.
pub const USER_STACK: u64 = 1 << 8;
/// `BPF_F_FAST_STACK_CMP`: an equal hash is taken as an equal trace.
pub const FAST_STACK_CMP: u64 = 1 << 9;
/// `BPF_F_REUSE_STACKID`: a different trace with the same id replaces the old one.
pub const REUSE_STACKID: u64 = 1 << 10;
/// `BPF_F_USER_BUILD_ID` of `bpf_get_stack`.
pub const USER_BUILD_ID: u64 = 1 << 11;

/// The deepest stack the kernel records by default (`kernel.perf_event_max_stack`).
pub const MAX_STACK_DEPTH: u32 = 127;

/// A bucket's header. Every access holds the map lock; the fields are
/// atomics only because the slot lives in memory other processes share.
#[repr(C)]
struct Slot {
    used: AtomicU32,
    hash: AtomicU32,
    nr: AtomicU32,
    _pad: u32,
}

impl Slot {
    fn used(&self) -> bool {
        self.used.load(Ordering::Relaxed) != 0
    }
    fn nr(&self) -> usize {
        self.nr.load(Ordering::Relaxed) as usize
    }
}

const SLOT_HEADER: usize = std::mem::size_of::<Slot>();

pub(super) fn slot_size(value_size: u32) -> usize {
    SLOT_HEADER + value_size as usize
}

/// Number of buckets for `max_entries` (0 when too large).
pub(super) fn buckets_for(max_entries: u32) -> u32 {
    max_entries.checked_next_power_of_two().unwrap_or(0)
}

/// Whether stack `id` (below the map's bucket count) holds a trace.
pub(super) fn is_used(map: &Map, id: u32) -> bool {
    slot(map, id).used()
}

fn slot_ptr(map: &Map, id: u32) -> *mut u8 {
    // SAFETY: callers check id < nbuckets; the data area holds nbuckets slots.
    unsafe { map.data().add(id as usize * slot_size(map.value_size())) }
}

fn slot(map: &Map, id: u32) -> &Slot {
    // SAFETY: slot_ptr is 8-byte aligned (slot sizes are multiples of 8) and
    // points at a slot header.
    unsafe { &*(slot_ptr(map, id) as *const Slot) }
}

fn frames_ptr(map: &Map, id: u32) -> *mut u64 {
    // SAFETY: the frames follow the slot header.
    unsafe { slot_ptr(map, id).add(SLOT_HEADER).cast() }
}

fn key_id(map: &Map, key: &[u8]) -> Result<u32> {
    map.check_key(key)?;
    Ok(u32::from_ne_bytes([key[0], key[1], key[2], key[3]]))
}

/// `BPF_MAP_LOOKUP_ELEM`: the frames, zero-filled past the trace's end.
pub(super) fn lookup(map: &Map, key: &[u8], value: &mut [u8]) -> Result<()> {
    extract(map, key, value, false)
}

/// `BPF_MAP_LOOKUP_AND_DELETE_ELEM`: the frames, and the id freed.
pub(super) fn lookup_and_delete(map: &Map, key: &[u8], value: &mut [u8]) -> Result<()> {
    extract(map, key, value, true)
}

fn extract(map: &Map, key: &[u8], value: &mut [u8], delete: bool) -> Result<()> {
    let id = key_id(map, key)?;
    if value.len() != map.value_size() as usize {
        return Err(err(libc::EINVAL, "value size mismatch"));
    }
    let h = map.header();
    if id >= map.fixed.nbuckets {
        return Err(err(libc::ENOENT, "no stack with this id"));
    }
    let _g = map.lock(|| {})?;
    let s = slot(map, id);
    if !s.used() {
        return Err(err(libc::ENOENT, "no stack with this id"));
    }
    let len = s.nr().saturating_mul(8);
    if len > value.len() {
        return Err(map.garbage("a stack trace holds more frames than its slot"));
    }
    // SAFETY: the slot holds value_size bytes of frames; len <= value_size.
    unsafe {
        std::ptr::copy_nonoverlapping(frames_ptr(map, id).cast::<u8>(), value.as_mut_ptr(), len)
    };
    value[len..].fill(0);
    if delete {
        s.used.store(0, Ordering::Relaxed);
        h.count.fetch_sub(1, Ordering::Relaxed);
    }
    Ok(())
}

/// `BPF_MAP_DELETE_ELEM`.
pub(super) fn delete(map: &Map, key: &[u8]) -> Result<()> {
    let id = key_id(map, key)?;
    let h = map.header();
    if id >= map.fixed.nbuckets {
        return Err(err(libc::E2BIG, "stack id beyond the map's buckets"));
    }
    let _g = map.lock(|| {})?;
    let s = slot(map, id);
    if !s.used() {
        return Err(err(libc::ENOENT, "no stack with this id"));
    }
    s.used.store(0, Ordering::Relaxed);
    h.count.fetch_sub(1, Ordering::Relaxed);
    Ok(())
}

/// `BPF_MAP_GET_NEXT_KEY`: ids of filed traces in increasing order; an
/// unknown or empty id starts over.
pub(super) fn next_key(map: &Map, key: Option<&[u8]>, out: &mut [u8]) -> Result<()> {
    let _g = map.lock(|| {})?;
    let mut id = match key {
        None => 0,
        Some(k) => {
            let k = key_id(map, k)?;
            if k >= map.fixed.nbuckets || !slot(map, k).used() {
                0
            } else {
                k + 1
            }
        }
    };
    while id < map.fixed.nbuckets && !slot(map, id).used() {
        id += 1;
    }
    if id >= map.fixed.nbuckets {
        return Err(err(libc::ENOENT, "last stack"));
    }
    out.copy_from_slice(&id.to_ne_bytes());
    Ok(())
}

/// The kernel's `jhash2` (Bob Jenkins' lookup3 over 32-bit words), so that a
/// trace gets the same id here as on the kernel.
pub fn jhash2(words: &[u32], initval: u32) -> u32 {
    fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
        *a = a.wrapping_sub(*c) ^ c.rotate_left(4);
        *c = c.wrapping_add(*b);
        *b = b.wrapping_sub(*a) ^ a.rotate_left(6);
        *a = a.wrapping_add(*c);
        *c = c.wrapping_sub(*b) ^ b.rotate_left(8);
        *b = b.wrapping_add(*a);
        *a = a.wrapping_sub(*c) ^ c.rotate_left(16);
        *c = c.wrapping_add(*b);
        *b = b.wrapping_sub(*a) ^ a.rotate_left(19);
        *a = a.wrapping_add(*c);
        *c = c.wrapping_sub(*b) ^ b.rotate_left(4);
        *b = b.wrapping_add(*a);
    }
    fn last(a: &mut u32, b: &mut u32, c: &mut u32) {
        *c = (*c ^ *b).wrapping_sub(b.rotate_left(14));
        *a = (*a ^ *c).wrapping_sub(c.rotate_left(11));
        *b = (*b ^ *a).wrapping_sub(a.rotate_left(25));
        *c = (*c ^ *b).wrapping_sub(b.rotate_left(16));
        *a = (*a ^ *c).wrapping_sub(c.rotate_left(4));
        *b = (*b ^ *a).wrapping_sub(a.rotate_left(14));
        *c = (*c ^ *b).wrapping_sub(b.rotate_left(24));
    }
    let init = 0xdead_beefu32
        .wrapping_add((words.len() as u32) << 2)
        .wrapping_add(initval);
    let (mut a, mut b, mut c) = (init, init, init);
    let mut rest = words;
    while rest.len() > 3 {
        a = a.wrapping_add(rest[0]);
        b = b.wrapping_add(rest[1]);
        c = c.wrapping_add(rest[2]);
        mix(&mut a, &mut b, &mut c);
        rest = &rest[3..];
    }
    if rest.is_empty() {
        return c;
    }
    if rest.len() == 3 {
        c = c.wrapping_add(rest[2]);
    }
    if rest.len() >= 2 {
        b = b.wrapping_add(rest[1]);
    }
    a = a.wrapping_add(rest[0]);
    last(&mut a, &mut b, &mut c);
    c
}

/// Files `ips` (already stripped of skipped frames) as `bpf_get_stackid` does;
/// returns the id or a negative errno.
pub(super) fn file_trace(map: &Map, ips: &[u64], flags: u64) -> i64 {
    let words: Vec<u32> = ips
        .iter()
        .flat_map(|ip| [*ip as u32, (*ip >> 32) as u32])
        .collect();
    let hash = jhash2(&words, 0);
    let h = map.header();
    let id = hash & (map.fixed.nbuckets - 1);
    let _g = match map.lock(|| {}) {
        Ok(g) => g,
        Err(e) => return -(e.errno() as i64),
    };
    let s = slot(map, id);
    let used = s.used();
    let hash_matches = used && s.hash.load(Ordering::Relaxed) == hash;
    if hash_matches && flags & FAST_STACK_CMP != 0 {
        return id as i64;
    }
    if hash_matches && s.nr() == ips.len() {
        // SAFETY: the slot holds nr frames.
        let old = unsafe { std::slice::from_raw_parts(frames_ptr(map, id), ips.len()) };
        if old == ips {
            return id as i64;
        }
    }
    if used && flags & REUSE_STACKID == 0 {
        return -(libc::EEXIST as i64);
    }
    // The replacement is taken from the free elements before the old trace is
    // released, so a full map refuses even a replacement.
    if h.count.load(Ordering::Relaxed) >= map.max_entries() {
        return -(libc::ENOMEM as i64);
    }
    s.hash.store(hash, Ordering::Relaxed);
    s.nr.store(ips.len() as u32, Ordering::Relaxed);
    // SAFETY: ips.len() * 8 <= value_size (the caller capped the depth).
    unsafe { std::ptr::copy_nonoverlapping(ips.as_ptr(), frames_ptr(map, id), ips.len()) };
    if !used {
        s.used.store(1, Ordering::Relaxed);
        h.count.fetch_add(1, Ordering::Relaxed);
    }
    id as i64
}

#[cfg(test)]
mod tests {
    use super::jhash2;

    #[test]
    fn jhash2_of_the_empty_key_is_the_seeded_initial_value() {
        // The frames themselves are checked against the kernel's ids in
        // tests/tests/stacks.rs; here only the length and seed terms.
        assert_eq!(jhash2(&[], 0), 0xdead_beef);
        assert_eq!(jhash2(&[], 0xdead_beef), 0xbd5b_7dde);
        assert_ne!(jhash2(&[1], 0), jhash2(&[1, 0], 0));
        assert_ne!(jhash2(&[1, 2, 3, 4], 0), jhash2(&[1, 2, 3, 5], 0));
    }
}
