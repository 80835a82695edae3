//! Whether the process is exiting: from then on thread-local state (the log formatter's
//! among it) may be gone, so nothing of GPU attach's logs.

use std::sync::atomic::{AtomicBool, Ordering};

static EXITING: AtomicBool = AtomicBool::new(false);

/// Marks the process as exiting; true the first time only, so that work done at exit
/// (registered more than once) runs once.
pub fn mark() -> bool {
    !EXITING.swap(true, Ordering::AcqRel)
}

/// Whether the process is exiting ([`mark`] was called).
pub fn is_exiting() -> bool {
    EXITING.load(Ordering::Relaxed)
}

/// Whether logging is still possible.
pub fn may_log() -> bool {
    !is_exiting()
}
