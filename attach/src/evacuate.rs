//! Moving the process's other threads out of the instructions a jump is about to cover.
//!
//! A jump over several instructions has boundaries inside it, and a thread may be stopped at
//! one (preempted there, say): written under it, the jump's operand would have that thread
//! resume in the middle of the displacement. Once the `int3` is at the first byte, no thread
//! can get in any more except through the trap, so one look at each thread is enough. A
//! thread that is off its CPU says where it will resume through
//! `/proc/self/task/<tid>/syscall`; one asleep outside the covered bytes is left alone (a
//! signal would end some of its sleeps with EINTR). Every other one is sent a signal queued
//! with a value that tells it from any other, and our handler, finding it at a boundary
//! inside, sends it to that instruction's copy in the trampoline, which goes on exactly as
//! the original would, then answers. The operand is written once every thread has answered,
//! exited, or gone to sleep outside; one that does not within [`PATIENCE`] (it blocks the
//! signal, or never gets a CPU) is not risked, and the site stays a breakpoint.
//!
//! The request is not a SIGTRAP, although that one is ours already: a standard signal is
//! pending once at most, and the kernel queues a trap's SIGTRAP only some time after the
//! `int3` (the path is preemptible). A thread that had just trapped on this site's `int3`
//! (this one, or one from an earlier patch or restore) could have that SIGTRAP dropped in
//! favour of our pending request, and the handler would find it at the byte after the
//! `int3`, which after a one-byte first instruction (`push rbp`) is also where a thread
//! stopped after that instruction is: one must go to the trampoline's start, the other past
//! the copy of that instruction. A real-time signal is queued apart, and the kernel hands
//! over the trap's SIGTRAP first. It is the highest one that has no handler and that no
//! thread blocks when the first request goes out; it is checked to be still ours before each
//! request, and what is not ours on it goes to the default action, as it would have.
//!
//! The handler reads the request under a sequence lock and answers in a slot of its own,
//! without locks or allocation; a request that arrives after its patcher stopped waiting is
//! recognised and dropped.

use std::collections::HashSet;
use std::io;
use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::signals;

/// The instruction boundaries strictly inside the bytes a jump covers, each with the
/// address of the instruction's relocated copy: where a thread found there is sent before
/// the jump's operand is written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Interior {
    /// How many bytes from the hooked address the covered instructions span.
    pub len: usize,
    /// (offset from the hooked address, address of the copy, or 0 where the encoder
    /// replaced the instruction by others it does not locate).
    pub boundaries: Vec<(usize, usize)>,
    /// A call that is not the last covered instruction: a thread inside its callee when
    /// the jump goes in would return between the covered bytes, where no look at the
    /// threads finds it (it is somewhere in the callee); such a site stays a breakpoint.
    pub returns_inside: bool,
}

/// How long the patcher waits for the threads it asked, all told: long enough for a thread
/// that is ready to run to get a CPU on a loaded machine, short enough for an attach.
const PATIENCE: Duration = Duration::from_millis(100);
/// How often the threads that have not answered are looked at again.
const LOOK_EVERY: Duration = Duration::from_millis(1);
/// How long the patcher polls for answers before it sleeps between looks.
const POLL_FOR: Duration = Duration::from_micros(30);
/// Listings of the threads before giving up on a process whose threads keep coming and
/// going.
const ROUNDS: usize = 8;
/// The most threads one request asks.
const SLOTS: usize = 4096;
/// Boundaries lie below the jump's length (the last covered instruction starts there);
/// room to spare.
const MAX_OFFSET: usize = 16;
/// `PF_IO_WORKER` in a task's flags: an io_uring worker, which runs no user code and takes
/// no signal.
const PF_IO_WORKER: u64 = 0x10;

/// The top 16 bits of a request's value; the rest are its generation (32 bits) and the
/// thread's slot (16).
const TAG: u64 = 0xb7f7 << 48;
const TAG_MASK: u64 = 0xffff << 48;

/// The generation of the latest request, shifted left by one; the low bit is set while it
/// is open. Only the patcher holding [`ONE_REQUEST`] writes it and what it guards.
static STATE: AtomicU64 = AtomicU64::new(0);
static START: AtomicUsize = AtomicUsize::new(0);
static END: AtomicUsize = AtomicUsize::new(0);
/// By offset from `START`: where a thread at that boundary goes on, 0 for none known.
static TO: [AtomicUsize; MAX_OFFSET] = [const { AtomicUsize::new(0) }; MAX_OFFSET];
/// Per asked thread: the generation it answered in, shifted left by one, and 1 when it was
/// not left inside the covered bytes.
static ANSWERS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];

/// Hooks and detours keep separate registries, and may patch at once.
static ONE_REQUEST: Mutex<()> = Mutex::new(());

/// The signal that carries requests, and the disposition it had before ours.
struct Carrier {
    sig: libc::c_int,
    previous: libc::sigaction,
}

// SAFETY: a sigaction is plain data (a handler address, flags, a mask).
unsafe impl Send for Carrier {}
// SAFETY: as above; it is never changed once set.
unsafe impl Sync for Carrier {}

static CARRIER: OnceLock<Option<Carrier>> = OnceLock::new();

/// `siginfo_t` as the kernel lays it out for a queued signal.
#[repr(C)]
struct Queued {
    signo: i32,
    errno: i32,
    code: i32,
    _pad: i32,
    pid: i32,
    uid: u32,
    value: u64,
    _rest: [u64; 12],
}

const _: () = assert!(std::mem::size_of::<Queued>() == std::mem::size_of::<libc::siginfo_t>());

/// Makes sure that no thread but this one is at a boundary inside `interior`, at `addr`
/// where an `int3` already is. False when some thread may still be there: then the jump's
/// operand must not be written.
pub(crate) fn clear(addr: usize, interior: &Interior) -> bool {
    if interior.boundaries.is_empty() {
        return true;
    }
    let _one = ONE_REQUEST.lock().unwrap_or_else(|e| e.into_inner());
    let inside = |pc: usize| pc > addr && pc < addr + interior.len;
    // SAFETY: takes no arguments and cannot fail.
    let me = unsafe { libc::gettid() };
    let mut seen = HashSet::from([me]);
    let mut request: Option<Request> = None;
    let mut last = Vec::new();
    // Listed again until two listings agree: a thread made meanwhile may have been made by
    // one that was inside, where its clone returned, and a listing during which a listed
    // thread exits may skip another (the kernel goes on by position). Once they agree,
    // every thread made later is the child of one known to be outside.
    for _ in 0..ROUNDS {
        let mut tids = match threads() {
            Ok(tids) => tids,
            Err(e) => {
                tracing::debug!("cannot list this process's threads: {e}");
                return false;
            }
        };
        tids.sort_unstable();
        if tids == last {
            return true;
        }
        last.clone_from(&tids);
        let new: Vec<i32> = tids.into_iter().filter(|&t| seen.insert(t)).collect();
        let to_ask: Vec<i32> = new
            .into_iter()
            .filter(|&t| match whereabouts(t) {
                Whereabouts::Gone => false,
                Whereabouts::Parked(pc) => inside(pc),
                Whereabouts::Running => true,
            })
            .collect();
        if to_ask.is_empty() {
            continue;
        }
        if request.is_none() {
            let Some(sig) = carrier() else {
                return false;
            };
            request = Some(Request::open(sig, addr, interior));
        }
        if let Some(r) = request.as_mut() {
            if let Err(why) = r.ask(&to_ask, inside) {
                tracing::debug!(addr = format_args!("{addr:#x}"), "{why}");
                return false;
            }
        }
    }
    tracing::debug!("threads kept coming and going while they were listed");
    false
}

/// Where a thread is, as /proc tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Whereabouts {
    Gone,
    /// On a CPU or waiting for one, or not told.
    Running,
    /// Off its CPU (asleep or stopped); resumes at this address.
    Parked(usize),
}

/// The patcher's side of one open request; dropping it closes the request.
struct Request {
    sig: libc::c_int,
    pid: i32,
    generation: u64,
    /// Slots handed out so far.
    slots: usize,
    deadline: Instant,
}

impl Request {
    fn open(sig: libc::c_int, addr: usize, interior: &Interior) -> Request {
        let generation = (STATE.load(Ordering::Relaxed) >> 1) + 1;
        // The last request left the state even. A handler that reads what follows then sees
        // the state moved on from the request it started with, and gives up.
        fence(Ordering::Release);
        START.store(addr, Ordering::Relaxed);
        END.store(addr + interior.len, Ordering::Relaxed);
        for (offset, slot) in TO.iter().enumerate() {
            let to = interior
                .boundaries
                .iter()
                .find(|&&(o, _)| o == offset)
                .map_or(0, |&(_, to)| to);
            slot.store(to, Ordering::Relaxed);
        }
        debug_assert!(interior.boundaries.iter().all(|&(o, _)| o < MAX_OFFSET));
        STATE.store(generation << 1 | 1, Ordering::Release);
        Request {
            sig,
            // SAFETY: takes no arguments and cannot fail.
            pid: unsafe { libc::getpid() },
            generation,
            slots: 0,
            deadline: Instant::now() + PATIENCE,
        }
    }

    /// Asks `tids` and waits until each has answered, exited, or gone to sleep outside.
    fn ask(&mut self, tids: &[i32], inside: impl Fn(usize) -> bool) -> Result<(), String> {
        let mut waiting = Vec::with_capacity(tids.len());
        for &tid in tids {
            let slot = self.slots;
            if slot == SLOTS {
                return Err(format!("more than {SLOTS} threads to ask"));
            }
            self.slots += 1;
            ANSWERS[slot].store(0, Ordering::Relaxed);
            match self.send(tid, slot) {
                Ok(()) => waiting.push((slot, tid)),
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => return Err(format!("cannot signal thread {tid}: {e}")),
            }
        }
        let asked_at = Instant::now();
        let mut next_look = asked_at + LOOK_EVERY;
        let mut nap = Duration::from_micros(10);
        loop {
            let mut refused = None;
            waiting.retain(|&(slot, tid)| {
                let answer = ANSWERS[slot].load(Ordering::Acquire);
                if answer >> 1 != self.generation {
                    return true;
                }
                if answer & 1 == 0 {
                    refused = Some(tid);
                }
                false
            });
            if let Some(tid) = refused {
                return Err(format!(
                    "thread {tid} is inside the covered bytes where no copy is known"
                ));
            }
            if waiting.is_empty() {
                return Ok(());
            }
            let now = Instant::now();
            if now >= next_look || now >= self.deadline {
                // Without answering, a thread that exited, sleeps or is stopped outside the
                // covered bytes, or never runs user code, is no more in the way than one
                // that answered.
                waiting.retain(|&(_, tid)| {
                    let outside = match whereabouts(tid) {
                        Whereabouts::Gone => true,
                        Whereabouts::Parked(pc) => !inside(pc),
                        Whereabouts::Running => false,
                    };
                    !outside && task_flags(tid).is_none_or(|f| f & PF_IO_WORKER == 0)
                });
                if waiting.is_empty() {
                    return Ok(());
                }
                if now >= self.deadline {
                    let tids: Vec<i32> = waiting.iter().map(|&(_, t)| t).collect();
                    return Err(format!(
                        "threads {tids:?} did not answer within {PATIENCE:?}"
                    ));
                }
                next_look = now + LOOK_EVERY;
            }
            // A running thread answers within microseconds, sooner than the shortest sleep
            // (timer slack makes it some 50 us): poll a little first. Then sleep, which
            // gives this CPU to a thread that waits for one; yielding would not, for a whole
            // time slice, while other threads run.
            if now < asked_at + POLL_FOR {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_micros(200));
            }
        }
    }

    fn send(&self, tid: i32, slot: usize) -> io::Result<()> {
        let info = Queued {
            signo: self.sig,
            errno: 0,
            code: libc::SI_QUEUE,
            _pad: 0,
            pid: self.pid,
            // SAFETY: takes no arguments and cannot fail.
            uid: unsafe { libc::getuid() },
            value: TAG | (self.generation & 0xffff_ffff) << 16 | slot as u64,
            _rest: [0; 12],
        };
        // SAFETY: the kernel reads a siginfo_t from the pointer, which `Queued` is laid out
        // as.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_rt_tgsigqueueinfo,
                self.pid,
                tid,
                self.sig,
                &info as *const Queued,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        STATE.store(self.generation << 1, Ordering::Release);
    }
}

/// The signal that carries requests, installing our handler on it the first time; `None`
/// when no real-time signal is free, or the application has since taken ours.
fn carrier() -> Option<libc::c_int> {
    let carrier = CARRIER.get_or_init(install_carrier).as_ref()?;
    // SAFETY: a zeroed sigaction is a valid value for the kernel to fill in.
    let mut now: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: only reads the disposition into `now`.
    unsafe { libc::sigaction(carrier.sig, std::ptr::null(), &mut now) };
    if now.sa_sigaction != on_request as *const () as usize {
        tracing::debug!(
            sig = carrier.sig,
            "the application installed its own handler on our signal; no requests"
        );
        return None;
    }
    Some(carrier.sig)
}

fn install_carrier() -> Option<Carrier> {
    let blocked = blocked_somewhere();
    for sig in (libc::SIGRTMIN() + 1..=libc::SIGRTMAX()).rev() {
        if blocked & 1 << (sig - 1) != 0 {
            continue;
        }
        // SAFETY: a zeroed sigaction is a valid "no handler, empty mask" value.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_request as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
        // SAFETY: as above, filled in by the kernel.
        let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: only reads the disposition into `previous`.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut previous) } != 0
            || previous.sa_sigaction != libc::SIG_DFL
        {
            continue;
        }
        // SAFETY: both pointers are to live sigaction values; the handler is
        // async-signal-safe.
        if unsafe { libc::sigaction(sig, &action, &mut previous) } != 0 {
            continue;
        }
        if previous.sa_sigaction != libc::SIG_DFL {
            // Taken between the two calls: given back.
            // SAFETY: as above.
            unsafe { libc::sigaction(sig, &previous, std::ptr::null_mut()) };
            continue;
        }
        tracing::debug!(
            sig,
            "threads are asked to leave patched code with this signal"
        );
        return Some(Carrier { sig, previous });
    }
    tracing::debug!("no real-time signal is free to ask threads with");
    None
}

/// The real-time signals some thread of this process blocks now (bit n - 1 for signal n),
/// from the SigBlk lines of /proc: a signal that is blocked may be read with sigwaitinfo or
/// a signalfd, which would take our requests. A thread that blocks them all says nothing
/// about any: the C library blocks them all while a thread starts or exits.
fn blocked_somewhere() -> u64 {
    let realtime = (libc::SIGRTMIN() + 1..=libc::SIGRTMAX()).fold(0u64, |m, s| m | 1 << (s - 1));
    threads()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|tid| std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok())
        .filter_map(|status| {
            let line = status.lines().find(|l| l.starts_with("SigBlk:"))?;
            u64::from_str_radix(line["SigBlk:".len()..].trim(), 16).ok()
        })
        .map(|mask| mask & realtime)
        .filter(|&mask| mask != realtime)
        .fold(0, |all, mask| all | mask)
}

extern "C" fn on_request(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: as the kernel handed them to this SA_SIGINFO handler.
    if unsafe { answer(info, ctx) } {
        return;
    }
    if let Some(Some(carrier)) = CARRIER.get() {
        // SAFETY: as above, for the disposition ours replaced.
        unsafe { signals::chain(&carrier.previous, sig, info, ctx) };
    }
}

/// Answers our request, if `info` is one (true), moving the thread to the copy of the
/// instruction it is stopped at. Async-signal-safe: atomics and `getpid` only.
///
/// # Safety
/// `info` and `ctx` as the kernel hands them to an SA_SIGINFO handler.
unsafe fn answer(info: *const libc::siginfo_t, ctx: *mut libc::c_void) -> bool {
    // SAFETY: the kernel's siginfo_t, which `Queued` is laid out as.
    let request = unsafe { &*info.cast::<Queued>() };
    // SAFETY: takes no arguments and cannot fail.
    if request.code != libc::SI_QUEUE
        || request.value & TAG_MASK != TAG
        || request.pid != unsafe { libc::getpid() }
    {
        return false;
    }
    let state = STATE.load(Ordering::Acquire);
    let generation = state >> 1;
    if state & 1 == 0 || generation & 0xffff_ffff != (request.value >> 16) & 0xffff_ffff {
        // Late: its patcher stopped waiting.
        return true;
    }
    let uc = ctx.cast::<libc::ucontext_t>();
    // SAFETY: the kernel hands an SA_SIGINFO handler a valid ucontext_t.
    let rip = unsafe { &mut (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] };
    let at = *rip as usize;
    let (start, end) = (START.load(Ordering::Relaxed), END.load(Ordering::Relaxed));
    let to = if at > start && at < end {
        TO.get(at - start).map_or(0, |t| t.load(Ordering::Relaxed))
    } else {
        at
    };
    fence(Ordering::Acquire);
    if STATE.load(Ordering::Relaxed) != state {
        // What was read may belong to the next request.
        return true;
    }
    if to != 0 {
        *rip = to as i64;
    }
    if let Some(answer) = ANSWERS.get((request.value & 0xffff) as usize) {
        answer.store(generation << 1 | u64::from(to != 0), Ordering::Release);
    }
    true
}

fn threads() -> io::Result<Vec<i32>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task")? {
        if let Some(tid) = entry?.file_name().to_str().and_then(|n| n.parse().ok()) {
            out.push(tid);
        }
    }
    Ok(out)
}

/// Where thread `tid` is, from `/proc/self/task/<tid>/syscall`: "running", or the system
/// call (-1 for none) with its arguments, then the stack pointer and the address it
/// resumes at.
fn whereabouts(tid: i32) -> Whereabouts {
    let text = match std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")) {
        Ok(text) => text,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)) => {
            return Whereabouts::Gone;
        }
        Err(_) => return Whereabouts::Running,
    };
    if text.starts_with("running") {
        return Whereabouts::Running;
    }
    text.split_whitespace()
        .next_back()
        .and_then(|pc| pc.strip_prefix("0x"))
        .and_then(|pc| usize::from_str_radix(pc, 16).ok())
        .map_or(Whereabouts::Running, Whereabouts::Parked)
}

/// The kernel's flags of thread `tid`, the ninth field of `/proc/self/task/<tid>/stat`.
fn task_flags(tid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // "pid (comm) state ppid pgrp session tty_nr tpgid flags ...": comm may hold anything.
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(6)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::mpsc;

    #[test]
    fn threads_are_listed_and_located() {
        let (tx, rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let sleeper = std::thread::spawn(move || {
            // SAFETY: takes no arguments and cannot fail.
            tx.send(unsafe { libc::gettid() }).unwrap();
            done_rx.recv().unwrap();
        });
        let tid = rx.recv().unwrap();
        // A listing may skip a thread while another exits (other tests' threads do).
        let listed = (0..100)
            .map(|_| threads().unwrap())
            .find(|l| l.contains(&tid))
            .expect("the thread is listed");
        // SAFETY: as above.
        assert!(listed.contains(&unsafe { libc::gettid() }));
        assert_eq!(task_flags(tid).map(|f| f & PF_IO_WORKER), Some(0));
        let pc = (0..1000)
            .find_map(|_| {
                std::thread::sleep(Duration::from_millis(1));
                match whereabouts(tid) {
                    Whereabouts::Parked(pc) => Some(pc),
                    _ => None,
                }
            })
            .expect("a thread asleep in recv says where it resumes");
        assert_ne!(pc, 0);
        done_tx.send(()).unwrap();
        sleeper.join().unwrap();
        // Joined, it may still be on its way out of the kernel for a moment.
        assert!(
            (0..1000).any(|_| {
                std::thread::sleep(Duration::from_millis(1));
                whereabouts(tid) == Whereabouts::Gone
            }),
            "an exited thread is gone"
        );

        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let (tx, rx) = mpsc::channel();
            let stop = &stop;
            s.spawn(move || {
                // SAFETY: as above.
                tx.send(unsafe { libc::gettid() }).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            });
            let tid = rx.recv().unwrap();
            // Spinning, on a CPU or waiting for one: nowhere to tell.
            assert_eq!(whereabouts(tid), Whereabouts::Running);
            stop.store(true, Ordering::Relaxed);
        });
    }

    #[test]
    fn requests_go_by_a_free_real_time_signal_with_our_handler() {
        let sig = carrier().expect("a free real-time signal");
        assert!((libc::SIGRTMIN() + 1..=libc::SIGRTMAX()).contains(&sig));
        // SAFETY: a zeroed sigaction is a valid value for the kernel to fill in.
        let mut now: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: only reads the disposition.
        unsafe { libc::sigaction(sig, std::ptr::null(), &mut now) };
        assert_eq!(now.sa_sigaction, on_request as *const () as usize);
        assert_eq!(carrier(), Some(sig), "the same one every time");
    }
}
