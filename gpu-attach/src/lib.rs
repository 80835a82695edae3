//! eBPF inside CUDA kernels: the GPU half of bpftime's attach (docs/ARCHITECTURE.md decision 11).
//!
//! - The text of device code (fatbins, PTX parsing and splicing, kernel names) is
//!   `bpftime-gpu-ptx`'s, the stage before this one.
//! - The device side (the driver API slice, device memory, the device runtime's map
//!   layouts, map replicas, the GPU clock) is `bpftime-gpu-device`'s.
//! - A probe's code (compiled once per process and set of inputs, and cached on disk) is
//!   `bpftime-gpu-probe`'s.
//! - The session (`install`, [`GpuAttach`]) intercepts the CUDA driver in a target
//!   process, builds instrumented modules, keeps map replicas on each device in sync and
//!   anchors the GPU clock to the host's.
//! - [`launch`] runs CPU programs at each launch of the kernels they name, and again with
//!   the launch's GPU times once it completed, for every kernel, PTX or not.
//! - [`observer`] tells a timeline of every intercepted driver call and every line a GPU
//!   probe printed, with its GPU time.
//! - [`scan`] finds the PTX of kernels whose modules were loaded before GPU attach
//!   started, in the fatbins of the ELF objects the process maps.
//! - The conformance suite's stand-alone GPU runner is `bpftime-conformance`'s.

mod entry_points;
mod error;
mod install;
pub mod launch;
pub mod observer;
pub mod scan;
mod session;

pub use bpftime_gpu_probe::probe_point;
pub use bpftime_gpu_ptx::ProbePoint;
pub use error::GpuAttachError;
pub use install::install;
pub use launch::{LaunchContext, LaunchProbe, PHASE_COMPLETED, PHASE_LAUNCHED};
pub use session::{
    after_exit_flush, cuda_loaded, installed, GpuAttach, GpuDevice, GpuProbe, InstallError,
};
