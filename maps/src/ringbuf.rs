//! Ring buffers in the kernel's layout, so libbpf's own consumer reads them:
//! a consumer page, a producer page, then the data, which every process maps
//! twice in a row so that a record wrapping past the end is contiguous.
//! Each record starts with an 8-byte header: the length with the busy and
//! discard bits, and the page offset of the header from the start of the
//! mapping, from which `submit` finds its ring.

use super::Map;
use bpftime_isa::uapi::ringbuf as rb;
use bpftime_store::layout::{MapHeader, PAGE_SIZE};
use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

pub(super) const CONSUMER_OFFSET: usize = PAGE_SIZE;
pub(super) const PRODUCER_OFFSET: usize = 2 * PAGE_SIZE;
pub(super) const DATA_OFFSET: usize = 3 * PAGE_SIZE;

/// Wake-up FIFOs of the ring buffers this process has open, by mapping base.
static WAKERS: Mutex<Option<HashMap<usize, RawFd>>> = Mutex::new(None);

pub(super) fn register_waker(base: usize, fd: RawFd) {
    if let Ok(mut w) = WAKERS.lock() {
        w.get_or_insert_with(HashMap::new).insert(base, fd);
    }
}

pub(super) fn unregister_waker(base: usize) {
    if let Ok(mut w) = WAKERS.lock() {
        if let Some(m) = w.as_mut() {
            m.remove(&base);
        }
    }
}

fn positions(base: *mut u8) -> (&'static AtomicU64, &'static AtomicU64) {
    // SAFETY: ring mappings always include the consumer and producer pages, 8-byte aligned;
    // the references do not outlive the mapping in practice because callers hold the Map.
    unsafe {
        (
            &*(base.add(CONSUMER_OFFSET) as *const AtomicU64),
            &*(base.add(PRODUCER_OFFSET) as *const AtomicU64),
        )
    }
}

#[cfg(test)]
pub(super) fn positions_for_test(map: &Map) -> (&AtomicU64, &AtomicU64) {
    positions(map.mapping.base())
}

/// Whether the consumer position is at most a ring behind the producer's, as producers
/// and consumers leave them.
pub(super) fn positions_in_order(map: &Map) -> bool {
    let (cons, prod) = positions(map.mapping.base());
    // The consumer's first: it never passes the producer's, which only grows.
    let c = cons.load(Ordering::Acquire);
    let p = prod.load(Ordering::Acquire);
    c <= p && p - c <= u64::from(map.ring_size())
}

/// The ring bytes a record of `size` bytes of data takes: its header, rounded up to 8.
pub(super) fn record_len(size: u64) -> u64 {
    (size + rb::HDR_SZ as u64 + 7) & !7
}

pub(super) fn reserve(map: &Map, size: u64, flags: u64) -> *mut u8 {
    reserve_counting(map, size, flags, true)
}

/// [`reserve`], counting a full ring's refusal as a drop only with `count_drop` (a
/// producer that keeps the record and offers it again counts nothing).
pub(super) fn reserve_counting(map: &Map, size: u64, flags: u64, count_drop: bool) -> *mut u8 {
    let h = map.header();
    let ring = map.ring_size() as u64;
    if flags != 0 || size > (u32::MAX / 4) as u64 {
        return std::ptr::null_mut();
    }
    let len = record_len(size);
    if len > ring {
        return std::ptr::null_mut();
    }
    let base = map.mapping.base();
    let (cons, prod) = positions(base);
    let Ok(_g) = map.lock(|| {}) else {
        return std::ptr::null_mut();
    };
    let c = cons.load(Ordering::Acquire);
    let p = prod.load(Ordering::Relaxed);
    if c > p || p - c > ring || p % 8 != 0 {
        let _ = map.garbage("its consumer and producer positions are out of order");
        return std::ptr::null_mut();
    }
    if p + len - c > ring {
        if count_drop {
            h.dropped.fetch_add(1, Ordering::Relaxed);
        }
        return std::ptr::null_mut();
    }
    // SAFETY: (p & mask) < ring, and the data is followed by its second mapping,
    // so the record of `len` bytes fits in mapped memory.
    let hdr = unsafe { base.add(DATA_OFFSET + (p & (ring - 1)) as usize) };
    let page_of_hdr = (hdr as usize & !(PAGE_SIZE - 1)) - base as usize;
    // SAFETY: the header is 8-byte aligned (positions advance in multiples of 8).
    unsafe {
        (*(hdr as *const AtomicU32)).store(size as u32 | rb::BUSY_BIT, Ordering::Relaxed);
        (*(hdr.add(4) as *const AtomicU32))
            .store((page_of_hdr / PAGE_SIZE) as u32, Ordering::Relaxed);
    }
    prod.store(p + len, Ordering::Release);
    // SAFETY: the sample follows its 8-byte header inside the record.
    unsafe { hdr.add(rb::HDR_SZ as usize) }
}

/// Writes a record of `size` bytes from `data` and submits it: `bpf_ringbuf_output`, and
/// a producer's offer that counts no drop when the ring is full (`count_drop` false).
/// False when there is no room.
///
/// # Safety
/// `data` must point to `size` readable bytes.
pub(super) unsafe fn output(
    map: &Map,
    data: *const u8,
    size: u64,
    flags: u64,
    count_drop: bool,
) -> bool {
    let rec = reserve_counting(
        map,
        size,
        flags & !(rb::NO_WAKEUP | rb::FORCE_WAKEUP),
        count_drop,
    );
    if rec.is_null() {
        return false;
    }
    // SAFETY: the record has room for `size` bytes; `data` is readable per the caller.
    unsafe { std::ptr::copy_nonoverlapping(data, rec, size as usize) };
    // SAFETY: `rec` came from reserve on this ring, not committed yet.
    unsafe { commit(rec, flags, false) };
    true
}

/// Submits (or discards) a record returned by `reserve`.
///
/// # Safety
/// `rec` must come from `reserve` and not have been committed yet.
pub(crate) unsafe fn commit(rec: *mut u8, flags: u64, discard: bool) {
    // SAFETY: caller obligation: the header precedes the sample.
    let hdr = unsafe { rec.sub(rb::HDR_SZ as usize) };
    // SAFETY: as above; the header words are aligned atomics.
    let (len_word, pg_off) = unsafe {
        (
            &*(hdr as *const AtomicU32),
            (*(hdr.add(4) as *const AtomicU32)).load(Ordering::Relaxed),
        )
    };
    let len = len_word.load(Ordering::Relaxed) & !rb::BUSY_BIT;
    let new = if discard { len | rb::DISCARD_BIT } else { len };
    len_word.store(new, Ordering::Release);
    let base = (hdr as usize & !(PAGE_SIZE - 1)).wrapping_sub(pg_off as usize * PAGE_SIZE);
    // The page offset is in the ring, which anyone may overwrite between reserve and
    // submit: only the base of a ring this process has open is followed.
    if !is_ring_base(base) {
        return;
    }
    // SAFETY: `base` is the start of a ring's mapping (checked above), which begins with
    // its MapHeader.
    let h = unsafe { &*(base as *const MapHeader) };
    if flags & rb::NO_WAKEUP != 0 {
        return;
    }
    if flags & rb::FORCE_WAKEUP != 0 || h.wakeup_pending.swap(1, Ordering::SeqCst) == 0 {
        wake(base);
    }
}

fn is_ring_base(base: usize) -> bool {
    WAKERS
        .lock()
        .ok()
        .is_some_and(|w| w.as_ref().is_some_and(|m| m.contains_key(&base)))
}

fn wake(base: usize) {
    let fd = WAKERS
        .lock()
        .ok()
        .and_then(|w| w.as_ref().and_then(|m| m.get(&base).copied()));
    if let Some(fd) = fd {
        // SAFETY: writes one byte from a local buffer to a FIFO fd this process keeps open;
        // a full FIFO (EAGAIN) already holds a wake-up.
        unsafe { libc::write(fd, [1u8].as_ptr().cast(), 1) };
    }
}

pub(super) fn query(map: &Map, flags: u64) -> u64 {
    let (cons, prod) = positions(map.mapping.base());
    let c = cons.load(Ordering::Acquire);
    let p = prod.load(Ordering::Acquire);
    match flags {
        rb::AVAIL_DATA => p - c,
        rb::RING_SIZE => map.ring_size() as u64,
        rb::CONS_POS => c,
        rb::PROD_POS => p,
        _ => 0,
    }
}

/// Reads every submitted record, in order, as a consumer would; stops at the
/// first record still being written. Returns the number of records read.
pub(super) fn drain(map: &Map, mut f: impl FnMut(&[u8])) -> usize {
    drain_while(map, |r| {
        f(r);
        true
    })
}

/// [`drain`], stopping before the first record `f` declines (returns false for), which
/// stays in the ring, first of what the next drain reads.
pub(super) fn drain_while(map: &Map, mut f: impl FnMut(&[u8]) -> bool) -> usize {
    let base = map.mapping.base();
    let ring = map.ring_size() as u64;
    let (cons, prod) = positions(base);
    let mut c = cons.load(Ordering::Acquire);
    let mut n = 0;
    loop {
        let p = prod.load(Ordering::Acquire);
        if c >= p {
            break;
        }
        if p - c > ring {
            let _ = map.garbage("its producer position is more than a ring ahead of its consumer");
            break;
        }
        // SAFETY: c & mask is inside the data area.
        let hdr = unsafe { base.add(DATA_OFFSET + (c & (ring - 1)) as usize) };
        // SAFETY: the header word is an aligned atomic.
        let len = unsafe { &*(hdr as *const AtomicU32) }.load(Ordering::Acquire);
        if len & rb::BUSY_BIT != 0 {
            break;
        }
        let size = (len & !(rb::BUSY_BIT | rb::DISCARD_BIT)) as usize;
        if record_len(size as u64) > p - c {
            let _ = map.garbage("a record is longer than what was written");
            break;
        }
        if len & rb::DISCARD_BIT == 0 {
            // SAFETY: the record is contiguous thanks to the double mapping.
            if !f(unsafe { std::slice::from_raw_parts(hdr.add(rb::HDR_SZ as usize), size) }) {
                break;
            }
            n += 1;
        }
        c += (size as u64 + rb::HDR_SZ as u64 + 7) & !7;
        cons.store(c, Ordering::Release);
    }
    n
}
