//! The application's own SIGTRAP handler, installed before the first hook, still gets every
//! SIGTRAP that is not an `int3` at a hooked address: one it raises or is sent, and one of
//! its own `int3`s, while a hook's trap handler is in place (and a hooked function keeps
//! working meanwhile).

use std::hint::black_box;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use bpftime_attach::{attach_uprobe, detach, Handler};

static APP_TRAPS: AtomicUsize = AtomicUsize::new(0);
static APP_LAST_CODE: AtomicI32 = AtomicI32::new(0);

extern "C" fn app_on_sigtrap(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    APP_TRAPS.fetch_add(1, Ordering::SeqCst);
    // SAFETY: the kernel hands an SA_SIGINFO handler a valid siginfo_t.
    APP_LAST_CODE.store(unsafe { (*info).si_code }, Ordering::SeqCst);
}

#[inline(never)]
extern "C" fn hooked(x: u64) -> u64 {
    black_box(x).wrapping_mul(3) ^ 0x55
}

#[test]
fn sigtraps_that_are_not_our_int3s_reach_the_applications_handler() {
    // SAFETY: a zeroed sigaction is a valid "no handler, empty mask" value; the handler is
    // async-signal-safe (atomics only).
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = app_on_sigtrap as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO;
        assert_eq!(
            libc::sigaction(libc::SIGTRAP, &action, std::ptr::null_mut()),
            0
        );
    }
    let hits = Arc::new(AtomicU64::new(0));
    let h = hits.clone();
    let handler: Handler = Arc::new(move |_| {
        h.fetch_add(1, Ordering::Relaxed);
    });
    // SAFETY: `hooked` is a function of this binary, called only through Rust.
    let id = unsafe { attach_uprobe(hooked as *const () as usize, handler) }.expect("attaches");
    assert_eq!(hooked(7), (7 * 3) ^ 0x55);
    assert_eq!(hits.load(Ordering::Relaxed), 1);

    // SAFETY: raise has no preconditions; the handler above takes it.
    assert_eq!(unsafe { libc::raise(libc::SIGTRAP) }, 0);
    assert_eq!(APP_TRAPS.load(Ordering::SeqCst), 1, "a raised SIGTRAP");
    assert_eq!(APP_LAST_CODE.load(Ordering::SeqCst), libc::SI_TKILL);

    // SAFETY: the application's handler returns past the `int3`, as the kernel resumes.
    unsafe { std::arch::asm!("int3") };
    assert_eq!(
        APP_TRAPS.load(Ordering::SeqCst),
        2,
        "the application's own int3"
    );
    assert_eq!(APP_LAST_CODE.load(Ordering::SeqCst), libc::SI_KERNEL);

    assert_eq!(hooked(8), (8 * 3) ^ 0x55);
    assert_eq!(hits.load(Ordering::Relaxed), 2);
    detach(id).unwrap();
}
