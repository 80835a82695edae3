//! What the CPU's code paths cost on the GPU, built on launch events (`cuda:KERNEL:launch`,
//! in `bpftime-gpu-attach`), which every kernel gets, PTX or not.
//!
//! - [`flamegraph`]: the CPU stack of each launch call, weighted by that launch's GPU time,
//!   as folded stacks (`flamegraph.pl` and inferno read them) and as an SVG flame graph.

pub mod flamegraph;

pub use flamegraph::{containing_object, FlameGraphError, LaunchStacks, Written};
