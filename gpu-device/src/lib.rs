//! The device side of GPU attach (docs/ARCHITECTURE.md, decision 5): what runs on or
//! moves bytes to an NVIDIA GPU, below the session that decides when.
//!
//! - [`cuda`] is the slice of the CUDA driver API GPU attach calls, resolved from the
//!   libcuda the process already loaded; [`arena`] places device memory at addresses
//!   that repeat from run to run.
//! - [`device_maps`] holds the layouts the device runtime (device/runtime.c, compiled
//!   into every probe by build.rs) works on, and the plain-data logic of keeping them in
//!   step with the store; [`replica`] moves those bytes: a map's copy on one device,
//!   pushed before launches and pulled after.
//! - [`sync_kernels`] are the kernels of ours that apply the CPU's changes to arrays
//!   and fold sharded arrays, in the application's streams.
//! - [`tensor_maps`] keeps the tensor maps the process encoded, as the table the device
//!   runtime finds a tensor copy's global memory in.
//! - [`clock`] anchors the GPU's clock to the host's.
//! - [`exiting`] says whether the process is past the point where logging works.

pub mod arena;
pub mod clock;
pub mod cuda;
pub mod device_maps;
pub mod exiting;
pub mod replica;
pub mod sync_kernels;
pub mod tensor_maps;
