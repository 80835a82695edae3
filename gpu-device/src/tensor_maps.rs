//! The tensor maps a process encoded (`cuTensorMapEncodeTiled`), for memory-access probes
//! at tensor copies.
//!
//! A tensor copy (`cp.async.bulk.tensor`) names its global memory through a `CUtensorMap`,
//! 128 bytes whose layout NVIDIA does not document. The host sees each map made, with
//! what it was made from (the tensor's address, dimensions and strides, the box), so it
//! keeps a table of them, which GPU attach copies to each device that runs probed tensor
//! copies; the calls there find a copy's map in it by its 128 bytes
//! ([`bpftime_gpu_ptx::ptx::TENSOR_MAPS_GLOBAL`] has the layout).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use bpftime_gpu_ptx::ptx::{TENSOR_MAPS_HEAD, TENSOR_MAP_ENTRY};

/// Bytes of a `CUtensorMap`.
pub const MAP_BYTES: usize = 128;
/// Maps a table holds; later ones' copies are not probed (said once).
pub const MAX_MAPS: usize = 255;
/// Bytes of a device's table.
pub const TABLE_BYTES: usize = TENSOR_MAPS_HEAD + MAX_MAPS * TENSOR_MAP_ENTRY;

/// What `cuTensorMapEncodeTiled` was given, besides the map it wrote.
#[derive(Debug, Clone, Copy)]
pub struct Tiled<'a> {
    /// `CUtensorMapDataType`.
    pub data_type: u32,
    pub global_address: u64,
    /// Elements in each dimension, innermost first.
    pub dims: &'a [u64],
    /// Bytes from one element to the next in dimensions 1 and up (`rank - 1` of them).
    pub strides: &'a [u64],
    pub box_dims: &'a [u32],
    pub element_strides: &'a [u32],
    /// `CUtensorMapInterleave`; 0 is none.
    pub interleave: u32,
}

/// The bytes of one element of `CUtensorMapDataType` `data_type`; `None` for the packed
/// sub-byte types.
fn element_bytes(data_type: u32) -> Option<u32> {
    match data_type {
        // UINT8
        0 => Some(1),
        // UINT16, FLOAT16, BFLOAT16
        1 | 6 | 9 => Some(2),
        // UINT32, INT32, FLOAT32, FLOAT32_FTZ, TFLOAT32, TFLOAT32_FTZ
        2 | 3 | 7 | 10 | 11 | 12 => Some(4),
        // UINT64, INT64, FLOAT64
        4 | 5 | 8 => Some(8),
        _ => None,
    }
}

/// Why a tensor map's copies cannot be probed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorMapError {
    #[error("a tensor map of rank {0}")]
    Rank(usize),
    #[error("a tensor map of packed sub-byte elements (type {0})")]
    SubByteElements(u32),
    #[error("an interleaved tensor map")]
    Interleaved,
    #[error("a tensor map with element strides other than 1")]
    ElementStrides,
    #[error("more than {MAX_MAPS} tensor maps")]
    TooMany,
}

/// The table entry of `map`, made from `t`, or why its copies cannot be probed.
pub fn entry(
    map: &[u8; MAP_BYTES],
    t: &Tiled<'_>,
) -> Result<[u8; TENSOR_MAP_ENTRY], TensorMapError> {
    let rank = t.dims.len();
    if !(1..=5).contains(&rank)
        || t.strides.len() + 1 != rank
        || t.box_dims.len() != rank
        || t.element_strides.len() != rank
    {
        return Err(TensorMapError::Rank(rank));
    }
    let element = element_bytes(t.data_type).ok_or(TensorMapError::SubByteElements(t.data_type))?;
    if t.interleave != 0 {
        return Err(TensorMapError::Interleaved);
    }
    if t.element_strides.iter().any(|&s| s != 1) {
        return Err(TensorMapError::ElementStrides);
    }
    let mut e = [0u8; TENSOR_MAP_ENTRY];
    e[..MAP_BYTES].copy_from_slice(map);
    e[128..136].copy_from_slice(&t.global_address.to_le_bytes());
    e[136..140].copy_from_slice(&(rank as u32).to_le_bytes());
    e[140..144].copy_from_slice(&element.to_le_bytes());
    for d in 0..rank {
        let stride = if d == 0 {
            u64::from(element)
        } else {
            t.strides[d - 1]
        };
        e[144 + 8 * d..152 + 8 * d].copy_from_slice(&t.dims[d].to_le_bytes());
        e[184 + 8 * d..192 + 8 * d].copy_from_slice(&stride.to_le_bytes());
        e[224 + 4 * d..228 + 4 * d].copy_from_slice(&t.box_dims[d].to_le_bytes());
    }
    Ok(e)
}

/// The process's table: entries in the order maps were first made.
static ENTRIES: Mutex<Vec<[u8; TENSOR_MAP_ENTRY]>> = Mutex::new(Vec::new());
/// Changes to the table so far; a device's copy is current at the same count.
static GENERATION: AtomicU64 = AtomicU64::new(0);

fn entries() -> std::sync::MutexGuard<'static, Vec<[u8; TENSOR_MAP_ENTRY]>> {
    ENTRIES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Notes map `map`, just made from `t`: in the table unless one with the same bytes is,
/// or why its copies cannot be probed.
pub fn note(map: &[u8; MAP_BYTES], t: &Tiled<'_>) -> Result<(), TensorMapError> {
    let e = entry(map, t)?;
    let mut entries = entries();
    if entries.iter().any(|x| x[..MAP_BYTES] == map[..]) {
        return Ok(());
    }
    if entries.len() >= MAX_MAPS {
        return Err(TensorMapError::TooMany);
    }
    entries.push(e);
    GENERATION.fetch_add(1, Ordering::Release);
    Ok(())
}

/// After `cuTensorMapReplaceAddress` made `before` into `after`, pointing at
/// `global_address`: the entry follows (when `before` had one).
pub fn address_replaced(before: &[u8; MAP_BYTES], after: &[u8; MAP_BYTES], global_address: u64) {
    let mut entries = entries();
    let Some(i) = entries.iter().position(|x| x[..MAP_BYTES] == before[..]) else {
        return;
    };
    let mut e = entries[i];
    e[..MAP_BYTES].copy_from_slice(after);
    e[128..136].copy_from_slice(&global_address.to_le_bytes());
    if entries.iter().any(|x| x[..MAP_BYTES] == after[..]) {
        entries.remove(i);
    } else {
        entries[i] = e;
    }
    GENERATION.fetch_add(1, Ordering::Release);
}

/// The table's current generation, cheap to compare with a device copy's.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// The table as a device holds it, with its generation: the count, then the entries.
pub fn table() -> (u64, Vec<u8>) {
    let entries = entries();
    let generation = GENERATION.load(Ordering::Acquire);
    let mut bytes = vec![0u8; TENSOR_MAPS_HEAD + entries.len() * TENSOR_MAP_ENTRY];
    bytes[..4].copy_from_slice(&(entries.len() as u32).to_le_bytes());
    for (i, e) in entries.iter().enumerate() {
        let at = TENSOR_MAPS_HEAD + i * TENSOR_MAP_ENTRY;
        bytes[at..at + TENSOR_MAP_ENTRY].copy_from_slice(e);
    }
    (generation, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiled<'a>(
        dims: &'a [u64],
        strides: &'a [u64],
        boxes: &'a [u32],
        ones: &'a [u32],
    ) -> Tiled<'a> {
        Tiled {
            data_type: 7,
            global_address: 0x7f00_0000_0000,
            dims,
            strides,
            box_dims: boxes,
            element_strides: ones,
            interleave: 0,
        }
    }

    /// An entry holds the map's bytes and what the device reads at the offsets the
    /// splice's calls read (ptx.rs's `tensor_calls`).
    #[test]
    fn an_entry_lays_out_what_the_calls_read() {
        let map = [0xabu8; MAP_BYTES];
        let e = entry(&map, &tiled(&[1000, 500], &[4000], &[32, 16], &[1, 1])).unwrap();
        let word = |at: usize| u64::from_le_bytes(e[at..at + 8].try_into().unwrap());
        let half = |at: usize| u32::from_le_bytes(e[at..at + 4].try_into().unwrap());
        assert_eq!(&e[..MAP_BYTES], &map[..]);
        assert_eq!(word(128), 0x7f00_0000_0000);
        assert_eq!((half(136), half(140)), (2, 4));
        assert_eq!((word(144), word(152)), (1000, 500));
        assert_eq!((word(184), word(192)), (4, 4000));
        assert_eq!((half(224), half(228)), (32, 16));
    }

    #[test]
    fn maps_the_calls_cannot_follow_are_refused_with_the_reason() {
        let map = [0u8; MAP_BYTES];
        let mut t = tiled(&[64, 64], &[256], &[16, 16], &[2, 1]);
        assert_eq!(entry(&map, &t), Err(TensorMapError::ElementStrides));
        t.element_strides = &[1, 1];
        t.interleave = 1;
        assert_eq!(entry(&map, &t), Err(TensorMapError::Interleaved));
        t.interleave = 0;
        t.data_type = 13;
        assert_eq!(entry(&map, &t), Err(TensorMapError::SubByteElements(13)));
        t.data_type = 7;
        t.strides = &[];
        assert_eq!(entry(&map, &t), Err(TensorMapError::Rank(2)));
        // The notice names the reason.
        assert_eq!(
            TensorMapError::SubByteElements(13).to_string(),
            "a tensor map of packed sub-byte elements (type 13)"
        );
    }

    /// The table counts its entries, keeps one per distinct map, and follows an address
    /// replaced; each change moves the generation.
    #[test]
    fn the_table_keeps_one_entry_per_map_and_follows_replaced_addresses() {
        let (a, b, c) = ([1u8; MAP_BYTES], [2u8; MAP_BYTES], [3u8; MAP_BYTES]);
        let t = tiled(&[8], &[], &[8], &[1]);
        let before = generation();
        note(&a, &t).unwrap();
        note(&a, &t).unwrap();
        note(&b, &t).unwrap();
        let (g, bytes) = table();
        assert!(g >= before + 2);
        let count = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
        let at = |i: usize| TENSOR_MAPS_HEAD + i * TENSOR_MAP_ENTRY;
        let maps: Vec<u8> = (0..count).map(|i| bytes[at(i)]).collect();
        assert_eq!(maps.iter().filter(|&&m| m == 1).count(), 1);
        assert_eq!(maps.iter().filter(|&&m| m == 2).count(), 1);
        address_replaced(&a, &c, 0x1234);
        let (g2, bytes) = table();
        assert!(g2 > g);
        let i = (0..count).find(|&i| bytes[at(i)] == 3).unwrap();
        let addr = u64::from_le_bytes(bytes[at(i) + 128..at(i) + 136].try_into().unwrap());
        assert_eq!(addr, 0x1234);
        assert!((0..count).all(|i| bytes[at(i)] != 1));
    }
}
