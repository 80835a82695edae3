use std::fmt;

use thiserror::Error;

/// The kind of memory access a program attempted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Load,
    Store,
    Atomic,
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Access::Load => "load",
            Access::Store => "store",
            Access::Atomic => "atomic",
        })
    }
}

/// Why a program stopped without reaching `exit`. Every variant names the slot (`pc`) of the
/// instruction that failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ExecError {
    #[error("pc {pc}: unknown opcode {code:#04x}")]
    UnknownOpcode { pc: usize, code: u8 },
    #[error("pc {pc}: opcode {code:#04x} with an invalid {field} ({value})")]
    InvalidField {
        pc: usize,
        code: u8,
        field: &'static str,
        value: i64,
    },
    #[error("pc {pc}: jump to slot {target}, outside the program's {len} slots")]
    JumpOutOfRange { pc: usize, target: i64, len: usize },
    #[error("pc {pc}: execution ran past the last of the program's {len} slots")]
    FellOffEnd { pc: usize, len: usize },
    #[error("pc {pc}: lddw is missing its second slot")]
    IncompleteLddw { pc: usize },
    #[error("pc {pc}: a call would exceed {max} frames")]
    CallDepthExceeded { pc: usize, max: usize },
    #[error("pc {pc}: unknown helper {id}")]
    UnknownHelper { pc: usize, id: u64 },
    #[error("pc {pc}: kernel function calls (call src {src}) are not supported")]
    UnsupportedCall { pc: usize, src: u8 },
    #[error("pc {pc}: {len}-byte {access} at {addr:#x} is outside the allowed memory")]
    MemoryViolation {
        pc: usize,
        addr: u64,
        len: usize,
        access: Access,
    },
    #[error("pc {pc}: {len}-byte atomic at {addr:#x} is not aligned")]
    MisalignedAtomic { pc: usize, addr: u64, len: usize },
    #[error("pc {pc}: bpf_loop's callback {value:#x} is not a subprogram of this program (load it with `lddw rX, func`)")]
    BadCallback { pc: usize, value: u64 },
    #[error("pc {pc}: instruction budget of {budget} exhausted")]
    BudgetExceeded { pc: usize, budget: u64 },
}
