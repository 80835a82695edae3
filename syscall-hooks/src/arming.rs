//! Arming threads for Syscall User Dispatch, the SIGSYS handler, and keeping SIGSYS
//! deliverable while armed.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::entry::{self, raw};
use crate::{rewrite, tls_byte, FLAGS, SIGSYS_BIT, SPECIAL, TLS_OFFSET};
use bpftime_attach::{patch, signals};

/// The signals no mask may block while armed: SIGSYS (the kernel kills a process whose
/// dispatched call meets it blocked) and SIGTRAP (a thread that meets a site mid-rewrite
/// takes one, which the kernel turns into a kill when blocked: the C library blocks every
/// signal while it makes a thread or spawns a process).
const KEPT: u64 = SIGSYS_BIT | 1 << (libc::SIGTRAP - 1);
use bpftime_attach::in_handlers;

const SYS_GETTID: u64 = 186;
const SYS_PRCTL: u64 = 157;
const SYS_TGKILL: u64 = 234;
const PR_SET_SYSCALL_USER_DISPATCH: u64 = 59;
const PR_SYS_DISPATCH_OFF: u64 = 0;
const PR_SYS_DISPATCH_ON: u64 = 1;
/// `si_code` of a SIGSYS raised by Syscall User Dispatch.
const SYS_USER_DISPATCH: i32 = 2;
/// `SA_RESTORER`: the kernel returns from our handlers through `entry::restorer`.
const SA_RESTORER: u64 = 0x0400_0000;

/// System calls that came in through SIGSYS.
pub(crate) static TRAPPED: AtomicU64 = AtomicU64::new(0);
/// Whether the process was ever armed: from then on its signal masks and its SIGSYS and
/// SIGTRAP dispositions are kept as dispatch needs them, also after a disarm (a thread
/// may still be armed while the others are told, and a child armed by its parent).
static ARMED: AtomicBool = AtomicBool::new(false);
static ONE_ARMER: Mutex<()> = Mutex::new(());

/// Why system calls cannot be hooked in this process.
#[derive(Debug, thiserror::Error)]
pub enum ArmError {
    #[error("no static TLS for the hooks' per-thread selector (the agent was not started by the starter library)")]
    NoStaticTls,
    #[error("the process runs under seccomp (mode {0}), which Syscall User Dispatch would have to cooperate with; its system calls are left alone")]
    Seccomp(u32),
    #[error("no real-time signal is free to arm the process's threads with")]
    NoSignal,
    #[error("the SIGSYS handler cannot be installed: {0}")]
    Handler(std::io::Error),
    #[error("this kernel has no Syscall User Dispatch (Linux 5.11 and later): {0}")]
    Unsupported(std::io::Error),
}

/// What [`arm`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArmReport {
    /// Threads of the application armed now.
    pub armed: usize,
    /// Threads that did not answer (they block the signal, or never ran): their system
    /// calls are not seen until they make a new thread or process.
    pub unanswered: usize,
    /// Why sites are not rewritten, if they are not: every call then takes a signal.
    pub slow_only: Option<String>,
}

/// The kernel's `struct sigaction` for `rt_sigaction`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KSigaction {
    handler: u64,
    flags: u64,
    restorer: u64,
    mask: u64,
}

/// The process's own SIGSYS disposition, which ours stands in front of.
static APP_SIGSYS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

fn app_sigsys() -> KSigaction {
    KSigaction {
        handler: APP_SIGSYS[0].load(Ordering::Acquire),
        flags: APP_SIGSYS[1].load(Ordering::Acquire),
        restorer: APP_SIGSYS[2].load(Ordering::Acquire),
        mask: APP_SIGSYS[3].load(Ordering::Acquire),
    }
}

fn set_app_sigsys(a: &KSigaction) {
    APP_SIGSYS[0].store(a.handler, Ordering::Release);
    APP_SIGSYS[1].store(a.flags, Ordering::Release);
    APP_SIGSYS[2].store(a.restorer, Ordering::Release);
    APP_SIGSYS[3].store(a.mask, Ordering::Release);
}

fn errno_of(r: i64) -> std::io::Error {
    std::io::Error::from_raw_os_error((-r) as i32)
}

fn install_sigsys_handler() -> Result<(), ArmError> {
    static INSTALLED: AtomicBool = AtomicBool::new(false);
    if INSTALLED.load(Ordering::Acquire) {
        return Ok(());
    }
    let ours = KSigaction {
        handler: on_sigsys as *const () as u64,
        flags: libc::SA_SIGINFO as u64 | libc::SA_ONSTACK as u64 | SA_RESTORER,
        restorer: entry::restorer() as u64,
        mask: 0,
    };
    let mut previous = KSigaction::default();
    // SAFETY: two live kernel sigaction structures, the size of a signal set; the handler
    // is async-signal-safe and returns through our restorer.
    let r = unsafe {
        raw(
            libc::SYS_rt_sigaction as u64,
            libc::SIGSYS as u64,
            &ours as *const KSigaction as u64,
            &mut previous as *mut KSigaction as u64,
            8,
            0,
            0,
        )
    };
    if r < 0 {
        return Err(ArmError::Handler(errno_of(r)));
    }
    set_app_sigsys(&previous);
    INSTALLED.store(true, Ordering::Release);
    Ok(())
}

/// The seccomp mode of this process, from /proc.
fn seccomp_mode() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Seccomp:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Arms every thread of the application (not ours, which never run handlers) and the
/// hooks' machinery: from here on every system call of the process goes through the
/// entry. Threads made later arm themselves as they start.
pub fn arm() -> Result<ArmReport, ArmError> {
    let _one = ONE_ARMER.lock().unwrap_or_else(|e| e.into_inner());
    if TLS_OFFSET.load(Ordering::Acquire) == 0 {
        return Err(ArmError::NoStaticTls);
    }
    match seccomp_mode() {
        0 => {}
        mode => return Err(ArmError::Seccomp(mode)),
    }
    // This thread (ours) answers whether the kernel has the feature at all, with a
    // setting it then takes back.
    let (start, end) = entry::allowed_range();
    let probe = AtomicU8::new(0);
    // SAFETY: prctl with a live selector byte; undone just below.
    let r = unsafe {
        raw(
            SYS_PRCTL,
            PR_SET_SYSCALL_USER_DISPATCH,
            PR_SYS_DISPATCH_ON,
            start as u64,
            (end - start) as u64,
            probe.as_ptr() as u64,
            0,
        )
    };
    if r < 0 {
        return Err(ArmError::Unsupported(errno_of(r)));
    }
    // SAFETY: turns it off again for this thread.
    unsafe {
        raw(
            SYS_PRCTL,
            PR_SET_SYSCALL_USER_DISPATCH,
            PR_SYS_DISPATCH_OFF,
            0,
            0,
            0,
            0,
        )
    };
    install_sigsys_handler()?;
    for nr in [13, 14, 15, 56, 57, 58, 435] {
        FLAGS[nr].fetch_or(SPECIAL, Ordering::AcqRel);
    }
    let slow_only = rewrite::start().err();
    ARMED.store(true, Ordering::Release);
    let (armed, unanswered) = broadcast(Request::Arm)?;
    Ok(ArmReport {
        armed,
        unanswered,
        slow_only,
    })
}

/// Disarms every thread: system calls go straight to the kernel again, but for rewritten
/// sites, which keep going through the entry (a few nanoseconds, no programs). Signal
/// masks and dispositions stay kept (see `ARMED`).
pub fn disarm() -> Result<usize, ArmError> {
    let _one = ONE_ARMER.lock().unwrap_or_else(|e| e.into_inner());
    let (n, _) = broadcast(Request::Disarm)?;
    Ok(n)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Request {
    Arm = 1,
    Disarm = 2,
}

/// The signal that carries arming requests, and the disposition it replaced.
static CARRIER: AtomicI32 = AtomicI32::new(0);
static CARRIER_PREVIOUS: std::sync::OnceLock<KSigaction> = std::sync::OnceLock::new();
/// The request being answered: its kind and generation, and where answers go.
static REQUEST: AtomicU64 = AtomicU64::new(0);
const ANSWER_SLOTS: usize = 4096;
static ANSWERS: [AtomicI32; ANSWER_SLOTS] = [const { AtomicI32::new(0) }; ANSWER_SLOTS];
static ANSWERED: AtomicUsize = AtomicUsize::new(0);
static PID: AtomicI32 = AtomicI32::new(0);
const TAG: u64 = 0x5ca1 << 48;

/// The signal that carries requests, installed with our restorer: its `rt_sigreturn`
/// is then one of ours, never a call of the application's that tools would see.
fn carrier() -> Result<i32, ArmError> {
    let sig = CARRIER.load(Ordering::Acquire);
    if sig != 0 {
        return Ok(sig);
    }
    for sig in (libc::SIGRTMIN() + 1..=libc::SIGRTMAX()).rev() {
        let mut previous = KSigaction::default();
        // SAFETY: only reads the disposition.
        let r = unsafe {
            raw(
                libc::SYS_rt_sigaction as u64,
                sig as u64,
                0,
                &mut previous as *mut KSigaction as u64,
                8,
                0,
                0,
            )
        };
        if r != 0 || previous.handler != libc::SIG_DFL as u64 {
            continue;
        }
        let ours = KSigaction {
            handler: on_arm as *const () as u64,
            flags: (libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART) as u64 | SA_RESTORER,
            restorer: entry::restorer() as u64,
            mask: 0,
        };
        // SAFETY: live kernel sigaction structures; the handler is async-signal-safe and
        // returns through our restorer.
        let r = unsafe {
            raw(
                libc::SYS_rt_sigaction as u64,
                sig as u64,
                &ours as *const KSigaction as u64,
                &mut previous as *mut KSigaction as u64,
                8,
                0,
                0,
            )
        };
        if r != 0 {
            continue;
        }
        let _ = CARRIER_PREVIOUS.set(previous);
        CARRIER.store(sig, Ordering::Release);
        return Ok(sig);
    }
    Err(ArmError::NoSignal)
}

fn threads() -> Vec<i32> {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Asks every thread to arm (or disarm) itself; returns how many application threads
/// did, and how many never answered.
fn broadcast(request: Request) -> Result<(usize, usize), ArmError> {
    let sig = carrier()?;
    // SAFETY: no preconditions.
    let pid = unsafe { libc::getpid() };
    PID.store(pid, Ordering::Release);
    static GENERATION: AtomicU64 = AtomicU64::new(0);
    let generation = GENERATION.fetch_add(1, Ordering::Relaxed) + 1;
    let value = TAG | (generation & 0xffff_ffff) << 8 | request as u64;
    ANSWERED.store(0, Ordering::Release);
    for a in &ANSWERS {
        a.store(0, Ordering::Relaxed);
    }
    REQUEST.store(value, Ordering::Release);
    let mut asked: HashSet<i32> = HashSet::new();
    let mut lost = 0;
    // Threads may be made while we ask; the ones made by armed threads arm themselves,
    // the others are asked in a later round.
    for _round in 0..8 {
        let fresh: Vec<i32> = threads()
            .into_iter()
            .filter(|t| !asked.contains(t))
            .collect();
        if fresh.is_empty() {
            break;
        }
        for &tid in &fresh {
            asked.insert(tid);
            // SAFETY: sigqueueinfo to a thread of our own process with a plain value.
            let r = unsafe {
                let mut info: libc::siginfo_t = std::mem::zeroed();
                let q = &mut info as *mut libc::siginfo_t as *mut u8;
                // signo, errno, code, pad, pid, uid, value (the layout of a queued signal).
                std::ptr::write(q.cast::<i32>(), sig);
                std::ptr::write(q.add(8).cast::<i32>(), libc::SI_QUEUE);
                std::ptr::write(q.add(16).cast::<i32>(), pid);
                std::ptr::write(q.add(20).cast::<u32>(), libc::getuid());
                std::ptr::write(q.add(24).cast::<u64>(), value);
                libc::syscall(libc::SYS_rt_tgsigqueueinfo, pid, tid, sig, &info)
            };
            if r != 0 {
                // Exited meanwhile.
                lost += 1;
            }
        }
        let deadline = Instant::now() + Duration::from_millis(500);
        while ANSWERED.load(Ordering::Acquire) + lost < asked.len() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    REQUEST.store(0, Ordering::Release);
    let n = ANSWERED.load(Ordering::Acquire).min(ANSWER_SLOTS);
    let answers: Vec<i32> = ANSWERS[..n]
        .iter()
        .map(|a| a.load(Ordering::Acquire))
        .collect();
    let done = answers.iter().filter(|&&a| a > 0).count();
    let unanswered = asked.len().saturating_sub(answers.len() + lost);
    Ok((done, unanswered))
}

extern "C" fn on_arm(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel's siginfo for a queued signal: code at 8, pid at 16, value at 24.
    let (code, pid, value) = unsafe {
        let q = info as *const u8;
        (
            std::ptr::read(q.add(8).cast::<i32>()),
            std::ptr::read(q.add(16).cast::<i32>()),
            std::ptr::read(q.add(24).cast::<u64>()),
        )
    };
    let ours = code == libc::SI_QUEUE
        && value & (0xffff << 48) == TAG
        && pid == PID.load(Ordering::Acquire);
    if !ours {
        if let Some(prev) = CARRIER_PREVIOUS.get() {
            // SAFETY: a zeroed sigaction is a valid value; only handler and flags matter.
            let mut p: libc::sigaction = unsafe { std::mem::zeroed() };
            p.sa_sigaction = prev.handler as usize;
            p.sa_flags = prev.flags as libc::c_int;
            // SAFETY: as the kernel handed them to us, for the handler ours replaced.
            unsafe { signals::chain(&p, sig, info, ctx) };
        }
        return;
    }
    if value != REQUEST.load(Ordering::Acquire) {
        return;
    }
    // Our own threads are never armed (their work is not the application's): answered 0.
    let result = if in_handlers() {
        0
    } else if value & 0xff == Request::Arm as u64 {
        // SAFETY: the handler's ucontext, whose mask the thread gets back on return.
        unsafe { unblock_sigsys(ctx) };
        if arm_this_thread() {
            1
        } else {
            -1
        }
    } else {
        disarm_this_thread();
        1
    };
    // SAFETY: gettid from our range takes no arguments.
    let tid = unsafe { raw(SYS_GETTID, 0, 0, 0, 0, 0, 0) } as i32;
    let slot = ANSWERED.fetch_add(1, Ordering::AcqRel);
    if let Some(a) = ANSWERS.get(slot) {
        a.store(if result > 0 { tid } else { result }, Ordering::Release);
    }
}

/// Takes SIGSYS and SIGTRAP out of the mask a signal handler's thread resumes with.
///
/// # Safety
/// `ctx` is the ucontext the kernel handed an SA_SIGINFO handler.
unsafe fn unblock_sigsys(ctx: *mut libc::c_void) {
    let uc = ctx.cast::<libc::ucontext_t>();
    // SAFETY: caller obligation; the first word of the mask holds the standard signals.
    unsafe {
        let mask = std::ptr::addr_of_mut!((*uc).uc_sigmask).cast::<u64>();
        *mask &= !KEPT;
    }
}

/// Arms the calling thread (from a signal handler or a child's first instructions).
fn arm_this_thread() -> bool {
    let Some(sel) = tls_byte(0) else {
        return false;
    };
    // SAFETY: this thread's selector byte; blocking from now on.
    unsafe { sel.write_volatile(1) };
    let (start, end) = entry::allowed_range();
    // SAFETY: prctl with this thread's selector, which lives as long as the thread.
    let r = unsafe {
        raw(
            SYS_PRCTL,
            PR_SET_SYSCALL_USER_DISPATCH,
            PR_SYS_DISPATCH_ON,
            start as u64,
            (end - start) as u64,
            sel as u64,
            0,
        )
    };
    if r < 0 {
        // SAFETY: as above.
        unsafe { sel.write_volatile(0) };
    }
    r == 0
}

fn disarm_this_thread() {
    // SAFETY: prctl OFF takes no pointers.
    unsafe {
        raw(
            SYS_PRCTL,
            PR_SET_SYSCALL_USER_DISPATCH,
            PR_SYS_DISPATCH_OFF,
            0,
            0,
            0,
            0,
        )
    };
    if let Some(sel) = tls_byte(0) {
        // SAFETY: this thread's selector byte.
        unsafe { sel.write_volatile(0) };
    }
}

/// Whether the process was ever armed: its signal masks and dispositions are kept.
pub(crate) fn armed() -> bool {
    ARMED.load(Ordering::Acquire)
}

/// SIGSYS: a system call of an armed thread, outside our code. The thread is sent into
/// the entry as if the instruction had called it (rax still holds the number: the kernel
/// rolled the call back), and the site is offered for rewriting. Async-signal-safe.
extern "C" fn on_sigsys(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel hands an SA_SIGINFO handler a valid siginfo_t.
    let code = unsafe { (*info).si_code };
    if code != SYS_USER_DISPATCH {
        // SAFETY: as handed to us.
        unsafe { chain_app_sigsys(sig, info, ctx) };
        return;
    }
    TRAPPED.fetch_add(1, Ordering::Relaxed);
    let uc = ctx.cast::<libc::ucontext_t>();
    // SAFETY: the kernel hands an SA_SIGINFO handler a valid ucontext_t.
    let gregs = unsafe { &mut (*uc).uc_mcontext.gregs };
    let after = gregs[libc::REG_RIP as usize];
    rewrite::offer(after as usize - 2);
    gregs[libc::REG_RCX as usize] = after;
    gregs[libc::REG_RIP as usize] = entry::entry_signal() as i64;
}

/// A SIGSYS that is not ours (seccomp's `SECCOMP_RET_TRAP`, or one sent): what the
/// process asked for it.
///
/// # Safety
/// As the kernel handed them to an SA_SIGINFO handler.
unsafe fn chain_app_sigsys(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let app = app_sigsys();
    match app.handler as usize {
        libc::SIG_IGN => {}
        libc::SIG_DFL => {
            // The default action (core dump): restored, then delivered once we return.
            let dfl = KSigaction::default();
            // SAFETY: our own struct; tgkill to this thread.
            unsafe {
                raw(
                    libc::SYS_rt_sigaction as u64,
                    sig as u64,
                    &dfl as *const KSigaction as u64,
                    0,
                    8,
                    0,
                    0,
                );
                let tid = raw(SYS_GETTID, 0, 0, 0, 0, 0, 0);
                raw(
                    SYS_TGKILL,
                    PID.load(Ordering::Relaxed).max(libc::getpid()) as u64,
                    tid as u64,
                    sig as u64,
                    0,
                    0,
                    0,
                );
            }
        }
        // SAFETY: the process installed `f`, with these flags, for SIGSYS; `info` and
        // `ctx` as the kernel handed them.
        f => unsafe {
            signals::call_installed_handler(
                f,
                app.flags & libc::SA_SIGINFO as u64 != 0,
                sig,
                info,
                ctx,
            )
        },
    }
}

/// `rt_sigaction` for the process while its calls come through the entry: the
/// dispositions of SIGSYS and SIGTRAP (once ours is installed) are kept apart, ours
/// staying installed (a `posix_spawn` child resets every handler while it shares our
/// memory, where a site may be mid-rewrite), and no handler's mask may block either.
///
/// # Safety
/// As `rt_sigaction(2)`.
pub(crate) unsafe fn sigaction(sig: u64, act: u64, oact: u64, size: u64) -> i64 {
    if !armed() {
        // SAFETY: the caller's call, unchanged.
        return unsafe { raw(libc::SYS_rt_sigaction as u64, sig, act, oact, size, 0, 0) };
    }
    if sig == libc::SIGSYS as u64 {
        if size != 8 {
            return -(libc::EINVAL as i64);
        }
        let old = app_sigsys();
        if act != 0 {
            // SAFETY: caller obligation: a kernel sigaction.
            set_app_sigsys(&unsafe { std::ptr::read_unaligned(act as *const KSigaction) });
        }
        if oact != 0 {
            // SAFETY: caller obligation: room for a kernel sigaction.
            unsafe { std::ptr::write_unaligned(oact as *mut KSigaction, old) };
        }
        return 0;
    }
    if sig == libc::SIGTRAP as u64 && patch::trap_handler_installed() {
        if size != 8 {
            return -(libc::EINVAL as i64);
        }
        let (handler, flags) = patch::app_sigtrap();
        if act != 0 {
            // SAFETY: caller obligation: a kernel sigaction.
            let a = unsafe { std::ptr::read_unaligned(act as *const KSigaction) };
            patch::set_app_sigtrap(a.handler as usize, a.flags as usize);
        }
        if oact != 0 {
            let old = KSigaction {
                handler: handler as u64,
                flags: flags as u64,
                ..KSigaction::default()
            };
            // SAFETY: caller obligation: room for a kernel sigaction.
            unsafe { std::ptr::write_unaligned(oact as *mut KSigaction, old) };
        }
        return 0;
    }
    if act != 0 {
        // SAFETY: caller obligation: a kernel sigaction.
        let mut a = unsafe { std::ptr::read_unaligned(act as *const KSigaction) };
        if a.mask & KEPT != 0 {
            a.mask &= !KEPT;
            // SAFETY: our copy, otherwise the caller's call.
            return unsafe {
                raw(
                    libc::SYS_rt_sigaction as u64,
                    sig,
                    &a as *const KSigaction as u64,
                    oact,
                    size,
                    0,
                    0,
                )
            };
        }
    }
    // SAFETY: the caller's call, unchanged.
    unsafe { raw(libc::SYS_rt_sigaction as u64, sig, act, oact, size, 0, 0) }
}

/// `rt_sigprocmask` for the process while its calls come through the entry: SIGSYS and
/// SIGTRAP are never blocked (see `KEPT`).
///
/// # Safety
/// As `rt_sigprocmask(2)`.
pub(crate) unsafe fn sigprocmask(how: u64, set: u64, oset: u64, size: u64) -> i64 {
    if armed() && set != 0 && how != libc::SIG_UNBLOCK as u64 {
        // SAFETY: caller obligation: a signal set.
        let mask = unsafe { std::ptr::read_unaligned(set as *const u64) };
        if mask & KEPT != 0 {
            let mine = mask & !KEPT;
            // SAFETY: our copy, otherwise the caller's call.
            return unsafe {
                raw(
                    libc::SYS_rt_sigprocmask as u64,
                    how,
                    &mine as *const u64 as u64,
                    oset,
                    size,
                    0,
                    0,
                )
            };
        }
    }
    // SAFETY: the caller's call, unchanged.
    unsafe { raw(libc::SYS_rt_sigprocmask as u64, how, set, oset, size, 0, 0) }
}
