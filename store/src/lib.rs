//! The shared-memory store: where every object of a set of processes lives.
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
//! The maps' contents are `bpftime-maps`' business; this crate holds what every object
//! shares: the files, their headers, the lock words in them ([`lock`]), the thread and
//! CPU a program runs as ([`thread`], [`cpu`], [`cpu_slots`]).

mod attach_hint;
pub mod cgroup;
pub mod cpu;
pub mod cpu_slots;
mod error;
mod fault;
mod gpu_probe;
pub mod layout;
mod lifetime;
pub mod lock;
pub mod mapping;
mod objects;
mod pins;
mod store;
pub mod store_dir;
pub mod thread;

pub use attach_hint::{read_attach_hint, report_to_attach};
pub use cpu::possible_cpus;
pub use cpu_slots::cpu_number_offset;
pub use error::{Error, Result};
pub use fault::{guard_mapping, Damage, GuardedMapping};
pub use gpu_probe::{
    gpu_probe, parse_cuda_section, GpuAttachPoint, GpuProbeKind, GpuSectionError,
    CUDA_PROGRAM_PREFIX, CUDA_SECTION_PREFIX, GPU_ACCESS_CONFIG_BIT, GPU_LAUNCH_CONFIG_BIT,
    GPU_SHARED_ACCESS_CONFIG_BIT, MEMCAPTURE,
};
pub use layout::{InnerTemplate, ObjectKind, PAGE_SIZE, STORE_VERSION};
pub use lifetime::{hold, StoreLock};
pub use objects::{
    publish_btf, read_btf, LinkKind, LinkRecord, PerfEventKind, PerfEventRecord, ProgramRecord,
};
pub use pins::{bpffs_relative, Pin, BPFFS_ROOT};
pub use store::{
    check_header, map_fifo_name, new_object_header, open_fifo, open_object_in, owner_alive,
    perf_fifo_name, perf_ring_name, ObjectInfo, Store, DEFAULT_STORE_NAME, STORE_ENV, TRACE_PIPE,
};
