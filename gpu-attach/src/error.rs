//! Why GPU attach could not do something for a context, a probe or a kernel.
//!
//! Answers are kept (a probe's code is made once per process, a kernel whose PTX is
//! missing is looked for once per device), so the error is `Clone`; the sources that are
//! not are held behind an `Arc`.

use std::sync::Arc;

use bpftime_gpu_device::cuda::CudaError;
use bpftime_gpu_device::replica::ReplicaError;
use bpftime_gpu_probe::ProbeError;
use bpftime_gpu_ptx::fatbin::FatbinError;
use bpftime_jit_ptx::CompileError;
use thiserror::Error;

use crate::scan::Missing;
use bpftime_gpu_device::tensor_maps::TensorMapError;

#[derive(Debug, Clone, Error)]
pub enum GpuAttachError {
    /// A driver call failed (the error names the call and the driver's answer).
    #[error(transparent)]
    Cuda(#[from] CudaError),
    #[error("its device is unknown ({0})")]
    UnknownDevice(CudaError),
    #[error(transparent)]
    Replica(Arc<ReplicaError>),
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error("a NUL byte in text for the driver (PTX or a name)")]
    NulInPtx,
    #[error("the probe's compilation panicked")]
    CompilePanicked,
    #[error("no thread to compile it: {0}")]
    NoThread(Arc<std::io::Error>),
    /// The PTX of a kernel loaded before GPU attach started is in no object the process
    /// maps.
    #[error(transparent)]
    NoPtx(Arc<Missing>),
    /// A kernel's function handle came without its module (no `cuFuncGetModule`).
    #[error("the driver does not say which module it is in (cuFuncGetModule)")]
    ModuleUnknown,
    /// The image a module was loaded from has no PTX GPU attach can read.
    #[error(transparent)]
    Fatbin(Arc<FatbinError>),
    #[error("no CUDA event could be made")]
    NoEvent,
    #[error("no clock sample was usable")]
    NoClockSample,
    #[error(transparent)]
    TensorMap(#[from] TensorMapError),
    /// An instrumented module's variables are the application's, copied in and out around
    /// each launch: one that cannot be paired would split the kernel's state.
    #[error(
        "its module's variable {variable} cannot be found in the application's library \
         (this driver has no cuLibraryGetGlobal)"
    )]
    NoLibraryGetGlobal { variable: String },
    #[error("its module's variable {variable} cannot be paired with the application's ({why})")]
    VariableUnpaired { variable: String, why: String },
    #[error("its module's variables hold {mib} MiB, which each launch would copy twice")]
    VariablesTooLarge { mib: usize },
}

impl From<CompileError> for GpuAttachError {
    fn from(e: CompileError) -> Self {
        GpuAttachError::Probe(e.into())
    }
}

impl From<ReplicaError> for GpuAttachError {
    fn from(e: ReplicaError) -> Self {
        GpuAttachError::Replica(Arc::new(e))
    }
}

impl From<FatbinError> for GpuAttachError {
    fn from(e: FatbinError) -> Self {
        GpuAttachError::Fatbin(Arc::new(e))
    }
}

impl From<Missing> for GpuAttachError {
    fn from(e: Missing) -> Self {
        GpuAttachError::NoPtx(Arc::new(e))
    }
}

impl From<std::ffi::NulError> for GpuAttachError {
    fn from(_: std::ffi::NulError) -> Self {
        GpuAttachError::NulInPtx
    }
}

impl<E: Into<GpuAttachError>> From<bpftime_gpu_device::clock::CalibrationError<E>>
    for GpuAttachError
{
    fn from(e: bpftime_gpu_device::clock::CalibrationError<E>) -> Self {
        match e {
            bpftime_gpu_device::clock::CalibrationError::Read(e) => e.into(),
            bpftime_gpu_device::clock::CalibrationError::NoSample => GpuAttachError::NoClockSample,
        }
    }
}
