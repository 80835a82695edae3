//! The per-map structure lock. It lives in shared memory and may be held by a
//! thread of another process; if that process dies holding it, the next taker
//! notices, takes it over and asks the map to repair itself.

use std::sync::atomic::{AtomicU32, Ordering};

pub(crate) fn current_tid() -> u32 {
    crate::thread::pid_tgid() as u32
}

/// Takes a shared-memory lock word (for structures outside maps); `None` when the word
/// is no lock any more (see [`lock`]).
pub fn lock_word(word: &AtomicU32) -> Option<Guard<'_>> {
    lock(word, || false, || {})
}

/// The largest thread id Linux hands out (`PID_MAX_LIMIT` on 64-bit kernels).
const TID_LIMIT: u32 = 1 << 22;

/// Whether `tid` is a thread id at all; a lock or slot word holding anything else was
/// written by no thread of ours.
pub fn plausible_tid(tid: u32) -> bool {
    tid != 0 && tid <= TID_LIMIT
}

pub(crate) fn thread_alive(tid: u32) -> bool {
    // A value out of range would name a process group (negative) or nothing at all.
    if !plausible_tid(tid) {
        return false;
    }
    // SAFETY: signal 0 only checks for existence and permission.
    let r = unsafe { libc::kill(tid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// How long a lock may stay taken by one live holder before the waiter takes the word
/// for garbage: holders keep it for a few hundred instructions, but a holder preempted on
/// an overloaded machine was seen to keep a CPU slot past 1 s (two cores, six busy
/// processes), and a wrong verdict detaches what uses the object; 10 s is past any
/// preemption, and still ends the wait on a word a damaging writer left. Fuzz builds
/// (cargo-fuzz sets `cfg(fuzzing)`) wait 50 ms: there every such word is garbage, and
/// 10 s per input cut the store_files fuzzer from about 100 inputs a second to 11.
#[cfg(not(fuzzing))]
pub const PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);
#[cfg(fuzzing)]
pub const PATIENCE: std::time::Duration = std::time::Duration::from_millis(50);

pub struct Guard<'a> {
    word: &'a AtomicU32,
}

impl Drop for Guard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.word.store(0, Ordering::Release);
    }
}

/// Takes the lock, or `None` when the word cannot be a lock any more: it names no
/// thread, or one that has held it past all patience, or `damaged` says the structure
/// it guards was found damaged (then nobody waits). `repair` runs (with the lock held)
/// when the previous holder died while holding it.
#[inline]
pub fn lock<'a>(
    word: &'a AtomicU32,
    damaged: impl Fn() -> bool,
    repair: impl FnOnce(),
) -> Option<Guard<'a>> {
    let me = current_tid();
    // A free lock is taken here, inline in the map operation; waiting is out of line.
    if word
        .compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        match wait(word, me, &damaged) {
            Taken::Free => {}
            Taken::FromDead => repair(),
            Taken::Never => return None,
        }
    }
    Some(Guard { word })
}

enum Taken {
    Free,
    FromDead,
    Never,
}

/// Spins until `word` is taken for `me`, or gives up on a word that is no lock.
#[cold]
#[inline(never)]
fn wait(word: &AtomicU32, me: u32, damaged: &dyn Fn() -> bool) -> Taken {
    let mut spins: u32 = 0;
    let started = std::time::Instant::now();
    loop {
        let cur = word.load(Ordering::Relaxed);
        if cur == 0 {
            if word
                .compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Taken::Free;
            }
            continue;
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(1024) || !plausible_tid(cur) {
            if !plausible_tid(cur) || damaged() || started.elapsed() > PATIENCE {
                return Taken::Never;
            }
            if !thread_alive(cur)
                && word
                    .compare_exchange(cur, me, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                tracing::warn!(
                    dead_tid = cur,
                    "took over a map lock held by a dead thread; repairing the map"
                );
                return Taken::FromDead;
            }
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}
