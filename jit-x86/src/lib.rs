//! Compiles lifted eBPF to x86-64 machine code in process.
//!
//! [`JitProgram::compile`] lifts with `bpftime-lifter`, optimizes with LLVM for the host
//! CPU, emits a relocatable object and loads it with a small ELF loader of our own: the
//! memory is filled while read-write and then becomes read-execute, never both. A
//! compiled program owns no LLVM state, so it is `Send + Sync` and cheap to clone.
//! [`JitCache`] memoizes compilation by bytecode, helper addresses and options.

#![warn(unreachable_pub)]

mod cache;
mod error;
mod jit;
mod loader;
mod vectors;

pub use bpftime_lifter::{ArrayMapLayout, CpuSlotTable, LiftError, PerCpuCopies};
pub use cache::JitCache;
pub use error::JitError;
pub use jit::{lifted_ir, EntryFn, JitEnv, JitOptions, JitProgram, OptLevel, FS_SEGMENT};
