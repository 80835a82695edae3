//! The syscall shim: preloaded into an unmodified eBPF loader (a libbpf tool,
//! bpftrace, bpftool), it serves the loader's `bpf()`, `perf_event_open`,
//! `ioctl`, `mmap`, `epoll_*` and `close` calls on eBPF objects from the
//! shared-memory store instead of the kernel.
//!
//! [`Shim`] is the core: a function from a command and its attribute bytes to
//! a result, testable without preloading. The `preload` module only adapts
//! libc's entry points to it.

mod attr;
mod btf;
mod core;
mod info;
#[cfg(feature = "preload")]
mod libbpf_handler;
mod perf;
#[cfg(feature = "preload")]
mod preload;
#[cfg(not(feature = "preload"))]
mod preload {
    pub(crate) fn mark_fd(_fd: std::os::fd::RawFd, _on: bool) {}
}
mod program;
mod test_run;

pub use crate::core::{Object, ObjectRef, Shim};
pub use perf::{KprobePmu, UprobePmu};
pub use program::{check_program, check_program_with_lines, source_lines, Rejection};
