use super::*;
use bpftime_isa::uapi::{map_type as mt, update_flags as uf};

pub(super) struct TempStore(Option<Store>);

impl TempStore {
    pub(super) fn new(tag: &str) -> Self {
        let name = format!("unit-{tag}-{}", std::process::id());
        let _ = std::fs::remove_dir_all(Store::dir_for(&name));
        TempStore(Some(Store::create_or_open(&name).unwrap()))
    }
}

impl std::ops::Deref for TempStore {
    type Target = Store;
    fn deref(&self) -> &Store {
        self.0.as_ref().unwrap()
    }
}

impl Drop for TempStore {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            let _ = s.destroy();
        }
    }
}

pub(super) fn spec(map_type: u32, key: u32, value: u32, max: u32) -> MapSpec {
    MapSpec {
        map_type,
        key_size: key,
        value_size: value,
        max_entries: max,
        ..Default::default()
    }
}

/// A perf event array of one CPU whose entry is perf event `event`, a ring of one
/// metadata page and one data page (4096 bytes of records), and that ring as its
/// consumer maps it.
fn perf_array_with_ring(s: &TempStore, event: u32) -> (Map, crate::PerfRing) {
    let perf = Map::create(s, &spec(mt::PERF_EVENT_ARRAY, 4, 4, 1)).unwrap();
    crate::PerfRing::create(s, event, 2 * PAGE_SIZE).unwrap();
    perf.set_id(&0u32.to_ne_bytes(), event, uf::ANY).unwrap();
    let ring = crate::PerfRing::open(s, event).unwrap();
    (perf, ring)
}

pub(super) fn errno<T: std::fmt::Debug>(r: Result<T>) -> i32 {
    r.unwrap_err().errno()
}

#[test]
fn hash_follows_kernel_flags_and_capacity() {
    let s = TempStore::new("hash");
    let m = Map::create(&s, &spec(mt::HASH, 4, 8, 2)).unwrap();
    let k = |v: u32| v.to_ne_bytes();
    m.update(&k(1), &10u64.to_ne_bytes(), uf::ANY).unwrap();
    assert_eq!(
        errno(m.update(&k(1), &11u64.to_ne_bytes(), uf::NOEXIST)),
        libc::EEXIST
    );
    assert_eq!(
        errno(m.update(&k(2), &11u64.to_ne_bytes(), uf::EXIST)),
        libc::ENOENT
    );
    m.update(&k(2), &20u64.to_ne_bytes(), uf::NOEXIST).unwrap();
    assert_eq!(
        errno(m.update(&k(3), &30u64.to_ne_bytes(), uf::ANY)),
        libc::E2BIG
    );
    // Replacing an existing key works at capacity.
    m.update(&k(2), &21u64.to_ne_bytes(), uf::EXIST).unwrap();
    let mut v = [0u8; 8];
    m.lookup(&k(2), &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 21);
    assert_eq!(errno(m.update(&k(1), &1u64.to_ne_bytes(), 8)), libc::EINVAL);
    // Iteration visits every key once, then ENOENT.
    let mut seen = vec![];
    let mut key: Option<[u8; 4]> = None;
    loop {
        let mut out = [0u8; 4];
        match m.next_key(key.as_ref().map(|k| &k[..]), &mut out) {
            Ok(()) => {
                seen.push(u32::from_ne_bytes(out));
                key = Some(out);
            }
            Err(e) => {
                assert_eq!(e.errno(), libc::ENOENT);
                break;
            }
        }
    }
    seen.sort();
    assert_eq!(seen, vec![1, 2]);
    m.delete(&k(1)).unwrap();
    assert_eq!(errno(m.delete(&k(1))), libc::ENOENT);
    assert_eq!(errno(m.lookup(&k(1), &mut v)), libc::ENOENT);
    let mut out = [0u8; 8];
    m.lookup_and_delete(&k(2), &mut out).unwrap();
    assert_eq!(u64::from_ne_bytes(out), 21);
    assert_eq!(errno(m.next_key(None, &mut [0u8; 4])), libc::ENOENT);
}

#[test]
fn many_threads_and_two_handles_count_exactly() {
    let s = TempStore::new("threads");
    let m = Map::create(&s, &spec(mt::HASH, 8, 8, 64)).unwrap();
    let other = Map::open(&s, m.id()).unwrap();
    std::thread::scope(|sc| {
        for t in 0..4u64 {
            let m = if t % 2 == 0 { &m } else { &other };
            sc.spawn(move || {
                for i in 0..2000u64 {
                    let key = (i % 16).to_ne_bytes();
                    // SAFETY: key and value are 8-byte locals.
                    unsafe {
                        let p = m.prog_lookup(key.as_ptr());
                        if p.is_null() {
                            let one = 1u64.to_ne_bytes();
                            if m.prog_update(key.as_ptr(), one.as_ptr(), uf::NOEXIST) == 0 {
                                continue;
                            }
                            let p = m.prog_lookup(key.as_ptr());
                            (*(p as *const std::sync::atomic::AtomicU64))
                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        } else {
                            (*(p as *const std::sync::atomic::AtomicU64))
                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                    let _ = t;
                }
            });
        }
    });
    let mut total = 0;
    for k in 0..16u64 {
        let mut v = [0u8; 8];
        m.lookup(&k.to_ne_bytes(), &mut v).unwrap();
        total += u64::from_ne_bytes(v);
    }
    assert_eq!(total, 8000);
}

#[test]
fn array_and_percpu_array() {
    let s = TempStore::new("array");
    let m = Map::create(&s, &spec(mt::ARRAY, 4, 4, 3)).unwrap();
    let mut v = [0u8; 4];
    m.lookup(&1u32.to_ne_bytes(), &mut v).unwrap();
    assert_eq!(v, [0; 4]);
    assert_eq!(
        errno(m.update(&3u32.to_ne_bytes(), &v, uf::ANY)),
        libc::E2BIG
    );
    assert_eq!(
        errno(m.update(&0u32.to_ne_bytes(), &v, uf::NOEXIST)),
        libc::EEXIST
    );
    // The kernel checks the index before BPF_NOEXIST, and unknown flags before both.
    assert_eq!(
        errno(m.update(&3u32.to_ne_bytes(), &v, uf::NOEXIST)),
        libc::E2BIG
    );
    assert_eq!(errno(m.update(&3u32.to_ne_bytes(), &v, 3)), libc::EINVAL);
    assert_eq!(errno(m.delete(&0u32.to_ne_bytes())), libc::EINVAL);
    let mut out = [0u8; 4];
    m.next_key(Some(&1u32.to_ne_bytes()), &mut out).unwrap();
    assert_eq!(u32::from_ne_bytes(out), 2);
    assert_eq!(
        errno(m.next_key(Some(&2u32.to_ne_bytes()), &mut out)),
        libc::ENOENT
    );
    m.next_key(Some(&7u32.to_ne_bytes()), &mut out).unwrap();
    assert_eq!(u32::from_ne_bytes(out), 0);

    let p = Map::create(&s, &spec(mt::PERCPU_ARRAY, 4, 4, 2)).unwrap();
    let n = possible_cpus() as usize;
    assert_eq!(p.syscall_value_size(), 8 * n);
    let mut vals = vec![0u8; 8 * n];
    for c in 0..n {
        vals[c * 8] = c as u8 + 1;
    }
    p.update(&1u32.to_ne_bytes(), &vals, uf::ANY).unwrap();
    let mut back = vec![0u8; 8 * n];
    p.lookup(&1u32.to_ne_bytes(), &mut back).unwrap();
    assert_eq!(back, vals);
    // A program sees its own CPU's slot.
    // SAFETY: a 4-byte key.
    let ptr = unsafe { p.prog_lookup(1u32.to_ne_bytes().as_ptr()) };
    let cpu = current_cpu(n as u32);
    // SAFETY: ptr points at a 4-byte value.
    assert_eq!(unsafe { *ptr }, cpu as u8 + 1);
}

#[test]
fn lru_evicts_instead_of_failing() {
    let s = TempStore::new("lru");
    let m = Map::create(&s, &spec(mt::LRU_HASH, 4, 4, 4)).unwrap();
    for i in 0..100u32 {
        m.update(&i.to_ne_bytes(), &i.to_ne_bytes(), uf::ANY)
            .unwrap();
    }
    let mut n = 0;
    let mut key: Option<[u8; 4]> = None;
    let mut out = [0u8; 4];
    while m.next_key(key.as_ref().map(|k| &k[..]), &mut out).is_ok() {
        n += 1;
        key = Some(out);
    }
    assert_eq!(n, 4);
    let mut v = [0u8; 4];
    m.lookup(&99u32.to_ne_bytes(), &mut v).unwrap();
}

/// Updating a key of a full LRU map takes a fresh element, evicting another key if it
/// must, never the key being updated (which the kernel keeps too).
#[test]
fn updating_a_key_of_a_full_lru_map_keeps_it_whatever_was_used_least() {
    let s = TempStore::new("lru-update");
    let m = Map::create(&s, &spec(mt::LRU_HASH, 4, 4, 4)).unwrap();
    for i in 0..4u32 {
        m.update(&i.to_ne_bytes(), &i.to_ne_bytes(), uf::ANY)
            .unwrap();
    }
    // Key 0 is the least recently used, so it is what an eviction would pick.
    for round in 0..20u32 {
        m.update(&0u32.to_ne_bytes(), &(100 + round).to_ne_bytes(), uf::ANY)
            .unwrap();
        let mut v = [0u8; 4];
        m.lookup(&0u32.to_ne_bytes(), &mut v)
            .unwrap_or_else(|e| panic!("round {round}: key 0 lost ({e})"));
        assert_eq!(u32::from_ne_bytes(v), 100 + round);
    }
}

#[test]
fn queue_and_stack_orders() {
    let s = TempStore::new("queue");
    let q = Map::create(&s, &spec(mt::QUEUE, 0, 4, 2)).unwrap();
    let st = Map::create(&s, &spec(mt::STACK, 0, 4, 2)).unwrap();
    for m in [&q, &st] {
        m.update(&[], &1u32.to_ne_bytes(), uf::ANY).unwrap();
        m.update(&[], &2u32.to_ne_bytes(), uf::ANY).unwrap();
        assert_eq!(
            errno(m.update(&[], &3u32.to_ne_bytes(), uf::ANY)),
            libc::E2BIG
        );
        m.update(&[], &3u32.to_ne_bytes(), uf::EXIST).unwrap();
    }
    let mut v = [0u8; 4];
    let mut popped = |m: &Map| {
        m.lookup_and_delete(&[], &mut v).unwrap();
        u32::from_ne_bytes(v)
    };
    assert_eq!((popped(&q), popped(&q)), (2, 3));
    assert_eq!((popped(&st), popped(&st)), (3, 2));
    assert_eq!(errno(q.lookup_and_delete(&[], &mut v)), libc::ENOENT);
}

#[test]
fn ringbuf_records_wrap_and_drops_are_counted() {
    let s = TempStore::new("ring");
    assert_eq!(
        errno(Map::create(&s, &spec(mt::RINGBUF, 0, 0, 5000))),
        libc::EINVAL
    );
    let m = Map::create(&s, &spec(mt::RINGBUF, 0, 0, 4096)).unwrap();
    let mut produced = 0u32;
    let mut consumed = vec![];
    for round in 0..50u32 {
        // 100-byte records: 13 fit (108 bytes each with the header) before the ring fills.
        loop {
            let rec = m.ringbuf_reserve(100, 0);
            if rec.is_null() {
                break;
            }
            // SAFETY: the record holds 100 bytes.
            unsafe {
                std::ptr::write_bytes(rec, (produced % 251) as u8, 100);
                ringbuf_commit(rec, 0, produced % 7 == 3);
            }
            produced += 1;
        }
        m.ringbuf_drain(|r| consumed.push((r.len(), r[0], r[99])));
        let _ = round;
    }
    assert!(m.dropped() >= 50);
    let expected: Vec<_> = (0..produced)
        .filter(|p| p % 7 != 3)
        .map(|p| (100, (p % 251) as u8, (p % 251) as u8))
        .collect();
    assert_eq!(consumed, expected);
}

/// A consumer with no room declines a record: the drain stops there, and the record is
/// the first the next drain reads; records before it are consumed once.
#[test]
fn a_declined_record_stays_first_in_the_ring() {
    let s = TempStore::new("drain-while");
    let m = Map::create(&s, &spec(mt::RINGBUF, 0, 0, 4096)).unwrap();
    for i in 0..10u8 {
        assert_eq!(m.offer_record(0, &[i; 20]), RecordOffer::Taken);
    }
    let mut got = Vec::new();
    let n = m.ringbuf_drain_while(|r| {
        if r[0] == 4 {
            return false;
        }
        got.push(r[0]);
        true
    });
    assert_eq!((n, got.clone()), (4, vec![0, 1, 2, 3]));
    got.clear();
    assert_eq!(
        m.ringbuf_drain_while(|r| {
            got.push(r[0]);
            true
        }),
        6
    );
    assert_eq!(got, (4..10).collect::<Vec<u8>>());
    assert_eq!(m.ringbuf_drain(|_| panic!("drained twice")), 0);
}

/// GPU records reach the store in bursts and are kept and offered again while a ring is
/// full (gpu-attach's backlog): an offer a full ring refuses counts no drop, where the
/// helper's refusal does, and is taken once the consumer made room.
#[test]
fn an_offered_ringbuf_record_counts_no_drop_and_goes_in_once_there_is_room() {
    let s = TempStore::new("offer-ringbuf");
    let m = Map::create(&s, &spec(mt::RINGBUF, 0, 0, 4096)).unwrap();
    let mut offered = 0u8;
    while m.offer_record(0, &[offered; 100]) == RecordOffer::Taken {
        offered += 1;
    }
    // 112 bytes each with the header: 36 fit.
    assert_eq!(offered, 36);
    assert_eq!(m.offer_record(0, &[offered; 100]), RecordOffer::Full);
    assert_eq!(m.dropped(), 0);
    // SAFETY: 100 readable bytes.
    assert_eq!(
        unsafe { m.ringbuf_output([0u8; 100].as_ptr(), 100, 0) },
        -(libc::EAGAIN as i64)
    );
    assert_eq!(m.dropped(), 1);
    let mut firsts = Vec::new();
    m.ringbuf_drain(|r| firsts.push(r[0]));
    assert_eq!(firsts, (0..36).collect::<Vec<u8>>());
    assert_eq!(m.offer_record(0, &[36; 100]), RecordOffer::Taken);
    // Never: larger than the ring, or with flags.
    assert_eq!(
        m.offer_record(0, &[0; 4096]),
        RecordOffer::Refused(-(libc::E2BIG as i64))
    );
    assert!(matches!(
        m.offer_record(1, &[0; 8]),
        RecordOffer::Refused(_)
    ));
    assert_eq!(m.dropped(), 1);
}

#[test]
fn an_offered_perf_sample_counts_no_loss_and_goes_in_once_there_is_room() {
    let s = TempStore::new("offer-perf");
    let (m, ring) = perf_array_with_ring(&s, 42);
    let mut taken = 0;
    while m.offer_record(0, &[7; 100]) == RecordOffer::Taken {
        taken += 1;
    }
    // 112 bytes each (header, size word, data padded to 8): 36 fit in 4096.
    assert_eq!(taken, 36);
    assert_eq!(m.offer_record(0, &[7; 100]), RecordOffer::Full);
    assert_eq!(ring.lost(), 0);
    assert_eq!(m.perf_event_output(0, &[7; 100]), -(libc::ENOSPC as i64));
    assert_eq!(ring.lost(), 1);
    ring.consume_all();
    // The lost record goes first, then the sample.
    assert_eq!(m.offer_record(0, &[7; 100]), RecordOffer::Taken);
    assert_eq!(ring.lost(), 0);
    assert_eq!(
        m.offer_record(0, &[7; 8192]),
        RecordOffer::Refused(-(libc::E2BIG as i64))
    );
    assert_eq!(
        m.offer_record(3, &[7; 8]),
        RecordOffer::Refused(-(libc::E2BIG as i64))
    );
}

/// Records a producer dropped before they reached the map (a GPU's full ring): a perf
/// consumer reads their count in a lost record before the ring's next sample, as it
/// reads the ring's own losses; a ring buffer counts them as dropped; a perf event
/// array with no ring at the CPU they name counts them as dropped too, not nowhere.
#[test]
fn records_lost_before_the_map_reach_the_consumer_as_lost_or_dropped() {
    let s = TempStore::new("lost-before");
    let (perf, ring) = perf_array_with_ring(&s, 43);
    perf.count_lost_records(0, 5);
    assert_eq!(perf.offer_record(0, &[1; 8]), RecordOffer::Taken);
    perf.count_lost_records(0, 2);
    assert_eq!(perf.perf_event_output(0, &[2; 8]), 0);
    let seen = std::cell::RefCell::new(Vec::new());
    ring.consume(
        |d| seen.borrow_mut().push(format!("sample {}", d[0])),
        |n| seen.borrow_mut().push(format!("lost {n}")),
    );
    assert_eq!(
        seen.into_inner(),
        ["lost 5", "sample 1", "lost 2", "sample 2"]
    );
    assert_eq!(perf.dropped(), 0);
    perf.count_lost_records(1, 3);
    assert_eq!(perf.dropped(), 3);

    let rb = Map::create(&s, &spec(mt::RINGBUF, 0, 0, 4096)).unwrap();
    rb.count_lost_records(0, 4);
    assert_eq!(rb.dropped(), 4);
}

#[test]
fn rejects_bad_specs_like_the_kernel() {
    let s = TempStore::new("specs");
    assert_eq!(errno(Map::create(&s, &spec(9999, 4, 4, 1))), libc::EINVAL);
    assert_eq!(
        errno(Map::create(&s, &spec(mt::ARRAY, 8, 4, 1))),
        libc::EINVAL
    );
    assert_eq!(
        errno(Map::create(&s, &spec(mt::HASH, 4, 4, 0))),
        libc::EINVAL
    );
    assert_eq!(
        errno(Map::create(&s, &spec(mt::QUEUE, 4, 4, 1))),
        libc::EINVAL
    );
}

#[test]
fn stack_trace_ids_collide_reuse_and_fill_like_the_kernel() {
    use super::stack_trace::{FAST_STACK_CMP, REUSE_STACKID};
    let s = TempStore::new("stacktrace");
    // One bucket: every trace gets id 0.
    let m = Map::create(&s, &spec(mt::STACK_TRACE, 4, 32, 1)).unwrap();
    let a = [0x10u64, 0x20, 0x30];
    let b = [0x11u64, 0x21];
    assert_eq!(m.stack_trace_file(&a, 0), 0);
    assert_eq!(m.stack_trace_file(&a, 0), 0, "the same trace keeps its id");
    assert_eq!(m.stack_trace_file(&b, 0), -(libc::EEXIST as i64));
    // The map is full (max_entries 1): even a replacement finds no free element.
    assert_eq!(
        m.stack_trace_file(&b, REUSE_STACKID),
        -(libc::ENOMEM as i64)
    );
    let mut v = [0xffu8; 32];
    m.lookup(&0u32.to_ne_bytes(), &mut v).unwrap();
    let words: Vec<u64> = v
        .chunks(8)
        .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(words, vec![0x10, 0x20, 0x30, 0], "zero past the trace");
    assert_eq!(
        errno(m.update(&0u32.to_ne_bytes(), &v, uf::ANY)),
        libc::EINVAL
    );
    assert_eq!(errno(m.lookup(&1u32.to_ne_bytes(), &mut v)), libc::ENOENT);
    assert_eq!(errno(m.delete(&1u32.to_ne_bytes())), libc::E2BIG);
    let mut next = [0u8; 4];
    m.next_key(None, &mut next).unwrap();
    assert_eq!(u32::from_ne_bytes(next), 0);
    assert_eq!(
        errno(m.next_key(Some(&0u32.to_ne_bytes()), &mut next)),
        libc::ENOENT
    );
    // Read and freed at once; the freed element takes a new trace.
    let mut taken = [0u8; 32];
    m.lookup_and_delete(&0u32.to_ne_bytes(), &mut taken)
        .unwrap();
    assert_eq!(taken, v);
    assert_eq!(
        errno(m.lookup_and_delete(&0u32.to_ne_bytes(), &mut taken)),
        libc::ENOENT
    );
    assert_eq!(m.stack_trace_file(&b, 0), 0);
    m.delete(&0u32.to_ne_bytes()).unwrap();
    assert_eq!(errno(m.delete(&0u32.to_ne_bytes())), libc::ENOENT);
    assert_eq!(errno(m.next_key(None, &mut next)), libc::ENOENT);

    // Two elements in two buckets: a replacement takes the free one.
    let m = Map::create(&s, &spec(mt::STACK_TRACE, 4, 16, 2)).unwrap();
    let id_a = m.stack_trace_file(&a, 0);
    assert!((0..2).contains(&id_a));
    // Deeper traces are cut to value_size / 8 frames.
    let mut v = [0u8; 16];
    m.lookup(&(id_a as u32).to_ne_bytes(), &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v[8..].try_into().unwrap()), 0x20);
    // Find a trace that lands in the same bucket as `a`.
    let other = (1u64..)
        .map(|i| [i, i])
        .find(|t| {
            let w: Vec<u32> = t.iter().flat_map(|x| [*x as u32, 0]).collect();
            (super::stack_trace::jhash2(&w, 0) & 1) as i64 == id_a
        })
        .unwrap();
    assert_eq!(m.stack_trace_file(&other, 0), -(libc::EEXIST as i64));
    assert_eq!(m.stack_trace_file(&other, REUSE_STACKID), id_a);
    m.lookup(&(id_a as u32).to_ne_bytes(), &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v[..8].try_into().unwrap()), other[0]);
    // With FAST_STACK_CMP, an equal hash is enough.
    assert_eq!(m.stack_trace_file(&other, FAST_STACK_CMP), id_a);

    for (k, v, max, flags) in [
        (4, 12, 4, 0),
        (8, 16, 4, 0),
        (4, 8 * 128, 4, 0),
        (4, 16, 0, 0),
        (4, 16, 4, 1),
    ] {
        let mut sp = spec(mt::STACK_TRACE, k, v, max);
        sp.map_flags = flags;
        assert_eq!(
            errno(Map::create(&s, &sp)),
            libc::EINVAL,
            "{k} {v} {max} {flags}"
        );
    }
}

/// GPU attach's pulls add into per-CPU hash values while programs and other processes
/// change the same map: additions from threads and forked processes, racing to make the
/// same keys, beside a thread inserting and deleting other keys, all count.
#[test]
fn percpu_hash_additions_race_from_threads_and_processes_and_all_count() {
    const KEYS: u32 = 8;
    const ADDS: u32 = 20_000;
    const THREADS: u32 = 3;
    const CHILDREN: u32 = 2;
    let s = TempStore::new("pcpurace");
    let m = Map::create(&s, &spec(mt::PERCPU_HASH, 4, 8, 128)).unwrap();
    let n = possible_cpus() as usize;
    let adder = |who: u32| {
        for i in 0..ADDS {
            let key = ((i + who) % KEYS).to_ne_bytes();
            m.with_percpu_values(&key, true, |v| v.add(who as usize % n, 0, true, 1))
                .unwrap();
        }
    };
    // The map is in the store's shared memory: a child forked now adds into the same one.
    let mut children = Vec::new();
    for c in 0..CHILDREN {
        // SAFETY: the child only adds into the shared map and leaves with _exit, running
        // no destructor and no code the fork may have left inconsistent (no other thread
        // of this test runs yet).
        match unsafe { libc::fork() } {
            0 => {
                adder(THREADS + c);
                // SAFETY: ends the child at once.
                unsafe { libc::_exit(0) }
            }
            pid if pid > 0 => children.push(pid),
            _ => panic!("fork: {}", std::io::Error::last_os_error()),
        }
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    // The threads' adds start once the churn has, so the two overlap however the
    // scheduler orders the threads (on 2 busy cores the adds could otherwise all end
    // before the churn's first round).
    let churning = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let churn = scope.spawn(|| {
            let zero = vec![0u8; m.syscall_value_size()];
            let mut rounds = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for k in 100u32..164 {
                    m.update(&k.to_ne_bytes(), &zero, uf::ANY).unwrap();
                    churning.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                for k in 100u32..164 {
                    m.delete(&k.to_ne_bytes()).unwrap();
                }
                rounds += 1;
            }
            rounds
        });
        let churning = &churning;
        let adders: Vec<_> = (0..THREADS)
            .map(|t| {
                scope.spawn(move || {
                    while !churning.load(std::sync::atomic::Ordering::Relaxed) {
                        std::thread::yield_now();
                    }
                    adder(t)
                })
            })
            .collect();
        for a in adders {
            a.join().unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(churn.join().unwrap() > 0);
    });
    for pid in children {
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }
    let per_key = (THREADS + CHILDREN) * ADDS / KEYS;
    let mut all = vec![0u8; m.syscall_value_size()];
    for key in 0..KEYS {
        m.lookup(&key.to_ne_bytes(), &mut all).unwrap();
        let sum: u64 = (0..n)
            .map(|c| u64::from_ne_bytes(all[c * 8..c * 8 + 8].try_into().unwrap()))
            .sum();
        assert_eq!(sum, per_key as u64, "key {key}");
    }
}

#[test]
fn percpu_hash_values_take_additions_per_cpu_and_keys_are_made_zeroed() {
    let s = TempStore::new("pcpuadd");
    let m = Map::create(&s, &spec(mt::PERCPU_HASH, 4, 12, 2)).unwrap();
    let n = possible_cpus() as usize;
    let k = |v: u32| v.to_ne_bytes();
    // Missing and not to be made: ENOENT, nothing inserted, no update counted.
    let before = m.updates();
    assert_eq!(
        errno(m.with_percpu_values(&k(1), false, |_| ())),
        libc::ENOENT
    );
    assert_eq!(m.updates(), before);
    // Made with every CPU's value zeroed, then added to on the last CPU: one update.
    let ((), made) = m
        .with_percpu_values(&k(1), true, |v| {
            assert_eq!(v.cpus(), n);
            assert!((0..n).all(|c| v.get(c) == vec![0; 12]));
            v.add(n - 1, 0, true, 5);
            v.add(n - 1, 0, true, u64::MAX); // wraps: 4
            v.add(n - 1, 8, false, 7);
            v.write(0, 10, &[0xaa]);
        })
        .unwrap();
    assert!(made);
    assert_eq!(m.updates(), before + 1);
    let mut all = vec![0u8; m.syscall_value_size()];
    m.lookup(&k(1), &mut all).unwrap();
    let last = &all[(n - 1) * 16..(n - 1) * 16 + 12];
    assert_eq!(&last[..8], &4u64.to_ne_bytes());
    assert_eq!(&last[8..12], &7u32.to_ne_bytes());
    assert_eq!(all[10], 0xaa);
    // Found again: not made, not counted; the values are the ones written.
    let (first, made) = m.with_percpu_values(&k(1), true, |v| v.get(0)).unwrap();
    assert!(!made);
    assert_eq!(first[10], 0xaa);
    assert_eq!(m.updates(), before + 1);
    // A full map says so; other map types are refused.
    m.update(&k(2), &vec![0u8; m.syscall_value_size()], uf::ANY)
        .unwrap();
    assert_eq!(
        errno(m.with_percpu_values(&k(3), true, |_| ())),
        libc::E2BIG
    );
    let h = Map::create(&s, &spec(mt::HASH, 4, 8, 2)).unwrap();
    assert_eq!(
        errno(h.with_percpu_values(&k(1), true, |_| ())),
        libc::EINVAL
    );
}

#[test]
fn a_process_dying_mid_update_with_the_lock_held_wedges_no_one() {
    let s = TempStore::new("deadholder");
    let m = Map::create(&s, &spec(mt::HASH, 8, 8, 4)).unwrap();
    m.update(&1u64.to_ne_bytes(), &10u64.to_ne_bytes(), uf::ANY)
        .unwrap();
    // SAFETY: the child takes the lock, leaves the free list as a writer cut off
    // mid-insert would, and `_exit`s holding the lock; no other thread runs yet.
    match unsafe { libc::fork() } {
        0 => {
            std::mem::forget(lock::lock(&m.header().lock, || false, || {}));
            m.header()
                .free_head
                .store(0, std::sync::atomic::Ordering::Relaxed);
            // SAFETY: ends the child at once, the lock still held.
            unsafe { libc::_exit(0) }
        }
        -1 => panic!("fork: {}", std::io::Error::last_os_error()),
        pid => {
            let mut status = 0;
            // SAFETY: waits for our own child.
            assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        }
    }
    // The next writer takes the dead process's lock over and rebuilds the free list:
    // the map still holds its key and takes as many as max_entries allows.
    for k in 2..=4u64 {
        m.update(&k.to_ne_bytes(), &(k * 10).to_ne_bytes(), uf::NOEXIST)
            .unwrap();
    }
    assert_eq!(
        errno(m.update(&5u64.to_ne_bytes(), &50u64.to_ne_bytes(), uf::ANY)),
        libc::E2BIG
    );
    let mut v = [0u8; 8];
    m.lookup(&1u64.to_ne_bytes(), &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 10);
    m.delete(&1u64.to_ne_bytes()).unwrap();
}

/// Arrays of ids take what the kernel's arrays of file descriptors take: `BPF_ANY` only
/// (anything else is EINVAL, before the index is looked at), then a key in range.
#[test]
fn arrays_of_ids_take_bpf_any_only() {
    let s = TempStore::new("id-array");
    let m = Map::create(&s, &spec(mt::PROG_ARRAY, 4, 4, 3)).unwrap();
    for flags in [uf::NOEXIST, uf::EXIST, uf::LOCK] {
        assert_eq!(errno(m.set_id(&0u32.to_ne_bytes(), 7, flags)), libc::EINVAL);
        assert_eq!(errno(m.set_id(&5u32.to_ne_bytes(), 7, flags)), libc::EINVAL);
    }
    assert_eq!(
        errno(m.set_id(&3u32.to_ne_bytes(), 7, uf::ANY)),
        libc::E2BIG
    );
    m.set_id(&2u32.to_ne_bytes(), 7, uf::ANY).unwrap();
}

/// Losses counted from outside a perf buffer (a GPU ring's drops, `count_lost_records`)
/// while helpers write into it from other threads and a consumer reads it as fast as it
/// can: every loss and every record is told to the consumer once, none twice, none
/// wiped by a lost record written meanwhile.
#[test]
fn losses_counted_beside_writers_all_reach_the_consumer_once() {
    const WRITERS: u64 = 3;
    const RECORDS: u64 = 50_000;
    const COUNTERS: u64 = 2;
    const COUNTS: u64 = 50_000;
    let s = TempStore::new("lost-stress");
    let (perf, ring) = perf_array_with_ring(&s, 44);
    let done = std::sync::atomic::AtomicBool::new(false);
    let (mut samples, mut told) = (0u64, 0u64);
    let (written, counted) = std::thread::scope(|scope| {
        let writers: Vec<_> = (0..WRITERS)
            .map(|_| {
                let perf = &perf;
                scope.spawn(move || {
                    (0..RECORDS)
                        .filter(|i| perf.perf_event_output(0, &i.to_ne_bytes()) == 0)
                        .count() as u64
                })
            })
            .collect();
        let counters: Vec<_> = (0..COUNTERS)
            .map(|c| {
                let perf = &perf;
                scope.spawn(move || {
                    let mut n = 0;
                    for i in 0..COUNTS {
                        let k = 1 + (i + c) % 3;
                        perf.count_lost_records(0, k);
                        n += k;
                    }
                    n
                })
            })
            .collect();
        let reader = scope.spawn(|| {
            let (mut samples, mut told) = (0u64, 0u64);
            loop {
                let finished = done.load(std::sync::atomic::Ordering::Acquire);
                ring.consume(|_| samples += 1, |n| told += n);
                if finished {
                    return (samples, told);
                }
            }
        });
        let written: u64 = writers.into_iter().map(|w| w.join().unwrap()).sum();
        let counted: u64 = counters.into_iter().map(|c| c.join().unwrap()).sum();
        done.store(true, std::sync::atomic::Ordering::Release);
        (samples, told) = reader.join().unwrap();
        (written, counted)
    });
    // What is still counted goes out before the next record: one more, into an empty
    // ring, then every loss has been told.
    ring.consume(|_| samples += 1, |n| told += n);
    assert_eq!(perf.perf_event_output(0, &[0; 8]), 0);
    ring.consume(|_| samples += 1, |n| told += n);
    let refused = WRITERS * RECORDS - written;
    assert!(refused > 0, "the ring was never full");
    assert_eq!(samples, written + 1, "every record written is read once");
    assert_eq!(ring.lost(), 0);
    assert_eq!(
        told,
        counted + refused,
        "every loss, counted outside or by a full ring, is told once"
    );
}

/// Records per producer of the offer stress test, its producer threads per process, and
/// the processes it starts besides its own.
const OFFER_RECORDS: u64 = 20_000;
const OFFER_THREADS: u64 = 3;
const OFFER_CHILDREN: u64 = 2;
/// Set in the offer stress test's producer processes: `STORE,RINGBUF_ID,PERF_ID,FIRST`.
const OFFER_CHILD_ENV: &str = "BPFTIME_OFFER_STRESS_CHILD";

/// Makes producer `p`'s records in order: each offered until taken (as gpu-attach's
/// backlog does), or, for the helper producer, written once through the helper (which
/// counts a full ring's refusal as a drop or a loss).
fn produce(rb: &Map, perf: &Map, p: u64, helper: bool) {
    for seq in 0..OFFER_RECORDS {
        let mut rec = [0u8; 16];
        rec[..8].copy_from_slice(&p.to_ne_bytes());
        rec[8..].copy_from_slice(&seq.to_ne_bytes());
        if helper {
            // SAFETY: 16 readable bytes.
            let _ = unsafe { rb.ringbuf_output(rec.as_ptr(), 16, 0) };
            let _ = perf.perf_event_output(0, &rec);
            continue;
        }
        for m in [rb, perf] {
            loop {
                match m.offer_record(0, &rec) {
                    RecordOffer::Taken => break,
                    RecordOffer::Full => std::thread::yield_now(),
                    RecordOffer::Refused(e) => panic!("offer refused: {e}"),
                }
            }
        }
    }
}

/// Producers offering records that wait for room, on several threads of several
/// processes, with one producer writing through the helpers beside them, against a
/// consumer reading a ring buffer and a perf buffer as fast as it can: every offered
/// record arrives, once and in its producer's order, and nothing is counted lost for
/// them; the helper's records arrive in order or are counted as dropped (ring buffer)
/// and lost (perf buffer), to the record.
#[test]
fn offered_records_from_threads_and_processes_arrive_in_order_and_none_is_lost() {
    if let Ok(spec) = std::env::var(OFFER_CHILD_ENV) {
        let parts: Vec<&str> = spec.split(',').collect();
        let store = Store::open(parts[0]).unwrap();
        let rb = Map::open(&store, parts[1].parse().unwrap()).unwrap();
        let perf = Map::open(&store, parts[2].parse().unwrap()).unwrap();
        let first: u64 = parts[3].parse().unwrap();
        std::thread::scope(|scope| {
            for p in first..first + OFFER_THREADS {
                let (rb, perf) = (&rb, &perf);
                scope.spawn(move || produce(rb, perf, p, false));
            }
        });
        return;
    }
    let s = TempStore::new("offer-stress");
    // Small rings, so that producers find them full often.
    let rb = Map::create(&s, &spec(mt::RINGBUF, 0, 0, 4096)).unwrap();
    let (perf, ring) = perf_array_with_ring(&s, 7);
    let offered = OFFER_THREADS * (1 + OFFER_CHILDREN);
    let helper = offered;
    let name = s.name().to_string();
    let children: Vec<_> = (1..=OFFER_CHILDREN)
        .map(|c| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "tests::offered_records_from_threads_and_processes_arrive_in_order_and_none_is_lost",
                    "--exact",
                    "--test-threads=1",
                ])
                .env(
                    OFFER_CHILD_ENV,
                    format!("{name},{},{},{}", rb.id(), perf.id(), c * OFFER_THREADS),
                )
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    // next[p]: the sequence number producer p's next record must carry, per ring.
    let mut next_rb = vec![0u64; helper as usize + 1];
    let mut next_perf = vec![0u64; helper as usize + 1];
    let (mut helper_lost, mut helper_skipped_rb, mut helper_skipped_perf) = (0u64, 0u64, 0u64);
    let done = std::sync::atomic::AtomicBool::new(false);
    let mut children = children;
    std::thread::scope(|scope| {
        let producers: Vec<_> = (0..OFFER_THREADS)
            .map(|p| {
                let (rb, perf) = (&rb, &perf);
                scope.spawn(move || produce(rb, perf, p, false))
            })
            .chain(std::iter::once({
                let (rb, perf) = (&rb, &perf);
                scope.spawn(move || produce(rb, perf, helper, true))
            }))
            .collect();
        let take = |r: &[u8], next: &mut Vec<u64>, skipped: &mut u64| {
            let p = u64::from_ne_bytes(r[..8].try_into().unwrap()) as usize;
            let seq = u64::from_ne_bytes(r[8..16].try_into().unwrap());
            if p as u64 == helper {
                assert!(seq >= next[p], "helper record {seq} after {}", next[p]);
                *skipped += seq - next[p];
            } else {
                assert_eq!(
                    seq, next[p],
                    "producer {p}'s records out of order or missing"
                );
            }
            next[p] = seq + 1;
        };
        let mut consume = |next_rb: &mut Vec<u64>, next_perf: &mut Vec<u64>| {
            rb.ringbuf_drain(|r| take(r, next_rb, &mut helper_skipped_rb));
            ring.consume(
                |r| take(r, next_perf, &mut helper_skipped_perf),
                |n| helper_lost += n,
            );
        };
        let waiter = scope.spawn(|| {
            for p in producers {
                p.join().unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::Release);
        });
        while !done.load(std::sync::atomic::Ordering::Acquire)
            || next_rb[..offered as usize]
                .iter()
                .any(|&n| n < OFFER_RECORDS)
            || next_perf[..offered as usize]
                .iter()
                .any(|&n| n < OFFER_RECORDS)
        {
            // A child that ran no producer (a wrong test filter, a crash) would leave this
            // loop waiting for ever: once every producer is done, what is missing stays so.
            let children_done = children
                .iter_mut()
                .all(|c| !matches!(c.try_wait(), Ok(None)));
            let threads_done = done.load(std::sync::atomic::Ordering::Acquire);
            consume(&mut next_rb, &mut next_perf);
            if children_done && threads_done {
                break;
            }
        }
        consume(&mut next_rb, &mut next_perf);
        waiter.join().unwrap();
    });
    for mut c in children {
        assert!(c.wait().unwrap().success(), "a producer process failed");
    }
    // A record lost after the helper's last delivered one is counted but not yet
    // written: the ring writes the count before its next record.
    let pending_lost = ring.lost();
    assert!(next_rb[..offered as usize]
        .iter()
        .all(|&n| n == OFFER_RECORDS));
    assert!(next_perf[..offered as usize]
        .iter()
        .all(|&n| n == OFFER_RECORDS));
    let h = helper as usize;
    assert_eq!(
        helper_skipped_rb + (OFFER_RECORDS - next_rb[h]),
        rb.dropped(),
        "the ring buffer's drops are the helper's missing records"
    );
    assert_eq!(
        helper_skipped_perf + (OFFER_RECORDS - next_perf[h]),
        helper_lost + pending_lost,
        "the perf buffer's lost count is the helper's missing records"
    );
    eprintln!(
        "offer stress: {} offered records per ring all arrived; helper: {} of {OFFER_RECORDS} ring buffer records dropped, {} perf records lost",
        offered * OFFER_RECORDS,
        rb.dropped(),
        helper_lost + pending_lost
    );
}

/// Every key `next_key` walks to, for comparison with `present_keys`.
fn walk_keys(m: &Map) -> Vec<u32> {
    let mut keys = Vec::new();
    let mut out = [0u8; 4];
    let mut prev: Option<[u8; 4]> = None;
    while m.next_key(prev.as_ref().map(|k| &k[..]), &mut out).is_ok() {
        keys.push(u32::from_ne_bytes(out));
        prev = Some(out);
    }
    keys
}

#[test]
fn present_keys_of_a_huge_sparse_array_are_the_nonzero_ones() {
    let s = TempStore::new("present-huge");
    // 2^31 values of 8 bytes: a 16 GiB file, sparse.
    let m = Map::create(&s, &spec(mt::ARRAY, 4, 8, 1 << 31)).unwrap();
    let set = |k: u32, v: u64| {
        m.update(&k.to_ne_bytes(), &v.to_ne_bytes(), uf::ANY)
            .unwrap()
    };
    set(0, 1);
    set(7, 0); // written, but zero: not present
    set(1_000_000, 2);
    set(1_000_001, 3);
    set((1 << 31) - 1, 4);
    set(5000, 9);
    set(5000, 0); // zero again
    let start = std::time::Instant::now();
    let keys = m.present_keys().unwrap().unwrap();
    eprintln!("present_keys on 2^31 entries: {:?}", start.elapsed());
    assert_eq!(keys, [0, 1_000_000, 1_000_001, (1 << 31) - 1]);
}

#[test]
fn present_keys_see_every_cpu_and_values_across_pages() {
    let s = TempStore::new("present-percpu");
    let m = Map::create(&s, &spec(mt::PERCPU_ARRAY, 4, 8, 1 << 28)).unwrap();
    let n = m.syscall_value_size();
    // Only the last CPU's copy is set: the key is present all the same.
    let mut v = vec![0u8; n];
    v[n - 8] = 1;
    m.update(&12345u32.to_ne_bytes(), &v, uf::ANY).unwrap();
    assert_eq!(m.present_keys().unwrap().unwrap(), [12345]);

    // 1000-byte values: slot 4 (bytes 4000..5000 of the data) starts on the first page
    // and ends on the second; only its last byte is set, on the second page.
    let m = Map::create(&s, &spec(mt::ARRAY, 4, 1000, 64)).unwrap();
    let mut v = vec![0u8; 1000];
    v[999] = 7;
    m.update(&4u32.to_ne_bytes(), &v, uf::ANY).unwrap();
    // Slot 8 straddles the second and third pages, set on both.
    let v = vec![1u8; 1000];
    m.update(&8u32.to_ne_bytes(), &v, uf::ANY).unwrap();
    assert_eq!(m.present_keys().unwrap().unwrap(), [4, 8]);
    assert_eq!(walk_keys(&m).len(), 64, "next_key still walks every index");

    let h = Map::create(&s, &spec(mt::HASH, 4, 8, 16)).unwrap();
    assert_eq!(
        h.present_keys().unwrap(),
        None,
        "hash maps walk what they hold"
    );
}

#[test]
fn present_keys_of_a_stack_trace_map_are_the_stacks_it_holds() {
    let s = TempStore::new("present-stacks");
    // 2^24 buckets of 1032-byte slots: a 16 GiB file, sparse.
    let m = Map::create(&s, &spec(mt::STACK_TRACE, 4, 127 * 8, 1 << 24)).unwrap();
    let mut ids: Vec<u32> = (1..40u64)
        .map(|i| {
            let id = m.stack_trace_file(&[0x1000 * i, 0x2000 * i + 3], 0);
            assert!(id >= 0, "filing trace {i}: {id}");
            id as u32
        })
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(m.present_keys().unwrap().unwrap(), ids);
}

// ----- damaged store files: garbage and truncation never steer an access -----

/// The map's shared header, to overwrite fields as a damaging writer would.
fn raw_header(m: &Map) -> *mut MapHeader {
    m.mapping.base().cast()
}

#[test]
fn a_hash_chain_that_runs_round_ends_the_walk() {
    let s = TempStore::new("dmg-cycle");
    let m = Map::create(&s, &spec(mt::HASH, 8, 8, 4)).unwrap();
    m.update(&1u64.to_ne_bytes(), &10u64.to_ne_bytes(), uf::ANY)
        .unwrap();
    // Every bucket leads to element 1, whose chain leads back to itself.
    for b in 0..hash::raw::nbuckets(&m) {
        hash::raw::bucket(&m, b).store(1, std::sync::atomic::Ordering::Relaxed);
    }
    hash::raw::next(&m, 1).store(1, std::sync::atomic::Ordering::Relaxed);
    let started = std::time::Instant::now();
    let mut out = [0u8; 8];
    assert_eq!(errno(m.lookup(&2u64.to_ne_bytes(), &mut out)), libc::ENOENT);
    // SAFETY: an 8-byte key.
    assert!(unsafe { m.prog_lookup(2u64.to_ne_bytes().as_ptr()) }.is_null());
    assert_eq!(errno(m.delete(&3u64.to_ne_bytes())), libc::ENOENT);
    let mut keys = 0;
    let mut k = None;
    let mut next = [0u8; 8];
    while m
        .next_key(k.as_ref().map(|k: &[u8; 8]| &k[..]), &mut next)
        .is_ok()
        && keys < 100
    {
        keys += 1;
        k = Some(next);
    }
    assert!(keys < 100, "key iteration over a cycle must end");
    assert_eq!(
        errno(m.next_key(Some(&1u64.to_ne_bytes()), &mut next)),
        libc::EFAULT
    );
    assert_eq!(m.damage(), Some(Damage::Garbage));
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    // The key itself is still found through its chain.
    m.lookup(&1u64.to_ne_bytes(), &mut out).unwrap();
    assert_eq!(u64::from_ne_bytes(out), 10);
}

#[test]
fn an_out_of_range_free_list_is_an_error_and_marks_the_map() {
    let s = TempStore::new("dmg-free");
    let m = Map::create(&s, &spec(mt::HASH, 8, 8, 4)).unwrap();
    m.header()
        .free_head
        .store(0xffff_fff0, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(m.damage(), None);
    assert_eq!(
        errno(m.update(&1u64.to_ne_bytes(), &1u64.to_ne_bytes(), uf::ANY)),
        libc::EFAULT
    );
    assert_eq!(m.damage(), Some(Damage::Garbage));
    // A free element whose link leads out of the pool, in a fresh map.
    let m = Map::create(&s, &spec(mt::LRU_HASH, 8, 8, 4)).unwrap();
    hash::raw::free_next(&m, 1).store(77, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: 8-byte key and value.
    let r = unsafe { m.prog_update(1u64.to_ne_bytes().as_ptr(), 5u64.to_ne_bytes().as_ptr(), 0) };
    assert_eq!(r, -(libc::EFAULT as i64));
    assert_eq!(m.damage(), Some(Damage::Garbage));
    // The free tail, out of range, met by a delete.
    let m = Map::create(&s, &spec(mt::HASH, 8, 8, 4)).unwrap();
    m.update(&1u64.to_ne_bytes(), &1u64.to_ne_bytes(), uf::ANY)
        .unwrap();
    m.header()
        .free_tail
        .store(1 << 30, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(errno(m.delete(&1u64.to_ne_bytes())), libc::EFAULT);
    assert_eq!(m.check_damage(), Some(Damage::Garbage));
}

#[test]
fn a_garbage_lock_word_gives_up_instead_of_spinning() {
    let s = TempStore::new("dmg-lock");
    let m = Map::create(&s, &spec(mt::HASH, 8, 8, 4)).unwrap();
    // No thread has this id: given up at once.
    m.header()
        .lock
        .store(0xdead_beef, std::sync::atomic::Ordering::Relaxed);
    let started = std::time::Instant::now();
    assert_eq!(
        errno(m.update(&1u64.to_ne_bytes(), &1u64.to_ne_bytes(), uf::ANY)),
        libc::EFAULT
    );
    assert!(started.elapsed() < std::time::Duration::from_millis(500));
    assert_eq!(m.damage(), Some(Damage::Garbage));
    // A live thread (init) that never lets go: given up after the patience runs out,
    // and at once on the next call, since the map is marked.
    let q = Map::create(&s, &spec(mt::QUEUE, 0, 8, 4)).unwrap();
    q.header()
        .lock
        .store(1, std::sync::atomic::Ordering::Relaxed);
    let started = std::time::Instant::now();
    // SAFETY: an 8-byte value.
    let r = unsafe { q.prog_push(7u64.to_ne_bytes().as_ptr(), 0) };
    assert_eq!(r, -(libc::EFAULT as i64));
    let waited = started.elapsed();
    assert!(
        waited >= lock::PATIENCE && waited < lock::PATIENCE * 5,
        "{waited:?}"
    );
    let started = std::time::Instant::now();
    let mut out = [0u8; 8];
    assert_eq!(errno(q.lookup(&[], &mut out)), libc::EFAULT);
    assert!(started.elapsed() < std::time::Duration::from_millis(100));
}

#[test]
fn garbage_in_the_header_changes_no_access_and_is_found() {
    let s = TempStore::new("dmg-header");
    let m = Map::create(&s, &spec(mt::PERCPU_ARRAY, 4, 8, 4)).unwrap();
    let h = raw_header(&m);
    // SAFETY: plain fields of the mapped header, written as a damaging process would.
    unsafe {
        (*h).value_size = 1 << 30;
        (*h).max_entries = u32::MAX;
        (*h).ncpus = 1 << 20;
    }
    // Accesses keep to what the map was opened as.
    assert_eq!(m.value_size(), 8);
    assert_eq!(m.max_entries(), 4);
    // SAFETY: a 4-byte key.
    assert!(unsafe { m.prog_lookup(4u32.to_ne_bytes().as_ptr()) }.is_null());
    // SAFETY: as above, in range.
    assert!(!unsafe { m.prog_lookup(3u32.to_ne_bytes().as_ptr()) }.is_null());
    assert_eq!(m.check_damage(), Some(Damage::Garbage));
    // A file whose header describes a map it cannot hold is refused at open.
    assert_eq!(errno(Map::open(&s, m.id())), libc::EINVAL);
    let z = Map::create(&s, &spec(mt::HASH, 8, 8, 4)).unwrap();
    // SAFETY: the whole header page, zeroed.
    unsafe { std::ptr::write_bytes(z.mapping.base(), 0, PAGE_SIZE) };
    assert_eq!(z.check_damage(), Some(Damage::Garbage));
    assert!(Map::open(&s, z.id()).is_err());
}

#[test]
fn a_truncated_map_file_reads_zeros_through_the_fault_handler() {
    let s = TempStore::new("dmg-trunc");
    let m = Map::create(&s, &spec(mt::ARRAY, 4, 8, 4)).unwrap();
    m.update(&1u32.to_ne_bytes(), &42u64.to_ne_bytes(), uf::ANY)
        .unwrap();
    // SAFETY: a 4-byte key; the value is 8 bytes.
    let v = unsafe { m.prog_lookup(1u32.to_ne_bytes().as_ptr()) };
    // SAFETY: as above.
    assert_eq!(unsafe { std::ptr::read_volatile(v.cast::<u64>()) }, 42);
    std::fs::OpenOptions::new()
        .write(true)
        .open(m.path())
        .unwrap()
        .set_len(0)
        .unwrap();
    // As JIT code reads an array value: straight through the pointer.
    // SAFETY: the mapping stays; the fault handler puts zero pages under it.
    assert_eq!(unsafe { std::ptr::read_volatile(v.cast::<u64>()) }, 0);
    assert_eq!(m.damage(), Some(Damage::Truncated));
    assert_eq!(m.check_damage(), Some(Damage::Truncated));
    // A hash map truncated under its header, met by an update.
    let h = Map::create(&s, &spec(mt::HASH, 8, 8, 4)).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(h.path())
        .unwrap()
        .set_len(0)
        .unwrap();
    // The zeroed pool has no free element.
    assert_eq!(
        errno(h.update(&1u64.to_ne_bytes(), &1u64.to_ne_bytes(), uf::ANY)),
        libc::E2BIG
    );
    assert_eq!(h.damage(), Some(Damage::Truncated));
}

#[test]
fn garbage_positions_in_queues_and_rings_are_errors() {
    let s = TempStore::new("dmg-ring");
    let q = Map::create(&s, &spec(mt::STACK, 0, 8, 4)).unwrap();
    q.header()
        .tail
        .store(1000, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: an 8-byte value.
    assert_eq!(
        unsafe { q.prog_push(1u64.to_ne_bytes().as_ptr(), 0) },
        -(libc::EFAULT as i64)
    );
    assert_eq!(q.damage(), Some(Damage::Garbage));
    let r = Map::create(&s, &spec(mt::RINGBUF, 0, 0, PAGE_SIZE as u32)).unwrap();
    let (_, prod) = ringbuf::positions_for_test(&r);
    prod.store(1 << 40, std::sync::atomic::Ordering::Relaxed);
    assert!(r.ringbuf_reserve(8, 0).is_null());
    assert_eq!(r.damage(), Some(Damage::Garbage));
    assert_eq!(r.ringbuf_drain(|_| {}), 0);
    // A record header claiming more bytes than were written.
    let r = Map::create(&s, &spec(mt::RINGBUF, 0, 0, PAGE_SIZE as u32)).unwrap();
    // SAFETY: 8 readable bytes.
    assert_eq!(
        unsafe { r.ringbuf_output(1u64.to_ne_bytes().as_ptr(), 8, 0) },
        0
    );
    // SAFETY: the first record's length word, at the start of the data.
    unsafe {
        (*r.mapping.base().add(ringbuf::DATA_OFFSET).cast::<u32>()) = 0x0fff_fff0;
    }
    assert_eq!(r.ringbuf_drain(|_| panic!("no record is whole")), 0);
    assert_eq!(r.damage(), Some(Damage::Garbage));
    // A perf ring whose positions are garbage refuses the record.
    let (perf, ring) = perf_array_with_ring(&s, 900);
    ring.set_head_for_test(1 << 40);
    assert_eq!(
        perf.perf_event_output(0, &[1, 2, 3]),
        -(libc::ENOSPC as i64)
    );
    assert!(perf.check_damage().is_some());
    assert!(ring.check_damage().is_some());
}

/// Threads outputting to a perf event array's events for the first time at once each
/// open a ring, and one table of rings results: every thread gets the one ring the map
/// keeps for an event, none is lost to a race between the swaps, and the records all
/// land in the rings a consumer maps. Repeated on fresh handles to catch a rare
/// interleaving.
#[test]
fn first_outputs_racing_on_threads_share_one_ring_per_event() {
    const EVENTS: u32 = 8;
    const THREADS: usize = 4;
    const ROUNDS: usize = 200;
    let s = TempStore::new("perf-first-race");
    let perf = Map::create(&s, &spec(mt::PERF_EVENT_ARRAY, 4, 4, EVENTS)).unwrap();
    let rings: Vec<crate::PerfRing> = (0..EVENTS)
        .map(|i| {
            let event = 100 + i;
            crate::PerfRing::create(&s, event, 2 * PAGE_SIZE).unwrap();
            perf.set_id(&i.to_ne_bytes(), event, uf::ANY).unwrap();
            crate::PerfRing::open(&s, event).unwrap()
        })
        .collect();
    for round in 0..ROUNDS {
        let fresh = Map::open(&s, perf.id()).unwrap();
        let start = std::sync::Barrier::new(THREADS);
        let got: Vec<Vec<usize>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (fresh, start) = (&fresh, &start);
                    scope.spawn(move || {
                        let mut mine = vec![0usize; EVENTS as usize];
                        start.wait();
                        for k in 0..EVENTS {
                            // Each thread walks the events from its own start.
                            let i = (k + t as u32 * 3) % EVENTS;
                            let ring = fresh.perf_event_ring(u64::from(i)).unwrap();
                            mine[i as usize] = std::sync::Arc::as_ptr(&ring) as usize;
                            assert_eq!(fresh.perf_event_output(u64::from(i), &[t as u8; 8]), 0);
                        }
                        mine
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let table = fresh.perf_rings.now();
        assert_eq!(table.len(), EVENTS as usize, "round {round}");
        for i in 0..EVENTS {
            let kept = std::sync::Arc::as_ptr(&table[&(100 + i)]) as usize;
            for (t, mine) in got.iter().enumerate() {
                assert_eq!(
                    mine[i as usize], kept,
                    "round {round}: thread {t}, event {i}"
                );
            }
        }
        for (i, ring) in rings.iter().enumerate() {
            let mut records = 0;
            ring.consume(|_| records += 1, |_| {});
            assert_eq!(records, THREADS, "round {round}: event {i}");
        }
    }
}
