//! Reading the interpreter's memory from inside its process without ever faulting.
//!
//! The walk follows pointers found in the interpreter's structures. On the launching
//! thread's own frames they are good (the thread is inside those calls, so its frames and
//! their code objects are alive and nobody else changes them), but a layout this crate
//! got wrong would make them anything, and a fault would kill the application. So every
//! read is checked first.
//!
//! `process_vm_readv` on our own pid checks every read and never faults, but it is a
//! system call: 2 µs each on the development VM, per frame, at every kernel launch. So a
//! read is checked against a copy of the process's readable private mappings instead and
//! then copied directly; a read outside that copy goes through `process_vm_readv`, and if
//! that succeeds (or the call is refused, as a container's seccomp filter may) the copy
//! may be stale and is read again (at most once a second). Shared
//! mappings and devices are never read directly (a device mapping can fault on a read
//! of a mapped page): interpreter structures are never there.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard};
use std::time::Instant;

/// A source of bytes at addresses.
pub(crate) trait Memory {
    /// Fills `out` from `addr` on; false where any of it cannot be read.
    fn read(&self, addr: usize, out: &mut [u8]) -> bool;

    /// The `len` bytes at `addr`, where all of them can be read, for fields to be loaded
    /// from: a structure is checked once, then only the fields the walk needs are loaded.
    fn span(&self, addr: usize, len: usize) -> Option<Span> {
        let mut copy = vec![0u8; len];
        self.read(addr, &mut copy).then_some(Span::Copied(copy))
    }

    fn word(&self, addr: usize) -> Option<usize> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b).then(|| usize::from_le_bytes(b))
    }
}

/// Bytes found readable, to load fields from.
pub(crate) enum Span {
    /// In a readable mapping of this process: loaded in place.
    Mapped {
        addr: usize,
        len: usize,
    },
    Copied(Vec<u8>),
}

impl Span {
    /// The `N` bytes at `off`; zeros past the span's end (where the walk's layouts never
    /// reach).
    #[inline]
    fn bytes<const N: usize>(&self, off: usize) -> [u8; N] {
        let mut b = [0u8; N];
        match self {
            Span::Mapped { addr, len } => {
                if off <= *len && N <= *len - off {
                    load(addr + off, &mut b);
                }
            }
            Span::Copied(v) => {
                if let Some(s) = off.checked_add(N).and_then(|end| v.get(off..end)) {
                    b.copy_from_slice(s);
                }
            }
        }
        b
    }

    #[inline]
    pub(crate) fn word(&self, off: usize) -> usize {
        match *self {
            // The common case, a field of a structure in place: one load.
            Span::Mapped { addr, len } if off < len && len - off >= 8 => {
                let at = addr + off;
                if at.is_multiple_of(8) {
                    // SAFETY: within a span checked to lie in a readable mapping (as
                    // `load` has it), aligned for a usize.
                    return unsafe { std::ptr::read_volatile(at as *const usize) };
                }
                usize::from_le_bytes(self.bytes(off))
            }
            _ => usize::from_le_bytes(self.bytes(off)),
        }
    }

    #[inline]
    pub(crate) fn int(&self, off: usize) -> i32 {
        match *self {
            Span::Mapped { addr, len } if off < len && len - off >= 4 => {
                let at = addr + off;
                if at.is_multiple_of(4) {
                    // SAFETY: within a span checked to lie in a readable mapping (as
                    // `load` has it), aligned for an i32.
                    return unsafe { std::ptr::read_volatile(at as *const i32) };
                }
                i32::from_le_bytes(self.bytes(off))
            }
            _ => i32::from_le_bytes(self.bytes(off)),
        }
    }

    #[inline]
    pub(crate) fn byte(&self, off: usize) -> u8 {
        self.bytes::<1>(off)[0]
    }
}

/// This process's memory, checked against one look at the copy of its mappings: made for
/// one capture, and dropped before the next (the copy is read again only when no
/// capture looks at it).
pub(crate) struct OwnMemory {
    mappings: Option<RwLockReadGuard<'static, Vec<(usize, usize)>>>,
    /// The mapping the last read was in: a walk reads mostly in a few (the thread's frame
    /// stack, an arena of code objects), so most reads are checked against it alone.
    last: Cell<(usize, usize)>,
    /// A read outside the copy succeeded: the copy is stale.
    stale: Cell<bool>,
}

/// The readable private mappings, as sorted, merged `[start, end)` ranges.
static MAPPINGS: RwLock<Vec<(usize, usize)>> = RwLock::new(Vec::new());
/// When [`MAPPINGS`] was last read, in ms since [`EPOCH`]; 0 for never.
static MAPPINGS_READ_MS: AtomicU64 = AtomicU64::new(0);
static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// How often a stale copy of the mappings may be read again: reading /proc/self/maps of
/// a process with PyTorch loaded takes milliseconds.
const REREAD_MS: u64 = 1000;

impl OwnMemory {
    pub(crate) fn new() -> OwnMemory {
        if MAPPINGS_READ_MS.load(Ordering::Relaxed) == 0 {
            refresh_mappings(true);
        }
        OwnMemory {
            mappings: Some(MAPPINGS.read().unwrap_or_else(|e| e.into_inner())),
            last: Cell::new((0, 0)),
            stale: Cell::new(false),
        }
    }
}

impl Drop for OwnMemory {
    fn drop(&mut self) {
        self.mappings = None;
        if self.stale.get() {
            refresh_mappings(false);
        }
    }
}

impl OwnMemory {
    /// Whether `len` bytes at `addr` lie in one readable private mapping of the copy.
    fn mapped(&self, addr: usize, len: usize) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        if addr < 4096 {
            return false;
        }
        let within = |(s, e): (usize, usize)| s <= addr && end <= e;
        within(self.last.get())
            || self.mappings.as_ref().is_some_and(|m| {
                let i = m.partition_point(|&(_, e)| e <= addr);
                let hit = m.get(i).copied().filter(|&r| within(r));
                if let Some(r) = hit {
                    self.last.set(r);
                }
                hit.is_some()
            })
    }
}

impl Memory for OwnMemory {
    fn read(&self, addr: usize, out: &mut [u8]) -> bool {
        if out.is_empty() {
            return true;
        }
        if self.mapped(addr, out.len()) {
            for (i, b) in out.iter_mut().enumerate() {
                load(addr + i, std::array::from_mut(b));
            }
            return true;
        }
        self.read_outside(addr, out)
    }

    fn span(&self, addr: usize, len: usize) -> Option<Span> {
        if len > 0 && self.mapped(addr, len) {
            return Some(Span::Mapped { addr, len });
        }
        let mut copy = vec![0u8; len];
        self.read_outside(addr, &mut copy)
            .then_some(Span::Copied(copy))
    }
}

impl OwnMemory {
    /// A read outside the copy of the mappings, through the kernel.
    fn read_outside(&self, addr: usize, out: &mut [u8]) -> bool {
        match read_checked(addr, out) {
            Checked::Read => {
                // Readable, yet not in the copy: something was mapped since it was made.
                self.stale.set(true);
                true
            }
            Checked::NotMapped => false,
            Checked::Refused => {
                // The kernel would not say (a seccomp filter that refuses the call, as
                // some container runtimes have): the copy may be stale, so it is read
                // again, and the read fails meanwhile.
                self.stale.set(true);
                false
            }
        }
    }
}

/// Loads `N` bytes at `at`, in memory known to be mapped and readable: one load where
/// aligned.
///
/// The caller has checked that [at, at + N) lies in a readable private mapping of this
/// process (`Span::Mapped` is only made so); a mapping that a live interpreter structure
/// lies in is not unmapped while the walk reads it.
#[inline]
fn load<const N: usize>(at: usize, out: &mut [u8; N]) {
    // Volatile loads: the bytes belong to the interpreter, outside anything Rust knows
    // of, and the compiler must neither assume them unchanged nor invent reads.
    if N == 8 && at.is_multiple_of(8) {
        // SAFETY: mapped and readable (the function's contract), aligned for a u64.
        let v = unsafe { std::ptr::read_volatile(at as *const u64) };
        out.iter_mut()
            .zip(v.to_ne_bytes())
            .for_each(|(o, b)| *o = b);
    } else if N == 4 && at.is_multiple_of(4) {
        // SAFETY: mapped and readable (the function's contract), aligned for a u32.
        let v = unsafe { std::ptr::read_volatile(at as *const u32) };
        out.iter_mut()
            .zip(v.to_ne_bytes())
            .for_each(|(o, b)| *o = b);
    } else {
        for (i, b) in out.iter_mut().enumerate() {
            // SAFETY: mapped and readable (the function's contract).
            *b = unsafe { std::ptr::read_volatile((at + i) as *const u8) };
        }
    }
}

enum Checked {
    Read,
    /// Some of it is not mapped (or not readable): what a direct read would fault on.
    NotMapped,
    /// The call itself was refused.
    Refused,
}

/// Reads through the kernel, which fails where a direct read would fault.
fn read_checked(addr: usize, out: &mut [u8]) -> Checked {
    let local = libc::iovec {
        iov_base: out.as_mut_ptr().cast(),
        iov_len: out.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: out.len(),
    };
    // SAFETY: the kernel writes at most `out.len()` bytes into `out` and reads the
    // remote range itself, failing with EFAULT where it is not mapped.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n == out.len() as isize {
        return Checked::Read;
    }
    // A short read is a range that ends in memory that cannot be read.
    if n >= 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EFAULT) {
        Checked::NotMapped
    } else {
        Checked::Refused
    }
}

fn now_ms() -> u64 {
    // Never 0, which means "never read".
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

fn refresh_mappings(first: bool) {
    let now = now_ms();
    let last = MAPPINGS_READ_MS.load(Ordering::Relaxed);
    if !first && now.saturating_sub(last) < REREAD_MS {
        return;
    }
    // One thread reads; the others go on with the copy they have.
    if MAPPINGS_READ_MS
        .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    let Ok(text) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    let ranges = readable_private(&text);
    *MAPPINGS.write().unwrap_or_else(|e| e.into_inner()) = ranges;
}

/// The readable private mappings of a `/proc/PID/maps` text, sorted and merged.
fn readable_private(maps: &str) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for line in maps.lines() {
        let mut parts = line.split_ascii_whitespace();
        let (Some(range), Some(perms)) = (parts.next(), parts.next()) else {
            continue;
        };
        let path = parts.nth(3).unwrap_or("");
        let perms = perms.as_bytes();
        if perms.len() < 4 || perms[0] != b'r' || perms[3] != b'p' {
            continue;
        }
        // Device memory can fault on a read; the kernel's pages ([vvar]) too.
        if path.starts_with("/dev/") || path.starts_with("[vvar") || path == "[vsyscall]" {
            continue;
        }
        let Some((s, e)) = range.split_once('-') else {
            continue;
        };
        let (Ok(s), Ok(e)) = (usize::from_str_radix(s, 16), usize::from_str_radix(e, 16)) else {
            continue;
        };
        match out.last_mut() {
            Some(last) if last.1 == s => last.1 = e,
            _ => out.push((s, e)),
        }
    }
    out.sort_unstable();
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Memory made of given regions, for walks over made-up structures.
    pub(crate) struct Fake {
        regions: Vec<(usize, Vec<u8>)>,
    }

    impl Fake {
        pub(crate) fn new(regions: &[(usize, Vec<u8>)]) -> Fake {
            Fake {
                regions: regions.to_vec(),
            }
        }
    }

    impl Memory for Fake {
        fn read(&self, addr: usize, out: &mut [u8]) -> bool {
            for (start, bytes) in &self.regions {
                if addr >= *start && addr + out.len() <= start + bytes.len() {
                    let at = addr - start;
                    out.copy_from_slice(&bytes[at..at + out.len()]);
                    return true;
                }
            }
            false
        }
    }

    #[test]
    fn own_memory_reads_what_is_mapped_and_refuses_what_is_not() {
        let here = [7u8, 8, 9, 10];
        let mut out = [0u8; 4];
        assert!(OwnMemory::new().read(here.as_ptr() as usize, &mut out));
        assert_eq!(out, here);
        let heap = vec![0x5au8; 100_000];
        let mut big = vec![0u8; heap.len()];
        assert!(OwnMemory::new().read(heap.as_ptr() as usize, &mut big));
        assert_eq!(big, heap);
        for bogus in [
            0usize,
            8,
            0xdead_0000,
            usize::MAX - 3,
            0x7fff_ffff_f000_0000,
        ] {
            assert!(!OwnMemory::new().read(bogus, &mut out), "{bogus:#x}");
        }
    }

    #[test]
    fn fields_load_from_a_span_checked_once() {
        let words: Vec<u64> = vec![0x1122_3344_5566_7788, 0xdead_beef, 7];
        // The copy of the mappings is the process's, and tests beside this one read it:
        // one read before this thread's heap was mapped would not hold the vector.
        refresh_mappings(true);
        let mem = OwnMemory::new();
        let span = mem.span(words.as_ptr() as usize, 24).unwrap();
        assert!(matches!(span, Span::Mapped { .. }));
        assert_eq!(span.word(0), 0x1122_3344_5566_7788);
        assert_eq!(
            (span.int(8), span.byte(16), span.byte(1)),
            (0xdead_beefu32 as i32, 7, 0x77)
        );
        assert_eq!(span.word(20), 0, "past the end");
        assert!(mem.span(0xdead_0000, 8).is_none());
        let copied = Fake::new(&[(0x1000, vec![1, 2, 3, 4, 5, 6, 7, 8, 9])]).span(0x1000, 9);
        assert_eq!(
            copied.map(|s| (s.word(1), s.word(2))),
            Some((0x0908_0706_0504_0302, 0))
        );
    }

    #[test]
    fn a_page_that_cannot_be_read_is_refused_and_a_new_mapping_is_read() {
        // SAFETY: a fresh anonymous mapping of two pages, ours alone.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let addr = p as usize;
        // SAFETY: the second page of our mapping loses its access; the first is written.
        unsafe {
            libc::mprotect((addr + 4096) as *mut libc::c_void, 4096, libc::PROT_NONE);
            *(addr as *mut u8) = 42;
        }
        let mut b = [0u8; 1];
        assert!(OwnMemory::new().read(addr, &mut b));
        assert_eq!(b[0], 42);
        let mut across = [0u8; 16];
        assert!(!OwnMemory::new().read(addr + 4096 - 8, &mut across));
        assert!(!OwnMemory::new().read(addr + 4096, &mut b));
        // SAFETY: our own mapping, no longer used.
        unsafe { libc::munmap(p, 8192) };
    }

    #[test]
    fn the_readable_private_mappings_are_merged_and_devices_left_out() {
        let maps = "\
7f0000000000-7f0000001000 r--p 00000000 08:01 12 /usr/lib/libpython3.12.so.1.0
7f0000001000-7f0000003000 rw-p 00001000 08:01 12 /usr/lib/libpython3.12.so.1.0
7f0000003000-7f0000004000 ---p 00000000 00:00 0
7f0000004000-7f0000005000 rw-s 00000000 00:05 9 /dev/shm/store
7f0000005000-7f0000006000 rw-p 00000000 00:05 9 /dev/nvidia0
7f0000006000-7f0000007000 rw-p 00000000 00:00 0 [heap]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]
";
        assert_eq!(
            readable_private(maps),
            vec![
                (0x7f00_0000_0000, 0x7f00_0000_3000),
                (0x7f00_0000_6000, 0x7f00_0000_7000)
            ]
        );
    }
}
