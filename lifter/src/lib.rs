//! Lifts eBPF bytecode to LLVM IR once, for every code generator.
//!
//! [`lift`] turns a program into a module with one function per subprogram. The IR is
//! target-neutral: helpers, pointer address spaces and the entry's symbol name come from a
//! [`LoweringTarget`], and the backend sets the triple and data layout, then runs
//! [`optimize`] and its own code generation.
//!
//! Signatures of the lifted functions, all integers `i64`:
//! - entry: `r0 = entry(r1, r2, tail_depth)`, external, named by
//!   [`LoweringTarget::entry_name`]; callers pass `tail_depth = 0`.
//! - subprogram at slot `pc`: `r0 = bpf_sub_<pc>(r1, r2, r3, r4, r5, tail_depth)`, internal.
//! - helper: `r0 = helper(r1, r2, r3, r4, r5)`.
//!
//! Calls:
//! - helpers: direct calls to whatever [`HelperLowering`] the target gives for the id; an
//!   unknown id is [`LiftError::UnknownHelper`] with the id and pc.
//! - callbacks (`lddw rX, func`, src 4, as `bpf_loop` takes them): the subprogram is a
//!   function like a call target, and the register gets its address; the target's
//!   `bpf_loop` calls it as `r0 = f(index, ctx, 0, 0, 0, tail_depth)`.
//! - `callx`: the register holds a helper id (uBPF semantics); the call dispatches over
//!   [`LoweringTarget::callx_helpers`], and an unknown id at run time yields r0 = 0.
//! - `bpf_map_lookup_elem` on an array map whose address an `lddw` put in r1 in the same
//!   block is inlined when [`LoweringTarget::array_map`] describes the map.
//! - tail calls (helper 12): call-and-return. The target's lowering of helper 12 is a
//!   resolver `entry = resolver(ctx, prog_array, index, r4, r5)` returning the target
//!   program's entry address or 0; when non-zero, `entry(ctx, 0, tail_depth + 1)` runs
//!   and its r0 is returned at once, so the target replaces the current (sub)program as in
//!   the kernel. Each tail call costs one native frame; a chain stops after
//!   [`MAX_TAIL_CALLS`](bpftime_isa::uapi::MAX_TAIL_CALLS) (33) tail calls, counted
//!   through `tail_depth`, and a failed tail call falls through with -ENOENT in r0.
//!
//! Each function keeps r0-r10 and its own 512-byte stack in allocas, so SROA and mem2reg
//! turn them into SSA values. Lifting assumes a little-endian target.

#![deny(unsafe_code)]
#![warn(unreachable_pub)]

mod error;
#[allow(unsafe_code)] // registers the exit handler (libc's atexit)
mod exit_gate;
mod lift;
mod target;

pub use error::LiftError;
pub use exit_gate::{exit_destructor_registered, guard_llvm_at_exit, llvm_in_use, LlvmInUse};
pub use lift::{lift, optimize, Lifted};
pub use target::{
    ArrayMapLayout, CpuNumber, CpuSlotTable, HelperLowering, LoweringTarget, PerCpuCopies,
};

/// Symbol name of the entry function unless the target picks another.
pub const DEFAULT_ENTRY_NAME: &str = "bpf_entry";
