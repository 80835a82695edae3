//! Detours on functions of this test binary: the replacement runs in place of the function,
//! calls the original through the relocated prologue, and the function comes back whole.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use bpftime_attach::{attach_uprobe, detour, remove_detour, Detour};

#[inline(never)]
extern "C" fn scale(a: u64, b: u64) -> u64 {
    black_box(a).wrapping_mul(7) ^ black_box(b).rotate_left(9)
}

static ORIGINAL: AtomicUsize = AtomicUsize::new(0);
static REPLACED_CALLS: AtomicU64 = AtomicU64::new(0);

/// Swaps the arguments and adds one to the result, through the original.
extern "C" fn scale_replacement(a: u64, b: u64) -> u64 {
    REPLACED_CALLS.fetch_add(1, Ordering::Relaxed);
    // SAFETY: ORIGINAL holds `Detour::original` of `scale`, same signature.
    let original: extern "C" fn(u64, u64) -> u64 =
        unsafe { std::mem::transmute(ORIGINAL.load(Ordering::Acquire)) };
    original(b, a).wrapping_add(1)
}

fn expected(a: u64, b: u64) -> u64 {
    a.wrapping_mul(7) ^ b.rotate_left(9)
}

#[test]
fn replacement_runs_and_calls_the_original_from_many_threads() {
    let f = scale as *const () as usize;
    let call = black_box(scale as extern "C" fn(u64, u64) -> u64);
    assert_eq!(call(3, 4), expected(3, 4));
    // Threads call all along: before, during and after the patch.
    let stop = Arc::new(AtomicBool::new(false));
    let wrong = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (stop, wrong) = (stop.clone(), wrong.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let (a, b) = (t * 1000 + n, n);
                    let r = call(a, b);
                    if r != expected(a, b) && r != expected(b, a).wrapping_add(1) {
                        wrong.fetch_add(1, Ordering::Relaxed);
                    }
                    n += 1;
                }
            })
        })
        .collect();
    // SAFETY: `scale` is a whole function of this binary; the replacement has its
    // signature and lives for the whole test binary.
    let d: Detour =
        unsafe { detour(f, scale_replacement as *const () as usize, &ORIGINAL) }.unwrap();
    assert_eq!(ORIGINAL.load(Ordering::Relaxed), d.original);
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(call(5, 6), expected(6, 5).wrapping_add(1));
    assert!(REPLACED_CALLS.load(Ordering::Relaxed) > 0);
    // A second detour or a uprobe at the same place is refused.
    // SAFETY: refused before anything is written.
    static UNUSED: AtomicUsize = AtomicUsize::new(0);
    assert!(unsafe { detour(f, scale_replacement as *const () as usize, &UNUSED) }.is_err());
    // SAFETY: as above.
    let uprobe = unsafe { attach_uprobe(f, Arc::new(|_| {})) };
    assert!(uprobe.is_err(), "a uprobe on a detoured function");
    remove_detour(d).unwrap();
    let before = REPLACED_CALLS.load(Ordering::Relaxed);
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(call(5, 6), expected(5, 6));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(wrong.load(Ordering::Relaxed), 0);
    // Threads that were inside the replacement when it was removed finish there; none
    // enter it after.
    let after = REPLACED_CALLS.load(Ordering::Relaxed);
    assert!(
        after - before < 8,
        "{} replaced calls after removal",
        after - before
    );
    // The original stays callable after removal.
    // SAFETY: `original` keeps `scale`'s signature for good.
    let original: extern "C" fn(u64, u64) -> u64 = unsafe { std::mem::transmute(d.original) };
    assert_eq!(original(1, 2), expected(1, 2));
}

#[inline(never)]
extern "C" fn probed(a: u64) -> u64 {
    black_box(a).wrapping_mul(3)
}

/// A function a uprobe watches is not detoured: the detour's jump would go over the
/// hook's, and its trampoline would never run again.
#[test]
fn a_hooked_function_is_not_detoured() {
    let f = probed as *const () as usize;
    let hits = Arc::new(AtomicU64::new(0));
    let h = hits.clone();
    // SAFETY: `probed` is a whole function of this binary.
    unsafe {
        attach_uprobe(
            f,
            Arc::new(move |_| {
                h.fetch_add(1, Ordering::Relaxed);
            }),
        )
    }
    .unwrap();
    static UNUSED: AtomicUsize = AtomicUsize::new(0);
    // SAFETY: refused before anything is written.
    let refused = unsafe { detour(f, scale_replacement as *const () as usize, &UNUSED) };
    let err = refused.expect_err("a detour over a uprobe");
    assert!(err.to_string().contains("uprobe"), "{err}");
    assert_eq!(black_box(probed as extern "C" fn(u64) -> u64)(5), 15);
    assert_eq!(hits.load(Ordering::Relaxed), 1, "the hook still runs");
}
