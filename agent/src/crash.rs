//! A crash report for the target, asked for with `BPFTIME_CRASH_REPORT=1`: when the
//! process dies of a fault or an abort, one block on stderr says which signal, which
//! thread, where (the instruction and the faulting address, each with the mapping that
//! holds it) and the stack as glibc's unwinder sees it. A crash under bpftime is then
//! placed in our code, the driver's or the application's without a debugger, which the
//! GPU machines do not have. Off by default: applications (JVMs, Python's faulthandler)
//! own these signals, and a report changes nothing else.
//!
//! Everything the handler does is async-signal-safe except `backtrace`, whose first call
//! loads the unwinder; it is called once at install so the handler's call only walks.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};

const SIGNALS: [libc::c_int; 5] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGABRT,
];

extern "C" {
    // glibc's execinfo.h, which the libc crate does not declare.
    fn backtrace(buffer: *mut *mut c_void, size: libc::c_int) -> libc::c_int;
    fn backtrace_symbols_fd(buffer: *const *mut c_void, size: libc::c_int, fd: libc::c_int);
}

/// The actions in place before ours, restored before the signal is delivered again.
static mut PREVIOUS: [std::mem::MaybeUninit<libc::sigaction>; 5] =
    [std::mem::MaybeUninit::uninit(); 5];
static REPORTED: AtomicBool = AtomicBool::new(false);

/// Installs the report when `BPFTIME_CRASH_REPORT=1`.
pub(crate) fn install_if_asked() {
    if !std::env::var("BPFTIME_CRASH_REPORT").is_ok_and(|v| v == "1") {
        return;
    }
    let mut frames = [std::ptr::null_mut(); 4];
    // SAFETY: a buffer of 4 frame slots; this first call loads the unwinder.
    unsafe { backtrace(frames.as_mut_ptr(), 4) };
    for (i, &sig) in SIGNALS.iter().enumerate() {
        // SAFETY: a zeroed sigaction is "no handler, empty mask"; PREVIOUS is written
        // here, before the handler that reads it is in place, and nowhere else.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_crash as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            let previous = &mut *std::ptr::addr_of_mut!(PREVIOUS[i]);
            libc::sigaction(sig, &action, previous.as_mut_ptr());
        }
    }
    tracing::info!("crash report on: a fault or abort prints where it happened");
}

/// A fixed buffer of text, written to stderr in one call.
struct Line {
    buf: [u8; 512],
    len: usize,
}

impl Line {
    fn new() -> Line {
        Line {
            buf: [0; 512],
            len: 0,
        }
    }
    fn text(&mut self, s: &[u8]) -> &mut Line {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s[..n]);
        self.len += n;
        self
    }
    fn hex(&mut self, v: u64) -> &mut Line {
        let mut digits = [0u8; 18];
        digits[0] = b'0';
        digits[1] = b'x';
        let mut n = 2;
        let mut started = false;
        for shift in (0..16).rev() {
            let d = ((v >> (shift * 4)) & 0xf) as u8;
            if d != 0 || started || shift == 0 {
                started = true;
                digits[n] = if d < 10 { b'0' + d } else { b'a' + d - 10 };
                n += 1;
            }
        }
        self.text(&digits[..n])
    }
    fn dec(&mut self, v: i64) -> &mut Line {
        let mut digits = [0u8; 20];
        let mut n = 0;
        let mut u = v.unsigned_abs();
        loop {
            digits[19 - n] = b'0' + (u % 10) as u8;
            n += 1;
            u /= 10;
            if u == 0 {
                break;
            }
        }
        if v < 0 {
            self.text(b"-");
        }
        self.text(&digits[20 - n..])
    }
    fn emit(&mut self) {
        self.text(b"\n");
        // SAFETY: write(2) of our own buffer.
        unsafe { libc::write(2, self.buf.as_ptr().cast(), self.len) };
        self.len = 0;
    }
}

/// This process's /proc/self/maps, read into a static buffer (empty if it cannot be).
fn read_maps() -> &'static [u8] {
    static mut MAPS: [u8; 1 << 20] = [0; 1 << 20];
    // SAFETY: only the first crashing thread gets here (REPORTED), so the buffer has one
    // user; open/read/close are async-signal-safe.
    unsafe {
        let buf = &mut *std::ptr::addr_of_mut!(MAPS);
        let fd = libc::open(c"/proc/self/maps".as_ptr(), libc::O_RDONLY);
        if fd < 0 {
            return &[];
        }
        let mut len = 0;
        while len < buf.len() {
            let n = libc::read(fd, buf[len..].as_mut_ptr().cast(), buf.len() - len);
            if n <= 0 {
                break;
            }
            len += n as usize;
        }
        libc::close(fd);
        &buf[..len]
    }
}

/// Writes the line of `maps` that holds `addr`, if one does.
fn write_mapping(maps: &[u8], label: &[u8], addr: u64) {
    for entry in maps.split(|&b| b == b'\n') {
        let Some(dash) = entry.iter().position(|&b| b == b'-') else {
            continue;
        };
        let Some(space) = entry.iter().position(|&b| b == b' ') else {
            continue;
        };
        let (Some(start), Some(end)) = (
            parse_hex(&entry[..dash]),
            parse_hex(&entry[dash + 1..space]),
        ) else {
            continue;
        };
        if (start..end).contains(&addr) {
            Line::new()
                .text(b"  ")
                .text(label)
                .text(b" ")
                .hex(addr)
                .text(b" is at +")
                .hex(addr - start)
                .text(b" in ")
                .text(entry)
                .emit();
            return;
        }
    }
    Line::new()
        .text(b"  ")
        .text(label)
        .text(b" ")
        .hex(addr)
        .text(b" is in no mapping")
        .emit();
}

fn parse_hex(s: &[u8]) -> Option<u64> {
    let mut v: u64 = 0;
    for &b in s {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => return None,
        };
        v = v.checked_mul(16)?.checked_add(u64::from(d))?;
    }
    Some(v)
}

extern "C" fn on_crash(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    let index = SIGNALS.iter().position(|&s| s == sig).unwrap_or(0);
    if !REPORTED.swap(true, Ordering::SeqCst) {
        // SAFETY: the kernel passes a valid siginfo and ucontext to an SA_SIGINFO handler.
        let (code, fault, ip, sp, bp) = unsafe {
            let regs = &(*context.cast::<libc::ucontext_t>()).uc_mcontext.gregs;
            (
                (*info).si_code,
                (*info).si_addr() as u64,
                regs[libc::REG_RIP as usize] as u64,
                regs[libc::REG_RSP as usize] as u64,
                regs[libc::REG_RBP as usize] as u64,
            )
        };
        let mut name = [0u8; 16];
        // SAFETY: PR_GET_NAME writes at most 16 bytes; gettid has no preconditions.
        let tid = unsafe {
            libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr());
            libc::syscall(libc::SYS_gettid)
        };
        let name_len = name.iter().position(|&b| b == 0).unwrap_or(16);
        Line::new()
            .text(b"bpftime crash report: signal ")
            .dec(i64::from(sig))
            .text(b" code ")
            .dec(i64::from(code))
            .text(b" address ")
            .hex(fault)
            .text(b" in thread ")
            .dec(tid)
            .text(b" (")
            .text(&name[..name_len])
            .text(b") ip ")
            .hex(ip)
            .text(b" sp ")
            .hex(sp)
            .text(b" bp ")
            .hex(bp)
            .emit();
        let maps = read_maps();
        write_mapping(maps, b"ip", ip);
        if sig != libc::SIGABRT {
            write_mapping(maps, b"address", fault);
        }
        let mut frames = [std::ptr::null_mut(); 48];
        // SAFETY: the unwinder was loaded at install; the buffer holds 48 frames.
        unsafe {
            let n = backtrace(frames.as_mut_ptr(), 48);
            backtrace_symbols_fd(frames.as_ptr(), n, 2);
        }
    }
    // SAFETY: PREVIOUS[index] was filled at install; putting it back and returning
    // (a fault runs its instruction again) or raising again (an abort) ends the process
    // as it would have ended without us.
    unsafe {
        let previous = (*std::ptr::addr_of!(PREVIOUS[index])).as_ptr();
        libc::sigaction(sig, previous, std::ptr::null_mut());
        if sig == libc::SIGABRT || (*info).si_code <= 0 {
            libc::raise(sig);
        }
    }
}
