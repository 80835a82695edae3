//! One traced thread: thin, checked wrappers over ptrace(2) and waitpid(2)
//! for x86-64. Every request must come from the thread that seized the
//! tracee, which is why [`Tracee`] is neither `Send` nor `Sync`.

use std::io;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

pub(crate) type Regs = libc::user_regs_struct;

const NT_X86_XSTATE: usize = 0x202;
/// Large enough for every XSAVE layout in use (AVX-512 and AMX tiles
/// included); the kernel says how much it filled.
const XSTATE_MAX: usize = 64 * 1024;

/// The extended register state (x87, SSE, AVX, AVX-512...), as the kernel
/// hands it out, to be handed back unchanged.
pub(crate) enum FpState {
    Xsave(Vec<u8>),
    Fxsave(Box<libc::user_fpregs_struct>),
}

/// What waitpid reported.
#[derive(Debug)]
pub(crate) enum Stop {
    /// A signal is about to be delivered (signal-delivery-stop).
    Signal { signal: i32, info: libc::siginfo_t },
    /// `PTRACE_EVENT_STOP`: our interrupt, or a group stop.
    Event,
    /// Any other ptrace event (none are requested).
    Other,
    /// The thread is gone.
    Gone,
}

pub(crate) struct Tracee {
    pub tid: i32,
    _not_send: PhantomData<*const ()>,
}

fn check(r: libc::c_long) -> io::Result<libc::c_long> {
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

impl Tracee {
    /// PTRACE_SEIZE: traces `tid` without stopping it.
    pub fn seize(tid: i32) -> io::Result<Tracee> {
        // SAFETY: PTRACE_SEIZE takes no pointers (addr 0, data = options 0).
        check(unsafe {
            libc::ptrace(
                libc::PTRACE_SEIZE,
                tid,
                std::ptr::null_mut::<libc::c_void>(),
                std::ptr::null_mut::<libc::c_void>(),
            )
        })?;
        Ok(Tracee {
            tid,
            _not_send: PhantomData,
        })
    }

    fn request(&self, req: libc::c_uint, addr: usize, data: usize) -> io::Result<()> {
        // SAFETY: callers pass requests whose addr/data are plain integers or
        // point to live buffers of the size the request writes.
        check(unsafe {
            libc::ptrace(
                req,
                self.tid,
                addr as *mut libc::c_void,
                data as *mut libc::c_void,
            )
        })
        .map(drop)
    }

    pub fn interrupt(&self) -> io::Result<()> {
        self.request(libc::PTRACE_INTERRUPT, 0, 0)
    }

    /// Resumes the stopped thread, delivering `signal` (0: none).
    pub fn cont(&self, signal: i32) -> io::Result<()> {
        self.request(libc::PTRACE_CONT, 0, signal as usize)
    }

    pub fn detach(&self, signal: i32) -> io::Result<()> {
        self.request(libc::PTRACE_DETACH, 0, signal as usize)
    }

    pub fn regs(&self) -> io::Result<Regs> {
        // SAFETY: user_regs_struct is plain integers; all-zero is valid.
        let mut regs: Regs = unsafe { std::mem::zeroed() };
        self.request(libc::PTRACE_GETREGS, 0, &mut regs as *mut Regs as usize)?;
        Ok(regs)
    }

    pub fn set_regs(&self, regs: &Regs) -> io::Result<()> {
        self.request(libc::PTRACE_SETREGS, 0, regs as *const Regs as usize)
    }

    pub fn fp_state(&self) -> io::Result<FpState> {
        let mut buf = vec![0u8; XSTATE_MAX];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        match self.request(
            libc::PTRACE_GETREGSET,
            NT_X86_XSTATE,
            &mut iov as *mut libc::iovec as usize,
        ) {
            Ok(()) => {
                buf.truncate(iov.iov_len);
                Ok(FpState::Xsave(buf))
            }
            // CPUs without XSAVE: the legacy FXSAVE area is all there is.
            Err(_) => {
                // SAFETY: user_fpregs_struct is plain integers.
                let mut fx: Box<libc::user_fpregs_struct> = Box::new(unsafe { std::mem::zeroed() });
                self.request(
                    libc::PTRACE_GETFPREGS,
                    0,
                    &mut *fx as *mut libc::user_fpregs_struct as usize,
                )?;
                Ok(FpState::Fxsave(fx))
            }
        }
    }

    pub fn set_fp_state(&self, state: &FpState) -> io::Result<()> {
        match state {
            FpState::Xsave(buf) => {
                let iov = libc::iovec {
                    iov_base: buf.as_ptr() as *mut libc::c_void,
                    iov_len: buf.len(),
                };
                self.request(
                    libc::PTRACE_SETREGSET,
                    NT_X86_XSTATE,
                    &iov as *const libc::iovec as usize,
                )
            }
            FpState::Fxsave(fx) => self.request(
                libc::PTRACE_SETFPREGS,
                0,
                &**fx as *const libc::user_fpregs_struct as usize,
            ),
        }
    }

    pub fn siginfo(&self) -> io::Result<libc::siginfo_t> {
        // SAFETY: siginfo_t is plain data; all-zero is valid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        self.request(
            libc::PTRACE_GETSIGINFO,
            0,
            &mut info as *mut libc::siginfo_t as usize,
        )?;
        Ok(info)
    }

    pub fn set_siginfo(&self, info: &libc::siginfo_t) -> io::Result<()> {
        self.request(
            libc::PTRACE_SETSIGINFO,
            0,
            info as *const libc::siginfo_t as usize,
        )
    }

    /// Waits for the next stop. After `patience` without one, calls `waiting`
    /// once (so a slow library constructor is reported, not silently waited on).
    pub fn wait(&self, patience: Duration, waiting: &mut dyn FnMut()) -> io::Result<Stop> {
        let start = Instant::now();
        let mut warned = false;
        let mut nap = Duration::from_micros(50);
        loop {
            let mut status = 0;
            // SAFETY: waitpid writes one int.
            let r = unsafe { libc::waitpid(self.tid, &mut status, libc::__WALL | libc::WNOHANG) };
            if r == -1 {
                let e = io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::ECHILD) => Ok(Stop::Gone),
                    _ => Err(e),
                };
            }
            if r == 0 {
                if !warned && start.elapsed() > patience {
                    warned = true;
                    waiting();
                }
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_millis(5));
                continue;
            }
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                return Ok(Stop::Gone);
            }
            if !libc::WIFSTOPPED(status) {
                continue;
            }
            let signal = libc::WSTOPSIG(status);
            let event = (status >> 16) & 0xff;
            return Ok(match event {
                0 => match self.siginfo() {
                    Ok(info) => Stop::Signal { signal, info },
                    // No siginfo means a group stop (PTRACE_ATTACH-style tracees only).
                    Err(_) => Stop::Event,
                },
                libc::PTRACE_EVENT_STOP => Stop::Event,
                _ => Stop::Other,
            });
        }
    }
}

/// True for signals the kernel raises on a fault of the instruction just run:
/// suppressing one would only make the instruction fault again.
pub(crate) fn is_fault(signal: i32, info: &libc::siginfo_t) -> bool {
    matches!(
        signal,
        libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE | libc::SIGTRAP
    ) && info.si_code > 0
}

/// The faulting address of a SIGSEGV/SIGBUS/SIGILL/SIGFPE.
pub(crate) fn fault_address(info: &libc::siginfo_t) -> u64 {
    // SAFETY: for fault signals the kernel fills si_addr; for others the union
    // holds some other integer, which is only printed.
    unsafe { info.si_addr() as u64 }
}

/// Blocks the signals that would end or stop this tool while a target is
/// stopped with borrowed registers; they are delivered when this is dropped,
/// after the target is restored and detached.
pub(crate) struct HoldTermination {
    old: libc::sigset_t,
}

impl HoldTermination {
    pub fn new() -> HoldTermination {
        // SAFETY: sigset operations on local, initialised sets.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in [
                libc::SIGINT,
                libc::SIGTERM,
                libc::SIGHUP,
                libc::SIGQUIT,
                libc::SIGTSTP,
                libc::SIGPIPE,
            ] {
                libc::sigaddset(&mut set, s);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            HoldTermination { old }
        }
    }
}

impl Drop for HoldTermination {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `new`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}
