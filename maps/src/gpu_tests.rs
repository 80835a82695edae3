//! bpftime's GPU map types as the store serves them: the shared arrays and hash map
//! behave exactly as the standard ones, the per-thread array keeps a value per GPU
//! thread and hands `bpf()` every thread's value in bpftime's order, and the GPU ring
//! buffer is a ring buffer of records of at most `value_size` bytes.

use super::tests::{errno, spec, TempStore};
use super::*;
use bpftime_isa::uapi::{map_type as mt, update_flags as uf};

fn with_threads(mut s: MapSpec, threads: u64) -> MapSpec {
    s.map_extra = threads;
    s
}

fn u64s(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

/// Every operation `bpf()` and a program make, on `a` and on `b`, with each result:
/// two maps of one shape must answer alike.
fn transcript(m: &Map, keys: &[u32]) -> Vec<String> {
    let mut out = Vec::new();
    let mut value = vec![0u8; m.syscall_value_size()];
    for (i, &k) in keys.iter().enumerate() {
        let key = k.to_ne_bytes();
        let v = (i as u64 * 7 + 1).to_ne_bytes();
        for flags in [uf::NOEXIST, uf::ANY, uf::EXIST, 9] {
            out.push(format!(
                "update {k} {flags}: {:?}",
                m.update(&key, &v, flags).map_err(|e| e.errno())
            ));
        }
        out.push(format!(
            "lookup {k}: {:?} {:?}",
            m.lookup(&key, &mut value).map_err(|e| e.errno()),
            value
        ));
        // SAFETY: a 4-byte key.
        let p = unsafe { m.prog_lookup(key.as_ptr()) };
        // SAFETY: a hit points at the key's 8-byte value.
        out.push(format!(
            "prog lookup {k}: {:?}",
            (!p.is_null()).then(|| unsafe { *(p as *const u64) })
        ));
    }
    let mut key: Option<[u8; 4]> = None;
    loop {
        let mut next = [0u8; 4];
        match m.next_key(key.as_ref().map(|k| &k[..]), &mut next) {
            Ok(()) => out.push(format!("next {}", u32::from_ne_bytes(next))),
            Err(e) => {
                out.push(format!("next: {}", e.errno()));
                break;
            }
        }
        key = Some(next);
    }
    for &k in keys {
        out.push(format!(
            "delete {k}: {:?}",
            m.delete(&k.to_ne_bytes()).map_err(|e| e.errno())
        ));
    }
    out.push(format!(
        "present {:?}",
        m.present_keys().map_err(|e| e.errno())
    ));
    out
}

/// bpftime's GPU arrays (1503, 1504 kernel-shared, 1513 host) and GPU hash map (1501)
/// answer every operation exactly as the standard array and hash map of the same shape
/// do, keep the type they were made with for what is reported, and offer the GPU and JIT
/// their values where an array's are (the fast paths of arrays apply).
#[test]
fn shared_gpu_maps_are_the_standard_array_and_hash() {
    let s = TempStore::new("gpu-shared");
    let keys = [0, 3, 1, 4, 9, 2, 3];
    for (gpu, standard) in [
        (mt::GPU_ARRAY, mt::ARRAY),
        (mt::GPU_KERNEL_SHARED_ARRAY, mt::ARRAY),
        (mt::GPU_ARRAY_HOST, mt::ARRAY),
        (mt::GPU_HASH, mt::HASH),
    ] {
        let a = Map::create(&s, &spec(gpu, 4, 8, 4)).unwrap();
        let b = Map::create(&s, &spec(standard, 4, 8, 4)).unwrap();
        assert_eq!(a.map_type(), gpu);
        assert_eq!(transcript(&a, &keys), transcript(&b, &keys), "type {gpu}");
        assert_eq!(
            a.array_values().is_some(),
            standard == mt::ARRAY,
            "type {gpu}"
        );
        // Another process's handle on it, as a target's agent opens it.
        let again = Map::open(&s, a.id()).unwrap();
        assert_eq!((again.map_type(), again.max_entries()), (gpu, 4));
    }
    // bpftime's examples declare its kernel-shared array mmapable.
    let mut mmapable = spec(mt::GPU_KERNEL_SHARED_ARRAY, 4, 8, 32);
    mmapable.map_flags = map_flags::MMAPABLE;
    let m = Map::create(&s, &mmapable).unwrap();
    assert!(m.mmapable_region().is_some());
}

/// A per-thread array (1502, and 1512) keeps each GPU thread's value of each key, and
/// `bpf()`'s lookup gives them all, thread 0 first, `value_size` bytes apart (bpftime's
/// contract), whatever their alignment in the store; an update writes them all; a CPU
/// program, no GPU thread, finds nothing.
#[test]
fn a_per_thread_array_gives_bpf_every_threads_value_in_thread_order() {
    let s = TempStore::new("gpu-per-thread");
    for map_type in [mt::GPU_PER_THREAD_ARRAY, mt::GPU_PER_THREAD_ARRAY_HOST] {
        // 12-byte values: the store keeps them 16 bytes apart, bpf() 12.
        let m = Map::create(&s, &with_threads(spec(map_type, 4, 12, 2), 5)).unwrap();
        assert_eq!(m.gpu_threads(), Some(5));
        assert_eq!(m.syscall_value_size(), 5 * 12);
        assert!(m.array_values().is_none());
        // What GPU threads wrote (the GPU sync writes here): key 1, thread t holds
        // bytes 100 + t, 101 + t, ...
        let v = m.thread_values().unwrap();
        assert_eq!(v.per_cpu, Some((5, 16)));
        for t in 0..5usize {
            let bytes: Vec<u8> = (0..12).map(|i| (100 + t + i) as u8).collect();
            // SAFETY: key 1's value of thread t, 12 bytes inside the data area.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.as_ptr(),
                    v.base.add(v.key_stride as usize + t * 16),
                    12,
                )
            };
        }
        let mut out = vec![0u8; 60];
        m.lookup(&1u32.to_ne_bytes(), &mut out).unwrap();
        for t in 0..5usize {
            let want: Vec<u8> = (0..12).map(|i| (100 + t + i) as u8).collect();
            assert_eq!(out[t * 12..t * 12 + 12], want[..], "thread {t}");
        }
        m.lookup(&0u32.to_ne_bytes(), &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 0), "key 0 untouched");
        // An update writes every thread's value; another handle reads them.
        let packed: Vec<u8> = (0..60).map(|i| i as u8).collect();
        m.update(&0u32.to_ne_bytes(), &packed, uf::ANY).unwrap();
        let other = Map::open(&s, m.id()).unwrap();
        assert_eq!(other.gpu_threads(), Some(5));
        other.lookup(&0u32.to_ne_bytes(), &mut out).unwrap();
        assert_eq!(out, packed);
        // SAFETY: thread 4's value of key 0, at 4 * 16 in the data area.
        let stored = unsafe { std::slice::from_raw_parts(v.base.add(4 * 16), 12) };
        assert_eq!(stored, &packed[48..60]);
        // The array's rules.
        assert_eq!(errno(m.lookup(&2u32.to_ne_bytes(), &mut out)), libc::ENOENT);
        assert_eq!(
            errno(m.update(&2u32.to_ne_bytes(), &packed, uf::ANY)),
            libc::E2BIG
        );
        assert_eq!(
            errno(m.update(&0u32.to_ne_bytes(), &packed, uf::NOEXIST)),
            libc::EEXIST
        );
        assert_eq!(
            errno(m.update(&0u32.to_ne_bytes(), &packed[..12], uf::ANY)),
            libc::EINVAL
        );
        assert_eq!(errno(m.delete(&0u32.to_ne_bytes())), libc::EINVAL);
        assert_eq!(m.present_keys().unwrap(), Some(vec![0, 1]));
        // SAFETY: a 4-byte key.
        assert!(unsafe { m.prog_lookup(0u32.to_ne_bytes().as_ptr()) }.is_null());
    }
}

/// Without `map_extra`, a per-thread array is made for `BPFTIME_MAP_GPU_THREAD_COUNT`
/// threads, else bpftime's 1024, and says how many in its header, so every process
/// reads it alike.
#[test]
fn a_per_thread_arrays_thread_count_is_bpftimes() {
    use bpftime_isa::uapi::gpu_threads::{DEFAULT, ENV};
    let s = TempStore::new("gpu-threads");
    let m = Map::create(&s, &spec(mt::GPU_PER_THREAD_ARRAY, 4, 8, 1)).unwrap();
    let want = std::env::var(ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT);
    assert_eq!(m.gpu_threads(), Some(want));
    let mut out = vec![0xffu8; want as usize * 8];
    m.lookup(&0u32.to_ne_bytes(), &mut out).unwrap();
    assert_eq!(u64s(&out), vec![0; want as usize]);
    // A thread count that is no count is refused, as a bad map is.
    let bad = with_threads(spec(mt::GPU_PER_THREAD_ARRAY, 4, 8, 1), 1 << 40);
    assert_eq!(errno(Map::create(&s, &bad)), libc::EINVAL);
    let huge = with_threads(spec(mt::GPU_PER_THREAD_ARRAY, 4, 8, 1 << 20), 1 << 20);
    assert_eq!(errno(Map::create(&s, &huge)), libc::E2BIG);
}

/// A GPU ring buffer (1527, as bpftime's examples declare it: a 4-byte key, the record
/// type as value, records per thread as max_entries) is a ring buffer with room for
/// max_entries records of value_size bytes per thread; bpf_perf_event_output writes a
/// record as it is, of at most value_size bytes; a full ring drops and counts what the
/// helper writes, and counts nothing for what the GPU sync offers (it keeps it).
#[test]
fn a_gpu_ring_buffer_takes_records_of_up_to_its_value_size() {
    let s = TempStore::new("gpu-ring");
    let m = Map::create(&s, &with_threads(spec(mt::GPU_RINGBUF, 4, 24, 16), 8)).unwrap();
    // 16 records of 24 bytes (32 in the ring) for 8 threads: 4096 bytes.
    assert_eq!(m.ring_size(), 4096);
    assert_eq!(m.gpu_threads(), Some(8));
    assert_eq!(m.ringbuf_regions().map(|r| r.2), Some(4096));
    assert_eq!(m.perf_event_output(0, &[7u8; 24]), 0);
    assert_eq!(m.perf_event_output(0, &[1u8; 25]), -(libc::E2BIG as i64));
    assert_eq!(
        m.offer_record(0, &[2u8; 25]),
        RecordOffer::Refused(-(libc::E2BIG as i64))
    );
    assert_eq!(m.offer_record(0, &[3u8; 5]), RecordOffer::Taken);
    // The flags mean nothing to a GPU ring buffer.
    assert_eq!(m.perf_event_output(u64::from(u32::MAX), &[4u8; 1]), 0);
    let mut got = Vec::new();
    m.ringbuf_drain(|r| got.push(r.to_vec()));
    assert_eq!(got, vec![vec![7u8; 24], vec![3u8; 5], vec![4u8; 1]]);
    let mut written = 0;
    while m.perf_event_output(0, &[5u8; 24]) == 0 {
        written += 1;
    }
    assert_eq!(written, 4096 / 32);
    assert_eq!(m.dropped(), 1);
    assert_eq!(m.offer_record(0, &[6u8; 8]), RecordOffer::Full);
    assert_eq!(m.dropped(), 1);
    assert_eq!(m.ringbuf_drain(|r| assert_eq!(r, [5u8; 24])), written);
    // Reopened elsewhere, it maps the same ring.
    let other = Map::open(&s, m.id()).unwrap();
    assert_eq!(other.ring_size(), 4096);
    assert_eq!(other.offer_record(0, &[8u8; 3]), RecordOffer::Taken);
    let mut last = Vec::new();
    m.ringbuf_drain(|r| last.push(r.to_vec()));
    assert_eq!(last, vec![vec![8u8; 3]]);
    // bpftime's kernelretsnoop map (16 records of a 1024-byte struct), for 1024 threads.
    let big = Map::create(&s, &with_threads(spec(mt::GPU_RINGBUF, 4, 1024, 16), 1024)).unwrap();
    assert_eq!(big.ring_size(), 32 << 20);
    // A ring buffer's record needs a size.
    assert_eq!(
        errno(Map::create(&s, &spec(mt::GPU_RINGBUF, 4, 0, 16))),
        libc::EINVAL
    );
}
