//! A map's life in the store: made from a spec, opened by id in any process, locked,
//! and checked for damage another process (or a crash) left.

use super::*;

impl Map {
    /// Validates a `BPF_MAP_CREATE` request as the kernel does and creates the map.
    pub fn create(store: &Store, spec: &MapSpec) -> Result<Map> {
        let kind = Kind::of(spec.map_type).ok_or_else(|| {
            err(
                libc::EINVAL,
                format!(
                    "map type {} ({}) is not supported by bpftime (supported: array, hash, percpu_array, percpu_hash, lru_hash, lru_percpu_hash, ringbuf, perf_event_array, prog_array, cgroup_array, lpm_trie, array_of_maps, hash_of_maps, queue, stack, bloom_filter, stack_trace, task_storage, inode_storage, sk_storage, cgrp_storage, bpftime's GPU maps 1501-1504, 1512, 1513 and 1527, and, always empty, sockmap, sockhash, devmap, devmap_hash, cpumap, xskmap, reuseport_sockarray)",
                    spec.map_type,
                    type_name(spec.map_type)
                ),
            )
        })?;
        let layout = Layout::compute(kind, spec, gpu_thread_count(spec)?)?;
        let id = store.alloc_id();
        let ncpus = possible_cpus();
        let path = store.publish_with(ObjectKind::Map, id, layout.file_len, |bytes| {
            let mut name = [0u8; 16];
            let n = spec.name.len().min(15);
            name[..n].copy_from_slice(&spec.name.as_bytes()[..n]);
            let header = MapHeader {
                object: new_object_header(ObjectKind::Map, id),
                map_type: spec.map_type,
                key_size: spec.key_size,
                value_size: spec.value_size,
                max_entries: spec.max_entries,
                map_flags: spec.map_flags,
                ncpus,
                name,
                btf_id: spec.btf_id,
                btf_key_type_id: spec.btf_key_type_id,
                btf_value_type_id: spec.btf_value_type_id,
                frozen: Default::default(),
                map_extra: spec.map_extra,
                file_len: layout.file_len as u64,
                lock: Default::default(),
                count: Default::default(),
                free_head: Default::default(),
                free_tail: Default::default(),
                nbuckets: layout.nbuckets,
                nelems: layout.nelems,
                elem_size: layout.elem_size,
                head: Default::default(),
                tail: Default::default(),
                _pad: 0,
                lru_clock: Default::default(),
                dropped: Default::default(),
                wakeup_pending: Default::default(),
                _pad2: 0,
                updates: Default::default(),
                inner: spec.inner.unwrap_or_default(),
            };
            // SAFETY: the file is at least one page long, page aligned, and private to us until published.
            unsafe { std::ptr::write(bytes.as_mut_ptr().cast::<MapHeader>(), header) };
            if let Kind::Hash { .. } | Kind::MapHash | Kind::LocalStorage(_) = kind {
                // SAFETY: the header was just written at the start of `bytes`.
                let h = unsafe { &*(bytes.as_ptr() as *const MapHeader) };
                hash::init_free_list(h, &mut bytes[PAGE_SIZE..]);
            }
            Ok(())
        })?;
        if kind == Kind::Ringbuf {
            let fifo = bpftime_store::map_fifo_name(id);
            if let Err(e) = store.handle().mkfifo(&fifo) {
                let _ = store.remove(ObjectKind::Map, id);
                return Err(Error::io("mkfifo", store.handle().shown(&fifo), e));
            }
        }
        tracing::debug!(id, ?kind, path = %path.display(), "created map");
        Map::open(store, id)
    }

    /// The checks `BPF_MAP_CREATE` makes on `spec` alone, before it looks at BTF.
    pub fn check_spec(spec: &MapSpec) -> Result<()> {
        let kind = Kind::of(spec.map_type).ok_or_else(|| {
            err(
                libc::EINVAL,
                format!("map type {} is not supported", spec.map_type),
            )
        })?;
        Layout::compute(kind, spec, gpu_thread_count(spec)?).map(|_| ())
    }

    /// Opens a map of the store in this process.
    pub fn open(store: &Store, id: u32) -> Result<Map> {
        Map::open_in(store.handle(), id)
    }

    /// Opens map `id` of the store in directory `dir`.
    pub(super) fn open_in(dir: &StoreDir, id: u32) -> Result<Map> {
        let (file, path) = bpftime_store::open_object_in(dir, ObjectKind::Map, id)?;
        let len = file
            .metadata()
            .map_err(|e| Error::io("stat", &path, e))?
            .len() as usize;
        if len < PAGE_SIZE {
            return Err(Error::BadMagic { path, magic: 0 });
        }
        let probe = Mapping::map_file(&file, PAGE_SIZE, &path)?;
        let mut bytes = vec![0u8; std::mem::size_of::<bpftime_store::layout::ObjectHeader>()];
        // SAFETY: the probe mapping is one page, larger than the header.
        unsafe { std::ptr::copy_nonoverlapping(probe.base(), bytes.as_mut_ptr(), bytes.len()) };
        bpftime_store::check_header(&path, &bytes, ObjectKind::Map)?;
        // SAFETY: header validated above; it lies in the first page.
        let h = unsafe { &*(probe.base() as *const MapHeader) };
        let kind = Kind::of(h.map_type).ok_or_else(|| {
            err(
                libc::EINVAL,
                format!("{}: unknown map type {}", path.display(), h.map_type),
            )
        })?;
        let fixed = Fixed::of(h);
        drop(probe);
        if !fixed.fits(kind, len) {
            return Err(err(
                libc::EINVAL,
                format!(
                    "{}: the map's header does not describe what its {len}-byte file holds (the store file is damaged); remove the store with `bpftime list --clean` and load the tool again",
                    path.display()
                ),
            ));
        }
        let file_len = fixed.file_len as usize;
        let mapping = if kind == Kind::Ringbuf {
            Mapping::map_file_ring(
                &file,
                ringbuf::DATA_OFFSET,
                fixed.ring_size() as usize,
                &path,
            )?
        } else {
            Mapping::map_file(&file, file_len, &path)?
        };
        let fifo = if kind == Kind::Ringbuf {
            let f = bpftime_store::open_fifo(dir, &bpftime_store::map_fifo_name(id))?;
            ringbuf::register_waker(mapping.base() as usize, f.as_raw_fd());
            Some(f)
        } else {
            None
        };
        let mut map = Map {
            id,
            kind,
            mapping,
            fifo,
            dir: dir.clone(),
            path,
            perf_rings: Default::default(),
            inner_maps: Default::default(),
            hash_shape: Default::default(),
            fixed,
        };
        if let Kind::Hash { .. } | Kind::MapHash | Kind::LocalStorage(_) = kind {
            let data_len = map.mapping.byte_len().saturating_sub(PAGE_SIZE);
            map.hash_shape = hash::Shape::of(&map.fixed, map.data(), data_len, map.hash_key_size())
                .ok_or_else(|| {
                    err(
                        libc::EINVAL,
                        format!(
                            "{}: the hash map's buckets and elements do not fit its file",
                            map.path.display()
                        ),
                    )
                })?;
        }
        Ok(map)
    }

    /// Takes the map's structure lock (`repair` runs when its holder died holding it),
    /// or marks the map damaged when its lock word is no lock any more.
    pub(super) fn lock(&self, repair: impl FnOnce()) -> Result<lock::Guard<'_>> {
        lock::lock(
            &self.header().lock,
            || self.mapping.damage().is_some(),
            repair,
        )
        .ok_or_else(|| self.garbage("its lock word names no thread that lets it go"))
    }

    /// Marks the map damaged, for an operation that found `what` in its file; the
    /// operation's error (`EFAULT`).
    #[cold]
    #[inline(never)]
    pub(super) fn garbage(&self, what: &str) -> Error {
        self.mapping.mark_damaged(Damage::Garbage);
        err(
            libc::EFAULT,
            format!(
                "map {} ({}): {what}; the store file is damaged, so what uses the map is detached: remove the store with `bpftime list --clean` and load the tool again",
                self.id,
                self.path.display()
            ),
        )
    }

    /// Why the map is damaged, if a fault or an operation found it so.
    pub fn damage(&self) -> Option<Damage> {
        self.mapping.damage()
    }

    /// [`damage`](Self::damage), after checking the header against what the map was
    /// opened as (a file zeroed or overwritten shows there first): the slow check of a
    /// watcher, never of an operation.
    pub fn check_damage(&self) -> Option<Damage> {
        if let Some(d) = self.damage() {
            return Some(d);
        }
        let h = self.header();
        let mut object = [0u8; std::mem::size_of::<bpftime_store::layout::ObjectHeader>()];
        // SAFETY: the header lies in the mapping's first page.
        unsafe {
            std::ptr::copy_nonoverlapping(self.mapping.base(), object.as_mut_ptr(), object.len())
        };
        let now = Fixed::of(h);
        let same = bpftime_store::check_header(&self.path, &object, ObjectKind::Map).is_ok()
            && h.object.id == self.id
            && now.same_as(&self.fixed)
            && self.mutable_fields_in_range();
        if !same {
            self.mapping.mark_damaged(Damage::Garbage);
        }
        // What the map leads programs to: a perf event array's rings, a map of maps'
        // inner maps. Their damage is the map's, for what uses it.
        let rings = self.perf_rings.now();
        let inner = self.inner_maps.now();
        self.damage()
            .or_else(|| rings.values().find_map(|r| r.check_damage()))
            .or_else(|| inner.values().find_map(|m| m.check_damage()))
    }

    /// Whether the header's changing fields hold values this map's writers leave.
    pub(super) fn mutable_fields_in_range(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let h = self.header();
        let lock = h.lock.load(Relaxed);
        if lock != 0 && !lock::plausible_tid(lock) {
            return false;
        }
        match self.kind {
            Kind::Hash { .. } | Kind::MapHash | Kind::LocalStorage(_) => {
                let n = self.fixed.nelems;
                h.free_head.load(Relaxed) <= n
                    && h.free_tail.load(Relaxed) <= n
                    && h.count.load(Relaxed) <= n
            }
            Kind::Queue | Kind::Stack => {
                let n = self.fixed.max_entries.saturating_add(1);
                h.head.load(Relaxed) < n && h.tail.load(Relaxed) < n
            }
            Kind::StackTrace => h.count.load(Relaxed) <= self.fixed.nbuckets,
            Kind::Ringbuf => ringbuf::positions_in_order(self),
            _ => true,
        }
    }
}
