//! Who the current thread is: its `tgid << 32 | tid`, cached per thread (a system call
//! costs more than most programs) and kept right across `fork`.

use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, AtomicU64, Ordering};
use std::sync::OnceLock;

thread_local! {
    static IDS: Cell<(u64, u64)> = const { Cell::new((u64::MAX, 0)) };
}

/// Bumped in a forked child, so cached process ids are refreshed.
static FORKS: AtomicU64 = AtomicU64::new(0);

/// Offset from the thread pointer of 8 bytes of static TLS that cache [`pid_tgid`], or 0
/// while the ids are cached in `IDS` (see [`use_static_tls_ids`]).
static IDS_TP_OFFSET: AtomicIsize = AtomicIsize::new(0);

extern "C" fn after_fork_in_child() {
    // The child's only thread is this one: clearing its static slot clears them all.
    forget_cached_ids();
}

/// Forgets the ids this thread cached, so that the next read asks the kernel: for a new
/// process or thread that started with a copy of, or a share in, its maker's memory (a
/// `fork` or `clone` made without the C library's `fork`, whose handler does this too,
/// and the maker of a `vfork` child, which wrote its own ids there).
pub fn forget_cached_ids() {
    FORKS.fetch_add(1, Ordering::Relaxed);
    let offset = IDS_TP_OFFSET.load(Ordering::Relaxed);
    if offset != 0 {
        // SAFETY: `use_static_tls_ids`'s caller vouched for 8 bytes of static TLS here.
        unsafe { crate::mapping::write_tls_word(offset, 0) };
    }
}

/// Keeps each thread's `tgid << 32 | tid` in 8 bytes of static TLS at `tp_offset` from the
/// thread pointer, 0 until first read. A thread-local of a `dlopen`ed library (the agent)
/// costs a `__tls_get_addr` call per access, and the ids are read by every map lock and
/// `bpf_get_current_pid_tgid`; static TLS is one load.
///
/// # Safety
/// `tp_offset` must be the offset of 8 bytes, 8-aligned, in the static TLS block of a
/// module that stays loaded (an initial-exec variable, `var@gottpoff`), zero in every
/// thread that has not read its ids yet, and used by nothing else.
pub unsafe fn use_static_tls_ids(tp_offset: isize) {
    init_process();
    IDS_TP_OFFSET.store(tp_offset, Ordering::Relaxed);
}

/// The offset [`use_static_tls_ids`] was given, 0 before.
pub fn ids_tp_offset() -> isize {
    IDS_TP_OFFSET.load(Ordering::Relaxed)
}

fn fresh_pid_tgid() -> u64 {
    // SAFETY: getpid and gettid have no preconditions.
    unsafe { ((libc::getpid() as u64) << 32) | libc::gettid() as u64 }
}

/// Registers what helpers need to stay right across `fork`; call once per process.
pub fn init_process() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        // SAFETY: registers a handler that only bumps an atomic.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    });
}

/// Counts forks, so that per-thread caches of ids can tell they are stale in a child.
pub fn fork_generation() -> u64 {
    init_process();
    FORKS.load(Ordering::Relaxed)
}

/// This thread's `tgid << 32 | tid`, as `bpf_get_current_pid_tgid` gives it, cached per
/// thread (a system call costs more than most programs) and refreshed in a forked child.
#[inline]
pub fn pid_tgid() -> u64 {
    let offset = IDS_TP_OFFSET.load(Ordering::Relaxed);
    if offset != 0 {
        // SAFETY: `use_static_tls_ids`'s caller vouched for the slot. A forked child's
        // slot was cleared by the fork handler, registered before the offset was set.
        unsafe {
            let v = crate::mapping::read_tls_word(offset);
            if v != 0 {
                return v;
            }
            let v = fresh_pid_tgid();
            crate::mapping::write_tls_word(offset, v);
            return v;
        }
    }
    IDS.with(|c| {
        let (g, v) = c.get();
        // No value is cached before the fork handler is registered (below), so a cached
        // value from before a fork always meets a bumped count in the child; the
        // registration's check stays off the path every map lock and helper call takes.
        if g == FORKS.load(Ordering::Relaxed) {
            return v;
        }
        let gen = fork_generation();
        let v = fresh_pid_tgid();
        c.set((gen, v));
        v
    })
}
