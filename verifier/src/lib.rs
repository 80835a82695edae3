//! A userspace eBPF verifier: abstract interpretation over every path, CPU and GPU rules.
//!
//! [`verify`] walks every path of a program depth-first with an abstract state per
//! register and stack byte (scalars as signed/unsigned ranges plus known bits,
//! pointers by region and offset range), pruning a path where a state already
//! proved safe covers it, the way the kernel's verifier does; loops are allowed
//! when exploring them terminates, within the 1M processed-instruction limit.
//!
//! A rejection is a value ([`Rejection`]): the instruction index, the reason
//! ([`RejectKind`]) and the registers the instruction used; [`Rejection::log`]
//! renders the kernel-style text that libbpf prints, e.g.
//!
//! ```text
//! 12: R1=ctx(off=0)
//! 12: (61) r2 = *(u32 *)(r1 +200)
//! invalid bpf_context access off=200 size=4
//! ```
//!
//! The rules are the kernel's for privileged loaders (root, `CAP_PERFMON`), as
//! bpftime's loaders are: uninitialized stack reads as unknown numbers, pointers may
//! leak into maps, numbers and return values; what the kernel tracks no bounds for
//! (division, modulo, variable shifts) has none here either. `tests/kernel_diff.rs`
//! holds this against the kernel on a corpus of 600+ programs (`corpus/`).
//!
//! Program types: `KPROBE` (uprobes too; the context is x86-64 `struct pt_regs`,
//! read-only, aligned loads) and [`PROG_TYPE_CONFORMANCE`] (a buffer in `r1`, its
//! length in `r2`). With `gpu: true` only the helpers and map types the GPU
//! runtime implements pass.

#![forbid(unsafe_code)]

mod cfg;
mod disasm;
mod error;
mod helpers;
mod scalar;
mod state;
mod verify;

pub use disasm::disasm;
pub use error::{RejectKind, Rejection, Verified};
pub use scalar::{Scalar, Tnum};
pub use state::{Reg, Region};
pub use verify::{
    inner_map_key, inner_map_owner, verify, MapDesc, Options, ProgramInfo, SourceLine,
    PROG_TYPE_CONFORMANCE, PT_REGS_SIZE, RAW_TRACEPOINT_CTX, TRACEPOINT_CTX,
};
