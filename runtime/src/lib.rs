//! What a program calls while it runs: the helpers, over the store (`bpftime-store`) and
//! its maps (`bpftime-maps`), whose API this crate passes on so that the shim, the agent
//! and the tools name one crate.
//!
//! Programs reach maps through [`helpers`], which work on process-local [`Map`]
//! handles over the shared files.

mod bprintf;
pub mod helpers;
pub mod stack;
mod tsc_clock;

/// Sends logs of the shim or the agent to stderr, filtered by `BPFTIME_LOG`
/// (default: warnings). Safe to call more than once.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("BPFTIME_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

pub use bpftime_abi::{GPU_FLAMEGRAPH_ENV, TRACE_ENV};
pub use bpftime_maps::stack_trace::jhash2;
pub use bpftime_maps::{
    collect_garbage, ringbuf_commit, ArrayValues, Map, MapSpec, PerCpuValues, PerfRing,
    RecordOffer, ENOTSUPP,
};
pub use bpftime_store::{
    bpffs_relative, cgroup, cpu_number_offset, cpu_slots, gpu_probe, guard_mapping, hold,
    owner_alive, parse_cuda_section, possible_cpus, publish_btf, read_attach_hint, read_btf,
    report_to_attach, thread, Damage, Error, GpuAttachPoint, GpuProbeKind, GpuSectionError,
    GuardedMapping, InnerTemplate, LinkKind, LinkRecord, ObjectInfo, ObjectKind, PerfEventKind,
    PerfEventRecord, Pin, ProgramRecord, Result, Store, StoreLock, BPFFS_ROOT, CUDA_PROGRAM_PREFIX,
    CUDA_SECTION_PREFIX, DEFAULT_STORE_NAME, GPU_ACCESS_CONFIG_BIT, GPU_LAUNCH_CONFIG_BIT,
    GPU_SHARED_ACCESS_CONFIG_BIT, MEMCAPTURE, PAGE_SIZE, STORE_ENV, STORE_VERSION,
};
