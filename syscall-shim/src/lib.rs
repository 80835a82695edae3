//! The syscall shim: preloaded into an unmodified eBPF loader (a libbpf tool,
//! bpftrace, bpftool), it serves the loader's `bpf()`, `perf_event_open`,
//! `ioctl`, `mmap`, `epoll_*` and `close` calls on eBPF objects from the
//! shared-memory store instead of the kernel.
//!
//! [`Shim`] is the core: a function from a command and its attribute bytes to
//! a result, testable without preloading. The preload layer, which adapts libc's
//! entry points to it, is a crate of its own (`syscall-shim-preload`, a cdylib
//! only): a test binary that links this core keeps libc's definitions whatever
//! features cargo unifies, so the kernel it compares with is the kernel.

mod attr;
mod btf;
mod core;
mod gpu_ring;
mod handed;
mod info;
mod map_cmds;
mod perf;
mod test_run;
#[cfg(test)]
mod test_support;
mod tracepoint;

pub use crate::core::{set_fd_observer, Object, ObjectRef, Shim, SysResult, KERNEL_BTF_ID};
pub use bpftime_prepare::{check_program, check_program_with_lines, source_lines, Rejection};
pub use gpu_ring::poll_gpu_ring;
pub use perf::{perf_attr_is_bpf, KprobePmu, UprobePmu, PERF_EVENT_IOC_SET_BPF};
pub use tracepoint::{served_tracefs_file, served_tracefs_path_exists, tracepoint_ids};
