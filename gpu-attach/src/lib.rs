//! eBPF inside CUDA kernels: the GPU half of bpftime's attach (docs/ARCHITECTURE.md decision 11).
//!
//! - The text of device code (fatbins, PTX parsing and splicing, kernel names) is
//!   `bpftime-gpu-ptx`'s, the stage before this one.
//! - [`device_maps`] holds the layouts the device runtime (device/runtime.c, compiled into
//!   every probe) works on, and the host-side logic of keeping them in step with the store.
//! - The session (`install`, [`GpuAttach`]) intercepts the CUDA driver in a target
//!   process, builds instrumented modules, keeps map replicas on each device in sync and
//!   anchors the GPU clock to the host's ([`clock`]).
//! - [`launch`] runs CPU programs at each launch of the kernels they name, and again with
//!   the launch's GPU times once it completed, for every kernel, PTX or not.
//! - [`observer`] tells a timeline of every intercepted driver call and every line a GPU
//!   probe printed, with its GPU time.
//! - [`scan`] finds the PTX of kernels whose modules were loaded before GPU attach
//!   started, in the fatbins of the ELF objects the process maps.
//! - The conformance suite's stand-alone GPU runner is `bpftime-conformance`'s.

mod arena;
pub mod clock;
mod cuda;
pub mod device_maps;
mod entry_points;
pub mod launch;
pub mod observer;
pub mod probe;
mod replica;
pub mod scan;
mod session;
mod tensor_maps;

pub use bpftime_gpu_ptx::ProbePoint;
pub use launch::{LaunchContext, LaunchProbe, PHASE_COMPLETED, PHASE_LAUNCHED};
pub use session::{
    after_exit_flush, cuda_loaded, install, installed, GpuAttach, GpuDevice, GpuProbe, InstallError,
};
