use super::*;

fn shape(copies: u32) -> HashShape {
    HashShape {
        key_size: 5,
        value_size: 12,
        capacity: hash_capacity(6),
        copies,
    }
}

fn entry(k: u8, copies: u32) -> (Vec<u8>, Vec<u8>) {
    let key = vec![k, 1, 2, 3, k];
    let value = (0..12 * copies)
        .map(|i| k.wrapping_mul(3).wrapping_add(i as u8))
        .collect();
    (key, value)
}

#[test]
fn hash_tables_read_back_what_was_built_with_collisions() {
    assert_eq!(hash_capacity(6), 16);
    assert_eq!(hash_capacity(0), 2);
    for copies in [1, 3] {
        let s = shape(copies);
        let entries: Vec<_> = (0..6).map(|k| entry(k, copies)).collect();
        let image = s.build(&entries).unwrap();
        assert_eq!(image.states.iter().filter(|&&x| x == SLOT_FULL).count(), 6);
        let mut back = s.read(&image);
        back.sort();
        let mut want = entries.clone();
        want.sort();
        assert_eq!(back, want);
    }
    // Every key where the device's lookup would look first, or after it.
    let s = shape(1);
    let image = s.build(&[entry(9, 1)]).unwrap();
    let home = hash_key(&entry(9, 1).0) as usize & 15;
    assert_eq!(image.states[home], SLOT_FULL);
    let too_many: Vec<_> = (0..17).map(|k| entry(k, 1)).collect();
    assert!(s.build(&too_many).is_err());
}

/// A device table as hash_ops.c leaves it after `ops` (values `copies` x 8 bytes).
fn make_ops(device: &mut HashMap<Vec<u8>, Vec<u8>>, ops: &[HashOp], copies: usize) {
    for op in ops {
        if op.change == HashChange::Delete {
            device.remove(&op.key);
            continue;
        }
        if !device.contains_key(&op.key) && !op.make {
            continue;
        }
        let v = device
            .entry(op.key.clone())
            .or_insert_with(|| vec![0; 8 * copies]);
        match op.change {
            HashChange::Add {
                copy,
                offset,
                wide,
                delta,
            } => {
                assert!(wide);
                let d = WordDelta {
                    offset: offset as usize,
                    width: 8,
                    delta,
                };
                add_deltas(&mut v[copy as usize * 8..][..8], &[d]);
            }
            HashChange::Write { .. } => panic!("8-byte values have no tail"),
            HashChange::Delete | HashChange::None => {}
        }
    }
}

/// A store as the replica leaves it after `changes` (values `cpus` x 8 bytes).
fn make_changes(store: &mut HashMap<Vec<u8>, Vec<u8>>, changes: &[StoreChange], cpus: usize) {
    for c in changes {
        match c {
            StoreChange::Delete { key } => {
                store.remove(key);
            }
            StoreChange::Add {
                key,
                cpu,
                deltas,
                tail,
                make,
            } => {
                assert!(tail.is_none());
                if !store.contains_key(key) && !make {
                    continue;
                }
                let v = store
                    .entry(key.clone())
                    .or_insert_with(|| vec![0; 8 * cpus]);
                add_deltas(&mut v[cpu * 8..][..8], deltas);
            }
        }
    }
}

fn sorted(m: &HashMap<Vec<u8>, Vec<u8>>) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut v: Vec<_> = m.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    v.sort();
    v
}

fn add_to(m: &mut HashMap<Vec<u8>, Vec<u8>>, key: u8, at: usize, n: u64, width: usize) {
    let v = m.entry(vec![key]).or_insert_with(|| vec![0; 8 * width]);
    let d = WordDelta {
        offset: 0,
        width: 8,
        delta: n,
    };
    add_deltas(&mut v[at * 8..][..8], &[d]);
}

fn sum(v: &[u8]) -> u64 {
    v.chunks(8)
        .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
        .sum()
}

#[test]
fn per_cpu_hash_tables_start_with_each_cpu_value_on_its_sm() {
    // 3 CPUs, 2 SMs: CPUs 0 and 2 go to SM 0, CPU 1 to SM 1.
    let value: Vec<u8> = [1u64, 10, 100]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let (_, device) = PerCpuHashSync::new(8, 2, 3, &[(vec![7], value)]);
    let want: Vec<u8> = [101u64, 10].iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(device, [(vec![7], want)]);
}

#[test]
fn per_cpu_hash_changes_cross_as_additions_and_keys_follow_either_side() {
    let (copies, cpus) = (4, 3);
    let mut store: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    add_to(&mut store, 1, 2, 1000, cpus);
    let (mut sync, built) = PerCpuHashSync::new(8, copies as u32, cpus, &sorted(&store));
    let mut device: HashMap<_, _> = built.into_iter().collect();
    assert_eq!(sum(&device[&vec![1]]), 1000);

    // The GPU adds to key 1 on SMs 0 and 3 (both report to CPU 0), and makes key 2
    // on SM 1; nothing was sent, so done 0 covers everything.
    add_to(&mut device, 1, 0, 5, copies);
    add_to(&mut device, 1, 3, 7, copies);
    add_to(&mut device, 2, 1, 3, copies);
    let changes = sync.pull(sorted(&device), 0);
    make_changes(&mut store, &changes, cpus);
    assert_eq!(sum(&store[&vec![1]]), 1012);
    assert_eq!(&store[&vec![1]][..8], &12u64.to_le_bytes());
    assert_eq!(&store[&vec![2]][8..16], &3u64.to_le_bytes());
    assert!(changes
        .iter()
        .any(|c| matches!(c, StoreChange::Add { key, make: true, .. } if key == &vec![2])));
    // What the pull wrote is not the CPU's change: the next push sends nothing.
    assert_eq!(sync.push(&sorted(&store)), (vec![], 0));

    // The CPU adds 50 to key 2 on CPU 2 (goes to SM 2), makes key 3 with 9 on CPU 1
    // and deletes key 1; meanwhile the GPU adds 4 to key 2 on SM 1.
    add_to(&mut store, 2, 2, 50, cpus);
    add_to(&mut store, 3, 1, 9, cpus);
    store.remove(&vec![1]);
    let (ops, seq) = sync.push(&sorted(&store));
    assert_eq!(seq, 1);
    assert!(ops.contains(&HashOp {
        key: vec![1],
        make: false,
        change: HashChange::Delete
    }));
    assert!(ops.contains(&HashOp {
        key: vec![3],
        make: true,
        change: HashChange::Add {
            copy: 1,
            offset: 0,
            wide: true,
            delta: 9
        }
    }));
    assert!(ops.contains(&HashOp {
        key: vec![2],
        make: false,
        change: HashChange::Add {
            copy: 2,
            offset: 0,
            wide: true,
            delta: 50
        }
    }));
    add_to(&mut device, 2, 1, 4, copies);
    // A pull before the device made the ops (done 0 < 1): keys 1, 2 and 3 are waiting;
    // key 1, still on the device, is not brought back into the store, and key 3,
    // not there yet, is not taken for deleted.
    let early = sync.pull(sorted(&device), 0);
    assert!(early.is_empty(), "{early:?}");
    make_ops(&mut device, &ops, copies);
    let changes = sync.pull(sorted(&device), seq);
    make_changes(&mut store, &changes, cpus);
    assert!(!device.contains_key(&vec![1]) && !store.contains_key(&vec![1]));
    assert_eq!(sum(&store[&vec![2]]), 3 + 50 + 4);
    assert_eq!(sum(&device[&vec![2]]), 3 + 50 + 4);
    assert_eq!(sum(&store[&vec![3]]), 9);
    assert_eq!(&device[&vec![3]][8..16], &9u64.to_le_bytes());

    // The GPU deletes key 3: the store's goes.
    device.remove(&vec![3]);
    let changes = sync.pull(sorted(&device), seq);
    assert_eq!(changes, [StoreChange::Delete { key: vec![3] }]);
    make_changes(&mut store, &changes, cpus);
    assert_eq!(store.len(), 1);
    // And the CPU makes a key with zero values: it is made on the device all the same.
    store.insert(vec![4], vec![0; 8 * cpus]);
    let (ops, seq) = sync.push(&sorted(&store));
    assert_eq!(seq, 2);
    assert_eq!(
        ops,
        [HashOp {
            key: vec![4],
            make: true,
            change: HashChange::None
        }]
    );
    make_ops(&mut device, &ops, copies);
    assert!(sync.pull(sorted(&device), seq).is_empty());
}

#[test]
fn per_cpu_hash_values_of_odd_sizes_copy_their_last_bytes() {
    // A 6-byte value: one 4-byte word added, two bytes written.
    let (mut sync, _) = PerCpuHashSync::new(6, 2, 2, &[]);
    let mut value = vec![0u8; 16];
    value[8..14].copy_from_slice(&[1, 0, 0, 0, 0xab, 0xcd]);
    let (ops, _) = sync.push(&[(vec![9], value)]);
    assert_eq!(
        ops,
        [
            HashOp {
                key: vec![9],
                make: true,
                change: HashChange::Add {
                    copy: 1,
                    offset: 0,
                    wide: false,
                    delta: 1
                }
            },
            HashOp {
                key: vec![9],
                make: true,
                change: HashChange::Write {
                    copy: 1,
                    offset: 4,
                    len: 2,
                    bytes: 0xcdab
                }
            }
        ]
    );
}

#[test]
fn hash_ops_are_laid_out_as_the_kernel_reads_them() {
    let op = |k: u8| HashOp {
        key: vec![k; 5],
        make: k.is_multiple_of(2),
        change: HashChange::Add {
            copy: 3,
            offset: 8,
            wide: true,
            delta: u64::MAX,
        },
    };
    // 32 bytes an op (24 and an 8-byte key stride): 125 per launch.
    let ops: Vec<_> = (0..130).map(|i| op(i as u8)).collect();
    let launches = encode_hash_ops(&ops, 8);
    assert_eq!(launches.len(), 2);
    assert_eq!((launches[0].1, launches[1].1), (125, 5));
    let (buf, _) = &launches[0];
    assert_eq!(buf.len(), HASH_OPS_BYTES);
    let rec = &buf[32..64];
    assert_eq!(u32::from_le_bytes(rec[0..4].try_into().unwrap()), 1);
    assert_eq!(u32::from_le_bytes(rec[4..8].try_into().unwrap()), 3);
    assert_eq!(u32::from_le_bytes(rec[8..12].try_into().unwrap()), 8);
    assert_eq!(
        u64::from_le_bytes(rec[16..24].try_into().unwrap()),
        u64::MAX
    );
    assert_eq!(&rec[24..32], &[1, 1, 1, 1, 1, 0, 0, 0]);
    assert_eq!(
        u32::from_le_bytes(buf[0..4].try_into().unwrap()),
        1 | 1 << 8
    );
    let del = encode_hash_ops(
        &[HashOp {
            key: vec![2; 5],
            make: false,
            change: HashChange::Delete,
        }],
        8,
    );
    assert_eq!(u32::from_le_bytes(del[0].0[0..4].try_into().unwrap()), 4);
}

#[test]
fn the_hash_ops_kernel_is_ptx_that_ptxas_accepts() {
    assert!(HASH_OPS_PTX.contains(".visible .entry __bpftime_hash_ops("));
    // Nothing the probes' helpers need: the kernel loads on its own.
    assert!(!HASH_OPS_PTX.contains(".extern"));
    let Some(ptxas) = bpftime_gpu_ptx::toolchain::ptxas_for_tests() else {
        return;
    };
    // CUDA 13's ptxas starts at sm_75.
    for sm in [75, 90] {
        bpftime_gpu_ptx::toolchain::ptxas_accepts(&ptxas, "hash_ops", HASH_OPS_PTX, sm, false)
            .unwrap_or_else(|e| panic!("sm_{sm}: {e}"));
    }
    // The parameters fit a launch's 4 KiB.
    assert!(HASH_OPS_PTX.contains(&format!(".b8 __bpftime_hash_ops_param_4[{HASH_OPS_BYTES}]")));
}

#[test]
fn a_table_is_made_anew_once_a_quarter_of_its_slots_are_tombstones() {
    let table = |deleted: usize, full: usize| {
        let mut states = vec![SLOT_EMPTY; 64];
        states[..deleted].fill(SLOT_DELETED);
        states[deleted..deleted + full].fill(SLOT_FULL);
        states
    };
    assert!(!needs_rebuild(&table(0, 32)));
    assert!(!needs_rebuild(&table(15, 32)));
    assert!(needs_rebuild(&table(16, 0)));
    assert!(needs_rebuild(&table(40, 20)));
}

/// A table with tombstones (deleted or evicted keys) and a key an LRU insert left
/// twice, laid out anew: no tombstone, every entry with every copy of its value, the
/// doubled key once with the value a pull reads.
#[test]
fn a_table_laid_out_anew_keeps_its_entries_and_drops_its_tombstones() {
    let shape = HashShape {
        key_size: 8,
        value_size: 8,
        capacity: 16,
        copies: 2,
    };
    let entry = |k: u64, v: u64| {
        (
            k.to_ne_bytes().to_vec(),
            [v, v + 1]
                .iter()
                .flat_map(|x| x.to_ne_bytes())
                .collect::<Vec<u8>>(),
        )
    };
    let entries: Vec<Entry> = (0..6).map(|k| entry(k, 100 * k)).collect();
    let mut image = shape.build(&entries).unwrap();
    let slot_of = |image: &HashImage, k: u64| {
        (0..16)
            .find(|&s| {
                image.states[s] == SLOT_FULL && image.keys[s * 8..s * 8 + 8] == k.to_ne_bytes()
            })
            .unwrap()
    };
    // Keys 1 and 4 deleted on the device.
    for k in [1, 4] {
        let s = slot_of(&image, k);
        image.states[s] = SLOT_DELETED;
    }
    // The key in the lowest slot, inserted again later in the table with another value.
    let first = (0..16).find(|&s| image.states[s] == SLOT_FULL).unwrap();
    let doubled = u64::from_ne_bytes(image.keys[first * 8..first * 8 + 8].try_into().unwrap());
    let spare = (first + 1..16)
        .find(|&s| image.states[s] == SLOT_EMPTY)
        .unwrap();
    let (key, value) = entry(doubled, 7000);
    image.states[spare] = SLOT_FULL;
    image.keys[spare * 8..spare * 8 + 8].copy_from_slice(&key);
    image.values[spare * 16..spare * 16 + 16].copy_from_slice(&value);
    assert!(needs_rebuild(&image.states) == (2 * 4 >= 16));

    let fresh = compact_image(&shape, &image);
    assert!(!fresh.states.contains(&SLOT_DELETED));
    let mut got = shape.read(&fresh);
    got.sort();
    let mut want: Vec<Entry> = [0, 2, 3, 5]
        .into_iter()
        .map(|k| {
            if k == doubled {
                entry(k, 7000)
            } else {
                entry(k, 100 * k)
            }
        })
        .collect();
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn lru_tables_keep_a_flag_per_slot_and_a_hand_after_their_states() {
    assert_eq!(lru_extra_bytes(map_type::LRU_HASH, 2048), 2048 * 4 + 8);
    assert_eq!(lru_extra_bytes(map_type::HASH, 2048), 0);
    assert_eq!(lru_extra_bytes(map_type::LRU_PERCPU_HASH, 64), 64 * 4 + 8);
    assert_eq!(device_kind(map_type::LRU_HASH), Ok(DeviceKind::Hash));
    assert_eq!(device_kind(map_type::LRU_PERCPU_HASH), Ok(DeviceKind::Hash));
    // bpftime's shared GPU maps are the standard ones on the device, down to the
    // type runtime.c dispatches on; its per-thread arrays (either kind) are theirs.
    for (gpu, kind, standard) in [
        (map_type::GPU_ARRAY, DeviceKind::Array, map_type::ARRAY),
        (
            map_type::GPU_KERNEL_SHARED_ARRAY,
            DeviceKind::Array,
            map_type::ARRAY,
        ),
        (map_type::GPU_ARRAY_HOST, DeviceKind::Array, map_type::ARRAY),
        (map_type::GPU_HASH, DeviceKind::Hash, map_type::HASH),
        (
            map_type::GPU_PER_THREAD_ARRAY_HOST,
            DeviceKind::ThreadArray,
            map_type::GPU_PER_THREAD_ARRAY,
        ),
        (
            map_type::GPU_RINGBUF,
            DeviceKind::Ringbuf,
            map_type::GPU_RINGBUF,
        ),
    ] {
        assert_eq!(device_kind(gpu), Ok(kind), "{gpu}");
        assert_eq!(device_map_type(gpu), standard, "{gpu}");
        assert!(!is_per_cpu(gpu), "{gpu}");
        assert_eq!(lru_extra_bytes(device_map_type(gpu), 64), 0, "{gpu}");
    }
    assert!(is_per_cpu(map_type::LRU_PERCPU_HASH));
}

#[test]
fn fnv1a_matches_the_reference_values() {
    // FNV-1a 32-bit test vectors.
    assert_eq!(hash_key(b""), 0x811c_9dc5);
    assert_eq!(hash_key(b"a"), 0xe40c_292c);
    assert_eq!(hash_key(b"foobar"), 0xbf9c_f968);
}

#[test]
fn value_changes_become_word_additions() {
    // Two u64 counters and a u32, the first counter up 5, the u32 wrapped past zero.
    let mut old = Vec::new();
    old.extend_from_slice(&10u64.to_le_bytes());
    old.extend_from_slice(&7u64.to_le_bytes());
    old.extend_from_slice(&1u32.to_le_bytes());
    let mut new = old.clone();
    new[..8].copy_from_slice(&15u64.to_le_bytes());
    new[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
    let (deltas, tail) = value_deltas(&old, &new);
    assert_eq!(
        deltas,
        [
            WordDelta {
                offset: 0,
                width: 8,
                delta: 5
            },
            WordDelta {
                offset: 16,
                width: 4,
                delta: u32::MAX as u64 - 1
            },
        ]
    );
    assert_eq!(tail, None);
    // Adding the deltas to a value a second writer changed keeps both changes.
    let other: u64 = 10 + 3;
    assert_eq!(other.wrapping_add(deltas[0].delta), 18);
    // A decrease is a wrapping addition too.
    let (deltas, _) = value_deltas(&15u64.to_le_bytes(), &10u64.to_le_bytes());
    assert_eq!(15u64.wrapping_add(deltas[0].delta), 10);
    // Bytes past the last 4-byte word are copied when they changed.
    let (deltas, tail) = value_deltas(&[1, 2, 3, 4, 5, 6], &[1, 2, 3, 4, 5, 7]);
    assert!(deltas.is_empty());
    assert_eq!(tail, Some(4..6));
    assert_eq!(value_deltas(&[1, 2], &[1, 2]), (vec![], None));
}

/// Writes a record as runtime.c commits one.
fn put(ring: &mut [u8], size: u64, pos: u64, data: &[u8], flags: u32) -> u64 {
    let at = (pos & (size - 1)) as usize;
    ring[at..at + 4].copy_from_slice(&(data.len() as u32 | flags).to_le_bytes());
    ring[at + 4..at + 8].copy_from_slice(&(pos as u32).to_le_bytes());
    ring[at + 8..at + 8 + data.len()].copy_from_slice(data);
    pos + ((8 + data.len() as u64 + 7) & !7)
}

#[test]
fn rings_drain_in_order_across_laps_and_stop_at_uncommitted_records() {
    let size = 64u64;
    let mut ring = vec![0u8; 64];
    // A lap already consumed up to 40, then three records, the second wrapping with
    // a discarded pad to the end.
    let mut pos = 40;
    let first = put(&mut ring, size, pos, b"abc", 0);
    assert_eq!(first, 56);
    // The pad: 8 bytes left at 56.
    ring[56..60].copy_from_slice(&RECORD_DISCARD.to_le_bytes());
    ring[60..64].copy_from_slice(&(first as u32).to_le_bytes());
    pos = put(&mut ring, size, 64, b"0123456789", 0);
    let head = put(&mut ring, size, pos, b"hi", RECORD_RAW);
    let (records, tail) = drain_ring(&ring, size, 40, head);
    let data: Vec<&[u8]> = records.iter().map(|r| r.data.as_slice()).collect();
    assert_eq!(data, [&b"abc"[..], b"0123456789", b"hi"]);
    assert_eq!(
        records.iter().map(|r| r.raw).collect::<Vec<_>>(),
        [false, false, true]
    );
    assert_eq!(tail, head);
    // A reserved record whose header is still from an earlier lap stops the drain.
    let mut stale = ring.clone();
    stale[0..8].copy_from_slice(&[3, 0, 0, 0, 0xff, 0, 0, 0]);
    let (records, tail) = drain_ring(&stale, size, 40, head);
    assert_eq!(records.len(), 1);
    assert_eq!(tail, 64);
    // Nothing past head is read.
    let (records, tail) = drain_ring(&ring, size, 40, first);
    assert_eq!((records.len(), tail), (1, first));
}

#[test]
fn rings_get_a_shard_per_sm_while_shards_stay_large_enough() {
    // An H100's 132 SMs: 128 shards of 128 KiB for a 16 MiB ring.
    assert_eq!(ring_shards(16 << 20, 132), 128);
    // A small ring keeps shards of at least RING_SHARD_MIN.
    assert_eq!(ring_shards(1 << 20, 132), 16);
    assert_eq!(ring_shards(64 << 10, 132), 1);
    assert_eq!(ring_shards(4096, 132), 1);
    // Never more shards than SMs, and always a power of two.
    assert_eq!(ring_shards(1 << 30, 6), 4);
    assert_eq!(ring_shards(1 << 30, 1), 1);
    assert_eq!(ring_shards(1 << 30, 0), 1);
}

#[test]
fn deltas_replay_a_change_on_a_copy() {
    // 8-byte word, 4-byte word, then 2 tail bytes; one word wraps.
    let old: Vec<u8> = [
        5u64.to_le_bytes().as_slice(),
        &u32::MAX.to_le_bytes(),
        &[1, 2],
    ]
    .concat();
    let new: Vec<u8> = [9u64.to_le_bytes().as_slice(), &3u32.to_le_bytes(), &[1, 2]].concat();
    let (deltas, tail) = value_deltas(&old, &new);
    assert_eq!(tail, None);
    // Another copy of the value that moved on meanwhile gets the same change.
    let mut other: Vec<u8> = [
        100u64.to_le_bytes().as_slice(),
        &10u32.to_le_bytes(),
        &[7, 7],
    ]
    .concat();
    add_deltas(&mut other, &deltas);
    assert_eq!(&other[..8], &104u64.to_le_bytes());
    assert_eq!(&other[8..12], &14u32.to_le_bytes());
    assert_eq!(&other[12..], &[7, 7]);
    let mut same = old.clone();
    add_deltas(&mut same, &deltas);
    assert_eq!(same, new);
}

#[test]
fn shards_in_one_window_are_found_by_one_range_check() {
    let window = 0x3000_0020_0000u64;
    let shards = vec![
        ShardEntry::in_window(window, 4096, 256),
        ShardEntry::in_window(window + 4096, 512, 256),
    ];
    let ir = shard_address_ir(&shards);
    assert_eq!(ir.matches("icmp ult").count(), 1, "{ir}");
    assert!(ir.contains(&format!("sub i64 %addr, {window}")), "{ir}");
    assert!(ir.contains("icmp ult i64 %off, 4608"), "{ir}");
    assert!(
        ir.contains(&format!("(i64 %addr, i64 {window}, i64 4608)")),
        "the compiler is asked first: {ir}"
    );
    assert!(ir.contains("and i64 %sm, 255"), "{ir}");
    assert!(
        ir.contains(&format!("mul i64 %n, {SHARD_WINDOW_SPAN}")),
        "{ir}"
    );
    assert!(ir.contains("select i1 %w, i64 1, i64 257"), "{ir}");
    // Not laid out as one window (a copy count that is no power of two, as entries
    // made elsewhere may have): a compare per array.
    let scattered = [
        ShardEntry {
            copies: 132,
            ..shards[0]
        },
        shards[1],
    ];
    let ir = shard_address_ir(&scattered);
    assert_eq!(ir.matches("icmp ult").count(), 2, "{ir}");
}

#[test]
fn config_ir_fills_in_the_configuration_the_runtime_declares() {
    let shard = ShardEntry {
        base: 0x7100_0000,
        len: 16,
        shards64: 0x7200_0000,
        shards32: 0x7200_0000 + 256 * 132,
        stride: 256,
        copies: 132,
    };
    let ir = config_ir(&RuntimeConfig {
        pid_tgid_at: 0x7000_1000,
        trace_ring: 0x7000_0000,
        shards: vec![shard],
    });
    assert!(ir.contains(&format!(
        "define i64 @bpftime_gpu_config_pid_tgid() {{\n  %p = inttoptr i64 {} to ptr addrspace(1)",
        0x7000_1000u64
    )));
    assert!(ir.contains(&format!("ret i64 {}", 0x7000_0000u64)));
    assert!(ir.contains(&format!("sub i64 %addr, {}", 0x7100_0000u64)));
    assert!(ir.contains(&format!(
        "i64 {}, i64 {}",
        0x7200_0000u64,
        0x7200_0000u64 + 256 * 132
    )));
    // The runtime (the text build.rs turned into the bitcode) declares each of these
    // and defines every helper a probe may call.
    let runtime = include_str!(concat!(env!("OUT_DIR"), "/runtime.ll"));
    for config in [
        "bpftime_gpu_config_pid_tgid",
        "bpftime_gpu_config_trace_ring",
        "bpftime_gpu_shard_address",
    ] {
        assert!(ir.contains(&format!("define i64 @{config}(")), "{config}");
        assert!(
            runtime
                .lines()
                .any(|l| l.starts_with("declare") && l.contains(&format!("@{config}("))),
            "{config} is not declared by the runtime"
        );
    }
    for helper in bpftime_jit_ptx::extern_helpers() {
        assert!(
            runtime
                .lines()
                .any(|l| l.starts_with("define") && l.contains(&format!("@{}(", helper.1))),
            "{} missing",
            helper.1
        );
    }
    assert!(
        !runtime.contains("target-cpu"),
        "CPU attributes stop inlining into probes"
    );
    assert_eq!(&RUNTIME_BITCODE[..4], b"BC\xc0\xde", "bitcode");
}
