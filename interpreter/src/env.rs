use std::ops::Range;
use std::sync::Arc;

use bpftime_isa::{HelperFn, Insn};

/// What a running program can reach beyond its own registers and stack.
///
/// # Safety
///
/// The interpreter calls the helpers this returns with whatever values the program has in
/// r1-r5. An implementor vouches that each helper is sound for those values under the
/// [`MemoryPolicy`] in use: with a checked policy that means a helper must validate any
/// pointer it is given, as the interpreter cannot see what a helper dereferences.
pub unsafe trait Environment {
    /// The helper with this id (`call imm`, or the value of the register a `callx` names).
    fn helper(&self, id: u32) -> Option<HelperFn>;

    /// For `bpf_tail_call` (helper 12): the program at `index` in the prog array at `map`.
    fn tail_call_target(&self, map: u64, index: u64) -> Option<Arc<[Insn]>>;
}

/// An environment with no helpers and no tail-call targets.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoEnvironment;

// SAFETY: it offers no helpers at all.
unsafe impl Environment for NoEnvironment {
    fn helper(&self, _id: u32) -> Option<HelperFn> {
        None
    }

    fn tail_call_target(&self, _map: u64, _index: u64) -> Option<Arc<[Insn]>> {
        None
    }
}

/// Whether the interpreter checks each load, store and atomic before it touches memory.
#[derive(Debug, Clone)]
pub struct MemoryPolicy(pub(crate) Policy);

#[derive(Debug, Clone)]
pub(crate) enum Policy {
    Unchecked,
    Checked(Vec<Range<u64>>),
}

impl MemoryPolicy {
    /// Accesses go straight to memory, with no check: the fast path for verified programs.
    ///
    /// # Safety
    ///
    /// Every program the interpreter will run under this policy (the one passed to
    /// `execute` and every tail-call target) must only touch memory that is valid for the
    /// access, as the verifier establishes, given the r1 and r2 it is started with.
    pub unsafe fn unchecked() -> Self {
        MemoryPolicy(Policy::Unchecked)
    }

    /// Only these address ranges and the live part of the program's own stack may be touched;
    /// anything else stops the program with [`crate::ExecError::MemoryViolation`].
    pub fn checked(ranges: impl IntoIterator<Item = Range<u64>>) -> Self {
        MemoryPolicy(Policy::Checked(ranges.into_iter().collect()))
    }
}
