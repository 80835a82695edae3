//! Buffers that end at an inaccessible page, so that a read or write one byte past
//! what the caller handed over faults at once, sanitizer or not.

const PAGE: usize = 4096;

pub struct Guarded {
    base: *mut u8,
    total: usize,
    ptr: *mut u8,
    len: usize,
}

impl Guarded {
    /// `len` bytes, `bytes` first and zeros after, ending where the guard page starts.
    pub fn new(len: usize, bytes: &[u8]) -> Guarded {
        let data_pages = len.div_ceil(PAGE).max(1);
        let total = (data_pages + 1) * PAGE;
        // SAFETY: a fresh anonymous mapping; no address is imposed.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(base != libc::MAP_FAILED, "the fuzzer is out of memory");
        let base = base.cast::<u8>();
        // SAFETY: the last page of the mapping made above.
        let r =
            unsafe { libc::mprotect(base.add(data_pages * PAGE).cast(), PAGE, libc::PROT_NONE) };
        assert_eq!(r, 0, "mprotect of the guard page");
        // SAFETY: len <= data_pages * PAGE, so ptr stays inside the mapping.
        let ptr = unsafe { base.add(data_pages * PAGE - len) };
        let n = bytes.len().min(len);
        // SAFETY: ptr holds len >= n writable bytes; the source is a distinct slice.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, n) };
        Guarded {
            base,
            total,
            ptr,
            len,
        }
    }

    /// A NUL-terminated string of `bytes` (cut at their first NUL).
    pub fn c_string(bytes: &[u8]) -> Guarded {
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        let mut v = bytes[..end].to_vec();
        v.push(0);
        Guarded::new(v.len(), &v)
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: ptr holds len initialised bytes for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in bytes, and &mut self makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // SAFETY: the mapping made in new, unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.total) };
    }
}
