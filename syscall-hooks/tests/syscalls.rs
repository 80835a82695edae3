//! System call hooks in a process of their own (this test binary, run again as a child):
//! every call of a watched number reaches the handlers, at entry and at return, from
//! libc's wrappers and from a `syscall` instruction of our own, on threads made before and
//! after arming, in a `fork` child, in a signal handler; `vfork`, `execve` and blocked
//! signal masks keep working; and, where the page at 0 can be mapped, the sites are
//! rewritten and keep being counted.

use bpftime_attach::PtRegs;
use bpftime_syscall_hooks::{
    arm, set_syscall_handlers, syscall_stats, use_static_tls, watch_syscall,
};
use std::process::Command;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

bpftime_attach::static_tls_area!(fn syscall_tls, "bpftime_test_syscall_tls", 24);

const GETPPID: u64 = 110;
const GETPGID: u64 = 121;

static ENTERS: AtomicU64 = AtomicU64::new(0);
static EXITS: AtomicU64 = AtomicU64::new(0);
static PGID_ARG: AtomicI64 = AtomicI64::new(-1);
static LAST_RET: AtomicI64 = AtomicI64::new(0);
static BAD: AtomicU64 = AtomicU64::new(0);

fn on_enter(r: &PtRegs) {
    match r.orig_ax {
        GETPPID => {
            ENTERS.fetch_add(1, Ordering::Relaxed);
            if r.ax as i64 != -(libc::ENOSYS as i64) {
                BAD.fetch_add(1, Ordering::Relaxed);
            }
        }
        GETPGID => PGID_ARG.store(r.di as i64, Ordering::Relaxed),
        _ => {}
    }
}

fn on_exit(r: &PtRegs) {
    if r.orig_ax == GETPPID {
        EXITS.fetch_add(1, Ordering::Relaxed);
        LAST_RET.store(r.ax as i64, Ordering::Relaxed);
    }
}

/// getppid through a `syscall` instruction of our own, not libc's.
fn raw_getppid() -> i64 {
    let mut rax = GETPPID as i64;
    // SAFETY: getppid takes no arguments and touches no memory.
    unsafe {
        std::arch::asm!("syscall", inout("rax") rax, out("rcx") _, out("r11") _, options(nostack))
    };
    rax
}

extern "C" fn on_usr1(_: libc::c_int) {
    // SAFETY: async-signal-safe.
    unsafe { libc::getppid() };
}

fn counted(f: impl FnOnce()) -> (u64, u64) {
    let (e, x) = (ENTERS.load(Ordering::SeqCst), EXITS.load(Ordering::SeqCst));
    f();
    (
        ENTERS.load(Ordering::SeqCst) - e,
        EXITS.load(Ordering::SeqCst) - x,
    )
}

/// SIGSYS signals the process's own handlers got: plain ones in the low half, SA_SIGINFO
/// ones that carried the signal's number and a sender's code in the high half.
static APP_SIGSYS: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_app_sigsys(sig: libc::c_int) {
    if sig == libc::SIGSYS {
        APP_SIGSYS.fetch_add(1, Ordering::SeqCst);
    }
}

extern "C" fn on_app_sigsys_info(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    _ctx: *mut libc::c_void,
) {
    // SAFETY: the kernel's siginfo for this signal (an SA_SIGINFO handler).
    let (signo, code) = unsafe { ((*info).si_signo, (*info).si_code) };
    if sig == libc::SIGSYS && signo == libc::SIGSYS && code == libc::SI_TKILL {
        APP_SIGSYS.fetch_add(1 << 32, Ordering::SeqCst);
    }
}

/// The scenario, in the child: panics (a failed exit) on the first wrong count.
fn scenario() {
    // SAFETY: our own 24 bytes of static TLS, zero in every thread.
    unsafe { use_static_tls(syscall_tls()) };
    set_syscall_handlers(on_enter, on_exit);
    // A thread from before arming, which waits for its turn.
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let early = std::thread::spawn(move || {
        go_rx.recv().unwrap();
        counted(|| {
            for _ in 0..100 {
                // SAFETY: no preconditions.
                unsafe { libc::getppid() };
            }
        })
    });
    watch_syscall(Some(GETPPID as u32), true, true);
    watch_syscall(Some(GETPGID as u32), true, false);
    let report = arm().expect("arm");
    eprintln!("armed: {report:?}");
    assert!(report.armed >= 2, "{report:?}");
    // SAFETY: no preconditions.
    let ppid = unsafe { libc::getppid() } as i64;
    for round in 0..3 {
        let (e, x) = counted(|| {
            for _ in 0..1000 {
                // SAFETY: no preconditions.
                assert_eq!(unsafe { libc::getppid() } as i64, ppid);
                assert_eq!(raw_getppid(), ppid);
            }
        });
        assert_eq!((e, x), (2000, 2000), "round {round}");
        assert_eq!(LAST_RET.load(Ordering::Relaxed), ppid);
        // Let the rewriter take the sites between rounds.
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // SAFETY: no preconditions.
    unsafe { libc::getpgid(4242) };
    assert_eq!(PGID_ARG.load(Ordering::Relaxed), 4242);
    go_tx.send(()).unwrap();
    assert_eq!(
        early.join().unwrap(),
        (100, 100),
        "a thread from before arming"
    );
    let before = ENTERS.load(Ordering::SeqCst);
    let late: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(|| {
                counted(|| {
                    for _ in 0..500 {
                        assert_eq!(raw_getppid(), unsafe { libc::getppid() } as i64);
                    }
                })
            })
        })
        .collect();
    // Threads count into one total: their own deltas overlap, the sum does not.
    for t in late {
        t.join().unwrap();
    }
    assert_eq!(
        ENTERS.load(Ordering::SeqCst) - before,
        4000,
        "threads made after arming"
    );
    // A signal handler's calls, with every other signal blocked around it (SIGSYS too, as
    // far as the process asks).
    // SAFETY: a plain handler; sigfillset on a local mask.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr1 as *const () as usize;
        libc::sigfillset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
    }
    // SAFETY: raises a signal we handle.
    let (e, x) = counted(|| unsafe {
        libc::raise(libc::SIGUSR1);
    });
    assert_eq!((e, x), (1, 1), "a signal handler's call");
    // SAFETY: blocks everything, calls, unblocks.
    let (e, _) = counted(|| unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        libc::getppid();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    });
    assert_eq!(e, 1, "a call with every signal blocked");
    // The process's own SIGSYS handlers (seccomp's SECCOMP_RET_TRAP goes to them) still get
    // the SIGSYS signals that are not the dispatch's: an SA_SIGINFO one with its
    // information, then a plain one.
    for siginfo in [true, false] {
        // SAFETY: installs one of our handlers for SIGSYS, then raises it.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            if siginfo {
                sa.sa_sigaction = on_app_sigsys_info as *const () as usize;
                sa.sa_flags = libc::SA_SIGINFO;
            } else {
                sa.sa_sigaction = on_app_sigsys as *const () as usize;
            }
            assert_eq!(libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut()), 0);
            let before = APP_SIGSYS.load(Ordering::SeqCst);
            libc::raise(libc::SIGSYS);
            assert_eq!(
                APP_SIGSYS.load(Ordering::SeqCst) - before,
                if siginfo { 1 << 32 } else { 1 },
                "the process's own SIGSYS handler (SA_SIGINFO: {siginfo})"
            );
        }
    }
    // fork: the child counts its own calls; vfork and exec through posix_spawn (Command).
    // SAFETY: the child only calls getppid, reads atomics and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let (e, x) = counted(|| {
            for _ in 0..10 {
                // SAFETY: no preconditions.
                unsafe { libc::getppid() };
            }
            raw_getppid();
        });
        // SAFETY: exits the child at once.
        unsafe { libc::_exit(if (e, x) == (11, 11) { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "fork child: status {status:#x}"
    );
    // vfork itself, from an instruction of our own: the child runs on the parent's stack
    // and exits at once, touching no memory.
    let pid: i64;
    // SAFETY: vfork then, in the child only, exit(7); the parent resumes after the child
    // exits, its registers as they were but rax.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "mov edi, 7",
            "mov eax, 60",
            "syscall",
            "2:",
            inout("rax") 58i64 => pid,
            out("rdi") _,
            out("rcx") _,
            out("r11") _,
        )
    };
    let pid = pid as i32;
    let mut status = 0;
    // SAFETY: waits for our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 7,
        "vfork child: status {status:#x}"
    );
    // A sleep interrupted by a signal whose handler makes calls of its own, restarted.
    // SAFETY: a plain handler with SA_RESTART; an interval timer for this process.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr1 as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut());
        let t = libc::itimerval {
            it_interval: libc::timeval {
                tv_sec: 0,
                tv_usec: 0,
            },
            it_value: libc::timeval {
                tv_sec: 0,
                tv_usec: 20_000,
            },
        };
        libc::setitimer(libc::ITIMER_REAL, &t, std::ptr::null_mut());
    }
    let (e, _) = counted(|| {
        let mut buf = [0u8; 1];
        let mut fds = [0; 2];
        // SAFETY: a pipe of our own; the read blocks until the write after the alarm.
        unsafe {
            libc::pipe(fds.as_mut_ptr());
            let w = fds[1];
            let writer = std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(100));
                libc::write(w, b"x".as_ptr().cast(), 1);
            });
            assert_eq!(libc::read(fds[0], buf.as_mut_ptr().cast(), 1), 1);
            writer.join().unwrap();
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    });
    assert_eq!(
        e, 1,
        "the alarm's handler ran during the blocked read, which went on"
    );
    let out = Command::new("/bin/sh")
        .args(["-c", "echo spawned"])
        .output()
        .unwrap();
    eprintln!("spawned: {:?}", out);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "spawned\n");
    assert_eq!(
        BAD.load(Ordering::Relaxed),
        0,
        "rax at entry was not -ENOSYS"
    );
    let stats = syscall_stats();
    eprintln!("stats: {stats:?}");
    assert!(stats.trapped > 0);
    if report.slow_only.is_none() {
        assert!(stats.rewrite.rewritten >= 2, "{stats:?}");
        // A rewritten site (the C library's getppid, a leaf that keeps nothing below its
        // stack pointer) keeps its calls counted, and no longer traps.
        let trapped = syscall_stats().trapped;
        let (e, x) = counted(|| {
            for _ in 0..1000 {
                // SAFETY: no preconditions.
                unsafe { libc::getppid() };
            }
        });
        assert_eq!((e, x), (1000, 1000));
        assert!(
            syscall_stats().trapped - trapped < 10,
            "{:?}",
            syscall_stats()
        );
    }
    println!("scenario passed");
}

#[test]
fn every_watched_system_call_reaches_the_handlers() {
    if std::env::var_os("BPFTIME_SYSCALL_SCENARIO").is_some() {
        scenario();
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "every_watched_system_call_reaches_the_handlers",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("BPFTIME_SYSCALL_SCENARIO", "1")
        // The rewritten sites are checked too where the CPU cannot make page 0
        // execute-only (this one's readable sled is accepted for the test).
        .env("BPFTIME_SYSCALL_REWRITE", "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("scenario passed"),
        "{:?}\n{text}",
        out.status
    );
    eprintln!("{text}");
}
