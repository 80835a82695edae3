//! What programs call on maps succeeds or fails without allocating: a full hash map, a missing key, a
//! flag the key's state refuses, an index past an array, a full queue and an empty one,
//! each answered with the kernel's errno and no call to the allocator. A program may run
//! where `malloc` is locked (inside the C library's `fork`, which it watches), and it runs
//! on every call of a hot function.

use bpftime_isa::uapi::{map_type as mt, update_flags as uf};
use bpftime_runtime::{Map, MapSpec, Store};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Counts this thread's allocations while `COUNTING` is on.
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is `System`'s; the count is a side effect only.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
        }
        // SAFETY: the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's block.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
        }
        // SAFETY: the caller's block and sizes.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING_ALLOCATOR: Counting = Counting;

/// What `f` returns, and how many allocations it made.
fn counted<T>(f: impl FnOnce() -> T) -> (T, u64) {
    ALLOCATIONS.with(|n| n.set(0));
    COUNTING.with(|c| c.set(true));
    let r = f();
    COUNTING.with(|c| c.set(false));
    (r, ALLOCATIONS.with(Cell::get))
}

/// A program's map call, what it is, and the result it must give.
type Case<'a> = (&'static str, Box<dyn Fn() -> i64 + 'a>, i64);

fn spec(map_type: u32, key: u32, value: u32, max: u32) -> MapSpec {
    MapSpec {
        map_type,
        key_size: key,
        value_size: value,
        max_entries: max,
        ..Default::default()
    }
}

#[test]
fn failing_map_calls_of_programs_allocate_nothing() {
    let name = format!("noalloc-{}", std::process::id());
    let _ = std::fs::remove_dir_all(Store::dir_for(&name));
    let store = Store::create_or_open(&name).unwrap();
    let hash = Map::create(&store, &spec(mt::HASH, 4, 8, 1)).unwrap();
    let array = Map::create(&store, &spec(mt::ARRAY, 4, 8, 2)).unwrap();
    let queue = Map::create(&store, &spec(mt::QUEUE, 0, 8, 1)).unwrap();
    let one = 1u32.to_ne_bytes();
    let two = 2u32.to_ne_bytes();
    let value = 7u64.to_ne_bytes();
    let mut out = [0u8; 8];
    // Warm-up: the first calls may open what a map keeps per process.
    // SAFETY (every call below): keys and values of the maps' sizes.
    unsafe {
        assert_eq!(hash.prog_update(one.as_ptr(), value.as_ptr(), uf::ANY), 0);
        assert_eq!(array.prog_update(one.as_ptr(), value.as_ptr(), uf::ANY), 0);
        assert_eq!(queue.prog_push(value.as_ptr(), 0), 0);
        assert_eq!(queue.prog_pop(out.as_mut_ptr(), true), 0);
    }
    let e = |errno: i32| -(errno as i64);
    let cases: Vec<Case> = vec![
        (
            "hash update of a present key",
            // SAFETY: as above.
            Box::new(|| unsafe { hash.prog_update(one.as_ptr(), value.as_ptr(), uf::EXIST) }),
            0,
        ),
        (
            "array update",
            // SAFETY: as above.
            Box::new(|| unsafe { array.prog_update(one.as_ptr(), value.as_ptr(), uf::ANY) }),
            0,
        ),
        (
            "hash full",
            // SAFETY: as above.
            Box::new(|| unsafe { hash.prog_update(two.as_ptr(), value.as_ptr(), uf::ANY) }),
            e(libc::E2BIG),
        ),
        (
            "hash BPF_NOEXIST on a present key",
            // SAFETY: as above.
            Box::new(|| unsafe { hash.prog_update(one.as_ptr(), value.as_ptr(), uf::NOEXIST) }),
            e(libc::EEXIST),
        ),
        (
            "hash delete of a missing key",
            // SAFETY: as above.
            Box::new(|| unsafe { hash.prog_delete(two.as_ptr()) }),
            e(libc::ENOENT),
        ),
        (
            "array index past the end",
            // SAFETY: as above.
            Box::new(|| unsafe { array.prog_update(two.as_ptr(), value.as_ptr(), uf::ANY) }),
            e(libc::E2BIG),
        ),
        (
            "array BPF_NOEXIST",
            // SAFETY: as above.
            Box::new(|| unsafe { array.prog_update(one.as_ptr(), value.as_ptr(), uf::NOEXIST) }),
            e(libc::EEXIST),
        ),
        (
            "queue empty",
            // SAFETY: `out` holds a value.
            Box::new(|| unsafe { queue.prog_pop(out.as_ptr() as *mut u8, true) }),
            e(libc::ENOENT),
        ),
        (
            "array delete",
            // SAFETY: as above.
            Box::new(|| unsafe { array.prog_delete(one.as_ptr()) }),
            e(libc::EINVAL),
        ),
    ];
    for (what, call, want) in &cases {
        let (got, allocations) = counted(call);
        assert_eq!(got, *want, "{what}: errno");
        assert_eq!(allocations, 0, "{what}: allocated on a program's path");
    }
    drop(cases);
    drop((hash, array, queue));
    store.destroy().unwrap();
}
