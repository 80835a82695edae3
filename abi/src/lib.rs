//! What bpftime's processes and libraries agree on, in one place for both sides: the
//! CLI and the targets it starts or injects into, the starter and the agent it loads,
//! the loaders and the syscall shim preloaded into them.
//!
//! A change to [`AgentStart`] raises [`AGENT_START_VERSION`]: the starter and the agent
//! are separate libraries, and an agent from another build must refuse arguments it
//! does not know rather than misread them.

// One call needs `unsafe` (geteuid); everything else here is data.
#![deny(unsafe_code)]

use std::ffi::CStr;
use std::fs::File;
use std::path::{Path, PathBuf};

/// The syscall shim `bpftime load` preloads into a loader.
pub const SYSCALL_SHIM_LIB: &str = "libbpftime_syscall_shim.so";
/// The starter `bpftime start` preloads and `bpftime attach` injects into a target.
pub const AGENT_STARTER_LIB: &str = "libbpftime_agent_starter.so";
/// The agent, which the starter loads from its own directory.
pub const AGENT_LIB: &str = "libbpftime_agent.so";

/// The agent's entry point, an [`AgentEntry`], run once per process.
pub const AGENT_ENTRY: &CStr = c"bpftime_agent_start";
/// The version of [`AgentStart`] this build passes and accepts.
pub const AGENT_START_VERSION: u32 = 1;

/// What the starter hands the agent. The offsets are of the starter's static TLS
/// from the thread pointer (the agent, loaded by `dlopen`, could only have dynamic TLS,
/// which hooks' assembly cannot reach), each 0 for none.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentStart {
    /// [`AGENT_START_VERSION`] of the starter's build.
    pub version: u32,
    /// `size_of::<AgentStart>()` in the starter's build.
    pub size: u32,
    /// Called on a thread of the starter's (an injected start), not the application's.
    pub on_starter_thread: bool,
    /// One byte: the hooks' per-thread flag (see `bpftime_attach::use_static_tls_flag`).
    pub hook_flag_tp_offset: isize,
    /// The runtime's per-thread ids (see `bpftime_runtime::thread::use_static_tls_ids`).
    pub ids_tp_offset: isize,
    /// 8 bytes for the hooks' shadow stacks (see `bpftime_attach::use_static_tls_shadow`).
    pub shadow_tp_offset: isize,
    /// 8 bytes: the CPU slot a thread runs a program as (see `bpftime_runtime::cpu_slots`).
    pub cpu_slot_tp_offset: isize,
    /// A 32-byte rseq area for threads whose glibc registers none (see
    /// `bpftime_runtime::cpu_slots::use_own_rseq_area`).
    pub rseq_tp_offset: isize,
    /// 24 bytes for the system call hooks (see
    /// `bpftime_syscall_hooks::use_static_tls`).
    pub syscall_tp_offset: isize,
}

/// Why the agent refuses its start arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartMismatch {
    Null,
    Version { theirs: u32, ours: u32 },
    Size { theirs: u32, ours: u32 },
}

impl std::fmt::Display for StartMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartMismatch::Null => write!(f, "the starter passed no start arguments"),
            StartMismatch::Version { theirs, ours } => write!(
                f,
                "the starter speaks start version {theirs}, this agent {ours}: {AGENT_STARTER_LIB} and {AGENT_LIB} come from different builds; install them together"
            ),
            StartMismatch::Size { theirs, ours } => write!(
                f,
                "the starter's start arguments are {theirs} bytes, this agent's {ours}: {AGENT_STARTER_LIB} and {AGENT_LIB} come from different builds; install them together"
            ),
        }
    }
}

impl AgentStart {
    /// Arguments of this build's version and size, every offset 0.
    pub fn new(on_starter_thread: bool) -> AgentStart {
        AgentStart {
            version: AGENT_START_VERSION,
            size: std::mem::size_of::<AgentStart>() as u32,
            on_starter_thread,
            hook_flag_tp_offset: 0,
            ids_tp_offset: 0,
            shadow_tp_offset: 0,
            cpu_slot_tp_offset: 0,
            rseq_tp_offset: 0,
            syscall_tp_offset: 0,
        }
    }

    /// The arguments if they are of this build's version and size.
    pub fn checked(args: Option<&AgentStart>) -> Result<&AgentStart, StartMismatch> {
        let args = args.ok_or(StartMismatch::Null)?;
        if args.version != AGENT_START_VERSION {
            return Err(StartMismatch::Version {
                theirs: args.version,
                ours: AGENT_START_VERSION,
            });
        }
        let ours = std::mem::size_of::<AgentStart>() as u32;
        if args.size != ours {
            return Err(StartMismatch::Size {
                theirs: args.size,
                ours,
            });
        }
        Ok(args)
    }
}

/// The agent's entry point; its argument is null or an [`AgentStart`] that lives for the
/// call.
pub type AgentEntry = unsafe extern "C" fn(*const AgentStart);

/// The symbol by which a library says it follows `bpftime attach`'s injection contract
/// (a `u32`, [`ATTACH_CONTRACT_VERSION`]); `attach` refuses libraries without it.
pub const ATTACH_CONTRACT_SYMBOL: &str = "BPFTIME_ATTACH_CONTRACT";
/// The version of the injection contract (see cli/src/attach.rs).
pub const ATTACH_CONTRACT_VERSION: u32 = 1;

/// The file `bpftime attach` leaves for the process it injects into, `pid` as that
/// process sees itself (`getpid()` there): the store to use, and where the agent reports
/// why it did not start. It holds the store name (no newline) and exists only while
/// `attach` loads the agent; the agent takes the name when the file is owned by root or
/// by its own effective uid, then unlinks it, which tells `attach` the name was taken.
pub fn attach_hint_path(pid: u32) -> PathBuf {
    PathBuf::from(format!("/dev/shm/bpftime-inject-{pid}"))
}

/// Opens the attach hint at `path` for reading, or for writing when `write`, when it is a
/// plain file owned by root or by the caller's effective uid; None otherwise. The hint
/// lies where every user can write, so this is the one test of it: it is never created
/// here, a link is not followed (a link cannot make us write where it points), and a
/// file another user planted says nothing to us (no store, no start on a thread).
pub fn open_attach_hint(path: &Path, write: bool) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    is_trusted_attach_hint(&file.metadata().ok()?).then_some(file)
}

/// Whether a file with `meta` may be the attach hint: a plain file (not a link, not a
/// FIFO) owned by root or by the caller's effective uid.
pub fn is_trusted_attach_hint(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    let owner = meta.uid();
    meta.file_type().is_file() && (owner == 0 || owner == effective_uid())
}

#[allow(unsafe_code)]
fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// How a loader's libbpf is shown bpftime's GPU ring buffers (map type 1527): `ringbuf`
/// (the default: libbpf's ring buffer API reads them) or `perf` (its perf buffer API).
pub const GPU_RING_AS_ENV: &str = "BPFTIME_GPU_RING_AS";

/// The store a process uses (its name; the CLI's `--store`).
pub const STORE_ENV: &str = "BPFTIME_STORE";
/// Where stores live instead of /dev/shm (tests and fuzzing).
pub const STORE_ROOT_ENV: &str = "BPFTIME_SHM_ROOT";
/// Set in a target's environment to keep the agent out of it.
pub const AGENT_DISABLE_ENV: &str = "BPFTIME_AGENT_DISABLE";
/// How the agent runs programs: the JIT (default) or the interpreter.
pub const JIT_ENV: &str = "BPFTIME_JIT";
/// The application's own `LD_PRELOAD`, kept aside while `run` preloads the shim.
pub const USER_LD_PRELOAD_ENV: &str = "BPFTIME_USER_LD_PRELOAD";
/// Set by `bpftime start --gpu-flamegraph PATH` (and `run`): the agent writes the GPU
/// flame graph of the target's kernel launches to `PATH.svg` and `PATH.folded` at exit.
pub const GPU_FLAMEGRAPH_ENV: &str = "BPFTIME_GPU_FLAMEGRAPH";
/// Set by `bpftime start --trace FILE` (and `run`): the agent writes a Perfetto/Chrome
/// trace of the target (traced calls, CUDA calls, launches, kernels, GPU lines) to
/// `FILE` at exit.
pub const TRACE_ENV: &str = "BPFTIME_TRACE";

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout the starter and the agent agree on, field by field: a change here is
    /// a change of [`AGENT_START_VERSION`].
    #[test]
    fn the_start_arguments_keep_their_layout() {
        assert_eq!(std::mem::size_of::<AgentStart>(), 64);
        assert_eq!(std::mem::offset_of!(AgentStart, version), 0);
        assert_eq!(std::mem::offset_of!(AgentStart, size), 4);
        assert_eq!(std::mem::offset_of!(AgentStart, on_starter_thread), 8);
        assert_eq!(std::mem::offset_of!(AgentStart, hook_flag_tp_offset), 16);
        assert_eq!(std::mem::offset_of!(AgentStart, syscall_tp_offset), 56);
        assert_eq!(AGENT_START_VERSION, 1);
    }

    #[test]
    fn arguments_of_another_build_are_refused_with_the_way_out() {
        let ours = AgentStart::new(false);
        assert_eq!(AgentStart::checked(Some(&ours)), Ok(&ours));
        assert_eq!(AgentStart::checked(None), Err(StartMismatch::Null));
        let mut old = ours;
        old.version = 0;
        let e = AgentStart::checked(Some(&old)).unwrap_err();
        assert!(e.to_string().contains("install them together"), "{e}");
        let mut short = ours;
        short.size = 56;
        assert!(matches!(
            AgentStart::checked(Some(&short)),
            Err(StartMismatch::Size { theirs: 56, .. })
        ));
    }
}
