//! `BPF_OBJ_GET_INFO_BY_FD`: the kernel's info structures, filled from the store.

use crate::attr::{self, write_back_u32, Attr};
use crate::core::{Object, Shim, SysResult};
use std::os::fd::RawFd;

const MAP_INFO_LEN: usize = 88;
const PROG_INFO_LEN: usize = 232;
const LINK_INFO_LEN: usize = 64;
const BTF_INFO_LEN: usize = 32;
const LINK_TYPE_PERF_EVENT: u32 = 7;

fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}
fn put64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_ne_bytes());
}
fn get32(b: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes(b[off..off + 4].try_into().unwrap_or_default())
}
fn get64(b: &[u8], off: usize) -> u64 {
    u64::from_ne_bytes(b[off..off + 8].try_into().unwrap_or_default())
}
fn put_name(b: &mut [u8], off: usize, name: &str) {
    let n = name.len().min(15);
    b[off..off + n].copy_from_slice(&name.as_bytes()[..n]);
}

impl Shim {
    /// # Safety
    /// `info` inside `a` must point to `info_len` writable bytes.
    pub(crate) unsafe fn get_info(&mut self, a: &Attr, attr: *mut u8, size: usize) -> SysResult {
        use attr::info_by_fd as f;
        let fd = a.u32(f::FD) as RawFd;
        let user_len = a.u32(f::INFO_LEN) as usize;
        let user = a.u64(f::INFO) as *mut u8;
        if user.is_null() {
            return Err(libc::EFAULT);
        }
        let obj = self.object(fd).cloned().ok_or(libc::EBADF)?;
        // SAFETY: caller obligation.
        let input = unsafe { std::slice::from_raw_parts(user, user_len) }.to_vec();
        let info: Vec<u8> = match &obj.object {
            Object::Map(m) => {
                let mut b = vec![0u8; MAP_INFO_LEN];
                let (map_type, key_size, value_size, max_entries) =
                    if m.map_type() == bpftime_isa::uapi::map_type::GPU_RINGBUF {
                        // A GPU ring buffer is, to readers on the host, the BPF ring buffer
                        // it is kept as (libbpf's ring_buffer__add takes a map only when
                        // this says RINGBUF and gives the ring's size), or a perf event
                        // array of a slot per CPU where BPFTIME_GPU_RING_AS=perf says the
                        // tool reads it with perf_buffer__new (see gpu_ring.rs).
                        use crate::gpu_ring::GpuRingAs;
                        match GpuRingAs::from_env() {
                            GpuRingAs::Ringbuf => {
                                (bpftime_isa::uapi::map_type::RINGBUF, 0, 0, m.ring_size())
                            }
                            GpuRingAs::Perf => (
                                bpftime_isa::uapi::map_type::PERF_EVENT_ARRAY,
                                4,
                                4,
                                bpftime_runtime::possible_cpus(),
                            ),
                        }
                    } else {
                        (m.map_type(), m.key_size(), m.value_size(), m.max_entries())
                    };
                put32(&mut b, 0, map_type);
                put32(&mut b, 4, m.id());
                put32(&mut b, 8, key_size);
                put32(&mut b, 12, value_size);
                put32(&mut b, 16, max_entries);
                put32(&mut b, 20, m.map_flags());
                put_name(&mut b, 24, &m.name());
                let (btf, k, v) = m.btf_ids();
                put32(&mut b, 64, btf);
                put32(&mut b, 68, k);
                put32(&mut b, 72, v);
                put64(&mut b, 80, m.map_extra());
                b
            }
            Object::Program(p) => {
                let mut b = vec![0u8; PROG_INFO_LEN];
                put32(&mut b, 0, p.prog_type);
                put32(&mut b, 4, p.id);
                let code = bpftime_isa::encode(&p.insns);
                put32(&mut b, 20, code.len() as u32);
                let in_get = |off: usize| {
                    if input.len() >= off + 8 {
                        get64(&input, off)
                    } else {
                        0
                    }
                };
                let in_get32 = |off: usize| {
                    if input.len() >= off + 4 {
                        get32(&input, off)
                    } else {
                        0
                    }
                };
                let xlated = in_get(32) as *mut u8;
                let xlated_len = in_get32(20) as usize;
                if !xlated.is_null() && xlated_len > 0 {
                    let n = xlated_len.min(code.len());
                    // SAFETY: the caller's buffer holds xlated_prog_len bytes (ABI contract).
                    unsafe { std::ptr::copy_nonoverlapping(code.as_ptr(), xlated, n) };
                    put64(&mut b, 32, xlated as u64);
                }
                // SAFETY: getuid has no preconditions.
                put32(&mut b, 48, unsafe { libc::getuid() });
                put32(&mut b, 52, p.map_ids.len() as u32);
                let map_ids = in_get(56) as *mut u32;
                let nr = in_get32(52) as usize;
                if !map_ids.is_null() {
                    for (i, id) in p.map_ids.iter().take(nr).enumerate() {
                        // SAFETY: the caller's array holds nr_map_ids entries.
                        unsafe { map_ids.add(i).write_unaligned(*id) };
                    }
                    put64(&mut b, 56, map_ids as u64);
                }
                put_name(&mut b, 64, &p.name);
                put32(&mut b, 84, p.gpl as u32);
                put32(&mut b, 216, p.insns.len() as u32);
                b
            }
            Object::Link(id) => {
                let rec =
                    bpftime_runtime::LinkRecord::read(self.store(), *id).map_err(|e| e.errno())?;
                let mut b = vec![0u8; LINK_INFO_LEN];
                put32(&mut b, 0, LINK_TYPE_PERF_EVENT);
                put32(&mut b, 4, *id);
                put32(&mut b, 8, rec.prog_id);
                b
            }
            Object::Btf { id, size } => {
                let mut b = vec![0u8; BTF_INFO_LEN];
                let dst = if input.len() >= 8 {
                    get64(&input, 0)
                } else {
                    0
                } as *mut u8;
                let cap = if input.len() >= 12 {
                    get32(&input, 8)
                } else {
                    0
                } as usize;
                if !dst.is_null() {
                    let blob =
                        bpftime_runtime::read_btf(self.store(), *id).map_err(|e| e.errno())?;
                    // As the kernel: what fits, and btf_size says how much there is
                    // (libbpf asks with 4 KiB first, then with room for all of it).
                    let n = cap.min(blob.len());
                    // SAFETY: the caller's buffer holds btf_size bytes; n is at most that.
                    unsafe { std::ptr::copy_nonoverlapping(blob.as_ptr(), dst, n) };
                    put64(&mut b, 0, dst as u64);
                }
                put32(&mut b, 8, *size);
                put32(&mut b, 12, *id);
                b
            }
            Object::KernelBtf { size } => {
                let mut b = vec![0u8; BTF_INFO_LEN];
                let field64 = |off: usize| {
                    if input.len() >= off + 8 {
                        get64(&input, off)
                    } else {
                        0
                    }
                };
                let field32 = |off: usize| {
                    if input.len() >= off + 4 {
                        get32(&input, off)
                    } else {
                        0
                    }
                };
                let dst = field64(0) as *mut u8;
                if !dst.is_null() {
                    let blob = std::fs::read(crate::core::KERNEL_BTF_PATH)
                        .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
                    let n = (field32(8) as usize).min(blob.len());
                    // SAFETY: the caller's buffer holds btf_size bytes; n is at most that.
                    unsafe { std::ptr::copy_nonoverlapping(blob.as_ptr(), dst, n) };
                    put64(&mut b, 0, dst as u64);
                }
                put32(&mut b, 8, *size);
                put32(&mut b, 12, crate::core::KERNEL_BTF_ID);
                // The name, "vmlinux", NUL-terminated into the caller's buffer when it has
                // room (ENOSPC otherwise, as the kernel); name_len says its length.
                let name = b"vmlinux\0";
                let (name_ptr, name_cap) = (field64(16) as *mut u8, field32(24) as usize);
                if !name_ptr.is_null() {
                    if name_cap < name.len() {
                        return Err(libc::ENOSPC);
                    }
                    // SAFETY: the caller's name buffer holds name_len bytes.
                    unsafe { std::ptr::copy_nonoverlapping(name.as_ptr(), name_ptr, name.len()) };
                    put64(&mut b, 16, name_ptr as u64);
                }
                put32(&mut b, 24, (name.len() - 1) as u32);
                put32(&mut b, 28, 1);
                b
            }
            Object::PerfEvent { .. } => return Err(libc::EINVAL),
        };
        // A caller with a newer, longer struct must have zeroed what we don't know.
        if user_len > info.len() && input[info.len()..].iter().any(|&b| b != 0) {
            return Err(libc::E2BIG);
        }
        let n = user_len.min(info.len());
        // SAFETY: n <= user_len, the caller's buffer size.
        unsafe { std::ptr::copy_nonoverlapping(info.as_ptr(), user, n) };
        // SAFETY: caller obligation on attr.
        unsafe { write_back_u32(attr, size, f::INFO_LEN, n as u32) };
        Ok(0)
    }
}
