//! The agent's allocator: the C library's `malloc`, except on a thread inside a system call
//! that makes a process (see `bpftime_syscall_hooks::in_process_making_call`). The C library's
//! `fork` takes every lock of its `malloc` before that call and lets them go after it, in
//! the caller and in the child; the programs that watch the call run in between, and the
//! first time one writes to a perf buffer, or does anything else that allocates, a `malloc`
//! there would wait for a lock its own thread holds, for ever. Those threads are served
//! from a reserve of our own instead, and what they free of the C library's waits until a
//! thread outside such a call allocates or frees.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// Bytes of the reserve: what is allocated inside process-making calls at once. It is
/// taken again from the start whenever all of it was freed; past it, `malloc` is used.
const RESERVE_BYTES: usize = 1 << 20;

#[repr(C, align(4096))]
struct Reserve(UnsafeCell<[u8; RESERVE_BYTES]>);

// SAFETY: its bytes are handed out in disjoint pieces (`USED` only grows between resets,
// and a reset happens only when no piece is live).
unsafe impl Sync for Reserve {}

static RESERVE: Reserve = Reserve(UnsafeCell::new([0; RESERVE_BYTES]));
/// Bytes of the reserve handed out since it was last empty.
static USED: AtomicUsize = AtomicUsize::new(0);
/// Pieces of the reserve not yet freed.
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// Blocks of `malloc`'s freed inside a process-making call, chained through their first
/// word, for `free` later.
static DEFERRED: AtomicPtr<*mut u8> = AtomicPtr::new(null_mut());

pub struct AgentAllocator;

fn base() -> usize {
    RESERVE.0.get() as usize
}

fn in_reserve(ptr: *mut u8) -> bool {
    (base()..base() + RESERVE_BYTES).contains(&(ptr as usize))
}

fn from_reserve(layout: Layout) -> *mut u8 {
    LIVE.fetch_add(1, Ordering::AcqRel);
    let mut used = USED.load(Ordering::Acquire);
    loop {
        let start = (base() + used).next_multiple_of(layout.align()) - base();
        let end = start + layout.size();
        if end > RESERVE_BYTES {
            LIVE.fetch_sub(1, Ordering::AcqRel);
            return null_mut();
        }
        match USED.compare_exchange_weak(used, end, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return (base() + start) as *mut u8,
            Err(now) => used = now,
        }
    }
}

fn back_to_reserve() {
    let used = USED.load(Ordering::Acquire);
    if LIVE.fetch_sub(1, Ordering::AcqRel) == 1 {
        // Empty: start over, unless a piece was handed out since `used` was read (then
        // `USED` moved and the exchange fails).
        let _ = USED.compare_exchange(used, 0, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// Frees what was freed inside process-making calls, from a thread outside one.
fn free_deferred() {
    if DEFERRED.load(Ordering::Relaxed).is_null() {
        return;
    }
    let mut block = DEFERRED.swap(null_mut(), Ordering::AcqRel);
    while !block.is_null() {
        // SAFETY: every block on the chain is a live `malloc` block whose first word
        // `defer_free` set to the next one.
        let next = unsafe { *block };
        // SAFETY: a block of `malloc`'s, freed once (it left the chain above).
        unsafe { libc::free(block.cast()) };
        block = next.cast();
    }
}

/// # Safety
/// `ptr` is a live block of `malloc`'s, no longer used.
unsafe fn defer_free(ptr: *mut u8) {
    let block = ptr.cast::<*mut u8>();
    let mut head = DEFERRED.load(Ordering::Acquire);
    loop {
        // SAFETY: `malloc` gives every block at least 16 usable bytes, 16-aligned: room for
        // the link, whatever the layout asked for.
        unsafe { *block = head.cast() };
        match DEFERRED.compare_exchange_weak(head, block, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(now) => head = now,
        }
    }
}

// SAFETY: every block is either `System`'s, handled by `System` outside process-making
// calls, or a disjoint piece of the reserve, which is never given to `System`.
unsafe impl GlobalAlloc for AgentAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if bpftime_syscall_hooks::in_process_making_call() {
            let p = from_reserve(layout);
            if !p.is_null() {
                return p;
            }
        } else {
            free_deferred();
        }
        // SAFETY: the caller's layout, of nonzero size.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if in_reserve(ptr) {
            back_to_reserve();
        } else if bpftime_syscall_hooks::in_process_making_call() {
            // SAFETY: the caller's block, of `System`'s and no longer used.
            unsafe { defer_free(ptr) };
        } else {
            free_deferred();
            // SAFETY: as above.
            unsafe { System.dealloc(ptr, layout) };
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !in_reserve(ptr) && !bpftime_syscall_hooks::in_process_making_call() {
            // SAFETY: the caller's block and sizes.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        // SAFETY: the new layout keeps the old alignment, and `new_size` is nonzero.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: as above.
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks hold at least the smaller size, and are distinct.
            unsafe { std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size)) };
            // SAFETY: the caller's block, which is no longer used.
            unsafe { self.dealloc(ptr, layout) };
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_hands_out_disjoint_aligned_pieces_and_starts_over_when_empty() {
        let a = from_reserve(Layout::from_size_align(10, 8).unwrap());
        let b = from_reserve(Layout::from_size_align(100, 64).unwrap());
        assert!(in_reserve(a) && in_reserve(b));
        assert_eq!(b as usize % 64, 0);
        assert!(b as usize >= a as usize + 10);
        assert!(from_reserve(Layout::from_size_align(RESERVE_BYTES, 1).unwrap()).is_null());
        back_to_reserve();
        assert_ne!(USED.load(Ordering::Acquire), 0, "a piece is still live");
        back_to_reserve();
        assert_eq!(USED.load(Ordering::Acquire), 0);
        assert_eq!(LIVE.load(Ordering::Acquire), 0);
    }
}
