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
//! A [`HookAddress`] that is a function entry gets a hook that skips the dead flags. Given a
//! byte of static TLS ([`use_static_tls_flag`]), a site whose only handler is a
//! [`CodeHandler`] calls it straight from the assembly stub.
//!
//! Code is never writable and executable at once: hooked code is rewritten through
//! `/proc/self/mem` while its pages stay R-X, and trampolines are built RW, then made RX for
//! good. Trampolines and hook records are never freed, since a thread may be inside one.
//!
//! Limits, x86-64 Linux only:
//! - The jump takes 5 bytes. A function shorter than that, with no padding after it, gets a
//!   one-byte breakpoint instead (as does any site whose jump cannot be built); code that
//!   jumps back into those 5 bytes from further on (a loop head there) breaks, and only
//!   branches inside the 5 bytes are detected. When they hold several instructions, every
//!   other thread not asleep elsewhere is sent a signal before the jump goes in, and one
//!   found between two of them is moved to the instruction's copy; if one cannot be, the
//!   site stays a one-byte breakpoint; so does one where a call among them is not the
//!   last (a thread in its callee would return between them). A thread whose frame
//!   interrupted by a signal handler resumes between them is not found.
//!   Inside a function, [`plan_site`] reads the whole function and picks a one-byte `int3`
//!   ([`HookAddress::breakpoint`]) wherever the jump could be reached sideways; a hit
//!   there costs a signal delivery.
//! - A prologue's rip-relative operands must still reach their targets from the trampoline
//!   (it is placed within ±2 GiB of the hooked code, as near as a free hole allows).
//! - Uretprobes replace the return address on the stack: not under CET shadow stacks
//!   (refused), and code that reads its own return address sees the trampoline's. Stack
//!   walks read the real one back with [`original_return_address`].
//! - While hooks are written, a SIGTRAP handler is installed for the whole process (it hands
//!   traps it does not own to the previous handler); a thread that blocks SIGTRAP and reaches
//!   a site mid-patch is killed. The signal sent to threads before a jump over several
//!   instructions goes in is a real-time one, the highest with no handler that no thread
//!   blocks when first needed. Should the application take it later, such sites stay
//!   breakpoints, and a request still pending reaches the application's handler.
//! - ymm/zmm upper halves and x87 state are not saved around handlers.

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
compile_error!("bpftime-attach supports x86-64 Linux only");

mod detour;
mod error;
mod evacuate;
mod hook;
mod maps;
pub mod patch;
mod regs;
mod resolve;
pub mod signals;
mod site;
mod stubs;

pub use detour::{detour, remove_detour, Detour};
pub use error::AttachError;
pub use hook::{
    attach_uprobe, attach_uprobe_code, attach_uretprobe, attach_uretprobe_code, detach,
    in_handlers, never_run_handlers_on_this_thread, original_return_address, prime_returns,
    set_in_handlers, use_static_tls_flag, use_static_tls_shadow, CodeHandler, Handler, HookAddress,
};
pub use maps::{parse as parse_proc_maps, Mapping as ProcMapping};
pub use regs::PtRegs;
pub use resolve::{
    is_function_entry, resolve_binary, runtime_address, runtime_data_address, symbol_file_offset,
    Location, Target,
};
pub use site::{function_at, plan_site, SitePlan};

/// Names one attached handler, for [`detach`]. Here, at the root, as hooks hand it out
/// and errors name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HookId(u64);

impl std::fmt::Display for HookId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "hook #{}", self.0)
    }
}

/// Defines `$size` zeroed bytes of static TLS, 8-aligned, in the crate that invokes it, and
/// `fn $name() -> isize` answering their offset from the thread pointer (see
/// [`static_tls_flag!`]); 24 of them are what `bpftime_syscall_hooks::use_static_tls` takes.
#[macro_export]
macro_rules! static_tls_area {
    ($vis:vis fn $name:ident, $symbol:literal, $size:literal) => {
        ::std::arch::global_asm!(
            ".pushsection .tbss,\"awT\",@nobits",
            ".p2align 3",
            concat!(".globl ", $symbol),
            concat!(".hidden ", $symbol),
            concat!($symbol, ":"),
            concat!(".zero ", $size),
            ".popsection",
        );

        /// The offset of these bytes of static TLS from the thread pointer, the same in
        /// every thread.
        $vis fn $name() -> isize {
            let offset: isize;
            // SAFETY: reads the GOT slot the loader filled with the variable's TLS offset.
            unsafe {
                ::std::arch::asm!(
                    concat!("mov {}, qword ptr [rip + ", $symbol, "@gottpoff]"),
                    out(reg) offset,
                    options(nostack, readonly, preserves_flags),
                )
            };
            offset
        }
    };
}

/// Defines 8 zeroed bytes of static TLS (for [`use_static_tls_flag`], which uses one, or any
/// other per-thread word) in the crate that invokes it, and `fn $name() -> isize`
/// answering their offset from the thread pointer. `$symbol` names
/// the variable (hidden, so each library has its own). The access is initial-exec, which
/// makes the loader give the defining library's TLS a place in the static block: free for
/// an executable or a preloaded library, taken from the loader's surplus for a `dlopen`ed
/// one (which fails to load if none is left).
#[macro_export]
macro_rules! static_tls_flag {
    ($vis:vis fn $name:ident, $symbol:literal) => {
        ::std::arch::global_asm!(
            ".pushsection .tbss,\"awT\",@nobits",
            ".p2align 3",
            concat!(".globl ", $symbol),
            concat!(".hidden ", $symbol),
            concat!($symbol, ":"),
            ".zero 8",
            ".popsection",
        );

        /// The offset of these 8 bytes of static TLS from the thread pointer, the same in
        /// every thread.
        $vis fn $name() -> isize {
            let offset: isize;
            // SAFETY: reads the GOT slot the loader filled with the variable's TLS offset.
            unsafe {
                ::std::arch::asm!(
                    concat!("mov {}, qword ptr [rip + ", $symbol, "@gottpoff]"),
                    out(reg) offset,
                    options(nostack, readonly, preserves_flags),
                )
            };
            offset
        }
    };
}
