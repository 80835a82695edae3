use std::io;
use std::path::PathBuf;

use crate::HookId;

/// Why a target could not be resolved or a hook could not be installed or removed.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("invalid attach target `{target}`: {reason} (expected `binary:symbol` or `binary:0xOFFSET`)")]
    BadTarget {
        target: String,
        reason: &'static str,
    },

    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },

    #[error("{} is not an ELF file we can read: {reason}", path.display())]
    Elf { path: PathBuf, reason: String },

    #[error("symbol `{symbol}` not found in {} (is the binary stripped? check with `nm -D` and `nm`)", binary.display())]
    SymbolNotFound { binary: PathBuf, symbol: String },

    #[error("symbol `{symbol}` in {} has address {vaddr:#x}, which no PT_LOAD segment holds in the file (is it a TLS or undefined symbol?)", binary.display())]
    NotInSegment {
        binary: PathBuf,
        symbol: String,
        vaddr: u64,
    },

    #[error("{} is not mapped in this process (is the library loaded yet? compare with /proc/self/maps)", binary.display())]
    NotMapped { binary: PathBuf },

    #[error("file offset {offset:#x} of {} is outside every mapping of it in this process (is the offset from this build of the file?)", binary.display())]
    OffsetNotMapped { binary: PathBuf, offset: u64 },

    #[error("file offset {offset:#x} of {} is `{function}+{function_offset:#x}`, which is not where an instruction starts (the nearest are {nearest}); a probe there would corrupt the code", binary.display())]
    NotAnInstruction {
        binary: PathBuf,
        offset: u64,
        function: String,
        function_offset: u64,
        nearest: String,
    },

    #[error("cannot hook code at {addr:#x}: {reason}")]
    Unhookable { addr: usize, reason: String },

    #[error("no free memory for a trampoline within ±2 GiB of {addr:#x}")]
    NoTrampolineSpace { addr: usize },

    #[error("cannot {action} at {addr:#x}: {source}")]
    Memory {
        action: &'static str,
        addr: usize,
        source: io::Error,
    },

    #[error("the hooks' static TLS (offset {tp_offset} from the thread pointer) must be given at a non-zero offset, before the first hook is attached")]
    ThreadFlagRefused { tp_offset: isize },

    #[error("{id} is not attached (already detached?)")]
    UnknownHook { id: HookId },
}
