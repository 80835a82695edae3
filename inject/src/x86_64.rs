//! The injection itself, for x86-64 processes.

use crate::error::{InjectError, Result};
use crate::procfs::{self, Mapping, Status, CAP_SYS_PTRACE};
use crate::symbols::{self, LoaderEntry};
use crate::tracee::{self, FpState, HoldTermination, Regs, Stop, Tracee};
use crate::Loaded;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::time::Duration;

/// The System V ABI lets leaf functions use 128 bytes below `rsp` without
/// moving it; nothing of ours goes there.
const RED_ZONE: u64 = 128;
const RTLD_NOW: u64 = 2;
/// Interrupt attempts before giving up on a thread that keeps stopping inside
/// the C library.
const SAFE_POINT_TRIES: u32 = 200;
/// How long a `dlopen` may run before we say we are still waiting.
const PATIENCE: Duration = Duration::from_secs(10);

/// A process seized with ptrace (still running) and ready to load a library.
/// Dropping it without loading detaches and leaves the process as it was.
/// It must stay on the thread that created it (ptrace's rule).
pub struct Target {
    pid: i32,
    tid: i32,
    ns_pid: i32,
    /// /proc/PID/task/TID of the borrowed thread.
    dir: String,
    mem: File,
    tracee: Option<Tracee>,
}

fn os(pid: i32, what: &'static str) -> impl FnOnce(io::Error) -> InjectError {
    move |source| {
        if source.raw_os_error() == Some(libc::ESRCH) {
            InjectError::ExitedDuringAttach { pid }
        } else {
            InjectError::Os { pid, what, source }
        }
    }
}

fn is_permission(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES))
}

/// Explains an EPERM/EACCES from ptrace or /proc/PID/mem.
fn permission_denied(pid: i32, target: &Status) -> InjectError {
    let me = procfs::read_status(Path::new("/proc/self/status")).unwrap_or_default();
    let can_override = me.cap_eff & (1 << CAP_SYS_PTRACE) != 0;
    let (why, fix) = explain_denial(me.uids[0], can_override, procfs::yama_scope(), target.uids);
    InjectError::PermissionDenied { pid, why, fix }
}

/// Why the kernel refuses the attach, and the way out, from what we know:
/// our uid and CAP_SYS_PTRACE, Yama's scope, the target's uids.
fn explain_denial(
    my_uid: u32,
    can_override: bool,
    yama: Option<u32>,
    target_uids: [u32; 4],
) -> (String, String) {
    if yama == Some(3) {
        (
            "kernel.yama.ptrace_scope is 3, which disables attaching until reboot".into(),
            "start the program with `bpftime start` instead".into(),
        )
    } else if can_override {
        (
            "a security module (SELinux, AppArmor), a seccomp filter or a user namespace boundary refuses ptrace".into(),
            "look for the denial in the kernel log (dmesg), or start the program with `bpftime start`".into(),
        )
    } else if target_uids[..3].iter().any(|u| *u != my_uid) {
        (
            format!(
                "it runs as uid {} and bpftime as uid {my_uid}",
                target_uids[1]
            ),
            // Not "or as root": a store belongs to one user, and the agent in a process
            // of uid N can only use uid N's store.
            format!(
                "run `bpftime load` and `bpftime attach` as uid {}",
                target_uids[1]
            ),
        )
    } else if yama == Some(1) {
        (
            "kernel.yama.ptrace_scope is 1, so only its parent and ancestors may trace a process".into(),
            "run bpftime attach as root (CAP_SYS_PTRACE), or allow it with `sysctl kernel.yama.ptrace_scope=0`".into(),
        )
    } else if yama == Some(2) {
        (
            "kernel.yama.ptrace_scope is 2, so only root (CAP_SYS_PTRACE) may trace".into(),
            "run bpftime attach as root".into(),
        )
    } else {
        (
            "it is not dumpable (set-user-ID, file capabilities or prctl(PR_SET_DUMPABLE, 0))"
                .into(),
            "run bpftime attach as root (CAP_SYS_PTRACE)".into(),
        )
    }
}

/// `TracerPid` names the tracing thread; the error names its process.
fn already_traced(pid: i32, tracer_tid: i32) -> InjectError {
    let tracer = procfs::read_status(Path::new(&format!("/proc/{tracer_tid}/status")))
        .ok()
        .filter(|s| s.tgid > 0);
    InjectError::AlreadyTraced {
        pid,
        tracer: tracer.as_ref().map_or(tracer_tid, |s| s.tgid),
        tracer_name: tracer.map_or_else(|| "unknown".into(), |s| s.name),
    }
}

fn is_kernel_thread(pid: i32) -> bool {
    const PF_KTHREAD: u64 = 0x0020_0000;
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let after = &s[s.rfind(')')? + 1..];
            after.split_whitespace().nth(6)?.parse::<u64>().ok()
        })
        .is_some_and(|flags| flags & PF_KTHREAD != 0)
}

/// The thread to borrow: the main one, unless it has exited.
fn pick_thread(pid: i32) -> Result<(i32, Status)> {
    let status_of =
        |tid: i32| procfs::read_status(Path::new(&format!("/proc/{pid}/task/{tid}/status")));
    if let Ok(s) = status_of(pid) {
        if !matches!(s.state, 'Z' | 'X') {
            return Ok((pid, s));
        }
    }
    let dir = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(os(pid, "list threads"))?;
    for entry in dir.flatten() {
        let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        if let Ok(s) = status_of(tid) {
            if !matches!(s.state, 'Z' | 'X') {
                return Ok((tid, s));
            }
        }
    }
    Err(InjectError::Zombie { pid })
}

/// Whether SIGSEGV reaches the thread whose status is `thread` (at `dir`). A thread
/// blocks every signal for a moment while it creates another (glibc's pthread_create
/// does), so a blocked SIGSEGV is looked at again for up to 100 ms before it counts;
/// an ignored one counts at once.
fn segv_deliverable(dir: &str, thread: &procfs::Status) -> bool {
    let segv = 1u64 << (libc::SIGSEGV - 1);
    if thread.sig_ignored & segv != 0 {
        return false;
    }
    let mut blocked = thread.sig_blocked;
    for _ in 0..10 {
        if blocked & segv == 0 {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        match procfs::read_status(Path::new(&format!("{dir}/status"))) {
            Ok(now) if now.sig_ignored & segv == 0 => blocked = now.sig_blocked,
            _ => return false,
        }
    }
    blocked & segv == 0
}

fn preflight(pid: i32) -> Result<Preflight> {
    if pid <= 0 {
        return Err(InjectError::NoSuchProcess { pid });
    }
    if pid as u32 == std::process::id() {
        return Err(InjectError::Itself);
    }
    let status = match procfs::read_status(Path::new(&format!("/proc/{pid}/status"))) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(InjectError::NoSuchProcess { pid })
        }
        Err(e) => return Err(os(pid, "read its status")(e)),
    };
    if status.tgid != pid {
        return Err(InjectError::NotAProcess {
            pid,
            tgid: status.tgid,
        });
    }
    if is_kernel_thread(pid) {
        return Err(InjectError::KernelThread { pid });
    }
    // The main thread may have exited (pthread_exit) while others run on:
    // everything below goes through the thread we borrow.
    let (tid, thread) = pick_thread(pid)?;
    if thread.tracer != 0 {
        return Err(already_traced(pid, thread.tracer));
    }
    if matches!(thread.state, 'T' | 't') {
        return Err(InjectError::Stopped { pid });
    }
    let dir = format!("/proc/{pid}/task/{tid}");
    // Opening the memory file takes the same permission check as attaching.
    let mem = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("{dir}/mem"))
    {
        Ok(f) => f,
        Err(e) if is_permission(&e) => return Err(permission_denied(pid, &status)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(InjectError::NoSuchProcess { pid })
        }
        Err(e) => return Err(os(pid, "open its memory")(e)),
    };
    match procfs::foreign_architecture(&dir) {
        Ok(None) => {}
        Ok(Some(what)) => return Err(InjectError::NotX86_64 { pid, what }),
        Err(e) if is_permission(&e) => return Err(permission_denied(pid, &status)),
        Err(e) => return Err(os(pid, "read its executable")(e)),
    }
    if thread.shadow_stack {
        return Err(InjectError::ShadowStack { pid, tid });
    }
    if !segv_deliverable(&dir, &thread) {
        return Err(InjectError::SegvUnavailable { pid, tid });
    }
    Ok(Preflight {
        tid,
        dir,
        mem,
        status,
    })
}

/// What the checks before seizing found out.
struct Preflight {
    tid: i32,
    dir: String,
    mem: File,
    status: Status,
}

impl Target {
    /// Checks, without touching the process, everything that can be known
    /// before attaching: it exists, is a live x86-64 user process, is neither
    /// stopped nor traced, and we may trace it.
    pub fn check(pid: i32) -> Result<()> {
        preflight(pid).map(drop)
    }

    /// Checks that `pid` can be attached to and seizes it (it keeps running).
    pub fn attach(pid: i32) -> Result<Target> {
        let Preflight {
            tid,
            dir,
            mem,
            status,
        } = preflight(pid)?;
        let tracee = match Tracee::seize(tid) {
            Ok(t) => t,
            Err(e) if is_permission(&e) => {
                // Someone may have attached since we looked.
                let now =
                    procfs::read_status(Path::new(&format!("{dir}/status"))).unwrap_or_default();
                if now.tracer != 0 {
                    return Err(already_traced(pid, now.tracer));
                }
                return Err(permission_denied(pid, &status));
            }
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                return Err(InjectError::NoSuchProcess { pid })
            }
            Err(e) => return Err(os(pid, "seize it with ptrace")(e)),
        };
        tracing::debug!(pid, tid, "seized");
        Ok(Target {
            pid,
            tid,
            dir,
            ns_pid: if status.ns_pid > 0 {
                status.ns_pid
            } else {
                pid
            },
            mem,
            tracee: Some(tracee),
        })
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The pid as the process sees itself (differs inside a pid namespace).
    pub fn pid_in_namespace(&self) -> i32 {
        self.ns_pid
    }

    /// Calls `dlopen(library, RTLD_NOW)` in the process, then restores it and
    /// detaches. The library's constructors run inside that call, on the
    /// borrowed thread, before this returns.
    pub fn load_library(mut self, library: &Path) -> Result<Loaded> {
        let library = std::fs::canonicalize(library).map_err(|source| InjectError::Library {
            path: library.to_path_buf(),
            source,
        })?;
        let meta = std::fs::metadata(&library).map_err(|source| InjectError::Library {
            path: library.clone(),
            source,
        })?;
        // The target resolves the path in its own mount namespace: it must
        // name the same file there.
        let theirs = std::fs::metadata(format!("{}/root{}", self.dir, library.display()));
        if !theirs.is_ok_and(|m| m.dev() == meta.dev() && m.ino() == meta.ino()) {
            return Err(InjectError::OtherMountNamespace {
                pid: self.pid,
                library,
            });
        }
        let _hold = HoldTermination::new();
        let tracee = self.tracee.take().expect("seized in attach");
        let pid = self.pid;
        let (regs, maps) = match self.stop_at_safe_point(&tracee) {
            Ok(v) => v,
            Err(e) => {
                // Put the tracee back so Drop detaches it (unless it is gone).
                if !matches!(e, InjectError::ExitedDuringAttach { .. }) {
                    self.tracee = Some(tracee);
                }
                return Err(e);
            }
        };
        let fp = match tracee.fp_state() {
            Ok(fp) => fp,
            Err(e) => {
                let _ = tracee.detach(0);
                return Err(os(pid, "read its registers")(e));
            }
        };
        let mut call = Call {
            target: &self,
            tracee: &tracee,
            saved: regs,
            fp,
            written: Vec::new(),
            held: Vec::new(),
            at_signal_stop: false,
            frame: 0,
        };
        let result = call.run(&library, &meta, &maps);
        if let Err(e @ InjectError::ExitedDuringAttach { .. }) = result {
            return Err(e);
        }
        let restored = call.restore_and_detach();
        let loaded = result?;
        let held = restored?;
        tracing::debug!(pid, handle = loaded, "library loaded");
        Ok(Loaded {
            handle: loaded,
            tid: self.tid,
            was_in_syscall: regs.orig_rax as i64 >= 0,
            held_signals: held,
        })
    }

    /// Interrupts the thread; if it stopped where a call could deadlock, lets
    /// it run on briefly and tries again.
    fn stop_at_safe_point(&self, t: &Tracee) -> Result<(Regs, Vec<Mapping>)> {
        for attempt in 0..SAFE_POINT_TRIES {
            let regs = self.stop(t)?;
            let maps = procfs::read_maps(&self.dir).map_err(os(self.pid, "read its memory map"))?;
            let in_syscall = regs.orig_rax as i64 >= 0;
            let inside = maps
                .iter()
                .find(|m| m.contains(regs.rip as usize))
                .map(|m| m.file_name())
                .unwrap_or("");
            let loader = inside.starts_with("ld-linux");
            let busy = loader || (!in_syscall && symbols::is_runtime_library(inside));
            if !busy {
                tracing::debug!(
                    rip = regs.rip,
                    in_syscall,
                    attempt,
                    "stopped at a safe point"
                );
                return Ok((regs, maps));
            }
            t.cont(0).map_err(os(self.pid, "resume it"))?;
            std::thread::sleep(Duration::from_millis(1 + u64::from(attempt % 5)));
        }
        Err(InjectError::Busy {
            pid: self.pid,
            tries: SAFE_POINT_TRIES,
        })
    }

    /// Interrupts the running thread and waits until it is in a ptrace stop.
    fn stop(&self, t: &Tracee) -> Result<Regs> {
        let pid = self.pid;
        t.interrupt().map_err(os(pid, "interrupt it"))?;
        loop {
            match t
                .wait(PATIENCE, &mut || {})
                .map_err(os(pid, "wait for it"))?
            {
                Stop::Gone => return Err(InjectError::ExitedDuringAttach { pid }),
                // A signal that was on its way: deliver it as if we were not here.
                Stop::Signal { signal, .. } => t.cont(signal).map_err(os(pid, "resume it"))?,
                Stop::Other => t.cont(0).map_err(os(pid, "resume it"))?,
                Stop::Event => return t.regs().map_err(os(pid, "read its registers")),
            }
        }
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        self.mem.read_exact_at(buf, addr)
    }

    fn write(&self, addr: u64, buf: &[u8]) -> io::Result<()> {
        self.mem.write_all_at(buf, addr)
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(t) = self.tracee.take() {
            let _hold = HoldTermination::new();
            if self.stop(&t).is_ok() {
                let _ = t.detach(0);
            }
        }
    }
}

/// One borrowed thread, stopped, with what must be put back.
struct Call<'a> {
    target: &'a Target,
    tracee: &'a Tracee,
    saved: Regs,
    fp: FpState,
    /// Memory we overwrote, with its old contents.
    written: Vec<(u64, Vec<u8>)>,
    /// Signals that arrived during our calls, with their siginfo.
    held: Vec<(i32, libc::siginfo_t)>,
    /// The last stop was a signal-delivery-stop (so a signal can be handed
    /// over at detach).
    at_signal_stop: bool,
    /// `rsp` at the entry of our calls: a 0 return address there.
    frame: u64,
}

impl Call<'_> {
    fn pid(&self) -> i32 {
        self.target.pid
    }

    fn run(&mut self, library: &Path, meta: &std::fs::Metadata, maps: &[Mapping]) -> Result<u64> {
        let pid = self.pid();
        let dev = (libc::major(meta.dev()), libc::minor(meta.dev()));
        if maps.iter().any(|m| m.inode == meta.ino() && m.dev == dev) {
            return Err(InjectError::AlreadyLoaded {
                pid,
                library: library.to_path_buf(),
            });
        }
        let read = |addr: u64, buf: &mut [u8]| self.target.read(addr, buf);
        let entry: LoaderEntry = symbols::find_loader(pid, &self.target.dir, maps, &read)?;
        tracing::debug!(?entry, "dynamic loader entry points");

        let mut path = library.as_os_str().as_encoded_bytes().to_vec();
        path.push(0);
        let sp = self.saved.rsp;
        let path_addr = (sp - RED_ZONE - 64 - path.len() as u64) & !15;
        // At a function's entry rsp + 8 is 16-byte aligned.
        self.frame = ((path_addr - 64) & !15) - 8;
        let stack = maps.iter().find(|m| m.contains(self.frame as usize));
        if !stack.is_some_and(|m| m.writable && m.contains(sp as usize - 1)) {
            return Err(InjectError::BadStack {
                pid,
                tid: self.target.tid,
                rsp: sp,
            });
        }
        self.poke(path_addr, &path)?;
        let handle = self.call(entry.open, entry.open_name, path_addr, RTLD_NOW)?;
        if handle != 0 {
            return Ok(handle);
        }
        let message = match entry.error {
            Some(dlerror) => {
                let msg = self.call(dlerror, "dlerror", 0, 0)?;
                if msg == 0 {
                    "no reason given".to_string()
                } else {
                    self.read_c_string(msg)
                }
            }
            None => format!("{} reports no reason", entry.open_name),
        };
        Err(InjectError::DlopenFailed {
            pid,
            library: library.to_path_buf(),
            message,
        })
    }

    /// Writes `bytes` at `addr`, remembering what was there.
    fn poke(&mut self, addr: u64, bytes: &[u8]) -> Result<()> {
        let pid = self.pid();
        let mut old = vec![0u8; bytes.len()];
        self.target
            .read(addr, &mut old)
            .map_err(os(pid, "read its stack"))?;
        self.target
            .write(addr, bytes)
            .map_err(os(pid, "write its stack"))?;
        self.written.push((addr, old));
        Ok(())
    }

    fn read_c_string(&self, addr: u64) -> String {
        let mut out = Vec::new();
        let mut chunk = [0u8; 256];
        while out.len() < 4096 {
            let at = addr + out.len() as u64;
            // Never read across a page end we do not know to be mapped.
            let len = chunk.len().min((4096 - (at % 4096)) as usize);
            if self.target.read(at, &mut chunk[..len]).is_err() {
                break;
            }
            match chunk[..len].iter().position(|b| *b == 0) {
                Some(n) => {
                    out.extend_from_slice(&chunk[..n]);
                    break;
                }
                None => out.extend_from_slice(&chunk[..len]),
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Calls `func(a0, a1)` on the borrowed thread and returns `rax`.
    fn call(&mut self, func: u64, name: &'static str, a0: u64, a1: u64) -> Result<u64> {
        let pid = self.pid();
        self.poke(self.frame, &0u64.to_le_bytes())?;
        let mut r = self.saved;
        r.rip = func;
        r.rdi = a0;
        r.rsi = a1;
        r.rax = 0;
        r.rsp = self.frame;
        // Not a system call any more: the kernel must not restart anything
        // when it resumes these registers.
        r.orig_rax = u64::MAX;
        // The ABI wants the direction flag clear at calls; no single-stepping.
        r.eflags &= !(0x400 | 0x100);
        let t = self.tracee;
        t.set_regs(&r).map_err(os(pid, "set its registers"))?;
        t.cont(0).map_err(os(pid, "resume it"))?;
        let mut waiting = || {
            tracing::warn!(
                pid,
                "{name} has not returned after {} s; still waiting, with Ctrl-C held: leaving now would crash the process (kill -9 gives up, and the process dies when the call returns)",
                PATIENCE.as_secs()
            )
        };
        loop {
            let stop = t
                .wait(PATIENCE, &mut waiting)
                .map_err(os(pid, "wait for it"))?;
            match stop {
                Stop::Gone => return Err(InjectError::ExitedDuringAttach { pid }),
                Stop::Signal { signal, info } => {
                    self.at_signal_stop = true;
                    let regs = t.regs().map_err(os(pid, "read its registers"))?;
                    if signal == libc::SIGSEGV && regs.rip == 0 {
                        return Ok(regs.rax);
                    }
                    if tracee::is_fault(signal, &info) {
                        return Err(InjectError::RemoteFault {
                            pid,
                            function: name,
                            signal,
                            rip: regs.rip,
                            addr: tracee::fault_address(&info),
                        });
                    }
                    tracing::debug!(signal, "holding a signal until the call returns");
                    self.held.push((signal, info));
                    t.cont(0).map_err(os(pid, "resume it"))?;
                }
                Stop::Event | Stop::Other => {
                    self.at_signal_stop = false;
                    t.cont(0).map_err(os(pid, "resume it"))?;
                }
            }
        }
    }

    /// Puts memory and registers back, detaches, and delivers held signals.
    /// Returns the signals delivered.
    fn restore_and_detach(&mut self) -> Result<Vec<i32>> {
        let pid = self.pid();
        let t = self.tracee;
        let mut first_error = None;
        for (addr, old) in self.written.iter().rev() {
            if let Err(e) = self.target.write(*addr, old) {
                first_error.get_or_insert(os(pid, "restore its stack")(e));
            }
        }
        if let Err(e) = t.set_fp_state(&self.fp) {
            first_error.get_or_insert(os(pid, "restore its registers")(e));
        }
        if let Err(e) = t.set_regs(&self.saved) {
            first_error.get_or_insert(os(pid, "restore its registers")(e));
        }
        let mut held = std::mem::take(&mut self.held).into_iter();
        let mut delivered = Vec::new();
        // At a signal-delivery-stop, the first held signal (with its own
        // siginfo) replaces ours; the rest are sent again.
        let handed = if self.at_signal_stop {
            held.next()
        } else {
            None
        };
        let detach_signal = match handed {
            Some((signal, info)) if t.set_siginfo(&info).is_ok() => {
                delivered.push(signal);
                signal
            }
            Some((signal, _)) => {
                delivered.push(signal);
                resend(pid, t.tid, signal);
                0
            }
            None => 0,
        };
        if let Err(e) = t.detach(detach_signal) {
            first_error.get_or_insert(os(pid, "detach from it")(e));
        }
        for (signal, _) in held {
            resend(pid, t.tid, signal);
            delivered.push(signal);
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(delivered),
        }
    }
}

fn resend(pid: i32, tid: i32, signal: i32) {
    // SAFETY: tgkill takes plain integers.
    unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, signal) };
}

#[cfg(test)]
mod tests {
    use super::explain_denial;

    #[test]
    fn permission_problems_are_named_with_their_way_out() {
        let (why, fix) = explain_denial(1000, false, Some(0), [0, 0, 0, 0]);
        assert_eq!(why, "it runs as uid 0 and bpftime as uid 1000");
        assert_eq!(fix, "run `bpftime load` and `bpftime attach` as uid 0");
        // A set-user-ID program: same real uid, other effective uid.
        let (why, _) = explain_denial(1000, false, None, [1000, 0, 0, 1000]);
        assert!(why.contains("uid 0"), "{why}");
        let (why, fix) = explain_denial(1000, false, Some(1), [1000; 4]);
        assert!(why.contains("ptrace_scope is 1"), "{why}");
        assert!(fix.contains("sysctl kernel.yama.ptrace_scope=0"), "{fix}");
        let (why, fix) = explain_denial(1000, false, Some(2), [1000; 4]);
        assert!(why.contains("ptrace_scope is 2"), "{why}");
        assert_eq!(fix, "run bpftime attach as root");
        let (why, fix) = explain_denial(0, true, Some(3), [1000; 4]);
        assert!(why.contains("until reboot"), "{why}");
        assert!(fix.contains("bpftime start"), "{fix}");
        let (why, _) = explain_denial(1000, false, Some(0), [1000; 4]);
        assert!(why.contains("not dumpable"), "{why}");
        let (why, _) = explain_denial(0, true, Some(0), [1000; 4]);
        assert!(why.contains("security module"), "{why}");
    }
}
