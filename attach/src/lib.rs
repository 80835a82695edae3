//! Attaches programs to CPU functions with inline hooks (uprobes, uretprobes).
//!
//! Three pieces, used in this order by the agent:
//! - [`Target`] parses `binary:symbol` or `binary:0xOFFSET`; [`symbol_file_offset`] and
//!   [`runtime_address`] turn it into an address in this process, the way the kernel's uprobe
//!   `offset` is defined (a file offset, found through the segment that holds the symbol).
//! - [`attach_uprobe`] and [`attach_uretprobe`] patch that address with a jump to a
//!   trampoline that hands the registers, laid out as the kernel's [`PtRegs`], to each handler.
//! - [`detach`] removes one handler; the last one out restores the original code.
//!
//! x86-64 Linux only.

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
compile_error!("bpftime-attach supports x86-64 Linux only");

mod error;
mod hook;
mod maps;
mod patch;
mod regs;
mod resolve;
mod stubs;

pub use error::AttachError;
pub use hook::{attach_uprobe, attach_uretprobe, detach, Handler, HookId};
pub use regs::PtRegs;
pub use resolve::{resolve_binary, runtime_address, symbol_file_offset, Location, Target};
