//! The eBPF instruction set and the kernel's ABI numbers.
//!
//! Every stage of the pipeline (verifier, interpreter, lifter, runtime, shim)
//! decodes instructions and names map types, program types and helpers through
//! this crate, so that a number means the same thing everywhere. Helper rules that
//! both the verifier and the runtime apply (`bpf_snprintf`'s formats, `bpf_loop`'s
//! limits) live here too, so that they are written once.

pub mod asm;
pub mod bprintf;
pub mod helpers;
mod insn;
pub mod opcode;
pub mod uapi;

pub use insn::{decode, encode, DecodeError, Insn, INSN_SIZE};

/// A helper as the interpreter and the JITs call it: five arguments in, r0 out.
pub type HelperFn = unsafe extern "C" fn(u64, u64, u64, u64, u64) -> u64;
