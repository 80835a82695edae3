//! Loads a shared library into a running process, as `dlopen(path, RTLD_NOW)`
//! called by one of its own threads (`bpftime attach PID`).
//!
//! How: the thread is seized with ptrace and interrupted; when it stopped
//! inside the C library or the dynamic loader (where it may hold the malloc or
//! loader lock), it is let run a little and interrupted again. Its registers
//! (general and extended state) are saved; the library path is written below
//! the red zone of its stack, under a return address of 0; `dlopen` (found in
//! the C library's dynamic symbols, at the bias /proc/PID/maps gives) is
//! called with the thread's registers pointed at it. The return to address 0
//! faults, which ptrace reports before any handler runs; the result is read
//! from `rax` and, on failure, `dlerror()` is called the same way. Then the
//! stack bytes and all registers are put back exactly and the thread is
//! detached. A thread stopped inside a system call keeps `orig_rax` and the
//! `-ERESTART*` value in `rax`, so the kernel restarts the call as if it had
//! been interrupted by a signal without a handler (a blocked `read()` keeps
//! waiting; `nanosleep()` resumes with the time left). Signals that arrive
//! while the call runs are held back and delivered at detach.
//!
//! Known limits: a signal that interrupts a timed wait inside the injected
//! call overwrites the kernel's restart block of the original `nanosleep`/
//! `poll`; processes with shadow stacks (CET) or that block SIGSEGV are
//! refused.

mod error;
mod procfs;
mod symbols;
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod tracee;

pub use error::{InjectError, Result};

use std::path::Path;

/// What a successful [`Target::load_library`] did.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The handle `dlopen` returned in the target.
    pub handle: u64,
    /// The thread that made the call.
    pub tid: i32,
    /// The thread was blocked in a system call, which was restarted.
    pub was_in_syscall: bool,
    /// Signals that arrived during the call and were delivered at detach.
    pub held_signals: Vec<i32>,
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod x86_64;
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub use x86_64::Target;

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
/// A process to load a library into (unsupported on this host).
pub struct Target {
    pid: i32,
}

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
impl Target {
    pub fn check(_pid: i32) -> Result<()> {
        Err(InjectError::UnsupportedHost)
    }
    pub fn attach(_pid: i32) -> Result<Target> {
        Err(InjectError::UnsupportedHost)
    }
    pub fn pid(&self) -> i32 {
        self.pid
    }
    pub fn pid_in_namespace(&self) -> i32 {
        self.pid
    }
    pub fn load_library(self, _library: &Path) -> Result<Loaded> {
        Err(InjectError::UnsupportedHost)
    }
}

/// Loads `library` into process `pid`: [`Target::attach`] then
/// [`Target::load_library`].
pub fn inject(pid: i32, library: &Path) -> Result<Loaded> {
    Target::attach(pid)?.load_library(library)
}
