//! Maps with the kernel's semantics, in store files that every process maps.
//!
//! Each map type keeps its data after the header page; the syscall side
//! (`lookup`, `update`, ...) copies values the way `bpf()` does, and the
//! program side (`prog_*`) works on raw pointers the way helpers do.

mod array;
mod bloom;
mod hash;
mod local_storage;
mod lock;
pub(crate) use lock::{current_tid, plausible_tid, thread_alive, PATIENCE as LOCK_PATIENCE};
mod lpm;
mod queue;
mod ringbuf;
pub(crate) mod stack_trace;
mod thread_array;

use crate::fault::Damage;
use crate::layout::{InnerTemplate, MapHeader, ObjectKind, PAGE_SIZE};
use crate::mapping::Mapping;
use crate::store::{new_object_header, Store};
use crate::store_dir::StoreDir;
use crate::{Error, Result};
use bpftime_isa::uapi::{map_flags, map_type};
use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

pub(crate) fn round8(v: u32) -> usize {
    (v as usize + 7) & !7
}

fn page_round(v: usize) -> usize {
    (v + PAGE_SIZE - 1) & !(PAGE_SIZE - 1)
}

/// Takes a shared-memory lock word (for structures outside maps); `None` when the word
/// is no lock any more (see [`lock::lock`]).
pub(crate) fn lock_word(word: &std::sync::atomic::AtomicU32) -> Option<lock::Guard<'_>> {
    lock::lock(word, || false, || {})
}

pub(crate) fn err(errno: i32, what: impl Into<std::borrow::Cow<'static, str>>) -> Error {
    Error::invalid(errno, what)
}

/// Number of possible CPUs, as libbpf counts them for per-CPU values.
pub fn possible_cpus() -> u32 {
    static N: OnceLock<u32> = OnceLock::new();
    *N.get_or_init(|| {
        std::fs::read_to_string("/sys/devices/system/cpu/possible")
            .ok()
            .and_then(|s| parse_cpu_list(s.trim()))
            .unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map(|n| n.get() as u32)
                    .unwrap_or(1)
            })
    })
}

fn parse_cpu_list(s: &str) -> Option<u32> {
    let mut max = None;
    for part in s.split(',') {
        let last = part.rsplit('-').next()?.parse::<u32>().ok()?;
        max = Some(max.map_or(last, |m: u32| m.max(last)));
    }
    max.map(|m| m + 1)
}

/// Offset from the FS segment base of the `u32` in which the kernel keeps the number of
/// the CPU the thread runs on: the `cpu_id` field (offset 4) of the rseq area glibc
/// (2.35 and newer) registers for every thread, else of ours, which a thread registers
/// when it first takes a CPU slot (`cpu_slots::use_own_rseq_area`; -1 there until then).
/// `None` where there is neither.
pub fn cpu_number_offset() -> Option<u64> {
    static OFFSET: OnceLock<Option<u64>> = OnceLock::new();
    *OFFSET.get_or_init(|| {
        // SAFETY: dlsym with NUL-terminated names; both symbols, where glibc has them,
        // are constants set before any user code runs.
        unsafe {
            let offset = libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr());
            let size = libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr());
            if offset.is_null() || size.is_null() || *size.cast::<u32>() < 8 {
                // Ours, which threads register as they take CPU slots.
                return crate::cpu_slots::own_rseq_offset().map(|o| (o as u64).wrapping_add(4));
            }
            Some((*offset.cast::<isize>() as u64).wrapping_add(4))
        }
    })
}

/// The CPU a program on this thread runs as, below `ncpus`: the CPU slot it holds (see
/// `cpu_slots.rs`), else the CPU it runs on.
#[inline]
pub(crate) fn current_cpu(ncpus: u32) -> usize {
    match crate::cpu_slots::held_slot() {
        Some(slot) if slot < ncpus => slot as usize,
        _ => hardware_cpu(ncpus),
    }
}

/// The CPU this thread runs on, below `ncpus`: from the rseq area when glibc keeps one,
/// from `sched_getcpu` otherwise.
pub(crate) fn hardware_cpu(ncpus: u32) -> usize {
    if let Some(offset) = cpu_number_offset() {
        let cpu: u32;
        // SAFETY: the rseq area (glibc's or ours) is at this offset from every thread's
        // pointer for the thread's whole life; the kernel keeps `cpu_id` current once
        // the area is registered, and it reads out of range before.
        unsafe {
            std::arch::asm!(
                "mov {cpu:e}, dword ptr fs:[{offset}]",
                cpu = out(reg) cpu,
                offset = in(reg) offset,
                options(nostack, readonly, preserves_flags),
            )
        };
        // A thread whose registration failed reads a negative marker.
        if cpu < ncpus {
            return cpu as usize;
        }
    }
    // SAFETY: sched_getcpu has no preconditions.
    let c = unsafe { libc::sched_getcpu() };
    if c < 0 {
        0
    } else {
        (c as u32 % ncpus.max(1)) as usize
    }
}

/// Where an array map's values live: key `k`'s value (CPU `c`'s copy, for a per-CPU
/// map) at `base + k * key_stride + c * per_cpu.1` for `k < max_entries` and
/// `c < per_cpu.0`, for as long as the map handle lives. CPU `c` is the one
/// [`cpu_number_offset`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrayValues {
    pub base: *mut u8,
    pub key_stride: u32,
    /// Bytes in a value (what an update copies).
    pub value_size: u32,
    /// (copies, bytes from one CPU's copy to the next), for a per-CPU map.
    pub per_cpu: Option<(u32, u32)>,
}

/// One key's values in a per-CPU hash map while [`Map::with_percpu_values`] holds the
/// map's lock: CPU `c`'s `value_size` bytes at `c * stride`.
pub struct PerCpuValues<'a> {
    base: *mut u8,
    cpus: usize,
    stride: usize,
    value_size: usize,
    _lock: std::marker::PhantomData<&'a ()>,
}

impl PerCpuValues<'_> {
    /// The possible CPUs: how many values the key holds.
    pub fn cpus(&self) -> usize {
        self.cpus
    }

    fn at(&self, cpu: usize, offset: usize, len: usize) -> *mut u8 {
        assert!(cpu < self.cpus && offset + len <= self.value_size);
        // SAFETY: inside CPU `cpu`'s value (checked above), which the element holds
        // while the lock is held.
        unsafe { self.base.add(cpu * self.stride + offset) }
    }

    /// CPU `cpu`'s value.
    pub fn get(&self, cpu: usize) -> Vec<u8> {
        let at = self.at(cpu, 0, self.value_size);
        // SAFETY: `value_size` readable bytes (checked in `at`).
        unsafe { std::slice::from_raw_parts(at, self.value_size) }.to_vec()
    }

    /// Adds `delta` (wrapping) to the 8-byte (`wide`) or 4-byte word at `offset` of CPU
    /// `cpu`'s value, atomically: programs add to these values without the lock.
    pub fn add(&self, cpu: usize, offset: usize, wide: bool, delta: u64) {
        let width = if wide { 8 } else { 4 };
        assert!(offset.is_multiple_of(width));
        let at = self.at(cpu, offset, width);
        // SAFETY: an aligned word inside the value (values are 8-byte aligned, the offset
        // a multiple of the width), shared memory that others update atomically too.
        unsafe {
            if wide {
                (*at.cast::<std::sync::atomic::AtomicU64>())
                    .fetch_add(delta, std::sync::atomic::Ordering::Relaxed);
            } else {
                (*at.cast::<std::sync::atomic::AtomicU32>())
                    .fetch_add(delta as u32, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// Writes `bytes` at `offset` of CPU `cpu`'s value.
    pub fn write(&self, cpu: usize, offset: usize, bytes: &[u8]) {
        let at = self.at(cpu, offset, bytes.len());
        // SAFETY: inside the value (checked in `at`).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), at, bytes.len()) };
    }
}

/// What `BPF_MAP_CREATE` asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MapSpec {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    pub name: String,
    pub btf_id: u32,
    pub btf_key_type_id: u32,
    pub btf_value_type_id: u32,
    pub map_extra: u64,
    /// Maps of maps: the shape of the template map `inner_map_fd` named.
    pub inner: Option<InnerTemplate>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Array {
        percpu: bool,
    },
    /// Arrays whose values are object ids (prog_array, perf_event_array; cgroup_array,
    /// whose ids are cgroups').
    IdArray,
    /// bpftime's per-GPU-thread array (see `thread_array.rs`): a copy of every value per
    /// GPU thread, for the thread count fixed at creation.
    ThreadArray,
    Hash {
        percpu: bool,
        lru: bool,
        /// Longest-prefix match over the hash map (`lpm`).
        lpm: bool,
    },
    Queue,
    Stack,
    /// A bloom filter: values pushed, tested by peek.
    Bloom,
    Ringbuf,
    StackTrace,
    /// An array of maps: inner map ids, laid out as an `IdArray`.
    MapArray,
    /// A hash of maps: inner map ids as 4-byte values of a hash map.
    MapHash,
    /// Task, inode, socket or cgroup storage: a hash keyed by the owner's identity.
    LocalStorage(local_storage::Owner),
    /// Socket, device, CPU and XDP socket maps: created as the kernel creates them,
    /// but what they hold (sockets, network devices, CPUs for XDP redirects) has no
    /// meaning in user space, so they stay empty. `array` for the array-shaped ones.
    Inert {
        array: bool,
    },
}

impl Kind {
    fn of(map_type: u32) -> Option<Kind> {
        // bpftime's GPU arrays and hash maps are served as the standard ones; its GPU
        // ring buffer is a ring buffer (`ring_size` says how large).
        Some(match map_type::served_as(map_type) {
            map_type::ARRAY => Kind::Array { percpu: false },
            map_type::PERCPU_ARRAY => Kind::Array { percpu: true },
            // A cgroup array holds cgroups as their ids (the cgroup directory's inode).
            map_type::PROG_ARRAY | map_type::PERF_EVENT_ARRAY | map_type::CGROUP_ARRAY => {
                Kind::IdArray
            }
            map_type::HASH => Kind::Hash {
                percpu: false,
                lru: false,
                lpm: false,
            },
            map_type::PERCPU_HASH => Kind::Hash {
                percpu: true,
                lru: false,
                lpm: false,
            },
            map_type::LRU_HASH => Kind::Hash {
                percpu: false,
                lru: true,
                lpm: false,
            },
            map_type::LRU_PERCPU_HASH => Kind::Hash {
                percpu: true,
                lru: true,
                lpm: false,
            },
            map_type::LPM_TRIE => Kind::Hash {
                percpu: false,
                lru: false,
                lpm: true,
            },
            map_type::QUEUE => Kind::Queue,
            map_type::BLOOM_FILTER => Kind::Bloom,
            map_type::STACK => Kind::Stack,
            map_type::RINGBUF | map_type::GPU_RINGBUF => Kind::Ringbuf,
            map_type::GPU_PER_THREAD_ARRAY => Kind::ThreadArray,
            map_type::STACK_TRACE => Kind::StackTrace,
            map_type::ARRAY_OF_MAPS => Kind::MapArray,
            map_type::HASH_OF_MAPS => Kind::MapHash,
            map_type::SOCKMAP
            | map_type::DEVMAP
            | map_type::CPUMAP
            | map_type::XSKMAP
            | map_type::REUSEPORT_SOCKARRAY => Kind::Inert { array: true },
            map_type::SOCKHASH | map_type::DEVMAP_HASH => Kind::Inert { array: false },
            t => Kind::LocalStorage(local_storage::Owner::of(t)?),
        })
    }

    fn percpu(self) -> bool {
        matches!(
            self,
            Kind::Array { percpu: true } | Kind::Hash { percpu: true, .. }
        )
    }
}

/// What a ring did with a record offered by [`Map::offer_record`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordOffer {
    /// Written, and the consumer woken.
    Taken,
    /// No room now; nothing was counted.
    Full,
    /// Refused for good, with the helper's error (a bad index, a record no ring of this
    /// size can hold).
    Refused(i64),
}

/// A process-local handle on a map in the store.
pub struct Map {
    id: u32,
    kind: Kind,
    mapping: Mapping,
    path: PathBuf,
    /// The wake-up FIFO of a ring buffer, open for as long as the map is.
    fifo: Option<File>,
    /// The store's directory, where inner maps and perf rings are opened.
    dir: StoreDir,
    /// Rings of the perf events a perf_event_array points at, opened on first output.
    perf_rings: std::sync::Mutex<std::collections::HashMap<u32, std::sync::Arc<crate::PerfRing>>>,
    /// Maps of maps: this process's handles on the inner maps programs looked up, by id.
    /// A handle lives as long as the outer one, so the address a program got stays valid
    /// while the program (which holds the outer map) runs.
    inner_maps: std::sync::RwLock<std::collections::HashMap<u32, std::sync::Arc<Map>>>,
    /// Hash-laid-out maps: their layout in this process, read from the header at open.
    hash_shape: hash::Shape,
    /// The header's fields fixed at creation, copied at open once they were checked to
    /// describe the file: operations size and place their accesses by this copy, never
    /// by the shared header, which anyone may overwrite.
    fixed: Fixed,
}

/// The fields of a [`MapHeader`] that never change after creation.
#[derive(Clone, Copy, Debug)]
struct Fixed {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    ncpus: u32,
    map_extra: u64,
    file_len: u64,
    nbuckets: u32,
    nelems: u32,
    elem_size: u32,
    btf: (u32, u32, u32),
    inner: InnerTemplate,
}

impl Fixed {
    /// A ring buffer's bytes: its `max_entries`, or for a GPU ring buffer (whose
    /// `max_entries` counts records) the size fixed at creation.
    fn ring_size(&self) -> u32 {
        if self.map_type == map_type::GPU_RINGBUF {
            self.nbuckets
        } else {
            self.max_entries
        }
    }

    fn of(h: &MapHeader) -> Fixed {
        Fixed {
            map_type: h.map_type,
            key_size: h.key_size,
            value_size: h.value_size,
            max_entries: h.max_entries,
            map_flags: h.map_flags,
            ncpus: h.ncpus,
            map_extra: h.map_extra,
            file_len: h.file_len,
            nbuckets: h.nbuckets,
            nelems: h.nelems,
            elem_size: h.elem_size,
            btf: (h.btf_id, h.btf_key_type_id, h.btf_value_type_id),
            inner: h.inner,
        }
    }

    fn same_as(&self, o: &Fixed) -> bool {
        (
            self.map_type,
            self.key_size,
            self.value_size,
            self.max_entries,
            self.map_flags,
            self.ncpus,
            self.map_extra,
            self.file_len,
        ) == (
            o.map_type,
            o.key_size,
            o.value_size,
            o.max_entries,
            o.map_flags,
            o.ncpus,
            o.map_extra,
            o.file_len,
        ) && (
            self.nbuckets,
            self.nelems,
            self.elem_size,
            self.btf,
            self.inner,
        ) == (o.nbuckets, o.nelems, o.elem_size, o.btf, o.inner)
    }

    fn spec(&self) -> MapSpec {
        MapSpec {
            map_type: self.map_type,
            key_size: self.key_size,
            value_size: self.value_size,
            max_entries: self.max_entries,
            map_flags: self.map_flags,
            map_extra: self.map_extra,
            btf_id: self.btf.0,
            btf_key_type_id: self.btf.1,
            btf_value_type_id: self.btf.2,
            inner: (self.inner.map_type != 0).then_some(self.inner),
            name: String::new(),
        }
    }

    /// Whether these fields describe a map a file of `len` bytes holds, as
    /// `BPF_MAP_CREATE` on this machine would have laid it out.
    fn fits(&self, kind: Kind, len: usize) -> bool {
        // A GPU thread count was fixed at creation and kept in `nelems`.
        let threads = if uses_gpu_threads(self.map_type) {
            self.nelems
        } else {
            0
        };
        let Ok(layout) = Layout::compute(kind, &self.spec(), threads) else {
            return false;
        };
        self.ncpus == possible_cpus()
            && layout.file_len as u64 == self.file_len
            && layout.file_len <= len
            && (layout.nbuckets, layout.nelems, layout.elem_size)
                == (self.nbuckets, self.nelems, self.elem_size)
    }
}

impl std::fmt::Debug for Map {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Map")
            .field("id", &self.id)
            .field("kind", &self.kind)
            .field("path", &self.path)
            .finish()
    }
}

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
            let fifo = crate::store::map_fifo_name(id);
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
    fn open_in(dir: &StoreDir, id: u32) -> Result<Map> {
        let (file, path) = crate::store::open_object_in(dir, ObjectKind::Map, id)?;
        let len = file
            .metadata()
            .map_err(|e| Error::io("stat", &path, e))?
            .len() as usize;
        if len < PAGE_SIZE {
            return Err(Error::BadMagic { path, magic: 0 });
        }
        let probe = Mapping::map_file(&file, PAGE_SIZE, &path)?;
        let mut bytes = vec![0u8; std::mem::size_of::<crate::layout::ObjectHeader>()];
        // SAFETY: the probe mapping is one page, larger than the header.
        unsafe { std::ptr::copy_nonoverlapping(probe.base(), bytes.as_mut_ptr(), bytes.len()) };
        crate::store::check_header(&path, &bytes, ObjectKind::Map)?;
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
            let f = crate::store::open_fifo(dir, &crate::store::map_fifo_name(id))?;
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
            let data_len = map.mapping.len().saturating_sub(PAGE_SIZE);
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
    fn lock(&self, repair: impl FnOnce()) -> Result<lock::Guard<'_>> {
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
    fn garbage(&self, what: &str) -> Error {
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
        let mut object = [0u8; std::mem::size_of::<crate::layout::ObjectHeader>()];
        // SAFETY: the header lies in the mapping's first page.
        unsafe {
            std::ptr::copy_nonoverlapping(self.mapping.base(), object.as_mut_ptr(), object.len())
        };
        let now = Fixed::of(h);
        let same = crate::store::check_header(&self.path, &object, ObjectKind::Map).is_ok()
            && h.object.id == self.id
            && now.same_as(&self.fixed)
            && self.mutable_fields_in_range();
        if !same {
            self.mapping.mark_damaged(Damage::Garbage);
        }
        // What the map leads programs to: a perf event array's rings, a map of maps'
        // inner maps. Their damage is the map's, for what uses it.
        let rings: Vec<_> = self
            .perf_rings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        let inner: Vec<_> = self
            .inner_maps
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        self.damage()
            .or_else(|| rings.iter().find_map(|r| r.check_damage()))
            .or_else(|| inner.iter().find_map(|m| m.check_damage()))
    }

    /// Whether the header's changing fields hold values this map's writers leave.
    fn mutable_fields_in_range(&self) -> bool {
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

    /// Where a hash-laid-out map's buckets and elements are (default for other maps).
    #[inline]
    fn hash_shape(&self) -> &hash::Shape {
        &self.hash_shape
    }

    pub(crate) fn header(&self) -> &MapHeader {
        // SAFETY: the mapping starts with a validated MapHeader; shared fields are atomics.
        unsafe { &*(self.mapping.base() as *const MapHeader) }
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: every map file is longer than its header page.
        unsafe { self.mapping.base().add(PAGE_SIZE) }
    }

    pub fn id(&self) -> u32 {
        self.id
    }
    /// The type the map was created with (bpftime's GPU types included), for what is
    /// reported; what the map does follows [`map_type::served_as`] of it.
    pub fn map_type(&self) -> u32 {
        self.fixed.map_type
    }

    /// The GPU threads a per-thread array keeps values for, or a GPU ring buffer was
    /// sized for: fixed at creation (see `gpu_thread_count`). `None` for other maps.
    pub fn gpu_threads(&self) -> Option<u32> {
        uses_gpu_threads(self.fixed.map_type).then_some(self.fixed.nelems)
    }

    /// A ring buffer's size in bytes (what libbpf's consumer maps and what
    /// `BPF_OBJ_GET_INFO_BY_FD` reports as its `max_entries`); 0 for other maps.
    pub fn ring_size(&self) -> u32 {
        if self.kind == Kind::Ringbuf {
            self.fixed.ring_size()
        } else {
            0
        }
    }

    /// Copies of each value the data area holds: one per CPU (per-CPU maps), one per
    /// GPU thread (per-thread arrays), else one.
    fn value_copies(&self) -> usize {
        match self.kind {
            Kind::ThreadArray => self.fixed.nelems as usize,
            k if k.percpu() => self.fixed.ncpus as usize,
            _ => 1,
        }
    }
    /// Whether a program reaches per-CPU values through this map: its own, or those of
    /// the inner maps of a map of maps.
    pub fn reaches_per_cpu_values(&self) -> bool {
        self.kind.percpu()
            || self
                .inner_template()
                .and_then(|t| Kind::of(t.map_type))
                .is_some_and(Kind::percpu)
    }
    pub fn key_size(&self) -> u32 {
        self.fixed.key_size
    }
    pub fn value_size(&self) -> u32 {
        self.fixed.value_size
    }
    pub fn max_entries(&self) -> u32 {
        self.fixed.max_entries
    }
    pub fn map_flags(&self) -> u32 {
        self.fixed.map_flags
    }
    pub fn name(&self) -> String {
        let n = &self.header().name;
        let end = n.iter().position(|&b| b == 0).unwrap_or(n.len());
        String::from_utf8_lossy(&n[..end]).into_owned()
    }
    pub fn btf_ids(&self) -> (u32, u32, u32) {
        self.fixed.btf
    }
    /// Possible CPUs when the map was created: copies of each per-CPU value.
    pub(crate) fn ncpus(&self) -> u32 {
        self.fixed.ncpus
    }
    pub fn map_extra(&self) -> u64 {
        self.fixed.map_extra
    }
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
    /// Counts `n` records as dropped (by a producer elsewhere: the GPU's ring).
    pub fn count_dropped(&self, n: u64) {
        self.header()
            .dropped
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// How many times the map's elements were inserted, replaced or deleted through
    /// `bpf()` or the update and delete helpers (see `MapHeader::updates`).
    pub fn updates(&self) -> u64 {
        self.header()
            .updates
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Records dropped by a full ring buffer.
    pub fn dropped(&self) -> u64 {
        self.header()
            .dropped
            .load(std::sync::atomic::Ordering::Relaxed)
    }
    pub fn is_frozen(&self) -> bool {
        self.header()
            .frozen
            .load(std::sync::atomic::Ordering::Acquire)
            != 0
    }

    /// The value of a frozen array of one element (global data, such as libbpf's
    /// `.rodata`), which system calls can no longer change: what the verifier reads
    /// constant strings from at load. `None` for any other map.
    pub fn frozen_value(&self) -> Option<Vec<u8>> {
        if !self.is_frozen()
            || self.kind != (Kind::Array { percpu: false })
            || self.max_entries() != 1
        {
            return None;
        }
        let mut value = vec![0u8; self.value_size() as usize];
        array::lookup(self, &0u32.to_ne_bytes(), &mut value).ok()?;
        Some(value)
    }

    /// Size of a value as `bpf()` copies it: per-CPU maps hold one 8-byte
    /// aligned slot per possible CPU.
    pub fn syscall_value_size(&self) -> usize {
        match self.kind {
            k if k.percpu() => round8(self.value_size()) * self.ncpus() as usize,
            // bpftime's layout: every thread's value, `value_size` bytes apart.
            Kind::ThreadArray => self.value_size() as usize * self.value_copies(),
            _ => self.value_size() as usize,
        }
    }

    /// True for prog_array and perf_event_array, whose values are object ids.
    pub fn holds_ids(&self) -> bool {
        self.kind == Kind::IdArray
    }

    /// Bytes of the key a hash-laid-out map stores: local storage keeps its owners'
    /// identities, not the file descriptors user space names them by.
    pub(crate) fn hash_key_size(&self) -> usize {
        match self.kind {
            Kind::LocalStorage(_) => local_storage::KEY_SIZE,
            _ => self.key_size() as usize,
        }
    }

    /// What a lookup in an (always empty) inert map answers, by the kernel's rules:
    /// socket maps cannot hand a socket to user space in a 4-byte value (`ENOSPC`), an
    /// XDP socket map has no user-space lookup.
    fn inert_lookup_error(&self) -> Error {
        let errno = match self.map_type() {
            map_type::SOCKMAP | map_type::SOCKHASH | map_type::REUSEPORT_SOCKARRAY
                if self.value_size() == 4 =>
            {
                libc::ENOSPC
            }
            map_type::XSKMAP => libc::EOPNOTSUPP,
            _ => libc::ENOENT,
        };
        err(errno, "no element")
    }

    /// Elements a hash-laid-out map holds at most.
    pub(crate) fn hash_capacity(&self) -> u32 {
        match self.kind {
            Kind::LocalStorage(_) => local_storage::CAPACITY,
            _ => self.max_entries(),
        }
    }

    fn check_key(&self, key: &[u8]) -> Result<()> {
        if key.len() != self.key_size() as usize {
            return Err(err(libc::EINVAL, "key size mismatch"));
        }
        Ok(())
    }

    fn check_syscall_write(&self) -> Result<()> {
        if self.map_flags() & map_flags::RDONLY != 0 || self.is_frozen() {
            return Err(err(libc::EPERM, "map is read-only from user space"));
        }
        Ok(())
    }

    fn check_syscall_read(&self) -> Result<()> {
        if self.map_flags() & map_flags::WRONLY != 0 {
            return Err(err(libc::EPERM, "map is write-only from user space"));
        }
        Ok(())
    }

    /// The keys that hold something, in order, for the maps whose `next_key` walks every
    /// possible key: for an array (per-CPU or not), the indexes whose value is not all
    /// zero on any CPU; for a stack trace map, the ids of the stacks it holds. The time
    /// this takes follows what was written to the map, not `max_entries`: the map's file
    /// is sparse and only its written ranges are read. `None` for other maps, whose
    /// `next_key` visits only what they hold.
    pub fn present_keys(&self) -> Result<Option<Vec<u32>>> {
        let keys = match self.kind {
            Kind::Array { percpu } => {
                let copies = if percpu {
                    self.header().ncpus as usize
                } else {
                    1
                };
                let slot_len = round8(self.value_size()) * copies;
                array::slots_with_data(self, slot_len, self.max_entries(), |k, part| {
                    array::nonzero(self, k, part)
                })?
            }
            Kind::ThreadArray => {
                let slot_len = round8(self.value_size()) * self.value_copies();
                array::slots_with_data(self, slot_len, self.max_entries(), |k, part| {
                    array::nonzero(self, k, part)
                })?
            }
            Kind::StackTrace => {
                let slot_len = stack_trace::slot_size(self.value_size());
                // A slot is in use when the word at its start says so; a slot that
                // starts in a hole was never written.
                array::slots_with_data(self, slot_len, self.header().nbuckets, |k, part| {
                    part.start == 0 && stack_trace::is_used(self, k)
                })?
            }
            _ => return Ok(None),
        };
        Ok(Some(keys))
    }

    /// `BPF_MAP_LOOKUP_ELEM`.
    pub fn lookup(&self, key: &[u8], value: &mut [u8]) -> Result<()> {
        self.check_syscall_read()?;
        match self.kind {
            Kind::Array { .. } => array::lookup(self, key, value),
            Kind::ThreadArray => thread_array::lookup(self, key, value),
            Kind::IdArray => Err(err(
                libc::EOPNOTSUPP,
                "prog_array and perf_event_array values are read through their ids",
            )),
            Kind::Hash { lpm: true, .. } => lpm::lookup(self, key, value),
            Kind::Hash { .. } => hash::lookup(self, key, value),
            Kind::Queue | Kind::Stack => queue::peek(self, value),
            Kind::Bloom => bloom::peek(self, value),
            Kind::Ringbuf => Err(err(ENOTSUPP, "ring buffers have no elements")),
            Kind::StackTrace => stack_trace::lookup(self, key, value),
            // User space reads an inner map's id.
            Kind::MapArray => {
                let idx = array_index(key)?;
                let id = array::id_at(self, idx).ok_or_else(|| err(libc::ENOENT, "no map"))?;
                value.copy_from_slice(&id.to_ne_bytes());
                Ok(())
            }
            Kind::MapHash => hash::lookup(self, key, value),
            Kind::LocalStorage(o) => local_storage::lookup(self, o, key, value),
            Kind::Inert { .. } => {
                self.check_key(key)?;
                Err(self.inert_lookup_error())
            }
        }
    }

    /// `BPF_MAP_UPDATE_ELEM`.
    pub fn update(&self, key: &[u8], value: &[u8], flags: u64) -> Result<()> {
        self.check_syscall_write()?;
        match self.kind {
            Kind::Array { .. } => array::update(self, key, value, flags),
            Kind::ThreadArray => thread_array::update(self, key, value, flags),
            Kind::IdArray => Err(err(
                libc::EINVAL,
                "prog_array and perf_event_array take file descriptors (use set_id)",
            )),
            Kind::Hash { lpm: true, .. } => lpm::update(self, key, value.as_ptr(), flags, true),
            Kind::Hash { .. } => hash::update(self, key, value.as_ptr(), flags, true),
            Kind::Queue | Kind::Stack => queue::push(self, value.as_ptr(), flags),
            Kind::Bloom => bloom::push(self, value, flags),
            Kind::Ringbuf => Err(err(ENOTSUPP, "ring buffers have no elements")),
            Kind::StackTrace => Err(err(
                libc::EINVAL,
                "stack traces are filed by bpf_get_stackid, not written from user space",
            )),
            Kind::MapArray | Kind::MapHash => Err(err(
                libc::EINVAL,
                "maps of maps take map file descriptors (use set_inner)",
            )),
            Kind::LocalStorage(o) => local_storage::update(self, o, key, value, flags),
            Kind::Inert { .. } => Err(err(
                libc::EOPNOTSUPP,
                format!(
                    "a {} holds sockets, devices or CPUs, which have no meaning in bpftime",
                    type_name(self.map_type())
                ),
            )),
        }
    }

    /// `BPF_MAP_DELETE_ELEM`.
    pub fn delete(&self, key: &[u8]) -> Result<()> {
        self.check_syscall_write()?;
        match self.kind {
            Kind::Array { .. } | Kind::ThreadArray => {
                Err(err(libc::EINVAL, "array elements cannot be deleted"))
            }
            Kind::IdArray => array::clear_id(self, key),
            Kind::Hash { lpm: true, .. } => lpm::delete(self, key),
            Kind::Hash { .. } => hash::delete(self, key.as_ptr()),
            Kind::Queue | Kind::Stack => Err(err(libc::EINVAL, "use pop on queues and stacks")),
            Kind::Bloom => Err(err(libc::EINVAL, "bloom filters forget nothing")),
            Kind::Ringbuf => Err(err(ENOTSUPP, "ring buffers have no elements")),
            Kind::StackTrace => stack_trace::delete(self, key),
            Kind::MapArray => array::clear_id(self, key),
            Kind::MapHash => hash::delete(self, key.as_ptr()),
            Kind::LocalStorage(o) => local_storage::delete(self, o, key),
            Kind::Inert { array: false } => Err(err(libc::ENOENT, "no such key")),
            Kind::Inert { array: true } => {
                let idx = array_index(key)?;
                if idx >= self.max_entries() {
                    // The reuseport array says E2BIG where the others say EINVAL.
                    let errno = if self.map_type() == map_type::REUSEPORT_SOCKARRAY {
                        libc::E2BIG
                    } else {
                        libc::EINVAL
                    };
                    return Err(err(errno, "index out of range"));
                }
                match self.map_type() {
                    map_type::SOCKMAP => Err(err(libc::EINVAL, "no socket at this index")),
                    map_type::REUSEPORT_SOCKARRAY => Err(err(libc::ENOENT, "no socket")),
                    _ => Ok(()),
                }
            }
        }
    }

    /// `BPF_MAP_GET_NEXT_KEY`; `key` None (or a missing key) gives the first key.
    pub fn next_key(&self, key: Option<&[u8]>, out: &mut [u8]) -> Result<()> {
        if let Some(k) = key {
            self.check_key(k)?;
        }
        if out.len() != self.key_size() as usize {
            return Err(err(libc::EINVAL, "key size mismatch"));
        }
        match self.kind {
            Kind::Array { .. } | Kind::ThreadArray | Kind::IdArray | Kind::MapArray => {
                array::next_key(self, key, out)
            }
            Kind::Hash { lpm: true, .. } => lpm::next_key(self, key, out),
            Kind::Hash { .. } | Kind::MapHash => hash::next_key(self, key, out),
            Kind::Queue | Kind::Stack => Err(err(libc::EINVAL, "queues and stacks have no keys")),
            Kind::Bloom => Err(err(libc::EOPNOTSUPP, "bloom filters have no keys")),
            Kind::Ringbuf => Err(err(ENOTSUPP, "ring buffers have no keys")),
            Kind::StackTrace => stack_trace::next_key(self, key, out),
            Kind::LocalStorage(_) => Err(err(ENOTSUPP, "local storage cannot be iterated")),
            Kind::Inert { array: true } => array::next_key(self, key, out),
            Kind::Inert { array: false } => Err(err(libc::ENOENT, "no more keys")),
        }
    }

    /// `BPF_MAP_LOOKUP_AND_DELETE_ELEM` (a pop for queues and stacks).
    pub fn lookup_and_delete(&self, key: &[u8], value: &mut [u8]) -> Result<()> {
        self.check_syscall_read()?;
        self.check_syscall_write()?;
        match self.kind {
            Kind::Hash { lpm: true, .. } => Err(err(
                ENOTSUPP,
                "lookup-and-delete works on hash maps, queues, stacks and stack trace maps",
            )),
            Kind::Hash { .. } => hash::lookup_and_delete(self, key, value),
            Kind::Queue | Kind::Stack => queue::pop(self, value.as_mut_ptr()),
            Kind::StackTrace => stack_trace::lookup_and_delete(self, key, value),
            _ => Err(err(
                ENOTSUPP,
                "lookup-and-delete works on hash maps, queues, stacks and stack trace maps",
            )),
        }
    }

    /// `BPF_MAP_FREEZE`: user space may no longer write.
    pub fn freeze(&self) -> Result<()> {
        if self
            .header()
            .frozen
            .swap(1, std::sync::atomic::Ordering::AcqRel)
            != 0
        {
            return Err(err(libc::EBUSY, "map is already frozen"));
        }
        Ok(())
    }

    /// Stores an object id (a program, or a BPF output perf event) at `index`
    /// of a prog_array or perf_event_array.
    pub fn set_id(&self, key: &[u8], id: u32, flags: u64) -> Result<()> {
        if self.kind != Kind::IdArray {
            return Err(err(libc::EINVAL, "not a prog_array or perf_event_array"));
        }
        self.check_syscall_write()?;
        array::set_id(self, key, id, flags)
    }

    /// The object id stored at `index` of a prog_array or perf_event_array.
    pub fn id_at(&self, index: u32) -> Option<u32> {
        if self.kind != Kind::IdArray {
            return None;
        }
        array::id_at(self, index)
    }

    /// Where an array map (per-CPU or not) keeps its values, for a JIT that inlines
    /// lookups and updates, exactly where [`prog_lookup`](Self::prog_lookup) points.
    pub fn array_values(&self) -> Option<ArrayValues> {
        let Kind::Array { percpu } = self.kind else {
            return None;
        };
        let stride = round8(self.value_size()) as u32;
        let cpus = self.fixed.ncpus;
        Some(ArrayValues {
            base: self.data(),
            key_stride: if percpu { stride * cpus } else { stride },
            value_size: self.value_size(),
            per_cpu: percpu.then_some((cpus, stride)),
        })
    }

    /// Where a per-thread array keeps its values: key `k`'s value of GPU thread `t` at
    /// `base + k * key_stride + t * per_cpu.1` for `t < per_cpu.0` (here the copies are
    /// threads', not CPUs'), for as long as the map handle lives. `None` for other maps.
    pub fn thread_values(&self) -> Option<ArrayValues> {
        if self.kind != Kind::ThreadArray {
            return None;
        }
        let stride = round8(self.value_size()) as u32;
        let threads = self.fixed.nelems;
        Some(ArrayValues {
            base: self.data(),
            key_stride: stride * threads,
            value_size: self.value_size(),
            per_cpu: Some((threads, stride)),
        })
    }

    /// Runs `f` on `key`'s values in a per-CPU hash map, under the map's lock (no delete
    /// or reuse of the element comes between), first inserting the key with every CPU's
    /// value zeroed when it is missing and `create` is set. Returns what `f` returned and
    /// whether the key was inserted. This is how GPU attach adds what the GPU's SMs
    /// changed into the CPUs' values: see [`PerCpuValues::add`].
    pub fn with_percpu_values<R>(
        &self,
        key: &[u8],
        create: bool,
        f: impl FnOnce(&PerCpuValues<'_>) -> R,
    ) -> Result<(R, bool)> {
        if !matches!(
            self.kind,
            Kind::Hash {
                percpu: true,
                lpm: false,
                ..
            }
        ) {
            return Err(err(libc::EINVAL, "not a per-CPU hash map"));
        }
        let cpus = self.fixed.ncpus as usize;
        let stride = round8(self.value_size());
        let value_size = self.value_size() as usize;
        hash::with_values(self, key, create, |base| {
            f(&PerCpuValues {
                base,
                cpus,
                stride,
                value_size,
                _lock: std::marker::PhantomData,
            })
        })
    }

    /// The value area of an array map, as `mmap` of a `BPF_F_MMAPABLE` array exposes it:
    /// (file offset, length).
    pub fn mmapable_region(&self) -> Option<(usize, usize)> {
        match self.kind {
            Kind::Array { percpu: false } if self.map_flags() & map_flags::MMAPABLE != 0 => Some((
                PAGE_SIZE,
                page_round(round8(self.value_size()) * self.max_entries() as usize),
            )),
            _ => None,
        }
    }

    /// Offsets of a ring buffer's consumer page, and of its producer page that
    /// is followed by the data (for `mmap` by a consumer).
    pub fn ringbuf_regions(&self) -> Option<(usize, usize, usize)> {
        (self.kind == Kind::Ringbuf).then_some((
            ringbuf::CONSUMER_OFFSET,
            ringbuf::PRODUCER_OFFSET,
            self.ring_size() as usize,
        ))
    }

    /// Clears the pending wake-up flag of a ring buffer; a consumer calls this
    /// after draining the FIFO, so that a producer's byte written after the clear is
    /// never drained unseen.
    pub fn ringbuf_clear_wakeup(&self) {
        self.header()
            .wakeup_pending
            .store(0, std::sync::atomic::Ordering::SeqCst);
    }

    /// Opens, non-blocking, the FIFO a ring buffer's producers write a byte into to wake
    /// consumers; None for other maps.
    pub fn open_wakeup_fifo(&self) -> Option<Result<File>> {
        (self.kind == Kind::Ringbuf)
            .then(|| crate::store::open_fifo(&self.dir, &crate::store::map_fifo_name(self.id)))
    }

    /// Maps of maps: the shape every inner map must have.
    pub fn inner_template(&self) -> Option<InnerTemplate> {
        matches!(self.kind, Kind::MapArray | Kind::MapHash).then_some(self.fixed.inner)
    }

    /// What a map offers as the template of a map of maps' inner maps: its shape, or
    /// the kernel's refusal (`EINVAL` for a map of maps, since maps nest one level
    /// deep; `ENOTSUPP` for a prog_array).
    pub fn as_inner_template(&self) -> Result<InnerTemplate> {
        match self.kind {
            Kind::MapArray | Kind::MapHash => Err(err(
                libc::EINVAL,
                "a map of maps cannot be an inner map (maps nest one level deep)",
            )),
            _ if self.map_type() == map_type::PROG_ARRAY => {
                Err(err(ENOTSUPP, "a prog_array cannot be an inner map"))
            }
            _ => Ok(InnerTemplate {
                map_type: self.map_type(),
                key_size: self.key_size(),
                value_size: self.value_size(),
                max_entries: self.max_entries(),
                map_flags: self.map_flags(),
                _pad: 0,
            }),
        }
    }

    /// `BPF_MAP_UPDATE_ELEM` on a map of maps, whose value is the file descriptor of
    /// `inner`: the map must have the template's type, key and value sizes and flags,
    /// and for arrays its number of entries too (unless the template has
    /// `BPF_F_INNER_MAP`); the outer map then holds its id.
    pub fn set_inner(&self, key: &[u8], inner: &Map, flags: u64) -> Result<()> {
        let Some(t) = self.inner_template() else {
            return Err(err(libc::EINVAL, "not a map of maps"));
        };
        self.check_syscall_write()?;
        self.check_key(key)?;
        let shape = inner
            .as_inner_template()
            .map_err(|e| err(libc::EINVAL, e.to_string()))?;
        let arrays = matches!(
            map_type::served_as(t.map_type),
            map_type::ARRAY
                | map_type::PERCPU_ARRAY
                | map_type::CGROUP_ARRAY
                | map_type::PERF_EVENT_ARRAY
        );
        let sized = t.map_flags & map_flags::INNER_MAP != 0
            || !arrays
            || shape.max_entries == t.max_entries;
        if (
            shape.map_type,
            shape.key_size,
            shape.value_size,
            shape.map_flags,
        ) != (t.map_type, t.key_size, t.value_size, t.map_flags)
            || !sized
        {
            return Err(err(
                libc::EINVAL,
                format!(
                    "inner map {} (type {}, key {}, value {}, max_entries {}, flags {:#x}) does not match the template (type {}, key {}, value {}, max_entries {}, flags {:#x})",
                    inner.id(), shape.map_type, shape.key_size, shape.value_size, shape.max_entries, shape.map_flags,
                    t.map_type, t.key_size, t.value_size, t.max_entries, t.map_flags
                ),
            ));
        }
        let id = inner.id().to_ne_bytes();
        match self.kind {
            Kind::MapArray => array::set_id(self, key, inner.id(), flags),
            _ => hash::update(self, key, id.as_ptr(), flags, true),
        }
    }

    /// The id of the inner map at `key`, if any.
    ///
    /// # Safety
    /// `key` must point to `key_size` readable bytes.
    unsafe fn inner_id(&self, key: *const u8) -> Option<u32> {
        match self.kind {
            Kind::MapArray => {
                // SAFETY: caller obligation: a 4-byte key.
                let idx = unsafe { std::ptr::read_unaligned(key.cast::<u32>()) };
                array::id_at(self, idx)
            }
            Kind::MapHash => {
                // SAFETY: forwarded caller obligation.
                let v = unsafe { hash::find_value(self, key) };
                // SAFETY: values of a hash of maps are 4-byte ids, 8-byte aligned.
                (!v.is_null()).then(|| unsafe { std::ptr::read_volatile(v.cast::<u32>()) })
            }
            _ => None,
        }
    }

    /// This process's handle on inner map `id`, opened on first use.
    fn inner_handle(&self, id: u32) -> Option<Arc<Map>> {
        if let Some(m) = self
            .inner_maps
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
        {
            return Some(m.clone());
        }
        let m = match Map::open_in(&self.dir, id) {
            Ok(m) => Arc::new(m),
            Err(e) => {
                tracing::warn!(outer = self.id, inner = id, "cannot open inner map: {e}");
                return None;
            }
        };
        let mut maps = self.inner_maps.write().unwrap_or_else(|p| p.into_inner());
        Some(maps.entry(id).or_insert(m).clone())
    }

    // ----- program side -----

    /// `bpf_map_lookup_elem` from a program: a pointer into the map, or null.
    ///
    /// # Safety
    /// `key` must point to `key_size` readable bytes.
    pub unsafe fn prog_lookup(&self, key: *const u8) -> *mut u8 {
        match self.kind {
            // SAFETY: forwarded caller obligation.
            Kind::Array { percpu } => unsafe { array::prog_lookup(self, key, percpu) },
            // SAFETY: forwarded caller obligation.
            Kind::Hash { lpm: true, .. } => unsafe { lpm::prog_lookup(self, key) },
            Kind::Hash { percpu, .. } => {
                // SAFETY: forwarded caller obligation.
                let v = unsafe { hash::find_value(self, key) };
                if v.is_null() || !percpu {
                    v
                } else {
                    let cpu = current_cpu(self.fixed.ncpus);
                    // SAFETY: per-CPU values hold ncpus slots.
                    unsafe { v.add(cpu * round8(self.value_size())) }
                }
            }
            Kind::MapArray | Kind::MapHash => {
                // SAFETY: forwarded caller obligation.
                let id = unsafe { self.inner_id(key) };
                id.and_then(|id| self.inner_handle(id))
                    .map_or(std::ptr::null_mut(), |m| Arc::as_ptr(&m) as *mut u8)
            }
            // A per-thread array's values are GPU threads'; a CPU program is none of
            // them, and finds nothing (its updates fail: EINVAL below).
            Kind::ThreadArray => std::ptr::null_mut(),
            _ => std::ptr::null_mut(),
        }
    }

    /// `bpf_map_update_elem` from a program.
    ///
    /// # Safety
    /// `key` and `value` must point to `key_size` and `value_size` readable bytes.
    pub unsafe fn prog_update(&self, key: *const u8, value: *const u8, flags: u64) -> i64 {
        let r = match self.kind {
            Kind::Array { percpu } => {
                // SAFETY: forwarded caller obligation.
                let k = unsafe { std::slice::from_raw_parts(key, self.key_size() as usize) };
                array::prog_update(self, k, value, flags, percpu)
            }
            Kind::Hash { lpm: true, .. } => lpm::update(
                self,
                // SAFETY: forwarded caller obligation.
                unsafe { std::slice::from_raw_parts(key, self.key_size() as usize) },
                value,
                flags,
                false,
            ),
            // SAFETY: forwarded caller obligation.
            Kind::Hash { .. } => hash::update(
                self,
                unsafe { std::slice::from_raw_parts(key, self.key_size() as usize) },
                value,
                flags,
                false,
            ),
            Kind::Queue | Kind::Stack => queue::push(self, value, flags),
            _ => Err(err(libc::EINVAL, "not updatable from a program")),
        };
        errno_result(r)
    }

    /// `bpf_map_delete_elem` from a program.
    ///
    /// # Safety
    /// `key` must point to `key_size` readable bytes.
    pub unsafe fn prog_delete(&self, key: *const u8) -> i64 {
        errno_result(match self.kind {
            Kind::Hash { lpm: true, .. } => lpm::delete(
                self,
                // SAFETY: forwarded caller obligation.
                unsafe { std::slice::from_raw_parts(key, self.key_size() as usize) },
            ),
            Kind::Hash { .. } => hash::delete(self, key),
            Kind::Array { .. } => Err(err(libc::EINVAL, "array")),
            _ => Err(err(libc::EINVAL, "not deletable")),
        })
    }

    /// `bpf_task_storage_get`: the value of `task` (a token of
    /// [`current_task`](crate::helpers)), created when `flags` asks; null otherwise.
    ///
    /// # Safety
    /// `task` is null or a task token; `init` is null or points to `value_size`
    /// readable bytes.
    pub unsafe fn prog_task_storage_get(&self, task: u64, init: *const u8, flags: u64) -> *mut u8 {
        if self.kind != Kind::LocalStorage(local_storage::Owner::Task) {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded caller obligation.
        unsafe { local_storage::prog_get(self, task as *const _, init, flags) }
    }

    /// `bpf_task_storage_delete`.
    ///
    /// # Safety
    /// `task` is null or a task token.
    pub unsafe fn prog_task_storage_delete(&self, task: u64) -> i64 {
        if self.kind != Kind::LocalStorage(local_storage::Owner::Task) {
            return -(libc::EINVAL as i64);
        }
        // SAFETY: forwarded caller obligation.
        errno_result(unsafe { local_storage::prog_delete(self, task as *const _) })
    }

    /// `bpf_map_push_elem`.
    ///
    /// # Safety
    /// `value` must point to `value_size` readable bytes.
    pub unsafe fn prog_push(&self, value: *const u8, flags: u64) -> i64 {
        errno_result(match self.kind {
            Kind::Queue | Kind::Stack => queue::push(self, value, flags),
            Kind::Bloom => {
                // SAFETY: forwarded caller obligation.
                let v = unsafe { std::slice::from_raw_parts(value, self.value_size() as usize) };
                bloom::push(self, v, flags)
            }
            _ => Err(err(libc::EINVAL, "not a queue or stack")),
        })
    }

    /// `bpf_map_pop_elem` (`delete` true) and `bpf_map_peek_elem`.
    ///
    /// # Safety
    /// `value` must point to `value_size` writable bytes.
    pub unsafe fn prog_pop(&self, value: *mut u8, delete: bool) -> i64 {
        errno_result(match self.kind {
            Kind::Queue | Kind::Stack if delete => queue::pop(self, value),
            Kind::Queue | Kind::Stack => {
                // SAFETY: forwarded caller obligation.
                let v =
                    unsafe { std::slice::from_raw_parts_mut(value, self.value_size() as usize) };
                queue::peek(self, v)
            }
            // A bloom filter's peek reads the value it tests (the kernel's too).
            Kind::Bloom if !delete => {
                // SAFETY: forwarded caller obligation.
                let v = unsafe { std::slice::from_raw_parts(value, self.value_size() as usize) };
                bloom::peek(self, v)
            }
            _ => Err(err(libc::EINVAL, "not a queue or stack")),
        })
    }

    /// `bpf_get_stackid`'s second half: files the frames `ips` (skipped frames
    /// already dropped, at most `value_size / 8` of them) and returns the
    /// trace's id, or a negative errno (`-EEXIST` when another trace holds the
    /// id and `BPF_F_REUSE_STACKID` is not set, `-ENOMEM` when the map is full).
    pub fn stack_trace_file(&self, ips: &[u64], flags: u64) -> i64 {
        if self.kind != Kind::StackTrace {
            return -(libc::EINVAL as i64);
        }
        let ips = &ips[..ips.len().min(self.value_size() as usize / 8)];
        stack_trace::file_trace(self, ips, flags)
    }

    /// `bpf_perf_event_output` on a perf_event_array: writes `data` to the ring
    /// of the event at `flags & BPF_F_INDEX_MASK` (or the current CPU's).
    pub fn perf_event_output(&self, flags: u64, data: &[u8]) -> i64 {
        if self.map_type() == map_type::GPU_RINGBUF {
            return self.gpu_ring_output(data);
        }
        let ring = match self.perf_event_ring(flags) {
            Ok(r) => r,
            Err(e) => return e,
        };
        if !ring.output(data) {
            return -(libc::ENOSPC as i64);
        }
        ring.wake();
        0
    }

    /// A record offered to a ring buffer (`flags` 0) or a perf event array (`flags` as
    /// `bpf_perf_event_output`'s) by a producer that keeps what does not fit and offers
    /// it again: GPU records, which reach the host in bursts. Unlike the helpers, a full
    /// ring counts no drop or loss for it.
    pub fn offer_record(&self, flags: u64, data: &[u8]) -> RecordOffer {
        if self.kind != Kind::Ringbuf {
            return match self.perf_event_ring(flags) {
                Ok(ring) => {
                    let offer = ring.try_output(data);
                    if offer == RecordOffer::Taken {
                        ring.wake();
                    }
                    offer
                }
                Err(e) => RecordOffer::Refused(e),
            };
        }
        if flags != 0
            || ringbuf::record_len(data.len() as u64) > u64::from(self.ring_size())
            || !self.fits_gpu_record(data.len())
        {
            return RecordOffer::Refused(-(libc::E2BIG as i64));
        }
        // SAFETY: `data` is a slice of its length.
        if unsafe { ringbuf::output(self, data.as_ptr(), data.len() as u64, 0, false) } {
            RecordOffer::Taken
        } else {
            RecordOffer::Full
        }
    }

    /// Counts `n` records a producer dropped before they reached this map (a GPU's ring,
    /// full): a perf event array's as lost records of the ring `flags` names (as
    /// [`Map::offer_record`]'s), which its consumer reads before that ring's next sample;
    /// a ring buffer's, or where `flags` names no open ring, in the map's drop count.
    pub fn count_lost_records(&self, flags: u64, n: u64) {
        match self.perf_event_ring(flags) {
            Ok(ring) => ring.count_lost(n),
            Err(_) => self.count_dropped(n),
        }
    }

    /// The ring of the perf event `flags` names (`BPF_F_INDEX_MASK`, or the current
    /// CPU's), or the helper's error.
    fn perf_event_ring(&self, flags: u64) -> Result<std::sync::Arc<crate::PerfRing>, i64> {
        use bpftime_isa::uapi::{F_CURRENT_CPU, F_INDEX_MASK};
        if self.map_type() != map_type::PERF_EVENT_ARRAY || flags & !F_INDEX_MASK != 0 {
            return Err(-(libc::EINVAL as i64));
        }
        let index = if flags & F_INDEX_MASK == F_CURRENT_CPU {
            current_cpu(self.fixed.ncpus) as u32
        } else {
            (flags & F_INDEX_MASK) as u32
        };
        if index >= self.max_entries() {
            return Err(-(libc::E2BIG as i64));
        }
        let Some(event) = self.id_at(index) else {
            return Err(-(libc::ENOENT as i64));
        };
        let mut rings = self.perf_rings.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = rings.get(&event) {
            return Ok(r.clone());
        }
        let r = std::sync::Arc::new(
            crate::PerfRing::open_in(&self.dir, event).map_err(|_| -(libc::ENOENT as i64))?,
        );
        rings.insert(event, r.clone());
        Ok(r)
    }

    /// `bpf_perf_event_output` on a GPU ring buffer (bpftime's way to write one): the
    /// record as it is (no perf header: a consumer gets the bytes and their size), of
    /// at most the map's `value_size` bytes (bpftime's slot; -E2BIG past it); the flags
    /// mean nothing. -ENOSPC, counted as a drop, when the ring is full.
    fn gpu_ring_output(&self, data: &[u8]) -> i64 {
        if !self.fits_gpu_record(data.len()) || data.is_empty() {
            return -(libc::E2BIG as i64);
        }
        // SAFETY: `data` is a slice of its length.
        if unsafe { ringbuf::output(self, data.as_ptr(), data.len() as u64, 0, true) } {
            0
        } else {
            -(libc::ENOSPC as i64)
        }
    }

    /// Whether a record of `len` bytes fits this map's records: any, except in a GPU ring
    /// buffer, whose records are at most its `value_size` bytes.
    fn fits_gpu_record(&self, len: usize) -> bool {
        self.map_type() != map_type::GPU_RINGBUF || len <= self.value_size() as usize
    }

    /// `bpf_ringbuf_reserve`: a record of `size` bytes, or null when the ring is full.
    pub fn ringbuf_reserve(&self, size: u64, flags: u64) -> *mut u8 {
        if self.kind != Kind::Ringbuf {
            return std::ptr::null_mut();
        }
        ringbuf::reserve(self, size, flags)
    }

    /// `bpf_ringbuf_output`.
    ///
    /// # Safety
    /// `data` must point to `size` readable bytes.
    pub unsafe fn ringbuf_output(&self, data: *const u8, size: u64, flags: u64) -> i64 {
        if self.kind != Kind::Ringbuf {
            return -(libc::EINVAL as i64);
        }
        // SAFETY: `data` is readable for `size` bytes per the caller.
        if unsafe { ringbuf::output(self, data, size, flags, true) } {
            0
        } else {
            -(libc::EAGAIN as i64)
        }
    }

    /// `bpf_ringbuf_query`.
    pub fn ringbuf_query(&self, flags: u64) -> u64 {
        if self.kind != Kind::Ringbuf {
            return 0;
        }
        ringbuf::query(self, flags)
    }

    /// Reads the submitted records of a ring buffer in order, as a consumer.
    pub fn ringbuf_drain(&self, f: impl FnMut(&[u8])) -> usize {
        if self.kind != Kind::Ringbuf {
            return 0;
        }
        ringbuf::drain(self, f)
    }

    /// [`Map::ringbuf_drain`] for a consumer that may have no room: it stops at the
    /// first record `f` declines, which stays first in the ring.
    pub fn ringbuf_drain_while(&self, f: impl FnMut(&[u8]) -> bool) -> usize {
        if self.kind != Kind::Ringbuf {
            return 0;
        }
        ringbuf::drain_while(self, f)
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        if self.fifo.is_some() {
            ringbuf::unregister_waker(self.mapping.base() as usize);
        }
    }
}

/// `bpf_ringbuf_submit` / `bpf_ringbuf_discard`.
///
/// # Safety
/// `rec` must be a record reserved from a ring buffer this process has open,
/// not yet submitted or discarded.
pub unsafe fn ringbuf_commit(rec: *mut u8, flags: u64, discard: bool) {
    // SAFETY: forwarded caller obligation.
    unsafe { ringbuf::commit(rec, flags, discard) }
}

use std::os::fd::AsRawFd;

/// The kernel's name of a map type, for messages about types bpftime lacks.
fn type_name(t: u32) -> &'static str {
    const NAMES: [&str; 34] = [
        "unspec",
        "hash",
        "array",
        "prog_array",
        "perf_event_array",
        "percpu_hash",
        "percpu_array",
        "stack_trace",
        "cgroup_array",
        "lru_hash",
        "lru_percpu_hash",
        "lpm_trie",
        "array_of_maps",
        "hash_of_maps",
        "devmap",
        "sockmap",
        "cpumap",
        "xskmap",
        "sockhash",
        "cgroup_storage",
        "reuseport_sockarray",
        "percpu_cgroup_storage",
        "queue",
        "stack",
        "sk_storage",
        "devmap_hash",
        "struct_ops",
        "ringbuf",
        "inode_storage",
        "task_storage",
        "bloom_filter",
        "user_ringbuf",
        "cgrp_storage",
        "arena",
    ];
    NAMES.get(t as usize).copied().unwrap_or("unknown")
}

fn array_index(key: &[u8]) -> Result<u32> {
    key.try_into()
        .map(u32::from_ne_bytes)
        .map_err(|_| err(libc::EINVAL, "key size mismatch"))
}

pub(crate) use local_storage::current_task;

/// The kernel-internal ENOTSUPP, which `bpf()` hands to user space as is.
pub const ENOTSUPP: i32 = 524;

fn errno_result(r: Result<()>) -> i64 {
    match r {
        Ok(()) => 0,
        Err(e) => -(e.errno() as i64),
    }
}

/// Sizes of a map's data, fixed at creation.
struct Layout {
    file_len: usize,
    nbuckets: u32,
    nelems: u32,
    elem_size: u32,
}

/// The most data one map may hold: every process that uses a map maps its file whole.
const MAX_MAP_DATA: usize = 1 << 36;

/// `E2BIG` for a map whose data would pass [`MAX_MAP_DATA`], saying so.
fn too_large() -> Error {
    err(
        libc::E2BIG,
        format!(
            "it would hold more than bpftime's limit of {} GiB of data per map (make max_entries or the value smaller)",
            MAX_MAP_DATA >> 30
        ),
    )
}

/// Whether maps of type `t` are made for a number of GPU threads.
fn uses_gpu_threads(t: u32) -> bool {
    map_type::is_per_gpu_thread(t) || t == map_type::GPU_RINGBUF
}

/// The GPU thread count a map of `spec` is made for, as bpftime makes it: the
/// `BPFTIME_MAP_GPU_THREAD_COUNT` of this process's environment, else 1024; a non-zero
/// `map_extra` names it instead (ours: bpftime passes map_extra on and ignores it). 0
/// for maps that are made for no threads.
fn gpu_thread_count(spec: &MapSpec) -> Result<u32> {
    use bpftime_isa::uapi::gpu_threads::{DEFAULT, ENV};
    if !uses_gpu_threads(spec.map_type) {
        return Ok(0);
    }
    let bad = |what: String| {
        err(
            libc::EINVAL,
            format!(
                "{what}: a GPU map's thread count is a number from 1 to {}",
                u32::MAX
            ),
        )
    };
    if spec.map_extra != 0 {
        return u32::try_from(spec.map_extra)
            .map_err(|_| bad(format!("map_extra {}", spec.map_extra)));
    }
    match std::env::var(ENV) {
        Ok(v) => match v.trim().parse::<u32>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(bad(format!("{ENV}={v:?}"))),
        },
        Err(_) => Ok(DEFAULT),
    }
}

/// The bytes of a GPU ring buffer's ring: room for `max_entries` records of up to
/// `value_size` bytes for each of `threads` threads (bpftime gives every thread a ring of
/// `max_entries` such records; here the threads share one ring of as many bytes), rounded
/// up to a power of two of at least a page, as a ring buffer's size is. `None` past the
/// largest ring (2^31 bytes).
pub(crate) fn gpu_ring_size(max_entries: u32, value_size: u32, threads: u32) -> Option<u32> {
    let record = ringbuf::record_len(u64::from(value_size));
    let bytes = record
        .checked_mul(u64::from(max_entries))?
        .checked_mul(u64::from(threads))?
        .max(PAGE_SIZE as u64)
        .checked_next_power_of_two()?;
    (bytes <= 1 << 31).then_some(bytes as u32)
}

impl Layout {
    /// The layout of a map of `kind` for `s`; `gpu_threads` is the GPU thread count a
    /// per-thread array or a GPU ring buffer is made for (see [`gpu_thread_count`]).
    fn compute(kind: Kind, s: &MapSpec, gpu_threads: u32) -> Result<Layout> {
        let inval = |what: &str| err(libc::EINVAL, what.to_string());
        if let Kind::LocalStorage(_) = kind {
            local_storage::check_spec(s)?;
        } else if s.max_entries == 0 {
            return Err(inval("max_entries must be positive"));
        }
        let ncpus = possible_cpus() as usize;
        let ncpus_u32 = ncpus as u32;
        // A map of maps is laid out as the map of ids it is.
        let kind = match kind {
            Kind::MapArray | Kind::MapHash => {
                if s.value_size != 4 || s.inner.is_none() {
                    return Err(inval(
                        "maps of maps hold 4-byte values and need an inner map template",
                    ));
                }
                let array = kind == Kind::MapArray;
                let allowed = map_flags::NUMA_NODE
                    | map_flags::RDONLY
                    | map_flags::WRONLY
                    | if array { 0 } else { map_flags::NO_PREALLOC };
                if s.map_flags & !allowed != 0 {
                    return Err(inval("flags not allowed on a map of maps"));
                }
                if array {
                    Kind::IdArray
                } else {
                    Kind::Hash {
                        percpu: false,
                        lru: false,
                        lpm: false,
                    }
                }
            }
            k => k,
        };
        let (data, nbuckets, nelems, elem_size) = match kind {
            Kind::Array { percpu } => {
                if s.key_size != 4 || s.value_size == 0 {
                    return Err(inval("arrays need a 4-byte key and a non-empty value"));
                }
                if percpu && s.map_flags & map_flags::MMAPABLE != 0 {
                    return Err(inval("per-CPU arrays cannot be mmapable"));
                }
                let copies = if percpu { ncpus } else { 1 };
                let len = round8(s.value_size)
                    .checked_mul(copies)
                    .and_then(|v| v.checked_mul(s.max_entries as usize))
                    .ok_or_else(too_large)?;
                (len, 0, 0, 0)
            }
            Kind::ThreadArray => {
                if s.key_size != 4 || s.value_size == 0 {
                    return Err(inval("arrays need a 4-byte key and a non-empty value"));
                }
                if s.map_flags & map_flags::MMAPABLE != 0 {
                    return Err(inval("per-thread arrays cannot be mmapable"));
                }
                let len = round8(s.value_size)
                    .checked_mul(gpu_threads as usize)
                    .and_then(|v| v.checked_mul(s.max_entries as usize))
                    .ok_or_else(too_large)?;
                (len, 0, gpu_threads, 0)
            }
            Kind::Ringbuf if s.map_type == map_type::GPU_RINGBUF => {
                if s.value_size == 0 {
                    return Err(inval(
                        "a GPU ring buffer's value is its largest record, which must not be empty",
                    ));
                }
                let ring = gpu_ring_size(s.max_entries, s.value_size, gpu_threads)
                    .ok_or_else(too_large)?;
                (
                    ringbuf::DATA_OFFSET - PAGE_SIZE + ring as usize,
                    ring,
                    gpu_threads,
                    0,
                )
            }
            Kind::IdArray => {
                if s.key_size != 4 || s.value_size != 4 {
                    return Err(inval(
                        "prog_array, perf_event_array and cgroup_array need 4-byte keys and values",
                    ));
                }
                (4 * s.max_entries as usize, 0, 0, 0)
            }
            Kind::Hash { percpu, lru, lpm } => {
                if s.key_size == 0 || s.value_size == 0 {
                    return Err(inval("hash maps need non-empty keys and values"));
                }
                if lpm
                    && (!(5..=4 + 256).contains(&s.key_size)
                        || s.value_size > 0xffff
                        || s.max_entries == 0
                        || s.map_flags & map_flags::NO_PREALLOC == 0
                        || s.map_extra != 0)
                {
                    return Err(inval(
                        "LPM tries need BPF_F_NO_PREALLOC, a key of a 4-byte prefix length and 1-256 data bytes, and max_entries > 0",
                    ));
                }
                let copies = if percpu { ncpus } else { 1 };
                let elem = hash::ELEM_HEADER + round8(s.key_size) + round8(s.value_size) * copies;
                // Spare elements let an update of an existing key publish the new
                // value before retiring the old one, as the kernel's preallocated maps do.
                let nelems = if lru {
                    s.max_entries
                } else {
                    s.max_entries.saturating_add(ncpus as u32)
                };
                let nbuckets = s
                    .max_entries
                    .checked_next_power_of_two()
                    .ok_or_else(too_large)?;
                let len = hash::elems_offset(nbuckets)
                    .checked_add(elem.checked_mul(nelems as usize).ok_or_else(too_large)?)
                    .ok_or_else(too_large)?;
                (len, nbuckets, nelems, elem as u32)
            }
            Kind::Queue | Kind::Stack => {
                if s.key_size != 0 || s.value_size == 0 {
                    return Err(inval("queues and stacks take no key and a non-empty value"));
                }
                ((s.max_entries as usize + 1) * round8(s.value_size), 0, 0, 0)
            }
            Kind::Bloom => {
                if s.key_size != 0 || s.value_size == 0 || s.max_entries == 0 {
                    return Err(inval(
                        "bloom filters take no key, a non-empty value and max_entries > 0",
                    ));
                }
                let (_, bits) = bloom::shape(s.max_entries, s.map_extra)?;
                (bloom::bytes(bits), 0, 0, 0)
            }
            Kind::StackTrace => {
                use map_flags::{NUMA_NODE, RDONLY, STACK_BUILD_ID, WRONLY};
                if s.map_flags & !(NUMA_NODE | RDONLY | WRONLY | STACK_BUILD_ID) != 0 {
                    return Err(inval("unknown flags for a stack trace map"));
                }
                if s.map_flags & STACK_BUILD_ID != 0 {
                    return Err(err(
                        libc::EOPNOTSUPP,
                        "stack trace maps with BPF_F_STACK_BUILD_ID are not supported by bpftime; file plain addresses (no flag)",
                    ));
                }
                if s.key_size != 4 || s.value_size < 8 || !s.value_size.is_multiple_of(8) {
                    return Err(inval(
                        "stack trace maps need a 4-byte key and a value of whole 8-byte frames",
                    ));
                }
                if s.value_size / 8 > stack_trace::MAX_STACK_DEPTH {
                    return Err(inval(
                        "stack trace value is deeper than the 127-frame limit",
                    ));
                }
                let nbuckets = stack_trace::buckets_for(s.max_entries);
                if nbuckets == 0 {
                    return Err(too_large());
                }
                let len = (nbuckets as usize)
                    .checked_mul(stack_trace::slot_size(s.value_size))
                    .ok_or_else(too_large)?;
                (len, nbuckets, 0, 0)
            }
            Kind::MapArray | Kind::MapHash => unreachable!("mapped to their layouts above"),
            Kind::Inert { .. } => {
                use map_flags::{NUMA_NODE, RDONLY, RDONLY_PROG, WRONLY};
                let t = s.map_type;
                let hash = t == map_type::SOCKHASH;
                let key_ok = hash && s.key_size > 0 || s.key_size == 4;
                let value_ok = match t {
                    map_type::XSKMAP => s.value_size == 4,
                    _ => s.value_size == 4 || s.value_size == 8,
                };
                let allowed = NUMA_NODE
                    | match t {
                        map_type::CPUMAP => 0,
                        map_type::REUSEPORT_SOCKARRAY => RDONLY | WRONLY | RDONLY_PROG,
                        _ => RDONLY | WRONLY,
                    };
                if !key_ok || !value_ok || s.map_flags & !allowed != 0 {
                    return Err(inval(
                        "socket, device and CPU maps take a 4-byte key (any for a sockhash), a 4- or 8-byte value (4 for an xskmap) and no flags but read/write ones",
                    ));
                }
                (0, 0, 0, 0)
            }
            Kind::LocalStorage(_) => {
                let cap = local_storage::CAPACITY;
                let elem = hash::ELEM_HEADER
                    + round8(local_storage::KEY_SIZE as u32)
                    + round8(s.value_size);
                // Spares for replacing values, as for hash maps.
                let nelems = cap + ncpus_u32;
                let nbuckets = cap.next_power_of_two();
                let len = hash::elems_offset(nbuckets) + elem * nelems as usize;
                (len, nbuckets, nelems, elem as u32)
            }
            Kind::Ringbuf => {
                if s.key_size != 0 || s.value_size != 0 {
                    return Err(inval("ring buffers take no key and no value"));
                }
                if !s.max_entries.is_power_of_two()
                    || !(s.max_entries as usize).is_multiple_of(PAGE_SIZE)
                {
                    return Err(inval(
                        "ring buffer size must be a power of 2 and a multiple of the page size",
                    ));
                }
                (
                    ringbuf::DATA_OFFSET - PAGE_SIZE + s.max_entries as usize,
                    0,
                    0,
                    0,
                )
            }
        };
        if data > MAX_MAP_DATA {
            return Err(too_large());
        }
        Ok(Layout {
            file_len: PAGE_SIZE + page_round(data.max(1)),
            nbuckets,
            nelems,
            elem_size,
        })
    }
}

#[cfg(test)]
mod gpu_tests;
#[cfg(test)]
mod tests;
