//! Readable map contents and events for `bpftime run`: values decoded with the
//! object's BTF where it describes them (integers as numbers, structs as
//! `{ field=value ... }`, char arrays as strings, enums by name), raw bytes as
//! numbers and hex otherwise, and log2 histograms drawn as bars.

use crate::histogram;
use libbpf_rs::btf::{types, BtfKind, BtfType, TypeId};
use libbpf_rs::{AsRawLibbpf, Btf, HasSize, Map, MapCore, MapFlags, MapType, Object};
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Write as _;

/// The longest array printed element by element.
const MAX_ARRAY_ELEMS: usize = 64;
/// Arrays up to this many slots print every slot, zero or not.
const SMALL_ARRAY: u32 = 16;

/// The BTF of a loaded object, if it has any, and what we learned from it.
pub struct Types<'obj> {
    btf: Option<Btf<'obj>>,
    /// Record length -> the struct that describes records of that length.
    record_types: RefCell<HashMap<usize, Option<u32>>>,
}

/// Unsigned little-endian integer (the byte order of every target) of up to 8 bytes.
fn uint(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = bytes.len().min(8);
    b[..n].copy_from_slice(&bytes[..n]);
    u64::from_le_bytes(b)
}

fn sint(bytes: &[u8]) -> i64 {
    let v = uint(bytes);
    let bits = (bytes.len().min(8) * 8) as u32;
    if bits == 0 || bits == 64 {
        return v as i64;
    }
    let shift = 64 - bits;
    ((v << shift) as i64) >> shift
}

/// Bytes without type information: small integers as numbers, the rest as
/// 64-bit words and hex.
pub fn raw(bytes: &[u8]) -> String {
    match bytes.len() {
        1 | 2 | 4 | 8 => uint(bytes).to_string(),
        _ => dump(bytes),
    }
}

/// `u64[w0 w1 ...] hex[..]`: the words for counters and ids, the hex for the rest.
pub fn dump(bytes: &[u8]) -> String {
    let words: Vec<String> = bytes.chunks_exact(8).map(|c| uint(c).to_string()).collect();
    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    if words.is_empty() {
        format!("hex[{}]", hex.join(" "))
    } else {
        format!("u64[{}] hex[{}]", words.join(" "), hex.join(" "))
    }
}

fn name_of(t: &BtfType<'_>) -> Option<String> {
    t.name().map(|n| n.to_string_lossy().into_owned())
}

impl<'obj> Types<'obj> {
    pub fn new(btf: Option<Btf<'obj>>) -> Types<'obj> {
        Types {
            btf,
            record_types: RefCell::new(HashMap::new()),
        }
    }

    fn ty(&self, id: u32) -> Option<BtfType<'_>> {
        if id == 0 {
            return None;
        }
        self.btf.as_ref()?.type_by_id(TypeId::from(id))
    }

    fn size_of(t: BtfType<'_>) -> Option<usize> {
        let t = t.skip_mods_and_typedefs();
        Some(match t.kind() {
            BtfKind::Int => types::Int::try_from(t).ok()?.size(),
            BtfKind::Struct => types::Struct::try_from(t).ok()?.size(),
            BtfKind::Union => types::Union::try_from(t).ok()?.size(),
            BtfKind::Enum => types::Enum::try_from(t).ok()?.size(),
            BtfKind::Enum64 => types::Enum64::try_from(t).ok()?.size(),
            BtfKind::Float => types::Float::try_from(t).ok()?.size(),
            BtfKind::DataSec => types::DataSec::try_from(t).ok()?.size(),
            BtfKind::Ptr => 8,
            BtfKind::Array => {
                let a = types::Array::try_from(t).ok()?;
                a.capacity() * Self::size_of(a.contained_type())?
            }
            BtfKind::Var => return Self::size_of(t.next_type()?),
            _ => return None,
        })
    }

    /// A short name for type `id` (`__u32`, `struct event`), or the size.
    pub fn describe(&self, id: u32, size: u32) -> String {
        let Some(t) = self.ty(id) else {
            return format!("{size} bytes");
        };
        let kind = match t.skip_mods_and_typedefs().kind() {
            BtfKind::Struct => "struct ",
            BtfKind::Union => "union ",
            BtfKind::Enum | BtfKind::Enum64 => "enum ",
            _ => "",
        };
        let named =
            std::iter::successors(Some(t), |t| if t.is_mod() { t.next_type() } else { None })
                .find_map(|t| name_of(&t));
        match named {
            Some(n) if t.kind() == BtfKind::Typedef => n,
            Some(n) => format!("{kind}{n}"),
            None => format!("{kind}({size} bytes)"),
        }
    }

    /// The value as an unsigned number when type `id` is an integer (or, with
    /// no type information, when it is 1, 2, 4 or 8 bytes long).
    pub fn as_uint(&self, id: u32, bytes: &[u8]) -> Option<u64> {
        match self.ty(id).map(|t| t.skip_mods_and_typedefs()) {
            Some(t) if matches!(t.kind(), BtfKind::Int | BtfKind::Enum) => {
                (bytes.len() <= 8).then(|| uint(bytes))
            }
            Some(_) => None,
            None if self.btf.is_some() && id != 0 => None,
            None => matches!(bytes.len(), 1 | 2 | 4 | 8).then(|| uint(bytes)),
        }
    }

    /// The value as a number when type `id` is an integer or an enum of at most 8 bytes
    /// (signed where the type says so), or a float; with no type information, as
    /// [`Types::as_uint`] reads it.
    pub fn as_number(&self, id: u32, bytes: &[u8]) -> Option<f64> {
        let t = self.ty(id).map(|t| t.skip_mods_and_typedefs());
        match t {
            Some(t) if t.kind() == BtfKind::Int && bytes.len() <= 8 => {
                let signed = types::Int::try_from(t)
                    .is_ok_and(|i| matches!(i.encoding, types::IntEncoding::Signed));
                Some(if signed {
                    sint(bytes) as f64
                } else {
                    uint(bytes) as f64
                })
            }
            Some(t) if t.kind() == BtfKind::Float => match bytes.len() {
                4 => Some(f32::from_le_bytes(bytes.try_into().ok()?).into()),
                8 => Some(f64::from_le_bytes(bytes.try_into().ok()?)),
                _ => None,
            },
            _ => self.as_uint(id, bytes).map(|v| v as f64),
        }
    }

    /// The named members of struct type `id` laid over `bytes`, each with its type and
    /// bytes (bit fields and members past `bytes` left out); None when `id` is no struct.
    pub fn members<'b>(&self, id: u32, bytes: &'b [u8]) -> Option<Vec<(String, u32, &'b [u8])>> {
        let t = self.ty(id)?.skip_mods_and_typedefs();
        if t.kind() != BtfKind::Struct {
            return None;
        }
        let c = types::Composite::try_from(t).ok()?;
        Some(
            (0..c.len())
                .filter_map(|i| c.get(i))
                .filter_map(|m| {
                    let types::MemberAttr::Normal { offset } = m.attr else {
                        return None;
                    };
                    let name = m.name?.to_string_lossy().into_owned();
                    let ty: u32 = m.ty.into();
                    let len = Self::size_of(self.ty(ty)?)?;
                    let start = offset as usize / 8;
                    Some((name, ty, bytes.get(start..start + len)?))
                })
                .collect(),
        )
    }

    /// Type `id` applied to `bytes` as a label's text: a character array as the string it
    /// holds (to its first NUL), anything else as [`Types::format`] shows it.
    pub fn label_text(&self, id: u32, bytes: &[u8]) -> String {
        let is_chars = self
            .ty(id)
            .map(|t| t.skip_mods_and_typedefs())
            .and_then(|t| types::Array::try_from(t).ok())
            .is_some_and(|a| {
                let elem = a.contained_type().skip_mods_and_typedefs();
                elem.kind() == BtfKind::Int && Self::size_of(elem) == Some(1)
            });
        if is_chars {
            let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
            return String::from_utf8_lossy(&bytes[..end]).into_owned();
        }
        self.format(id, bytes)
    }

    /// Whether type `id` is a data section (`.bss`, `.data`, `.rodata`).
    pub fn is_datasec(&self, id: u32) -> bool {
        self.ty(id).is_some_and(|t| t.kind() == BtfKind::DataSec)
    }

    /// `name: value` for each variable of data section `id`.
    pub fn datasec_vars(&self, id: u32, bytes: &[u8]) -> Vec<(String, String)> {
        self.datasec_numbers(id, bytes)
            .into_iter()
            .map(|(name, ty, data)| (name, self.format(ty, data)))
            .collect()
    }

    /// Each variable of data section `id` laid over `bytes`: its name, type and bytes.
    pub fn datasec_numbers<'b>(&self, id: u32, bytes: &'b [u8]) -> Vec<(String, u32, &'b [u8])> {
        let Some(sec) = self.ty(id).and_then(|t| types::DataSec::try_from(t).ok()) else {
            return Vec::new();
        };
        (0..sec.len())
            .filter_map(|i| sec.get(i))
            .filter_map(|v| {
                let var = self.ty(v.ty.into())?;
                let name = name_of(&var).unwrap_or_else(|| "?".into());
                let start = v.offset as usize;
                let data = bytes.get(start..start + v.size)?;
                Some((name, u32::from(var.next_type()?.type_id()), data))
            })
            .collect()
    }

    /// Type `id` applied to `bytes`; raw bytes when there is no such type.
    pub fn format(&self, id: u32, bytes: &[u8]) -> String {
        match self.ty(id) {
            Some(t) if Self::size_of(t) == Some(bytes.len()) => {
                let mut s = String::new();
                self.write(t, bytes, &mut s, 0);
                s
            }
            _ => raw(bytes),
        }
    }

    /// The struct that describes records of `len` bytes (ring buffers and
    /// perf buffers carry no type): the only named struct of that size, or of
    /// that size less the perf buffer's padding to 8 bytes.
    pub fn record_type(&self, len: usize) -> Option<u32> {
        if let Some(found) = self.record_types.borrow().get(&len) {
            return *found;
        }
        let found = self.btf.as_ref().and_then(|btf| {
            let mut exact = Vec::new();
            let mut padded = Vec::new();
            for s in btf.type_by_kind::<types::Struct<'_>>() {
                if s.name().is_none() {
                    continue;
                }
                let size = s.size();
                if size == len {
                    exact.push(u32::from(s.type_id()));
                } else if size < len && len - size < 8 {
                    padded.push(u32::from(s.type_id()));
                }
            }
            match (exact.as_slice(), padded.as_slice()) {
                ([one], _) => Some(*one),
                ([], [one]) => Some(*one),
                _ => None,
            }
        });
        self.record_types.borrow_mut().insert(len, found);
        found
    }

    fn write(&self, t: BtfType<'_>, bytes: &[u8], out: &mut String, depth: usize) {
        let t = t.skip_mods_and_typedefs();
        if depth > 8 {
            out.push_str(&raw(bytes));
            return;
        }
        match t.kind() {
            BtfKind::Int => {
                let Ok(int) = types::Int::try_from(t) else {
                    out.push_str(&raw(bytes));
                    return;
                };
                let _ = match int.encoding {
                    types::IntEncoding::Bool => write!(out, "{}", uint(bytes) != 0),
                    types::IntEncoding::Char if bytes.len() == 1 && bytes[0].is_ascii_graphic() => {
                        write!(out, "'{}'", bytes[0] as char)
                    }
                    types::IntEncoding::Signed if bytes.len() <= 8 => {
                        write!(out, "{}", sint(bytes))
                    }
                    _ if bytes.len() <= 8 => write!(out, "{}", uint(bytes)),
                    _ => write!(out, "{}", raw(bytes)),
                };
            }
            BtfKind::Ptr => {
                let _ = write!(out, "{:#x}", uint(bytes));
            }
            BtfKind::Enum => self.write_enum(t, bytes, out),
            BtfKind::Enum64 => {
                let v = uint(bytes) as i128;
                let name = types::Enum64::try_from(t).ok().and_then(|e| {
                    (0..e.len())
                        .filter_map(|i| e.get(i))
                        .find(|m| m.value == v || m.value as u64 as i128 == v)
                        .and_then(|m| m.name.map(|n| n.to_string_lossy().into_owned()))
                });
                match name {
                    Some(n) => out.push_str(&n),
                    None => {
                        let _ = write!(out, "{}", uint(bytes));
                    }
                }
            }
            BtfKind::Float => {
                let _ = match bytes.len() {
                    4 => write!(
                        out,
                        "{}",
                        f32::from_le_bytes(bytes.try_into().unwrap_or([0; 4]))
                    ),
                    8 => write!(
                        out,
                        "{}",
                        f64::from_le_bytes(bytes.try_into().unwrap_or([0; 8]))
                    ),
                    _ => write!(out, "{}", raw(bytes)),
                };
            }
            BtfKind::Array => self.write_array(t, bytes, out, depth),
            BtfKind::Struct | BtfKind::Union => self.write_composite(t, bytes, out, depth),
            _ => out.push_str(&raw(bytes)),
        }
    }

    fn write_enum(&self, t: BtfType<'_>, bytes: &[u8], out: &mut String) {
        let Ok(e) = types::Enum::try_from(t) else {
            out.push_str(&raw(bytes));
            return;
        };
        let v = if e.is_signed() {
            sint(bytes)
        } else {
            uint(bytes) as i64
        };
        let name = (0..e.len())
            .filter_map(|i| e.get(i))
            .find(|m| m.value == v)
            .and_then(|m| m.name.map(|n| n.to_string_lossy().into_owned()));
        match name {
            Some(n) => out.push_str(&n),
            None => {
                let _ = write!(out, "{v}");
            }
        }
    }

    fn write_array(&self, t: BtfType<'_>, bytes: &[u8], out: &mut String, depth: usize) {
        let Ok(a) = types::Array::try_from(t) else {
            out.push_str(&raw(bytes));
            return;
        };
        let elem = a.contained_type().skip_mods_and_typedefs();
        let Some(esize) = Self::size_of(elem).filter(|&s| s > 0) else {
            out.push_str(&raw(bytes));
            return;
        };
        let is_char = esize == 1
            && types::Int::try_from(elem).is_ok_and(|i| {
                matches!(i.encoding, types::IntEncoding::Char)
                    || name_of(&elem).is_some_and(|n| n.contains("char"))
            });
        if is_char {
            let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
            let _ = write!(out, "{:?}", String::from_utf8_lossy(&bytes[..end]));
            return;
        }
        out.push('[');
        for (i, chunk) in bytes.chunks_exact(esize).enumerate() {
            if i == MAX_ARRAY_ELEMS {
                let _ = write!(out, " ...{} more", bytes.len() / esize - i);
                break;
            }
            if i > 0 {
                out.push(' ');
            }
            self.write(elem, chunk, out, depth + 1);
        }
        out.push(']');
    }

    fn write_composite(&self, t: BtfType<'_>, bytes: &[u8], out: &mut String, depth: usize) {
        let Ok(c) = types::Composite::try_from(t) else {
            out.push_str(&raw(bytes));
            return;
        };
        out.push_str("{ ");
        for i in 0..c.len() {
            let Some(m) = c.get(i) else { continue };
            let Some(mt) = self.ty(m.ty.into()) else {
                continue;
            };
            let (bit_off, bit_size) = match m.attr {
                types::MemberAttr::Normal { offset } => (offset as usize, None),
                types::MemberAttr::BitField { size, offset } => (offset as usize, Some(size)),
            };
            if let Some(name) = m.name {
                let _ = write!(out, "{}=", name.to_string_lossy());
            }
            match bit_size {
                Some(bits) => {
                    let first = bit_off / 8;
                    let word = uint(
                        bytes
                            .get(first..(first + 8).min(bytes.len()))
                            .unwrap_or(&[]),
                    );
                    let v = (word >> (bit_off % 8)) & (u64::MAX >> (64 - bits.min(64) as u32));
                    let _ = write!(out, "{v}");
                }
                None => {
                    let start = bit_off / 8;
                    let len = Self::size_of(mt).unwrap_or(0);
                    match bytes.get(start..start + len) {
                        Some(b) => self.write(mt, b, out, depth + 1),
                        None => out.push('?'),
                    }
                }
            }
            out.push(' ');
        }
        out.push('}');
    }
}

impl Types<'_> {
    /// The unsigned integer fields `names` of a record (its type found as
    /// [`Types::record_type`] finds it); `None` unless it has them all.
    pub fn record_fields<const N: usize>(&self, data: &[u8], names: [&str; N]) -> Option<[u64; N]> {
        let id = self.record_type(data.len())?;
        let t = self.ty(id)?.skip_mods_and_typedefs();
        let c = types::Composite::try_from(t).ok()?;
        let mut out = [0u64; N];
        for (slot, want) in out.iter_mut().zip(names) {
            let m = (0..c.len())
                .filter_map(|i| c.get(i))
                .find(|m| m.name.is_some_and(|n| n.to_string_lossy() == want))?;
            let types::MemberAttr::Normal { offset } = m.attr else {
                return None;
            };
            let mt = self.ty(m.ty.into())?;
            let size = Self::size_of(mt)?;
            let start = offset as usize / 8;
            *slot = self.as_uint(m.ty.into(), data.get(start..start + size)?)?;
        }
        Some(out)
    }
}

/// One line per ring buffer or perf buffer record.
pub fn event_line(types: &Types<'_>, map: &str, data: &[u8]) -> String {
    let typed = types.record_type(data.len()).and_then(|id| {
        let t = types.ty(id)?;
        let size = Types::size_of(t)?;
        let mut s = String::new();
        types.write(t, data.get(..size)?, &mut s, 0);
        Some(format!("{} {s}", types.describe(id, size as u32)))
    });
    match typed {
        Some(text) => format!("event {map} {}B {text}", data.len()),
        None => format!("event {map} {}B {}", data.len(), dump(data)),
    }
}

pub(crate) fn btf_ids(map: &Map<'_>) -> (u32, u32) {
    let raw = map.as_libbpf_object().as_ptr();
    // SAFETY: `raw` is a live map of a loaded object; both calls only read it.
    unsafe {
        (
            libbpf_rs::libbpf_sys::bpf_map__btf_key_type_id(raw),
            libbpf_rs::libbpf_sys::bpf_map__btf_value_type_id(raw),
        )
    }
}

/// The map's type as its object declares it: bpftime's GPU types too, which libbpf-rs
/// has no name for.
pub fn declared_type(map: &Map<'_>) -> u32 {
    let raw = map.as_libbpf_object().as_ptr();
    // SAFETY: `raw` is a live map of an open object; the call only reads it.
    unsafe { libbpf_rs::libbpf_sys::bpf_map__type(raw) }
}

/// What the map is served as: bpftime's shared GPU arrays and hash map are arrays and
/// hash maps, its GPU ring buffer a ring buffer; other types are themselves.
pub fn served_type(map: &Map<'_>) -> MapType {
    use bpftime_isa::uapi::map_type as mt;
    match mt::served_as(declared_type(map)) {
        mt::GPU_RINGBUF => MapType::RingBuf,
        t => MapType::from(t),
    }
}

/// A per-thread array's keys, each with its threads' values as runs of threads holding
/// the same value (`0-1023=5`; at most 16 runs a key, then how many more): every key of
/// every thread the map was made for, which the store says.
fn per_thread_lines(
    map: &Map<'_>,
    store: &bpftime_runtime::Store,
    types: &Types<'_>,
    value_id: u32,
) -> Vec<String> {
    const RUNS_SHOWN: usize = 16;
    let name = map.name().to_string_lossy().into_owned();
    let opened = map
        .info()
        .map_err(|e| format!("cannot find the map in the store: {e}"))
        .and_then(|info| {
            bpftime_runtime::Map::open(store, info.info.id)
                .map_err(|e| format!("cannot read the map in the store: {e}"))
        });
    let held = match opened {
        Ok(m) => m,
        Err(e) => return vec![format!("{name} (gpu_per_thread_array): {e}")],
    };
    let threads = held.gpu_threads().unwrap_or(0) as usize;
    let size = map.value_size() as usize;
    let mut out = vec![format!(
        "{name} (gpu_per_thread_array {} -> {}, {} entries of {threads} GPU threads):",
        types.describe(btf_ids(map).0, map.key_size()),
        types.describe(value_id, map.value_size()),
        map.max_entries(),
    )];
    let mut values = vec![0u8; held.syscall_value_size()];
    for key in 0..map.max_entries() {
        if held.lookup(&key.to_ne_bytes(), &mut values).is_err() || size == 0 {
            continue;
        }
        let mut runs: Vec<(usize, usize, String)> = Vec::new();
        for (t, v) in values.chunks_exact(size).enumerate().take(threads) {
            let text = types.format(value_id, v);
            match runs.last_mut() {
                Some((_, end, last)) if *last == text => *end = t,
                _ => runs.push((t, t, text)),
            }
        }
        let mut line = format!("{name}[{key}]:");
        for (from, to, v) in runs.iter().take(RUNS_SHOWN) {
            if from == to {
                let _ = write!(line, " {from}={v}");
            } else {
                let _ = write!(line, " {from}-{to}={v}");
            }
        }
        if runs.len() > RUNS_SHOWN {
            let _ = write!(line, " ... ({} more runs)", runs.len() - RUNS_SHOWN);
        }
        out.push(line);
    }
    out
}

/// The map's type as `bpftime run` names it: bpftime's GPU types by their names there.
fn label(map: &Map<'_>) -> String {
    use bpftime_isa::uapi::map_type as mt;
    match declared_type(map) {
        mt::GPU_HASH => "gpu_hash".into(),
        mt::GPU_ARRAY => "gpu_array".into(),
        mt::GPU_KERNEL_SHARED_ARRAY => "gpu_kernel_shared_array".into(),
        mt::GPU_ARRAY_HOST => "gpu_array_host".into(),
        mt::GPU_RINGBUF => "gpu_ringbuf".into(),
        _ => kind_name(served_type(map)),
    }
}

pub(crate) fn kind_name(t: MapType) -> String {
    match t {
        MapType::Hash => "hash".into(),
        MapType::Array => "array".into(),
        MapType::PercpuHash => "percpu_hash".into(),
        MapType::PercpuArray => "percpu_array".into(),
        MapType::LruHash => "lru_hash".into(),
        MapType::LruPercpuHash => "lru_percpu_hash".into(),
        MapType::RingBuf => "ringbuf".into(),
        MapType::PerfEventArray => "perf_event_array".into(),
        MapType::ProgArray => "prog_array".into(),
        MapType::Queue => "queue".into(),
        MapType::Stack => "stack".into(),
        MapType::StackTrace => "stack_trace".into(),
        other => format!("{other:?}").to_lowercase(),
    }
}

/// Whether a map holds a log2 histogram: named like one (`hist`, `slots`),
/// keyed by a slot number, counting in 64-bit integers.
fn is_log2_histogram(map: &Map<'_>, types: &Types<'_>, key_id: u32, value_id: u32) -> bool {
    let name = map.name().to_string_lossy().to_lowercase();
    let named = name.contains("hist") || name.contains("slot");
    let keyed = matches!(map.key_size(), 4 | 8)
        && types
            .as_uint(key_id, &vec![0; map.key_size() as usize])
            .is_some();
    let counts = map.value_size() == 8 && types.as_uint(value_id, &[0; 8]).is_some();
    let kinds = matches!(
        served_type(map),
        MapType::Array
            | MapType::PercpuArray
            | MapType::Hash
            | MapType::PercpuHash
            | MapType::LruHash
            | MapType::LruPercpuHash
    );
    named && keyed && counts && kinds
}

/// The keys to print of an array or a stack trace map larger than [`SMALL_ARRAY`]:
/// those that hold something, found in the store in time that follows what the map
/// holds (walking every index of a 2^31-entry array takes hours).
fn present_keys(map: &Map<'_>, store: &bpftime_runtime::Store) -> Result<Vec<Vec<u8>>, String> {
    let id = map
        .info()
        .map_err(|e| format!("cannot find the map in the store: {e}"))?
        .info
        .id;
    let keys = bpftime_runtime::Map::open(store, id)
        .and_then(|m| m.present_keys())
        .map_err(|e| format!("cannot read the map in the store: {e}"))?
        .ok_or_else(|| "the store's map is not an array".to_string())?;
    Ok(keys.into_iter().map(|k| k.to_ne_bytes().to_vec()).collect())
}

/// The keys of `map` to print: every key, or, for an array or a stack trace map
/// larger than [`SMALL_ARRAY`], those that hold something (see [`present_keys`]).
pub(crate) fn keys_to_print<'m>(
    map: &'m Map<'_>,
    store: &bpftime_runtime::Store,
) -> Result<Box<dyn Iterator<Item = Vec<u8>> + 'm>, String> {
    let sparse = matches!(
        served_type(map),
        MapType::Array | MapType::PercpuArray | MapType::StackTrace
    ) && map.max_entries() > SMALL_ARRAY;
    if sparse {
        Ok(Box::new(present_keys(map, store)?.into_iter()))
    } else {
        Ok(Box::new(map.keys()))
    }
}

/// The entries of `keys` with per-CPU values folded: integers summed, other
/// values listed by CPU.
pub(crate) fn entries(
    map: &Map<'_>,
    keys: impl Iterator<Item = Vec<u8>>,
    types: &Types<'_>,
    value_id: u32,
) -> Vec<(Vec<u8>, Value)> {
    let percpu = served_type(map).is_percpu();
    keys.filter_map(|k| {
        if percpu {
            let per_cpu = map.lookup_percpu(&k, MapFlags::ANY).ok()??;
            let sums: Option<u64> = per_cpu.iter().map(|v| types.as_uint(value_id, v)).sum();
            Some((
                k,
                match sums {
                    Some(s) => Value::Number(s),
                    None => Value::PerCpu(per_cpu),
                },
            ))
        } else {
            let v = map.lookup(&k, MapFlags::ANY).ok()??;
            Some((k, Value::Bytes(v)))
        }
    })
    .collect()
}

pub(crate) enum Value {
    Bytes(Vec<u8>),
    Number(u64),
    PerCpu(Vec<Vec<u8>>),
}

impl Value {
    fn as_uint(&self, types: &Types<'_>, value_id: u32) -> Option<u64> {
        match self {
            Value::Bytes(b) => types.as_uint(value_id, b),
            Value::Number(n) => Some(*n),
            Value::PerCpu(_) => None,
        }
    }

    fn format(&self, types: &Types<'_>, value_id: u32) -> String {
        match self {
            Value::Bytes(b) => types.format(value_id, b),
            Value::Number(n) => n.to_string(),
            Value::PerCpu(v) => {
                let cpus: Vec<String> = v
                    .iter()
                    .enumerate()
                    .map(|(cpu, b)| format!("cpu{cpu}: {}", types.format(value_id, b)))
                    .collect();
                format!("[{}]", cpus.join(", "))
            }
        }
    }

    fn is_zero(&self) -> bool {
        match self {
            Value::Bytes(b) => b.iter().all(|&x| x == 0),
            Value::Number(n) => *n == 0,
            Value::PerCpu(v) => v.iter().flatten().all(|&x| x == 0),
        }
    }
}

/// The traces of a stack trace map, by id: `name[id]:` and one line per
/// frame, innermost first, named by `frame` (`    func+off (file)`, as
/// bpftrace's `ustack` prints them).
fn stack_traces(
    map: &Map<'_>,
    keys: impl Iterator<Item = Vec<u8>>,
    frame: &mut dyn FnMut(u64) -> String,
) -> Vec<String> {
    let name = map.name().to_string_lossy().into_owned();
    let mut ids: Vec<(u32, Vec<u8>)> = keys
        .filter_map(|k| {
            let id = u32::from_ne_bytes(k.as_slice().try_into().ok()?);
            Some((id, map.lookup(&k, MapFlags::ANY).ok()??))
        })
        .collect();
    ids.sort_by_key(|(id, _)| *id);
    let mut out = vec![format!(
        "{name} (stack_trace, {} stacks of up to {} frames):",
        ids.len(),
        map.value_size() / 8
    )];
    for (id, trace) in ids {
        out.push(format!("{name}[{id}]:"));
        out.extend(
            trace
                .chunks_exact(8)
                .map(uint)
                .take_while(|&ip| ip != 0)
                .map(|ip| format!("    {}", frame(ip))),
        );
    }
    out
}

/// The contents of every map of `obj`, as lines. `events` counts the records
/// each ring buffer or perf buffer delivered; `frame` names a user-space
/// address of a stack trace; `store` holds the maps.
pub fn dump_maps(
    obj: &Object,
    store: &bpftime_runtime::Store,
    types: &Types<'_>,
    events: &HashMap<String, u64>,
    frame: &mut dyn FnMut(u64) -> String,
) -> Vec<String> {
    let mut out = Vec::new();
    for map in obj.maps() {
        let name = map.name().to_string_lossy().into_owned();
        let (key_id, value_id) = btf_ids(&map);
        let kind = served_type(&map);
        if bpftime_isa::uapi::map_type::is_per_gpu_thread(declared_type(&map)) {
            out.extend(per_thread_lines(&map, store, types, value_id));
            continue;
        }
        match kind {
            // Keys are 32-bit stack ids (the kernel refuses any other size).
            MapType::StackTrace if map.key_size() == 4 => {
                match keys_to_print(&map, store) {
                    Ok(keys) => out.extend(stack_traces(&map, keys, frame)),
                    Err(e) => out.push(format!("{name} (stack_trace): {e}")),
                }
                continue;
            }
            MapType::RingBuf | MapType::PerfEventArray => {
                out.push(format!(
                    "{name} ({}): {} events",
                    label(&map),
                    events.get(&name).copied().unwrap_or(0)
                ));
                continue;
            }
            MapType::Array
            | MapType::PercpuArray
            | MapType::Hash
            | MapType::PercpuHash
            | MapType::LruHash
            | MapType::LruPercpuHash => {}
            _ => {
                out.push(format!("{name} ({}): contents not shown", label(&map)));
                continue;
            }
        }
        if name.contains(".rodata.str") {
            // String literals the programs use (printk formats): no BTF, just text.
            if let Ok(Some(bytes)) = map.lookup(&0u32.to_ne_bytes(), MapFlags::ANY) {
                let strings: Vec<String> = bytes
                    .split(|&b| b == 0)
                    .filter(|s| !s.is_empty())
                    .map(|s| format!("{:?}", String::from_utf8_lossy(s)))
                    .collect();
                out.push(format!("{name} (string constants): {}", strings.join(" ")));
            }
            continue;
        }
        if types.is_datasec(value_id) {
            out.push(format!("{name} (global variables):"));
            if let Ok(Some(bytes)) = map.lookup(&0u32.to_ne_bytes(), MapFlags::ANY) {
                for (var, value) in types.datasec_vars(value_id, &bytes) {
                    out.push(format!("{var}: {value}"));
                }
            }
            continue;
        }
        let key_size = map.key_size();
        let list = match keys_to_print(&map, store) {
            Ok(keys) => entries(&map, keys, types, value_id),
            Err(e) => {
                out.push(format!("{name} ({}): {e}", label(&map)));
                continue;
            }
        };
        let header = format!(
            "{} -> {}",
            types.describe(key_id, key_size),
            types.describe(value_id, map.value_size())
        );
        if is_log2_histogram(&map, types, key_id, value_id) {
            out.push(format!(
                "{name} (log2 histogram; {} {header}):",
                label(&map)
            ));
            let counts: Vec<(u32, u64)> = list
                .iter()
                .filter_map(|(k, v)| {
                    Some((
                        types.as_uint(key_id, k)? as u32,
                        v.as_uint(types, value_id)?,
                    ))
                })
                .collect();
            out.extend(histogram::draw(&counts));
            continue;
        }
        let is_array = matches!(kind, MapType::Array | MapType::PercpuArray);
        // Every index of an array is an entry, read or not.
        let total = if is_array {
            map.max_entries() as usize
        } else {
            list.len()
        };
        out.push(format!(
            "{name} ({} {header}, {total} entries):",
            label(&map),
        ));
        let show_zero = !is_array || map.max_entries() <= SMALL_ARRAY;
        let mut shown: Vec<(Option<u64>, String, String)> = list
            .iter()
            .filter(|(_, v)| show_zero || !v.is_zero())
            .map(|(k, v)| {
                (
                    types.as_uint(key_id, k),
                    types.format(key_id, k),
                    v.format(types, value_id),
                )
            })
            .collect();
        if !is_array {
            shown.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        }
        let hidden = total - shown.len();
        for (_, k, v) in shown {
            out.push(format!("{name}[{k}]: {v}"));
        }
        if hidden > 0 {
            out.push(format!("({hidden} zero entries of {name} not shown)"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_bytes() {
        assert_eq!(raw(&7u32.to_le_bytes()), "7");
        assert_eq!(raw(&[1, 2, 3]), "hex[01 02 03]");
        let mut b = 5u64.to_le_bytes().to_vec();
        b.extend([0xff, 0]);
        assert_eq!(dump(&b), "u64[5] hex[05 00 00 00 00 00 00 00 ff 00]");
    }

    #[test]
    fn sign_extension() {
        assert_eq!(sint(&[0xff]), -1);
        assert_eq!(sint(&(-5i32).to_le_bytes()), -5);
        assert_eq!(sint(&(-5i64).to_le_bytes()), -5);
    }
}
