use bpftime_lifter::LiftError;
use inkwell::builder::BuilderError;
use thiserror::Error;

/// Why a program could not be compiled for a GPU.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CompileError {
    #[error(transparent)]
    Lift {
        #[from]
        source: LiftError,
    },
    #[error("invalid option: {message}")]
    InvalidOption { message: String },
    #[error("helper library does not parse or link: {message}")]
    Library { message: String },
    #[error("LLVM has no intrinsic `{name}` for this target")]
    Intrinsic { name: String },
    #[error("LLVM builder failed: {source}")]
    Builder {
        #[from]
        source: BuilderError,
    },
    #[error("no LLVM target: {message}")]
    Target { message: String },
    #[error("GPU module failed LLVM verification: {message}")]
    InvalidIr { message: String },
    #[error("LLVM code generation failed: {message}")]
    Codegen { message: String },
}
