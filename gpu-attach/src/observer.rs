//! Watching what GPU attach sees, for a timeline: every call of an intercepted driver entry
//! point, on its calling thread, and every `bpf_trace_printk` line a GPU probe wrote, with
//! the GPU time it was written at.
//!
//! Data flows one way: GPU attach tells an [`Observer`] (the agent's timeline, in
//! `bpftime-gpu-profile`) and knows nothing of what it does. With no observer, an entry
//! point pays one relaxed load.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// A call of an intercepted driver entry point.
#[derive(Debug, Clone, Copy)]
pub struct ApiCall {
    /// The entry point's name (`cuLaunchKernel`, `cuLibraryLoadData`...).
    pub name: &'static str,
    /// `CLOCK_MONOTONIC` when the call came in and when it returned to the caller.
    pub begin_ns: u64,
    pub end_ns: u64,
    /// The driver's `CUresult`.
    pub result: u32,
}

/// A `bpf_trace_printk` (or bpftime's `puts`) line written by a GPU probe.
#[derive(Debug, Clone)]
pub struct GpuPrint {
    /// The device's ordinal.
    pub device: i32,
    /// When the probe wrote it, on `CLOCK_MONOTONIC` through the device's clock
    /// calibration (the clock `bpf_ktime_get_ns` reads there); `None` when the device's
    /// clock could not be calibrated.
    pub at_ns: Option<u64>,
    /// The calibration's error bound, either way.
    pub error_ns: u64,
    /// The SM that ran the probe, and the linear index of its block in the grid.
    pub sm: u32,
    pub block: u32,
    /// The grid's launch number in its context (`%gridid`): the driver numbers a context's
    /// launches in the order they were submitted, so every line of one launch has the same
    /// one, and a later launch a larger one.
    pub grid: u64,
    pub text: String,
}

/// What a timeline implements to hear of driver calls and GPU lines. Calls come on the
/// application's threads (API calls) and on GPU attach's own (prints), so they must be
/// cheap and must not call CUDA.
pub trait Observer: Send + Sync {
    fn api_call(&self, call: &ApiCall);
    fn gpu_print(&self, print: &GpuPrint);
}

static OBSERVING: AtomicBool = AtomicBool::new(false);
static OBSERVER: OnceLock<Arc<dyn Observer>> = OnceLock::new();

/// Makes `observer` this process's observer, from now on. There is one per process: a
/// second call is refused and gives `observer` back.
pub fn observe(observer: Arc<dyn Observer>) -> Result<(), Arc<dyn Observer>> {
    OBSERVER.set(observer)?;
    OBSERVING.store(true, Ordering::Release);
    Ok(())
}

/// The observer, when there is one.
fn observer() -> Option<&'static Arc<dyn Observer>> {
    if !OBSERVING.load(Ordering::Relaxed) {
        return None;
    }
    OBSERVER.get()
}

/// The time an entry point's call came in, when someone observes (0 otherwise).
#[inline]
pub(crate) fn call_begins() -> u64 {
    if !OBSERVING.load(Ordering::Relaxed) {
        return 0;
    }
    bpftime_gpu_device::clock::host_monotonic_ns()
}

/// Reports a call that began at `begin_ns` (from [`call_begins`]; 0: nobody observed).
#[inline]
pub(crate) fn call_ends(name: &'static str, begin_ns: u64, result: u32) {
    if begin_ns == 0 {
        return;
    }
    if let Some(o) = observer() {
        o.api_call(&ApiCall {
            name,
            begin_ns,
            end_ns: bpftime_gpu_device::clock::host_monotonic_ns(),
            result,
        });
    }
}

/// Reports a GPU line, when someone observes.
pub(crate) fn gpu_print(print: impl FnOnce() -> GpuPrint) {
    if let Some(o) = observer() {
        o.gpu_print(&print());
    }
}

/// Whether someone observes: GPU lines then need their times.
pub(crate) fn observing() -> bool {
    observer().is_some()
}
