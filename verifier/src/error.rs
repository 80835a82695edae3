//! Diagnostics as values: the kernel-style log is rendered from them, never parsed.

use std::fmt::Write as _;

use bpftime_isa::bprintf::FormatError;
use thiserror::Error;

use crate::state::Reg;

/// Why a program was rejected. The `Display` text is the one-line reason of the log.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum RejectKind {
    #[error("program is empty")]
    EmptyProgram,
    #[error("program too large ({len} insns)")]
    ProgramTooLarge { len: usize },
    #[error("unsupported program type {prog_type}")]
    UnsupportedProgType { prog_type: u32 },
    #[error("unknown opcode {code:02x}")]
    UnknownOpcode { code: u8 },
    #[error("invalid register r{reg}")]
    InvalidRegister { reg: u8 },
    #[error("instruction {code:02x} uses reserved fields")]
    ReservedFields { code: u8 },
    #[error("invalid bpf_ld_imm64 insn")]
    InvalidLdImm64,
    #[error("unsupported ld_imm64 source {src}")]
    UnsupportedLdImm64 { src: u8 },
    #[error("BPF_LD_[ABS|IND] instructions not allowed for this program type")]
    LdAbsNotAllowed,
    #[error("jump out of range from insn {from} to {to}")]
    JumpOutOfRange { from: usize, to: i64 },
    #[error("jump into the middle of ldimm64 insn {to}")]
    JumpIntoLdImm64 { to: usize },
    #[error("last insn is not an exit or jmp")]
    FallOffEnd,
    #[error("unreachable insn {insn}")]
    Unreachable { insn: usize },
    #[error("call to invalid destination {target}")]
    InvalidCallTarget { target: i64 },
    #[error("kernel function calls are not supported")]
    KfuncUnsupported,
    #[error("fd {fd} is not pointing to valid bpf_map")]
    UnknownMap { fd: i32 },
    #[error("map type {map_type} is not supported")]
    UnsupportedMapType { map_type: u32 },
    #[error("map type {map_type} is not available on the GPU")]
    MapTypeNotOnGpu { map_type: u32 },
    #[error("invalid access to map value pointer, value_size={value_size} off={off}")]
    MapValueOffset { value_size: u32, off: i64 },
    #[error("R{reg} !read_ok")]
    UninitRegister { reg: u8 },
    #[error("frame pointer is read only")]
    FramePointerWrite,
    #[error("R{reg} invalid mem access '{ty}'")]
    InvalidMemAccess { reg: u8, ty: &'static str },
    #[error("access to a task_struct field: bpftime has no kernel task_struct; a task pointer only goes to task helpers (bpf_task_storage_get/delete)")]
    TaskStructAccess,
    #[error("invalid bpf_context access off={off} size={size}")]
    CtxAccess { off: i64, size: u32 },
    #[error("misaligned context access off={off} size={size}")]
    MisalignedCtxAccess { off: i64, size: u32 },
    #[error("dereference of modified ctx ptr R{reg} off={off} disallowed")]
    ModifiedCtxDeref { reg: u8, off: i64 },
    #[error("variable ctx access by R{reg} disallowed")]
    VariableCtxAccess { reg: u8 },
    #[error("invalid stack access off={off} size={size}")]
    StackOutOfBounds { off: i64, size: u64 },
    #[error("misaligned access off {off} size {size}")]
    MisalignedAccess { off: i64, size: u32 },
    #[error("misaligned stack access off {off} size {size}")]
    MisalignedStackAccess { off: i64, size: u32 },
    #[error("invalid size of register spill ({size} bytes of a pointer)")]
    PartialPointerSpill { size: u32 },
    /// Not produced since uninitialized stack reads were allowed (as the kernel
    /// allows privileged programs); kept so that matches on it still compile.
    #[error("invalid read from stack off {off}+{byte} size {size}")]
    StackUninitRead { off: i64, byte: i64, size: u64 },
    #[error("invalid size of register fill off={off} size={size}")]
    PartialSpillRead { off: i64, size: u32 },
    #[error("invalid access to {region}, size={region_size} off={off_min}..{off_max} access_size={size}")]
    RegionOutOfBounds {
        region: &'static str,
        region_size: u32,
        off_min: i64,
        off_max: i64,
        size: u64,
    },
    #[error("R{reg} pointer offset is unbounded or out of range, use 'var &= const' or 'if (var < const)'")]
    UnboundedOffset { reg: u8 },
    #[error("R{reg} pointer arithmetic on {ty} prohibited")]
    PtrArithProhibited { reg: u8, ty: &'static str },
    #[error("R{reg} {op} on pointer prohibited")]
    PtrOpProhibited { reg: u8, op: &'static str },
    #[error("div by zero")]
    DivByZero,
    #[error("invalid shift {imm}")]
    InvalidShift { imm: i32 },
    #[error("invalid atomic operation {imm:#x} size {size}")]
    InvalidAtomic { imm: i32, size: u32 },
    #[error("invalid func unknown#{id} (unknown func)")]
    UnknownHelper { id: i32 },
    #[error("helper {name}#{id} is not available on the GPU")]
    HelperNotOnGpu { id: u32, name: &'static str },
    #[error("helper {name}#{id} is not available on the CPU")]
    HelperNotOnCpu { id: u32, name: &'static str },
    #[error("R{reg} type={found} expected={expected}")]
    HelperArgType {
        reg: u8,
        found: &'static str,
        expected: &'static str,
    },
    // The stray quote ending this message and the next is in the kernel's text too.
    #[error("R{reg} does not point to a readonly map'")]
    NotReadonlyMap { reg: u8 },
    #[error("R{reg} is not a constant address'")]
    NotConstantAddress { reg: u8 },
    #[error("no direct value access support for this map type")]
    NoDirectValueAccess,
    #[error("direct value access on string failed")]
    DirectValueAccessFailed,
    #[error("string is not zero-terminated")]
    StringNotTerminated,
    /// The kernel refuses this without a message of its own.
    #[error("bpf_snprintf's data_len {len} is not a multiple of 8")]
    SnprintfDataLen { len: u64 },
    #[error("Invalid format string: {error}")]
    InvalidFormat { error: FormatError },
    #[error("cannot pass map_type {map_type} into func {name}#{id}")]
    MapHelperMismatch {
        map_type: u32,
        id: u32,
        name: &'static str,
    },
    #[error("R{reg} min value is negative, either use unsigned or 'var &= const'")]
    SizeNegative { reg: u8 },
    #[error("R{reg} unbounded memory access, use 'var &= const' or 'if (var < const)'")]
    SizeUnbounded { reg: u8 },
    #[error("invalid zero-sized read (R{reg})")]
    SizeZero { reg: u8 },
    #[error("R{reg} must be a known constant")]
    NotConstant { reg: u8 },
    #[error("R{reg} must point to the start of a referenced ring buffer record")]
    BadRelease { reg: u8 },
    #[error("Unreleased reference id={ref_id} alloc_insn={alloc_insn}")]
    UnreleasedReference { ref_id: u32, alloc_insn: usize },
    #[error("At program exit the register R0 is not a scalar ({ty})")]
    ReturnNotScalar { ty: &'static str },
    #[error("At callback return the register R0 has value [{umin}, {umax}], should be in [0, 1]")]
    CallbackReturnRange { umin: u64, umax: u64 },
    #[error("cannot spill pointers to stack into stack frame of the caller")]
    StackPointerToCallerFrame,
    #[error("cannot return stack pointer to the caller")]
    ReturnStackPointer,
    #[error("the call stack of {frames} frames is too deep")]
    CallStackTooDeep { frames: usize },
    #[error("combined stack size of {frames} calls is {depth}. Too large")]
    CombinedStackTooLarge { frames: usize, depth: u32 },
    #[error(
        "tail_calls are not allowed when call stack of previous frames is {depth} bytes. Too large"
    )]
    TailCallStackTooLarge { depth: u32 },
    #[error("recursive call to subprogram at insn {target}")]
    RecursiveCall { target: usize },
    #[error("infinite loop detected at insn {insn}")]
    InfiniteLoop { insn: usize },
    #[error("BPF program is too large. Processed {processed} insn")]
    TooComplex { processed: u64 },
}

/// A rejected program: where, why, and the register states that explain it.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("insn {insn}: {kind}")]
pub struct Rejection {
    /// Index of the failing instruction slot.
    pub insn: usize,
    pub kind: RejectKind,
    /// The failing instruction, disassembled (empty when the failure is not at one).
    pub disasm: Box<str>,
    /// The registers the failing instruction uses, as the verifier saw them.
    pub regs: Vec<(u8, Reg)>,
    /// Every instruction processed before the failure, when `Options::log_level > 0`.
    pub verbose: Box<str>,
    /// The source line of the failing instruction, when the loader gave line
    /// info (`Options::source_lines`); boxed to keep rejections small.
    pub source_line: Option<Box<crate::SourceLine>>,
}

impl RejectKind {
    /// The errno the kernel's `BPF_PROG_LOAD` gives for this refusal: EACCES for an
    /// unsafe program, EINVAL or ENOTSUPP where the kernel's check returns those.
    pub fn errno(&self) -> i32 {
        // Linux's numbers (the verifier has no libc): EACCES, EINVAL, and the kernel's
        // internal "operation not supported", which reaches user space.
        const EACCES: i32 = 13;
        const EINVAL: i32 = 22;
        const ENOTSUPP: i32 = 524;
        match self {
            RejectKind::StringNotTerminated
            | RejectKind::SnprintfDataLen { .. }
            | RejectKind::InvalidFormat { .. } => EINVAL,
            RejectKind::DirectValueAccessFailed => ENOTSUPP,
            _ => EACCES,
        }
    }
}

impl Rejection {
    /// The log the kernel would put in `log_buf`: the trace (if asked for), the
    /// registers that matter, the failing instruction and the reason.
    pub fn log(&self) -> String {
        let mut s = self.verbose.to_string();
        if !self.regs.is_empty() {
            let _ = write!(s, "{}:", self.insn);
            for (r, v) in &self.regs {
                let _ = write!(s, " R{r}={v}");
            }
            s.push('\n');
        }
        if let Some(l) = &self.source_line {
            // The kernel's form: trimmed text, then the file's base name.
            let file = l.file.rsplit('/').next().unwrap_or(&l.file);
            let _ = writeln!(s, "; {} @ {}:{}", l.text.trim(), file, l.line);
        }
        if !self.disasm.is_empty() {
            let _ = writeln!(s, "{}: {}", self.insn, self.disasm);
        }
        let _ = writeln!(s, "{}", self.kind);
        s
    }
}

/// A program that verified, with the cost of proving it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verified {
    /// Instructions processed over all paths (the kernel's "processed N insns").
    pub insns_processed: u64,
    /// States kept at pruning points.
    pub states: u64,
    /// Most states kept at one pruning point.
    pub peak_states: u64,
    /// States cut short because an explored state covered them.
    pub pruned: u64,
    /// Deepest stack use of any one subprogram, in bytes.
    pub stack_depth: u32,
    /// The 8-byte words of the context the program reads (bit i: bytes 8i to 8i+8), or
    /// every bit once the context reaches a helper, which may read any of it: a uprobe
    /// hook need only fill in these.
    pub ctx_words_read: u64,
    /// One past the last byte of the context the program loads directly (the kernel's
    /// `max_ctx_offset`): a tracepoint program attaches only where the record is at
    /// least this long, a raw tracepoint program only where it has this many bytes of
    /// arguments.
    pub ctx_read_end: u32,
    /// The trace, when `Options::log_level > 0`, ending with the summary line.
    pub log: String,
}
