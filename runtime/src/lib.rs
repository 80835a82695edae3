//! The shared-memory store and everything that lives in it.
//!
//! A store is a directory of POSIX shared-memory files (`/dev/shm/bpftime-<uid>-<name>/`),
//! which belongs to one user (`store_dir.rs` says how that is checked),
//! one file per object: maps, programs, links and perf events. Any number of
//! processes open it by name; it grows by adding files, so there is no fixed
//! segment to run out of. Every file starts with a versioned `#[repr(C)]` header
//! and is published with an atomic rename, so a process that dies mid-creation
//! leaves at most an ignored temporary file.
//!
//! An object lives while a descriptor, a pin or another object refers to it, as in
//! the kernel (`lifetime.rs` says how, across processes), and bpffs pins live in the
//! store (`pins.rs`).
//!
//! Programs reach maps through [`helpers`], which work on process-local [`Map`]
//! handles over the shared files.

mod attach_hint;
mod bprintf;
pub mod cgroup;
pub mod cpu_slots;
mod error;
mod fault;
mod gpu_probe;
pub mod helpers;
mod layout;
mod lifetime;
mod mapping;
mod maps;
mod objects;
mod perfbuf;
mod pins;
pub mod stack;
mod store;
mod store_dir;
mod tsc_clock;

pub use attach_hint::{read_attach_hint, report_to_attach};
pub use error::{Error, Result};
pub use fault::{guard_mapping, Damage, GuardedMapping};
pub use gpu_probe::{
    gpu_probe, parse_cuda_section, GpuAttachPoint, GpuProbeKind, GpuSectionError,
    CUDA_PROGRAM_PREFIX, CUDA_SECTION_PREFIX, GPU_ACCESS_CONFIG_BIT, GPU_LAUNCH_CONFIG_BIT,
    GPU_SHARED_ACCESS_CONFIG_BIT, MEMCAPTURE,
};

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
pub use layout::{InnerTemplate, ObjectKind, PAGE_SIZE, STORE_VERSION};
pub use lifetime::{hold, StoreLock};
pub use maps::stack_trace::jhash2;
pub use maps::{
    cpu_number_offset, possible_cpus, ringbuf_commit, ArrayValues, Map, MapSpec, PerCpuValues,
    RecordOffer, ENOTSUPP,
};
pub use objects::{
    publish_btf, read_btf, LinkKind, LinkRecord, PerfEventKind, PerfEventRecord, ProgramRecord,
};
pub use perfbuf::PerfRing;
pub use pins::{bpffs_relative, Pin, BPFFS_ROOT};
pub use store::{owner_alive, ObjectInfo, Store, DEFAULT_STORE_NAME, STORE_ENV};

pub use bpftime_abi::{GPU_FLAMEGRAPH_ENV, TRACE_ENV};
