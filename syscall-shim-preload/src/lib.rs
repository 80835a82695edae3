//! The syscall shim's preload layer: `libbpftime_syscall_shim.so`, which `bpftime load`,
//! `run` and `verify` preload into an unmodified loader. Its libc entry points adapt the
//! loader's `bpf()`, `perf_event_open`, `ioctl`, `mmap`, `epoll_*` and `close` calls on
//! our objects to the shim's core ([`bpftime_shim::Shim`]); other calls go on to libc.
//!
//! Two promises hold here whatever happens:
//! - Nothing reaches the kernel's eBPF: a `bpf()` call, a `perf_event_open` of an
//!   eBPF-only kind, or a `PERF_EVENT_IOC_SET_BPF` that the shim cannot serve (its store
//!   cannot be opened, say) fails with an errno and one line saying why, never passes on.
//! - No panic leaves an entry point: each runs its own work under the `ffi_guard!`, which
//!   turns a panic into the call's failure value and one line on stderr.
//!
//! It is a crate of its own, built only as a cdylib, so that no test binary can link these
//! definitions of `syscall` and `mmap` in place of libc's.

mod libbpf_handler;
mod preload;
