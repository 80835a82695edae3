use inkwell::builder::BuilderError;
use thiserror::Error;

/// Why a program could not be lifted or optimized.
///
/// Every variant that comes from one instruction names its `pc` (slot index), so a
/// message can be traced back to the bytecode the way a verifier log is.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LiftError {
    #[error("program is empty")]
    Empty,
    #[error(
        "pc {pc}: call to helper {}#{id}, which this target does not have",
        bpftime_isa::helpers::name(*id as i32)
    )]
    UnknownHelper { pc: usize, id: u32 },
    #[error("pc {pc}: unsupported instruction (opcode {code:#04x})")]
    UnsupportedOpcode { pc: usize, code: u8 },
    #[error("pc {pc}: invalid register r{reg}")]
    InvalidRegister { pc: usize, reg: u8 },
    #[error("pc {pc}: r10 is read-only")]
    WriteToFramePointer { pc: usize },
    #[error("pc {pc}: jump to {target} leaves its function [{start}, {end})")]
    JumpOutOfRange {
        pc: usize,
        target: i64,
        start: usize,
        end: usize,
    },
    #[error("pc {pc}: call target {target} is outside the program")]
    CallOutOfRange { pc: usize, target: i64 },
    #[error("pc {pc}: jump lands in the second slot of an lddw")]
    JumpIntoLddw { pc: usize },
    #[error("pc {pc}: lddw is missing its second slot")]
    TruncatedLddw { pc: usize },
    #[error("function starting at pc {start} runs past its end at pc {end}")]
    FallsOffEnd { start: usize, end: usize },
    #[error("LLVM builder failed: {source}")]
    Builder {
        #[from]
        source: BuilderError,
    },
    #[error("lifted IR failed LLVM verification: {message}")]
    InvalidIr { message: String },
    #[error("pass pipeline `{pipeline}` failed: {message}")]
    Passes { pipeline: String, message: String },
    #[error("the process is exiting: no program is compiled any more")]
    ProcessExiting,
}
