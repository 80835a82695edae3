//! Hooks on every system call a process makes, for syscall tracepoints. Sites are
//! rewritten with `bpftime-attach`'s code patching, and a thread inside these hooks is
//! inside bpftime's handlers for the uprobes too (`bpftime_attach::in_handlers`).
//!
//! Complete coverage comes from Syscall User Dispatch (Linux 5.11): each thread of the
//! process is armed (`PR_SET_SYSCALL_USER_DISPATCH` with a selector byte in its static
//! TLS), and then every system call it makes from anywhere but our own code raises a
//! SIGSYS before it runs: from libc, from a program's own `syscall` instructions, from the
//! vDSO's fallbacks. The handler sends the thread into the entry (see `entry`), as if the
//! `syscall` instruction had been a call to it: the entry runs the programs watching the
//! number, makes the call from our code, runs the programs watching its return, and
//! resumes the thread past the instruction with the result.
//!
//! A signal per call costs microseconds. Where the page at address 0 can be mapped (root,
//! or `vm.mmap_min_addr` 0), each site that raised one is rewritten, on a thread of ours,
//! from `syscall` (`0f 05`) to `call *%rax` (`ff d0`), which lands at the number's address
//! in that page and slides to the entry; the site then costs a few nanoseconds (see
//! `rewrite`). A site that cannot be rewritten safely stays on the signal.
//!
//! Measured on Linux 6.18: dispatch is not inherited by threads or `fork` children and is
//! off after `execve`, so the entry arms each child itself before it resumes (`entry`), and
//! threads that exist when the first watcher comes are armed by a signal each. The kernel
//! answers a blocked SIGSYS by killing the process, so while armed the entry keeps SIGSYS
//! out of every signal mask the process sets, and keeps the process's own SIGSYS handler
//! (for seccomp's `SECCOMP_RET_TRAP`) apart, handing it the signals that are not ours.
//!
//! Nothing is armed until [`arm`] is called (when a program first watches system calls): a
//! process whose system calls nobody watches pays nothing. A process under seccomp is
//! left alone, with a notice.

mod arming;
mod entry;
mod rewrite;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicIsize, AtomicU64, AtomicU8, AtomicUsize, Ordering};

use bpftime_attach::PtRegs;
use bpftime_attach::{in_handlers, set_in_handlers};

pub use arming::{arm, disarm, ArmError, ArmReport};
pub use rewrite::RewriteStats;

/// System call numbers below this have a byte in [`FLAGS`]; the others always go through
/// `dispatch` (none has programs).
pub(crate) const NR_LIMIT: usize = 512;
/// Programs watch the number's entry.
const ENTER: u8 = 1;
/// Programs watch its return.
pub(crate) const EXIT: u8 = 2;
/// `dispatch` must see it, watched or not: signal handling, and the calls that must be
/// made from the caller's stack.
const SPECIAL: u8 = 4;

/// What the entry looks up for each number; nonzero sends it to `dispatch`.
pub(crate) static FLAGS: [AtomicU8; NR_LIMIT] = [const { AtomicU8::new(0) }; NR_LIMIT];

/// The return addresses of rewritten sites (site + 2), an open-addressed set the entry
/// checks each call through the page at 0 against.
pub(crate) const SITE_SLOTS: usize = 4096;
pub(crate) static SITES: [AtomicU64; SITE_SLOTS] = [const { AtomicU64::new(0) }; SITE_SLOTS];

/// Where each thread's 24 bytes of static TLS for dispatch are, from the thread pointer:
/// byte 0 its selector (1 once armed), byte 1 whether a child it makes arms itself, byte 2
/// whether it is inside a process-making call (see [`in_process_making_call`]), then at 8
/// the return address of such a call in flight, then at 16 its number.
pub(crate) static TLS_OFFSET: AtomicIsize = AtomicIsize::new(0);

const SYS_RT_SIGACTION: u64 = 13;
const SYS_RT_SIGPROCMASK: u64 = 14;
const SYS_RT_SIGRETURN: u64 = 15;
const SYS_CLONE: u64 = 56;
const SYS_FORK: u64 = 57;
const SYS_VFORK: u64 = 58;
const SYS_CLONE3: u64 = 435;
const CLONE_VM: u64 = 0x100;
const CLONE_SETTLS: u64 = 0x80000;
/// SIGSYS's bit in a signal set.
const SIGSYS_BIT: u64 = 1 << (libc::SIGSYS - 1);

/// What the programs of a watched system call are run by: the registers as the kernel's
/// `struct pt_regs` at the call (`orig_ax` the number, the arguments in di, si, dx, r10,
/// r8, r9, `ip` the address after the instruction, `ax` -ENOSYS at entry and the result
/// at return).
pub type SyscallHandler = fn(&PtRegs);

static ON_ENTER: AtomicUsize = AtomicUsize::new(0);
static ON_EXIT: AtomicUsize = AtomicUsize::new(0);
static ON_NEW_TASK: AtomicUsize = AtomicUsize::new(0);

/// What must forget what it cached of the thread's ids: run in every child a hooked call
/// made (first thing, before its programs) and in the caller after such a call (a `vfork`
/// child shares the caller's memory and wrote its own ids where the caller keeps its).
pub type NewTaskHandler = fn();

/// Gives the function that runs in a new process or thread and in its maker (once, before
/// [`arm`]).
pub fn set_new_task_handler(f: NewTaskHandler) {
    ON_NEW_TASK.store(f as usize, Ordering::Release);
}

/// Whether this thread is inside a system call that makes a process or a thread, from
/// before the programs watching its entry run until those watching its return ran (in the
/// caller and in the child). The C library's `fork` holds every lock of its `malloc` over
/// that call, so nothing run there may call `malloc`: the agent's allocator serves such
/// threads from memory of its own.
#[inline]
pub fn in_process_making_call() -> bool {
    // SAFETY: this thread's dispatch TLS.
    tls_byte(2).is_some_and(|b| unsafe { *b } != 0)
}

fn set_process_making_call(on: bool) {
    if let Some(b) = tls_byte(2) {
        // SAFETY: this thread's dispatch TLS.
        unsafe { *b = u8::from(on) };
    }
}

/// Gives the functions that run programs at system calls (once, before [`arm`]).
pub fn set_syscall_handlers(enter: SyscallHandler, exit: SyscallHandler) {
    ON_ENTER.store(enter as usize, Ordering::Release);
    ON_EXIT.store(exit as usize, Ordering::Release);
}

/// Which numbers have programs: at entry, at return, or neither. `None` for every number
/// (a raw tracepoint).
pub fn watch_syscall(nr: Option<u32>, enter: bool, exit: bool) {
    let set = |f: &AtomicU8| {
        let mut v = f.load(Ordering::Relaxed) & SPECIAL;
        if enter {
            v |= ENTER;
        }
        if exit {
            v |= EXIT;
        }
        f.store(v, Ordering::Release);
    };
    match nr {
        Some(nr) => {
            if let Some(f) = FLAGS.get(nr as usize) {
                set(f)
            }
        }
        None => FLAGS.iter().for_each(set),
    }
}

/// Gives dispatch 24 bytes of static TLS at `tp_offset` from the thread pointer in every
/// thread (the starter's), zero in every thread and used by nothing else.
///
/// # Safety
/// As said: the bytes must be static TLS of every thread, present and zero in threads
/// created later too.
pub unsafe fn use_static_tls(tp_offset: isize) {
    TLS_OFFSET.store(tp_offset, Ordering::Release);
}

fn handler(slot: &AtomicUsize) -> Option<SyscallHandler> {
    match slot.load(Ordering::Acquire) {
        0 => None,
        // SAFETY: only `set_syscall_handlers` stores here, a `SyscallHandler`.
        f => Some(unsafe { std::mem::transmute::<usize, SyscallHandler>(f) }),
    }
}

/// Runs `slot`'s handler with this thread's handlers masked, so that what it calls (a
/// helper's system calls, a hooked function) runs no programs; a panic stays here.
fn run(slot: &AtomicUsize, regs: &PtRegs) {
    let Some(f) = handler(slot) else {
        return;
    };
    set_in_handlers(true);
    if catch_unwind(AssertUnwindSafe(|| f(regs))).is_err() {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            tracing::error!("a system call handler panicked; its programs did not run");
        });
    }
    set_in_handlers(false);
}

/// This thread's dispatch TLS, at byte `at`.
fn tls_byte(at: isize) -> Option<*mut u8> {
    let off = TLS_OFFSET.load(Ordering::Relaxed);
    if off == 0 {
        return None;
    }
    let tp: usize;
    // SAFETY: reads the thread pointer, which the x86-64 TLS ABI keeps at fs:0.
    unsafe {
        std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags))
    };
    Some((tp as isize + off + at) as *mut u8)
}

/// Called by the entry with the frame it saved; answers what the entry does next.
pub(crate) extern "C" fn dispatch(regs: *mut PtRegs) -> u64 {
    // SAFETY: the entry's frame, on this thread's stack, for this call only.
    let regs = unsafe { &mut *regs };
    let nr = regs.orig_ax;
    let flags = FLAGS
        .get(nr as usize)
        .map_or(0, |f| f.load(Ordering::Acquire));
    // Our own threads, and code running programs already, run none.
    let programs = !in_handlers();
    if matches!(nr, SYS_CLONE | SYS_FORK | SYS_VFORK | SYS_CLONE3) {
        set_process_making_call(true);
    }
    if programs && flags & ENTER != 0 {
        run(&ON_ENTER, regs);
    }
    match nr {
        SYS_RT_SIGRETURN => return entry::SIGRETURN,
        SYS_CLONE | SYS_FORK | SYS_VFORK | SYS_CLONE3 => {
            // SAFETY: the frame holds the call's arguments as the caller gave them.
            unsafe { prepare_fork(regs) };
            return entry::FORK;
        }
        _ => {}
    }
    let r = &*regs;
    let ret = match nr {
        // SAFETY: the caller's arguments, as it would have passed them to the kernel.
        SYS_RT_SIGACTION => unsafe { arming::sigaction(r.di, r.si, r.dx, r.r10) },
        // SAFETY: as above.
        SYS_RT_SIGPROCMASK => unsafe { arming::sigprocmask(r.di, r.si, r.dx, r.r10) },
        // The entry makes every other call itself: a return from here after a system
        // call would be mispredicted (the kernel may have emptied the return stack
        // buffer), about 40 ns on our AMD EPYC VM.
        _ => return entry::EXECUTE,
    };
    regs.ax = ret as u64;
    returned(regs);
    entry::DONE
}

/// Called by the entry once a call it made returned (`ax` the result): the programs
/// watching the return.
pub(crate) extern "C" fn returned(regs: *mut PtRegs) {
    // SAFETY: the entry's frame, on this thread's stack, for this call only.
    let regs = unsafe { &*regs };
    let watched = FLAGS
        .get(regs.orig_ax as usize)
        .is_some_and(|f| f.load(Ordering::Acquire) & EXIT != 0);
    if watched && !in_handlers() {
        run(&ON_EXIT, regs);
    }
}

/// Before a call that makes a process or a thread: where the caller (and the child)
/// resume, the number, and whether the child arms itself, in this thread's TLS and in the
/// child's, when it has TLS of its own.
///
/// # Safety
/// `regs` holds the call's arguments; a `clone3` argument points to its `clone_args`.
unsafe fn prepare_fork(regs: &PtRegs) {
    let Some(me) = tls_byte(0) else {
        return;
    };
    // SAFETY: this thread's own dispatch TLS.
    let armed = unsafe { *me };
    let write = |base: *mut u8| {
        // SAFETY: `base` is dispatch TLS, of this thread or of the child about to start
        // with it, which nothing else uses yet.
        unsafe {
            *base.add(1) = armed;
            std::ptr::write_unaligned(base.add(8).cast::<u64>(), regs.ip);
            std::ptr::write_unaligned(base.add(16).cast::<u64>(), regs.orig_ax);
        }
    };
    write(me);
    let (flags, tls) = match regs.orig_ax {
        SYS_CLONE => (regs.di, regs.r8),
        SYS_CLONE3 if regs.di != 0 && regs.si >= 64 => {
            let args = regs.di as *const u64;
            // SAFETY: caller obligation: `struct clone_args`, of at least 64 bytes as its
            // size says: flags first, tls at 56.
            unsafe {
                (
                    std::ptr::read_unaligned(args),
                    std::ptr::read_unaligned(args.add(7)),
                )
            }
        }
        _ => (0, 0),
    };
    if flags & CLONE_SETTLS != 0 && flags & CLONE_VM != 0 && tls != 0 {
        let off = TLS_OFFSET.load(Ordering::Relaxed);
        write((tls as isize + off) as *mut u8);
    }
}

/// Called by the entry in the caller of a process-making call once it returned `ret`:
/// the programs watching the return.
pub(crate) extern "C" fn returned_from_fork(ret: i64) {
    new_task();
    after_process_making_call(ret);
}

/// Called by the entry in the child of a process-making call, armed if its maker was:
/// what it cached of its maker's ids is forgotten, then the programs watching the call's
/// return run with 0, as the kernel runs them in the child.
pub(crate) extern "C" fn returned_in_child() {
    new_task();
    after_process_making_call(0);
}

fn new_task() {
    let f = match ON_NEW_TASK.load(Ordering::Acquire) {
        0 => return,
        // SAFETY: only `set_new_task_handler` stores here, a `NewTaskHandler`.
        f => unsafe { std::mem::transmute::<usize, NewTaskHandler>(f) },
    };
    let _ = catch_unwind(f);
}

/// The programs watching the return of the process-making call this thread's dispatch
/// TLS names, with `ret`; then the thread is out of the call.
fn after_process_making_call(ret: i64) {
    let Some(me) = tls_byte(0) else {
        return;
    };
    // SAFETY: this thread's own dispatch TLS, written by `prepare_fork`.
    let (ip, nr) = unsafe {
        (
            std::ptr::read_unaligned(me.add(8).cast::<u64>()),
            std::ptr::read_unaligned(me.add(16).cast::<u64>()),
        )
    };
    let flags = FLAGS
        .get(nr as usize)
        .map_or(0, |f| f.load(Ordering::Acquire));
    if flags & EXIT != 0 && !in_handlers() {
        let regs = PtRegs {
            ax: ret as u64,
            orig_ax: nr,
            ip,
            cx: ip,
            cs: 0x33,
            ss: 0x2b,
            ..PtRegs::default()
        };
        run(&ON_EXIT, &regs);
    }
    set_process_making_call(false);
}

/// What the hooks did so far, for notices and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyscallStats {
    /// System calls that came in through SIGSYS.
    pub trapped: u64,
    pub rewrite: RewriteStats,
}

pub fn syscall_stats() -> SyscallStats {
    SyscallStats {
        trapped: arming::TRAPPED.load(Ordering::Relaxed),
        rewrite: rewrite::stats(),
    }
}
