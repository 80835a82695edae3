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
    /// Bytes between two SMs' copies of `len` bytes of values: whole 256-byte blocks, so
    /// that no two SMs add into one cache line.
    pub fn stride_for(len: u64) -> u64 {
        len.div_ceil(256) * 256
    }

    /// Bytes of both regions of copies for `copies` SMs.
    pub fn shard_bytes(len: u64, copies: u32) -> u64 {
        2 * Self::stride_for(len) * copies as u64
    }
}

/// `bpftime_gpu_shard_address` for `shards`, as LLVM IR: a compare per array, with
/// every address a constant.
fn shard_address_ir(shards: &[ShardEntry]) -> String {
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
    /// An open-addressing table of `capacity` slots.
    Hash,
    /// Records in a ring the host drains into the store's ring buffer.
    Ringbuf,
    /// Records (each led by the perf flags) the host writes to the store's perf buffers.
    PerfEventArray,
}

/// The device kind of a map type, or why it has none.
pub fn device_kind(map_type: u32) -> Result<DeviceKind, String> {
    Ok(match map_type {
        map_type::ARRAY | map_type::PERCPU_ARRAY | map_type::GPU_ARRAY => DeviceKind::Array,
        map_type::HASH | map_type::PERCPU_HASH | map_type::GPU_HASH => DeviceKind::Hash,
        map_type::RINGBUF | map_type::GPU_RINGBUF => DeviceKind::Ringbuf,
        map_type::PERF_EVENT_ARRAY => DeviceKind::PerfEventArray,
        other => {
            return Err(format!(
                "map type {other} has no GPU replica (GPU probes use array, hash, per-CPU \
                 array and hash, ringbuf and perf_event_array maps)"
            ))
        }
    })
}

/// Whether a map type keeps one value per CPU: on the device, one per SM.
pub fn is_per_cpu(map_type: u32) -> bool {
    matches!(map_type, map_type::PERCPU_ARRAY | map_type::PERCPU_HASH)
}

/// Slots of a device hash table for `max_entries`: at least twice as many, a power of
/// two, so that probe sequences stay short and always meet an empty slot.
pub fn hash_capacity(max_entries: u32) -> u32 {
    (max_entries.max(1) as u64 * 2)
        .next_power_of_two()
        .min(1 << 31) as u32
}

/// FNV-1a, as runtime.c's `hash_key`.
pub fn hash_key(key: &[u8]) -> u32 {
    let mut h: u32 = 2_166_136_261;
    for &b in key {
        h ^= b as u32;
        h = h.wrapping_mul(16_777_619);
    }
    h
}

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
    pub fn build(&self, entries: &[(Vec<u8>, Vec<u8>)]) -> Result<HashImage, String> {
        let cap = self.capacity as usize;
        let mut image = HashImage {
            states: vec![SLOT_EMPTY; cap],
            keys: vec![0; cap * self.key_stride()],
            values: vec![0; cap * self.slot_values()],
        };
        if entries.len() > cap {
            return Err(format!("{} entries do not fit {cap} slots", entries.len()));
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
    /// What `bpf_get_current_pid_tgid` answers: the host process.
    pub pid_tgid: u64,
    /// Device address of the context's trace ring (`bpf_trace_printk`), 0 for none.
    pub trace_ring: u64,
    /// The sharded arrays among the probe's maps.
    pub shards: Vec<ShardEntry>,
}

/// The device runtime's LLVM IR, as build.rs compiled it from device/runtime.c.
const RUNTIME_IR: &str = include_str!(concat!(env!("OUT_DIR"), "/runtime.ll"));

/// The device runtime as LLVM IR with `config`'s values filled in: the IR a probe's
/// `GpuEnv::library` gives.
pub fn library_ir(config: &RuntimeConfig) -> String {
    let values = [
        ("bpftime_gpu_config_pid_tgid", config.pid_tgid),
        ("bpftime_gpu_config_trace_ring", config.trace_ring),
    ];
    RUNTIME_IR
        .lines()
        .map(|line| {
            for (name, value) in values {
                if line.starts_with("declare") && line.contains(&format!("@{name}(")) {
                    return format!("define i64 @{name}() {{\n  ret i64 {value}\n}}");
                }
            }
            if line.starts_with("declare") && line.contains("@bpftime_gpu_shard_address(") {
                return shard_address_ir(&config.shards);
            }
            line.to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
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
    fn library_ir_fills_in_the_configuration() {
        let shard = ShardEntry {
            base: 0x7100_0000,
            len: 16,
            shards64: 0x7200_0000,
            shards32: 0x7200_0000 + 256 * 132,
            stride: 256,
            copies: 132,
        };
        let ir = library_ir(&RuntimeConfig {
            pid_tgid: (42 << 32) | 42,
            trace_ring: 0x7000_0000,
            shards: vec![shard],
        });
        assert!(ir.contains("define i64 @bpftime_gpu_config_pid_tgid() {\n  ret i64 180388626474"));
        assert!(ir.contains(&format!("ret i64 {}", 0x7000_0000u64)));
        assert!(ir.contains(&format!("sub i64 %addr, {}", 0x7100_0000u64)));
        assert!(ir.contains(&format!(
            "i64 {}, i64 {}",
            0x7200_0000u64,
            0x7200_0000u64 + 256 * 132
        )));
        assert!(!ir.contains("declare dso_local i64 @bpftime_gpu_shard_address"));
        assert!(!ir.contains("declare dso_local i64 @bpftime_gpu_config"));
        for helper in bpftime_jit_ptx::EXTERN_HELPERS {
            assert!(
                ir.contains(&format!("@{}(", helper.1)),
                "{} missing",
                helper.1
            );
        }
        assert!(
            !ir.contains("target-cpu"),
            "CPU attributes stop inlining into probes"
        );
    }
}
