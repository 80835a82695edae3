//! The libc entry points that an unmodified loader calls, adapted to [`Shim`]. Calls that
//! are not about our objects go to the next definition (libc) untouched. While the shim
//! itself runs, a thread-local flag sends its own libc calls straight through, so nothing
//! recurses.

use bpftime_ffi_guard::ffi_guard;
use bpftime_runtime::Store;
use bpftime_shim::{Shim, SysResult};
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

fn mark_fd(fd: RawFd, on: bool) {
    set_bit(&OUR_FDS, fd, on);
}

fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Why the shim did not serve a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unserved {
    /// The shim's own code made the call (its libc calls pass straight through).
    Reentered,
    /// The store cannot be opened: the errno that says why (the reason was printed once).
    NoStore(i32),
}

impl Unserved {
    /// The errno a call that must not pass to the kernel fails with.
    pub(crate) fn errno(self) -> i32 {
        match self {
            Unserved::Reentered => libc::EDEADLK,
            Unserved::NoStore(errno) => errno,
        }
    }
}

/// Runs `f` on the shim with the re-entry guard set; the store is opened on first use, and
/// again on later calls while it cannot be (the reason is printed once).
pub(crate) fn with_shim<R>(f: impl FnOnce(&mut Shim) -> R) -> Result<R, Unserved> {
    if IN_SHIM.with(|g| g.replace(true)) {
        return Err(Unserved::Reentered);
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
        bpftime_shim::set_fd_observer(mark_fd);
        let name = Store::name_from_env();
        match Store::create_or_open(&name) {
            Ok(store) => {
                tracing::info!(store = %name, "bpftime syscall shim serving bpf() in userspace");
                *guard = Some(Shim::new(store));
            }
            Err(e) => {
                static ONCE: std::sync::Once = std::sync::Once::new();
                ONCE.call_once(|| {
                    let line = format!(
                        "bpftime: cannot open the store `{name}`: {e}; eBPF calls fail \
                         (nothing is passed to the kernel)\n"
                    );
                    // SAFETY: our own buffer to fd 2; a closed stderr is ignored.
                    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
                });
                // A store error whose errno says nothing (0) must still fail the call.
                let errno = match e.errno() {
                    0 => libc::EPERM,
                    n => n,
                };
                return Err(Unserved::NoStore(errno));
            }
        }
    }
    match guard.as_mut() {
        Some(shim) => Ok(f(shim)),
        None => Err(Unserved::NoStore(libc::EPERM)),
    }
}

/// The errno a guarded call fails with when our own code panicked in it.
const INTERNAL_ERROR: i32 = libc::EIO;

fn failed<T: From<i8>>(errno: i32) -> T {
    set_errno(errno);
    T::from(-1)
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

/// `syscall(2)`: libbpf issues `bpf()` and `perf_event_open()` through it. A `bpf()` call
/// is always the shim's, served or failed; so is a `perf_event_open` of an eBPF kind.
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
        return ffi_guard!("bpf", failed(INTERNAL_ERROR), {
            // SAFETY: the caller passes bpf()'s arguments.
            match with_shim(|s| unsafe { s.bpf(a1 as u32, a2 as *mut u8, a3 as usize) }) {
                Ok(r) => ret(r),
                Err(why) => failed(why.errno()),
            }
        });
    }
    if num == libc::SYS_perf_event_open {
        let served = ffi_guard!("perf_event_open", Some(failed(INTERNAL_ERROR)), {
            // SAFETY: the caller passes perf_event_open()'s arguments.
            match with_shim(|s| unsafe { s.perf_event_open(a1 as *const u8, a2 as i32, a3 as i32) })
            {
                Ok(Some(r)) => Some(ret(r.map(|fd| fd as i64))),
                Ok(None) => None,
                // SAFETY: the caller passes a perf_event_attr.
                Err(why) if unsafe { bpftime_shim::perf_attr_is_bpf(a1 as *const u8) } => {
                    Some(failed(why.errno()))
                }
                Err(_) => None,
            }
        });
        if let Some(r) = served {
            return r;
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
        let served = ffi_guard!("ioctl", Some(failed(INTERNAL_ERROR)), {
            match with_shim(|s| s.ioctl(fd, request, arg)) {
                Ok(Some(r)) => Some(ret(r) as c_int),
                _ => None,
            }
        });
        if let Some(r) = served {
            return r;
        }
    }
    if request == bpftime_shim::PERF_EVENT_IOC_SET_BPF {
        // A program onto a perf event the shim did not make: that would be the kernel's
        // eBPF, which is never used here.
        return failed(libc::EOPNOTSUPP);
    }
    let real = real!(
        "ioctl",
        unsafe extern "C" fn(c_int, c_ulong, c_ulong) -> c_int
    );
    // SAFETY: forwards unchanged.
    unsafe { real(fd, request, arg) }
}

/// Mappings the shim handed to the loader, which `munmap` must report: a lock-free table
/// (a free slot has length 0), so that every other `munmap` (malloc's, a thread stack's)
/// passes straight to libc after a few loads, never waiting for the shim.
const HANDED_SLOTS: usize = 4096;

struct HandedSlot {
    start: AtomicUsize,
    len: AtomicUsize,
}

static HANDED: [HandedSlot; HANDED_SLOTS] = [const {
    HandedSlot {
        start: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
    }
}; HANDED_SLOTS];
/// One past the highest slot ever used: scans stop there.
static HANDED_TOP: AtomicUsize = AtomicUsize::new(0);

/// Records a mapping the shim handed out; false when the table is full.
fn note_handed(start: usize, len: usize) -> bool {
    for (i, slot) in HANDED.iter().enumerate() {
        if slot
            .len
            .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            slot.start.store(start, Ordering::Release);
            slot.len.store(len, Ordering::Release);
            HANDED_TOP.fetch_max(i + 1, Ordering::AcqRel);
            return true;
        }
    }
    false
}

/// Whether `len` bytes at `start` touch a mapping the shim handed out; those it touches
/// leave the table.
fn forget_handed(start: usize, len: usize) -> bool {
    let end = start.saturating_add(len.max(1));
    let mut found = false;
    for slot in &HANDED[..HANDED_TOP.load(Ordering::Acquire)] {
        let l = slot.len.load(Ordering::Acquire);
        if l == 0 || l == usize::MAX {
            continue;
        }
        let s = slot.start.load(Ordering::Acquire);
        if start < s.saturating_add(l) && s < end {
            found = true;
            slot.len.store(0, Ordering::Release);
        }
    }
    found
}

/// Before `len` bytes at `addr` are unmapped or mapped over: mappings the shim handed out
/// there leave the fault table, so a later mapping at that address is never taken for
/// one of ours.
fn before_unmap(addr: *mut c_void, len: usize) {
    if forget_handed(addr as usize, len) {
        ffi_guard!("munmap", (), {
            let _ = with_shim(|s| s.munmapped(addr as usize, len));
        });
    }
}

/// After the shim served a mapping: it is remembered for `munmap`, or, with the table
/// full, left out of the fault table at once (unprotected, rather than wrongly kept).
fn after_served(p: *mut c_void, len: usize) {
    if p == libc::MAP_FAILED || note_handed(p as usize, len) {
        return;
    }
    static FULL: std::sync::Once = std::sync::Once::new();
    FULL.call_once(|| {
        tracing::warn!(
            "more than {HANDED_SLOTS} ring mappings at once: a damaged store file can crash this tool"
        )
    });
    let _ = with_shim(|s| s.munmapped(p as usize, len));
}

unsafe fn mmap_common(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> Option<*mut c_void> {
    if flags & libc::MAP_FIXED != 0 {
        before_unmap(addr, len);
    }
    if fd < 0 || !has_bit(&OUR_FDS, fd) {
        return None;
    }
    ffi_guard!(
        "mmap",
        {
            set_errno(INTERNAL_ERROR);
            Some(libc::MAP_FAILED)
        },
        // SAFETY: forwarded caller obligation.
        match with_shim(|s| unsafe { s.mmap(addr, len, prot, flags, fd, off) }) {
            Ok(Some(Ok(p))) => {
                after_served(p, len);
                Some(p)
            }
            Ok(Some(Err(e))) => {
                set_errno(e);
                Some(libc::MAP_FAILED)
            }
            _ => None,
        }
    )
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

/// `munmap(2)`: libbpf unmaps ring pages with it when a ring buffer or perf buffer is
/// freed.
///
/// # Safety
/// As `munmap(2)`.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    before_unmap(addr, len);
    let real = real!("munmap", unsafe extern "C" fn(*mut c_void, usize) -> c_int);
    // SAFETY: forwards unchanged.
    unsafe { real(addr, len) }
}

/// # Safety
/// As `close(2)`.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    let mut object = false;
    if has_bit(&OUR_FDS, fd) || has_bit(&EPOLL_FDS, fd) {
        object = ffi_guard!("close", false, with_shim(|s| s.close(fd)) == Ok(true));
        set_bit(&EPOLL_FDS, fd, false);
    }
    let real = real!("close", unsafe extern "C" fn(c_int) -> c_int);
    // SAFETY: forwards unchanged.
    let r = unsafe { real(fd) };
    if object {
        // The descriptor's reference is gone only now.
        ffi_guard!("close", (), {
            let _ = with_shim(|s| s.collect());
        });
    }
    r
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
        let served = ffi_guard!("epoll_ctl", Some(failed(INTERNAL_ERROR)), {
            // SAFETY: forwarded caller obligation.
            match with_shim(|s| unsafe { s.epoll_ctl(epfd, op, fd, event) }) {
                Ok(Some(r)) => {
                    if r.is_ok() {
                        set_bit(&EPOLL_FDS, epfd, true);
                    }
                    Some(ret(r) as c_int)
                }
                _ => None,
            }
        });
        if let Some(r) = served {
            return r;
        }
    }
    let real = real!(
        "epoll_ctl",
        unsafe extern "C" fn(c_int, c_int, c_int, *mut libc::epoll_event) -> c_int
    );
    // SAFETY: forwards unchanged.
    unsafe { real(epfd, op, fd, event) }
}

fn before_wait(epfd: c_int) {
    if has_bit(&EPOLL_FDS, epfd) {
        let saved = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        ffi_guard!("epoll_wait", (), {
            let _ = with_shim(|s| {
                s.check_handed(Some(epfd));
                s.epoll_arm_ready(epfd)
            });
        });
        set_errno(saved);
    }
}

fn after_wait(epfd: c_int, n: c_int) -> c_int {
    if n > 0 && has_bit(&EPOLL_FDS, epfd) {
        let saved = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        ffi_guard!("epoll_wait", (), {
            let _ = with_shim(|s| {
                s.epoll_drained(epfd);
                // The loader reads the rings right after this returns: what it will read
                // is checked now.
                s.check_handed(Some(epfd));
            });
        });
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
    before_wait(epfd);
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
    before_wait(epfd);
    // SAFETY: forwards unchanged.
    after_wait(epfd, unsafe { real(epfd, events, max, timeout, sigmask) })
}

fn track_dup(old: c_int, new: c_int) {
    if new >= 0 && has_bit(&OUR_FDS, old) {
        ffi_guard!("dup", (), {
            let _ = with_shim(|s| s.dup(old, new));
        });
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
    if ffi_guard!("setrlimit", false, memlock_refusal_is_moot(resource, r)) {
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
    if ffi_guard!("setrlimit", false, memlock_refusal_is_moot(resource, r)) {
        0
    } else {
        r
    }
}

/// The tracefs files that list legacy (text-defined) uprobes and kprobes.
/// Probes made here are never legacy ones, so where tracefs is not mounted
/// (containers, or a system that never mounted it) the list bpftime can vouch
/// for is empty.
const PROBE_EVENTS: [&[u8]; 4] = [
    b"/sys/kernel/tracing/uprobe_events",
    b"/sys/kernel/debug/tracing/uprobe_events",
    b"/sys/kernel/tracing/kprobe_events",
    b"/sys/kernel/debug/tracing/kprobe_events",
];

/// The directory of the kprobe PMU's sysfs files, which the shim answers for
/// where the kernel has no kprobe PMU (see [`bpftime_shim::KprobePmu`]).
const KPROBE_PMU_DIR: &[u8] = b"/sys/bus/event_source/devices/kprobe/";

/// What a missing kprobe PMU file reads, when the shim serves the PMU.
fn served_pmu_file(path: &std::ffi::CStr) -> Option<String> {
    if !path.to_bytes().starts_with(KPROBE_PMU_DIR) {
        return None;
    }
    let served = bpftime_shim::KprobePmu::served(path.to_bytes());
    if served.is_some() {
        tracing::debug!(path = %path.to_string_lossy(), "the kernel has no kprobe PMU; bpftime answers for it (kprobes are CUDA kernel probes)");
    }
    served
}

/// A read-only file descriptor holding `content`, for an `open` the shim answers.
fn memory_file(content: &str, flags: c_int) -> Option<c_int> {
    let cloexec = if flags & libc::O_CLOEXEC != 0 {
        libc::MFD_CLOEXEC
    } else {
        0
    };
    // SAFETY: a NUL-terminated name; the fd is ours until returned.
    let fd = unsafe { libc::memfd_create(c"bpftime-sysfs".as_ptr(), cloexec) };
    if fd < 0 {
        return None;
    }
    // SAFETY: writes `content` into our own memfd, then rewinds it for the reader.
    let ok = unsafe {
        libc::write(fd, content.as_ptr().cast(), content.len()) == content.len() as isize
            && libc::lseek(fd, 0, libc::SEEK_SET) == 0
    };
    if !ok {
        // SAFETY: our own fd.
        unsafe { libc::close(fd) };
        return None;
    }
    Some(fd)
}

/// What a tracefs file of a system call tracepoint (`id`, `format`), or
/// `available_events`, reads when the kernel gives none: tracefs not mounted (ENOENT),
/// or not readable by this user (EACCES). The shim serves those tracepoints, so it
/// answers for them, with the ids its `perf_event_open` takes.
fn served_tracefs_file(path: &std::ffi::CStr, errno: i32) -> Option<String> {
    if errno != libc::ENOENT && errno != libc::EACCES {
        return None;
    }
    let served = bpftime_shim::served_tracefs_file(path.to_bytes());
    if served.is_some() {
        tracing::debug!(path = %path.to_string_lossy(), errno, "the kernel's tracefs gives no such file; bpftime answers for its system call tracepoints");
    }
    served
}

/// After a failed `access` of `path`: whether to answer that it exists, for a tracefs
/// path of a served event the kernel gives none of (libbpf-tools check their tracepoints
/// with `access` before they attach, and turn off programs whose tracepoint is missing).
///
/// # Safety
/// `path` must be NULL or a NUL-terminated string.
unsafe fn access_missing(path: *const libc::c_char, mode: c_int) -> bool {
    let saved = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    if path.is_null()
        || (saved != libc::ENOENT && saved != libc::EACCES)
        || mode & (libc::W_OK | libc::X_OK) != 0
    {
        return false;
    }
    // SAFETY: caller obligation.
    let p = unsafe { std::ffi::CStr::from_ptr(path) };
    let exists = bpftime_shim::served_tracefs_path_exists(p.to_bytes());
    if !exists {
        set_errno(saved);
    }
    exists
}

/// `access(2)`; see [`access_missing`] for the paths the shim answers for.
///
/// # Safety
/// As `access(2)`.
#[no_mangle]
pub unsafe extern "C" fn access(path: *const libc::c_char, mode: c_int) -> c_int {
    let real = real!(
        "access",
        unsafe extern "C" fn(*const libc::c_char, c_int) -> c_int
    );
    // SAFETY: forwards unchanged.
    let r = unsafe { real(path, mode) };
    if r == 0 {
        return r;
    }
    // SAFETY: forwarded caller obligation.
    if ffi_guard!("access", false, unsafe { access_missing(path, mode) }) {
        0
    } else {
        r
    }
}

/// `faccessat(2)`, for absolute paths; see [`access_missing`].
///
/// # Safety
/// As `faccessat(2)`.
#[no_mangle]
pub unsafe extern "C" fn faccessat(
    dirfd: c_int,
    path: *const libc::c_char,
    mode: c_int,
    flags: c_int,
) -> c_int {
    let real = real!(
        "faccessat",
        unsafe extern "C" fn(c_int, *const libc::c_char, c_int, c_int) -> c_int
    );
    // SAFETY: forwards unchanged.
    let r = unsafe { real(dirfd, path, mode, flags) };
    if r == 0 {
        return r;
    }
    // SAFETY: forwarded caller obligation (the served paths are absolute).
    if ffi_guard!("access", false, unsafe { access_missing(path, mode) }) {
        0
    } else {
        r
    }
}

/// After a failed `open`: the file the shim answers for in its place, if any.
///
/// # Safety
/// `path` must be NULL or a NUL-terminated string.
unsafe fn open_missing(path: *const libc::c_char, flags: c_int) -> Option<c_int> {
    let saved = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    if path.is_null() || flags & libc::O_ACCMODE != libc::O_RDONLY {
        return None;
    }
    // SAFETY: caller obligation.
    let p = unsafe { std::ffi::CStr::from_ptr(path) };
    let content = match saved {
        libc::ENOENT => served_pmu_file(p),
        _ => None,
    }
    .or_else(|| served_tracefs_file(p, saved));
    let fd = content.and_then(|c| memory_file(&c, flags));
    if fd.is_none() {
        set_errno(saved);
    }
    fd
}

/// `open(2)`: bcc (under bpftrace) finds the kprobe PMU by reading its sysfs
/// files with `open` and `read`. The mode argument is read as a plain third
/// argument, which is where the variadic one is on the platforms we build for.
///
/// # Safety
/// As `open(2)`.
#[no_mangle]
pub unsafe extern "C" fn open(
    path: *const libc::c_char,
    flags: c_int,
    mode: libc::c_uint,
) -> c_int {
    let real = real!(
        "open",
        unsafe extern "C" fn(*const libc::c_char, c_int, libc::c_uint) -> c_int
    );
    // SAFETY: forwards unchanged.
    let fd = unsafe { real(path, flags, mode) };
    if fd >= 0 {
        return fd;
    }
    ffi_guard!(
        "open",
        fd,
        // SAFETY: forwarded caller obligation.
        unsafe { open_missing(path, flags) }.unwrap_or(fd)
    )
}

/// `open64(2)`: as `open`, for callers built with large-file support.
///
/// # Safety
/// As `open(2)`.
#[no_mangle]
pub unsafe extern "C" fn open64(
    path: *const libc::c_char,
    flags: c_int,
    mode: libc::c_uint,
) -> c_int {
    let real = real!(
        "open64",
        unsafe extern "C" fn(*const libc::c_char, c_int, libc::c_uint) -> c_int
    );
    // SAFETY: forwards unchanged.
    let fd = unsafe { real(path, flags, mode) };
    if fd >= 0 {
        return fd;
    }
    ffi_guard!(
        "open",
        fd,
        // SAFETY: forwarded caller obligation.
        unsafe { open_missing(path, flags) }.unwrap_or(fd)
    )
}

type FopenFn = unsafe extern "C" fn(*const libc::c_char, *const libc::c_char) -> *mut libc::FILE;

/// After a failed `fopen`: the stream the shim answers with in its place, if any.
///
/// bcc (under bpftrace) reads `uprobe_events` or `kprobe_events` when it
/// detaches a probe, to remove a legacy probe of the same name, and reports an
/// error when tracefs is missing: for reading, an empty list is the true
/// answer. libbpf finds the kprobe PMU with `fopen`.
///
/// # Safety
/// `path` and `mode` must be NULL or NUL-terminated strings; `real` is libc's `fopen`.
unsafe fn fopen_missing(
    real: FopenFn,
    path: *const libc::c_char,
    mode: *const libc::c_char,
) -> *mut libc::FILE {
    if path.is_null() || mode.is_null() {
        return std::ptr::null_mut();
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
    if read_only {
        if let Some(f) = served_tracefs_file(p, saved).and_then(|c| memory_stream(&c, m)) {
            return f;
        }
    }
    if saved == libc::ENOENT && read_only {
        if PROBE_EVENTS.contains(&p.to_bytes()) {
            tracing::debug!(path = %p.to_string_lossy(), "tracefs is not mounted; serving an empty list of legacy probes");
            // SAFETY: NUL-terminated literals.
            return unsafe { real(c"/dev/null".as_ptr(), c"r".as_ptr()) };
        }
        if let Some(f) = served_pmu_file(p).and_then(|c| memory_stream(&c, m)) {
            return f;
        }
    }
    set_errno(saved);
    std::ptr::null_mut()
}

/// A read-only stream holding `content`, for an `fopen` the shim answers (`e` in
/// `mode` makes its descriptor close-on-exec).
fn memory_stream(content: &str, mode: &std::ffi::CStr) -> Option<*mut libc::FILE> {
    let flags = if mode.to_bytes().contains(&b'e') {
        libc::O_CLOEXEC
    } else {
        0
    };
    let fd = memory_file(content, flags)?;
    // SAFETY: our own fresh fd, handed over to the stream.
    let f = unsafe { libc::fdopen(fd, c"r".as_ptr()) };
    if f.is_null() {
        // SAFETY: our own fd, which fdopen did not take.
        unsafe { libc::close(fd) };
        return None;
    }
    Some(f)
}

/// `fopen(3)`; see [`fopen_missing`] for the files the shim answers for.
///
/// # Safety
/// As `fopen(3)`.
#[no_mangle]
pub unsafe extern "C" fn fopen(
    path: *const libc::c_char,
    mode: *const libc::c_char,
) -> *mut libc::FILE {
    let real = real!("fopen", FopenFn);
    // SAFETY: forwards unchanged.
    let f = unsafe { real(path, mode) };
    if !f.is_null() {
        return f;
    }
    ffi_guard!(
        "fopen",
        std::ptr::null_mut(),
        // SAFETY: forwarded caller obligation.
        unsafe { fopen_missing(real, path, mode) }
    )
}

/// `fopen64(3)`: as `fopen`, for callers built with large-file support (libbpf).
///
/// # Safety
/// As `fopen(3)`.
#[no_mangle]
pub unsafe extern "C" fn fopen64(
    path: *const libc::c_char,
    mode: *const libc::c_char,
) -> *mut libc::FILE {
    let real = real!("fopen64", FopenFn);
    // SAFETY: forwards unchanged.
    let f = unsafe { real(path, mode) };
    if !f.is_null() {
        return f;
    }
    ffi_guard!(
        "fopen",
        std::ptr::null_mut(),
        // SAFETY: forwarded caller obligation.
        unsafe { fopen_missing(real, path, mode) }
    )
}

/// The callback of [`bpftime_syscall_server__poll_gpu_ringbuf_map`]: a record, its size,
/// and the caller's context.
pub type PollCallback = unsafe extern "C" fn(data: *const c_void, size: u64, ctx: *mut c_void);

/// bpftime's poll of a GPU ring buffer, under the name its loaders look up with
/// `dlsym(RTLD_DEFAULT, "bpftime_syscall_server__poll_gpu_ringbuf_map")` (kernelretsnoop
/// prints "This example can only be used under bpftime!" without it): calls `callback`
/// with every record the ring of `map_fd` holds now, in order, `(data, size, ctx)`, then
/// returns 0; never waits. `data` is valid during the call only. Fails with a negative
/// errno (and `errno` set): -EBADF for a descriptor that is not ours, -EINVAL for one
/// that is no ring buffer or a null callback. See `bpftime_shim::poll_gpu_ring` for what
/// bpftime's own does and how ours differs.
///
/// # Safety
/// `callback`, when not null, must be a function of that C signature, which may be called
/// with `ctx`.
#[no_mangle]
pub unsafe extern "C" fn bpftime_syscall_server__poll_gpu_ringbuf_map(
    map_fd: c_int,
    ctx: *mut c_void,
    callback: Option<PollCallback>,
) -> c_int {
    let fail = |errno: i32| -> c_int {
        set_errno(errno);
        -errno
    };
    ffi_guard!(
        "bpftime_syscall_server__poll_gpu_ringbuf_map",
        fail(INTERNAL_ERROR),
        {
            let Some(callback) = callback else {
                return fail(libc::EINVAL);
            };
            // The ring is taken out of the shim, and read without its lock: the callback
            // may make bpf() calls of its own.
            let ring = match with_shim(|s| s.ring_to_poll(map_fd)) {
                Ok(Ok(ring)) => ring,
                Ok(Err(errno)) => return fail(errno),
                Err(why) => return fail(why.errno()),
            };
            bpftime_shim::poll_gpu_ring(&ring, |record| {
                // SAFETY: the caller's function (see above), with the record's bytes,
                // which stay mapped while the ring handle lives, and its context.
                unsafe { callback(record.as_ptr().cast(), record.len() as u64, ctx) }
            });
            0
        }
    )
}

// After the macros above (`real!`), which it uses.
mod bpffs;
