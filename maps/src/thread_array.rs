//! bpftime's per-GPU-thread array (map type 1502, and 1512, its host-memory variant):
//! every GPU thread has its own copy of every value, so a probe updates its thread's
//! value without atomics.
//!
//! What bpftime's users rely on (read in bpftime's
//! `runtime/src/bpf_map/gpu/nv_gpu_per_thread_array_map.cpp`, `runtime/src/handler/
//! map_handler.cpp` and `attach/nv_attach_impl/trampoline/default_trampoline.cu`):
//! - The map is made for a thread count fixed at creation: `BPFTIME_MAP_GPU_THREAD_COUNT`
//!   in the creating (loader) process's environment, else 1024 (`gpu_thread_count` of
//!   `bpf_map_attr`). Here a non-zero `map_extra` may name it too.
//! - A thread's copy is the one of its global id, `z * W * H + y * W + x` where x, y, z
//!   are `blockIdx * blockDim + threadIdx` per axis, `W = gridDim.x * blockDim.x` and
//!   `H = gridDim.y * blockDim.y` (`getGlobalThreadId`); `blockIdx.x * blockDim.x +
//!   threadIdx.x` for a one-dimensional launch. bpftime writes past the map for a thread
//!   whose id is past the count (it prints a warning); here that thread's lookup is NULL
//!   and its update fails with -E2BIG.
//! - `bpf()`'s lookup of key `k` copies every thread's value of `k`, thread 0 first,
//!   `value_size` bytes apart (`BUF[MAX_ENTRIES][THREAD_COUNT][VALUE_SIZE]`): the
//!   caller's buffer holds `thread count * value_size` bytes (bpftime's threadhist reads
//!   7 of 1024 from a larger buffer; libbpf's `bpf_map__lookup_elem`, which knows no such
//!   type, checks only that it holds one). An update writes all of them from such a buffer.
//!   (bpftime's `bpf()` copies `value_size * 1024` bytes whatever the environment says:
//!   `get_userspace_value_size` multiplies by the attribute's default count, not the one
//!   the map was made for; here the copy is the map's own count.)
//!   A delete fails with EINVAL; keys beyond `max_entries` are ENOENT to a lookup and
//!   E2BIG to an update.
//!
//! The store keeps key `k`'s value of thread `t` at `(k * threads + t) * round8(value_size)`
//! in the data area, 8-byte aligned as every map value is; `bpf()` packs and unpacks.

use super::{array, err, round8, Map};
use crate::Result;

/// `BPF_MAP_LOOKUP_ELEM`: every thread's value of `key`, packed.
pub(super) fn lookup(map: &Map, key: &[u8], value: &mut [u8]) -> Result<()> {
    let idx = array::index(map, key)?;
    if idx >= map.max_entries() {
        return Err(err(libc::ENOENT, "index out of range"));
    }
    if value.len() != map.syscall_value_size() {
        return Err(err(libc::EINVAL, "value size mismatch"));
    }
    let size = map.value_size() as usize;
    let stride = round8(map.value_size());
    let base = array::slot(map, idx);
    for (t, out) in value.chunks_exact_mut(size).enumerate() {
        // SAFETY: the slot of `idx` (< max_entries) holds one value per thread, `stride`
        // bytes apart; `t` is below the thread count (the buffer holds that many values).
        unsafe { std::ptr::copy_nonoverlapping(base.add(t * stride), out.as_mut_ptr(), size) };
    }
    Ok(())
}

/// `BPF_MAP_UPDATE_ELEM`: every thread's value of `key`, from a packed buffer.
pub(super) fn update(map: &Map, key: &[u8], value: &[u8], flags: u64) -> Result<()> {
    let idx = array::update_index(map, key, flags)?;
    if value.len() != map.syscall_value_size() {
        return Err(err(libc::EINVAL, "value size mismatch"));
    }
    let size = map.value_size() as usize;
    let stride = round8(map.value_size());
    let base = array::slot(map, idx);
    for (t, v) in value.chunks_exact(size).enumerate() {
        // SAFETY: as in `lookup`.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), base.add(t * stride), size) };
    }
    map.header()
        .updates
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}
