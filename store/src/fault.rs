//! Store files damaged under a running process. Any process of the user can truncate or
//! overwrite a store file while targets have it mapped: a read past a truncated file's
//! end raises SIGBUS, and garbage read from it must not steer an access. This module
//! keeps a table of the store mappings of this process and a fault handler over them:
//! a fault inside one replaces that mapping's pages with anonymous zeros (so the
//! faulting instruction, JIT code's included, runs again harmlessly) and marks the
//! mapping damaged; code that finds garbage marks it damaged too. Whoever serves the
//! object (the agent's watcher) then detaches what uses it.
//!
//! The table is a fixed array of atomics, so the handler reads it without locks or
//! allocation (async-signal-safe); faults outside it go to the handler in place before.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Once;

/// Mappings a process may hold at once: a target's maps, rings and store header, and a
/// tool's. Beyond this, a mapping is unprotected (and said so once).
const SLOTS: usize = 4096;

/// Why a mapping is damaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Damage {
    /// An access faulted: the file was truncated under the mapping.
    Truncated,
    /// What the file holds cannot be (a changed header, an offset out of range, a lock
    /// word no live thread holds).
    Garbage,
}

impl Damage {
    fn code(self) -> u32 {
        match self {
            Damage::Truncated => 1,
            Damage::Garbage => 2,
        }
    }

    fn of(code: u32) -> Option<Damage> {
        match code {
            1 => Some(Damage::Truncated),
            2 => Some(Damage::Garbage),
            _ => None,
        }
    }

    /// What was seen, for a warning.
    pub fn describe(self) -> &'static str {
        match self {
            Damage::Truncated => "its file was truncated under the mapping (an access faulted; the pages now read as zeros in this process)",
            Damage::Garbage => "its file holds values no writer of this store leaves (overwritten or zeroed)",
        }
    }
}

struct Range {
    start: AtomicUsize,
    len: AtomicUsize,
    damage: AtomicU32,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Range = Range {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    damage: AtomicU32::new(0),
};

static RANGES: [Range; SLOTS] = [EMPTY; SLOTS];

const SIGNALS: [libc::c_int; 2] = [libc::SIGBUS, libc::SIGSEGV];

/// The actions in place before ours, where faults outside our mappings go.
static mut PREVIOUS: [std::mem::MaybeUninit<libc::sigaction>; 2] =
    [std::mem::MaybeUninit::uninit(); 2];
static INSTALL: Once = Once::new();

/// Adds `len` bytes at `start` to the table; the slot, or `None` when the table is full.
pub fn register(start: usize, len: usize) -> Option<usize> {
    INSTALL.call_once(install);
    for (i, r) in RANGES.iter().enumerate() {
        if r.start.load(Ordering::Relaxed) == 0
            && r.start
                .compare_exchange(0, start, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            r.damage.store(0, Ordering::Relaxed);
            // The handler takes a range only once its length is there.
            r.len.store(len, Ordering::Release);
            return Some(i);
        }
    }
    static FULL: Once = Once::new();
    FULL.call_once(|| {
        tracing::warn!(
            "more than {SLOTS} store mappings: a truncated store file can crash this process"
        )
    });
    None
}

/// Removes a slot from the table, before its range is unmapped.
pub fn unregister(slot: usize) {
    let r = &RANGES[slot];
    r.len.store(0, Ordering::Release);
    r.start.store(0, Ordering::Release);
}

/// The damage marked on a slot, if any.
pub fn damage(slot: usize) -> Option<Damage> {
    Damage::of(RANGES[slot].damage.load(Ordering::Acquire))
}

/// Marks a slot damaged (the first reason stays).
pub fn mark(slot: usize, why: Damage) {
    let _ =
        RANGES[slot]
            .damage
            .compare_exchange(0, why.code(), Ordering::AcqRel, Ordering::Relaxed);
}

/// A mapping of a store file that the caller made itself (the syscall shim's mappings
/// of rings that libbpf reads), kept in the fault table while the handle lives: a read
/// past the end of a truncated file then finds zero pages instead of ending the process.
/// Drop the handle before the range is unmapped or mapped over, so that a later mapping
/// at the same address is never taken for this one.
#[derive(Debug)]
pub struct GuardedMapping {
    start: usize,
    len: usize,
    /// `None` when the table was full: the mapping is then unprotected (said once).
    slot: Option<usize>,
}

/// Puts the mapping of `len` bytes at `base` in the fault table.
///
/// # Safety
/// `base..base + len` is a mapping this process made (one `mmap` or adjacent fixed ones)
/// and stays one, unmapped and mapped over by nobody, until the handle is dropped: a
/// fault in it, or [`GuardedMapping::condemn`], replaces the whole range.
pub unsafe fn guard_mapping(base: *mut u8, len: usize) -> GuardedMapping {
    GuardedMapping {
        start: base as usize,
        len,
        slot: register(base as usize, len),
    }
}

impl GuardedMapping {
    pub fn start(&self) -> usize {
        self.start
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether any of the `len` bytes at `start` are in this mapping.
    pub fn overlaps(&self, start: usize, len: usize) -> bool {
        start < self.start.saturating_add(self.len) && self.start < start.saturating_add(len)
    }

    /// Why the mapping is damaged, once a fault or [`condemn`](Self::condemn) found it so.
    pub fn damage(&self) -> Option<Damage> {
        self.slot.and_then(damage)
    }

    /// Replaces the whole mapping with private zero pages and marks it damaged for
    /// `why`: what its file holds would lead its reader astray (positions or lengths that
    /// reach outside it). Every later read finds zeros, which readers take for an empty
    /// ring. False when the kernel refused the replacement.
    pub fn condemn(&self, why: Damage) -> bool {
        if let Some(slot) = self.slot {
            mark(slot, why);
        }
        // SAFETY: the range is a whole mapping of this process while the handle lives
        // (guard_mapping's obligation).
        unsafe { zero_pages(self.start, self.len) }
    }
}

impl Drop for GuardedMapping {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            unregister(slot);
        }
    }
}

/// Replaces `len` bytes at `start` with private zero pages; false when the kernel refused.
///
/// # Safety
/// `start..start + len` is a whole mapping this process owns (a registered one).
unsafe fn zero_pages(start: usize, len: usize) -> bool {
    // The system call itself, not libc's `mmap`: in a loader, `mmap` is the syscall
    // shim's interposer, which takes locks (a fault handler must not) and would take
    // this replacement for the loader mapping over one of its rings.
    let ret: isize;
    // SAFETY: caller obligation; MAP_FIXED replaces exactly that range, atomically, so a
    // thread racing the replacement reads either the file's page or a zero page. The
    // x86-64 system call convention: number and result in rax, arguments in rdi, rsi,
    // rdx, r10, r8, r9; rcx and r11 are clobbered.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") libc::SYS_mmap as isize => ret,
            in("rdi") start,
            in("rsi") len,
            in("rdx") libc::PROT_READ | libc::PROT_WRITE,
            in("r10") libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            in("r8") -1isize,
            in("r9") 0usize,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        )
    };
    // Errors come back as -4095..-1.
    !(-4095..0).contains(&ret)
}

fn install() {
    for (i, &sig) in SIGNALS.iter().enumerate() {
        // SAFETY: a zeroed sigaction is "no handler, empty mask"; PREVIOUS[i] is written
        // here, once, before the handler that reads it is in place.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_fault as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            let previous = &mut *std::ptr::addr_of_mut!(PREVIOUS[i]);
            libc::sigaction(sig, &action, previous.as_mut_ptr());
        }
    }
}

extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    // Only faults the kernel raised (si_code > 0) carry an address to trust.
    if code > 0 {
        for r in &RANGES {
            let start = r.start.load(Ordering::Acquire);
            if start == 0 {
                continue;
            }
            let len = r.len.load(Ordering::Acquire);
            if addr >= start && addr - start < len {
                // SAFETY: a registered range is a whole mapping of this process, in place
                // until it is unregistered, which comes before its unmapping.
                if unsafe { zero_pages(start, len) } {
                    let _ = r.damage.compare_exchange(
                        0,
                        Damage::Truncated.code(),
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    );
                    return;
                }
                break;
            }
        }
    }
    let index = SIGNALS.iter().position(|&s| s == sig).unwrap_or(0);
    // SAFETY: PREVIOUS[index] was filled before this handler was installed.
    let previous = unsafe { &*(*std::ptr::addr_of!(PREVIOUS[index])).as_ptr() };
    let handler = previous.sa_sigaction;
    if handler == libc::SIG_IGN && code > 0 {
        // An ignored fault would run again forever; the default ends the process.
    } else if handler == libc::SIG_IGN {
        return;
    } else if handler != libc::SIG_DFL {
        if previous.sa_flags & libc::SA_SIGINFO != 0 {
            // SAFETY: the previous handler was installed with SA_SIGINFO, so it takes these.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(handler) };
            f(sig, info, context);
        } else {
            // SAFETY: a plain handler takes the signal number.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
            f(sig);
        }
        return;
    }
    // The default action: put it back and let the fault happen again (or the signal
    // come again), ending the process as it would have ended without us.
    // SAFETY: a zeroed sigaction with SIG_DFL; raise has no preconditions.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &dfl, std::ptr::null_mut());
        if code <= 0 {
            libc::raise(sig);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of two pages of 7s, mapped shared read-write by the caller itself.
    fn caller_mapping(tag: &str) -> (std::path::PathBuf, std::fs::File, *mut u8) {
        use std::os::fd::AsRawFd;
        let dir = std::env::temp_dir().join(format!("bpftime-guard-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, vec![7u8; 2 * crate::PAGE_SIZE]).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        // SAFETY: a fresh mapping of a file two pages long.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * crate::PAGE_SIZE,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        (dir, file, base.cast())
    }

    fn in_table(start: usize) -> bool {
        RANGES
            .iter()
            .any(|r| r.start.load(Ordering::Acquire) == start)
    }

    #[test]
    fn a_guarded_caller_mapping_of_a_truncated_file_reads_zeros_until_it_is_dropped() {
        let (dir, file, base) = caller_mapping("truncated");
        // SAFETY: our own mapping, unmapped only after the handle is dropped.
        let g = unsafe { guard_mapping(base, 2 * crate::PAGE_SIZE) };
        assert!(in_table(base as usize));
        assert!(g.overlaps(base as usize + crate::PAGE_SIZE, 1));
        assert!(!g.overlaps(base as usize + 2 * crate::PAGE_SIZE, 4096));
        // SAFETY: inside the mapping, backed by the file.
        assert_eq!(
            unsafe { std::ptr::read_volatile(base.add(crate::PAGE_SIZE)) },
            7
        );
        assert_eq!(g.damage(), None);
        file.set_len(0).unwrap();
        // SAFETY: mapped; the handler replaces the page the file no longer backs.
        let after = unsafe { std::ptr::read_volatile(base.add(crate::PAGE_SIZE)) };
        assert_eq!(after, 0, "a truncated page reads as zero");
        assert_eq!(g.damage(), Some(Damage::Truncated));
        drop(g);
        assert!(
            !in_table(base as usize),
            "a dropped handle leaves the table"
        );
        // SAFETY: the range the test mapped, out of the table.
        unsafe { libc::munmap(base.cast(), 2 * crate::PAGE_SIZE) };
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_condemned_mapping_reads_zeros_and_no_longer_sees_its_file() {
        let (dir, file, base) = caller_mapping("condemned");
        // SAFETY: our own mapping, unmapped only after the handle is dropped.
        let g = unsafe { guard_mapping(base, 2 * crate::PAGE_SIZE) };
        assert!(g.condemn(Damage::Garbage));
        assert_eq!(g.damage(), Some(Damage::Garbage));
        use std::os::unix::fs::FileExt;
        file.write_all_at(&[9u8; 8], 0).unwrap();
        for off in [0, crate::PAGE_SIZE, 2 * crate::PAGE_SIZE - 1] {
            // SAFETY: inside the replaced range.
            assert_eq!(unsafe { std::ptr::read_volatile(base.add(off)) }, 0);
        }
        // The first reason stays.
        assert!(g.condemn(Damage::Truncated));
        assert_eq!(g.damage(), Some(Damage::Garbage));
        drop(g);
        // SAFETY: the range the test mapped, out of the table.
        unsafe { libc::munmap(base.cast(), 2 * crate::PAGE_SIZE) };
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_read_past_a_truncated_file_reads_zeros_and_marks_the_mapping() {
        let dir = std::env::temp_dir().join(format!("bpftime-fault-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, vec![7u8; 2 * crate::PAGE_SIZE]).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let m = crate::mapping::Mapping::map_file(&file, 2 * crate::PAGE_SIZE, &path).unwrap();
        // SAFETY: inside the mapping.
        let second = unsafe { m.base().add(crate::PAGE_SIZE) };
        // SAFETY: as above, backed by the file.
        assert_eq!(unsafe { std::ptr::read_volatile(second) }, 7);
        assert_eq!(m.damage(), None);
        file.set_len(0).unwrap();
        // SAFETY: mapped; the page behind it is gone, which the handler repairs.
        let after = unsafe { std::ptr::read_volatile(second) };
        assert_eq!(after, 0, "a truncated page reads as zero");
        assert_eq!(m.damage(), Some(Damage::Truncated));
        // SAFETY: the replacement pages are writable, private memory.
        unsafe { std::ptr::write_volatile(m.base(), 1) };
        drop(m);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
