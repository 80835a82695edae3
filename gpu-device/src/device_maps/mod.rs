//! The layouts the device runtime (device/runtime.c) works on, and the host-side logic of
//! keeping them in step with the store: building a device hash table from the store's
//! entries, reading one back, deciding which values changed on which side, and reading the
//! records the device wrote into a ring. Everything here is plain data, checked without a
//! GPU; `session` moves the bytes.

use bpftime_isa::uapi::map_type;

/// Hash slot states, as runtime.c names them.
pub const SLOT_EMPTY: u32 = 0;
pub const SLOT_BUSY: u32 = 1;
pub const SLOT_FULL: u32 = 2;
pub const SLOT_DELETED: u32 = 3;

/// Ring record header flags and size, as runtime.c writes them.
pub const RECORD_DISCARD: u32 = 1 << 31;
pub const RECORD_RAW: u32 = 1 << 30;
pub const RECORD_HEADER: u64 = 8;

/// `struct gpu_map` of runtime.c: what a probe's `lddw map` points at on the device.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuMapDesc {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub key_stride: u32,
    pub value_stride: u32,
    pub copies: u32,
    pub capacity: u32,
    pub values: u64,
    pub keys: u64,
    pub states: u64,
    pub count: u64,
    pub ring: u64,
}

/// The largest array (its values' bytes) that is sharded per SM: the fold after each
/// launch reads every copy of it.
pub const SHARDED_ARRAY_MAX: u64 = 4 << 10;

/// A sharded array: its values and its per-SM copies on the device (runtime.c's
/// `bpftime_gpu_shard_address`, the fold kernel's parameters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShardEntry {
    /// The array's values.
    pub base: u64,
    /// Their bytes, a multiple of 8.
    pub len: u64,
    /// SM k's copy of the 8-byte adds is at `shards64 + k * stride`.
    pub shards64: u64,
    /// SM k's copy of the 4-byte adds is at `shards32 + k * stride`.
    pub shards32: u64,
    pub stride: u64,
    /// How many copies: the SM count.
    pub copies: u32,
}

impl ShardEntry {
    /// The entry of an array whose `len` bytes of values are at `base` in a shard window
    /// of `copies` copies (see [`SHARD_WINDOW_SPAN`]).
    pub fn in_window(base: u64, len: u64, copies: u32) -> ShardEntry {
        ShardEntry {
            base,
            len,
            shards64: base + SHARD_WINDOW_SPAN,
            shards32: base + SHARD_WINDOW_SPAN * (1 + u64::from(copies)),
            stride: SHARD_WINDOW_SPAN,
            copies,
        }
    }
}

/// The bytes of a context's shard window that its sharded arrays' values share. SM k's
/// copy of the value byte at `addr` is at `addr + SPAN * (1 + k)` for 8-byte adds and at
/// `addr + SPAN * (1 + copies + k)` for 4-byte adds, `copies` a power of two: finding an
/// add's copy is then one range check and a multiply, whichever array the address is in
/// (a probe that picks one of several histograms by a computed index does not know
/// which), where a compare per array was needed before.
pub const SHARD_WINDOW_SPAN: u64 = 32 << 10;

/// The window `shards` share, `(lo, hi, copies)` (the bytes of their values, and the
/// copies each has), when every one of them lies in one laid out as
/// [`ShardEntry::in_window`] does.
fn shard_window(shards: &[ShardEntry]) -> Option<(u64, u64, u32)> {
    let first = shards.first()?;
    let copies = first.copies;
    if !copies.is_power_of_two() {
        return None;
    }
    let lo = shards.iter().map(|s| s.base).min()?;
    let hi = shards.iter().map(|s| s.base + s.len).max()?;
    let laid_out = shards
        .iter()
        .all(|s| *s == ShardEntry::in_window(s.base, s.len, copies));
    (laid_out && hi - lo <= SHARD_WINDOW_SPAN).then_some((lo, hi, copies))
}

/// `bpftime_gpu_shard_address` for `shards`, as LLVM IR, every address a constant: one
/// range check for shards in one window, else a compare per array. The window's check
/// first asks the compiler (`bpftime_jit_ptx::KNOWN_IN_RANGE`), which answers yes for an
/// address it knows is in one of the window's arrays.
fn shard_address_ir(shards: &[ShardEntry]) -> String {
    match shard_window(shards) {
        Some((lo, hi, copies)) => format!(
            "declare i1 @{known}(i64, i64, i64) nounwind willreturn memory(none)\n\
             define i64 @bpftime_gpu_shard_address(i64 %addr, i64 %wide, i64 %sm) {{\nentry:\n  \
             %off = sub i64 %addr, {lo}\n  %known = call i1 @{known}(i64 %addr, i64 {lo}, i64 {len})\n  \
             %tested = icmp ult i64 %off, {len}\n  %in = or i1 %known, %tested\n  \
             br i1 %in, label %hit, label %miss\nhit:\n  %k = and i64 %sm, {mask}\n  \
             %w = icmp ne i64 %wide, 0\n  %first = select i1 %w, i64 1, i64 {first32}\n  \
             %n = add i64 %k, %first\n  %d = mul i64 %n, {span}\n  %a = add i64 %addr, %d\n  \
             ret i64 %a\nmiss:\n  ret i64 %addr\n}}",
            known = bpftime_jit_ptx::KNOWN_IN_RANGE,
            len = hi - lo,
            mask = copies - 1,
            first32 = 1 + u64::from(copies),
            span = SHARD_WINDOW_SPAN,
        ),
        None => shard_address_chain_ir(shards),
    }
}

/// `bpftime_gpu_shard_address` for shards not laid out in one window: a compare per
/// array.
fn shard_address_chain_ir(shards: &[ShardEntry]) -> String {
    let mut ir = String::from(
        "define i64 @bpftime_gpu_shard_address(i64 %addr, i64 %wide, i64 %sm) {\nentry:\n  br label %e0\n",
    );
    for (i, s) in shards.iter().enumerate() {
        let copies = s.copies.max(1);
        ir.push_str(&format!(
            "e{i}:\n  %off{i} = sub i64 %addr, {base}\n  %in{i} = icmp ult i64 %off{i}, {len}\n  \
             br i1 %in{i}, label %hit{i}, label %e{next}\nhit{i}:\n  %k{i} = urem i64 %sm, {copies}\n  \
             %w{i} = icmp ne i64 %wide, 0\n  %r{i} = select i1 %w{i}, i64 {s64}, i64 {s32}\n  \
             %p{i} = mul i64 %k{i}, {stride}\n  %q{i} = add i64 %r{i}, %p{i}\n  \
             %a{i} = add i64 %q{i}, %off{i}\n  ret i64 %a{i}\n",
            base = s.base,
            len = s.len,
            next = i + 1,
            s64 = s.shards64,
            s32 = s.shards32,
            stride = s.stride,
        ));
    }
    ir.push_str(&format!("e{}:\n  ret i64 %addr\n}}", shards.len()));
    ir
}

/// `struct ring` of runtime.c.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceRing {
    pub data: u64,
    pub size: u64,
    pub head: u64,
    pub tail: u64,
    pub dropped: u64,
    pub shards: u64,
}

const _: () = assert!(std::mem::size_of::<GpuMapDesc>() == 72);

const _: () = assert!(std::mem::size_of::<DeviceRing>() == 48);

/// Byte offsets of a ring shard's fields, for the host's partial copies.
pub const RING_HEAD: u64 = 16;
pub const RING_TAIL: u64 = 24;

/// Each ring shard holds at least this many bytes.
pub const RING_SHARD_MIN: u64 = 64 << 10;

/// How many shards a ring of `size` bytes (a power of two) gets on a GPU of `sm_count`
/// SMs: one per SM up to a power of two, as long as each keeps [`RING_SHARD_MIN`].
pub fn ring_shards(size: u64, sm_count: u32) -> u64 {
    let by_sm = u64::from(sm_count.max(1));
    let by_sm = 1u64 << (63 - by_sm.leading_zeros());
    by_sm.min((size / RING_SHARD_MIN).max(1))
}

pub fn round8(v: u32) -> u32 {
    (v + 7) & !7
}

/// How a store map lives on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// Values at `values + (key * copies + copy) * value_stride`.
    Array,
    /// bpftime's per-thread array: an array whose copy of a key's value is the thread's
    /// (the copy of its global id, `copies` being the map's thread count), synced as an
    /// array of `max_entries * copies` values.
    ThreadArray,
    /// An open-addressing table of `capacity` slots.
    Hash,
    /// Records in a ring the host drains into the store's ring buffer.
    Ringbuf,
    /// Records (each led by the perf flags) the host writes to the store's perf buffers.
    PerfEventArray,
}

/// Why a map cannot have a device replica (or one of the layout it has).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoReplica {
    #[error(
        "map type {0} has no GPU replica (GPU probes use array, hash, LRU hash, per-CPU \
         array, hash and LRU hash, ringbuf and perf_event_array maps, and bpftime's GPU maps)"
    )]
    MapType(u32),
    #[error("{entries} entries do not fit {slots} slots")]
    TableFull { entries: usize, slots: usize },
    #[error("a per-CPU hash map's keys on the GPU are at most {most} bytes; use a hash map")]
    PerCpuHashKey { most: usize },
    #[error("the store keeps no values for this array")]
    NoStoreValues,
}

/// The device kind of a map type, or why it has none. bpftime's GPU arrays (1503, 1504,
/// 1513) and hash map (1501) are arrays and hash tables exactly as the standard ones are
/// (`map_type::served_as`): the same replica, sync and fast paths.
pub fn device_kind(map_type: u32) -> Result<DeviceKind, NoReplica> {
    Ok(match map_type::served_as(map_type) {
        map_type::ARRAY | map_type::PERCPU_ARRAY => DeviceKind::Array,
        map_type::GPU_PER_THREAD_ARRAY => DeviceKind::ThreadArray,
        map_type::HASH | map_type::PERCPU_HASH | map_type::LRU_HASH | map_type::LRU_PERCPU_HASH => {
            DeviceKind::Hash
        }
        map_type::RINGBUF | map_type::GPU_RINGBUF => DeviceKind::Ringbuf,
        map_type::PERF_EVENT_ARRAY => DeviceKind::PerfEventArray,
        other => return Err(NoReplica::MapType(other)),
    })
}

/// The type a map's device descriptor (`struct gpu_map`) carries: what runtime.c
/// dispatches on, the standard type a bpftime GPU type is served as.
pub fn device_map_type(map_type: u32) -> u32 {
    map_type::served_as(map_type)
}

/// Whether a map type keeps one value per CPU: on the device, one per SM.
pub fn is_per_cpu(map_type: u32) -> bool {
    matches!(
        map_type,
        map_type::PERCPU_ARRAY | map_type::PERCPU_HASH | map_type::LRU_PERCPU_HASH
    )
}

/// Slots of a device hash table for `max_entries`: at least twice as many, a power of
/// two, so that probe sequences stay short and always meet an empty slot.
pub fn hash_capacity(max_entries: u32) -> u32 {
    (max_entries.max(1) as u64 * 2)
        .next_power_of_two()
        .min(1 << 31) as u32
}

/// Bytes an LRU hash table keeps after its states (runtime.c's `lru_refs` and `lru_hand`):
/// a reference flag per slot, then the clock's hand; none for other maps.
pub fn lru_extra_bytes(map_type: u32, capacity: u32) -> usize {
    if matches!(map_type, map_type::LRU_HASH | map_type::LRU_PERCPU_HASH) {
        capacity as usize * 4 + 8
    } else {
        0
    }
}

/// Whether a device hash table should be laid out anew before its next launch: the
/// device turns a deleted (or evicted) slot into a tombstone it never reuses, so that
/// concurrent inserts of one key always meet at the first empty slot; once a quarter of
/// the slots are tombstones, the empty ones that inserts need run short.
pub fn needs_rebuild(states: &[u32]) -> bool {
    let deleted = states.iter().filter(|&&s| s == SLOT_DELETED).count();
    deleted * 4 >= states.len().max(1)
}

/// The table `image` holds, laid out anew without tombstones: the same entries, every
/// copy of their values, one per key (of two that an LRU insert left, the later in slot
/// order, the one a pull reads).
pub fn compact_image(shape: &HashShape, image: &HashImage) -> HashImage {
    let mut at: HashMap<Vec<u8>, usize> = HashMap::new();
    let mut entries: Vec<Entry> = Vec::new();
    for (key, value) in shape.read(image) {
        match at.get(&key) {
            Some(&i) => entries[i].1 = value,
            None => {
                at.insert(key.clone(), entries.len());
                entries.push((key, value));
            }
        }
    }
    shape
        .build(&entries)
        .expect("a table's own entries fit its slots")
}

/// runtime.c's `hash_key`: where a key's slot search starts.
pub use bpftime_gpu_ptx::fnv1a as hash_key;

/// A device hash table's three arrays, as host bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashImage {
    pub states: Vec<u32>,
    pub keys: Vec<u8>,
    pub values: Vec<u8>,
}

/// The shape of a device hash table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashShape {
    pub key_size: u32,
    pub value_size: u32,
    pub capacity: u32,
    pub copies: u32,
}

impl HashShape {
    pub fn key_stride(&self) -> usize {
        round8(self.key_size) as usize
    }
    pub fn value_stride(&self) -> usize {
        round8(self.value_size) as usize
    }
    /// Bytes of all copies of one slot's value.
    pub fn slot_values(&self) -> usize {
        self.value_stride() * self.copies as usize
    }

    /// A table holding `entries` (key, the value's copies one after the other, each
    /// `value_size` bytes), placed as the device would place them. Fails if they do
    /// not fit (more entries than slots).
    pub fn build(&self, entries: &[(Vec<u8>, Vec<u8>)]) -> Result<HashImage, NoReplica> {
        let cap = self.capacity as usize;
        let mut image = HashImage {
            states: vec![SLOT_EMPTY; cap],
            keys: vec![0; cap * self.key_stride()],
            values: vec![0; cap * self.slot_values()],
        };
        if entries.len() > cap {
            return Err(NoReplica::TableFull {
                entries: entries.len(),
                slots: cap,
            });
        }
        for (key, value) in entries {
            let mut at = hash_key(key) as usize & (cap - 1);
            while image.states[at] != SLOT_EMPTY {
                at = (at + 1) & (cap - 1);
            }
            image.states[at] = SLOT_FULL;
            let k = at * self.key_stride();
            image.keys[k..k + key.len()].copy_from_slice(key);
            let vs = self.value_size as usize;
            for copy in 0..self.copies as usize {
                let from = copy * vs;
                let to = at * self.slot_values() + copy * self.value_stride();
                if let Some(src) = value.get(from..from + vs) {
                    image.values[to..to + vs].copy_from_slice(src);
                }
            }
        }
        Ok(image)
    }

    /// The entries of a table the device wrote: every FULL slot's key and value copies
    /// (`value_size` bytes each, back to back), in slot order.
    pub fn read(&self, image: &HashImage) -> Vec<(Vec<u8>, Vec<u8>)> {
        let vs = self.value_size as usize;
        image
            .states
            .iter()
            .enumerate()
            .filter(|(_, &s)| s == SLOT_FULL)
            .map(|(at, _)| {
                let k = at * self.key_stride();
                let key = image.keys[k..k + self.key_size as usize].to_vec();
                let mut value = Vec::with_capacity(vs * self.copies as usize);
                for copy in 0..self.copies as usize {
                    let from = at * self.slot_values() + copy * self.value_stride();
                    value.extend_from_slice(&image.values[from..from + vs]);
                }
                (key, value)
            })
            .collect()
    }
}

/// One change to an array value, as an addition: several writers (the GPUs of several
/// processes, the CPU) each adding what they changed, atomically, keep every counter
/// right, where copying values would keep only the last writer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WordDelta {
    /// Byte offset in the value.
    pub offset: usize,
    /// 8 or 4 bytes.
    pub width: u8,
    /// What to add (wrapping) to go from the old word to the new one.
    pub delta: u64,
}

/// The changes from `old` to `new` (one value's bytes, the same length) as additions to
/// 8-byte words, then a 4-byte word; the bytes after those (a value whose size is not a
/// multiple of 4) as a range to copy, when they changed.
pub fn value_deltas(old: &[u8], new: &[u8]) -> (Vec<WordDelta>, Option<std::ops::Range<usize>>) {
    let mut deltas = Vec::new();
    let mut at = 0;
    let word = |b: &[u8], at: usize, w: usize| {
        let mut v = [0u8; 8];
        v[..w].copy_from_slice(&b[at..at + w]);
        u64::from_le_bytes(v)
    };
    for width in [8usize, 4] {
        while at + width <= new.len() {
            let (o, n) = (word(old, at, width), word(new, at, width));
            if o != n {
                let delta = if width == 8 {
                    n.wrapping_sub(o)
                } else {
                    (n as u32).wrapping_sub(o as u32) as u64
                };
                deltas.push(WordDelta {
                    offset: at,
                    width: width as u8,
                    delta,
                });
            }
            at += width;
        }
    }
    let tail = (old[at..] != new[at..]).then_some(at..new.len());
    (deltas, tail)
}

/// Makes `deltas` (from [`value_deltas`]) on a copy of the value they came from.
pub fn add_deltas(value: &mut [u8], deltas: &[WordDelta]) {
    for d in deltas {
        let w = d.width as usize;
        let word = &mut value[d.offset..d.offset + w];
        if w == 8 {
            let v = u64::from_le_bytes(word.try_into().expect("8 bytes")).wrapping_add(d.delta);
            word.copy_from_slice(&v.to_le_bytes());
        } else {
            let v =
                u32::from_le_bytes(word.try_into().expect("4 bytes")).wrapping_add(d.delta as u32);
            word.copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// The kernel that makes the CPU's changes to a per-CPU hash map on the device
/// (device/hash_ops.c), as build.rs compiled it.
pub const HASH_OPS_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/hash_ops.ptx"));

/// Bytes of ops one launch of the hash ops kernel takes in its parameters (hash_ops.c's
/// `OPS_BYTES`), and of an op's header before its key.
pub const HASH_OPS_BYTES: usize = 4000;
pub const HASH_OP_HEADER: usize = 24;

const OP_ADD64: u32 = 1;
const OP_ADD32: u32 = 2;
const OP_WRITE: u32 = 3;
const OP_DELETE: u32 = 4;
const OP_NONE: u32 = 5;
const OP_MAKE: u32 = 1 << 8;

/// What one op does to a key of a device per-CPU hash table (hash_ops.c's `struct
/// hash_op`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashChange {
    /// Adds `delta` to the 8-byte (`wide`) or 4-byte word at `offset` of SM copy `copy`.
    Add {
        copy: u32,
        offset: u32,
        wide: bool,
        delta: u64,
    },
    /// Writes `len` (< 8) bytes, little-endian in `bytes`, at `offset` of copy `copy`:
    /// the end of a value whose size is not a multiple of 4.
    Write {
        copy: u32,
        offset: u32,
        len: u32,
        bytes: u64,
    },
    /// Removes the key.
    Delete,
    /// Nothing but making the key (with `make`): a key whose values are all zero.
    None,
}

/// An op for the device: a change to `key`, made after inserting it with every copy
/// zeroed when `make` is set and it is missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashOp {
    pub key: Vec<u8>,
    pub make: bool,
    pub change: HashChange,
}

/// Lays `ops` out as hash_ops.c reads them (each a header and the key in `key_stride`
/// bytes), as many per launch as fit in [`HASH_OPS_BYTES`]: one buffer and its op count
/// per launch. `key_stride` must leave room for one op.
pub fn encode_hash_ops(ops: &[HashOp], key_stride: usize) -> Vec<(Vec<u8>, u32)> {
    let size = HASH_OP_HEADER + key_stride;
    let per_launch = (HASH_OPS_BYTES / size).max(1);
    ops.chunks(per_launch)
        .map(|chunk| {
            let mut buf = vec![0u8; HASH_OPS_BYTES];
            for (i, op) in chunk.iter().enumerate() {
                let (kind, copy, offset, len, value) = match op.change {
                    HashChange::Add {
                        copy,
                        offset,
                        wide,
                        delta,
                    } => (
                        if wide { OP_ADD64 } else { OP_ADD32 },
                        copy,
                        offset,
                        0,
                        delta,
                    ),
                    HashChange::Write {
                        copy,
                        offset,
                        len,
                        bytes,
                    } => (OP_WRITE, copy, offset, len, bytes),
                    HashChange::Delete => (OP_DELETE, 0, 0, 0, 0),
                    HashChange::None => (OP_NONE, 0, 0, 0, 0),
                };
                let kind = kind | if op.make { OP_MAKE } else { 0 };
                let at = &mut buf[i * size..(i + 1) * size];
                at[0..4].copy_from_slice(&kind.to_le_bytes());
                at[4..8].copy_from_slice(&copy.to_le_bytes());
                at[8..12].copy_from_slice(&offset.to_le_bytes());
                at[12..16].copy_from_slice(&len.to_le_bytes());
                at[16..24].copy_from_slice(&value.to_le_bytes());
                at[HASH_OP_HEADER..HASH_OP_HEADER + op.key.len()].copy_from_slice(&op.key);
            }
            (buf, chunk.len() as u32)
        })
        .collect()
}

/// A change to make to the store's per-CPU hash map, from what the GPU changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreChange {
    /// Adds `deltas` to CPU `cpu`'s value of `key` and writes `tail` (offset, bytes),
    /// after inserting the key with every CPU's value zeroed when `make` is set and it is
    /// missing.
    Add {
        key: Vec<u8>,
        cpu: usize,
        deltas: Vec<WordDelta>,
        tail: Option<(usize, Vec<u8>)>,
        make: bool,
    },
    /// Removes the key.
    Delete { key: Vec<u8> },
}

/// The host's side of a per-CPU hash map on the GPU: a value per key and SM on the device
/// (`copies` of them), per key and CPU in the store (`cpus`); values travel both ways as
/// additions, SM `s`'s changes to CPU `s % cpus`, CPU `c`'s to SM `c % copies`, so that
/// several processes, GPUs and the CPU all add up. Keys made or deleted on one side are
/// made or deleted on the other. Plain data: the replica moves the bytes.
#[derive(Debug, Clone)]
pub struct PerCpuHashSync {
    value_size: usize,
    copies: usize,
    cpus: usize,
    /// The device's values (`copies` of `value_size` bytes, back to back) at the last
    /// pull, with the CPU's changes sent since: what the next pull compares with.
    device: HashMap<Vec<u8>, Vec<u8>>,
    /// The store's values (`cpus` of them, `round8(value_size)` apart, as `bpf()` gives
    /// them) at the last sync.
    host: HashMap<Vec<u8>, Vec<u8>>,
    /// Keys with ops sent, and the sequence number of the last: a pull that finds the
    /// device has not made those ops yet leaves the keys alone.
    pending: HashMap<Vec<u8>, u64>,
    seq: u64,
}

use std::collections::HashMap;

/// A key and its values.
pub type Entry = (Vec<u8>, Vec<u8>);

impl PerCpuHashSync {
    /// The sync of a table made from the store's `entries` (key, every CPU's value), and
    /// the entries to build the device table from: each SM copy starts from the CPU
    /// values that go to it (added up where several CPUs go to one SM).
    pub fn new(
        value_size: usize,
        copies: u32,
        cpus: usize,
        entries: &[Entry],
    ) -> (PerCpuHashSync, Vec<Entry>) {
        let mut sync = PerCpuHashSync {
            value_size,
            copies: copies.max(1) as usize,
            cpus: cpus.max(1),
            device: HashMap::new(),
            host: HashMap::new(),
            pending: HashMap::new(),
            seq: 0,
        };
        for (key, value) in entries {
            let zero = vec![0; value.len()];
            let device = sync.device_from(&zero, value, &mut Vec::new(), key, false);
            sync.device.insert(key.clone(), device);
            sync.host.insert(key.clone(), value.clone());
        }
        let device = sync
            .device
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        (sync, device)
    }

    fn stride(&self) -> usize {
        round8(self.value_size as u32) as usize
    }

    /// The device copies of `key` (`device` if it has some, zeros if not) with every
    /// CPU's change from `old` to `new` added to its SM's copy; the ops that make the
    /// same changes on the device go to `ops`.
    fn device_from(
        &self,
        old: &[u8],
        new: &[u8],
        ops: &mut Vec<HashOp>,
        key: &[u8],
        make: bool,
    ) -> Vec<u8> {
        let (vs, stride) = (self.value_size, self.stride());
        let mut device = self
            .device
            .get(key)
            .cloned()
            .unwrap_or_else(|| vec![0; vs * self.copies]);
        for cpu in 0..self.cpus {
            let (o, n) = (&old[cpu * stride..][..vs], &new[cpu * stride..][..vs]);
            if o == n {
                continue;
            }
            let copy = cpu % self.copies;
            let (deltas, tail) = value_deltas(o, n);
            let value = &mut device[copy * vs..][..vs];
            add_deltas(value, &deltas);
            ops.extend(deltas.iter().map(|d| HashOp {
                key: key.to_vec(),
                make,
                change: HashChange::Add {
                    copy: copy as u32,
                    offset: d.offset as u32,
                    wide: d.width == 8,
                    delta: d.delta,
                },
            }));
            if let Some(tail) = tail {
                let mut bytes = [0u8; 8];
                bytes[..tail.len()].copy_from_slice(&n[tail.clone()]);
                value[tail.clone()].copy_from_slice(&n[tail.clone()]);
                ops.push(HashOp {
                    key: key.to_vec(),
                    make,
                    change: HashChange::Write {
                        copy: copy as u32,
                        offset: tail.start as u32,
                        len: tail.len() as u32,
                        bytes: u64::from_le_bytes(bytes),
                    },
                });
            }
        }
        device
    }

    /// Before a launch, with the store's entries now: the ops that bring what the CPU
    /// changed since the last sync to the device (keys made, deleted, values changed),
    /// and the sequence number the ops kernel writes when it has made them.
    pub fn push(&mut self, entries: &[Entry]) -> (Vec<HashOp>, u64) {
        let mut ops = Vec::new();
        let now: HashMap<&[u8], &[u8]> = entries
            .iter()
            .map(|(k, v)| (k.as_slice(), v.as_slice()))
            .collect();
        let seq = self.seq + 1;
        let gone: Vec<Vec<u8>> = self
            .host
            .keys()
            .filter(|k| !now.contains_key(k.as_slice()))
            .cloned()
            .collect();
        for key in gone {
            self.host.remove(&key);
            self.device.remove(&key);
            self.pending.insert(key.clone(), seq);
            ops.push(HashOp {
                key,
                make: false,
                change: HashChange::Delete,
            });
        }
        for (key, value) in entries {
            let old = self.host.get(key);
            if old.map(|o| o == value) == Some(true) {
                continue;
            }
            let make = old.is_none();
            let zero;
            let old = match old {
                Some(o) => o.clone(),
                None => {
                    zero = vec![0; value.len()];
                    zero.clone()
                }
            };
            let before = ops.len();
            let device = self.device_from(&old, value, &mut ops, key, make);
            if make && ops.len() == before {
                ops.push(HashOp {
                    key: key.clone(),
                    make: true,
                    change: HashChange::None,
                });
            }
            self.device.insert(key.clone(), device);
            self.host.insert(key.clone(), value.clone());
            self.pending.insert(key.clone(), seq);
        }
        if !ops.is_empty() {
            self.seq = seq;
        }
        (ops, self.seq)
    }

    /// After a launch, with the device table's entries (key, every SM copy) read after
    /// `done`, the sequence number of the last ops it made: the changes that bring what
    /// the GPU changed into the store. Keys whose ops the device has yet to make are left
    /// for a later pull.
    pub fn pull(&mut self, entries: Vec<Entry>, done: u64) -> Vec<StoreChange> {
        let (vs, stride) = (self.value_size, self.stride());
        let mut out = Vec::new();
        let waiting = |pending: &mut HashMap<Vec<u8>, u64>, key: &[u8]| match pending.get(key) {
            Some(&seq) if seq > done => true,
            Some(_) => {
                pending.remove(key);
                false
            }
            None => false,
        };
        let mut seen = std::collections::HashSet::new();
        for (key, now) in entries {
            seen.insert(key.clone());
            if waiting(&mut self.pending, &key) {
                continue;
            }
            let make = !self.device.contains_key(&key);
            let before = self
                .device
                .get(&key)
                .cloned()
                .unwrap_or_else(|| vec![0; now.len()]);
            let host = self
                .host
                .entry(key.clone())
                .or_insert_with(|| vec![0; stride * self.cpus]);
            let mut any = false;
            for copy in 0..self.copies {
                let (o, n) = (&before[copy * vs..][..vs], &now[copy * vs..][..vs]);
                if o == n {
                    continue;
                }
                let cpu = copy % self.cpus;
                let (deltas, tail) = value_deltas(o, n);
                let seen_value = &mut host[cpu * stride..][..vs];
                add_deltas(seen_value, &deltas);
                let tail = tail.map(|t| {
                    seen_value[t.clone()].copy_from_slice(&n[t.clone()]);
                    (t.start, n[t].to_vec())
                });
                out.push(StoreChange::Add {
                    key: key.clone(),
                    cpu,
                    deltas,
                    tail,
                    make,
                });
                any = true;
            }
            if make && !any {
                out.push(StoreChange::Add {
                    key: key.clone(),
                    cpu: 0,
                    deltas: Vec::new(),
                    tail: None,
                    make: true,
                });
            }
            self.device.insert(key, now);
        }
        let gone: Vec<Vec<u8>> = self
            .device
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            if waiting(&mut self.pending, &key) {
                continue;
            }
            self.device.remove(&key);
            self.host.remove(&key);
            out.push(StoreChange::Delete { key });
        }
        out
    }
}

/// A record the device committed to a ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingRecord {
    pub data: Vec<u8>,
    /// Printed as it is rather than as a format (bpftime's puts).
    pub raw: bool,
}

/// Reads the committed records of a device ring of `size` bytes (a power of two) from
/// `tail` up to `head`, out of `ring`, a copy of its data. Stops at the first record not
/// yet committed (a header from an earlier lap, or none). Returns the records and the new
/// tail.
pub fn drain_ring(ring: &[u8], size: u64, tail: u64, head: u64) -> (Vec<RingRecord>, u64) {
    let mut records = Vec::new();
    let mut pos = tail;
    while pos < head && head - pos >= RECORD_HEADER {
        let at = (pos & (size - 1)) as usize;
        let Some(header) = ring.get(at..at + 8) else {
            break;
        };
        let word = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
        let stamp = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
        if stamp != pos as u32 || word == 0 {
            break;
        }
        let len = (word & !(RECORD_DISCARD | RECORD_RAW)) as u64;
        let total = (RECORD_HEADER + len + 7) & !7;
        if total > size || pos + total > head {
            break;
        }
        if word & RECORD_DISCARD == 0 {
            let start = at + RECORD_HEADER as usize;
            let Some(data) = ring.get(start..start + len as usize) else {
                break;
            };
            records.push(RingRecord {
                data: data.to_vec(),
                raw: word & RECORD_RAW != 0,
            });
        }
        pos += total;
    }
    (records, pos)
}

/// The per-context values runtime.c asks `bpftime_gpu_config_*` for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RuntimeConfig {
    /// Device address of the `u64` that `bpf_get_current_pid_tgid` answers (the host
    /// process), 0 for none (it answers 0). An address, not the value, so that a probe's
    /// code is the same text in every run (see `arena`).
    pub pid_tgid_at: u64,
    /// Device address of the context's trace ring (`bpf_trace_printk`), 0 for none.
    pub trace_ring: u64,
    /// The sharded arrays among the probe's maps.
    pub shards: Vec<ShardEntry>,
}

/// The device runtime's LLVM bitcode, as build.rs compiled it from device/runtime.c. It
/// declares the functions [`config_ir`] defines.
pub const RUNTIME_BITCODE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/runtime.bc"));

/// The definitions of the device runtime's configuration, `config`'s values filled in:
/// the text IR a probe's `GpuEnv::library` gives, linked with [`RUNTIME_BITCODE`].
pub fn config_ir(config: &RuntimeConfig) -> String {
    let pid_tgid = match config.pid_tgid_at {
        0 => "define i64 @bpftime_gpu_config_pid_tgid() {\n  ret i64 0\n}".to_string(),
        at => format!(
            "define i64 @bpftime_gpu_config_pid_tgid() {{\n  \
             %p = inttoptr i64 {at} to ptr addrspace(1)\n  \
             %v = load i64, ptr addrspace(1) %p, align 8\n  ret i64 %v\n}}"
        ),
    };
    format!(
        "define i64 @bpftime_gpu_config_trace_ring() {{\n  ret i64 {}\n}}\n{pid_tgid}\n{}\n",
        config.trace_ring,
        shard_address_ir(&config.shards)
    )
}

#[cfg(test)]
mod tests;
