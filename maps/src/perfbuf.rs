//! Perf buffers: the ring of a `PERF_COUNT_SW_BPF_OUTPUT` event, which
//! `bpf_perf_event_output` writes into and libbpf's `perf_buffer` reads, in the
//! kernel's layout (a `perf_event_mmap_page`, then the data pages).
//!
//! File `perfring-<event id>`: one control page of ours (lock, pending wake-up,
//! lost count), then exactly what the consumer maps.

use crate::RecordOffer;
use crate::{Error, Result};
use bpftime_store::layout::PAGE_SIZE;
use bpftime_store::mapping::Mapping;
use bpftime_store::store_dir::StoreDir;
use bpftime_store::Store;
use std::os::fd::{AsRawFd, RawFd};
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

/// A perf buffer ring, mapped in this process.
pub struct PerfRing {
    mapping: Mapping,
    fifo: std::fs::File,
    /// Bytes of data pages, from the mapping's length at open: the control block's copy
    /// is shared, and anyone may overwrite it.
    data_size: u64,
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
        let dir = store.handle();
        let name = bpftime_store::perf_ring_name(event_id);
        let path = dir.shown(&name);
        let file = dir
            .open(&name, libc::O_RDWR | libc::O_CREAT)
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
        let fifo = bpftime_store::perf_fifo_name(event_id);
        dir.mkfifo(&fifo)
            .map_err(|e| Error::io("mkfifo", dir.shown(&fifo), e))?;
        Ok(())
    }

    /// Opens an existing ring of `store` (producers).
    pub fn open(store: &Store, event_id: u32) -> Result<PerfRing> {
        Self::open_in(store.handle(), event_id)
    }

    pub(crate) fn open_in(dir: &StoreDir, event_id: u32) -> Result<PerfRing> {
        let name = bpftime_store::perf_ring_name(event_id);
        let path = dir.shown(&name);
        let file = dir
            .open(&name, libc::O_RDWR)
            .map_err(|e| Error::io("open", &path, e))?;
        let mapping = Mapping::map_existing(&file, &path)?;
        let data = mapping.byte_len().saturating_sub(2 * PAGE_SIZE);
        if data == 0 || !data.is_power_of_two() || !data.is_multiple_of(PAGE_SIZE) {
            return Err(Error::invalid(
                libc::EINVAL,
                format!(
                    "{} is {} bytes, not two pages and a power-of-two number of data pages (the store file is damaged)",
                    path.display(),
                    mapping.byte_len()
                ),
            ));
        }
        let fifo = bpftime_store::open_fifo(dir, &bpftime_store::perf_fifo_name(event_id))?;
        Ok(PerfRing {
            mapping,
            fifo,
            data_size: data as u64,
        })
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

    /// Why the ring is damaged, if a fault or a write found it so.
    pub fn damage(&self) -> Option<bpftime_store::Damage> {
        self.mapping.damage()
    }

    /// [`damage`](Self::damage), after checking what the control block and the
    /// metadata page hold (a watcher's slow check).
    pub fn check_damage(&self) -> Option<bpftime_store::Damage> {
        let c = self.control();
        // The tail first: the consumer never moves it past the head, which only grows.
        let tail = self.meta_u64(DATA_TAIL).load(Ordering::Acquire);
        let head = self.meta_u64(DATA_HEAD).load(Ordering::Acquire);
        let lock = c.lock.load(Ordering::Relaxed);
        if c.data_size != self.data_size
            || tail > head
            || head - tail > self.data_size
            || (lock != 0 && !bpftime_store::lock::plausible_tid(lock))
        {
            self.mapping.mark_damaged(bpftime_store::Damage::Garbage);
        }
        self.damage()
    }

    fn put_sample(&self, data: &[u8], count_lost: bool) -> RecordOffer {
        let c = self.control();
        let size = self.data_size;
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
        if self.damage().is_some() {
            return RecordOffer::Refused(-(libc::EFAULT as i64));
        }
        let Some(_g) = bpftime_store::lock::lock_word(&c.lock) else {
            return self.garbage("its lock word names no thread that lets it go");
        };
        let head = self.meta_u64(DATA_HEAD).load(Ordering::Relaxed);
        let tail = self.meta_u64(DATA_TAIL).load(Ordering::Acquire);
        // Positions run modulo 2^64, as the kernel's: what is written and unread is
        // their difference, whichever side of a wrap they are on. More than the ring
        // holds is a damaged consumer position (ahead of the head, or too far behind).
        let used = head.wrapping_sub(tail);
        if used > size {
            return self.garbage("its consumer position is past its producer's");
        }
        let lost = c.lost.load(Ordering::Relaxed);
        let lost_len = if lost > 0 { 24 } else { 0 };
        if used + (rec + lost_len) as u64 > size {
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
                // A head near the top wraps instead of overflowing (a fuzz finding).
                pos = pos.wrapping_add(1);
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

    #[cold]
    fn garbage(&self, what: &str) -> RecordOffer {
        self.mapping.mark_damaged(bpftime_store::Damage::Garbage);
        tracing::debug!("perf ring: {what}");
        RecordOffer::Refused(-(libc::EFAULT as i64))
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

    #[cfg(test)]
    pub(crate) fn set_head_for_test(&self, head: u64) {
        self.meta_u64(DATA_HEAD).store(head, Ordering::Relaxed);
    }

    #[cfg(test)]
    pub(crate) fn set_tail_for_test(&self, tail: u64) {
        self.meta_u64(DATA_TAIL).store(tail, Ordering::Relaxed);
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
        let size = self.data_size;
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
        let bytes = |at: u64, n: usize| {
            (0..n as u64)
                .map(|i| byte(at.wrapping_add(i)))
                .collect::<Vec<u8>>()
        };
        let word = |at: u64| u64::from_ne_bytes(bytes(at, 8).try_into().expect("8 bytes"));
        while tail != head {
            let kind = u32::from_ne_bytes(bytes(tail, 4).try_into().expect("4 bytes"));
            let len =
                u16::from_ne_bytes(bytes(tail.wrapping_add(6), 2).try_into().expect("2 bytes"));
            match kind {
                RECORD_SAMPLE => {
                    let raw = u32::from_ne_bytes(
                        bytes(tail.wrapping_add(8), 4).try_into().expect("4 bytes"),
                    );
                    sample(&bytes(tail.wrapping_add(12), raw as usize));
                }
                RECORD_LOST => lost(word(tail.wrapping_add(16))),
                other => panic!("record type {other} in a perf ring"),
            }
            tail = tail.wrapping_add(u64::from(len));
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
    /// sum overflow. The size is now the mapping's, whatever the control block says.
    #[test]
    fn a_damaged_perf_ring_is_refused_or_takes_nothing() {
        let name = format!("unit-perfbuf-damaged-{}", std::process::id());
        let _ = std::fs::remove_dir_all(Store::dir_for(&name));
        let store = Store::create_or_open(&name).unwrap();
        PerfRing::create(&store, 1, 2 * PAGE_SIZE).unwrap();
        let path = store.perf_ring_path(1);
        let whole = std::fs::read(&path).unwrap();
        for size in [0u64, 3 * PAGE_SIZE as u64, 1 << 40, 100, u64::MAX] {
            let mut bad = whole.clone();
            bad[16..24].copy_from_slice(&size.to_ne_bytes());
            std::fs::write(&path, &bad).unwrap();
            let ring = PerfRing::open(&store, 1).unwrap();
            assert_eq!(
                ring.data_size,
                (whole.len() - 2 * PAGE_SIZE) as u64,
                "size {size}"
            );
            // Writes stay inside the mapping (a write past it would fault here).
            for _ in 0..1000 {
                ring.output(&[0xa5; 100]);
            }
        }
        // A file whose length is not two pages and a power-of-two number of pages is refused.
        let mut short = whole[..2 * PAGE_SIZE].to_vec();
        short.extend_from_slice(&[0; 8]);
        std::fs::write(&path, &short).unwrap();
        let err = PerfRing::open(&store, 1).err().expect("refused");
        assert_eq!(err.errno(), libc::EINVAL);
        assert!(err.to_string().contains("damaged"), "{err}");
        std::fs::write(&path, &whole).unwrap();
        let ring = PerfRing::open(&store, 1).unwrap();
        assert!(ring.output(b"fits"));
        // A consumer's tail ahead of the head: nothing written (full, or refused as
        // damage), not an overflow of the free-space sum.
        ring.meta_u64(DATA_TAIL).store(1 << 20, Ordering::Release);
        let offer = ring.try_output(b"more");
        assert!(
            matches!(offer, RecordOffer::Full | RecordOffer::Refused(_)),
            "{offer:?}"
        );
        // A head at the top of the u64 range (damaged, or a ring that ran 2^64 bytes):
        // the record goes in across the wrap, at the positions modulo the ring's size.
        drop(ring);
        std::fs::write(&path, &whole).unwrap();
        let ring = PerfRing::open(&store, 1).unwrap();
        let top = u64::MAX - 7;
        ring.meta_u64(DATA_HEAD).store(top, Ordering::Release);
        ring.meta_u64(DATA_TAIL).store(top, Ordering::Release);
        assert!(ring.output(b"wraps"));
        let head = ring.meta_u64(DATA_HEAD).load(Ordering::Acquire);
        // An 8-byte header, the 4-byte size, and 5 bytes of data padded to 12.
        assert_eq!(
            head, 16,
            "the head wrapped past 2^64 by the record's 24 bytes"
        );
        drop(ring);
        drop(store);
        let _ = std::fs::remove_dir_all(Store::dir_for(&name));
    }

    /// Producers on three threads and in a forked process write one ring at full speed
    /// while a consumer drains it, from positions 16 KiB below 2^64 (the ring holds 64), so that the run
    /// crosses the wrap: every record arrives once or is counted lost, each producer's
    /// in the order it made them, and the ring is never taken for damaged.
    #[test]
    fn producers_on_threads_and_processes_across_the_wrap_lose_nothing_uncounted() {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        const PER_PRODUCER: u64 = 40_000;
        let name = format!("unit-perfbuf-stress-{}", std::process::id());
        let _ = std::fs::remove_dir_all(Store::dir_for(&name));
        let store = Store::create_or_open(&name).unwrap();
        PerfRing::create(&store, 1, 17 * PAGE_SIZE).unwrap();
        let ring = Arc::new(PerfRing::open(&store, 1).unwrap());
        let start = u64::MAX - (16 << 10);
        ring.set_head_for_test(start);
        ring.set_tail_for_test(start);
        let record = |producer: u64, n: u64| {
            let mut r = [0u8; 24];
            r[..8].copy_from_slice(&producer.to_ne_bytes());
            r[8..16].copy_from_slice(&n.to_ne_bytes());
            r[16..].copy_from_slice(&(producer ^ n).to_ne_bytes());
            r
        };
        // SAFETY: the child only writes the ring (atomics, its lock word, plain
        // stores into the mapping), then leaves with _exit.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let own = PerfRing::open(&store, 1);
            // `output`, as a program's helper call: a full ring counts a loss.
            let ok = own.is_ok_and(|r| {
                for n in 0..PER_PRODUCER {
                    r.output(&record(3, n));
                }
                r.damage().is_none()
            });
            // SAFETY: ends the child without the parent's exit handlers.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        assert!(child > 0, "fork");
        let done = Arc::new(AtomicBool::new(false));
        let consumer = {
            let (ring, done) = (ring.clone(), done.clone());
            std::thread::spawn(move || {
                let mut next = [0u64; 4];
                let (mut delivered, mut lost, mut bad) = (0u64, 0u64, 0u64);
                loop {
                    let finished = done.load(Ordering::Acquire);
                    ring.consume(
                        |r| {
                            let word = |i: usize| {
                                u64::from_ne_bytes(r[i * 8..i * 8 + 8].try_into().unwrap())
                            };
                            let (p, n) = (word(0), word(1));
                            // 24 bytes of ours, padded to 28 as the kernel pads raw samples.
                            if r.len() != 28 || p > 3 || word(2) != p ^ n || n < next[p as usize] {
                                bad += 1;
                            } else {
                                next[p as usize] = n + 1;
                            }
                            delivered += 1;
                        },
                        |n| lost += n,
                    );
                    if finished {
                        return (delivered, lost, bad);
                    }
                    std::thread::yield_now();
                }
            })
        };
        let producers: Vec<_> = (0..3u64)
            .map(|p| {
                let ring = ring.clone();
                std::thread::spawn(move || {
                    for n in 0..PER_PRODUCER {
                        ring.output(&record(p, n));
                    }
                })
            })
            .collect();
        for t in producers {
            t.join().unwrap();
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(child, &mut status, 0) };
        done.store(true, Ordering::Release);
        let (delivered, lost_records, bad) = consumer.join().unwrap();
        // A loss still pending (counted after the last record) is in the control block.
        let pending = ring.lost();
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child {status:#x}"
        );
        assert_eq!(ring.damage(), None, "the ring taken for damaged");
        assert_eq!(bad, 0, "records out of order or torn");
        assert_eq!(delivered + lost_records + pending, 4 * PER_PRODUCER);
        let head = ring.meta_u64(DATA_HEAD).load(Ordering::Acquire);
        assert!(head < start, "the run crossed the wrap (head {head:#x})");
        drop(ring);
        drop(store);
        let _ = std::fs::remove_dir_all(Store::dir_for(&name));
    }
}
