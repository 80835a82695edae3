//! Shared mappings of store files.

use crate::{Error, Result};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

/// A `MAP_SHARED` read-write mapping of a whole store file, unmapped on drop.
pub struct Mapping {
    base: *mut u8,
    len: usize,
    /// Its slot in the fault table (see `fault.rs`); `None` when the table was full.
    slot: Option<usize>,
}

// SAFETY: the mapping is plain shared memory; all concurrent access to it goes
// through atomics or the per-map lock, exactly as for other processes.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the whole of `file`, opened read-write (`path` names it in messages).
    pub fn map_existing(file: &File, path: &Path) -> Result<Self> {
        let len = file
            .metadata()
            .map_err(|e| Error::io("stat", path, e))?
            .len() as usize;
        Self::map_file(file, len, path)
    }

    pub fn map_file(file: &File, len: usize, path: &Path) -> Result<Self> {
        // SAFETY: a fresh mapping chosen by the kernel; the file is at least `len` long
        // (the caller sized it), so every byte of the mapping is backed.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Error::io("mmap", path, std::io::Error::last_os_error()));
        }
        Ok(Mapping::registered(base.cast(), len))
    }

    fn registered(base: *mut u8, len: usize) -> Mapping {
        Mapping {
            base,
            len,
            slot: crate::fault::register(base as usize, len),
        }
    }

    /// Maps `head` bytes of the file from offset 0, followed by the `ring` bytes
    /// that start at file offset `head` mapped a second time, so a record that
    /// wraps around the end of a ring buffer is contiguous in memory.
    pub fn map_file_ring(file: &File, head: usize, ring: usize, path: &Path) -> Result<Self> {
        let len = head + 2 * ring;
        // SAFETY: reserves address space only; nothing reads it before the fixed
        // mappings below replace it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Error::io("mmap", path, std::io::Error::last_os_error()));
        }
        let mapping = Mapping::registered(base.cast(), len);
        let fixed = |addr: *mut u8, size: usize, off: usize| -> Result<()> {
            // SAFETY: `addr..addr+size` lies inside the reservation above, which this
            // function owns; MAP_FIXED replaces only that range.
            let p = unsafe {
                libc::mmap(
                    addr.cast(),
                    size,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    file.as_raw_fd(),
                    off as libc::off_t,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(Error::io("mmap", path, std::io::Error::last_os_error()));
            }
            Ok(())
        };
        fixed(mapping.base, head + ring, 0)?;
        // SAFETY: in bounds of the reservation (len = head + 2 * ring).
        fixed(unsafe { mapping.base.add(head + ring) }, ring, head)?;
        Ok(mapping)
    }

    pub fn base(&self) -> *mut u8 {
        self.base
    }

    /// How many bytes are mapped at [`Mapping::base`] (never 0: a mapping of nothing fails).
    pub fn byte_len(&self) -> usize {
        self.len
    }

    /// Why the mapping is damaged, once a fault or a check found it so.
    pub fn damage(&self) -> Option<crate::fault::Damage> {
        self.slot.and_then(crate::fault::damage)
    }

    /// Marks the mapping damaged: what it holds cannot be trusted any more.
    pub fn mark_damaged(&self, why: crate::fault::Damage) {
        if let Some(slot) = self.slot {
            crate::fault::mark(slot, why);
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // Out of the fault table first: the range may be reused once unmapped.
        if let Some(slot) = self.slot {
            crate::fault::unregister(slot);
        }
        // SAFETY: unmaps exactly the range this value mapped and owns.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

/// The 8 bytes of static TLS at `offset` from this thread's pointer.
///
/// # Safety
/// `offset` is that of 8 bytes, 8-aligned, in the static TLS block of a module that stays
/// loaded (an initial-exec variable, `var@gottpoff`).
pub unsafe fn read_tls_word(offset: isize) -> u64 {
    let v: u64;
    // SAFETY: caller obligation; the word is this thread's own.
    unsafe {
        std::arch::asm!(
            "mov {v}, qword ptr fs:[{offset}]",
            offset = in(reg) offset,
            v = out(reg) v,
            options(nostack, readonly, preserves_flags),
        )
    };
    v
}

/// Sets the word [`read_tls_word`] reads.
///
/// # Safety
/// As [`read_tls_word`].
pub unsafe fn write_tls_word(offset: isize, v: u64) {
    // SAFETY: caller obligation; the word is this thread's own.
    unsafe {
        std::arch::asm!(
            "mov qword ptr fs:[{offset}], {v}",
            offset = in(reg) offset,
            v = in(reg) v,
            options(nostack, preserves_flags),
        )
    };
}
