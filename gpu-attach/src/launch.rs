//! Launch events: a CPU program at each launch of the kernels it names (`cuda:KERNEL:launch`),
//! for every kernel, PTX or not.
//!
//! The program runs twice per launch, with the same context:
//! - on the launching thread, right after the launch call returned (`phase` =
//!   [`PHASE_LAUNCHED`]): the kernel's name, grid, block, dynamic shared memory, stream,
//!   device, the host time of the call and the driver's result. The CPU stack there is the
//!   code path that launched the kernel.
//! - once the launch completed on the GPU (`phase` = [`PHASE_COMPLETED`]), on GPU attach's
//!   own thread: the same fields plus the kernel's GPU start and end on the host's
//!   `CLOCK_MONOTONIC` (the clock `bpf_ktime_get_ns` reads) and the bound on their error.
//!
//! GPU times come from two CUDA events recorded on the launch's stream around the launch,
//! as an application times its kernels, related to the host clock by a calibration of the
//! context's event clock (`EventClock`). The start is never earlier than the launch call:
//! on an idle GPU the start event completes before the launch has reached the GPU.

use std::sync::Arc;
use std::time::Instant;

/// `phase` of the run at the launch call.
pub const PHASE_LAUNCHED: u32 = 0;
/// `phase` of the run once the launch completed, with GPU times.
pub const PHASE_COMPLETED: u32 = 1;
/// Bytes of the kernel name carried in the context, NUL included; longer names are cut.
pub const LAUNCH_NAME_BYTES: usize = 68;

/// What a launch program's context points to: `struct bpftime_cuda_launch` of
/// `bpf-examples/common/cuda_launch.h`. 168 bytes, the size of the kprobe context the
/// verifier checks CPU programs against, so every field is a plain context read.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct LaunchContext {
    /// Unique in the process; the same in both runs of one launch.
    pub launch_id: u64,
    /// The `CUfunction` launched (as the application passed it).
    pub function: u64,
    /// The `CUstream`; 0 is the legacy default stream, 2 the per-thread one.
    pub stream: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    /// The device's ordinal.
    pub device: i32,
    /// `CLOCK_MONOTONIC` when the launch call was made.
    pub cpu_ns: u64,
    /// The kernel's start and end on the GPU, on `CLOCK_MONOTONIC` (0 at the launch).
    pub gpu_start_ns: u64,
    pub gpu_end_ns: u64,
    /// The bound on the error of the GPU times, either way.
    pub clock_error_ns: u32,
    pub phase: u32,
    /// The driver's `CUresult` for the launch call.
    pub result: u32,
    /// Bytes of the name before its NUL (at most `LAUNCH_NAME_BYTES - 1`).
    pub name_len: u32,
    /// The kernel's id as memory-access probes see it ([`bpftime_gpu_ptx::ptx::kernel_id`]).
    pub kernel_id: u32,
    /// The kernel's (mangled) name, NUL-terminated.
    pub name: [u8; LAUNCH_NAME_BYTES],
}

const _: () = assert!(std::mem::size_of::<LaunchContext>() == 168);

impl LaunchContext {
    pub(crate) fn new(name: &str, geometry: Geometry, stream: u64, device: i32) -> Self {
        let mut ctx = LaunchContext {
            launch_id: 0,
            function: 0,
            stream,
            grid: geometry.grid,
            block: geometry.block,
            shared_mem_bytes: geometry.shared_mem_bytes,
            device,
            cpu_ns: 0,
            gpu_start_ns: 0,
            gpu_end_ns: 0,
            clock_error_ns: 0,
            phase: PHASE_LAUNCHED,
            result: 0,
            name_len: 0,
            kernel_id: bpftime_gpu_ptx::ptx::kernel_id(name),
            name: [0; LAUNCH_NAME_BYTES],
        };
        let bytes = name.as_bytes();
        let n = bytes.len().min(LAUNCH_NAME_BYTES - 1);
        ctx.name[..n].copy_from_slice(&bytes[..n]);
        ctx.name_len = n as u32;
        ctx
    }

    /// The name as carried (cut at `LAUNCH_NAME_BYTES - 1` bytes).
    pub fn name(&self) -> String {
        String::from_utf8_lossy(&self.name[..self.name_len as usize]).into_owned()
    }
}

/// Runs a tool's program on a launch's context; the `&str` is the kernel's whole mangled
/// name, which the context carries cut at [`LAUNCH_NAME_BYTES`].
pub type LaunchHandler = Arc<dyn Fn(&mut LaunchContext, &str) + Send + Sync>;

/// A program on `cuda:KERNEL:launch`.
pub struct LaunchProbe {
    /// The store link that attached it.
    pub link_id: u32,
    pub name: String,
    /// The kernels it watches: a mangled or demangled name, with globs.
    pub pattern: String,
    pub run: LaunchHandler,
}

/// The geometry a launch call was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
}

/// A context's CUDA event clock against the host's: an event's host time is its elapsed
/// time since `base` plus `offset_ns`, within `error_ns`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EventClock {
    /// A completed event of the context.
    pub base: bpftime_gpu_device::cuda::Handle,
    pub offset_ns: i64,
    pub error_ns: u64,
    pub taken: Instant,
}

/// `cuEventElapsedTime` resolves about half a microsecond (CUDA's documentation).
pub(crate) const EVENT_RESOLUTION_NS: u64 = 500;

impl EventClock {
    /// The host time of an event `elapsed_ms` after `base` (negative: before it).
    pub fn host_ns(&self, elapsed_ms: f32) -> u64 {
        let rel = (elapsed_ms as f64 * 1e6).round() as i64;
        (rel + self.offset_ns).max(0) as u64
    }

    /// The bound on a time from [`host_ns`](Self::host_ns).
    pub fn bound_ns(&self) -> u32 {
        (self.error_ns + EVENT_RESOLUTION_NS).min(u32::MAX as u64) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn the_context_has_the_layout_the_header_declares() {
        // bpf-examples/common/cuda_launch.h; tests/tests/gpu_without_gpu.rs compiles the
        // header and compares the two.
        assert_eq!(offset_of!(LaunchContext, launch_id), 0);
        assert_eq!(offset_of!(LaunchContext, function), 8);
        assert_eq!(offset_of!(LaunchContext, stream), 16);
        assert_eq!(offset_of!(LaunchContext, grid), 24);
        assert_eq!(offset_of!(LaunchContext, block), 36);
        assert_eq!(offset_of!(LaunchContext, shared_mem_bytes), 48);
        assert_eq!(offset_of!(LaunchContext, device), 52);
        assert_eq!(offset_of!(LaunchContext, cpu_ns), 56);
        assert_eq!(offset_of!(LaunchContext, gpu_start_ns), 64);
        assert_eq!(offset_of!(LaunchContext, gpu_end_ns), 72);
        assert_eq!(offset_of!(LaunchContext, clock_error_ns), 80);
        assert_eq!(offset_of!(LaunchContext, phase), 84);
        assert_eq!(offset_of!(LaunchContext, result), 88);
        assert_eq!(offset_of!(LaunchContext, name_len), 92);
        assert_eq!(offset_of!(LaunchContext, kernel_id), 96);
        assert_eq!(offset_of!(LaunchContext, name), 100);
    }

    #[test]
    fn long_names_are_cut_and_terminated() {
        let g = Geometry {
            grid: [4096, 1, 1],
            block: [256, 1, 1],
            shared_mem_bytes: 0,
        };
        let long = "k".repeat(200);
        let c = LaunchContext::new(&long, g, 0, 0);
        assert_eq!(c.name_len as usize, LAUNCH_NAME_BYTES - 1);
        assert_eq!(c.name[LAUNCH_NAME_BYTES - 1], 0);
        assert_eq!(c.name(), "k".repeat(LAUNCH_NAME_BYTES - 1));
        let c = LaunchContext::new("_Z9vectorAddPKfS0_Pfi", g, 7, 1);
        assert_eq!(c.name(), "_Z9vectorAddPKfS0_Pfi");
        assert_eq!(
            c.kernel_id,
            bpftime_gpu_ptx::ptx::kernel_id("_Z9vectorAddPKfS0_Pfi")
        );
        assert_eq!(
            (c.grid, c.block, c.stream, c.device),
            ([4096, 1, 1], [256, 1, 1], 7, 1)
        );
    }

    #[test]
    fn event_times_land_on_the_host_clock() {
        let c = EventClock {
            base: 1,
            offset_ns: 5_000_000,
            error_ns: 1_200,
            taken: Instant::now(),
        };
        assert_eq!(c.host_ns(0.25), 5_250_000);
        assert_eq!(c.host_ns(-1.0), 4_000_000);
        assert_eq!(c.bound_ns(), 1_700);
    }
}
