//! The guard that every `extern "C"` function of ours runs its own work in.
//!
//! Our code runs inside someone else's process: libc's entry points interposed in a loader,
//! CUDA driver entry points detoured in an application, the starter's constructor. A panic
//! that reached the C caller would abort that process (a Rust panic cannot unwind through
//! an `extern "C"` frame). So the work is run under `catch_unwind`; a panic makes the call
//! fail the way the C function fails (an errno, a `CUresult`), is reported once per entry
//! point on stderr, and the process goes on.
//!
//! For tests, `BPFTIME_INJECT_PANIC=<entry point>` makes the guarded work of that entry
//! point panic (names as given to [`ffi_guard!`], such as `bpf`, `close` or
//! `cuLaunchKernel`), so that a test can show the application survives it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

/// The variable that names an entry point whose guarded work panics, for tests.
pub const INJECT_PANIC_ENV: &str = "BPFTIME_INJECT_PANIC";

/// One guarded entry point: its name and whether a panic in it was reported.
pub struct GuardSite {
    name: &'static str,
    reported: AtomicBool,
}

impl GuardSite {
    pub const fn new(name: &'static str) -> GuardSite {
        GuardSite {
            name,
            reported: AtomicBool::new(false),
        }
    }
}

static INJECTED_BY_CALL: AtomicBool = AtomicBool::new(false);
static INJECTED_NAME: Mutex<Option<&'static str>> = Mutex::new(None);

/// Makes the guarded work of entry point `name` panic from now on, as
/// `BPFTIME_INJECT_PANIC=name` does from the start: for tests that call an entry point
/// directly.
pub fn inject_panic(name: &'static str) {
    *INJECTED_NAME.lock().unwrap_or_else(|p| p.into_inner()) = Some(name);
    INJECTED_BY_CALL.store(true, Ordering::Release);
}

fn panic_injected(site: &str) -> bool {
    static FROM_ENV: OnceLock<Option<String>> = OnceLock::new();
    let from_env = FROM_ENV.get_or_init(|| {
        std::env::var(INJECT_PANIC_ENV)
            .ok()
            .filter(|s| !s.is_empty())
    });
    if from_env.as_deref() == Some(site) {
        return true;
    }
    INJECTED_BY_CALL.load(Ordering::Acquire)
        && *INJECTED_NAME.lock().unwrap_or_else(|p| p.into_inner()) == Some(site)
}

/// Runs `work`; if it panics, reports that once for `site` and returns `failed()` instead.
/// Use it through [`ffi_guard!`], which gives each call site its own [`GuardSite`].
pub fn run_guarded<R>(site: &GuardSite, failed: impl FnOnce() -> R, work: impl FnOnce() -> R) -> R {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        if panic_injected(site.name) {
            panic!("{INJECT_PANIC_ENV}={} asked for this panic", site.name);
        }
        work()
    }));
    match outcome {
        Ok(r) => r,
        Err(payload) => {
            if !site.reported.swap(true, Ordering::Relaxed) {
                report(site.name, payload.as_ref());
            }
            failed()
        }
    }
}

/// As [`run_guarded`], for entry points on a hot path (the helpers JIT code calls on every
/// probe hit): no check for an injected panic, nothing but the unwinding landing pad.
#[inline(always)]
pub fn run_guarded_hot<R>(
    site: &GuardSite,
    failed: impl FnOnce() -> R,
    work: impl FnOnce() -> R,
) -> R {
    match catch_unwind(AssertUnwindSafe(work)) {
        Ok(r) => r,
        Err(payload) => {
            if !site.reported.swap(true, Ordering::Relaxed) {
                report(site.name, payload.as_ref());
            }
            failed()
        }
    }
}

/// One line on stderr, written with `write(2)`: printing must not panic in turn when
/// stderr is closed, and must not take the locks the panicking code may have held.
fn report(name: &str, payload: &(dyn std::any::Any + Send)) {
    let why = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic");
    let line = format!(
        "bpftime: internal error in {name} ({why}); that call failed and the process goes on \
         (reported once; please report it)\n"
    );
    // SAFETY: writes our own buffer to fd 2; an error (a closed stderr) is ignored.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

/// `ffi_guard!(name, failed, work)`: runs the expression `work` under [`run_guarded`]; if
/// it panics, the expression `failed` is the result.
#[macro_export]
macro_rules! ffi_guard {
    ($name:expr, $failed:expr, $work:expr $(,)?) => {{
        static SITE: $crate::GuardSite = $crate::GuardSite::new($name);
        $crate::run_guarded(&SITE, || $failed, || $work)
    }};
}

/// `ffi_guard_hot!(name, failed, work)`: as [`ffi_guard!`], through [`run_guarded_hot`].
#[macro_export]
macro_rules! ffi_guard_hot {
    ($name:expr, $failed:expr, $work:expr $(,)?) => {{
        static SITE: $crate::GuardSite = $crate::GuardSite::new($name);
        $crate::run_guarded_hot(&SITE, || $failed, || $work)
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_gives_the_failure_value_and_the_next_call_works() {
        static SITE: GuardSite = GuardSite::new("test_site");
        let failed = run_guarded(&SITE, || -1, || -> i32 { panic!("boom") });
        assert_eq!(failed, -1);
        assert!(SITE.reported.load(Ordering::Relaxed));
        assert_eq!(run_guarded(&SITE, || -1, || 7), 7);
    }

    #[test]
    fn an_injected_panic_fails_only_its_own_entry_point() {
        inject_panic("injected_site");
        assert_eq!(ffi_guard!("injected_site", -5, 0), -5);
        assert_eq!(ffi_guard!("another_site", -5, 0), 0);
    }

    #[test]
    fn the_hot_guard_catches_a_panic_too() {
        assert_eq!(ffi_guard_hot!("hot_site", 3, panic!("hot")), 3);
        assert_eq!(ffi_guard_hot!("hot_site_ok", 3, 4), 4);
    }

    #[test]
    fn the_macro_gives_each_call_site_its_own_report() {
        let a = ffi_guard!("site_a", 1, panic!("first"));
        let b = ffi_guard!("site_b", 2, 0);
        assert_eq!((a, b), (1, 0));
    }
}
