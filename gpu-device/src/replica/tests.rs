use super::*;
use bpftime_runtime::{MapSpec, Store};

fn records(from: u8, n: u8) -> Vec<RingRecord> {
    (from..from + n)
        .map(|i| RingRecord {
            data: vec![i; 8],
            raw: false,
        })
        .collect()
}

/// A store ring with room for `room` records until its consumer reads them.
struct Consumer {
    room: usize,
    queued: Vec<u8>,
    read: Vec<u8>,
}

impl Consumer {
    fn take(&mut self, r: &RingRecord) -> RecordOffer {
        if self.queued.len() == self.room {
            return RecordOffer::Full;
        }
        self.queued.push(r.data[0]);
        RecordOffer::Taken
    }

    fn read_all(&mut self) {
        self.read.append(&mut self.queued);
    }
}

#[test]
fn records_a_full_ring_cannot_take_wait_and_arrive_in_order() {
    let mut consumer = Consumer {
        room: 3,
        queued: Vec::new(),
        read: Vec::new(),
    };
    let mut backlog = Backlog::new(1 << 20);
    let mut lost = 0;
    // A burst of ten into room for three, then four more while seven wait.
    backlog.offer(records(0, 10), |r| consumer.take(r), |_| lost += 1);
    assert_eq!((consumer.queued.len(), backlog.len()), (3, 7));
    consumer.read_all();
    backlog.offer(records(10, 4), |r| consumer.take(r), |_| lost += 1);
    assert_eq!(
        backlog.len(),
        8,
        "the new records wait behind the held ones"
    );
    while !backlog.is_empty() {
        consumer.read_all();
        backlog.offer(Vec::new(), |r| consumer.take(r), |_| lost += 1);
    }
    consumer.read_all();
    assert_eq!(consumer.read, (0..14).collect::<Vec<u8>>());
    assert_eq!(lost, 0);
    // With room, records go straight through and nothing is held.
    backlog.offer(records(14, 2), |r| consumer.take(r), |_| lost += 1);
    assert_eq!(
        (backlog.len(), consumer.queued.as_slice()),
        (0, &[14, 15][..])
    );
}

#[test]
fn a_backlog_past_its_bytes_loses_the_newest_and_gives_up_the_rest_when_told() {
    let mut lost = Vec::new();
    // Room for two 8-byte records held.
    let mut backlog = Backlog::new(16);
    backlog.offer(
        records(0, 5),
        |_| RecordOffer::Full,
        |r| lost.push(r.data[0]),
    );
    assert_eq!(backlog.len(), 2);
    assert_eq!(lost, [2, 3, 4]);
    // A record the ring refuses for good (not for room) is not held.
    backlog.offer(
        Vec::new(),
        |_| RecordOffer::Refused(-7),
        |r| lost.push(r.data[0]),
    );
    assert!(backlog.is_empty());
    backlog.offer(
        records(5, 2),
        |_| RecordOffer::Full,
        |r| lost.push(r.data[0]),
    );
    backlog.give_up(|r| lost.push(r.data[0]));
    assert!(backlog.is_empty());
    assert_eq!(lost, [2, 3, 4, 5, 6]);
    // Its bytes were given back with them.
    backlog.offer(
        records(7, 2),
        |_| RecordOffer::Full,
        |r| lost.push(r.data[0]),
    );
    assert_eq!(backlog.len(), 2);
}

fn key(k: u64) -> Vec<u8> {
    k.to_ne_bytes().to_vec()
}

/// A per-thread array's replica holds the store's values in the device's layout (key
/// k's value of thread t is element k * threads + t, which runtime.c's lookup of
/// thread t finds), and what the device changed in element e lands in that key's value
/// of that thread, as `bpf()` hands it to a loader.
#[test]
fn a_per_thread_arrays_replica_is_laid_out_as_the_device_reads_it() {
    let name = format!("unit-replica-pt-{}", std::process::id());
    let _ = std::fs::remove_dir_all(Store::dir_for(&name));
    let store = Store::create_or_open(&name).unwrap();
    let map = Map::create(
        &store,
        &MapSpec {
            map_type: map_type::GPU_PER_THREAD_ARRAY,
            key_size: 4,
            value_size: 8,
            max_entries: 2,
            map_extra: 3,
            ..Default::default()
        },
    )
    .unwrap();
    let words = |v: &[u64]| v.iter().flat_map(|w| w.to_ne_bytes()).collect::<Vec<u8>>();
    map.update(&0u32.to_ne_bytes(), &words(&[1, 2, 3]), 0)
        .unwrap();
    map.update(&1u32.to_ne_bytes(), &words(&[4, 5, 6]), 0)
        .unwrap();
    assert_eq!(device_kind(map.map_type()), Ok(DeviceKind::ThreadArray));
    let desc = GpuMapDesc {
        map_type: device_map_type(map.map_type()),
        key_size: 4,
        value_size: 8,
        max_entries: 2,
        value_stride: 8,
        copies: map.gpu_threads().unwrap(),
        ..GpuMapDesc::default()
    };
    assert_eq!(desc.map_type, map_type::GPU_PER_THREAD_ARRAY);
    assert_eq!(host_array(&map, &desc), words(&[1, 2, 3, 4, 5, 6]));
    // The device added 10 to thread 1's value of key 1 (element 4).
    let host = HostArray::of(&map, &desc).unwrap();
    host.add(
        4,
        &[WordDelta {
            offset: 0,
            width: 8,
            delta: 10,
        }],
    );
    let mut out = vec![0u8; 24];
    map.lookup(&1u32.to_ne_bytes(), &mut out).unwrap();
    assert_eq!(out, words(&[4, 15, 6]));
    let _ = store.destroy();
}

/// A device that replaced entries of a full map (an LRU map's evictions, or a hash
/// map's deletes and inserts in one launch) leaves the store's map holding what the
/// device holds: its deletes go first, so the inserts fit.
#[test]
fn a_full_map_whose_entries_the_device_replaced_ends_as_the_device_has_it() {
    let name = format!("unit-replica-{}", std::process::id());
    let _ = std::fs::remove_dir_all(Store::dir_for(&name));
    let store = Store::create_or_open(&name).unwrap();
    for map_type in [map_type::HASH, map_type::LRU_HASH] {
        let map = Map::create(
            &store,
            &MapSpec {
                map_type,
                key_size: 8,
                value_size: 8,
                max_entries: 4,
                ..Default::default()
            },
        )
        .unwrap();
        let shadow: HashMap<Vec<u8>, Vec<u8>> = (0..4).map(|k| (key(k), key(k))).collect();
        for (k, v) in &shadow {
            map.update(k, v, 0).unwrap();
        }
        // The device evicted or deleted keys 0 and 1, inserted 10 and 11, changed 2.
        let device: HashMap<Vec<u8>, Vec<u8>> = [(2, 20), (3, 3), (10, 10), (11, 11)]
            .into_iter()
            .map(|(k, v)| (key(k), key(v)))
            .collect();
        // Deleting 0 and 1 and inserting 10 and 11 are counted; changing 2 is, but for
        // the LRU map, written in place.
        let counted = if map_type == map_type::LRU_HASH { 4 } else { 5 };
        assert_eq!(apply_device_hash(&map, &shadow, &device), counted);
        let mut value = vec![0u8; 8];
        for (k, v) in &device {
            map.lookup(k, &mut value)
                .unwrap_or_else(|e| panic!("map type {map_type}, key {k:?}: {e}"));
            assert_eq!(&value, v, "map type {map_type}");
        }
        for k in [0, 1] {
            assert!(
                map.lookup(&key(k), &mut value).is_err(),
                "map type {map_type}"
            );
        }
    }
    let _ = store.destroy();
}
