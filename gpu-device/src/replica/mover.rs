use super::*;

/// Device memory and a stream of our own in one context, for moving bytes.
pub struct Mover<'a> {
    pub api: &'a Api,
    /// A non-blocking stream of GPU attach's own in the current context.
    pub stream: Handle,
    /// The context's arena, where there is one: addresses that repeat from run to run.
    pub arena: Option<&'a Arena>,
}

impl Mover<'_> {
    pub fn alloc(&self, bytes: usize) -> Result<DevicePtr, CudaError> {
        if let Some(arena) = self.arena {
            match arena.alloc(self.api, bytes) {
                Ok(p) => return Ok(p),
                Err(e) => tracing::debug!(bytes, "device memory outside the arena: {e}"),
            }
        }
        let mut p = 0;
        // SAFETY: writes one device pointer.
        self.api.check("cuMemAlloc", unsafe {
            (self.api.mem_alloc)(&mut p, bytes.max(8))
        })?;
        Ok(p)
    }

    /// `bytes` of page-locked host memory.
    pub fn alloc_pinned(&self, bytes: usize) -> Result<Pinned, CudaError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: writes one host pointer.
        self.api.check("cuMemHostAlloc", unsafe {
            (self.api.mem_host_alloc)(&mut p, bytes.max(8), 0)
        })?;
        let at = std::ptr::NonNull::new(p.cast::<u8>()).ok_or_else(|| CudaError {
            call: "cuMemHostAlloc",
            code: 0,
            name: "a null pointer".into(),
        })?;
        Ok(Pinned { at, len: bytes })
    }

    /// Copies `bytes` to `dst` and waits for it.
    pub fn put(&self, dst: DevicePtr, bytes: &[u8]) -> Result<(), CudaError> {
        if bytes.is_empty() {
            return Ok(());
        }
        // SAFETY: `bytes` stays borrowed until the copy is waited for below.
        self.api.check("cuMemcpyHtoDAsync", unsafe {
            (self.api.memcpy_htod_async)(dst, bytes.as_ptr().cast(), bytes.len(), self.stream)
        })?;
        self.wait()
    }

    /// Copies `out.len()` bytes from `src` and waits for them.
    pub fn get(&self, src: DevicePtr, out: &mut [u8]) -> Result<(), CudaError> {
        self.get_async(src, out)?;
        self.wait()
    }

    /// Queues a copy of `out.len()` bytes from `src`; `out` must not be read or dropped
    /// before [`Mover::wait`] returns (the borrow checker does not see the device's
    /// write: callers keep the buffer borrowed across the wait).
    pub fn get_async(&self, src: DevicePtr, out: &mut [u8]) -> Result<(), CudaError> {
        if out.is_empty() {
            return Ok(());
        }
        // SAFETY: the caller keeps `out` alive and unread until it waits (above).
        self.api.check("cuMemcpyDtoHAsync", unsafe {
            (self.api.memcpy_dtoh_async)(
                out.as_mut_ptr().cast::<c_void>(),
                src,
                out.len(),
                self.stream,
            )
        })
    }

    /// Queues a copy of `bytes` to `dst`, staged so that the caller's buffer is free at
    /// once: a pageable source is copied before the call returns.
    pub fn put_async(&self, dst: DevicePtr, bytes: &[u8]) -> Result<(), CudaError> {
        if bytes.is_empty() {
            return Ok(());
        }
        // SAFETY: `bytes` is readable for its length; from pageable memory the driver
        // stages the copy before returning.
        self.api.check("cuMemcpyHtoDAsync", unsafe {
            (self.api.memcpy_htod_async)(dst, bytes.as_ptr().cast(), bytes.len(), self.stream)
        })
    }

    pub fn zero(&self, dst: DevicePtr, bytes: usize) -> Result<(), CudaError> {
        // SAFETY: a device range we allocated.
        self.api.check("cuMemsetD8Async", unsafe {
            (self.api.memset_d8_async)(dst, 0, bytes, self.stream)
        })?;
        self.wait()
    }

    pub fn wait(&self) -> Result<(), CudaError> {
        // SAFETY: our own stream.
        self.api.check("cuStreamSynchronize", unsafe {
            (self.api.stream_synchronize)(self.stream)
        })
    }
}

pub fn as_bytes<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: a plain `#[repr(C)]` value of integers, read as its bytes.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

pub(super) fn u32s_as_bytes(v: &[u32]) -> &[u8] {
    // SAFETY: u32s read as bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), v.len() * 4) }
}

/// Page-locked host memory: copies between it and the device are queued without the host
/// waiting for each, where a copy into pageable memory returns only once done and keeps
/// the driver busy meanwhile (holding up the application's own calls). Made on first use
/// and kept for the process's life, as device memory is.
pub struct Pinned {
    at: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: plain bytes, which each owner touches only where it says (`Replica::take_copy`,
// `RingReader::read`).
unsafe impl Send for Pinned {}
// SAFETY: as above.
unsafe impl Sync for Pinned {}

impl Pinned {
    /// # Safety
    /// No copy or kernel of ours may be writing these bytes, and no other slice of them
    /// be live.
    // The device writes these bytes behind any borrow: exclusive use is the caller's to
    // keep, by the contract above, not the borrow checker's.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn bytes(&self) -> &mut [u8] {
        // SAFETY: `len` bytes of ours; the caller rules out every other use.
        unsafe { std::slice::from_raw_parts_mut(self.at.as_ptr(), self.len) }
    }
}
