//! Every reader of store files, on files whose bytes come from the input: the
//! first byte picks the object, the second how its file is made: the input's
//! bytes alone (random), a valid file of that object cut short (truncated), or a
//! valid file with the input's bytes spliced in (mixed). The object is then used
//! as an agent or `bpftime list` uses a damaged store's: maps are looked up,
//! updated, walked and deleted from, records read back, rings written to, and the
//! store's collector reads every header.
//!
//! The valid files come from a template store made once per process, with one
//! map of each kind the runtime keeps and one record of each other kind.

#![no_main]

use bpftime_fuzz::{private_store_root, Bytes};
use bpftime_isa::uapi::map_type as mt;
use bpftime_runtime::{
    LinkKind, LinkRecord, Map, MapSpec, ObjectKind, PerfEventKind, PerfEventRecord, PerfRing,
    ProgramRecord, Store,
};
use libfuzzer_sys::fuzz_target;
use std::path::Path;
use std::sync::OnceLock;

/// The id the damaged object gets in the store under test.
const ID: u32 = 7;
/// Keys and values larger than this are not handed to a map (the harness's own
/// buffers would be the memory hog, not the reader).
const MAX_ELEM: usize = 1 << 16;

struct Templates {
    maps: Vec<Vec<u8>>,
    program: Vec<u8>,
    link: Vec<u8>,
    perf_event: Vec<u8>,
    btf: Vec<u8>,
    store_header: Vec<u8>,
    cpus: Vec<u8>,
    ring: Vec<u8>,
}

fn spec(map_type: u32, key_size: u32, value_size: u32, max_entries: u32, flags: u32) -> MapSpec {
    MapSpec {
        map_type,
        key_size,
        value_size,
        max_entries,
        map_flags: flags,
        name: "fuzz".into(),
        ..MapSpec::default()
    }
}

fn templates() -> &'static Templates {
    static T: OnceLock<Templates> = OnceLock::new();
    T.get_or_init(|| {
        private_store_root();
        let store = Store::create_or_open("templates").expect("template store");
        let no_prealloc = 1; // BPF_F_NO_PREALLOC
        let specs = [
            spec(mt::HASH, 4, 8, 16, 0),
            spec(mt::ARRAY, 4, 8, 16, 0),
            spec(mt::PERCPU_HASH, 8, 16, 8, 0),
            spec(mt::PERCPU_ARRAY, 4, 8, 8, 0),
            spec(mt::LRU_HASH, 4, 8, 16, 0),
            spec(mt::LRU_PERCPU_HASH, 4, 8, 16, 0),
            spec(mt::LPM_TRIE, 8, 8, 16, no_prealloc),
            spec(mt::QUEUE, 0, 8, 16, 0),
            spec(mt::STACK, 0, 8, 16, 0),
            spec(mt::RINGBUF, 0, 0, 4096, 0),
            spec(mt::BLOOM_FILTER, 0, 8, 16, 0),
            spec(mt::STACK_TRACE, 4, 64, 16, 0),
            spec(mt::PERF_EVENT_ARRAY, 4, 4, 4, 0),
            spec(mt::PROG_ARRAY, 4, 4, 4, 0),
            spec(mt::ARRAY, 4, 8, 4, 0x400), // BPF_F_MMAPABLE
        ];
        let mut maps = Vec::new();
        for s in &specs {
            match Map::create(&store, s) {
                Ok(m) => {
                    let mut key = vec![0u8; m.key_size() as usize];
                    let value = vec![0x5a; m.syscall_value_size()];
                    for i in 0..3u8 {
                        if let Some(k) = key.first_mut() {
                            *k = i;
                        }
                        let _ = m.update(&key, &value, 0);
                    }
                    maps.push(std::fs::read(m.path()).expect("read a template map"));
                }
                Err(e) => eprintln!("store_files: no template for map type {}: {e}", s.map_type),
            }
        }
        let program = ProgramRecord {
            id: 2,
            prog_type: 2,
            expected_attach_type: 0,
            name: "p".into(),
            insns: bpftime_isa::decode(&[0xb7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0])
                .expect("mov r0, 0; exit"),
            map_ids: vec![1, 2],
            gpl: true,
            owner_pid: 1,
        };
        let read = |p: std::path::PathBuf| std::fs::read(p).expect("read a template record");
        let program = read(program.publish(&store).expect("program template"));
        let ev = PerfEventRecord {
            id: 3,
            kind: PerfEventKind::Uprobe,
            path: "/bin/true".into(),
            offset: 16,
            pid: -1,
            cpu: 0,
            ref_ctr_offset: 0,
            owner_pid: 1,
        };
        let perf_event = read(ev.publish(&store).expect("perf event template"));
        let link = LinkRecord {
            id: 4,
            prog_id: 2,
            perf_event_id: 3,
            kind: LinkKind::Uprobe,
            path: "/bin/true".into(),
            offset: 16,
            pid: -1,
            cookie: 9,
            ref_ctr_offset: 0,
            owned_by_event: false,
            owner_pid: 1,
        };
        let link = read(link.publish(&store).expect("link template"));
        let btf = read(
            bpftime_runtime::publish_btf(&store, 5, &[0x9f, 0xeb, 1, 0, 24, 0, 0, 0])
                .expect("btf template"),
        );
        PerfRing::create(&store, 6, 4096 * 2).expect("perf ring template");
        let ring = read(store.perf_ring_path(6));
        let store_header = read(store.dir().join("store"));
        let cpus = read(store.dir().join("cpus"));
        Templates {
            maps,
            program,
            link,
            perf_event,
            btf,
            store_header,
            cpus,
            ring,
        }
    })
}

/// The file's bytes: random, truncated or mixed.
fn damaged(b: &mut Bytes, valid: &[u8]) -> Vec<u8> {
    match b.u8() % 3 {
        0 => b.rest().to_vec(),
        1 => {
            let cut = (b.u32() as usize) % (valid.len() + 1);
            valid[..cut].to_vec()
        }
        _ => {
            let mut v = valid.to_vec();
            // A few splices, each at an offset of its own (headers sit at the front,
            // so half of them land in the first 256 bytes).
            for _ in 0..(b.u8() % 4 + 1) {
                let at = if b.u8() & 1 == 0 {
                    b.u8() as usize
                } else {
                    b.u32() as usize
                } % (v.len() + 1);
                let n = b.u8() as usize % 32 + 1;
                let patch = b.take(n);
                let end = (at + patch.len()).min(v.len());
                v[at..end].copy_from_slice(&patch[..end - at]);
            }
            v
        }
    }
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).expect("write the damaged file");
}

fn use_map(m: &Map, b: &mut Bytes) {
    let ks = m.key_size() as usize;
    let vs = m.syscall_value_size();
    if ks > MAX_ELEM || vs > MAX_ELEM {
        return;
    }
    let _ = (
        m.map_type(),
        m.max_entries(),
        m.map_flags(),
        m.name(),
        m.btf_ids(),
        m.is_frozen(),
    );
    let mut key = b.fill(ks);
    let mut value = b.fill(vs);
    let _ = m.lookup(&key, &mut value);
    let _ = m.update(&key, &value, u64::from(b.u8() % 4));
    let _ = m.lookup(&key, &mut value);
    // A walk as `bpftool map dump` does it, bounded here so that a cycle shows as
    // a finding in the map's size rather than a hang of the harness.
    let mut cur: Option<Vec<u8>> = None;
    let mut next = vec![0u8; ks];
    for _ in 0..(m.max_entries().min(4096) as usize + 2) {
        if m.next_key(cur.as_deref(), &mut next).is_err() {
            break;
        }
        let _ = m.lookup(&next, &mut value);
        cur = Some(next.clone());
    }
    let _ = m.lookup_and_delete(&key, &mut value);
    key.iter_mut().for_each(|k| *k ^= 1);
    let _ = m.delete(&key);
    let _ = m.id_at(b.u32());
    let _ = m.inner_template();
    let _ = m.array_values().is_some();
    let _ = m.mmapable_region();
    let _ = m.ringbuf_regions();
    let n = b.u8() as usize;
    let data = b.fill(n);
    let _ = m.offer_record(0, &data);
    let _ = m.perf_event_output(u64::from(b.u8() % 2) * 0xffff_ffff, &data);
    let _ = m.ringbuf_query(u64::from(b.u8() % 4));
    let _ = m.ringbuf_drain(|_| {});
    let _ = m.freeze();
}

fn check(store: &Store, dir: &Path, b: &mut Bytes) {
    let t = templates();
    let kind = b.u8() % 9;
    match kind {
        0 => {
            if t.maps.is_empty() {
                return;
            }
            let valid = &t.maps[b.u8() as usize % t.maps.len()];
            write(&store.path(ObjectKind::Map, ID), &damaged(b, valid));
            if let Ok(m) = Map::open(store, ID) {
                use_map(&m, b);
            }
        }
        1 => {
            write(
                &store.path(ObjectKind::Program, ID),
                &damaged(b, &t.program),
            );
            let _ = ProgramRecord::read(store, ID);
        }
        2 => {
            write(&store.path(ObjectKind::Link, ID), &damaged(b, &t.link));
            let _ = LinkRecord::read(store, ID);
        }
        3 => {
            write(
                &store.path(ObjectKind::PerfEvent, ID),
                &damaged(b, &t.perf_event),
            );
            let _ = PerfEventRecord::read(store, ID);
        }
        4 => {
            write(&store.path(ObjectKind::Btf, ID), &damaged(b, &t.btf));
            let _ = bpftime_runtime::read_btf(store, ID);
        }
        5 => {
            // In a store of its own: the store under test keeps its header mapped,
            // and a file shrunk under a mapping faults whoever maps it.
            let other = Store::dir_for("files-header");
            let _ = std::fs::create_dir_all(&other);
            write(&other.join("store"), &damaged(b, &t.store_header));
            if let Ok(s) = Store::open("files-header") {
                let _ = (s.alloc_id(), s.generation());
                s.bump_generation();
                let _ = s.ids(ObjectKind::Map);
                let _ = s.hold_refs();
            }
        }
        6 => {
            // The first table that passes is the process's for good (an agent serves
            // one store), so later inputs reach only the checks before it.
            write(&dir.join("cpus"), &damaged(b, &t.cpus));
            let _ = bpftime_runtime::cpu_slots::install(store);
        }
        7 => {
            write(&store.perf_ring_path(ID), &damaged(b, &t.ring));
            // The ring's wake-up FIFO, by the name the store gives it.
            let fifo = dir.join(format!("fifo-perf-{ID}"));
            let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a valid NUL-terminated path; an existing FIFO is fine.
            unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
            if let Ok(r) = PerfRing::open(store, ID) {
                for _ in 0..(b.u8() % 8) {
                    let n = b.u16() as usize % 8192;
                    let data = b.fill(n);
                    let _ = r.try_output(&data);
                    let _ = r.output(&data);
                }
                let _ = (r.has_unread(), r.lost());
                r.count_lost(1);
                r.clear_wakeup();
            }
        }
        _ => {
            // A file of any kind, under any name, as `bpftime list` and the collector
            // meet them.
            let kinds = [
                ObjectKind::Map,
                ObjectKind::Program,
                ObjectKind::Link,
                ObjectKind::PerfEvent,
                ObjectKind::Btf,
            ];
            let k = kinds[b.u8() as usize % kinds.len()];
            write(&store.path(k, ID), b.rest());
        }
    }
    for k in [
        ObjectKind::Map,
        ObjectKind::Program,
        ObjectKind::Link,
        ObjectKind::PerfEvent,
        ObjectKind::Btf,
    ] {
        for id in store.ids(k) {
            let _ = store.info(k, id);
        }
    }
    let _ = store.pins();
    bpftime_runtime::collect_garbage(&store);
}

fuzz_target!(|data: &[u8]| {
    private_store_root();
    templates();
    let name = "files";
    let dir = Store::dir_for(name);
    let _ = std::fs::remove_dir_all(&dir);
    let store = Store::create_or_open(name).expect("create the store under test");
    let mut b = Bytes::new(data);
    check(&store, &dir, &mut b);
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
});
