//! The same sequence of `bpf()` map operations, sent to the real kernel and to
//! the shim: every return value, errno and value read back must agree. Where the
//! kernel cannot be used, the expected results written here are checked alone.

use bpftime_isa::uapi::{cmd, map_flags, map_type as mt, update_flags as uf};
use bpftime_runtime::Store;
use bpftime_shim::Shim;
use bpftime_tests::bpf::{put32, put64, Bpf, Kernel, Ours, Res};
use std::os::fd::AsRawFd;

/// One step's observable outcome: the result, and the bytes of the output buffer.
type Outcome = (Res, Vec<u8>);

struct Script<'a> {
    bpf: &'a mut dyn Bpf,
    log: Vec<(String, Outcome)>,
    fd: u32,
}

impl Script<'_> {
    fn create(&mut self, t: u32, k: u32, v: u32, max: u32, flags: u32) -> Res {
        self.create_extra(t, k, v, max, flags, 0)
    }

    fn create_extra(&mut self, t: u32, k: u32, v: u32, max: u32, flags: u32, extra: u64) -> Res {
        self.create_full(t, k, v, max, flags, extra, 0)
    }

    /// A map of maps whose inner maps look like the map behind `inner_fd`.
    fn create_outer(&mut self, t: u32, k: u32, max: u32, flags: u32, inner_fd: u32) -> Res {
        self.create_full(t, k, 4, max, flags, 0, inner_fd)
    }

    #[allow(clippy::too_many_arguments)]
    fn create_full(
        &mut self,
        t: u32,
        k: u32,
        v: u32,
        max: u32,
        flags: u32,
        extra: u64,
        inner_fd: u32,
    ) -> Res {
        let mut a = [0u8; 128];
        put32(&mut a, 20, inner_fd);
        put64(&mut a, 64, extra);
        put32(&mut a, 0, t);
        put32(&mut a, 4, k);
        put32(&mut a, 8, v);
        put32(&mut a, 12, max);
        put32(&mut a, 16, flags);
        let r = self.bpf.call(cmd::MAP_CREATE, &mut a);
        // Fds differ between the two; record success and errno only.
        self.log
            .push((format!("create type {t}"), (r.map(|_| 0), vec![])));
        if let Ok(fd) = r {
            self.fd = fd as u32;
        }
        r
    }

    fn elem(&mut self, what: &str, command: u32, key: Option<&[u8]>, value: &mut [u8], flags: u64) {
        let mut a = [0u8; 128];
        put32(&mut a, 0, self.fd);
        put64(&mut a, 8, key.map_or(0, |k| k.as_ptr() as u64));
        put64(
            &mut a,
            16,
            if value.is_empty() {
                0
            } else {
                value.as_mut_ptr() as u64
            },
        );
        put64(&mut a, 24, flags);
        let r = self.bpf.call(command, &mut a);
        let out = if r.is_ok()
            && matches!(
                command,
                cmd::MAP_LOOKUP_ELEM | cmd::MAP_GET_NEXT_KEY | cmd::MAP_LOOKUP_AND_DELETE_ELEM
            ) {
            value.to_vec()
        } else {
            vec![]
        };
        self.log.push((what.to_string(), (r, out)));
    }

    fn update(&mut self, key: &[u8], value: &[u8], flags: u64) {
        let mut v = value.to_vec();
        self.elem(
            &format!("update {key:?} flags {flags}"),
            cmd::MAP_UPDATE_ELEM,
            Some(key),
            &mut v,
            flags,
        );
    }
    fn push(&mut self, value: &[u8], flags: u64) {
        let mut v = value.to_vec();
        self.elem(
            &format!("push {value:?} flags {flags}"),
            cmd::MAP_UPDATE_ELEM,
            None,
            &mut v,
            flags,
        );
    }
    fn lookup(&mut self, key: Option<&[u8]>, size: usize) {
        let mut v = vec![0u8; size];
        self.elem(
            &format!("lookup {key:?}"),
            cmd::MAP_LOOKUP_ELEM,
            key,
            &mut v,
            0,
        );
    }
    fn pop(&mut self, size: usize) {
        let mut v = vec![0u8; size];
        self.elem("pop", cmd::MAP_LOOKUP_AND_DELETE_ELEM, None, &mut v, 0);
    }
    fn lookup_and_delete(&mut self, key: &[u8], size: usize) {
        let mut v = vec![0u8; size];
        self.elem(
            &format!("lookup_and_delete {key:?}"),
            cmd::MAP_LOOKUP_AND_DELETE_ELEM,
            Some(key),
            &mut v,
            0,
        );
    }
    fn delete(&mut self, key: &[u8]) {
        self.elem(
            &format!("delete {key:?}"),
            cmd::MAP_DELETE_ELEM,
            Some(key),
            &mut [],
            0,
        );
    }
    fn next_key(&mut self, key: Option<&[u8]>, size: usize) {
        let mut v = vec![0u8; size];
        self.elem(
            &format!("next_key {key:?}"),
            cmd::MAP_GET_NEXT_KEY,
            key,
            &mut v,
            0,
        );
    }
    /// Counts keys by iteration (orders differ between implementations).
    fn count_keys(&mut self, size: usize) {
        let mut n = 0;
        let mut key: Option<Vec<u8>> = None;
        loop {
            let mut a = [0u8; 128];
            let mut out = vec![0u8; size];
            put32(&mut a, 0, self.fd);
            put64(&mut a, 8, key.as_ref().map_or(0, |k| k.as_ptr() as u64));
            put64(&mut a, 16, out.as_mut_ptr() as u64);
            match self.bpf.call(cmd::MAP_GET_NEXT_KEY, &mut a) {
                Ok(_) => {
                    n += 1;
                    key = Some(out);
                }
                Err(e) => {
                    self.log
                        .push(("iterate".into(), (Ok(n), e.to_ne_bytes().to_vec())));
                    return;
                }
            }
            if n > 10_000 {
                self.log.push(("iterate".into(), (Err(-1), vec![])));
                return;
            }
        }
    }
    /// The id of the map behind `fd` (BPF_OBJ_GET_INFO_BY_FD).
    fn map_id(&mut self, fd: u32) -> u32 {
        let mut info = [0u8; 96];
        let mut a = [0u8; 128];
        put32(&mut a, 0, fd);
        put32(&mut a, 4, info.len() as u32);
        put64(&mut a, 8, info.as_mut_ptr() as u64);
        self.bpf.call(cmd::OBJ_GET_INFO_BY_FD, &mut a).unwrap();
        u32::from_ne_bytes(info[4..8].try_into().unwrap())
    }

    /// A lookup in a map of maps: ids differ between the two, so what is recorded
    /// is whether the id read back is the one of the map behind `want_fd`.
    fn lookup_inner(&mut self, key: &[u8], want_fd: u32) {
        let want = self.map_id(want_fd);
        let mut v = [0u8; 4];
        self.elem(
            &format!("lookup inner {key:?}"),
            cmd::MAP_LOOKUP_ELEM,
            Some(key),
            &mut v,
            0,
        );
        let last = self.log.last_mut().unwrap();
        if last.1 .0.is_ok() {
            last.1 .1 = vec![u8::from(u32::from_ne_bytes(v) == want)];
        }
    }

    /// Loads BTF with `int` (id 1), `long` (id 2) and `struct v {{ long a, b; }}` (id 3);
    /// returns its fd.
    fn load_btf(&mut self) -> u32 {
        let strs = b"\0int\0long\0v\0a\0b\0";
        let mut t: Vec<u8> = vec![];
        let mut push = |w: &[u32]| w.iter().for_each(|v| t.extend(v.to_ne_bytes()));
        push(&[1, 1 << 24, 4, (1 << 24) | 32]);
        push(&[5, 1 << 24, 8, (1 << 24) | 64]);
        push(&[10, (4 << 24) | 2, 16, 12, 2, 0, 14, 2, 64]);
        let mut blob: Vec<u8> = vec![];
        blob.extend(0xeb9fu16.to_ne_bytes());
        blob.extend([1, 0]);
        for v in [24u32, 0, t.len() as u32, t.len() as u32, strs.len() as u32] {
            blob.extend(v.to_ne_bytes());
        }
        blob.extend(t);
        blob.extend(strs);
        let mut a = [0u8; 128];
        put64(&mut a, 0, blob.as_ptr() as u64);
        put32(&mut a, 16, blob.len() as u32);
        self.bpf.call(cmd::BTF_LOAD, &mut a).expect("BTF loads") as u32
    }

    /// A map with BTF for its key and value.
    #[allow(clippy::too_many_arguments)]
    fn create_btf(
        &mut self,
        t: u32,
        k: u32,
        v: u32,
        max: u32,
        flags: u32,
        btf: u32,
        kid: u32,
        vid: u32,
    ) -> Res {
        let mut a = [0u8; 128];
        put32(&mut a, 0, t);
        put32(&mut a, 4, k);
        put32(&mut a, 8, v);
        put32(&mut a, 12, max);
        put32(&mut a, 16, flags);
        put32(&mut a, 48, btf);
        put32(&mut a, 52, kid);
        put32(&mut a, 56, vid);
        let r = self.bpf.call(cmd::MAP_CREATE, &mut a);
        self.log.push((
            format!("create type {t} key {k} value {v} max {max} flags {flags:#x} btf {kid}/{vid}"),
            (r.map(|_| 0), vec![]),
        ));
        if let Ok(fd) = r {
            self.fd = fd as u32;
        }
        r
    }

    fn freeze(&mut self) {
        let mut a = [0u8; 128];
        put32(&mut a, 0, self.fd);
        let r = self.bpf.call(cmd::MAP_FREEZE, &mut a);
        self.log.push(("freeze".into(), (r, vec![])));
    }
}

fn k32(v: u32) -> [u8; 4] {
    v.to_ne_bytes()
}
fn v64(v: u64) -> [u8; 8] {
    v.to_ne_bytes()
}

fn ncpus() -> usize {
    bpftime_runtime::possible_cpus() as usize
}

/// The whole sequence, run against one implementation.
fn script(bpf: &mut dyn Bpf) -> Vec<(String, Outcome)> {
    let mut s = Script {
        bpf,
        log: vec![],
        fd: 0,
    };
    // Array.
    s.create(mt::ARRAY, 4, 8, 4, 0).unwrap();
    s.update(&k32(1), &v64(11), uf::ANY);
    s.lookup(Some(&k32(1)), 8);
    s.lookup(Some(&k32(2)), 8);
    s.lookup(Some(&k32(4)), 8);
    s.update(&k32(4), &v64(1), uf::ANY);
    s.update(&k32(1), &v64(1), uf::NOEXIST);
    s.update(&k32(1), &v64(12), uf::EXIST);
    s.update(&k32(1), &v64(1), 99);
    s.delete(&k32(1));
    s.next_key(None, 4);
    s.next_key(Some(&k32(2)), 4);
    s.next_key(Some(&k32(3)), 4);
    s.next_key(Some(&k32(77)), 4);
    s.freeze();
    s.update(&k32(0), &v64(5), uf::ANY);
    s.lookup(Some(&k32(1)), 8);
    // Hash.
    s.create(mt::HASH, 4, 8, 3, 0).unwrap();
    s.lookup(Some(&k32(1)), 8);
    s.update(&k32(1), &v64(10), uf::ANY);
    s.update(&k32(2), &v64(20), uf::NOEXIST);
    s.update(&k32(2), &v64(21), uf::NOEXIST);
    s.update(&k32(3), &v64(30), uf::EXIST);
    s.update(&k32(3), &v64(30), uf::ANY);
    s.update(&k32(4), &v64(40), uf::ANY);
    s.update(&k32(3), &v64(31), uf::ANY);
    s.lookup(Some(&k32(3)), 8);
    s.count_keys(4);
    s.delete(&k32(2));
    s.delete(&k32(2));
    s.update(&k32(4), &v64(40), uf::ANY);
    s.lookup_and_delete(&k32(4), 8);
    s.lookup_and_delete(&k32(4), 8);
    s.count_keys(4);
    // Per-CPU array and hash: one 8-byte slot per possible CPU.
    let n = ncpus();
    let vals: Vec<u8> = (0..n as u64)
        .flat_map(|c| (c * 3 + 1).to_ne_bytes())
        .collect();
    s.create(mt::PERCPU_ARRAY, 4, 8, 2, 0).unwrap();
    s.update(&k32(1), &vals, uf::ANY);
    s.lookup(Some(&k32(1)), 8 * n);
    s.lookup(Some(&k32(0)), 8 * n);
    s.create(mt::PERCPU_HASH, 8, 4, 2, 0).unwrap();
    let vals4: Vec<u8> = (0..n as u64)
        .flat_map(|c| (c + 100).to_ne_bytes())
        .collect();
    s.update(&v64(7), &vals4, uf::ANY);
    s.lookup(Some(&v64(7)), 8 * n);
    s.update(&v64(8), &vals4, uf::ANY);
    s.update(&v64(9), &vals4, uf::ANY);
    // LRU: never full.
    s.create(mt::LRU_HASH, 4, 4, 64, 0).unwrap();
    for i in 0..200 {
        let mut v = k32(i).to_vec();
        s.elem(
            "lru update",
            cmd::MAP_UPDATE_ELEM,
            Some(&k32(i)),
            &mut v,
            uf::ANY,
        );
    }
    s.lookup(Some(&k32(199)), 4);
    // LRU, full: updating a key takes a fresh element, evicting another key, never the
    // one updated.
    s.create(mt::LRU_HASH, 4, 4, 4, 0).unwrap();
    for i in 0..4 {
        s.update(&k32(i), &k32(i), uf::ANY);
    }
    for round in 0..6 {
        s.update(&k32(0), &k32(100 + round), uf::ANY);
        s.lookup(Some(&k32(0)), 4);
    }
    // Queue and stack.
    for t in [mt::QUEUE, mt::STACK] {
        s.create(t, 0, 4, 2, 0).unwrap();
        s.pop(4);
        s.push(&k32(1), uf::ANY);
        s.push(&k32(2), uf::ANY);
        s.push(&k32(3), uf::ANY);
        s.push(&k32(3), uf::EXIST);
        s.push(&k32(3), uf::NOEXIST);
        s.lookup(None, 4);
        s.pop(4);
        s.pop(4);
        s.pop(4);
    }
    // Cgroup array: cgroup directories go in by fd; user space cannot read them back.
    let _ = s.create(mt::CGROUP_ARRAY, 4, 8, 4, 0);
    s.create(mt::CGROUP_ARRAY, 4, 4, 4, 0).unwrap();
    let not_a_cgroup = std::fs::File::open("/proc/self/status").unwrap();
    s.update(
        &k32(0),
        &(not_a_cgroup.as_raw_fd() as u32).to_ne_bytes(),
        uf::ANY,
    );
    if let Some(root) = bpftime_runtime::cgroup::cgroup2_root() {
        let cgroup = std::fs::File::open(root).unwrap();
        let fd = (cgroup.as_raw_fd() as u32).to_ne_bytes();
        s.update(&k32(0), &fd, uf::ANY);
        s.update(&k32(4), &fd, uf::ANY);
        s.lookup(Some(&k32(0)), 4);
        s.delete(&k32(0));
    }
    s.delete(&k32(0));
    s.delete(&k32(4));
    // Bloom filter: push, then peek tests a value (the value buffer is the input).
    let _ = s.create(mt::BLOOM_FILTER, 4, 8, 16, 0);
    let _ = s.create(mt::BLOOM_FILTER, 0, 8, 0, 0);
    let _ = s.create_extra(mt::BLOOM_FILTER, 0, 8, 16, 0, 16);
    s.create_extra(mt::BLOOM_FILTER, 0, 8, 16, 0, 3).unwrap();
    s.lookup(None, 8);
    s.push(&v64(0), uf::ANY);
    s.push(&v64(0), uf::EXIST);
    s.lookup(None, 8);
    s.delete(&[]);
    s.next_key(None, 0);
    s.pop(8);
    // LPM trie: the longest stored prefix of a key answers, up to the key's own length.
    let lpm = |prefix: u32, ip: [u8; 4]| [prefix.to_ne_bytes(), ip].concat();
    let _ = s.create(mt::LPM_TRIE, 8, 8, 16, 0);
    let _ = s.create(mt::LPM_TRIE, 4, 8, 16, map_flags::NO_PREALLOC);
    s.create(mt::LPM_TRIE, 8, 8, 16, map_flags::NO_PREALLOC)
        .unwrap();
    s.update(&lpm(24, [10, 1, 2, 0]), &v64(1), uf::ANY);
    s.update(&lpm(16, [10, 1, 0, 0]), &v64(2), uf::ANY);
    s.update(&lpm(33, [10, 1, 2, 3]), &v64(3), uf::ANY);
    s.lookup(Some(&lpm(32, [10, 1, 2, 3])), 8);
    s.lookup(Some(&lpm(32, [10, 1, 9, 9])), 8);
    s.lookup(Some(&lpm(32, [11, 0, 0, 0])), 8);
    s.lookup(Some(&lpm(20, [10, 1, 2, 3])), 8);
    s.update(&lpm(24, [10, 1, 2, 77]), &v64(4), uf::NOEXIST);
    s.update(&lpm(24, [10, 1, 3, 0]), &v64(4), uf::EXIST);
    s.delete(&lpm(24, [10, 1, 2, 0]));
    s.lookup(Some(&lpm(32, [10, 1, 2, 3])), 8);
    s.delete(&lpm(24, [10, 1, 2, 0]));
    s.count_keys(8);
    // The trie's walk order: more specific prefixes first, the 0 side of a bit first.
    s.create(mt::LPM_TRIE, 8, 8, 16, map_flags::NO_PREALLOC)
        .unwrap();
    let walked = [
        lpm(16, [192, 168, 0, 0]),
        lpm(24, [192, 168, 128, 0]),
        lpm(24, [192, 168, 1, 0]),
        lpm(24, [192, 168, 0, 0]),
        lpm(0, [0, 0, 0, 0]),
        lpm(8, [10, 0, 0, 0]),
        lpm(32, [10, 9, 9, 9]),
    ];
    for k in &walked {
        s.update(k, &v64(7), uf::ANY);
    }
    s.next_key(None, 8);
    for k in &walked {
        s.next_key(Some(k), 8);
    }
    s.next_key(Some(&lpm(24, [192, 168, 7, 0])), 8);
    s.next_key(Some(&lpm(40, [192, 168, 0, 0])), 8);
    // Maps of maps: created from a template map, filled with map fds, read back as ids.
    s.create(mt::ARRAY, 4, 8, 4, 0).unwrap();
    let a = s.fd;
    s.create(mt::ARRAY, 4, 8, 5, 0).unwrap();
    let a_longer = s.fd;
    s.create(mt::ARRAY, 4, 16, 4, 0).unwrap();
    let a_wider = s.fd;
    s.create(mt::ARRAY, 4, 8, 4, map_flags::INNER_MAP).unwrap();
    let a_inner = s.fd;
    s.create(mt::ARRAY, 4, 8, 9, map_flags::INNER_MAP).unwrap();
    let a_inner_longer = s.fd;
    s.create(mt::HASH, 4, 8, 4, 0).unwrap();
    let h = s.fd;
    s.create(mt::HASH, 4, 8, 8, 0).unwrap();
    let h_longer = s.fd;
    s.create(mt::PROG_ARRAY, 4, 4, 4, 0).unwrap();
    let prog_array = s.fd;
    s.create(mt::RINGBUF, 0, 0, 4096, 0).unwrap();
    let ringbuf = s.fd;
    let not_a_map = std::fs::File::open("/proc/self/status").unwrap();
    let not_a_map = not_a_map.as_raw_fd() as u32;
    let closed = 999;
    let aom = mt::ARRAY_OF_MAPS;
    let hom = mt::HASH_OF_MAPS;
    let _ = s.create_outer(aom, 4, 4, 0, closed);
    let _ = s.create_outer(aom, 4, 4, 0, not_a_map);
    let _ = s.create_full(aom, 4, 8, 4, 0, 0, a);
    let _ = s.create_outer(aom, 8, 4, 0, a);
    let _ = s.create_outer(aom, 4, 0, 0, a);
    let _ = s.create_outer(aom, 4, 4, map_flags::NO_PREALLOC, a);
    let _ = s.create_outer(aom, 4, 4, map_flags::MMAPABLE, a);
    let _ = s.create_outer(aom, 4, 4, map_flags::RDONLY_PROG, a);
    let _ = s.create_full(hom, 4, 8, 4, 0, 0, a);
    let _ = s.create_outer(hom, 0, 4, 0, a);
    let _ = s.create_outer(hom, 4, 0, 0, a);
    let _ = s.create_outer(aom, 4, 4, 0, prog_array);
    let _ = s.create_outer(aom, 4, 4, 0, ringbuf);
    s.create_outer(aom, 4, 4, 0, a).unwrap();
    let outer = s.fd;
    let _ = s.create_outer(aom, 4, 4, 0, outer);
    s.fd = outer;
    s.lookup_inner(&k32(0), a);
    s.lookup_inner(&k32(9), a);
    s.update(&k32(0), &a.to_ne_bytes(), uf::ANY);
    s.lookup_inner(&k32(0), a);
    s.update(&k32(0), &a.to_ne_bytes(), uf::NOEXIST);
    s.update(&k32(1), &a.to_ne_bytes(), uf::EXIST);
    for wrong in [a_longer, a_wider, h, not_a_map, closed, outer] {
        s.update(&k32(1), &wrong.to_ne_bytes(), uf::ANY);
    }
    s.update(&k32(4), &a.to_ne_bytes(), uf::ANY);
    s.update(&k32(3), &a.to_ne_bytes(), uf::ANY);
    s.next_key(None, 4);
    s.delete(&k32(4));
    s.delete(&k32(1));
    s.delete(&k32(0));
    s.lookup_inner(&k32(0), a);
    s.lookup_inner(&k32(3), a);
    // BPF_F_INNER_MAP: inner arrays of any length.
    s.create_outer(aom, 4, 4, 0, a_inner).unwrap();
    s.update(&k32(0), &a_inner_longer.to_ne_bytes(), uf::ANY);
    s.update(&k32(1), &a.to_ne_bytes(), uf::ANY);
    s.lookup_inner(&k32(0), a_inner_longer);
    // Batch updates take inner maps by fd too.
    let (keys, fds) = ([2u32, 3], [a_inner_longer, a_inner]);
    let mut b = [0u8; 128];
    put64(&mut b, 16, keys.as_ptr() as u64);
    put64(&mut b, 24, fds.as_ptr() as u64);
    put32(&mut b, 32, 2);
    put32(&mut b, 36, s.fd);
    let r = s.bpf.call(cmd::MAP_UPDATE_BATCH, &mut b);
    s.log
        .push(("update batch of maps".into(), (r, b[32..36].to_vec())));
    s.lookup_inner(&k32(2), a_inner_longer);
    s.lookup_inner(&k32(3), a_inner);
    // A hash of maps: hash flags, and inner hashes of any length.
    s.create_outer(hom, 8, 2, map_flags::NO_PREALLOC, h)
        .unwrap();
    s.create_outer(hom, 8, 2, 0, h).unwrap();
    s.update(&v64(5), &h_longer.to_ne_bytes(), uf::ANY);
    s.update(&v64(5), &h.to_ne_bytes(), uf::NOEXIST);
    s.update(&v64(5), &h.to_ne_bytes(), uf::ANY);
    s.update(&v64(6), &h.to_ne_bytes(), uf::EXIST);
    s.update(&v64(6), &a.to_ne_bytes(), uf::ANY);
    s.update(&v64(6), &h.to_ne_bytes(), uf::ANY);
    s.update(&v64(7), &h.to_ne_bytes(), uf::ANY);
    s.lookup_inner(&v64(5), h);
    s.lookup_and_delete(&v64(5), 4);
    s.count_keys(8);
    s.delete(&v64(5));
    s.delete(&v64(5));
    s.lookup_inner(&v64(5), h);
    local_storage(&mut s);
    inert_maps(&mut s);
    // Creation errors.
    let _ = s.create(mt::RINGBUF, 0, 0, 5000, 0);
    let _ = s.create(mt::RINGBUF, 0, 0, 4096, 0);
    let _ = s.create(mt::ARRAY, 8, 8, 1, 0);
    let _ = s.create(mt::HASH, 4, 4, 0, 0);
    let _ = s.create(mt::QUEUE, 4, 4, 1, 0);
    let _ = s.create(mt::PERCPU_ARRAY, 4, 4, 1, map_flags::MMAPABLE);
    let _ = s.create(9999, 4, 4, 1, 0);
    s.log
}

/// Task, inode, socket and cgroup storage: the kernel's creation checks (BTF
/// required), and user space naming owners by file descriptor.
fn local_storage(s: &mut Script) {
    let btf = s.load_btf();
    let np = map_flags::NO_PREALLOC;
    // SAFETY: pidfd_open of this process; the fd is closed below.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) } as u32;
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let file = std::fs::File::open("/proc/self/status").unwrap();
    let cgroup = bpftime_runtime::cgroup::cgroup2_root().and_then(|r| std::fs::File::open(r).ok());
    let mut owners = vec![
        pidfd,
        sock.as_raw_fd() as u32,
        file.as_raw_fd() as u32,
        999,
        u32::MAX,
    ];
    if let Some(c) = &cgroup {
        owners.push(c.as_raw_fd() as u32);
    }
    for t in [
        mt::TASK_STORAGE,
        mt::INODE_STORAGE,
        mt::SK_STORAGE,
        mt::CGRP_STORAGE,
    ] {
        let _ = s.create(t, 4, 8, 0, np);
        let _ = s.create_btf(t, 4, 8, 0, 0, btf, 1, 2);
        let _ = s.create_btf(t, 4, 8, 0, np | map_flags::RDONLY, btf, 1, 2);
        let _ = s.create_btf(t, 4, 8, 1, np, btf, 1, 2);
        let _ = s.create_btf(t, 8, 8, 0, np, btf, 2, 2);
        let _ = s.create_btf(t, 4, 8, 0, np, btf, 2, 2);
        let _ = s.create_btf(t, 4, 0, 0, np, btf, 1, 2);
        let _ = s.create_btf(t, 4, 16, 0, np, btf, 1, 2);
        let _ = s.create_btf(t, 4, 8, 0, np, btf, 0, 2);
        let _ = s.create_btf(t, 4, 8, 0, np, btf, 1, 0);
        let _ = s.create_btf(t, 4, 65536, 0, np, btf, 1, 2);
        let _ = s.create_btf(t, 4, 8, 0, np, 1, 1, 2);
        let _ = s.create_btf(t, 4, 8, 0, np | map_flags::CLONE, btf, 1, 2);
        let _ = s.create_btf(t, 4, 16, 0, np, btf, 1, 3);
        s.create_btf(t, 4, 8, 0, np, btf, 1, 2).unwrap();
        for &o in &owners {
            let k = k32(o);
            s.lookup(Some(&k), 8);
            s.update(&k, &v64(7), uf::ANY);
            s.update(&k, &v64(8), uf::NOEXIST);
            s.lookup(Some(&k), 8);
            s.update(&k, &v64(9), uf::EXIST);
            s.lookup(Some(&k), 8);
            s.update(&k, &v64(9), uf::LOCK);
            s.update(&k, &v64(9), 3);
            s.lookup_and_delete(&k, 8);
            s.delete(&k);
            s.delete(&k);
            s.update(&k, &v64(10), uf::EXIST);
        }
        s.next_key(None, 4);
        s.next_key(Some(&k32(pidfd)), 4);
    }
    // SAFETY: the pidfd opened above.
    unsafe { libc::close(pidfd as i32) };
}

/// Socket, device, CPU and XDP socket maps: created with the kernel's checks; empty,
/// they answer lookups, deletes and iteration as the kernel's do.
fn inert_maps(s: &mut Script) {
    use map_flags::{CLONE, MMAPABLE, NO_PREALLOC, RDONLY, RDONLY_PROG, WRONLY, ZERO_SEED};
    for t in [
        mt::SOCKMAP,
        mt::SOCKHASH,
        mt::DEVMAP,
        mt::DEVMAP_HASH,
        mt::CPUMAP,
        mt::XSKMAP,
        mt::REUSEPORT_SOCKARRAY,
    ] {
        for (k, v, max, flags) in [
            (4, 8, 4, 0),
            (8, 4, 4, 0),
            (4, 4, 0, 0),
            (8, 8, 4, 0),
            (4, 4, 4, NO_PREALLOC),
            (4, 4, 4, RDONLY),
            (4, 4, 4, WRONLY),
            (4, 4, 4, MMAPABLE),
            (4, 4, 4, RDONLY_PROG),
            (4, 4, 4, CLONE),
            (4, 4, 4, ZERO_SEED),
        ] {
            let _ = s.create(t, k, v, max, flags);
        }
        s.create(t, 4, 4, 4, 0).unwrap();
        s.lookup(Some(&k32(0)), 4);
        s.lookup(Some(&k32(9)), 4);
        s.delete(&k32(0));
        s.delete(&k32(9));
        s.next_key(None, 4);
        s.next_key(Some(&k32(0)), 4);
        s.next_key(Some(&k32(3)), 4);
        s.lookup_and_delete(&k32(0), 4);
    }
}

#[test]
fn map_operations_agree_with_the_kernel() {
    let name = format!("test-diff-{}", std::process::id());
    let store = Store::create_or_open(&name).unwrap();
    let mut ours = Ours(Shim::new(store));
    let got = script(&mut ours);
    let _ = Store::open(&name).map(|s| s.destroy());

    // Spot checks that hold whatever the kernel says.
    let find = |what: &str| got.iter().find(|(w, _)| w == what).map(|(_, o)| o.clone());
    assert_eq!(
        find("update [4, 0, 0, 0] flags 0").unwrap().0,
        Err(libc::E2BIG)
    );
    assert_eq!(find("create type 9999").unwrap().0, Err(libc::EINVAL));
    assert_eq!(
        find("update batch of maps").unwrap(),
        (Ok(0), 2u32.to_ne_bytes().to_vec()),
        "a batch update fills a map of maps from fds"
    );
    assert!(
        got.iter()
            .any(|(w, o)| w == "lookup inner [0, 0, 0, 0]" && *o == (Ok(0), vec![1])),
        "an array of maps gives the id of the map stored in it"
    );

    if let Some(why) = bpftime_tests::kernel_unavailable() {
        eprintln!("SKIPPED kernel comparison: {why}; checked our own results only");
        return;
    }
    let want = script(&mut Kernel);
    let mut differ = vec![];
    for (i, ((w1, o1), (_, o2))) in got.iter().zip(want.iter()).enumerate() {
        if o1 != o2 {
            differ.push(format!("step {i} {w1}: bpftime {o1:?} kernel {o2:?}"));
        }
    }
    assert_eq!(got.len(), want.len());
    assert!(
        differ.is_empty(),
        "{} steps differ from the kernel:\n{}",
        differ.len(),
        differ.join("\n")
    );
    println!("{} map operations agree with the kernel", got.len());
}
