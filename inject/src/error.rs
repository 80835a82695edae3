use std::io;
use std::path::PathBuf;
use thiserror::Error;

/// Why a library could not be loaded into a process. Each message names the
/// problem and what to do about it.
#[derive(Debug, Error)]
pub enum InjectError {
    #[error("no process {pid}: it has exited or never existed")]
    NoSuchProcess { pid: i32 },

    #[error("process {pid} has exited (a zombie waiting for its parent to reap it); there is nothing to attach to")]
    Zombie { pid: i32 },

    #[error("process {pid} is a kernel thread; only user processes can be attached to")]
    KernelThread { pid: i32 },

    #[error("{pid} is a thread of process {tgid}; give the process id: bpftime attach {tgid}")]
    NotAProcess { pid: i32, tgid: i32 },

    #[error("bpftime cannot attach to itself")]
    Itself,

    #[error("not permitted to trace process {pid}: {why}; {fix}")]
    PermissionDenied { pid: i32, why: String, fix: String },

    #[error("process {pid} is already traced by process {tracer} ({tracer_name}); only one tracer may attach at a time: detach that debugger or tracer first")]
    AlreadyTraced {
        pid: i32,
        tracer: i32,
        tracer_name: String,
    },

    #[error("process {pid} is stopped (job control or SIGSTOP); resume it with `kill -CONT {pid}` first")]
    Stopped { pid: i32 },

    #[error("process {pid} runs {what}; bpftime attach supports x86-64 processes only")]
    NotX86_64 { pid: i32, what: String },

    #[error(
        "bpftime attach works on x86-64 Linux only; start the program with `bpftime start` instead"
    )]
    UnsupportedHost,

    #[error("process {pid} has no dynamic loader to call ({why}); start the program with `bpftime start` instead")]
    NoDlopen { pid: i32, why: String },

    #[error("the C library mapped in process {pid} differs from {path} on disk (upgraded since the process started?); restart the process to attach to it")]
    LibcChanged { pid: i32, path: String },

    #[error("process {pid} is in another mount namespace (a container?), where {library} may not exist; run bpftime attach inside that namespace")]
    OtherMountNamespace { pid: i32, library: PathBuf },

    #[error("thread {tid} of process {pid} uses a shadow stack (CET), which a call injected from outside cannot return through; start the program with `bpftime start` instead")]
    ShadowStack { pid: i32, tid: i32 },

    #[error("thread {tid} of process {pid} blocks or ignores SIGSEGV, which bpftime attach needs to regain control after its call; start the program with `bpftime start` instead")]
    SegvUnavailable { pid: i32, tid: i32 },

    #[error("{library} is already loaded in process {pid}; it was started with `bpftime start` or attached before, and already runs its programs")]
    AlreadyLoaded { pid: i32, library: PathBuf },

    #[error("process {pid} stayed inside the C library or the dynamic loader for {tries} tries, where a call from outside could deadlock; try again")]
    Busy { pid: i32, tries: u32 },

    #[error("the stack pointer {rsp:#x} of thread {tid} in process {pid} is not in writable memory; cannot make a call there")]
    BadStack { pid: i32, tid: i32, rsp: u64 },

    #[error("library {path}: {source}")]
    Library { path: PathBuf, source: io::Error },

    #[error("dlopen({library}) failed in process {pid}: {message}")]
    DlopenFailed {
        pid: i32,
        library: PathBuf,
        message: String,
    },

    #[error("the injected call to {function} in process {pid} died with signal {signal} at {rip:#x} (fault address {addr:#x}); registers were restored but the process may be damaged")]
    RemoteFault {
        pid: i32,
        function: &'static str,
        signal: i32,
        rip: u64,
        addr: u64,
    },

    #[error("process {pid} exited while bpftime was attached to it")]
    ExitedDuringAttach { pid: i32 },

    #[error("cannot {what} (process {pid}): {source}")]
    Os {
        pid: i32,
        what: &'static str,
        source: io::Error,
    },

    #[error("cannot read the ELF file {path} mapped in process {pid}: {why}")]
    Elf { pid: i32, path: String, why: String },
}

impl InjectError {
    /// True when the process was left untouched because a precondition does not
    /// hold (the user can fix the request or the environment); false when
    /// something went wrong while the library was being loaded.
    pub fn is_refusal(&self) -> bool {
        !matches!(
            self,
            InjectError::DlopenFailed { .. }
                | InjectError::RemoteFault { .. }
                | InjectError::ExitedDuringAttach { .. }
                | InjectError::Os { .. }
        )
    }
}

pub type Result<T, E = InjectError> = std::result::Result<T, E>;
