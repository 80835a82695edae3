//! The per-map structure lock. It lives in shared memory and may be held by a
//! thread of another process; if that process dies holding it, the next taker
//! notices, takes it over and asks the map to repair itself.

use std::sync::atomic::{AtomicU32, Ordering};

pub(crate) fn current_tid() -> u32 {
    crate::helpers::pid_tgid() as u32
}

pub(crate) fn thread_alive(tid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    let r = unsafe { libc::kill(tid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

pub(crate) struct Guard<'a> {
    word: &'a AtomicU32,
}

impl Drop for Guard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.word.store(0, Ordering::Release);
    }
}

/// Takes the lock. `repair` runs (with the lock held) when the previous holder
/// died while holding it.
#[inline]
pub(crate) fn lock<'a>(word: &'a AtomicU32, repair: impl FnOnce()) -> Guard<'a> {
    let me = current_tid();
    // A free lock is taken here, inline in the map operation; waiting is out of line.
    if word
        .compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
        && wait(word, me)
    {
        repair();
    }
    Guard { word }
}

/// Spins until `word` is taken for `me`; true when it was taken over from a holder
/// that died.
#[cold]
#[inline(never)]
fn wait(word: &AtomicU32, me: u32) -> bool {
    let mut spins: u32 = 0;
    loop {
        let cur = word.load(Ordering::Relaxed);
        if cur == 0 {
            if word
                .compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return false;
            }
            continue;
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(1024) {
            if !thread_alive(cur)
                && word
                    .compare_exchange(cur, me, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                tracing::warn!(
                    dead_tid = cur,
                    "took over a map lock held by a dead thread; repairing the map"
                );
                return true;
            }
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}
