//! `perf_event_open` for uprobes, the perf `ioctl`s, and the file-descriptor
//! calls (`mmap`, `epoll_ctl`) a consumer makes on ring buffers.

use crate::attr::Attr;
use crate::core::{refuse, Object, Shim, SysResult};
use bpftime_runtime::{Map, PerfEventKind, PerfEventRecord, PerfRing, PAGE_SIZE};
use std::os::fd::RawFd;
use std::sync::Arc;

/// What a consumer's epoll waits on: a ring buffer map or a perf buffer ring.
pub(crate) enum Waker {
    Ring(Arc<Map>),
    Perf(Arc<PerfRing>),
}

const PERF_EVENT_IOC_ENABLE: u64 = 0x2400;
const PERF_EVENT_IOC_DISABLE: u64 = 0x2401;
const PERF_EVENT_IOC_RESET: u64 = 0x2403;
const PERF_EVENT_IOC_SET_BPF: u64 = 0x4004_2408;

/// The uprobe PMU as the kernel describes it in sysfs, which is what libbpf reads.
#[derive(Debug, Clone, Copy)]
pub struct UprobePmu {
    pub type_: u32,
    pub retprobe_bit: u32,
}

impl UprobePmu {
    pub fn detect() -> UprobePmu {
        let dir = "/sys/bus/event_source/devices/uprobe";
        let type_ = std::fs::read_to_string(format!("{dir}/type"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(7);
        let retprobe_bit = std::fs::read_to_string(format!("{dir}/format/retprobe"))
            .ok()
            .and_then(|s| {
                s.trim()
                    .strip_prefix("config:")
                    .and_then(|b| b.parse().ok())
            })
            .unwrap_or(0);
        UprobePmu {
            type_,
            retprobe_bit,
        }
    }
}

impl Shim {
    /// Serves `perf_event_open` for uprobe events; None leaves the call to the kernel.
    ///
    /// # Safety
    /// `attr` must point to a `struct perf_event_attr` of the size it declares,
    /// and `config1` of a uprobe event to a NUL-terminated path.
    pub unsafe fn perf_event_open(
        &mut self,
        attr: *const u8,
        pid: i32,
        cpu: i32,
    ) -> Option<SysResult<RawFd>> {
        if attr.is_null() {
            return None;
        }
        // SAFETY: caller obligation; size is the attribute's own first fields.
        let head = unsafe { Attr::read(attr, 8) };
        let size = (head.u32(4) as usize).max(72);
        // SAFETY: caller obligation.
        let a = unsafe { Attr::read(attr, size) };
        const PERF_TYPE_SOFTWARE: u32 = 1;
        const PERF_COUNT_SW_BPF_OUTPUT: u64 = 10;
        if a.u32(0) == PERF_TYPE_SOFTWARE && a.u64(8) == PERF_COUNT_SW_BPF_OUTPUT {
            let record = PerfEventRecord {
                id: self.store().alloc_id(),
                kind: PerfEventKind::BpfOutput,
                path: String::new(),
                offset: 0,
                pid,
                cpu,
                owner_pid: std::process::id(),
            };
            return Some(self.register_perf_event(record));
        }
        if a.u32(0) != self.pmu.type_ {
            return None;
        }
        let path_ptr = a.u64(56) as *const libc::c_char;
        if path_ptr.is_null() {
            return Some(Err(libc::EINVAL));
        }
        // SAFETY: caller obligation: config1 is the uprobe path.
        let given = unsafe { std::ffi::CStr::from_ptr(path_ptr) }
            .to_string_lossy()
            .into_owned();
        // The kernel resolves the path in the loader's directory; the agent runs
        // elsewhere and matches against /proc/self/maps, which shows real paths.
        let path = match std::fs::canonicalize(&given) {
            Ok(p) => p.to_string_lossy().into_owned(),
            Err(_) => {
                return Some(Err(refuse(
                    libc::ENOENT,
                    format_args!("uprobe target {given} does not exist"),
                )))
            }
        };
        let retprobe = (a.u64(8) >> self.pmu.retprobe_bit) & 1 == 1;
        let record = PerfEventRecord {
            id: self.store().alloc_id(),
            kind: if retprobe {
                PerfEventKind::Uretprobe
            } else {
                PerfEventKind::Uprobe
            },
            path,
            offset: a.u64(64),
            pid,
            cpu,
            owner_pid: std::process::id(),
        };
        Some(self.register_perf_event(record))
    }

    /// Serves an `ioctl` on one of our perf events; None when `fd` is not ours.
    pub fn ioctl(&mut self, fd: RawFd, request: u64, arg: u64) -> Option<SysResult<i32>> {
        let obj = self.object(fd)?.object.clone();
        Some(match (obj, request) {
            (
                Object::PerfEvent { .. },
                PERF_EVENT_IOC_ENABLE | PERF_EVENT_IOC_DISABLE | PERF_EVENT_IOC_RESET,
            ) => Ok(0),
            (Object::PerfEvent { .. }, PERF_EVENT_IOC_SET_BPF) => {
                self.set_perf_link(fd, arg as RawFd)
            }
            _ => Err(refuse(
                libc::ENOTTY,
                format_args!("ioctl {request:#x} on a bpftime object"),
            )),
        })
    }

    /// Serves `mmap` of a ring buffer or an mmapable array; None when `fd` is not ours.
    ///
    /// # Safety
    /// As `mmap(2)`: `addr` with `MAP_FIXED` must be a range the caller may replace.
    pub unsafe fn mmap(
        &mut self,
        addr: *mut libc::c_void,
        len: usize,
        prot: i32,
        flags: i32,
        fd: RawFd,
        off: i64,
    ) -> Option<SysResult<*mut libc::c_void>> {
        let m = match self.object(fd)?.object.clone() {
            Object::Map(m) => m,
            Object::PerfEvent { record, .. } if record.kind == PerfEventKind::BpfOutput => {
                // SAFETY: forwarded caller obligation.
                return Some(unsafe {
                    self.mmap_perf_ring(record.id, addr, len, prot, flags, off)
                });
            }
            _ => return Some(Err(libc::ENODEV)),
        };
        let off = off as usize;
        let map_at = |a: *mut libc::c_void,
                      l: usize,
                      p: i32,
                      fl: i32,
                      file_off: usize|
         -> SysResult<*mut libc::c_void> {
            // SAFETY: maps our own object's file; MAP_FIXED only where the caller asked
            // for it or inside a reservation made below.
            let r = unsafe { libc::mmap(a, l, p, fl, fd, file_off as libc::off_t) };
            if r == libc::MAP_FAILED {
                Err(std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::ENOMEM))
            } else {
                Ok(r)
            }
        };
        if let Some((consumer, producer, ring)) = m.ringbuf_regions() {
            return Some(if off == 0 && len <= PAGE_SIZE {
                map_at(addr, len, prot, flags, consumer)
            } else if off == PAGE_SIZE && len == PAGE_SIZE + 2 * ring {
                if prot & libc::PROT_WRITE != 0 {
                    return Some(Err(libc::EACCES));
                }
                // Reserve, then map the producer page and data, then the data again.
                let base = map_at(
                    addr,
                    len,
                    libc::PROT_NONE,
                    (flags & libc::MAP_FIXED) | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    0,
                );
                let base = match base {
                    Ok(b) => b,
                    // MAP_ANONYMOUS ignores fd; retry through the real call on failure.
                    Err(e) => return Some(Err(e)),
                };
                let first = map_at(
                    base,
                    PAGE_SIZE + ring,
                    prot,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    producer,
                );
                // SAFETY: inside the reservation.
                let second_addr = unsafe { (base as *mut u8).add(PAGE_SIZE + ring) }.cast();
                let second = first.and_then(|_| {
                    map_at(
                        second_addr,
                        ring,
                        prot,
                        libc::MAP_SHARED | libc::MAP_FIXED,
                        producer + PAGE_SIZE,
                    )
                });
                match second {
                    Ok(_) => Ok(base),
                    Err(e) => {
                        // SAFETY: unmaps the reservation made above.
                        unsafe { libc::munmap(base, len) };
                        Err(e)
                    }
                }
            } else {
                Err(refuse(
                    libc::EINVAL,
                    format_args!("ring buffer mmap at offset {off} of {len} bytes"),
                ))
            });
        }
        if let Some((start, region)) = m.mmapable_region() {
            if off.checked_add(len).is_none_or(|end| end > region) {
                return Some(Err(libc::EINVAL));
            }
            if prot & libc::PROT_WRITE != 0 && flags & libc::MAP_SHARED != 0 && m.is_frozen() {
                return Some(Err(libc::EPERM));
            }
            return Some(map_at(addr, len, prot, flags, start + off));
        }
        Some(Err(refuse(
            libc::ENODEV,
            format_args!(
                "mmap of map {} (not a ring buffer or an mmapable array)",
                m.id()
            ),
        )))
    }

    /// Maps the ring of a BPF output event, creating it at the size the
    /// consumer asks for.
    ///
    /// # Safety
    /// As `mmap(2)`.
    unsafe fn mmap_perf_ring(
        &mut self,
        id: u32,
        addr: *mut libc::c_void,
        len: usize,
        prot: i32,
        flags: i32,
        off: i64,
    ) -> SysResult<*mut libc::c_void> {
        if off != 0 {
            return Err(libc::EINVAL);
        }
        PerfRing::create(self.store(), id, len).map_err(|e| e.errno())?;
        let path = bpftime_runtime::perf_ring_path(self.store().dir(), id);
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| libc::EINVAL)?;
        // SAFETY: a valid path.
        let file = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if file < 0 {
            return Err(libc::EIO);
        }
        // SAFETY: maps the ring file past our control page, as the caller asked.
        let r = unsafe { libc::mmap(addr, len, prot, flags, file, PAGE_SIZE as libc::off_t) };
        // SAFETY: our own fd; the mapping keeps the file.
        unsafe { libc::close(file) };
        if r == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::ENOMEM));
        }
        Ok(r)
    }

    /// Serves `epoll_ctl` on a ring buffer: the epoll instance watches the ring's
    /// wake-up FIFO instead. None when `fd` is not ours.
    ///
    /// # Safety
    /// `event` as for `epoll_ctl(2)`.
    pub unsafe fn epoll_ctl(
        &mut self,
        epfd: RawFd,
        op: i32,
        fd: RawFd,
        event: *mut libc::epoll_event,
    ) -> Option<SysResult<i32>> {
        let (fifo_path, waker) = match self.object(fd)?.object.clone() {
            Object::Map(m) => match m.wakeup_fifo() {
                Some(p) => (p.to_path_buf(), Waker::Ring(m.clone())),
                None => {
                    return Some(Err(refuse(
                        libc::EPERM,
                        format_args!("epoll on map {}, which is not a ring buffer", m.id()),
                    )))
                }
            },
            Object::PerfEvent { record, .. } if record.kind == PerfEventKind::BpfOutput => {
                match PerfRing::open(self.store().dir(), record.id) {
                    Ok(r) => (
                        bpftime_runtime::perf_fifo_path(self.store().dir(), record.id),
                        Waker::Perf(Arc::new(r)),
                    ),
                    Err(_) => {
                        return Some(Err(refuse(
                            libc::EINVAL,
                            format_args!("epoll on perf event {} before it was mmapped", record.id),
                        )))
                    }
                }
            }
            _ => return Some(Err(libc::EPERM)),
        };
        let entry = self
            .epolls
            .get(&epfd)
            .and_then(|l| l.iter().find(|(_, mfd, _)| *mfd == fd).map(|e| e.0));
        let r = match (op, entry) {
            (libc::EPOLL_CTL_ADD, Some(_)) => Err(libc::EEXIST),
            (libc::EPOLL_CTL_ADD, None) => {
                let c = match std::ffi::CString::new(fifo_path.as_os_str().as_encoded_bytes()) {
                    Ok(c) => c,
                    Err(_) => return Some(Err(libc::EINVAL)),
                };
                // SAFETY: a valid path; O_RDWR never blocks on a FIFO.
                let fifo = unsafe {
                    libc::open(
                        c.as_ptr(),
                        libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
                    )
                };
                if fifo < 0 {
                    return Some(Err(std::io::Error::last_os_error()
                        .raw_os_error()
                        .unwrap_or(libc::EIO)));
                }
                // SAFETY: forwarded caller obligation for `event`.
                if unsafe { libc::epoll_ctl(epfd, op, fifo, event) } != 0 {
                    let e = std::io::Error::last_os_error()
                        .raw_os_error()
                        .unwrap_or(libc::EIO);
                    // SAFETY: our own fd.
                    unsafe { libc::close(fifo) };
                    Err(e)
                } else {
                    self.epolls.entry(epfd).or_default().push((fifo, fd, waker));
                    Ok(0)
                }
            }
            (_, None) => Err(libc::ENOENT),
            (libc::EPOLL_CTL_DEL, Some(fifo)) => {
                // SAFETY: our own registration.
                unsafe { libc::epoll_ctl(epfd, op, fifo, event) };
                // SAFETY: our own fd.
                unsafe { libc::close(fifo) };
                if let Some(l) = self.epolls.get_mut(&epfd) {
                    l.retain(|(f, _, _)| *f != fifo);
                }
                Ok(0)
            }
            // SAFETY: forwarded caller obligation.
            (_, Some(fifo)) => match unsafe { libc::epoll_ctl(epfd, op, fifo, event) } {
                0 => Ok(0),
                _ => Err(std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO)),
            },
        };
        Some(r)
    }

    /// After `epoll_wait` returns: clears the wake-up state of the rings watched
    /// by `epfd`, so their producers wake it again for the next record.
    pub fn epoll_drained(&mut self, epfd: RawFd) {
        let Some(list) = self.epolls.get(&epfd) else {
            return;
        };
        for (fifo, _, waker) in list {
            match waker {
                Waker::Ring(m) => m.ringbuf_clear_wakeup(),
                Waker::Perf(r) => r.clear_wakeup(),
            }
            let mut buf = [0u8; 64];
            // SAFETY: reads into a local buffer from our own non-blocking FIFO.
            while unsafe { libc::read(*fifo, buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
        }
    }

    pub fn has_epoll(&self, epfd: RawFd) -> bool {
        self.epolls.contains_key(&epfd)
    }
}
