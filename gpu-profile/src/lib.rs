//! What the CPU's code paths cost on the GPU, and when each side did what, built on launch
//! events (`cuda:KERNEL:launch`, in `bpftime-gpu-attach`), which every kernel gets, PTX or
//! not.
//!
//! - [`flamegraph`]: the CPU stack of each launch call (with its Python frames, on a
//!   CPython thread), weighted by that launch's GPU time, as folded stacks
//!   (`flamegraph.pl` and inferno read them), as an SVG flame graph and as a pprof
//!   profile ([`pprof`]).
//! - [`timeline`]: traced calls, CUDA driver calls, launches, kernels and GPU probe lines
//!   on one clock, written as a Perfetto/Chrome trace.

pub mod flamegraph;
pub mod pprof;
pub mod timeline;

pub use bpftime_callstack::{containing_object, python_version, PythonError};
pub use flamegraph::{FlameGraphError, LaunchStacks, Written};
pub use timeline::{Name, Summary, Timeline, TimelineError};
