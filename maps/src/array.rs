use super::{current_cpu, err, round8, Map};
use crate::Result;
use bpftime_isa::uapi::update_flags;
use std::sync::atomic::{AtomicU32, Ordering};

pub(super) fn index(map: &Map, key: &[u8]) -> Result<u32> {
    map.check_key(key)?;
    Ok(u32::from_ne_bytes([key[0], key[1], key[2], key[3]]))
}

/// The index an update of `key` with `flags` writes, checked in the kernel's order:
/// unknown flags, then the index, then `BPF_NOEXIST` (every element of an array exists).
/// The GPU and x86 JITs' inlined updates give the same answers (bpftime-lifter).
pub(super) fn update_index(map: &Map, key: &[u8], flags: u64) -> Result<u32> {
    if flags & !update_flags::LOCK > update_flags::EXIST {
        return Err(err(libc::EINVAL, "unknown update flags"));
    }
    let idx = index(map, key)?;
    if idx >= map.max_entries() {
        return Err(err(libc::E2BIG, "index out of range"));
    }
    if flags & !update_flags::LOCK == update_flags::NOEXIST {
        return Err(err(libc::EEXIST, "array elements always exist"));
    }
    Ok(idx)
}

pub(super) fn slot(map: &Map, idx: u32) -> *mut u8 {
    let stride = round8(map.value_size());
    let copies = map.value_copies();
    // SAFETY: callers check idx < max_entries; the data area holds max_entries * copies slots.
    unsafe { map.data().add(idx as usize * stride * copies) }
}

pub(super) fn lookup(map: &Map, key: &[u8], value: &mut [u8]) -> Result<()> {
    let idx = index(map, key)?;
    if idx >= map.max_entries() {
        return Err(err(libc::ENOENT, "index out of range"));
    }
    copy_out(map, slot(map, idx), value)
}

/// Copies a (possibly per-CPU) value out to a `bpf()` buffer.
pub(super) fn copy_out(map: &Map, src: *const u8, value: &mut [u8]) -> Result<()> {
    if value.len() != map.syscall_value_size() {
        return Err(err(libc::EINVAL, "value size mismatch"));
    }
    // SAFETY: `src` points at a value of the map, which holds syscall_value_size bytes
    // (per-CPU slots are laid out exactly as bpf() expects them).
    unsafe { std::ptr::copy_nonoverlapping(src, value.as_mut_ptr(), value.len()) };
    Ok(())
}

pub(super) fn update(map: &Map, key: &[u8], value: &[u8], flags: u64) -> Result<()> {
    let idx = update_index(map, key, flags)?;
    if value.len() != map.syscall_value_size() {
        return Err(err(libc::EINVAL, "value size mismatch"));
    }
    let dst = slot(map, idx);
    if map.kind.percpu() {
        // SAFETY: per-CPU slots are contiguous and value holds all of them.
        unsafe { std::ptr::copy_nonoverlapping(value.as_ptr(), dst, value.len()) };
    } else {
        // SAFETY: one slot of value_size bytes.
        unsafe { std::ptr::copy_nonoverlapping(value.as_ptr(), dst, map.value_size() as usize) };
    }
    map.header()
        .updates
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// # Safety
/// `key` points to 4 readable bytes.
pub(super) unsafe fn prog_lookup(map: &Map, key: *const u8, percpu: bool) -> *mut u8 {
    // SAFETY: caller obligation.
    let idx = unsafe { std::ptr::read_unaligned(key.cast::<u32>()) };
    if idx >= map.max_entries() {
        return std::ptr::null_mut();
    }
    let p = slot(map, idx);
    if percpu {
        // SAFETY: the slot holds ncpus copies.
        unsafe { p.add(current_cpu(map.ncpus()) * round8(map.value_size())) }
    } else {
        p
    }
}

pub(super) fn prog_update(
    map: &Map,
    key: &[u8],
    value: *const u8,
    flags: u64,
    percpu: bool,
) -> Result<()> {
    let idx = update_index(map, key, flags)?;
    let mut dst = slot(map, idx);
    if percpu {
        // SAFETY: the slot holds ncpus copies.
        dst = unsafe { dst.add(current_cpu(map.ncpus()) * round8(map.value_size())) };
    }
    // SAFETY: the program's value holds value_size bytes (verified); dst is one value slot.
    unsafe { std::ptr::copy_nonoverlapping(value, dst, map.value_size() as usize) };
    map.header()
        .updates
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

pub(super) fn next_key(map: &Map, key: Option<&[u8]>, out: &mut [u8]) -> Result<()> {
    let max = map.max_entries();
    let next = match key {
        None => 0,
        Some(k) => {
            let i = u32::from_ne_bytes([k[0], k[1], k[2], k[3]]);
            if i >= max {
                0
            } else if i == max - 1 {
                return Err(err(libc::ENOENT, "last element"));
            } else {
                i + 1
            }
        }
    };
    out.copy_from_slice(&next.to_ne_bytes());
    Ok(())
}

fn id_slot(map: &Map, idx: u32) -> &AtomicU32 {
    // SAFETY: callers check idx < max_entries; id arrays hold max_entries u32 slots.
    unsafe { &*(map.data().cast::<AtomicU32>().add(idx as usize)) }
}

/// Stores an object id at `key` of an array of ids (a prog, perf event or cgroup array,
/// an array of maps), which, as the kernel's arrays of file descriptors, takes
/// `BPF_ANY` only.
pub(super) fn set_id(map: &Map, key: &[u8], id: u32, flags: u64) -> Result<()> {
    if flags != update_flags::ANY {
        return Err(err(
            libc::EINVAL,
            "arrays of file descriptors take BPF_ANY only",
        ));
    }
    let idx = update_index(map, key, flags)?;
    id_slot(map, idx).store(id, Ordering::Release);
    Ok(())
}

pub(super) fn clear_id(map: &Map, key: &[u8]) -> Result<()> {
    let idx = index(map, key)?;
    if idx >= map.max_entries() {
        return Err(err(libc::E2BIG, "index past the array's end"));
    }
    if id_slot(map, idx).swap(0, Ordering::AcqRel) == 0 {
        return Err(err(libc::ENOENT, "no entry"));
    }
    Ok(())
}

pub(super) fn id_at(map: &Map, idx: u32) -> Option<u32> {
    if idx >= map.max_entries() {
        return None;
    }
    match id_slot(map, idx).load(Ordering::Acquire) {
        0 => None,
        id => Some(id),
    }
}

/// The slots of an array-shaped data area (`count` slots of `slot_len` bytes after the
/// header page) that lie at least partly in data, in order, each once: for every such
/// slot, `keep(index, lo..hi)` is asked with the part of the slot (offsets from its
/// start) that is data, and the slot is kept when it answers true. A store file is
/// sparse, never-written pages being holes that read as zeros, so the walk costs what
/// was written, not `count`, and reads no hole (which on tmpfs would fill it with a page).
pub(super) fn slots_with_data(
    map: &Map,
    slot_len: usize,
    count: u32,
    mut keep: impl FnMut(u32, std::ops::Range<usize>) -> bool,
) -> Result<Vec<u32>> {
    use std::os::fd::AsRawFd;
    let path = map.path();
    let file = std::fs::File::open(path).map_err(|e| crate::Error::io("open", path, e))?;
    let fd = file.as_raw_fd();
    let start = bpftime_store::layout::PAGE_SIZE as u64;
    let slot = slot_len as u64;
    let end = start + slot * u64::from(count);
    let seek = |pos: u64, whence: libc::c_int| -> std::io::Result<Option<u64>> {
        // SAFETY: lseek on a descriptor we own; it only moves the file offset.
        let r = unsafe { libc::lseek(fd, pos as libc::off_t, whence) };
        if r >= 0 {
            return Ok(Some(r as u64));
        }
        let e = std::io::Error::last_os_error();
        // ENXIO: no data from `pos` on.
        if e.raw_os_error() == Some(libc::ENXIO) {
            Ok(None)
        } else {
            Err(e)
        }
    };
    let mut keys: Vec<u32> = Vec::new();
    let mut pos = start;
    while pos < end {
        let (lo, hi) = match seek(pos, libc::SEEK_DATA) {
            Ok(None) => break,
            Ok(Some(lo)) => {
                let hi = seek(lo, libc::SEEK_HOLE)
                    .map_err(|e| crate::Error::io("lseek", path, e))?
                    .unwrap_or(end);
                (lo, hi)
            }
            // A file system that cannot tell holes: everything is data.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (pos, end),
            Err(e) => return Err(crate::Error::io("lseek", path, e)),
        };
        let (lo, hi) = (lo.max(start), hi.min(end));
        if lo >= end {
            break;
        }
        let first = ((lo - start) / slot) as u32;
        let last = (hi - start).div_ceil(slot) as u32;
        for k in first..last {
            // A slot that straddles two data ranges is asked about each part.
            if keys.last() == Some(&k) {
                continue;
            }
            let slot_start = start + u64::from(k) * slot;
            let from = lo.saturating_sub(slot_start) as usize;
            let to = (hi - slot_start).min(slot) as usize;
            if keep(k, from..to) {
                keys.push(k);
            }
        }
        pos = hi.max(pos + 1);
    }
    Ok(keys)
}

/// Whether any byte of `range` of index `idx`'s slot (every CPU's copy) is not zero.
pub(super) fn nonzero(map: &Map, idx: u32, range: std::ops::Range<usize>) -> bool {
    let base = slot(map, idx);
    // SAFETY: idx < max_entries (from `slots_with_data`), and the range lies inside the
    // slot, which the data area holds.
    let bytes = unsafe { std::slice::from_raw_parts(base.add(range.start), range.len()) };
    bytes.iter().any(|&b| b != 0)
}
