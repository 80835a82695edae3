//! The shim's side of bpftime's ring-buffer poll function,
//! `int bpftime_syscall_server__poll_gpu_ringbuf_map(int map_fd, void *ctx,
//! void (*cb)(const void *data, uint64_t size, void *ctx))`, which bpftime's GPU loaders
//! find with `dlsym(RTLD_DEFAULT, ...)` in the preloaded syscall library (the preload
//! crate exports it).
//!
//! What bpftime does (its `runtime/src/bpf_map/gpu/nv_gpu_ringbuf_map.cpp`
//! `drain_data`, `runtime/src/bpftime_shm.cpp` and `runtime/syscall-server/
//! syscall_server_main.cpp`): a GPU ring buffer (map type 1527) is one ring per GPU
//! thread of `max_entries` slots, each an 8-byte size and then up to `value_size` bytes
//! of the record that `bpf_perf_event_output(ctx, &map, flags, data, size)` wrote (ctx
//! and flags unused); a call looks at every thread's ring once and hands the callback at
//! most one record of each, `cb(data, size, ctx)`, stops early at a ring a writer is in
//! the middle of, never waits, and returns 0 (even for a descriptor that is no GPU ring
//! buffer, which it only logs). Loaders call it in a loop (kernelretsnoop: once a second).
//!
//! Here the GPU's records reach the store's ring (a BPF ring buffer, see
//! `bpftime_runtime::Map::ring_size`) after their launch, in order per SM; a call hands
//! the callback every record the ring holds at that moment, in order, each with its
//! size, consumes them, never waits, and returns 0. It fails with -EBADF for a
//! descriptor that is not ours and -EINVAL for one that is not a ring buffer (any BPF ring
//! buffer is read, not only a GPU one). The callback runs outside the shim's lock, so it
//! may make `bpf()` calls.
//!
//! libbpf reads the ring too: as a ring buffer by default, or, with
//! `BPFTIME_GPU_RING_AS=perf`, through its perf buffer API ([`GpuRingAs`]), whose buffers
//! a thread of ours fills from the ring.

use crate::core::{Object, Shim, SysResult};
use bpftime_isa::uapi::map_type;
use bpftime_runtime::{Map, PerfRing, RecordOffer};
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// How the loader's libbpf is shown a GPU ring buffer (`BPFTIME_GPU_RING_AS`): libbpf's
/// ring buffer API takes a map only when `BPF_OBJ_GET_INFO_BY_FD` calls it
/// `BPF_MAP_TYPE_RINGBUF`, and its perf buffer API only when it says
/// `BPF_MAP_TYPE_PERF_EVENT_ARRAY`, from the same answer; bpftime's poll function reads
/// it either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuRingAs {
    /// The default: a BPF ring buffer of the ring's size.
    Ringbuf,
    /// A perf event array of one entry per possible CPU, whose perf buffers get the
    /// ring's records once `perf_buffer__new` put them in.
    Perf,
}

impl GpuRingAs {
    /// From the environment; an unknown value is said once and taken as the default.
    pub fn from_env() -> GpuRingAs {
        static CHOICE: std::sync::OnceLock<GpuRingAs> = std::sync::OnceLock::new();
        *CHOICE.get_or_init(|| {
            match std::env::var(bpftime_abi::GPU_RING_AS_ENV).as_deref() {
                Err(_) | Ok("") | Ok("ringbuf") => GpuRingAs::Ringbuf,
                Ok("perf") => GpuRingAs::Perf,
                Ok(other) => {
                    eprintln!(
                        "bpftime: {}={other} is neither `ringbuf` nor `perf`; GPU ring buffers are shown as ring buffers",
                        bpftime_abi::GPU_RING_AS_ENV
                    );
                    GpuRingAs::Ringbuf
                }
            }
        })
    }
}

/// The perf buffers a GPU ring buffer's records go to, by the index the loader put each
/// under (a CPU's number), and the thread that moves them there.
pub(crate) struct PerfPump {
    rings: Arc<Mutex<BTreeMap<u32, Arc<PerfRing>>>>,
    stop: Arc<AtomicBool>,
}

impl Drop for PerfPump {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

impl Shim {
    /// The ring buffer behind `fd` for bpftime's poll function: EBADF when `fd` is not
    /// one of our objects, EINVAL when it is no ring buffer.
    pub fn ring_to_poll(&mut self, fd: RawFd) -> SysResult<Arc<Map>> {
        match self.object(fd).map(|o| &o.object) {
            Some(Object::Map(m))
                if matches!(m.map_type(), map_type::GPU_RINGBUF | map_type::RINGBUF) =>
            {
                Ok(m.clone())
            }
            Some(_) => Err(libc::EINVAL),
            None => Err(libc::EBADF),
        }
    }
}

impl Shim {
    /// `BPF_MAP_UPDATE_ELEM` of a GPU ring buffer with a perf event (libbpf's
    /// `perf_buffer__new` on a ring shown as a perf event array): that event's perf buffer
    /// gets the ring's records from now on.
    pub(crate) fn gpu_ring_add_perf_buffer(
        &mut self,
        ring: &Arc<Map>,
        index: u32,
        event: u32,
    ) -> SysResult {
        if index >= bpftime_runtime::possible_cpus() {
            return Err(libc::E2BIG);
        }
        let perf = PerfRing::open(self.store(), event).map_err(|e| e.errno())?;
        let pump = self.gpu_ring_pumps.entry(ring.id()).or_insert_with(|| {
            let pump = PerfPump {
                rings: Arc::default(),
                stop: Arc::default(),
            };
            let (rings, stop, ring) = (pump.rings.clone(), pump.stop.clone(), ring.clone());
            let spawned = std::thread::Builder::new()
                .name("bpftime-gpu-perf".into())
                .spawn(move || move_records(&ring, &rings, &stop));
            if let Err(e) = spawned {
                eprintln!(
                    "bpftime: cannot start the thread that moves GPU records to perf buffers: {e}"
                );
            }
            pump
        });
        pump.rings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(index, Arc::new(perf));
        Ok(0)
    }

    /// `BPF_MAP_DELETE_ELEM` of a GPU ring buffer's perf buffer (libbpf's
    /// `perf_buffer__free`): ENOENT when none is at `index`.
    pub(crate) fn gpu_ring_remove_perf_buffer(&mut self, ring: &Map, index: u32) -> SysResult {
        let Some(pump) = self.gpu_ring_pumps.get(&ring.id()) else {
            return Err(libc::ENOENT);
        };
        let mut rings = pump.rings.lock().unwrap_or_else(|e| e.into_inner());
        rings.remove(&index).ok_or(libc::ENOENT)?;
        let empty = rings.is_empty();
        drop(rings);
        if empty {
            self.gpu_ring_pumps.remove(&ring.id());
        }
        Ok(0)
    }
}

/// Moves the records that reach `ring` into the perf buffer of the lowest index in
/// `rings`, in order, each as a `PERF_RECORD_SAMPLE` of its bytes, waking its reader; what
/// the perf buffer has no room for waits in the ring, and what the ring and the GPU
/// dropped counts as lost in the perf buffer (libbpf's lost callback says so). Waits on the ring's wake-up FIFO, and
/// looks every 100 ms regardless (the GPU's records come in bursts after their launches).
fn move_records(ring: &Map, rings: &Mutex<BTreeMap<u32, Arc<PerfRing>>>, stop: &AtomicBool) {
    let fifo = ring.open_wakeup_fifo().and_then(Result::ok);
    let mut dropped = ring.dropped();
    let mut buf = [0u8; 64];
    while !stop.load(Ordering::Acquire) {
        if let Some(f) = &fifo {
            let mut pfd = libc::pollfd {
                fd: f.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut pfd, 1, 100) } > 0 {
                // SAFETY: reads into a local buffer from a non-blocking FIFO we opened.
                while unsafe { libc::read(pfd.fd, buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
            }
            ring.ringbuf_clear_wakeup();
        } else {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let Some(perf) = rings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .next()
            .cloned()
        else {
            continue;
        };
        let mut moved = 0;
        ring.ringbuf_drain_while(|record| match perf.try_output(record) {
            RecordOffer::Taken => {
                moved += 1;
                true
            }
            // Kept in the ring until the reader made room: the ring, not the perf
            // buffer, drops what does not fit, and counts it (below).
            RecordOffer::Full => false,
            // Never fits (larger than the perf buffer): counted lost there, passed.
            RecordOffer::Refused(_) => true,
        });
        let now = ring.dropped();
        if now > dropped {
            perf.count_lost(now - dropped);
            dropped = now;
        }
        if moved > 0 {
            perf.wake();
        }
    }
}

/// One call of bpftime's poll function on `ring`: hands `deliver` every record the ring
/// holds now, in order, and consumes them. How many it handed over.
pub fn poll_gpu_ring(ring: &Map, deliver: impl FnMut(&[u8])) -> usize {
    ring.ringbuf_drain(deliver)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::TempShim;
    use bpftime_isa::uapi::cmd;

    fn create(t: &mut TempShim, map_type: u32, key: u32, value: u32, max: u32, extra: u64) -> i64 {
        let mut a = [0u8; 128];
        a[0..4].copy_from_slice(&map_type.to_ne_bytes());
        a[4..8].copy_from_slice(&key.to_ne_bytes());
        a[8..12].copy_from_slice(&value.to_ne_bytes());
        a[12..16].copy_from_slice(&max.to_ne_bytes());
        a[64..72].copy_from_slice(&extra.to_ne_bytes());
        t.bpf(cmd::MAP_CREATE, &mut a).expect("map")
    }

    /// `bpf_map_info`'s type, key size, value size and max_entries for `fd`.
    fn info(t: &mut TempShim, fd: i64) -> (u32, u32, u32, u32) {
        let mut info = [0u8; 88];
        let mut a = [0u8; 128];
        a[0..4].copy_from_slice(&(fd as u32).to_ne_bytes());
        a[4..8].copy_from_slice(&88u32.to_ne_bytes());
        a[8..16].copy_from_slice(&(info.as_mut_ptr() as u64).to_ne_bytes());
        t.bpf(cmd::OBJ_GET_INFO_BY_FD, &mut a).expect("info");
        let w = |o: usize| u32::from_ne_bytes(info[o..o + 4].try_into().unwrap());
        (w(0), w(8), w(12), w(16))
    }

    fn elem(t: &mut TempShim, command: u32, fd: i64, key: u32, value: &mut [u8]) -> SysResult {
        let key = key.to_ne_bytes();
        let mut a = [0u8; 128];
        a[0..4].copy_from_slice(&(fd as u32).to_ne_bytes());
        a[8..16].copy_from_slice(&(key.as_ptr() as u64).to_ne_bytes());
        a[16..24].copy_from_slice(&(value.as_mut_ptr() as u64).to_ne_bytes());
        t.bpf(command, &mut a)
    }

    /// A GPU ring buffer made through `bpf()` as bpftime's examples declare it reports
    /// itself as the BPF ring buffer it is kept as (what libbpf's ring buffer API asks
    /// for), and the poll function's side hands over what the GPU sync offered, each
    /// record whole and with its size, in order, once.
    #[test]
    fn a_gpu_ring_buffer_is_a_ring_buffer_to_readers_and_polls_its_records() {
        let mut t = TempShim::new("gpu-ring-poll");
        let fd = create(&mut t, map_type::GPU_RINGBUF, 4, 24, 16, 8);
        assert_eq!(info(&mut t, fd), (map_type::RINGBUF, 0, 0, 4096));
        let ring = t.shim().ring_to_poll(fd as RawFd).unwrap();
        // As the GPU sync lands records, from another handle on the map.
        let producer = Map::open(t.shim().store(), ring.id()).unwrap();
        let sizes = [24usize, 1, 13, 8];
        for (i, &n) in sizes.iter().enumerate() {
            let record: Vec<u8> = (0..n).map(|b| (i * 40 + b) as u8).collect();
            assert_eq!(producer.offer_record(0, &record), RecordOffer::Taken);
        }
        let mut got = Vec::new();
        assert_eq!(poll_gpu_ring(&ring, |r| got.push(r.to_vec())), 4);
        assert_eq!(got.iter().map(Vec::len).collect::<Vec<_>>(), sizes);
        for (i, r) in got.iter().enumerate() {
            assert!(
                r.iter().enumerate().all(|(b, &v)| v == (i * 40 + b) as u8),
                "record {i}"
            );
        }
        assert_eq!(poll_gpu_ring(&ring, |_| panic!("polled twice")), 0);
        // Not a ring: refused; not ours: EBADF.
        let array = create(&mut t, map_type::GPU_ARRAY, 4, 8, 4, 0);
        assert_eq!(
            t.shim().ring_to_poll(array as RawFd).err(),
            Some(libc::EINVAL)
        );
        assert_eq!(t.shim().ring_to_poll(9999).err(), Some(libc::EBADF));
    }

    /// What `BPF_OBJ_GET_INFO_BY_FD` says of bpftime's map types: the type the loader
    /// created (the GPU ring buffer aside, above), with its sizes; the maps' elements go
    /// through `bpf()` as the standard types' do.
    #[test]
    fn gpu_maps_report_the_type_they_were_made_with() {
        let mut t = TempShim::new("gpu-map-info");
        for map_type in [
            map_type::GPU_HASH,
            map_type::GPU_ARRAY,
            map_type::GPU_KERNEL_SHARED_ARRAY,
            map_type::GPU_ARRAY_HOST,
            map_type::GPU_PER_THREAD_ARRAY,
            map_type::GPU_PER_THREAD_ARRAY_HOST,
        ] {
            let fd = create(&mut t, map_type, 4, 8, 4, 2);
            assert_eq!(info(&mut t, fd), (map_type, 4, 8, 4));
        }
    }

    /// bpftime's per-thread contract through `bpf()`: a lookup fills a buffer of one
    /// value per thread the map was made for, thread 0 first; an update takes such a
    /// buffer; a delete is EINVAL.
    #[test]
    fn a_per_thread_lookup_through_bpf_fills_every_threads_value() {
        let mut t = TempShim::new("gpu-per-thread-bpf");
        let fd = create(&mut t, map_type::GPU_PER_THREAD_ARRAY, 4, 8, 2, 7);
        let mut values: Vec<u8> = (0..7u64).flat_map(|v| (v * 3 + 1).to_ne_bytes()).collect();
        assert_eq!(
            elem(&mut t, cmd::MAP_UPDATE_ELEM, fd, 1, &mut values),
            Ok(0)
        );
        let mut out = vec![0u8; 7 * 8 + 8];
        assert_eq!(elem(&mut t, cmd::MAP_LOOKUP_ELEM, fd, 1, &mut out), Ok(0));
        let got: Vec<u64> = out
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        // Seven threads' values, and the caller's byte after them untouched.
        assert_eq!(got, vec![1, 4, 7, 10, 13, 16, 19, 0]);
        assert_eq!(elem(&mut t, cmd::MAP_LOOKUP_ELEM, fd, 0, &mut out), Ok(0));
        assert!(out[..56].iter().all(|&b| b == 0));
        assert_eq!(
            elem(&mut t, cmd::MAP_DELETE_ELEM, fd, 0, &mut out),
            Err(libc::EINVAL)
        );
        assert_eq!(
            elem(&mut t, cmd::MAP_LOOKUP_ELEM, fd, 2, &mut out),
            Err(libc::ENOENT)
        );
    }
}
