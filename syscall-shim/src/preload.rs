//! The preload layer: libc entry points that an unmodified loader calls,
//! adapted to [`Shim`]. Calls that are not about our objects go to the next
//! definition (libc) untouched. While the shim itself runs, a thread-local flag
//! sends its own libc calls straight through, so nothing recurses.

use crate::core::{Shim, SysResult};
use bpftime_runtime::Store;
use std::cell::Cell;
use std::ffi::{c_int, c_long, c_ulong, c_void};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

thread_local! {
    static IN_SHIM: Cell<bool> = const { Cell::new(false) };
}

static SHIM: Mutex<Option<Shim>> = Mutex::new(None);

const TRACKED_FDS: usize = 1 << 16;
static OUR_FDS: [AtomicU64; TRACKED_FDS / 64] = [const { AtomicU64::new(0) }; TRACKED_FDS / 64];
static EPOLL_FDS: [AtomicU64; TRACKED_FDS / 64] = [const { AtomicU64::new(0) }; TRACKED_FDS / 64];

fn set_bit(set: &[AtomicU64], fd: RawFd, on: bool) {
    if fd < 0 || fd as usize >= TRACKED_FDS {
        return;
    }
    let (w, b) = (fd as usize / 64, 1u64 << (fd as usize % 64));
    if on {
        set[w].fetch_or(b, Ordering::Relaxed);
    } else {
        set[w].fetch_and(!b, Ordering::Relaxed);
    }
}

fn has_bit(set: &[AtomicU64], fd: RawFd) -> bool {
    if fd < 0 {
        return false;
    }
    if fd as usize >= TRACKED_FDS {
        // Beyond the bitmap, ask the shim.
        return true;
    }
    set[fd as usize / 64].load(Ordering::Relaxed) & (1u64 << (fd as usize % 64)) != 0
}

pub(crate) fn mark_fd(fd: RawFd, on: bool) {
    set_bit(&OUR_FDS, fd, on);
}

fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Runs `f` on the shim with the re-entry guard set; None when re-entered or
/// when the store cannot be opened (the reason is logged once).
fn with_shim<R>(f: impl FnOnce(&mut Shim) -> R) -> Option<R> {
    if IN_SHIM.with(|g| g.replace(true)) {
        return None;
    }
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            IN_SHIM.with(|g| g.set(false));
        }
    }
    let _reset = Reset;
    let mut guard = SHIM.lock().unwrap_or_else(|p| p.into_inner());
    if guard.is_none() {
        bpftime_runtime::init_logging();
        let name = Store::name_from_env();
        match Store::create_or_open(&name) {
            Ok(store) => {
                tracing::info!(store = %name, "bpftime syscall shim serving bpf() in userspace");
                *guard = Some(Shim::new(store));
            }
            Err(e) => {
                static ONCE: std::sync::Once = std::sync::Once::new();
                ONCE.call_once(|| eprintln!("bpftime: cannot open the store: {e}"));
                return None;
            }
        }
    }
    guard.as_mut().map(f)
}

macro_rules! real {
    ($name:literal, $ty:ty) => {{
        static ADDR: AtomicUsize = AtomicUsize::new(0);
        let mut a = ADDR.load(Ordering::Relaxed);
        if a == 0 {
            // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT finds libc's definition.
            a = unsafe { libc::dlsym(libc::RTLD_NEXT, concat!($name, "\0").as_ptr().cast()) }
                as usize;
            ADDR.store(a, Ordering::Relaxed);
        }
        // SAFETY: the symbol has the C signature `$ty` (libc's declaration).
        unsafe { std::mem::transmute::<usize, $ty>(a) }
    }};
}

type SyscallFn =
    unsafe extern "C" fn(c_long, c_long, c_long, c_long, c_long, c_long, c_long) -> c_long;

fn ret<T: Into<i64>>(r: SysResult<T>) -> i64 {
    match r {
        Ok(v) => v.into(),
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// `syscall(2)`: libbpf issues `bpf()` and `perf_event_open()` through it.
///
/// # Safety
/// As `syscall(2)` for the given number.
#[no_mangle]
pub unsafe extern "C" fn syscall(
    num: c_long,
    a1: c_long,
    a2: c_long,
    a3: c_long,
    a4: c_long,
    a5: c_long,
    a6: c_long,
) -> c_long {
    if num == libc::SYS_bpf {
        // SAFETY: the caller passes bpf()'s arguments.
        if let Some(r) = with_shim(|s| unsafe { s.bpf(a1 as u32, a2 as *mut u8, a3 as usize) }) {
            return ret(r);
        }
    } else if num == libc::SYS_perf_event_open {
        // SAFETY: the caller passes perf_event_open()'s arguments.
        if let Some(Some(r)) =
            with_shim(|s| unsafe { s.perf_event_open(a1 as *const u8, a2 as i32, a3 as i32) })
        {
            return ret(r.map(|fd| fd as i64));
        }
    }
    let real = real!("syscall", SyscallFn);
    // SAFETY: forwards the caller's arguments unchanged.
    let r = unsafe { real(num, a1, a2, a3, a4, a5, a6) };
    // libbpf (1.4 and later) moves map fds into place with a raw dup3.
    if (num == libc::SYS_dup3 || num == libc::SYS_dup2) && r >= 0 {
        track_dup(a1 as c_int, r as c_int);
    }
    r
}

/// # Safety
/// As `ioctl(2)`.
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: c_ulong) -> c_int {
    if has_bit(&OUR_FDS, fd) {
        if let Some(Some(r)) = with_shim(|s| s.ioctl(fd, request, arg)) {
            return ret(r) as c_int;
        }
    }
    let real = real!(
        "ioctl",
        unsafe extern "C" fn(c_int, c_ulong, c_ulong) -> c_int
    );
    // SAFETY: forwards unchanged.
    unsafe { real(fd, request, arg) }
}

unsafe fn mmap_common(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> Option<*mut c_void> {
    if fd < 0 || !has_bit(&OUR_FDS, fd) {
        return None;
    }
    // SAFETY: forwarded caller obligation.
    match with_shim(|s| unsafe { s.mmap(addr, len, prot, flags, fd, off) }) {
        Some(Some(Ok(p))) => Some(p),
        Some(Some(Err(e))) => {
            set_errno(e);
            Some(libc::MAP_FAILED)
        }
        _ => None,
    }
}

/// # Safety
/// As `mmap(2)`.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    // SAFETY: forwarded caller obligation.
    if let Some(p) = unsafe { mmap_common(addr, len, prot, flags, fd, off) } {
        return p;
    }
    let real = real!(
        "mmap",
        unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, c_int, libc::off_t) -> *mut c_void
    );
    // SAFETY: forwards unchanged.
    unsafe { real(addr, len, prot, flags, fd, off) }
}

/// # Safety
/// As `mmap64(2)`.
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off64_t,
) -> *mut c_void {
    // SAFETY: forwarded caller obligation.
    if let Some(p) = unsafe { mmap_common(addr, len, prot, flags, fd, off) } {
        return p;
    }
    let real = real!(
        "mmap64",
        unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, c_int, libc::off64_t) -> *mut c_void
    );
    // SAFETY: forwards unchanged.
    unsafe { real(addr, len, prot, flags, fd, off) }
}

/// # Safety
/// As `close(2)`.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if has_bit(&OUR_FDS, fd) || has_bit(&EPOLL_FDS, fd) {
        with_shim(|s| s.close(fd));
        set_bit(&EPOLL_FDS, fd, false);
    }
    let real = real!("close", unsafe extern "C" fn(c_int) -> c_int);
    // SAFETY: forwards unchanged.
    unsafe { real(fd) }
}

/// # Safety
/// As `epoll_ctl(2)`.
#[no_mangle]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    event: *mut libc::epoll_event,
) -> c_int {
    if has_bit(&OUR_FDS, fd) {
        // SAFETY: forwarded caller obligation.
        if let Some(Some(r)) = with_shim(|s| unsafe { s.epoll_ctl(epfd, op, fd, event) }) {
            if r.is_ok() {
                set_bit(&EPOLL_FDS, epfd, true);
            }
            return ret(r) as c_int;
        }
    }
    let real = real!(
        "epoll_ctl",
        unsafe extern "C" fn(c_int, c_int, c_int, *mut libc::epoll_event) -> c_int
    );
    // SAFETY: forwards unchanged.
    unsafe { real(epfd, op, fd, event) }
}

fn after_wait(epfd: c_int, n: c_int) -> c_int {
    if n > 0 && has_bit(&EPOLL_FDS, epfd) {
        let saved = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        with_shim(|s| s.epoll_drained(epfd));
        set_errno(saved);
    }
    n
}

/// # Safety
/// As `epoll_wait(2)`.
#[no_mangle]
pub unsafe extern "C" fn epoll_wait(
    epfd: c_int,
    events: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    let real = real!(
        "epoll_wait",
        unsafe extern "C" fn(c_int, *mut libc::epoll_event, c_int, c_int) -> c_int
    );
    // SAFETY: forwards unchanged.
    after_wait(epfd, unsafe { real(epfd, events, max, timeout) })
}

/// # Safety
/// As `epoll_pwait(2)`.
#[no_mangle]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    events: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
    sigmask: *const libc::sigset_t,
) -> c_int {
    let real = real!(
        "epoll_pwait",
        unsafe extern "C" fn(
            c_int,
            *mut libc::epoll_event,
            c_int,
            c_int,
            *const libc::sigset_t,
        ) -> c_int
    );
    // SAFETY: forwards unchanged.
    after_wait(epfd, unsafe { real(epfd, events, max, timeout, sigmask) })
}

fn track_dup(old: c_int, new: c_int) {
    if new >= 0 && has_bit(&OUR_FDS, old) {
        with_shim(|s| s.dup(old, new));
    }
}

/// # Safety
/// As `dup(2)`.
#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    let real = real!("dup", unsafe extern "C" fn(c_int) -> c_int);
    // SAFETY: forwards unchanged.
    let new = unsafe { real(fd) };
    track_dup(fd, new);
    new
}

/// # Safety
/// As `dup2(2)`.
#[no_mangle]
pub unsafe extern "C" fn dup2(fd: c_int, new: c_int) -> c_int {
    let real = real!("dup2", unsafe extern "C" fn(c_int, c_int) -> c_int);
    // SAFETY: forwards unchanged.
    let r = unsafe { real(fd, new) };
    track_dup(fd, r);
    r
}

/// # Safety
/// As `dup3(2)`.
#[no_mangle]
pub unsafe extern "C" fn dup3(fd: c_int, new: c_int, flags: c_int) -> c_int {
    let real = real!("dup3", unsafe extern "C" fn(c_int, c_int, c_int) -> c_int);
    // SAFETY: forwards unchanged.
    let r = unsafe { real(fd, new, flags) };
    track_dup(fd, r);
    r
}

/// `fcntl(2)`: libbpf moves fds below 3 up with `F_DUPFD_CLOEXEC`.
///
/// # Safety
/// As `fcntl(2)`.
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    let real = real!(
        "fcntl",
        unsafe extern "C" fn(c_int, c_int, c_ulong) -> c_int
    );
    // SAFETY: forwards unchanged.
    let r = unsafe { real(fd, cmd, arg) };
    if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
        track_dup(fd, r);
    }
    r
}

/// Whether a failed `setrlimit(RLIMIT_MEMLOCK, ...)` is one to report as done:
/// loaders raise the locked-memory limit only because the kernel once charged
/// eBPF maps to it. Maps served here live in shared memory that is never
/// locked, so a refusal (EPERM for an unprivileged user, or in a container)
/// changes nothing for them; reporting it would only tell the user to fix a
/// limit that does not apply.
fn memlock_refusal_is_moot(resource: c_int, r: c_int) -> bool {
    let moot = resource as u32 == libc::RLIMIT_MEMLOCK
        && r != 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    if moot {
        tracing::debug!("setrlimit(RLIMIT_MEMLOCK) refused by the kernel; bpftime's maps do not use locked memory, so it is reported as done");
        set_errno(0);
    }
    moot
}

/// # Safety
/// As `setrlimit(2)`.
#[no_mangle]
pub unsafe extern "C" fn setrlimit(resource: c_int, rlim: *const libc::rlimit) -> c_int {
    let real = real!(
        "setrlimit",
        unsafe extern "C" fn(c_int, *const libc::rlimit) -> c_int
    );
    // SAFETY: forwards unchanged.
    let r = unsafe { real(resource, rlim) };
    if memlock_refusal_is_moot(resource, r) {
        0
    } else {
        r
    }
}

/// # Safety
/// As `setrlimit64(2)`.
#[no_mangle]
pub unsafe extern "C" fn setrlimit64(resource: c_int, rlim: *const libc::rlimit64) -> c_int {
    let real = real!(
        "setrlimit64",
        unsafe extern "C" fn(c_int, *const libc::rlimit64) -> c_int
    );
    // SAFETY: forwards unchanged.
    let r = unsafe { real(resource, rlim) };
    if memlock_refusal_is_moot(resource, r) {
        0
    } else {
        r
    }
}

/// The tracefs files that list legacy (text-defined) uprobes. Probes made here
/// are never legacy ones, so where tracefs is not mounted (containers, or a
/// system that never mounted it) the list bpftime can vouch for is empty.
const UPROBE_EVENTS: [&[u8]; 2] = [
    b"/sys/kernel/tracing/uprobe_events",
    b"/sys/kernel/debug/tracing/uprobe_events",
];

/// `fopen(3)`: bcc (under bpftrace) reads `uprobe_events` when it detaches a
/// uprobe, to remove a legacy probe of the same name, and reports an error
/// when tracefs is missing. For reading, an empty list is the true answer.
///
/// # Safety
/// As `fopen(3)`.
#[no_mangle]
pub unsafe extern "C" fn fopen(
    path: *const libc::c_char,
    mode: *const libc::c_char,
) -> *mut libc::FILE {
    let real = real!(
        "fopen",
        unsafe extern "C" fn(*const libc::c_char, *const libc::c_char) -> *mut libc::FILE
    );
    // SAFETY: forwards unchanged.
    let f = unsafe { real(path, mode) };
    if !f.is_null() || path.is_null() || mode.is_null() {
        return f;
    }
    let saved = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    // SAFETY: both are NUL-terminated strings (fopen's contract).
    let (p, m) = unsafe {
        (
            std::ffi::CStr::from_ptr(path),
            std::ffi::CStr::from_ptr(mode),
        )
    };
    let read_only = m.to_bytes().first() == Some(&b'r') && !m.to_bytes().contains(&b'+');
    if saved == libc::ENOENT && read_only && UPROBE_EVENTS.contains(&p.to_bytes()) {
        tracing::debug!(path = %p.to_string_lossy(), "tracefs is not mounted; serving an empty list of legacy uprobes");
        // SAFETY: NUL-terminated literals.
        return unsafe { real(c"/dev/null".as_ptr(), c"r".as_ptr()) };
    }
    set_errno(saved);
    f
}
