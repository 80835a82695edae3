//! The GPU half of lowering, shared by every GPU backend: PTX (`bpftime-jit-ptx`) and
//! AMDGCN (`bpftime-jit-amdgcn`) each use it, and neither depends on the other.
//!
//! A program is lifted once; on a GPU its helpers split three ways:
//! - *builtins*, computed inside the module from the GPU's special registers: helper 5
//!   (`ktime_get_ns`) and 502 read the global timer, 8 (`get_smp_processor_id`) and 509
//!   the SM (compute unit) id, 510 the warp id, 511 the lane id; 503 block index, 504
//!   block size, 505 thread index and 508 grid size write x, y and z as three `u64`s
//!   through r1, r2 and r3 and return 0; 506 is a system-wide memory barrier and
//!   returns 0. Helper 502 is the raw global timer; helper 5 (`ktime_get_ns`) is the
//!   global timer plus the module global [`GpuModule::clock_offset`], which the runtime
//!   sets to its calibrated (host `CLOCK_MONOTONIC` − global timer) before a launch
//!   (docs/ARCHITECTURE.md decision 8), so that GPU and CPU timestamps order correctly. Left at 0 it is
//!   the raw timer.
//! - *extern* helpers ([`extern_helpers`]): calls to device functions that the GPU
//!   runtime links, each with the helper ABI `u64 f(u64, u64, u64, u64, u64)`. PTX
//!   declares them `.extern .func`.
//! - anything else is refused at lift time, naming the helper and the pc.
//!
//! A compiled program has two ways in: the *probe function* `u64 <symbol>(void *ctx)`,
//! which an instrumented kernel calls, and the *kernel* `<symbol>_kernel(void *mem, u64
//! len, u64 *result)`, which runs the program on its own with r1 = mem, r2 = len and
//! stores r0 to `*result`. The eBPF stack is an `alloca`, so it lives in each thread's
//! private memory; eBPF pointers are generic (flat, address space 0) pointers.
//!
//! Every function the module defines besides those two is internal and named
//! `<symbol>__...`, so that modules of several programs can be spliced into one; so is
//! the one global, the clock offset `<symbol>__clock_offset_ns`.
//!
//! [`lowering`] makes a lifted program a GPU module; [`passes`] are the LLVM IR folds
//! run over it before code generation, which the generic optimizer cannot do because
//! they rest on facts about GPU execution (warp-uniform values, known address ranges).

#![warn(unreachable_pub)]

mod error;
pub mod ir;
pub mod lowering;
pub mod passes;

pub use error::CompileError;
pub use ir::{call_int, intrinsic};
pub use lowering::*;
pub use passes::*;

#[cfg(test)]
mod tests;
