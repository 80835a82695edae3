//! The agent: loaded into a target process by the starter library (preloaded by
//! `bpftime start`, injected by `bpftime attach`), it opens the store, verifies
//! and JIT-compiles every program linked to a point in this process, and attaches
//! it with inline hooks. A watcher thread follows the store, so tools loaded
//! later attach without a restart and tools that exit detach.

mod alloc;
mod crash;
mod exit;
mod gpu;
mod program;
mod syscalls;
mod trace;
mod watch;

#[global_allocator]
static ALLOCATOR: alloc::AgentAllocator = alloc::AgentAllocator;

/// The entry point the starter calls once the loader has run every initializer
/// of this library (LLVM's static constructors among them), with its
/// [`bpftime_abi::AgentStart`]: where its static TLS holds what the hooks and the runtime
/// keep per thread, and whether the caller is a thread the starter made (injection).
/// Arguments of another version or size (a starter of another build) are refused with
/// one line, and the target runs uninstrumented.
///
/// # Safety
/// `args` is null or points to an `AgentStart` that lives for the call.
#[no_mangle]
pub unsafe extern "C" fn bpftime_agent_start(args: *const bpftime_abi::AgentStart) {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        // A failing agent must never take the target down with it: a panic leaves the
        // target running uninstrumented.
        let start = || {
            // Before anything else: an exit that begins from here on finds LLVM's
            // globals guarded.
            bpftime_lifter::guard_llvm_at_exit();
            // SAFETY: the caller's obligation (null, or an `AgentStart` alive for the
            // call); the version and size are checked before any other field is read.
            let args = unsafe { args.as_ref() };
            match bpftime_abi::AgentStart::checked(args) {
                Ok(args) => watch::start(args),
                Err(e) => eprintln!("bpftime agent: {e}; the target runs uninstrumented"),
            }
        };
        bpftime_ffi_guard::ffi_guard!("the agent's start", (), start());
    });
}
