//! The agent's starter: the library `bpftime start` preloads and `bpftime attach`
//! injects. It holds no LLVM and no runtime, only this constructor, which
//! `dlopen`s the agent library beside it and calls its entry point.
//!
//! Why two libraries: the agent JIT-compiles with a statically linked LLVM, whose
//! C++ static initializers live in the agent's own `.init_array`. A constructor in
//! that same library may run before them (the order inside one `.init_array` is the
//! linker's), and LLVM then crashes on uninitialized globals. `dlopen` runs every
//! initializer of the agent before it returns, so calling in afterwards is safe.
//! It also keeps what is preloaded into every target tiny.
//!
//! It also owns one byte of static TLS for the hooks (see `hook_flag_offset`): the
//! agent, being `dlopen`ed, could only have dynamic TLS, which its assembly cannot reach.

use bpftime_abi::{AgentEntry, AgentStart, AGENT_DISABLE_ENV, AGENT_ENTRY, AGENT_LIB};
use std::ffi::{CStr, CString};

/// Runs when the dynamic loader maps this library, before `main` for a preload. Nothing
/// here may take the target down: a panic is reported once and the target runs on,
/// uninstrumented.
extern "C" fn starter_init() {
    bpftime_ffi_guard::ffi_guard!("the agent starter", (), start_in_target());
}

fn start_in_target() {
    if std::env::var_os(AGENT_DISABLE_ENV).is_some() {
        return;
    }
    // `bpftime attach` leaves this file before it injects us. An injected dlopen
    // runs this constructor holding the loader's lock, and the agent's start needs
    // that lock on another thread: starting inline would deadlock the target. So
    // the agent starts on a thread of its own, once the injected call returns.
    let hint = bpftime_abi::attach_hint_path(std::process::id());
    // Only a hint of root's or ours counts: one another user planted (the directory is
    // everyone's) must not move our start off the main thread, where probes would miss
    // what the target does before the thread runs.
    let trusted_hint = match std::fs::symlink_metadata(&hint) {
        Ok(meta) if bpftime_abi::is_trusted_attach_hint(&meta) => true,
        Ok(_) => {
            eprintln!(
                "bpftime agent: ignoring {}: not a plain file of root's or this user's (remove it; only `bpftime attach` makes it)",
                hint.display()
            );
            false
        }
        Err(_) => false,
    };
    if trusted_hint {
        let spawned = std::thread::Builder::new()
            .name("bpftime-start".into())
            .spawn(move || {
                if let Err(why) = start_agent(true) {
                    eprintln!("bpftime agent: {why}; the target runs uninstrumented");
                    report_to_attach(&hint, &why);
                }
            });
        if let Err(e) = spawned {
            eprintln!("bpftime agent: cannot start a thread ({e}); the target runs uninstrumented");
        }
        return;
    }
    if let Err(why) = start_agent(false) {
        eprintln!("bpftime agent: {why}; the target runs uninstrumented");
    }
}

/// Tells a waiting `bpftime attach` why the agent did not start, in a hint that is still
/// there (`attach` may have given up and removed it) and trusted (the runtime's
/// `report_to_attach` does the same for the agent; this library does not link it).
fn report_to_attach(hint: &std::path::Path, why: &str) {
    let Some(mut f) = bpftime_abi::open_attach_hint(hint, true) else {
        return;
    };
    if f.set_len(0).is_ok() {
        let _ = std::io::Write::write_all(&mut f, format!("error: {why}").as_bytes());
    }
}

/// Declares that this library follows `bpftime attach`'s injection contract
/// (see cli/src/attach.rs); `attach` refuses libraries without it. The symbol's name is
/// `bpftime_abi::ATTACH_CONTRACT_SYMBOL`.
#[no_mangle]
pub static BPFTIME_ATTACH_CONTRACT: u32 = bpftime_abi::ATTACH_CONTRACT_VERSION;

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = starter_init;

// The hooks' per-thread flag, in this library's TLS: for free when preloaded, and from the
// loader's surplus for such libraries when injected (this library's TLS is about 100 bytes).
bpftime_attach::static_tls_flag!(fn hook_flag_offset, "bpftime_starter_hook_flag");
// The runtime's per-thread ids (pid_tgid, the map locks' owner), read on every map
// update and delete: static TLS for the same reason.
bpftime_attach::static_tls_flag!(fn ids_offset, "bpftime_starter_ids");
// Where each thread's shadow stack of pending uretprobe calls is, read at every hooked
// entry with a uretprobe and at every such return.
bpftime_attach::static_tls_flag!(fn shadow_offset, "bpftime_starter_shadow");
// The CPU slot a thread runs a program as, read by every per-CPU access of JIT code.
bpftime_attach::static_tls_flag!(fn cpu_slot_offset, "bpftime_starter_cpu_slot");

// Each thread's selector byte for Syscall User Dispatch and the return address of a
// process-making call in flight (see bpftime_attach's system call hooks), read by their
// assembly and written by the kernel's dispatch checks on every system call.
bpftime_attach::static_tls_area!(fn syscall_offset, "bpftime_starter_syscalls", 24);

// A `struct rseq` (32 bytes, 32-aligned) of our own, for a process whose glibc registers
// none (before 2.35, or `GLIBC_TUNABLES=glibc.pthread.rseq=0`): a thread registers it the
// first time it takes a CPU slot (see bpftime_runtime::cpu_slots). Its `cpu_id` starts
// at -1 (RSEQ_CPU_ID_UNINITIALIZED), which every reader takes for "no CPU"; a zero there
// would read as CPU 0 before the kernel writes it.
::std::arch::global_asm!(
    ".pushsection .tdata,\"awT\",@progbits",
    ".p2align 5",
    ".globl bpftime_starter_rseq",
    ".hidden bpftime_starter_rseq",
    "bpftime_starter_rseq:",
    ".long 0",
    ".long 0xffffffff",
    ".zero 24",
    ".popsection",
);

/// The offset of the rseq area above from the thread pointer, the same in every thread.
fn rseq_offset() -> isize {
    let offset: isize;
    // SAFETY: reads the GOT slot the loader filled with the variable's TLS offset.
    unsafe {
        ::std::arch::asm!(
            "mov {}, qword ptr [rip + bpftime_starter_rseq@gottpoff]",
            out(reg) offset,
            options(nostack, readonly, preserves_flags),
        )
    };
    offset
}

/// `on_own_thread`: called on a thread this library made, not one of the application's.
fn start_agent(on_own_thread: bool) -> Result<(), String> {
    let dir = own_directory().ok_or("cannot find the directory of libbpftime_agent_starter.so")?;
    let path = format!("{dir}/{AGENT_LIB}");
    let c_path = CString::new(path.clone()).map_err(|_| format!("bad agent path {path}"))?;
    // SAFETY: a NUL-terminated path. RTLD_LOCAL keeps the agent's symbols (LLVM's
    // among them) from interposing on the target's own.
    let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(format!("cannot load {path}: {}", dl_error()));
    }
    // SAFETY: a live handle and a NUL-terminated symbol name.
    let sym = unsafe { libc::dlsym(handle, AGENT_ENTRY.as_ptr()) };
    if sym.is_null() {
        return Err(format!("{path} has no {AGENT_ENTRY:?}: {}", dl_error()));
    }
    // SAFETY: the agent exports its entry point as an `AgentEntry` (it checks the
    // arguments' version and size, for an agent of another build); the library stays
    // loaded (never dlclose'd), so the code outlives the call.
    let start: AgentEntry = unsafe { std::mem::transmute(sym) };
    let args = AgentStart {
        hook_flag_tp_offset: hook_flag_offset(),
        ids_tp_offset: ids_offset(),
        shadow_tp_offset: shadow_offset(),
        cpu_slot_tp_offset: cpu_slot_offset(),
        rseq_tp_offset: rseq_offset(),
        syscall_tp_offset: syscall_offset(),
        ..AgentStart::new(on_own_thread)
    };
    // SAFETY: `args` lives for the call.
    unsafe { start(&args) };
    Ok(())
}

fn dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string valid until the next dl call.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-null, NUL-terminated, as above.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// The directory this library was loaded from.
fn own_directory() -> Option<String> {
    // SAFETY: dladdr only reads the loader's tables; `info` is plain data it fills in.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let here = starter_init as *const libc::c_void;
    // SAFETY: `here` is an address inside this library; `info` is writable.
    if unsafe { libc::dladdr(here, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the loader.
    let file = unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned();
    let file = std::fs::canonicalize(&file).ok()?;
    Some(file.parent()?.to_string_lossy().into_owned())
}
