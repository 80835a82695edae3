//! Queues (FIFO) and stacks (LIFO) over one ring of `max_entries + 1` slots.
//! Pushing to a full map with `BPF_EXIST` drops the oldest element, as the
//! kernel does for both.

use super::{err, round8, Kind, Map};
use crate::Result;
use bpftime_isa::uapi::update_flags;
use std::sync::atomic::Ordering;

fn slots(map: &Map) -> u32 {
    map.max_entries() + 1
}

fn slot_ptr(map: &Map, i: u32) -> *mut u8 {
    // SAFETY: i < max_entries + 1 slots of round8(value_size) bytes.
    unsafe { map.data().add(i as usize * round8(map.value_size())) }
}

pub(super) fn push(map: &Map, value: *const u8, flags: u64) -> Result<()> {
    if flags != update_flags::ANY && flags != update_flags::EXIST {
        return Err(err(
            libc::EINVAL,
            "queues and stacks take BPF_ANY or BPF_EXIST",
        ));
    }
    let h = map.header();
    let n = slots(map);
    let _g = map.lock(|| {})?;
    let (head, tail) = positions(map)?;
    if (tail + 1) % n == head {
        if flags != update_flags::EXIST {
            return Err(err(libc::E2BIG, "queue or stack is full"));
        }
        h.head.store((head + 1) % n, Ordering::Relaxed);
    }
    // SAFETY: the caller's value holds value_size bytes; the slot holds as many.
    unsafe { std::ptr::copy_nonoverlapping(value, slot_ptr(map, tail), map.value_size() as usize) };
    h.tail.store((tail + 1) % n, Ordering::Release);
    Ok(())
}

/// The ring's head and tail (lock held), or the map marked damaged when either is
/// outside the ring.
fn positions(map: &Map) -> Result<(u32, u32)> {
    let h = map.header();
    let head = h.head.load(Ordering::Relaxed);
    let tail = h.tail.load(Ordering::Acquire);
    if head >= slots(map) || tail >= slots(map) {
        return Err(map.garbage("its head or tail is outside its ring"));
    }
    Ok((head, tail))
}

/// The slot the next pop reads, or None when empty.
fn top(map: &Map) -> Result<Option<u32>> {
    let n = slots(map);
    let (head, tail) = positions(map)?;
    if head == tail {
        return Ok(None);
    }
    Ok(Some(if map.kind == Kind::Stack {
        (tail + n - 1) % n
    } else {
        head
    }))
}

pub(super) fn pop(map: &Map, value: *mut u8) -> Result<()> {
    let h = map.header();
    let n = slots(map);
    let _g = map.lock(|| {})?;
    let Some(i) = top(map)? else {
        return Err(err(libc::ENOENT, "queue or stack is empty"));
    };
    // SAFETY: value holds value_size writable bytes (bpf() buffer or verified program memory).
    unsafe { std::ptr::copy_nonoverlapping(slot_ptr(map, i), value, map.value_size() as usize) };
    if map.kind == Kind::Stack {
        h.tail.store(i, Ordering::Release);
    } else {
        h.head.store((i + 1) % n, Ordering::Release);
    }
    Ok(())
}

pub(super) fn peek(map: &Map, value: &mut [u8]) -> Result<()> {
    if value.len() != map.value_size() as usize {
        return Err(err(libc::EINVAL, "value size mismatch"));
    }
    let _g = map.lock(|| {})?;
    let Some(i) = top(map)? else {
        return Err(err(libc::ENOENT, "queue or stack is empty"));
    };
    // SAFETY: the slot holds value_size bytes.
    unsafe { std::ptr::copy_nonoverlapping(slot_ptr(map, i), value.as_mut_ptr(), value.len()) };
    Ok(())
}
