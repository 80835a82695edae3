//! Records programs send out through a map: perf event arrays, ring buffers (the
//! CPU's and the GPU's), stack traces.

use super::*;

impl Map {
    /// `bpf_get_stackid`'s second half: files the frames `ips` (skipped frames
    /// already dropped, at most `value_size / 8` of them) and returns the
    /// trace's id, or a negative errno (`-EEXIST` when another trace holds the
    /// id and `BPF_F_REUSE_STACKID` is not set, `-ENOMEM` when the map is full).
    pub fn stack_trace_file(&self, ips: &[u64], flags: u64) -> i64 {
        if self.kind != Kind::StackTrace {
            return -(libc::EINVAL as i64);
        }
        let ips = &ips[..ips.len().min(self.value_size() as usize / 8)];
        stack_trace::file_trace(self, ips, flags)
    }

    /// `bpf_perf_event_output` on a perf_event_array: writes `data` to the ring
    /// of the event at `flags & BPF_F_INDEX_MASK` (or the current CPU's).
    pub fn perf_event_output(&self, flags: u64, data: &[u8]) -> i64 {
        if self.map_type() == map_type::GPU_RINGBUF {
            return self.gpu_ring_output(data);
        }
        let ring = match self.perf_event_ring(flags) {
            Ok(r) => r,
            Err(e) => return e,
        };
        if !ring.output(data) {
            return -(libc::ENOSPC as i64);
        }
        ring.wake();
        0
    }

    /// A record offered to a ring buffer (`flags` 0) or a perf event array (`flags` as
    /// `bpf_perf_event_output`'s) by a producer that keeps what does not fit and offers
    /// it again: GPU records, which reach the host in bursts. Unlike the helpers, a full
    /// ring counts no drop or loss for it.
    pub fn offer_record(&self, flags: u64, data: &[u8]) -> RecordOffer {
        if self.kind != Kind::Ringbuf {
            return match self.perf_event_ring(flags) {
                Ok(ring) => {
                    let offer = ring.try_output(data);
                    if offer == RecordOffer::Taken {
                        ring.wake();
                    }
                    offer
                }
                Err(e) => RecordOffer::Refused(e),
            };
        }
        if flags != 0
            || ringbuf::record_len(data.len() as u64) > u64::from(self.ring_size())
            || !self.fits_gpu_record(data.len())
        {
            return RecordOffer::Refused(-(libc::E2BIG as i64));
        }
        // SAFETY: `data` is a slice of its length.
        if unsafe { ringbuf::output(self, data.as_ptr(), data.len() as u64, 0, false) } {
            RecordOffer::Taken
        } else {
            RecordOffer::Full
        }
    }

    /// Counts `n` records a producer dropped before they reached this map (a GPU's ring,
    /// full): a perf event array's as lost records of the ring `flags` names (as
    /// [`Map::offer_record`]'s), which its consumer reads before that ring's next sample;
    /// a ring buffer's, or where `flags` names no open ring, in the map's drop count.
    pub fn count_lost_records(&self, flags: u64, n: u64) {
        match self.perf_event_ring(flags) {
            Ok(ring) => ring.count_lost(n),
            Err(_) => self.count_dropped(n),
        }
    }

    /// The ring of the perf event `flags` names (`BPF_F_INDEX_MASK`, or the current
    /// CPU's), or the helper's error.
    pub(super) fn perf_event_ring(
        &self,
        flags: u64,
    ) -> Result<std::sync::Arc<crate::PerfRing>, i64> {
        use bpftime_isa::uapi::{F_CURRENT_CPU, F_INDEX_MASK};
        if self.map_type() != map_type::PERF_EVENT_ARRAY || flags & !F_INDEX_MASK != 0 {
            return Err(-(libc::EINVAL as i64));
        }
        let index = if flags & F_INDEX_MASK == F_CURRENT_CPU {
            current_cpu(self.fixed.ncpus) as u32
        } else {
            (flags & F_INDEX_MASK) as u32
        };
        if index >= self.max_entries() {
            return Err(-(libc::E2BIG as i64));
        }
        let Some(event) = self.id_at(index) else {
            return Err(-(libc::ENOENT as i64));
        };
        if let Some(r) = self.perf_rings.get(event) {
            return Ok(r);
        }
        let opened = std::sync::Arc::new(
            crate::PerfRing::open_in(&self.dir, event).map_err(|_| -(libc::ENOENT as i64))?,
        );
        Ok(self.perf_rings.get_or_insert(event, opened))
    }

    /// `bpf_perf_event_output` on a GPU ring buffer (bpftime's way to write one): the
    /// record as it is (no perf header: a consumer gets the bytes and their size), of
    /// at most the map's `value_size` bytes (bpftime's slot; -E2BIG past it); the flags
    /// mean nothing. -ENOSPC, counted as a drop, when the ring is full.
    pub(super) fn gpu_ring_output(&self, data: &[u8]) -> i64 {
        if !self.fits_gpu_record(data.len()) || data.is_empty() {
            return -(libc::E2BIG as i64);
        }
        // SAFETY: `data` is a slice of its length.
        if unsafe { ringbuf::output(self, data.as_ptr(), data.len() as u64, 0, true) } {
            0
        } else {
            -(libc::ENOSPC as i64)
        }
    }

    /// Whether a record of `len` bytes fits this map's records: any, except in a GPU ring
    /// buffer, whose records are at most its `value_size` bytes.
    pub(super) fn fits_gpu_record(&self, len: usize) -> bool {
        self.map_type() != map_type::GPU_RINGBUF || len <= self.value_size() as usize
    }

    /// `bpf_ringbuf_reserve`: a record of `size` bytes, or null when the ring is full.
    pub fn ringbuf_reserve(&self, size: u64, flags: u64) -> *mut u8 {
        if self.kind != Kind::Ringbuf {
            return std::ptr::null_mut();
        }
        ringbuf::reserve(self, size, flags)
    }

    /// `bpf_ringbuf_output`.
    ///
    /// # Safety
    /// `data` must point to `size` readable bytes.
    pub unsafe fn ringbuf_output(&self, data: *const u8, size: u64, flags: u64) -> i64 {
        if self.kind != Kind::Ringbuf {
            return -(libc::EINVAL as i64);
        }
        // SAFETY: `data` is readable for `size` bytes per the caller.
        if unsafe { ringbuf::output(self, data, size, flags, true) } {
            0
        } else {
            -(libc::EAGAIN as i64)
        }
    }

    /// `bpf_ringbuf_query`.
    pub fn ringbuf_query(&self, flags: u64) -> u64 {
        if self.kind != Kind::Ringbuf {
            return 0;
        }
        ringbuf::query(self, flags)
    }

    /// Reads the submitted records of a ring buffer in order, as a consumer.
    pub fn ringbuf_drain(&self, f: impl FnMut(&[u8])) -> usize {
        if self.kind != Kind::Ringbuf {
            return 0;
        }
        ringbuf::drain(self, f)
    }

    /// [`Map::ringbuf_drain`] for a consumer that may have no room: it stops at the
    /// first record `f` declines, which stays first in the ring.
    pub fn ringbuf_drain_while(&self, f: impl FnMut(&[u8]) -> bool) -> usize {
        if self.kind != Kind::Ringbuf {
            return 0;
        }
        ringbuf::drain_while(self, f)
    }
}
