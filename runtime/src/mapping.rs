//! Shared mappings of store files.

use crate::{Error, Result};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

/// A `MAP_SHARED` read-write mapping of a whole store file, unmapped on drop.
pub(crate) struct Mapping {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; all concurrent access to it goes
// through atomics or the per-map lock, exactly as for other processes.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    pub(crate) fn map_file(file: &File, len: usize, path: &Path) -> Result<Self> {
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
        Ok(Mapping {
            base: base.cast(),
            len,
        })
    }

    /// Maps `head` bytes of the file from offset 0, followed by the `ring` bytes
    /// that start at file offset `head` mapped a second time, so a record that
    /// wraps around the end of a ring buffer is contiguous in memory.
    pub(crate) fn map_file_ring(
        file: &File,
        head: usize,
        ring: usize,
        path: &Path,
    ) -> Result<Self> {
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
        let mapping = Mapping {
            base: base.cast(),
            len,
        };
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

    pub(crate) fn base(&self) -> *mut u8 {
        self.base
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the range this value mapped and owns.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}
