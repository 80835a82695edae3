//! Perf buffers: the ring of a `PERF_COUNT_SW_BPF_OUTPUT` event, which
//! `bpf_perf_event_output` writes into and libbpf's `perf_buffer` reads, in the
//! kernel's layout (a `perf_event_mmap_page`, then the data pages).
//!
//! File `perfring-<event id>`: one control page of ours (lock, pending wake-up,
//! lost count), then exactly what the consumer maps.

use crate::layout::PAGE_SIZE;
use crate::mapping::Mapping;
use crate::maps::RecordOffer;
use crate::store::Store;
use crate::{Error, Result};
use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const DATA_HEAD: usize = 1024;
const DATA_TAIL: usize = 1032;
const DATA_OFFSET: usize = 1040;
const DATA_SIZE: usize = 1048;
const RECORD_LOST: u32 = 2;
const RECORD_SAMPLE: u32 = 9;

#[repr(C)]
struct Control {
    lock: AtomicU32,
    wakeup_pending: AtomicU32,
    lost: AtomicU64,
    data_size: u64,
}

pub fn ring_path(dir: &Path, event_id: u32) -> PathBuf {
    dir.join(format!("perfring-{event_id}"))
}

pub fn fifo_path(dir: &Path, event_id: u32) -> PathBuf {
    dir.join(format!("fifo-perf-{event_id}"))
}

/// A perf buffer ring, mapped in this process.
pub struct PerfRing {
    mapping: Mapping,
    fifo: std::fs::File,
    /// The data pages' size, read and checked against the mapping once at open: the
    /// control block is shared, and a size past the mapping would aim writes past it.
    size: u64,
}

impl PerfRing {
    /// Creates the ring for a consumer that maps `len` bytes (one metadata
    /// page and a power-of-two number of data pages).
    pub fn create(store: &Store, event_id: u32, len: usize) -> Result<()> {
        let data = len.saturating_sub(PAGE_SIZE);
        if data == 0 || !data.is_power_of_two() || !data.is_multiple_of(PAGE_SIZE) {
            return Err(Error::invalid(
                libc::EINVAL,
                "perf buffer size must be 1 + 2^n pages",
            ));
        }
        let dir = store.dir();
        let path = ring_path(dir, event_id);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| Error::io("create", &path, e))?;
        file.set_len((PAGE_SIZE + len) as u64)
            .map_err(|e| Error::io("resize", &path, e))?;
        let m = Mapping::map_file(&file, PAGE_SIZE + len, &path)?;
        // SAFETY: the file is PAGE_SIZE + len bytes; the control block and the
        // metadata page's fields are in range and aligned.
        unsafe {
            let c = &mut *(m.base() as *mut Control);
            c.data_size = data as u64;
            let meta = m.base().add(PAGE_SIZE);
            std::ptr::write_unaligned(meta.add(DATA_OFFSET).cast::<u64>(), PAGE_SIZE as u64);
            std::ptr::write_unaligned(meta.add(DATA_SIZE).cast::<u64>(), data as u64);
        }
        let fifo = fifo_path(dir, event_id);
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes())
            .map_err(|_| Error::invalid(libc::EINVAL, "store path holds a NUL byte"))?;
        // SAFETY: a valid NUL-terminated path.
        if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(Error::io("mkfifo", fifo, e));
            }
        }
        Ok(())
    }

    /// Opens an existing ring (producers).
    pub fn open(dir: &Path, event_id: u32) -> Result<PerfRing> {
        let path = ring_path(dir, event_id);
        let mapping = Mapping::map_existing(&path)?;
        if mapping.len() < 3 * PAGE_SIZE {
            return Err(Error::invalid(
                libc::EINVAL,
                format!("{} is truncated", path.display()),
            ));
        }
        // SAFETY: the control block starts the mapping, which is at least 3 pages.
        let size = unsafe { &*(mapping.base() as *const Control) }.data_size;
        let fits = (2 * PAGE_SIZE as u64)
            .checked_add(size)
            .is_some_and(|end| end <= mapping.len() as u64);
        if size == 0 || !size.is_power_of_two() || size % PAGE_SIZE as u64 != 0 || !fits {
            return Err(Error::invalid(
                libc::EINVAL,
                format!(
                    "{} is damaged: its data size {size} is not a power-of-two number of pages inside its {} bytes; close the perf buffer's event (or remove the file) and open it again",
                    path.display(),
                    mapping.len()
                ),
            ));
        }
        let fifo_p = fifo_path(dir, event_id);
        let fifo = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&fifo_p)
            .map_err(|e| Error::io("open", &fifo_p, e))?;
        Ok(PerfRing {
            mapping,
            fifo,
            size,
        })
    }

    /// Removes a ring's files (when its event is closed).
    pub fn remove(dir: &Path, event_id: u32) {
        let _ = std::fs::remove_file(ring_path(dir, event_id));
        let _ = std::fs::remove_file(fifo_path(dir, event_id));
    }

    fn control(&self) -> &Control {
        // SAFETY: the control block starts the mapping.
        unsafe { &*(self.mapping.base() as *const Control) }
    }

    fn meta_u64(&self, off: usize) -> &AtomicU64 {
        // SAFETY: the metadata page follows the control page; offsets are 8-aligned.
        unsafe { &*(self.mapping.base().add(PAGE_SIZE + off) as *const AtomicU64) }
    }

    /// Writes one `PERF_RECORD_SAMPLE` holding `data` as raw sample bytes.
    /// Returns false (and counts the loss) when the consumer is too far behind.
    pub fn output(&self, data: &[u8]) -> bool {
        self.put_sample(data, true) == RecordOffer::Taken
    }

    /// [`PerfRing::output`] for a producer that keeps a record the ring has no room for
    /// and offers it again later: a full ring counts no loss. A record this ring can never
    /// hold is refused (`E2BIG`), and counted as `output` counts it.
    pub fn try_output(&self, data: &[u8]) -> RecordOffer {
        self.put_sample(data, false)
    }

    fn put_sample(&self, data: &[u8], count_lost: bool) -> RecordOffer {
        let c = self.control();
        let size = self.size;
        let raw = ((data.len() + 4 + 7) & !7) - 4;
        let rec = 8 + 4 + raw;
        if rec > u16::MAX as usize {
            return RecordOffer::Refused(-(libc::E2BIG as i64));
        }
        // Larger than the whole ring: lost, whoever offers it.
        if rec as u64 > size {
            c.lost.fetch_add(1, Ordering::Relaxed);
            return RecordOffer::Refused(-(libc::E2BIG as i64));
        }
        let _g = crate::maps::lock_word(&c.lock);
        let head = self.meta_u64(DATA_HEAD).load(Ordering::Relaxed);
        let tail = self.meta_u64(DATA_TAIL).load(Ordering::Acquire);
        let lost = c.lost.load(Ordering::Relaxed);
        let lost_len = if lost > 0 { 24 } else { 0 };
        // The consumer moves the tail: one that is damaged (ahead of the head, or too
        // far behind) leaves a ring that takes nothing.
        let used = head.wrapping_sub(tail);
        if used > size || used + (rec + lost_len) as u64 > size {
            if count_lost {
                c.lost.fetch_add(1, Ordering::Relaxed);
            }
            return RecordOffer::Full;
        }
        let mut pos = head;
        let mut put = |bytes: &[u8]| {
            for &b in bytes {
                // SAFETY: data pages follow the metadata page; the index is taken modulo their size.
                unsafe {
                    *self
                        .mapping
                        .base()
                        .add(2 * PAGE_SIZE + (pos % size) as usize) = b
                };
                pos += 1;
            }
        };
        if lost > 0 {
            put(&RECORD_LOST.to_ne_bytes());
            put(&0u16.to_ne_bytes());
            put(&24u16.to_ne_bytes());
            put(&0u64.to_ne_bytes());
            put(&lost.to_ne_bytes());
            // Not a store of 0: a loss counted meanwhile without the lock (`count_lost`,
            // or a record too large for the ring) waits for the next record.
            c.lost.fetch_sub(lost, Ordering::Relaxed);
        }
        put(&RECORD_SAMPLE.to_ne_bytes());
        put(&0u16.to_ne_bytes());
        put(&(rec as u16).to_ne_bytes());
        put(&(raw as u32).to_ne_bytes());
        put(data);
        put(&[0u8; 8][..raw - data.len()]);
        self.meta_u64(DATA_HEAD).store(pos, Ordering::Release);
        RecordOffer::Taken
    }

    /// Wakes the consumer unless a wake-up is already pending.
    pub fn wake(&self) {
        if self.control().wakeup_pending.swap(1, Ordering::SeqCst) == 0 {
            // SAFETY: one byte from a local buffer to our non-blocking FIFO.
            unsafe { libc::write(self.fifo.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
        }
    }

    /// Whether records are written that the consumer has not read.
    pub fn has_unread(&self) -> bool {
        self.meta_u64(DATA_HEAD).load(Ordering::Acquire)
            != self.meta_u64(DATA_TAIL).load(Ordering::Acquire)
    }

    /// Clears the pending wake-up (consumers, after draining the FIFO).
    pub fn clear_wakeup(&self) {
        self.control().wakeup_pending.store(0, Ordering::SeqCst);
    }

    pub fn fifo_fd(&self) -> RawFd {
        self.fifo.as_raw_fd()
    }

    /// Counts `n` records lost that never reached this ring (a producer's own buffer was
    /// full): its consumer reads them in the lost record before the next sample, as it
    /// reads this ring's own losses.
    pub fn count_lost(&self, n: u64) {
        self.control().lost.fetch_add(n, Ordering::Relaxed);
    }

    /// Records lost since the last one written.
    pub fn lost(&self) -> u64 {
        self.control().lost.load(Ordering::Relaxed)
    }

    /// A consumer's reading of everything written: the tail moved to the head.
    #[cfg(test)]
    pub(crate) fn consume_all(&self) {
        self.consume(|_| {}, |_| {});
    }

    /// Reads what is written, as a consumer does: each sample's bytes to `sample`, each
    /// lost record's count to `lost`; then moves the tail past them.
    #[cfg(test)]
    pub(crate) fn consume(&self, mut sample: impl FnMut(&[u8]), mut lost: impl FnMut(u64)) {
        let size = self.size;
        let head = self.meta_u64(DATA_HEAD).load(Ordering::Acquire);
        let mut tail = self.meta_u64(DATA_TAIL).load(Ordering::Relaxed);
        let byte = |at: u64| {
            // SAFETY: data pages follow the metadata page; the index is taken modulo their size.
            unsafe {
                *self
                    .mapping
                    .base()
                    .add(2 * PAGE_SIZE + (at % size) as usize)
            }
        };
        let bytes = |at: u64, n: usize| (0..n as u64).map(|i| byte(at + i)).collect::<Vec<u8>>();
        let word = |at: u64| u64::from_ne_bytes(bytes(at, 8).try_into().expect("8 bytes"));
        while tail < head {
            let kind = u32::from_ne_bytes(bytes(tail, 4).try_into().expect("4 bytes"));
            let len = u16::from_ne_bytes(bytes(tail + 6, 2).try_into().expect("2 bytes"));
            match kind {
                RECORD_SAMPLE => {
                    let raw = u32::from_ne_bytes(bytes(tail + 8, 4).try_into().expect("4 bytes"));
                    sample(&bytes(tail + 12, raw as usize));
                }
                RECORD_LOST => lost(word(tail + 16)),
                other => panic!("record type {other} in a perf ring"),
            }
            tail += u64::from(len);
        }
        self.meta_u64(DATA_TAIL).store(tail, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seen reading the writer after a store_files fuzz finding in it (fuzz/README.md):
    /// the data size in a ring's shared control block was trusted, so a damaged one
    /// aimed writes past the mapping; and a tail ahead of the head made the free-space
    /// sum overflow.
    #[test]
    fn a_damaged_perf_ring_is_refused_or_takes_nothing() {
        let name = format!("unit-perfbuf-damaged-{}", std::process::id());
        let _ = std::fs::remove_dir_all(Store::dir_for(&name));
        let store = Store::create_or_open(&name).unwrap();
        PerfRing::create(&store, 1, 2 * PAGE_SIZE).unwrap();
        let path = ring_path(store.dir(), 1);
        let whole = std::fs::read(&path).unwrap();
        for size in [0u64, 3 * PAGE_SIZE as u64, 1 << 40, 100, u64::MAX] {
            let mut bad = whole.clone();
            bad[16..24].copy_from_slice(&size.to_ne_bytes());
            std::fs::write(&path, &bad).unwrap();
            let err = PerfRing::open(store.dir(), 1).err().expect("refused");
            assert_eq!(err.errno(), libc::EINVAL, "size {size}");
            assert!(err.to_string().contains("is damaged"), "{err}");
        }
        std::fs::write(&path, &whole).unwrap();
        let ring = PerfRing::open(store.dir(), 1).unwrap();
        assert!(ring.output(b"fits"));
        // A consumer's tail ahead of the head: full, not an overflow.
        ring.meta_u64(DATA_TAIL).store(1 << 20, Ordering::Release);
        assert_eq!(ring.try_output(b"more"), RecordOffer::Full);
        drop(ring);
        drop(store);
        let _ = std::fs::remove_dir_all(Store::dir_for(&name));
    }
}
