//! The agent: loaded into a target process by the starter library (preloaded by
//! `bpftime start`, injected by `bpftime attach`), it opens the store, verifies
//! and JIT-compiles every program linked to a point in this process, and attaches
//! it with inline hooks. A watcher thread follows the store, so tools loaded
//! later attach without a restart and tools that exit detach.

mod crash;
mod exit;
mod gpu;
mod program;
mod syscalls;
mod trace;
mod watch;

/// The entry point the starter calls once the loader has run every initializer
/// of this library (LLVM's static constructors among them). `hook_flag_tp_offset` is
/// a byte of the starter's static TLS for the hooks (see
/// `bpftime_attach::use_static_tls_flag`), or 0 for none. `on_starter_thread` says the
/// caller is a thread the starter made for this call (injection), not the application's.
/// `ids_tp_offset` is 8 bytes of the starter's static TLS for the runtime's per-thread ids
/// (see `bpftime_runtime::helpers::use_static_tls_ids`), or 0 for none.
/// `shadow_tp_offset` is 8 bytes of it for the hooks' shadow stacks (see
/// `bpftime_attach::use_static_tls_shadow`), or 0 for none. `cpu_slot_tp_offset` is 8
/// bytes of it for the CPU slot a thread runs a program as (see
/// `bpftime_runtime::cpu_slots`), or 0 for none. `rseq_tp_offset` is a 32-byte rseq area
/// in it, for threads whose glibc registers none (see
/// `bpftime_runtime::cpu_slots::use_own_rseq_area`), or 0 for none. `syscall_tp_offset`
/// is 24 bytes of it for the system call hooks (see
/// `bpftime_attach::use_static_tls_for_syscalls`), or 0 for none.
#[no_mangle]
pub extern "C" fn bpftime_agent_start(
    hook_flag_tp_offset: isize,
    on_starter_thread: bool,
    ids_tp_offset: isize,
    shadow_tp_offset: isize,
    cpu_slot_tp_offset: isize,
    rseq_tp_offset: isize,
    syscall_tp_offset: isize,
) {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        // A failing agent must never take the target down with it: a panic leaves the
        // target running uninstrumented.
        let start = || {
            watch::start(
                hook_flag_tp_offset,
                on_starter_thread,
                ids_tp_offset,
                shadow_tp_offset,
                cpu_slot_tp_offset,
                rseq_tp_offset,
                syscall_tp_offset,
            )
        };
        bpftime_ffi_guard::ffi_guard!("the agent's start", (), start());
    });
}
