//! Device replicas of store maps, one per map per CUDA context (docs/ARCHITECTURE.md decision 5): probes
//! read and write the replica in device memory; the host pushes what the CPU changed
//! before a launch and pulls what the GPU changed once a launch completes (and drains
//! rings while kernels run). The decisions are `device_maps`'s; this module moves bytes.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bpftime_isa::uapi::{map_type, F_CURRENT_CPU};
use bpftime_jit_ptx::ArrayMapLayout;
use bpftime_runtime::{Map, RecordOffer};

use crate::arena::Arena;
use crate::cuda::{Api, CudaError, DevicePtr, Handle};
use crate::device_maps::{
    add_deltas, compact_image, device_kind, device_map_type, drain_ring, encode_hash_ops,
    hash_capacity, is_per_cpu, lru_extra_bytes, needs_rebuild, ring_shards, round8, value_deltas,
    DeviceKind, DeviceRing, GpuMapDesc, HashImage, HashShape, NoReplica, PerCpuHashSync,
    RingRecord, ShardEntry, StoreChange, WordDelta, HASH_OPS_BYTES, HASH_OP_HEADER, RING_TAIL,
    SHARDED_ARRAY_MAX, SHARD_WINDOW_SPAN, SLOT_FULL,
};

mod mover;
mod ring_reader;

use mover::u32s_as_bytes;
pub use mover::{as_bytes, Mover, Pinned};
use ring_reader::perf_record;
pub use ring_reader::RingReader;

/// Why a replica could not be made or synced.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    #[error("map {name} (id {id}): {reason}")]
    Unsupported {
        id: u32,
        name: String,
        reason: NoReplica,
    },
    #[error(transparent)]
    Cuda(#[from] CudaError),
}

enum SyncState {
    Array {
        /// The values both sides held at the last sync, in the device's layout.
        shadow: Vec<u8>,
    },
    /// A per-CPU array: a value per key and SM on the device, per key and CPU in the
    /// store; SM `s`'s changes go to CPU `s % cpus`, CPU `c`'s to SM `c % sms`.
    PerCpuArray {
        /// The device's values at the last sync, in its layout (key-major, SM-minor).
        device: Vec<u8>,
        /// The store's values at the last sync, key-major, CPU-minor, `value_stride`
        /// apart.
        host: Vec<u8>,
        cpus: usize,
    },
    Hash {
        shape: HashShape,
        shadow: HashMap<Vec<u8>, Vec<u8>>,
    },
    /// A per-CPU hash map: a value per key and SM on the device; what each side changed
    /// crosses as additions (`PerCpuHashSync`), the CPU's through the hash ops kernel.
    PerCpuHash {
        shape: HashShape,
        sync: PerCpuHashSync,
        /// Device address of the u64 the ops kernel sets to the sequence number of the
        /// last ops it made.
        done: DevicePtr,
    },
    Ring(RingReader, Backlog),
}

/// Records read off a device ring that the store's ring had no room for yet. A GPU's
/// records reach the host in bursts (a launch's, read when it completes, or at a drain),
/// where the kernel's producers are paced by their CPUs; and a perf event array's records
/// go to the buffer of the CPU they name, which for all of a burst's `BPF_F_CURRENT_CPU`
/// records is the one our reading thread runs on. Dropping what does not fit would lose
/// records a consumer that keeps reading would have had (kernelretsnoop through a perf
/// event array, 8192 records: 6553 arrived in 4 runs of 6 on an H200's 16-CPU host, none
/// counted as lost). So they wait here, in order, and go first at the next read; only
/// past [`Backlog::most`] bytes, or when the process exits and the consumer stops making
/// room, are they given up, and counted as the store's ring counts what it drops.
#[derive(Debug, Default)]
pub struct Backlog {
    held: std::collections::VecDeque<RingRecord>,
    bytes: usize,
    most: usize,
}

impl Backlog {
    pub fn new(most: usize) -> Backlog {
        Backlog {
            most,
            ..Backlog::default()
        }
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Delivers what is held, then `new`, in order, until the store's ring is full; keeps
    /// the rest, up to `most` bytes, and gives up (`lose`) any record past that.
    pub fn offer(
        &mut self,
        new: Vec<RingRecord>,
        mut deliver: impl FnMut(&RingRecord) -> RecordOffer,
        mut lose: impl FnMut(&RingRecord),
    ) {
        while let Some(r) = self.held.front() {
            if deliver(r) == RecordOffer::Full {
                break;
            }
            self.bytes -= r.data.len();
            self.held.pop_front();
        }
        for r in new {
            if self.held.is_empty() && deliver(&r) != RecordOffer::Full {
                continue;
            }
            if self.bytes + r.data.len() > self.most {
                lose(&r);
                continue;
            }
            self.bytes += r.data.len();
            self.held.push_back(r);
        }
    }

    /// Gives up everything held.
    pub fn give_up(&mut self, mut lose: impl FnMut(&RingRecord)) {
        for r in self.held.drain(..) {
            lose(&r);
        }
        self.bytes = 0;
    }
}

/// What a push leaves for the launch's stream, before the launch.
#[derive(Default)]
pub struct Pushed {
    /// Additions to device words (the apply kernel).
    pub deltas: Vec<DeviceDelta>,
    /// Launches of the hash ops kernel.
    pub hash_ops: Vec<HashOpsLaunch>,
}

/// One launch of the hash ops kernel (device/hash_ops.c): its parameters.
pub struct HashOpsLaunch {
    /// The table's `GpuMapDesc`.
    pub map: DevicePtr,
    /// Where it writes `seq` when done.
    pub done: DevicePtr,
    pub seq: u64,
    /// [`HASH_OPS_BYTES`] of ops, `count` of them.
    pub ops: Vec<u8>,
    pub count: u32,
}

/// One map's replica in one context.
pub struct Replica {
    pub map: Arc<Map>,
    pub kind: DeviceKind,
    /// Device address of its [`GpuMapDesc`]: what the probe's `lddw map` loads.
    pub desc_addr: DevicePtr,
    pub desc: GpuMapDesc,
    /// Its per-SM copies, for a sharded array.
    pub shards: Option<ShardEntry>,
    /// The store map's update count the device last took in (a push, or a pull that
    /// only wrote the device's own values), read without the lock: a launch must not
    /// wait for a pull just to learn that nothing changed.
    seen_updates: AtomicU64,
    /// Set by a pull that found a hash table's deleted slots piling up (the device never
    /// reuses them, see `needs_rebuild`): before the next launch, once the launches before
    /// it in its stream are done, the table is laid out anew ([`Replica::compact`]).
    compact: AtomicBool,
    /// How often an array's shadow changed other than by [`Replica::pull_taken`]: a push
    /// that wrote the device, or a whole pull. A copy queued before one is not applied
    /// ([`Replica::pull_taken`]): it lacks what the push added, or is older than what the
    /// pull took in, and its difference from the shadow would take that out of the store.
    shadow_changes: AtomicU64,
    /// An array's staging memory, `None` where page-locked memory was refused.
    staging: std::sync::OnceLock<Option<Pinned>>,
    /// A ring's records the device dropped for want of room, not yet said
    /// ([`Replica::take_device_dropped`]).
    device_dropped: AtomicU64,
    state: Mutex<SyncState>,
}

/// An array's values being read from the device without its lock, into its staging
/// memory ([`Replica::take_copy`]), to be applied under it ([`Replica::pull_taken`]).
pub struct PullCopy {
    shadow_changes: u64,
}

/// A context's shard window (see `SHARD_WINDOW_SPAN`): made on first use, its arrays'
/// values handed out from its start.
pub struct ShardWindow {
    copies: u32,
    state: Mutex<WindowState>,
}

#[derive(Default)]
struct WindowState {
    base: Option<DevicePtr>,
    used: u64,
    /// The window could not be made: arrays go unsharded.
    unavailable: bool,
}

impl ShardWindow {
    /// A window with a copy per SM of a device of `sm_count` SMs (rounded up to a power
    /// of two: `%smid` is masked, not divided).
    pub fn new(sm_count: u32) -> ShardWindow {
        ShardWindow {
            copies: sm_count.max(1).next_power_of_two(),
            state: Mutex::new(WindowState::default()),
        }
    }

    /// Room for `len` bytes of an array's values (zeroed; the caller writes them) with
    /// its copies: the array's shard entry, or `None` when the window is full or cannot
    /// be made, and the array goes unsharded.
    pub fn place(&self, mover: &Mover<'_>, len: u64) -> Option<ShardEntry> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let at = state.used.div_ceil(256) * 256;
        if state.unavailable || at + len > SHARD_WINDOW_SPAN {
            return None;
        }
        let base = match state.base {
            Some(base) => base,
            None => {
                let bytes = (SHARD_WINDOW_SPAN * (1 + 2 * u64::from(self.copies))) as usize;
                let made = mover
                    .alloc(bytes)
                    .and_then(|b| mover.zero(b, bytes).map(|()| b));
                match made {
                    Ok(base) => *state.base.insert(base),
                    Err(e) => {
                        tracing::debug!(bytes, "small arrays go unsharded: {e}");
                        state.unavailable = true;
                        return None;
                    }
                }
            }
        };
        state.used = at + len;
        Some(ShardEntry::in_window(base + at, len, self.copies))
    }
}

/// Default size of the device ring of a perf event array (the kernel's rings are per
/// CPU, sized by the consumer; ours is one ring the host splits by CPU index). It is
/// split in shards by SM ([`ring_shards`]), and a launch's records arrive all at once: at
/// 1 MiB (16 shards of 64 KiB on an H200), a launch of 65536 threads with a record each
/// lost two in three of them. 16 MiB is 128 KiB a shard: several such launches.
pub const PERF_RING_BYTES: u64 = 1 << 24;

impl Replica {
    /// Makes the replica of `map` with the store's current contents, for a device of
    /// `sm_count` SMs: a per-CPU array keeps a value per SM, and an array of at most
    /// [`SHARDED_ARRAY_MAX`] bytes gets per-SM copies for its adds in the context's
    /// `window` while it has room (none for 1 SM).
    pub fn new(
        mover: &Mover<'_>,
        map: Arc<Map>,
        sm_count: u32,
        window: &ShardWindow,
    ) -> Result<Replica, ReplicaError> {
        let unsupported = |reason: NoReplica| ReplicaError::Unsupported {
            id: map.id(),
            name: map.name(),
            reason,
        };
        let kind = device_kind(map.map_type()).map_err(unsupported)?;
        // Read before the store is copied: a change made meanwhile is pushed later.
        let updates = map.updates();
        let per_cpu = is_per_cpu(map.map_type());
        if per_cpu
            && kind == DeviceKind::Hash
            && HASH_OP_HEADER + round8(map.key_size()) as usize > HASH_OPS_BYTES
        {
            return Err(unsupported(NoReplica::PerCpuHashKey {
                most: HASH_OPS_BYTES - HASH_OP_HEADER,
            }));
        }
        let mut desc = GpuMapDesc {
            map_type: device_map_type(map.map_type()),
            key_size: map.key_size(),
            value_size: map.value_size(),
            max_entries: map.max_entries(),
            key_stride: round8(map.key_size()),
            value_stride: round8(map.value_size()),
            copies: 1,
            ..GpuMapDesc::default()
        };
        let mut shards = None;
        let state = match kind {
            DeviceKind::Array if per_cpu => {
                desc.copies = sm_count.max(1);
                let host = HostArray::of(&map, &desc)
                    .ok_or_else(|| unsupported(NoReplica::NoStoreValues))?;
                let (copies, cpus) = (desc.copies as usize, host.cpus);
                let stride = desc.value_stride as usize;
                let size = host.value_size;
                let entries = desc.max_entries as usize;
                let mut device = vec![0u8; entries * copies * stride];
                let mut host_shadow = vec![0u8; entries * cpus * stride];
                for k in 0..entries {
                    for c in 0..cpus {
                        host_shadow[(k * cpus + c) * stride..][..size]
                            .copy_from_slice(host.value_on(k, c));
                    }
                    // Each SM starts from the value of the CPU it reports to.
                    for sm in 0..copies {
                        device[(k * copies + sm) * stride..][..size]
                            .copy_from_slice(host.value_on(k, sm % cpus));
                    }
                }
                desc.values = mover.alloc(device.len())?;
                mover.put(desc.values, &device)?;
                SyncState::PerCpuArray {
                    device,
                    host: host_shadow,
                    cpus,
                }
            }
            DeviceKind::Array => {
                let bytes = desc.max_entries as usize * desc.value_stride as usize;
                shards = (sm_count > 1 && bytes as u64 <= SHARDED_ARRAY_MAX)
                    .then(|| window.place(mover, bytes as u64))
                    .flatten();
                desc.values = match shards {
                    Some(s) => s.base,
                    None => mover.alloc(bytes)?,
                };
                let shadow = host_array(&map, &desc);
                mover.put(desc.values, &shadow)?;
                SyncState::Array { shadow }
            }
            DeviceKind::ThreadArray => {
                // Never sharded: a thread's value is its own, and a thread that adds to
                // it atomically reads its own adds back within the launch.
                desc.copies = map.gpu_threads().unwrap_or(1).max(1);
                let bytes = array_elements(&desc) * desc.value_stride as usize;
                desc.values = mover.alloc(bytes)?;
                let shadow = host_array(&map, &desc);
                mover.put(desc.values, &shadow)?;
                SyncState::Array { shadow }
            }
            DeviceKind::Hash if per_cpu => {
                desc.copies = sm_count.max(1);
                let shape = alloc_hash_table(mover, &mut desc)?;
                let done = mover.alloc(8)?;
                mover.put(done, &0u64.to_le_bytes())?;
                let entries = host_hash_entries(&map);
                let (sync, device) = PerCpuHashSync::new(
                    desc.value_size as usize,
                    desc.copies,
                    map.syscall_value_size() / shape.value_stride(),
                    &entries,
                );
                let image = shape.build(&device).map_err(unsupported)?;
                mover.put(desc.states, u32s_as_bytes(&image.states))?;
                mover.put(desc.keys, &image.keys)?;
                mover.put(desc.values, &image.values)?;
                mover.put(desc.count, &(device.len() as u64).to_le_bytes())?;
                SyncState::PerCpuHash { shape, sync, done }
            }
            DeviceKind::Hash => {
                let shape = alloc_hash_table(mover, &mut desc)?;
                let mut shadow = HashMap::new();
                push_hash(mover, &map, &desc, &shape, &mut shadow)?;
                SyncState::Hash { shape, shadow }
            }
            DeviceKind::Ringbuf | DeviceKind::PerfEventArray => {
                let size = if kind == DeviceKind::Ringbuf {
                    // A GPU ring buffer's max_entries counts records: its ring's bytes
                    // are the store's.
                    u64::from(map.ring_size()).next_power_of_two().max(4096)
                } else {
                    PERF_RING_BYTES
                };
                let reader = RingReader::new(mover, size, ring_shards(size, sm_count))?;
                desc.ring = reader.ring;
                // As much as the device's ring holds.
                SyncState::Ring(reader, Backlog::new(size as usize))
            }
        };
        let desc_addr = mover.alloc(std::mem::size_of::<GpuMapDesc>())?;
        mover.put(desc_addr, as_bytes(&desc))?;
        Ok(Replica {
            shards,
            seen_updates: AtomicU64::new(updates),
            compact: AtomicBool::new(false),
            shadow_changes: AtomicU64::new(0),
            staging: std::sync::OnceLock::new(),
            device_dropped: AtomicU64::new(0),
            map,
            kind,
            desc_addr,
            desc,
            state: Mutex::new(state),
        })
    }

    /// How a probe inlines lookups of an array replica.
    /// Lookups of a per-CPU array go through the runtime, which picks the SM's value.
    pub fn array_layout(&self) -> Option<ArrayMapLayout> {
        (self.kind == DeviceKind::Array && self.desc.copies == 1).then_some(ArrayMapLayout {
            values: self.desc.values,
            key_stride: self.desc.value_stride,
            max_entries: self.desc.max_entries,
            update_size: self.desc.value_size,
            per_cpu: None,
        })
    }

    /// Device address of the first value of an array replica (global data sections).
    pub fn values_addr(&self) -> Option<DevicePtr> {
        (self.kind == DeviceKind::Array && self.desc.copies == 1).then_some(self.desc.values)
    }

    /// Before a launch: writes what the CPU changed since the last sync.
    pub fn push(&self, mover: &Mover<'_>) -> Result<Pushed, CudaError> {
        // Hash maps and large arrays are looked at only when an update went through
        // bpf() or the helpers; small arrays always, which also catches stores through
        // looked-up pointers and memory-mapped writes.
        let counted_only = match self.kind {
            DeviceKind::Array | DeviceKind::ThreadArray => {
                self.desc.max_entries as usize
                    * self.desc.copies as usize
                    * self.desc.value_stride as usize
                    > ALWAYS_COMPARED_ARRAY
            }
            DeviceKind::Hash => true,
            DeviceKind::Ringbuf | DeviceKind::PerfEventArray => return Ok(Pushed::default()),
        };
        if counted_only && self.seen_updates.load(Ordering::Acquire) == self.map.updates() {
            return Ok(Pushed::default());
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // Again under the lock: a pull in progress writes the device's values into the
        // store, moving the count, and says so only when it is done. Read before it was,
        // the count looks like someone else's change, and rebuilding the device's table
        // from the store would drop what a running launch added since that pull.
        let updates = self.map.updates();
        if counted_only && self.seen_updates.load(Ordering::Acquire) == updates {
            return Ok(Pushed::default());
        }
        self.seen_updates.store(updates, Ordering::Release);
        match &mut *state {
            SyncState::Array { shadow } => {
                let mut out = Vec::new();
                let Some(host) = HostArray::of(&self.map, &self.desc) else {
                    return Ok(Pushed::default());
                };
                let stride = self.desc.value_stride as usize;
                let size = self.desc.value_size as usize;
                for (k, s) in shadow.chunks_mut(stride).enumerate() {
                    let h = host.value(k);
                    if h == &s[..size] {
                        continue;
                    }
                    // What the CPU changed goes to the device as additions, made in the
                    // launch's stream order: the device's own changes since the last
                    // pull stay.
                    let at = self.desc.values + (k * stride) as u64;
                    let (deltas, tail) = value_deltas(&s[..size], h);
                    out.extend(deltas.iter().map(|d| DeviceDelta::of(at, d)));
                    if let Some(tail) = tail {
                        mover.put(at + tail.start as u64, &h[tail])?;
                    }
                    s[..size].copy_from_slice(h);
                    self.shadow_changes.fetch_add(1, Ordering::AcqRel);
                }
                Ok(Pushed {
                    deltas: out,
                    ..Pushed::default()
                })
            }
            SyncState::PerCpuArray { device, host, cpus } => {
                let mut out = Vec::new();
                let Some(store) = HostArray::of(&self.map, &self.desc) else {
                    return Ok(Pushed::default());
                };
                let stride = self.desc.value_stride as usize;
                let copies = self.desc.copies as usize;
                let size = store.value_size;
                for k in 0..self.desc.max_entries as usize {
                    for c in 0..*cpus {
                        let h = store.value_on(k, c);
                        let seen = &mut host[(k * *cpus + c) * stride..][..size];
                        if h == &seen[..] {
                            continue;
                        }
                        // CPU c's change goes to the SM that reports to it, as additions
                        // (the device's own changes since the last pull stay).
                        let sm = c % copies;
                        let at_byte = (k * copies + sm) * stride;
                        let at = self.desc.values + at_byte as u64;
                        let (deltas, tail) = value_deltas(seen, h);
                        out.extend(deltas.iter().map(|d| DeviceDelta::of(at, d)));
                        let dev = &mut device[at_byte..][..size];
                        add_deltas(dev, &deltas);
                        if let Some(tail) = tail {
                            mover.put(at + tail.start as u64, &h[tail.clone()])?;
                            dev[tail.clone()].copy_from_slice(&h[tail]);
                        }
                        seen.copy_from_slice(h);
                    }
                }
                Ok(Pushed {
                    deltas: out,
                    ..Pushed::default()
                })
            }
            SyncState::Hash { shape, shadow } => {
                push_hash(mover, &self.map, &self.desc, shape, shadow).map(|()| Pushed::default())
            }
            SyncState::PerCpuHash { shape, sync, done } => {
                let (ops, seq) = sync.push(&host_hash_entries(&self.map));
                let launches = encode_hash_ops(&ops, shape.key_stride());
                let last = launches.len();
                let hash_ops = launches
                    .into_iter()
                    .enumerate()
                    .map(|(i, (ops, count))| HashOpsLaunch {
                        map: self.desc_addr,
                        done: *done,
                        // Only the last launch says the ops are all made.
                        seq: if i + 1 == last { seq } else { seq - 1 },
                        ops,
                        count,
                    })
                    .collect();
                Ok(Pushed {
                    hash_ops,
                    ..Pushed::default()
                })
            }
            SyncState::Ring(..) => Ok(Pushed::default()),
        }
    }

    /// Whether a pull asked for the hash table to be laid out anew.
    pub fn wants_compaction(&self) -> bool {
        self.compact.load(Ordering::Acquire)
    }

    /// Lays a hash table (plain, per-CPU or LRU) out anew without its tombstones: the same
    /// entries and values, read from the device and written back, so the store's view and
    /// the sync state (both by key, not by slot) stay as they are. The caller makes sure
    /// no launch that uses the table runs meanwhile (the launch's stream synchronized);
    /// an LRU table's reference flags start clear, its hand where it was.
    pub fn compact(&self, mover: &Mover<'_>) -> Result<(), CudaError> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let shape = match &*state {
            SyncState::Hash { shape, .. } | SyncState::PerCpuHash { shape, .. } => *shape,
            _ => return Ok(()),
        };
        let image = read_hash_image(mover, &self.desc, &shape)?;
        if needs_rebuild(&image.states) {
            let fresh = compact_image(&shape, &image);
            let entries = fresh.states.iter().filter(|&&s| s == SLOT_FULL).count() as u64;
            mover.put(self.desc.states, u32s_as_bytes(&fresh.states))?;
            mover.put(self.desc.keys, &fresh.keys)?;
            mover.put(self.desc.values, &fresh.values)?;
            mover.put(self.desc.count, &entries.to_le_bytes())?;
            if lru_extra_bytes(self.desc.map_type, shape.capacity) > 0 {
                // The reference flags, one u32 a slot after the states; not the hand.
                let cap = u64::from(shape.capacity);
                mover.zero(self.desc.states + cap * 4, cap as usize * 4)?;
            }
        }
        self.compact.store(false, Ordering::Release);
        Ok(())
    }

    /// After a launch completed (or while a long one runs): brings what the GPU changed
    /// into the store, and the records it wrote into the store's ring.
    pub fn pull(&self, mover: &Mover<'_>) -> Result<(), CudaError> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match &mut *state {
            SyncState::Array { shadow } => {
                let mut device = vec![0u8; shadow.len()];
                mover.get(self.desc.values, &mut device)?;
                self.apply_array(shadow, &device);
                self.shadow_changes.fetch_add(1, Ordering::AcqRel);
                Ok(())
            }
            SyncState::PerCpuArray { device, host, cpus } => {
                let mut now = vec![0u8; device.len()];
                mover.get(self.desc.values, &mut now)?;
                if now == *device {
                    return Ok(());
                }
                let Some(store) = HostArray::of(&self.map, &self.desc) else {
                    return Ok(());
                };
                let stride = self.desc.value_stride as usize;
                let copies = self.desc.copies as usize;
                let size = store.value_size;
                for (i, (d, s)) in now
                    .chunks(stride)
                    .zip(device.chunks_mut(stride))
                    .enumerate()
                {
                    if d == s {
                        continue;
                    }
                    // SM `sm`'s changes reach the store as additions to CPU `sm % cpus`.
                    let (k, sm) = (i / copies, i % copies);
                    let cpu = sm % *cpus;
                    let (deltas, tail) = value_deltas(&s[..size], &d[..size]);
                    store.add_on(k, cpu, &deltas);
                    let seen = &mut host[(k * *cpus + cpu) * stride..][..size];
                    add_deltas(seen, &deltas);
                    if let Some(tail) = tail {
                        store.write_bytes_on(k, cpu, tail.start, &d[tail.clone()]);
                        seen[tail.clone()].copy_from_slice(&d[tail]);
                    }
                    s.copy_from_slice(d);
                }
                Ok(())
            }
            SyncState::Hash { shape, shadow } => {
                let image = read_hash_image(mover, &self.desc, shape)?;
                if needs_rebuild(&image.states) {
                    self.compact.store(true, Ordering::Release);
                }
                let device: HashMap<Vec<u8>, Vec<u8>> = shape.read(&image).into_iter().collect();
                let before = self.map.updates();
                let writes = apply_device_hash(&self.map, shadow, &device);
                let after = self.map.updates();
                // Our own writes do not make the device stale; anyone else's does.
                if self.seen_updates.load(Ordering::Acquire) == before && after - before == writes {
                    self.seen_updates.store(after, Ordering::Release);
                }
                *shadow = device;
                Ok(())
            }
            SyncState::PerCpuHash { shape, sync, done } => {
                // The ops the device has made, read before the table: a table read after
                // it holds at least those.
                let mut made = [0u8; 8];
                mover.get(*done, &mut made)?;
                let image = read_hash_image(mover, &self.desc, shape)?;
                if needs_rebuild(&image.states) {
                    self.compact.store(true, Ordering::Release);
                }
                let mut changes = sync.pull(shape.read(&image), u64::from_le_bytes(made));
                // Deletes first, so that a full map's replaced keys fit (as for hash maps).
                changes.sort_by_key(|c| !matches!(c, StoreChange::Delete { .. }));
                let before = self.map.updates();
                let mut writes = 0u64;
                for change in changes {
                    writes += u64::from(apply_store_change(&self.map, change));
                }
                let after = self.map.updates();
                // Our own inserts and deletes do not make the device stale; anyone else's do.
                if self.seen_updates.load(Ordering::Acquire) == before && after - before == writes {
                    self.seen_updates.store(after, Ordering::Release);
                }
                Ok(())
            }
            SyncState::Ring(reader, backlog) => {
                let (records, dropped) = reader.read(mover)?;
                if dropped > 0 {
                    self.device_dropped.fetch_add(dropped, Ordering::Relaxed);
                    self.lose_dropped(dropped);
                }
                backlog.offer(records, |r| self.deliver(r), |r| self.lose(r));
                Ok(())
            }
        }
    }

    /// Takes in the device's values of an array (`device`, in its layout): what the GPU
    /// changed since `shadow` goes into the store as additions (another process's GPU,
    /// or the CPU, may have changed the value meanwhile).
    fn apply_array(&self, shadow: &mut [u8], device: &[u8]) {
        if device == shadow {
            return;
        }
        let Some(host) = HostArray::of(&self.map, &self.desc) else {
            return;
        };
        let stride = self.desc.value_stride as usize;
        let size = self.desc.value_size as usize;
        for (k, (d, s)) in device
            .chunks(stride)
            .zip(shadow.chunks_mut(stride))
            .enumerate()
        {
            if d == s {
                continue;
            }
            let (deltas, tail) = value_deltas(&s[..size], &d[..size]);
            host.add(k, &deltas);
            if let Some(tail) = tail {
                host.write_bytes(k, tail.start, &d[tail]);
            }
            s.copy_from_slice(d);
        }
    }

    /// For an array (not per-CPU), queues the copy of its device values into its
    /// staging memory in `mover`'s stream, without its lock: the copies of every map a
    /// launch used are waited for once, and a launch's push meanwhile (which takes the
    /// lock) does not wait behind them. `None` for other maps, and where no page-locked
    /// memory is to be had: [`Replica::pull`] takes those whole. Only one sync pass at a
    /// time may call this and then [`Replica::pull_taken`], after [`Mover::wait`].
    pub fn take_copy(&self, mover: &Mover<'_>) -> Result<Option<PullCopy>, CudaError> {
        if self.kind != DeviceKind::Array || self.desc.copies != 1 {
            return Ok(None);
        }
        let len = self.desc.max_entries as usize * self.desc.value_stride as usize;
        let staging = self.staging.get_or_init(|| {
            mover
                .alloc_pinned(len)
                .map_err(|e| tracing::debug!(map = self.map.id(), "no staging memory: {e}"))
                .ok()
        });
        let Some(staging) = staging else {
            return Ok(None);
        };
        let shadow_changes = self.shadow_changes.load(Ordering::Acquire);
        // SAFETY: the one sync pass (see above) reads it only after waiting for the copy.
        mover.get_async(self.desc.values, unsafe { staging.bytes() })?;
        Ok(Some(PullCopy { shadow_changes }))
    }

    /// Applies a copy [`Replica::take_copy`] queued, once `mover` waited for it. Where the
    /// shadow changed otherwise after the copy was queued (see `shadow_changes`), the
    /// array is pulled again under its lock instead.
    pub fn pull_taken(&self, copy: PullCopy, mover: &Mover<'_>) -> Result<(), CudaError> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if self.shadow_changes.load(Ordering::Acquire) != copy.shadow_changes {
            drop(state);
            return self.pull(mover);
        }
        let Some(Some(staging)) = self.staging.get() else {
            return Ok(());
        };
        // SAFETY: filled by the copy `take_copy` queued, which `mover` waited for; no
        // other pass uses it meanwhile (see `take_copy`).
        let device: &[u8] = unsafe { staging.bytes() };
        if let SyncState::Array { shadow } = &mut *state {
            if shadow.len() == device.len() {
                self.apply_array(shadow, device);
            }
        }
        Ok(())
    }

    /// Records of a ring replica held back for want of room in the store's ring
    /// ([`Backlog`]), offered again. How many are still held.
    pub fn retry_held(&self) -> usize {
        self.with_backlog(|_| ())
    }

    /// [`Replica::retry_held`], then what is still held given up and counted as dropped
    /// (or lost). How many were given up.
    pub fn give_up_held(&self) -> usize {
        self.with_backlog(|b| b.give_up(|r| self.lose(r)))
    }

    /// Offers the backlog's records again, then `then` on it; its length before `then`.
    fn with_backlog(&self, then: impl FnOnce(&mut Backlog)) -> usize {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let SyncState::Ring(_, backlog) = &mut *state else {
            return 0;
        };
        if backlog.is_empty() {
            return 0;
        }
        backlog.offer(Vec::new(), |r| self.deliver(r), |r| self.lose(r));
        let held = backlog.len();
        then(backlog);
        held
    }

    /// Offers `record` to the store's ring: nothing is counted when it is full, as the
    /// record is kept and offered again ([`Backlog`]).
    fn deliver(&self, record: &RingRecord) -> RecordOffer {
        let offer = match self.kind {
            DeviceKind::Ringbuf => self.map.offer_record(0, &record.data),
            DeviceKind::PerfEventArray => match perf_record(record) {
                Some((flags, data)) => self.map.offer_record(flags, data),
                None => RecordOffer::Refused(-(libc::EINVAL as i64)),
            },
            DeviceKind::Array | DeviceKind::ThreadArray | DeviceKind::Hash => RecordOffer::Taken,
        };
        if let RecordOffer::Refused(error) = offer {
            if crate::exiting::may_log() {
                tracing::debug!(map = self.map.id(), error, "the store refused a GPU record");
            }
        }
        offer
    }

    /// `n` records the device dropped, counted as given-up ones are ([`Replica::lose`]).
    /// Their perf flags were never written: they count as lost in the buffer of the CPU
    /// `BPF_F_CURRENT_CPU` names here, where such records go.
    fn lose_dropped(&self, n: u64) {
        match self.kind {
            DeviceKind::PerfEventArray => self.map.count_lost_records(F_CURRENT_CPU, n),
            _ => self.map.count_dropped(n),
        }
    }

    /// The records the device dropped since the last call: what a consumer may not have
    /// been told (a perf buffer says what it lost only before its next record).
    pub fn take_device_dropped(&self) -> u64 {
        self.device_dropped.swap(0, Ordering::Relaxed)
    }

    /// A record given up: counted as the kernel counts what its ring had no room for (a
    /// ring buffer's drop count; a perf buffer's lost records, which its consumer reads
    /// before its next record).
    fn lose(&self, record: &RingRecord) {
        match self.kind {
            DeviceKind::PerfEventArray => {
                if let Some((flags, data)) = perf_record(record) {
                    // Full, it counts the record as lost; with room again, it is taken.
                    let _ = self.map.perf_event_output(flags, data);
                }
            }
            _ => self.map.count_dropped(1),
        }
    }
}

/// Arrays up to this many bytes are compared with the store before every launch.
const ALWAYS_COMPARED_ARRAY: usize = 64 << 10;

/// An array map's values where the store keeps them: one per key, or for a per-CPU
/// array one per key and CPU.
struct HostArray {
    base: *mut u8,
    key_stride: usize,
    value_size: usize,
    max_entries: usize,
    /// Values per key (1, or the possible CPUs of a per-CPU array), `cpu_stride` apart.
    cpus: usize,
    cpu_stride: usize,
}

impl HostArray {
    fn of(map: &Map, desc: &GpuMapDesc) -> Option<HostArray> {
        if let Some(v) = map.thread_values() {
            // A per-thread array, as the device lays it out: key k's value of thread t
            // is element k * threads + t, `stride` bytes apart.
            let (threads, stride) = v.per_cpu?;
            return Some(HostArray {
                base: v.base,
                key_stride: stride as usize,
                value_size: (desc.value_size as usize).min(v.value_size as usize),
                max_entries: map.max_entries() as usize * threads as usize,
                cpus: 1,
                cpu_stride: 0,
            });
        }
        let v = map.array_values()?;
        let (cpus, cpu_stride) = v.per_cpu.map_or((1, 0), |(n, s)| (n as usize, s as usize));
        Some(HostArray {
            base: v.base,
            key_stride: v.key_stride as usize,
            value_size: (desc.value_size as usize).min(v.value_size as usize),
            max_entries: map.max_entries() as usize,
            cpus: cpus.max(1),
            cpu_stride,
        })
    }

    fn offset(&self, k: usize, cpu: usize) -> usize {
        assert!(k < self.max_entries && cpu < self.cpus);
        k * self.key_stride + cpu * self.cpu_stride
    }

    /// Key `k`'s value (`k` below max_entries).
    fn value(&self, k: usize) -> &[u8] {
        self.value_on(k, 0)
    }

    /// Key `k`'s value of CPU `cpu`.
    fn value_on(&self, k: usize, cpu: usize) -> &[u8] {
        let at = self.offset(k, cpu);
        // SAFETY: key k < max_entries holds value_size bytes for each of its CPUs at base
        // + k * key_stride + cpu * cpu_stride (checked in `offset`) for as long as the
        // map handle lives (the replica holds it).
        unsafe { std::slice::from_raw_parts(self.base.add(at), self.value_size) }
    }

    /// Adds `deltas` to key `k`'s value, each word atomically.
    fn add(&self, k: usize, deltas: &[WordDelta]) {
        self.add_on(k, 0, deltas)
    }

    /// Adds `deltas` to key `k`'s value of CPU `cpu`, each word atomically.
    fn add_on(&self, k: usize, cpu: usize, deltas: &[WordDelta]) {
        let value = self.offset(k, cpu);
        for d in deltas {
            assert!(d.offset + d.width as usize <= self.value_size);
            // SAFETY: a word inside key k's value (checked above), aligned: the store
            // keeps values 8-byte aligned and the offsets are multiples of the width. The
            // value is shared memory that other processes update the same way.
            unsafe {
                let at = self.base.add(value + d.offset);
                if d.width == 8 {
                    (*at.cast::<AtomicU64>()).fetch_add(d.delta, Ordering::Relaxed);
                } else {
                    (*at.cast::<std::sync::atomic::AtomicU32>())
                        .fetch_add(d.delta as u32, Ordering::Relaxed);
                }
            }
        }
    }

    /// Writes `bytes` at `offset` in key `k`'s value.
    fn write_bytes(&self, k: usize, offset: usize, bytes: &[u8]) {
        self.write_bytes_on(k, 0, offset, bytes)
    }

    /// Writes `bytes` at `offset` in key `k`'s value of CPU `cpu`.
    fn write_bytes_on(&self, k: usize, cpu: usize, offset: usize, bytes: &[u8]) {
        let value = self.offset(k, cpu);
        assert!(offset + bytes.len() <= self.value_size);
        // SAFETY: as in `value_on`; inside the value (checked above).
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.base.add(value + offset),
                bytes.len(),
            )
        };
    }
}

/// An addition the device must make to one of its words before a launch: the word's
/// address, with bit 0 set for a 4-byte word, and the value to add. The apply kernel
/// (`session`) takes them as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceDelta {
    pub addr: u64,
    pub delta: u64,
}

impl DeviceDelta {
    fn of(value: DevicePtr, d: &WordDelta) -> DeviceDelta {
        DeviceDelta {
            addr: (value + d.offset as u64) | u64::from(d.width == 4),
            delta: d.delta,
        }
    }
}

/// The values an array replica holds: a value per key, or per key and thread for a
/// per-thread array.
fn array_elements(desc: &GpuMapDesc) -> usize {
    desc.max_entries as usize * desc.copies as usize
}

/// An array map's values as the store holds them, laid out as the device does.
fn host_array(map: &Map, desc: &GpuMapDesc) -> Vec<u8> {
    let stride = desc.value_stride as usize;
    let mut out = vec![0u8; array_elements(desc) * stride];
    if let Some(host) = HostArray::of(map, desc) {
        for (k, chunk) in out.chunks_mut(stride).enumerate() {
            let v = host.value(k);
            chunk[..v.len()].copy_from_slice(v);
        }
    }
    out
}

/// Makes the store's hash map what the device's table holds (`device`), given what both
/// held at the last sync (`shadow`): deletes first, so that a device that replaced
/// entries of a full map (deleted or evicted some, inserted others) fits in the store's;
/// then changed values and inserts. An LRU map's changed values are written in place: an
/// update of a key takes a fresh element, which in a full LRU map evicts another key, one
/// the device still holds. Returns how many counted writes (`Map::updates`) the store took.
fn apply_device_hash(
    map: &Map,
    shadow: &HashMap<Vec<u8>, Vec<u8>>,
    device: &HashMap<Vec<u8>, Vec<u8>>,
) -> u64 {
    let mut writes = 0u64;
    for k in shadow.keys() {
        if !device.contains_key(k) && map.delete(k).is_ok() {
            writes += 1;
        }
    }
    let in_place = map.map_type() == map_type::LRU_HASH;
    let value_size = map.value_size() as usize;
    for (k, v) in device {
        if shadow.get(k) == Some(v) {
            continue;
        }
        if in_place && k.len() == map.key_size() as usize && v.len() >= value_size {
            // SAFETY: `k` holds the map's key_size bytes (checked above).
            let at = unsafe { map.prog_lookup(k.as_ptr()) };
            if !at.is_null() {
                // SAFETY: `at` is the key's value in the map, value_size bytes; `v` holds
                // at least as many.
                unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), at, value_size) };
                continue;
            }
        }
        if map.update(k, v, 0).is_ok() {
            writes += 1;
        }
    }
    writes
}

/// Rebuilds the device table from the store's entries.
fn push_hash(
    mover: &Mover<'_>,
    map: &Map,
    desc: &GpuMapDesc,
    shape: &HashShape,
    shadow: &mut HashMap<Vec<u8>, Vec<u8>>,
) -> Result<(), CudaError> {
    let entries = host_hash_entries(map);
    let image = shape.build(&entries).unwrap_or_else(|_| HashImage {
        states: vec![0; shape.capacity as usize],
        keys: vec![0; shape.capacity as usize * shape.key_stride()],
        values: vec![0; shape.capacity as usize * shape.slot_values()],
    });
    mover.put(desc.states, u32s_as_bytes(&image.states))?;
    mover.put(desc.keys, &image.keys)?;
    mover.put(desc.values, &image.values)?;
    mover.put(desc.count, &(entries.len() as u64).to_le_bytes())?;
    *shadow = entries.into_iter().collect();
    Ok(())
}

fn host_hash_entries(map: &Map) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut entries = Vec::new();
    let mut key = vec![0u8; map.key_size() as usize];
    let mut prev: Option<Vec<u8>> = None;
    let mut value = vec![0u8; map.syscall_value_size()];
    while map.next_key(prev.as_deref(), &mut key).is_ok() {
        if map.lookup(&key, &mut value).is_ok() {
            entries.push((key.clone(), value.clone()));
        }
        prev = Some(key.clone());
        if entries.len() > map.max_entries() as usize {
            break;
        }
    }
    entries
}

/// A device hash table's three arrays, copied to the host.
fn read_hash_image(
    mover: &Mover<'_>,
    desc: &GpuMapDesc,
    shape: &HashShape,
) -> Result<HashImage, CudaError> {
    let cap = shape.capacity as usize;
    let mut states = vec![0u8; cap * 4];
    let mut image = HashImage {
        states: Vec::new(),
        keys: vec![0; cap * shape.key_stride()],
        values: vec![0; cap * shape.slot_values()],
    };
    mover.get_async(desc.states, &mut states)?;
    mover.get_async(desc.keys, &mut image.keys)?;
    mover.get_async(desc.values, &mut image.values)?;
    mover.wait()?;
    image.states = states
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes")))
        .collect();
    Ok(image)
}

/// Allocates a device hash table for `desc` (its slots, keys, `desc.copies` values per
/// slot and its count) and fills in where they are.
fn alloc_hash_table(mover: &Mover<'_>, desc: &mut GpuMapDesc) -> Result<HashShape, ReplicaError> {
    let shape = HashShape {
        key_size: desc.key_size,
        value_size: desc.value_size,
        capacity: hash_capacity(desc.max_entries),
        copies: desc.copies,
    };
    desc.capacity = shape.capacity;
    let cap = shape.capacity as usize;
    let lru = lru_extra_bytes(desc.map_type, shape.capacity);
    desc.states = mover.alloc(cap * 4 + lru)?;
    if lru > 0 {
        mover.zero(desc.states + cap as u64 * 4, lru)?;
    }
    desc.keys = mover.alloc(cap * shape.key_stride())?;
    desc.values = mover.alloc(cap * shape.slot_values())?;
    desc.count = mover.alloc(8)?;
    Ok(shape)
}

/// Makes `change` in the store's per-CPU hash map; true if it inserted or deleted a key
/// (an update the map counts).
fn apply_store_change(map: &Map, change: StoreChange) -> bool {
    match change {
        StoreChange::Delete { key } => map.delete(&key).is_ok(),
        StoreChange::Add {
            key,
            cpu,
            deltas,
            tail,
            make,
        } => {
            let r = map.with_percpu_values(&key, make, |values| {
                if cpu >= values.cpus() {
                    return;
                }
                for d in &deltas {
                    values.add(cpu, d.offset, d.width == 8, d.delta);
                }
                if let Some((offset, bytes)) = &tail {
                    values.write(cpu, *offset, bytes);
                }
            });
            match r {
                Ok(((), inserted)) => inserted,
                Err(e) => {
                    // The key went (the CPU deleted it) or the map is full: the GPU's
                    // change has nowhere to go, as a CPU program's update would not.
                    if crate::exiting::may_log() {
                        tracing::debug!(
                            map = map.id(),
                            "a GPU change to a per-CPU hash map was dropped: {e}"
                        );
                    }
                    false
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
