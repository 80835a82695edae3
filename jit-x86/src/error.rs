use bpftime_lifter::LiftError;
use thiserror::Error;

/// Why a program could not be compiled or loaded.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum JitError {
    #[error(transparent)]
    Lift {
        #[from]
        source: LiftError,
    },
    #[error("no LLVM target for the host: {message}")]
    Target { message: String },
    #[error("LLVM code generation failed: {message}")]
    Codegen { message: String },
    #[error("malformed object from LLVM: {message}")]
    Object { message: String },
    #[error("object has a writable section `{name}`, which lifted code never needs")]
    UnsupportedSection { name: String },
    #[error("object refers to undefined symbol `{name}`")]
    UndefinedSymbol { name: String },
    #[error("unsupported relocation type {kind} against `{symbol}`")]
    UnsupportedRelocation { kind: u32, symbol: String },
    #[error("relocation type {kind} against `{symbol}` does not fit its field")]
    RelocationOverflow { kind: u32, symbol: String },
    #[error("entry symbol `{name}` is missing from the object")]
    EntryMissing { name: String },
    #[error("mapping JIT memory failed: {source}")]
    Map { source: std::io::Error },
}
