//! Maps with the kernel's semantics, in store files that every process maps.
//!
//! Each map type keeps its data after the header page; the syscall side
//! (`lookup`, `update`, ...) copies values the way `bpf()` does, and the
//! program side (`prog_*`) works on raw pointers the way helpers do.
//!
//! Perf event rings ([`PerfRing`]) live here too, as a perf event array's outputs land
//! in them, and so does collection of unreferenced objects ([`collect_garbage`]), which
//! reads the references held in program and perf event arrays.

pub use garbage::collect_garbage;
pub use perfbuf::PerfRing;

mod array;
mod bloom;
mod cow_table;
mod garbage;
mod hash;
mod lifecycle;
mod local_storage;
mod lpm;
mod perfbuf;
mod program_side;
mod queue;
mod records;
mod ringbuf;
pub mod stack_trace;
mod syscall_side;
mod thread_array;

use bpftime_isa::uapi::{map_flags, map_type};
use bpftime_store::cpu::possible_cpus;
use bpftime_store::cpu_slots::current_cpu;
use bpftime_store::layout::{InnerTemplate, MapHeader, ObjectKind, PAGE_SIZE};
use bpftime_store::lock;
use bpftime_store::mapping::Mapping;
use bpftime_store::store_dir::StoreDir;
use bpftime_store::{new_object_header, Damage, Error, Result, Store};
use cow_table::CowTable;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

pub(crate) fn round8(v: u32) -> usize {
    (v as usize + 7) & !7
}

fn page_round(v: usize) -> usize {
    (v + PAGE_SIZE - 1) & !(PAGE_SIZE - 1)
}

pub(crate) fn err(errno: i32, what: impl Into<std::borrow::Cow<'static, str>>) -> Error {
    Error::invalid(errno, what)
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
    /// Rings of the perf events a perf_event_array points at, opened on first output,
    /// by event id.
    perf_rings: CowTable<std::sync::Arc<crate::PerfRing>>,
    /// Maps of maps: this process's handles on the inner maps programs looked up, by id.
    /// A handle lives as long as the outer one, so the address a program got stays valid
    /// while the program (which holds the outer map) runs.
    inner_maps: CowTable<std::sync::Arc<Map>>,
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

pub use local_storage::current_task;

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
