//! An interpreter for the whole eBPF ISA (RFC 9669 plus `callx`): the reference engine the
//! JITs are judged against, and the fallback that runs inside traced processes until the
//! JIT is available.
//!
//! [`execute`] runs a program with r1 and r2 set; an [`Environment`] supplies helpers and
//! tail-call targets, and a [`MemoryPolicy`] says whether memory accesses are checked.

#![warn(unreachable_pub)]

mod env;
mod error;
mod vm;

pub use bpftime_isa::HelperFn;
pub use env::{Environment, MemoryPolicy, NoEnvironment};
pub use error::{Access, ExecError};
pub use vm::{execute, execute_with_budget, TAIL_CALL_FAILED};
