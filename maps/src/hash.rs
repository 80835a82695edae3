//! Hash maps (plain, per-CPU, LRU): chained buckets over a preallocated element
//! pool, both inside the map file and addressed by index, never by pointer.
//!
//! Writers take the map lock; lookups walk chains without it. An updated value
//! goes into a fresh element that is linked in before the old one is unlinked,
//! and retired elements are reused in FIFO order, so a lookup racing an update
//! sees either the old or the new value, never a torn one.

use super::{current_cpu, err, round8, Map};
use crate::Result;
use bpftime_isa::uapi::update_flags;
use bpftime_store::layout::MapHeader;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

#[repr(C)]
struct Elem {
    /// Next element in the bucket chain (index + 1, 0 = end).
    next: AtomicU32,
    /// Next element in the free list (index + 1, 0 = end).
    free_next: AtomicU32,
    hash: u32,
    used: AtomicU32,
    /// LRU clock at the last lookup.
    tick: AtomicU64,
}

pub(super) const ELEM_HEADER: usize = std::mem::size_of::<Elem>();

pub(super) fn elems_offset(nbuckets: u32) -> usize {
    (nbuckets as usize * 4 + 63) & !63
}

/// Copies a key or value of `n` bytes. Tracing keys and values are mostly one 8-byte word
/// (a pid_tgid, a timestamp): a fixed-size copy is one load and store, where a copy of
/// unknown size is a call into libc's memmove.
///
/// # Safety
/// As `ptr::copy_nonoverlapping(src, dst, n)`.
unsafe fn copy_small(src: *const u8, dst: *mut u8, n: usize) {
    // SAFETY: forwarded caller obligation, in each arm.
    unsafe {
        match n {
            8 => std::ptr::copy_nonoverlapping(src, dst, 8),
            4 => std::ptr::copy_nonoverlapping(src, dst, 4),
            _ => std::ptr::copy_nonoverlapping(src, dst, n),
        }
    }
}

const HASH_SEED: u64 = 0x9e37_79b9_7f4a_7c15;

#[inline]
fn mix_word(h: u64, v: u64) -> u64 {
    let h = (h ^ v).wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 32)
}

#[inline]
fn finish(mut h: u64) -> u32 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 29;
    h as u32
}

#[inline]
fn hash_key(key: &[u8]) -> u32 {
    // One word, the common tracing key, without the loop (the same hash as the loop's).
    if let Ok(word) = <[u8; 8]>::try_from(key) {
        return finish(mix_word(HASH_SEED ^ 8, u64::from_le_bytes(word)));
    }
    let mut h: u64 = HASH_SEED ^ key.len() as u64;
    let mut chunks = key.chunks_exact(8);
    for c in &mut chunks {
        h = mix_word(
            h,
            u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]),
        );
    }
    for &b in chunks.remainder() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    finish(h)
}

/// Where a hash-laid-out map's buckets and elements lie in this process, read once from
/// its header when the map is opened: none of it changes after creation, and the
/// operations then need no header reads and no arithmetic to find an element.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Shape {
    /// Addresses, in this process, of the bucket array and of element 1.
    buckets: usize,
    elems: usize,
    /// nbuckets - 1 (a power of two).
    mask: u32,
    nelems: u32,
    elem_size: usize,
    key_size: usize,
    /// From an element's start to its value.
    value_offset: usize,
}

impl Shape {
    /// The shape of a map whose header is `h`, with `data_len` bytes of data at `data`;
    /// `None` when the header's numbers do not fit a hash map of that length.
    pub(super) fn of(
        h: &super::Fixed,
        data: *mut u8,
        data_len: usize,
        key_size: usize,
    ) -> Option<Shape> {
        let value_offset = ELEM_HEADER + round8(key_size as u32);
        let elem_size = h.elem_size as usize;
        let pool = elem_size.checked_mul(h.nelems as usize)?;
        if !h.nbuckets.is_power_of_two()
            || elem_size < value_offset
            || !elem_size.is_multiple_of(8)
            || elems_offset(h.nbuckets).checked_add(pool)? > data_len
        {
            return None;
        }
        Some(Shape {
            buckets: data as usize,
            elems: data as usize + elems_offset(h.nbuckets),
            mask: h.nbuckets - 1,
            nelems: h.nelems,
            elem_size,
            key_size,
            value_offset,
        })
    }
}

#[derive(Clone, Copy)]
struct View<'a> {
    map: &'a Map,
    h: &'a MapHeader,
    /// Borrowed, not copied: the view is copied into closures, and a 56-byte copy of
    /// words just stored is read back with 16-byte loads that cannot be forwarded.
    s: &'a Shape,
    key_size: usize,
}

impl<'a> View<'a> {
    #[inline]
    fn new(map: &'a Map) -> Self {
        let s = map.hash_shape();
        View {
            map,
            h: map.header(),
            s,
            key_size: s.key_size,
        }
    }

    fn nbuckets(&self) -> u32 {
        self.s.mask + 1
    }

    #[inline]
    fn bucket(&self, hash: u32) -> &AtomicU32 {
        // SAFETY: the bucket array holds mask + 1 u32s (checked in `Shape::of`).
        unsafe { &*(self.s.buckets as *const AtomicU32).add((hash & self.s.mask) as usize) }
    }

    #[inline]
    fn elem_ptr(&self, idx: u32) -> *mut u8 {
        debug_assert!(idx >= 1 && idx <= self.s.nelems);
        (self.s.elems + (idx as usize - 1) * self.s.elem_size) as *mut u8
    }

    #[inline]
    fn elem(&self, idx: u32) -> &Elem {
        // SAFETY: elem_ptr points at an element header, 8-byte aligned (elem_size is a multiple of 8).
        unsafe { &*(self.elem_ptr(idx) as *const Elem) }
    }

    #[inline]
    fn key_ptr(&self, idx: u32) -> *mut u8 {
        // SAFETY: the key follows the element header.
        unsafe { self.elem_ptr(idx).add(ELEM_HEADER) }
    }

    #[inline]
    fn value_ptr(&self, idx: u32) -> *mut u8 {
        // SAFETY: the value follows the 8-byte rounded key, inside the element.
        unsafe { self.elem_ptr(idx).add(self.s.value_offset) }
    }

    /// Finds the element holding `key`, without the lock.
    #[inline]
    fn find(&self, key: &[u8], hash: u32) -> u32 {
        // Tracing keys are mostly a pid_tgid or a pid: one compare, not a memcmp call.
        // Keys in elements are 8-byte aligned; the caller's may not be.
        match key.len() {
            8 => {
                let k = u64::from_ne_bytes(key.try_into().unwrap_or_default());
                // SAFETY: the element's key holds 8 bytes, 8-byte aligned.
                self.find_by(hash, |at| unsafe { *(at as *const u64) } == k)
            }
            4 => {
                let k = u32::from_ne_bytes(key.try_into().unwrap_or_default());
                // SAFETY: as above, 4 bytes.
                self.find_by(hash, |at| unsafe { *(at as *const u32) } == k)
            }
            // SAFETY: the element's key holds key_size (== key.len()) bytes.
            n => self.find_by(
                hash,
                |at| unsafe { std::slice::from_raw_parts(at, n) } == key,
            ),
        }
    }

    #[inline(always)]
    fn find_by(&self, hash: u32, same_key: impl Fn(*const u8) -> bool) -> u32 {
        let mut idx = self.bucket(hash).load(Ordering::Acquire);
        // A chain that writers relink under a walk may lead round or astray: the walk
        // stops after nelems steps, and at an index outside the pool.
        let mut steps = 0u32;
        while idx != 0 && idx <= self.s.nelems && steps <= self.s.nelems {
            let e = self.elem(idx);
            if e.hash == hash && same_key(self.key_ptr(idx)) && e.used.load(Ordering::Acquire) != 0
            {
                return idx;
            }
            idx = e.next.load(Ordering::Acquire);
            steps += 1;
        }
        0
    }

    /// Whether `idx` names an element of the pool (or none, 0).
    fn in_pool(&self, idx: u32) -> bool {
        idx <= self.s.nelems
    }

    /// The first free element (0 when none), taken off the free list (lock held).
    /// The element after `idx` in the chain of bucket `hash` (0 at its end), walked from
    /// the bucket: an iteration follows it call after call, so a chain that comes round
    /// to an element again, or leaves the pool, is garbage, not a key order.
    fn chain_after(&self, hash: u32, idx: u32) -> Result<u32> {
        let mut seen = vec![false; self.s.nelems as usize + 1];
        let mut cur = self.bucket(hash).load(Ordering::Acquire);
        while cur != 0 {
            if !self.in_pool(cur) || seen[cur as usize] {
                return Err(self
                    .map
                    .garbage("a bucket's chain leaves its elements or runs round"));
            }
            seen[cur as usize] = true;
            let next = self.elem(cur).next.load(Ordering::Acquire);
            if cur == idx {
                if next != 0 && (!self.in_pool(next) || seen[next as usize]) {
                    return Err(self
                        .map
                        .garbage("a bucket's chain leaves its elements or runs round"));
                }
                return Ok(next);
            }
            cur = next;
        }
        // Unlinked meanwhile: start over from the next bucket.
        Ok(0)
    }

    fn pop_free(&self) -> Result<u32> {
        let idx = self.h.free_head.load(Ordering::Relaxed);
        if idx == 0 {
            return Ok(0);
        }
        if !self.in_pool(idx) {
            return Err(self
                .map
                .garbage("its free list starts outside its elements"));
        }
        let next = self.elem(idx).free_next.load(Ordering::Relaxed);
        if !self.in_pool(next) || self.elem(idx).used.load(Ordering::Relaxed) != 0 {
            return Err(self
                .map
                .garbage("its free list leads outside its free elements"));
        }
        self.h.free_head.store(next, Ordering::Relaxed);
        if next == 0 {
            self.h.free_tail.store(0, Ordering::Relaxed);
        }
        Ok(idx)
    }

    fn push_free(&self, idx: u32) -> Result<()> {
        let tail = self.h.free_tail.load(Ordering::Relaxed);
        if !self.in_pool(tail) {
            return Err(self.map.garbage("its free list ends outside its elements"));
        }
        let e = self.elem(idx);
        e.used.store(0, Ordering::Release);
        e.free_next.store(0, Ordering::Relaxed);
        if tail == 0 {
            self.h.free_head.store(idx, Ordering::Relaxed);
        } else {
            self.elem(tail).free_next.store(idx, Ordering::Relaxed);
        }
        self.h.free_tail.store(idx, Ordering::Relaxed);
        Ok(())
    }

    /// Removes `idx` from its chain (lock held). A chain longer than the pool, or one
    /// that leaves it, is garbage.
    fn unlink(&self, idx: u32) -> Result<()> {
        let b = self.bucket(self.elem(idx).hash);
        let next = self.elem(idx).next.load(Ordering::Relaxed);
        let mut cur = b.load(Ordering::Relaxed);
        if cur == idx {
            b.store(next, Ordering::Release);
            return Ok(());
        }
        let mut steps = 0u32;
        while cur != 0 {
            if !self.in_pool(cur) || steps > self.s.nelems {
                return Err(self
                    .map
                    .garbage("a bucket's chain leaves its elements or runs round"));
            }
            let e = self.elem(cur);
            let n = e.next.load(Ordering::Relaxed);
            if n == idx {
                e.next.store(next, Ordering::Release);
                return Ok(());
            }
            cur = n;
            steps += 1;
        }
        Ok(())
    }

    /// Adds `by` to a header counter that only lock holders write: a load and a
    /// store, not a locked read-modify-write (readers elsewhere only load it).
    fn bump_counter(&self, counter: &AtomicU64, by: i64) {
        counter.store(
            counter.load(Ordering::Relaxed).wrapping_add(by as u64),
            Ordering::Relaxed,
        );
    }

    fn bump_count(&self, by: i32) {
        let c = &self.h.count;
        c.store(
            c.load(Ordering::Relaxed).wrapping_add(by as u32),
            Ordering::Relaxed,
        );
    }

    fn lock(&self) -> Result<super::lock::Guard<'a>> {
        let v = *self;
        self.map.lock(move || v.repair())
    }

    /// Rebuilds the free list and the count from the chains, after a writer died
    /// holding the lock.
    fn repair(&self) {
        let n = self.s.nelems as usize;
        let mut linked = vec![false; n + 1];
        let mut count = 0;
        for b in 0..self.nbuckets() {
            let bucket = self.bucket(b);
            let mut prev: Option<&AtomicU32> = None;
            let mut idx = bucket.load(Ordering::Relaxed);
            while idx != 0 && (idx as usize) <= n && !linked[idx as usize] {
                linked[idx as usize] = true;
                count += 1;
                prev = Some(&self.elem(idx).next);
                idx = self.elem(idx).next.load(Ordering::Relaxed);
            }
            if idx != 0 {
                // A cycle or a bad index: cut the chain there.
                match prev {
                    Some(p) => p.store(0, Ordering::Relaxed),
                    None => bucket.store(0, Ordering::Relaxed),
                }
            }
        }
        self.h.free_head.store(0, Ordering::Relaxed);
        self.h.free_tail.store(0, Ordering::Relaxed);
        for idx in 1..=n as u32 {
            if linked[idx as usize] {
                self.elem(idx).used.store(1, Ordering::Relaxed);
            } else {
                // The list was emptied above, so its tail is in range.
                let _ = self.push_free(idx);
            }
        }
        self.h.count.store(count, Ordering::Relaxed);
    }

    fn is_lru(&self) -> bool {
        matches!(self.map.kind, super::Kind::Hash { lru: true, .. })
    }

    /// Evicts the least recently used of a sample of elements other than `keep` (lock
    /// held): an update of a key in a full map replaces its element with a fresh one, and
    /// evicting the one it replaces would unlink the fresh one in its place.
    fn evict(&self, keep: u32) -> Result<bool> {
        let n = self.s.nelems;
        let start = (self.h.lru_clock.load(Ordering::Relaxed) as u32) % n;
        let mut best: Option<(u64, u32)> = None;
        let mut seen = 0;
        for i in 0..n {
            let idx = (start + i) % n + 1;
            let e = self.elem(idx);
            if e.used.load(Ordering::Relaxed) == 0 || idx == keep {
                continue;
            }
            let t = e.tick.load(Ordering::Relaxed);
            if best.is_none_or(|(bt, _)| t < bt) {
                best = Some((t, idx));
            }
            seen += 1;
            if seen >= 128 {
                break;
            }
        }
        let Some((_, idx)) = best else {
            return Ok(false);
        };
        self.unlink(idx)?;
        self.push_free(idx)?;
        self.bump_count(-1);
        Ok(true)
    }

    fn copies(&self) -> usize {
        if self.map.kind.percpu() {
            self.map.ncpus() as usize
        } else {
            1
        }
    }
}

pub(super) fn init_free_list(h: &MapHeader, data: &mut [u8]) {
    let base = elems_offset(h.nbuckets);
    for i in 0..h.nelems as usize {
        let off = base + i * h.elem_size as usize + 4;
        let next = if i + 1 == h.nelems as usize {
            0
        } else {
            i as u32 + 2
        };
        data[off..off + 4].copy_from_slice(&next.to_ne_bytes());
    }
    h.free_head
        .store(if h.nelems > 0 { 1 } else { 0 }, Ordering::Relaxed);
    h.free_tail.store(h.nelems, Ordering::Relaxed);
}

/// # Safety
/// `key` points to key_size readable bytes.
pub(super) unsafe fn find_value(map: &Map, key: *const u8) -> *mut u8 {
    let v = View::new(map);
    // SAFETY: caller obligation.
    let key = unsafe { std::slice::from_raw_parts(key, v.key_size) };
    let idx = v.find(key, hash_key(key));
    if idx == 0 {
        return std::ptr::null_mut();
    }
    if v.is_lru() {
        let t = v.h.lru_clock.fetch_add(1, Ordering::Relaxed);
        v.elem(idx).tick.store(t, Ordering::Relaxed);
    }
    v.value_ptr(idx)
}

pub(super) fn lookup(map: &Map, key: &[u8], value: &mut [u8]) -> Result<()> {
    if key.len() != map.hash_key_size() {
        return Err(err(libc::EINVAL, "key size mismatch"));
    }
    let v = View::new(map);
    let idx = v.find(key, hash_key(key));
    if idx == 0 {
        return Err(err(libc::ENOENT, "no such key"));
    }
    super::array::copy_out(map, v.value_ptr(idx), value)
}

/// Inserts or replaces. From a program (`from_syscall` false) `value` is one
/// value, which goes to the current CPU's slot of per-CPU maps.
pub(super) fn update(
    map: &Map,
    key: &[u8],
    value: *const u8,
    flags: u64,
    from_syscall: bool,
) -> Result<()> {
    if key.len() != map.hash_key_size() {
        return Err(err(libc::EINVAL, "key size mismatch"));
    }
    if flags & !update_flags::LOCK > update_flags::EXIST {
        return Err(err(libc::EINVAL, "unknown update flags"));
    }
    let v = View::new(map);
    let hash = hash_key(key);
    let vstride = round8(map.value_size());
    let vsize = map.value_size() as usize;
    let percpu = map.kind.percpu();
    let _g = v.lock()?;
    let old = v.find(key, hash);
    let mode = flags & !update_flags::LOCK;
    if old != 0 && mode == update_flags::NOEXIST {
        return Err(err(libc::EEXIST, "key exists"));
    }
    if old == 0 && mode == update_flags::EXIST {
        return Err(err(libc::ENOENT, "no such key"));
    }
    let write_values = |dst: *mut u8, fresh: bool| {
        if percpu && from_syscall {
            for c in 0..v.copies() {
                // SAFETY: `value` holds ncpus 8-byte-rounded slots from bpf(); dst holds ncpus slots.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        value.add(c * vstride),
                        dst.add(c * vstride),
                        vsize,
                    )
                };
            }
        } else if percpu {
            if fresh {
                // SAFETY: dst holds ncpus slots.
                unsafe { std::ptr::write_bytes(dst, 0, vstride * v.copies()) };
            }
            let cpu = current_cpu(map.ncpus());
            // SAFETY: the program's value holds value_size bytes; the slot is in range.
            unsafe { copy_small(value, dst.add(cpu * vstride), vsize) };
        } else {
            // SAFETY: one value of value_size bytes each side.
            unsafe { copy_small(value, dst, vsize) };
        }
    };
    v.bump_counter(&v.h.updates, 1);
    if old != 0 && percpu {
        // The kernel updates per-CPU values in place.
        write_values(v.value_ptr(old), false);
        return Ok(());
    }
    place(v, map, key, hash, old, |dst| write_values(dst, true))?;
    Ok(())
}

/// Links a fresh element holding `key` (its value written by `write`) in place of
/// `old` (0 for none), evicting from an LRU map when full (lock held). Returns the
/// element.
fn place(
    v: View<'_>,
    map: &Map,
    key: &[u8],
    hash: u32,
    old: u32,
    write: impl FnOnce(*mut u8),
) -> Result<u32> {
    if old == 0
        && v.h.count.load(Ordering::Relaxed) >= map.hash_capacity()
        && !(v.is_lru() && v.evict(0)?)
    {
        return Err(err(libc::E2BIG, "map is full"));
    }
    let mut idx = v.pop_free()?;
    if idx == 0 && v.is_lru() && v.evict(old)? {
        idx = v.pop_free()?;
    }
    if idx == 0 {
        return Err(err(libc::E2BIG, "map is full"));
    }
    // SAFETY: a free element is ours alone under the lock; the key area holds key_size bytes.
    unsafe { copy_small(key.as_ptr(), v.key_ptr(idx), key.len()) };
    write(v.value_ptr(idx));
    // SAFETY: elem_ptr points at the element header, which we own until it is linked.
    let e = unsafe { &mut *(v.elem_ptr(idx) as *mut Elem) };
    e.hash = hash;
    if v.is_lru() {
        e.tick.store(
            v.h.lru_clock.fetch_add(1, Ordering::Relaxed),
            Ordering::Relaxed,
        );
    }
    e.used.store(1, Ordering::Relaxed);
    let b = v.bucket(hash);
    e.next.store(b.load(Ordering::Relaxed), Ordering::Relaxed);
    b.store(idx, Ordering::Release);
    if old != 0 {
        v.unlink(old)?;
        v.push_free(old)?;
    } else {
        v.bump_count(1);
    }
    Ok(idx)
}

/// Runs `f` on the values of `key` in a per-CPU hash map (every CPU's, `round8(value_size)`
/// apart) under the map's lock, so that no delete or reuse of the element can come
/// between; a missing key is first inserted with every value zeroed when `create` is set
/// (counted as an update, as a `bpf()` insert is). Returns what `f` returned and whether
/// the key was inserted.
pub(super) fn with_values<R>(
    map: &Map,
    key: &[u8],
    create: bool,
    f: impl FnOnce(*mut u8) -> R,
) -> Result<(R, bool)> {
    if key.len() != map.hash_key_size() {
        return Err(err(libc::EINVAL, "key size mismatch"));
    }
    let v = View::new(map);
    let hash = hash_key(key);
    let bytes = round8(map.value_size()) * v.copies();
    let _g = v.lock()?;
    let mut idx = v.find(key, hash);
    let inserted = idx == 0;
    if inserted {
        if !create {
            return Err(err(libc::ENOENT, "no such key"));
        }
        // SAFETY: a free element's value area holds every CPU's value.
        idx = place(v, map, key, hash, 0, |dst| unsafe {
            std::ptr::write_bytes(dst, 0, bytes)
        })?;
        v.bump_counter(&v.h.updates, 1);
    }
    Ok((f(v.value_ptr(idx)), inserted))
}

/// # Safety-free wrapper: `key` points to key_size readable bytes (checked by callers).
pub(super) fn delete(map: &Map, key: *const u8) -> Result<()> {
    let v = View::new(map);
    // SAFETY: callers pass key_size readable bytes (a bpf() buffer or a verified program pointer).
    let key = unsafe { std::slice::from_raw_parts(key, v.key_size) };
    let hash = hash_key(key);
    let _g = v.lock()?;
    let idx = v.find(key, hash);
    if idx == 0 {
        return Err(err(libc::ENOENT, "no such key"));
    }
    v.unlink(idx)?;
    v.push_free(idx)?;
    v.bump_count(-1);
    v.bump_counter(&v.h.updates, 1);
    Ok(())
}

pub(super) fn lookup_and_delete(map: &Map, key: &[u8], value: &mut [u8]) -> Result<()> {
    if key.len() != map.hash_key_size() {
        return Err(err(libc::EINVAL, "key size mismatch"));
    }
    if value.len() != map.syscall_value_size() {
        return Err(err(libc::EINVAL, "value size mismatch"));
    }
    let v = View::new(map);
    let hash = hash_key(key);
    let _g = v.lock()?;
    let idx = v.find(key, hash);
    if idx == 0 {
        return Err(err(libc::ENOENT, "no such key"));
    }
    // SAFETY: the element's value area holds syscall_value_size bytes.
    unsafe { std::ptr::copy_nonoverlapping(v.value_ptr(idx), value.as_mut_ptr(), value.len()) };
    v.unlink(idx)?;
    v.push_free(idx)?;
    v.bump_count(-1);
    v.bump_counter(&v.h.updates, 1);
    Ok(())
}

/// Every key in the map, bucket by bucket, without the lock (as `next_key` reads).
pub(super) fn keys(map: &Map) -> Vec<Vec<u8>> {
    let v = View::new(map);
    let mut out = Vec::new();
    for b in 0..v.nbuckets() {
        let mut idx = v.bucket(b).load(Ordering::Acquire);
        let mut steps = 0;
        while idx != 0 && idx <= v.s.nelems && steps <= v.s.nelems {
            // SAFETY: the element's key holds key_size bytes.
            let k = unsafe { std::slice::from_raw_parts(v.key_ptr(idx), v.key_size) };
            out.push(k.to_vec());
            idx = v.elem(idx).next.load(Ordering::Acquire);
            steps += 1;
        }
    }
    out
}

pub(super) fn next_key(map: &Map, key: Option<&[u8]>, out: &mut [u8]) -> Result<()> {
    let v = View::new(map);
    let first_from = |start: u32| -> Option<u32> {
        (start..v.nbuckets()).find_map(|b| {
            let idx = v.bucket(b).load(Ordering::Acquire);
            (idx != 0 && idx <= v.s.nelems).then_some(idx)
        })
    };
    let found = key.map(|k| (k, hash_key(k))).and_then(|(k, h)| {
        let idx = v.find(k, h);
        (idx != 0).then_some((idx, h))
    });
    let next = match found {
        None => first_from(0),
        Some((idx, h)) => match v.chain_after(h, idx)? {
            0 => first_from((h & v.s.mask) + 1),
            n => Some(n),
        },
    };
    let Some(idx) = next else {
        return Err(err(libc::ENOENT, "no more keys"));
    };
    // SAFETY: the element's key holds key_size bytes; out was checked to be key_size long.
    unsafe { std::ptr::copy_nonoverlapping(v.key_ptr(idx), out.as_mut_ptr(), out.len()) };
    Ok(())
}

/// Element and bucket words of a map, for tests that damage them.
#[cfg(test)]
pub(super) mod raw {
    use super::*;

    pub(crate) fn nbuckets(map: &Map) -> u32 {
        map.hash_shape().mask + 1
    }

    pub(crate) fn bucket(map: &Map, b: u32) -> &AtomicU32 {
        let s = map.hash_shape();
        // SAFETY: the bucket array holds mask + 1 words.
        unsafe { &*(s.buckets as *const AtomicU32).add((b & s.mask) as usize) }
    }

    fn elem(map: &Map, idx: u32) -> &Elem {
        let s = map.hash_shape();
        assert!(idx >= 1 && idx <= s.nelems);
        // SAFETY: an element of the pool.
        unsafe { &*((s.elems + (idx as usize - 1) * s.elem_size) as *const Elem) }
    }

    pub(crate) fn next(map: &Map, idx: u32) -> &AtomicU32 {
        &elem(map, idx).next
    }

    pub(crate) fn free_next(map: &Map, idx: u32) -> &AtomicU32 {
        &elem(map, idx).free_next
    }
}
