//! `perf_event_open` for uprobes and kprobes, the perf `ioctl`s, and the
//! file-descriptor calls (`mmap`, `epoll_ctl`) a consumer makes on ring buffers.
//!
//! Kernel functions do not exist in userspace, so every kprobe served here is
//! a CUDA kernel probe: the kprobe PMU's function name is the kernel's name
//! (or pattern), a kprobe its entry, a kretprobe its exit.

use crate::attr::Attr;
use crate::core::{refuse, Object, Shim, SysResult};
use crate::handed::{Owner, Role};
use bpftime_runtime::{Map, PerfEventKind, PerfEventRecord, PerfRing, PAGE_SIZE};
use std::ffi::CStr;
use std::os::fd::{AsRawFd, IntoRawFd, RawFd};
use std::sync::Arc;

/// What a consumer's epoll waits on: a ring buffer map or a perf buffer ring.
pub(crate) enum Waker {
    Ring(Arc<Map>),
    Perf(Arc<PerfRing>, u32),
}

impl Waker {
    /// The object whose ring this is, as the mappings handed out name it.
    pub(crate) fn owner(&self) -> Owner {
        match self {
            Waker::Ring(m) => Owner::Map(m.id()),
            Waker::Perf(_, id) => Owner::PerfEvent(*id),
        }
    }
}

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_TYPE_TRACEPOINT: u32 = 2;
const PERF_COUNT_SW_BPF_OUTPUT: u64 = 10;

/// Whether a `perf_event_open` attribute asks for an event that only eBPF uses: a uprobe
/// or kprobe (the PMUs' sysfs types), a tracepoint, or a BPF output ring. The preload
/// layer refuses these when the shim cannot serve them, rather than hand them to the
/// kernel; other events (counters, samples) are the kernel's business.
///
/// # Safety
/// `attr` is null or points to a `struct perf_event_attr` of at least 16 bytes.
pub unsafe fn perf_attr_is_bpf(attr: *const u8) -> bool {
    if attr.is_null() {
        return false;
    }
    // SAFETY: caller obligation: type (u32 at 0) and config (u64 at 8).
    let a = unsafe { Attr::read(attr, 16) };
    let type_ = a.u32(0);
    type_ == PERF_TYPE_TRACEPOINT
        || (type_ == PERF_TYPE_SOFTWARE && a.u64(8) == PERF_COUNT_SW_BPF_OUTPUT)
        || type_ == UprobePmu::detect().type_
        || type_ == KprobePmu::get().type_
}

const PERF_EVENT_IOC_ENABLE: u64 = 0x2400;
const PERF_EVENT_IOC_DISABLE: u64 = 0x2401;
const PERF_EVENT_IOC_RESET: u64 = 0x2403;
/// Attaches a program to a perf event; public so that the preload layer can refuse it on
/// events that are not ours (the kernel must never be handed a program for one).
pub const PERF_EVENT_IOC_SET_BPF: u64 = 0x4004_2408;
/// `PERF_ATTR_SIZE_VER0`: the first `perf_event_attr`, up to and with `config1`.
const PERF_ATTR_SIZE_VER0: usize = 64;
/// Where a uprobe event's `config` carries the USDT semaphore's file offset (the kernel's
/// `PERF_UPROBE_REF_CTR_OFFSET_SHIFT`, and its sysfs `format/ref_ctr_offset`: config:32-63).
const UPROBE_REF_CTR_OFFSET_SHIFT: u32 = 32;

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

const PMU_DIR: &str = "/sys/bus/event_source/devices";

thread_local! {
    /// Set while this thread looks for the kprobe PMU.
    static DETECTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Reads a PMU's `config:N` format file.
fn config_bit(path: &str) -> Option<u32> {
    std::fs::read_to_string(path)
        .ok()?
        .trim()
        .strip_prefix("config:")?
        .parse()
        .ok()
}

/// The kprobe PMU as loaders find it in sysfs. Where the kernel has none (built
/// without kprobes, or hidden in a container), the shim answers for it: loaders
/// then take the PMU path, which is the one it serves, instead of writing to
/// tracefs's `kprobe_events`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KprobePmu {
    pub type_: u32,
    pub retprobe_bit: u32,
    /// Whether the kernel lacks the PMU and the shim serves its sysfs files.
    pub served: bool,
}

impl KprobePmu {
    /// The type the kernel gives the kprobe PMU when it has one.
    const DEFAULT_TYPE: u32 = 6;
    const TYPE_FILE: &'static str = "/sys/bus/event_source/devices/kprobe/type";
    const RETPROBE_FILE: &'static str = "/sys/bus/event_source/devices/kprobe/format/retprobe";

    pub fn detect() -> KprobePmu {
        let real = std::fs::read_to_string(Self::TYPE_FILE)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        match real {
            Some(type_) => KprobePmu {
                type_,
                retprobe_bit: config_bit(Self::RETPROBE_FILE).unwrap_or(0),
                served: false,
            },
            None => KprobePmu {
                type_: Self::free_type(),
                retprobe_bit: 0,
                served: true,
            },
        }
    }

    /// The kernel's usual kprobe type, unless another PMU has it here: a type
    /// we answer for must never capture another PMU's events.
    fn free_type() -> u32 {
        let mut taken: Vec<u32> = std::fs::read_dir(PMU_DIR)
            .map(|d| {
                d.filter_map(|e| {
                    let t = std::fs::read_to_string(e.ok()?.path().join("type")).ok()?;
                    t.trim().parse().ok()
                })
                .collect()
            })
            .unwrap_or_default();
        // The uprobe PMU's own default, which the shim may be answering for.
        taken.push(UprobePmu::detect().type_);
        (Self::DEFAULT_TYPE..)
            .find(|t| !taken.contains(t))
            .unwrap_or(Self::DEFAULT_TYPE)
    }

    /// The process's answer, computed once.
    pub fn get() -> KprobePmu {
        static PMU: std::sync::OnceLock<KprobePmu> = std::sync::OnceLock::new();
        *PMU.get_or_init(|| {
            DETECTING.with(|d| d.set(true));
            let pmu = KprobePmu::detect();
            DETECTING.with(|d| d.set(false));
            pmu
        })
    }

    /// What the sysfs file at `path` reads when the shim serves the PMU; None
    /// for other files, and while the PMU is being looked for (its sysfs reads
    /// come back here through the preloaded `open`).
    pub fn served(path: &[u8]) -> Option<String> {
        if DETECTING.with(|d| d.get()) {
            return None;
        }
        Self::get().served_file(path)
    }

    /// What a sysfs file of the PMU reads, when the shim serves the PMU.
    pub fn served_file(&self, path: &[u8]) -> Option<String> {
        if !self.served {
            return None;
        }
        if path == Self::TYPE_FILE.as_bytes() {
            Some(format!("{}\n", self.type_))
        } else if path == Self::RETPROBE_FILE.as_bytes() {
            Some(format!("config:{}\n", self.retprobe_bit))
        } else {
            None
        }
    }
}

impl Shim {
    /// Serves `perf_event_open` for uprobe and kprobe events and BPF output
    /// rings; None leaves the call to the kernel.
    ///
    /// # Safety
    /// `attr` must point to a `struct perf_event_attr` of the size it declares,
    /// and `config1` of a uprobe event to a NUL-terminated path, of a kprobe
    /// event to a NUL-terminated function name or be 0.
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
        // The caller's struct holds `size` bytes and no more (0 stands for the first
        // version's): reading further could fault at the end of its page.
        let size = match head.u32(4) as usize {
            0 => PERF_ATTR_SIZE_VER0,
            n => n,
        };
        if size < PERF_ATTR_SIZE_VER0 {
            // No version is this short: the kernel refuses it (E2BIG) before reading on.
            return None;
        }
        // SAFETY: caller obligation: the attribute holds the `size` bytes it declares.
        let a = unsafe { Attr::read(attr, size) };
        if a.u32(0) == PERF_TYPE_SOFTWARE && a.u64(8) == PERF_COUNT_SW_BPF_OUTPUT {
            let record = PerfEventRecord {
                id: self.store().alloc_id(),
                kind: PerfEventKind::BpfOutput,
                path: String::new(),
                offset: 0,
                pid,
                cpu,
                ref_ctr_offset: 0,
                owner_pid: std::process::id(),
            };
            return Some(self.register_perf_event(record));
        }
        if a.u32(0) == self.kprobe_pmu.type_ {
            let name = a.u64(56) as *const libc::c_char;
            let name = if name.is_null() {
                None
            } else {
                // SAFETY: caller obligation: config1 is the kprobe's function name.
                Some(unsafe { CStr::from_ptr(name) })
            };
            return Some(self.kprobe_event(a.u64(8), name, a.u64(64), pid, cpu));
        }
        if a.u32(0) == PERF_TYPE_TRACEPOINT {
            // Tracepoint events exist to run eBPF programs (or perf's own sampling, which
            // no loader does in this process): the kernel is never given one, and those
            // that are no system call's are refused.
            return Some(self.tracepoint_event(a.u64(8), pid, cpu));
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
        let ref_ctr_offset = a.u64(8) >> UPROBE_REF_CTR_OFFSET_SHIFT;
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
            ref_ctr_offset,
            owner_pid: std::process::id(),
        };
        Some(self.register_perf_event(record))
    }

    /// A kprobe perf event: `config` carries the retprobe bit (or bpftime's
    /// launch bit), `name` the function (`config1`), `offset` the offset into
    /// it, or the address when there is no name (`config2`).
    pub(crate) fn kprobe_event(
        &mut self,
        config: u64,
        name: Option<&CStr>,
        offset: u64,
        pid: i32,
        cpu: i32,
    ) -> SysResult<RawFd> {
        let Some(name) = name.filter(|n| !n.is_empty()) else {
            tracing::info!(
                address = offset,
                "kprobe by address refused (errno {}): bpftime serves kprobes only as CUDA kernel probes, by name",
                libc::EINVAL
            );
            return Err(libc::EINVAL);
        };
        let mut name = name.to_string_lossy().into_owned();
        let bit = |b: u32| (config >> b) & 1 == 1;
        let launch = bit(bpftime_runtime::GPU_LAUNCH_CONFIG_BIT);
        let access = bit(bpftime_runtime::GPU_ACCESS_CONFIG_BIT);
        let shared = bit(bpftime_runtime::GPU_SHARED_ACCESS_CONFIG_BIT);
        let retprobe = bit(self.kprobe_pmu.retprobe_bit);
        let kind = match (launch, access, shared, retprobe) {
            // bpftime's memory capture: every global access of every kernel.
            (false, false, false, false) if name == bpftime_runtime::MEMCAPTURE => {
                name = "*".into();
                PerfEventKind::GpuAccess
            }
            (false, false, false, false) => PerfEventKind::Kprobe,
            (false, false, false, true) => PerfEventKind::Kretprobe,
            (true, false, false, false) => PerfEventKind::GpuLaunch,
            (false, true, false, false) => PerfEventKind::GpuAccess,
            (false, true, true, false) => PerfEventKind::GpuSharedAccess,
            _ => {
                tracing::info!(kernel = %name, config, "a CUDA launch or memory-access event is neither a retprobe nor both, and shared memory is asked only of a memory-access event (errno {})", libc::EINVAL);
                return Err(libc::EINVAL);
            }
        };
        tracing::info!(kernel = %name, kind = kind.label(), "perf event on a CUDA kernel");
        let record = PerfEventRecord {
            id: self.store().alloc_id(),
            kind,
            path: name,
            offset,
            pid,
            cpu,
            ref_ctr_offset: 0,
            owner_pid: std::process::id(),
        };
        self.register_perf_event(record)
    }

    /// A launch event or a memory-access event on the CUDA kernels `kernel` names, as
    /// `perf_event_open` with `config` (bpftime's bits,
    /// [`bpftime_runtime::GpuProbeKind::event_config`]) makes it (for loaders that hold no
    /// attribute).
    pub fn gpu_event(&mut self, kernel: &CStr, config: u64) -> SysResult<RawFd> {
        self.kprobe_event(config, Some(kernel), 0, -1, 0)
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
            let owner = Owner::Map(m.id());
            return Some(if off == 0 && len <= PAGE_SIZE {
                let p = map_at(addr, len, prot, flags, consumer);
                if let Ok(p) = p {
                    // SAFETY: the mapping just made, which the loader owns.
                    unsafe { self.hand_out(p.cast(), len, owner, Role::RingConsumer) };
                }
                p
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
                    Ok(_) => {
                        let role = Role::RingProducer { ring: ring as u64 };
                        // SAFETY: the mapping just made, which the loader owns.
                        unsafe { self.hand_out(base.cast(), len, owner, role) };
                        Ok(base)
                    }
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
            let p = map_at(addr, len, prot, flags, start + off);
            if let Ok(p) = p {
                // SAFETY: the mapping just made, which the loader owns.
                unsafe { self.hand_out(p.cast(), len, Owner::Map(m.id()), Role::Plain) };
            }
            return Some(p);
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
        // Closed on return: the mapping keeps the file.
        let ring = self.store().open_perf_ring(id).map_err(|e| e.errno())?;
        let file = ring.as_raw_fd();
        // SAFETY: maps the ring file past our control page, as the caller asked.
        let r = unsafe { libc::mmap(addr, len, prot, flags, file, PAGE_SIZE as libc::off_t) };
        if r == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::ENOMEM));
        }
        let role = Role::PerfRing {
            data: (len - PAGE_SIZE) as u64,
        };
        // SAFETY: the mapping just made, which the loader owns.
        unsafe { self.hand_out(r.cast(), len, Owner::PerfEvent(id), role) };
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
        // The epoll instance gets a descriptor of its own on the FIFO.
        let (fifo, waker) = match self.object(fd)?.object.clone() {
            Object::Map(m) => match m.open_wakeup_fifo() {
                Some(f) => (f, Waker::Ring(m.clone())),
                None => {
                    return Some(Err(refuse(
                        libc::EPERM,
                        format_args!("epoll on map {}, which is not a ring buffer", m.id()),
                    )))
                }
            },
            Object::PerfEvent { record, .. } if record.kind == PerfEventKind::BpfOutput => {
                match PerfRing::open(self.store(), record.id) {
                    Ok(r) => (
                        self.store().open_perf_fifo(record.id),
                        Waker::Perf(Arc::new(r), record.id),
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
                let fifo = match fifo {
                    Ok(f) => f.into_raw_fd(),
                    Err(e) => return Some(Err(e.errno())),
                };
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
    /// by `epfd`, so their producers wake it again for the next record. The FIFO is
    /// emptied first and the pending flag cleared after: the other way round, a record
    /// committed between the two would write its wake-up byte only for the drain to
    /// eat it, and with the flag left set no producer would write another (every later
    /// record waiting for the poll's timeout, or lost at a final zero-timeout poll).
    /// A record committed after the drain and before the clear wrote no byte, but it is
    /// in the ring, which the consumer reads right after this returns.
    pub fn epoll_drained(&mut self, epfd: RawFd) {
        let Some(list) = self.epolls.get(&epfd) else {
            return;
        };
        for (fifo, _, waker) in list {
            let mut buf = [0u8; 64];
            // SAFETY: reads into a local buffer from our own non-blocking FIFO.
            while unsafe { libc::read(*fifo, buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
            match waker {
                Waker::Ring(m) => m.ringbuf_clear_wakeup(),
                Waker::Perf(r, _) => r.clear_wakeup(),
            }
        }
    }

    /// Before `epoll_wait`: a ring watched by `epfd` that holds unread data is made
    /// readable, as the kernel's rings are (level-triggered), whatever became of the
    /// wake-ups that announced the data.
    pub fn epoll_arm_ready(&self, epfd: RawFd) {
        let Some(list) = self.epolls.get(&epfd) else {
            return;
        };
        for (fifo, _, waker) in list {
            // A condemned ring reads as empty here, whatever its file says.
            if self.is_condemned(waker.owner()) {
                continue;
            }
            let unread = match waker {
                Waker::Ring(m) => m.ringbuf_query(bpftime_isa::uapi::ringbuf::AVAIL_DATA) > 0,
                Waker::Perf(r, _) => r.has_unread(),
            };
            if unread {
                // SAFETY: one byte from a local buffer to our own non-blocking FIFO (a
                // full FIFO is readable already).
                unsafe { libc::write(*fifo, [1u8].as_ptr().cast(), 1) };
            }
        }
    }

    pub fn has_epoll(&self, epfd: RawFd) -> bool {
        self.epolls.contains_key(&epfd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bpftime_isa::uapi::{attach_type, cmd, prog_type};
    use bpftime_runtime::{GpuProbeKind, LinkKind, LinkRecord, ObjectKind};

    use crate::test_support::TempShim;

    impl TempShim {
        /// Loads a kprobe program named `name`.
        fn load(&mut self, name: &str, src: &str) -> SysResult<RawFd> {
            let code = bpftime_isa::encode(&bpftime_isa::asm::assemble(src).unwrap());
            let mut a = [0u8; 128];
            a[0..4].copy_from_slice(&prog_type::KPROBE.to_ne_bytes());
            a[4..8].copy_from_slice(&((code.len() / 8) as u32).to_ne_bytes());
            a[8..16].copy_from_slice(&(code.as_ptr() as u64).to_ne_bytes());
            a[16..24].copy_from_slice(&(c"GPL".as_ptr() as u64).to_ne_bytes());
            let n = name.len().min(15);
            a[48..48 + n].copy_from_slice(&name.as_bytes()[..n]);
            self.bpf(cmd::PROG_LOAD, &mut a).map(|fd| fd as RawFd)
        }

        /// `perf_event_open` on the kprobe PMU, with `name` in config1 (0 for None).
        fn kprobe(&mut self, config: u64, name: Option<&CStr>, offset: u64) -> SysResult<RawFd> {
            let mut a = [0u8; 128];
            let pmu = self.shim().kprobe_pmu.type_;
            a[0..4].copy_from_slice(&pmu.to_ne_bytes());
            a[4..8].copy_from_slice(&128u32.to_ne_bytes());
            a[8..16].copy_from_slice(&config.to_ne_bytes());
            let ptr = name.map_or(0, |n| n.as_ptr() as u64);
            a[56..64].copy_from_slice(&ptr.to_ne_bytes());
            a[64..72].copy_from_slice(&offset.to_ne_bytes());
            // SAFETY: a perf_event_attr of the size it declares; config1 is NULL or
            // a NUL-terminated name alive across the call.
            unsafe { self.shim().perf_event_open(a.as_ptr(), -1, 0) }.expect("served here")
        }

        fn retprobe_config(&mut self) -> u64 {
            1 << self.shim().kprobe_pmu.retprobe_bit
        }

        fn link_create(&mut self, prog: RawFd, event: RawFd) -> SysResult {
            let mut a = [0u8; 128];
            a[0..4].copy_from_slice(&(prog as u32).to_ne_bytes());
            a[4..8].copy_from_slice(&(event as u32).to_ne_bytes());
            a[8..12].copy_from_slice(&attach_type::PERF_EVENT.to_ne_bytes());
            self.bpf(cmd::LINK_CREATE, &mut a)
        }

        /// Closes `fd` as the preloaded `close` does: the shim forgets it, the
        /// descriptor goes, then what nothing holds any more is collected.
        fn close(&mut self, fd: RawFd) -> bool {
            let ours = self.shim().close(fd);
            // SAFETY: `fd` is a descriptor this test opened through the shim.
            unsafe { libc::close(fd) };
            self.shim().collect();
            ours
        }

        fn links(&mut self) -> Vec<LinkRecord> {
            let store = self.shim().store();
            store
                .ids(ObjectKind::Link)
                .into_iter()
                .map(|id| LinkRecord::read(store, id).unwrap())
                .collect()
        }
    }

    const SET_BPF: u64 = PERF_EVENT_IOC_SET_BPF;
    const ACCEPTED: &str = "mov %r0, 0\nexit";
    /// bpf_get_current_comm: fine on the CPU, not on the GPU.
    const CPU_ONLY: &str = "mov %r1, %r10\nadd %r1, -16\nmov %r2, 16\ncall 16\nmov %r0, 0\nexit";

    #[test]
    fn kprobes_by_name_become_gpu_links_through_ioctl_and_link_create() {
        let mut t = TempShim::new("perf-kprobe");
        let prog = t.load("count", ACCEPTED).unwrap();
        // A kprobe, attached with PERF_EVENT_IOC_SET_BPF (bcc, older libbpf).
        let entry = t.kprobe(0, Some(c"vectorAdd"), 0).unwrap();
        let ev = match &t.shim().object(entry).unwrap().object {
            Object::PerfEvent { record, .. } => record.clone(),
            o => panic!("{o:?}"),
        };
        assert_eq!(
            (ev.kind, ev.path.as_str(), ev.offset),
            (PerfEventKind::Kprobe, "vectorAdd", 0)
        );
        assert_eq!(t.shim().ioctl(entry, SET_BPF, prog as u64), Some(Ok(0)));
        // A kretprobe on a demangled name, attached with BPF_LINK_CREATE.
        let config = t.retprobe_config();
        let exit = t.kprobe(config, Some(c"ns::kern"), 0).unwrap();
        let exit_link = t.link_create(prog, exit).unwrap();
        // A launch event on a glob.
        let launch = t
            .kprobe(
                1 << bpftime_runtime::GPU_LAUNCH_CONFIG_BIT,
                Some(c"*gemm*"),
                0,
            )
            .unwrap();
        t.link_create(prog, launch).unwrap();
        let mut got: Vec<(LinkKind, String, u64)> = t
            .links()
            .into_iter()
            .map(|l| (l.kind, l.path, l.offset))
            .collect();
        got.sort_by_key(|l| l.0.label());
        assert_eq!(
            got,
            vec![
                (LinkKind::Gpu(GpuProbeKind::Entry), "vectorAdd".into(), 0),
                (LinkKind::Gpu(GpuProbeKind::Exit), "ns::kern".into(), 0),
                (LinkKind::Gpu(GpuProbeKind::Launch), "*gemm*".into(), 0),
            ]
        );
        // Closing detaches, as for uprobes.
        assert!(t.close(exit_link as RawFd));
        assert!(t.close(entry));
        let left: Vec<LinkKind> = t.links().into_iter().map(|l| l.kind).collect();
        assert_eq!(left, vec![LinkKind::Gpu(GpuProbeKind::Launch)]);
    }

    #[test]
    fn kprobes_by_address_and_odd_requests_are_refused() {
        let mut t = TempShim::new("perf-kprobe-refused");
        assert_eq!(t.kprobe(0, None, 0xffff_ffff_8100_0000), Err(libc::EINVAL));
        assert_eq!(t.kprobe(0, Some(c""), 0), Err(libc::EINVAL));
        let both = t.retprobe_config() | 1 << bpftime_runtime::GPU_LAUNCH_CONFIG_BIT;
        assert_eq!(t.kprobe(both, Some(c"k"), 0), Err(libc::EINVAL));
        // An offset into a CUDA kernel is recorded, but nothing attaches there.
        let prog = t.load("count", ACCEPTED).unwrap();
        let ev = t.kprobe(0, Some(c"vectorAdd"), 16).unwrap();
        assert_eq!(t.link_create(prog, ev), Err(libc::EINVAL));
        assert!(t.links().is_empty());
    }

    #[test]
    fn gpu_rules_apply_to_every_program_that_runs_on_a_gpu() {
        let mut t = TempShim::new("perf-kprobe-rules");
        // Named cuda__: checked for the GPU at load.
        assert_eq!(t.load("cuda__comm", CPU_ONLY), Err(libc::EACCES));
        // Named by libbpf's cuda: handler (BPF_PROG_LOAD carries 15 bytes of it).
        t.shim().expect_gpu_program("comm_in_a_cuda_section");
        assert_eq!(
            t.load("comm_in_a_cuda_section", CPU_ONLY),
            Err(libc::EACCES)
        );
        // Any other kprobe loads under the CPU rules...
        let prog = t.load("comm", CPU_ONLY).unwrap();
        // ...and is checked for the GPU when it is attached to a CUDA kernel,
        // through either attach path, and fails the same way every time.
        let entry = t.kprobe(0, Some(c"vectorAdd"), 0).unwrap();
        assert_eq!(
            t.shim().ioctl(entry, SET_BPF, prog as u64),
            Some(Err(libc::EINVAL))
        );
        let config = t.retprobe_config();
        let exit = t.kprobe(config, Some(c"vectorAdd"), 0).unwrap();
        assert_eq!(t.link_create(prog, exit), Err(libc::EINVAL));
        assert!(t.links().is_empty());
        // A launch program runs on the CPU: it keeps the CPU rules.
        let launch = t
            .kprobe(
                1 << bpftime_runtime::GPU_LAUNCH_CONFIG_BIT,
                Some(c"vectorAdd"),
                0,
            )
            .unwrap();
        t.link_create(prog, launch).unwrap();
        // An announcement holds for one successful load, not for every later
        // program of the name.
        t.shim().expect_gpu_program("once");
        t.load("once", ACCEPTED).unwrap();
        t.load("once", CPU_ONLY).unwrap();
        // A program that passes the GPU rules attaches.
        let ok = t.load("fine", ACCEPTED).unwrap();
        t.link_create(ok, exit).unwrap();
        let kinds: Vec<LinkKind> = t.links().into_iter().map(|l| l.kind).collect();
        assert_eq!(kinds.len(), 2, "{kinds:?}");
        assert!(
            kinds.contains(&LinkKind::Gpu(GpuProbeKind::Launch))
                && kinds.contains(&LinkKind::Gpu(GpuProbeKind::Exit))
        );
    }

    #[test]
    fn a_missing_kprobe_pmu_is_answered_for_and_a_real_one_is_not() {
        let served = KprobePmu {
            type_: 6,
            retprobe_bit: 0,
            served: true,
        };
        assert_eq!(
            served.served_file(b"/sys/bus/event_source/devices/kprobe/type"),
            Some("6\n".into())
        );
        assert_eq!(
            served.served_file(b"/sys/bus/event_source/devices/kprobe/format/retprobe"),
            Some("config:0\n".into())
        );
        assert_eq!(
            served.served_file(b"/sys/bus/event_source/devices/uprobe/type"),
            None
        );
        let real = KprobePmu {
            served: false,
            ..served
        };
        assert_eq!(
            real.served_file(b"/sys/bus/event_source/devices/kprobe/type"),
            None
        );
        // Whatever this machine has, the kprobe type never captures the uprobe PMU's.
        assert_ne!(KprobePmu::get().type_, UprobePmu::detect().type_);
        let here = std::path::Path::new("/sys/bus/event_source/devices/kprobe/type").exists();
        assert_eq!(KprobePmu::get().served, !here);
    }

    /// Found by the fuzzer (fuzz/, target shim_bpf): a first-version attribute (size 0
    /// or 64, 64 bytes long) at the end of a page was read 8 bytes past its end.
    #[test]
    fn perf_event_open_reads_no_more_than_the_attribute_declares() {
        let mut t = TempShim::new("perf-attr-size");
        // Two pages, the second inaccessible: the attribute ends where it starts.
        // SAFETY: a fresh anonymous mapping, then its own second page protected.
        let base = unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                2 * PAGE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            assert_eq!(
                libc::mprotect(
                    p.cast::<u8>().add(PAGE_SIZE).cast(),
                    PAGE_SIZE,
                    libc::PROT_NONE
                ),
                0
            );
            p.cast::<u8>()
        };
        for declared in [0u32, 64] {
            // SAFETY: the last 64 bytes of the first page, ours.
            let a = unsafe { std::slice::from_raw_parts_mut(base.add(PAGE_SIZE - 64), 64) };
            a.fill(0);
            a[0..4].copy_from_slice(&1u32.to_ne_bytes()); // PERF_TYPE_SOFTWARE
            a[4..8].copy_from_slice(&declared.to_ne_bytes());
            a[8..16].copy_from_slice(&10u64.to_ne_bytes()); // PERF_COUNT_SW_BPF_OUTPUT
                                                            // SAFETY: a 64-byte attribute, as its size field says.
            let fd = unsafe { t.shim().perf_event_open(a.as_ptr(), -1, 0) }
                .expect("a BPF output event is served here")
                .expect("a first-version attribute is accepted");
            assert!(t.close(fd));
        }
        // Shorter than any version: left to the kernel, which refuses it.
        // SAFETY: the last 8 bytes of the first page hold type and size.
        let a = unsafe { std::slice::from_raw_parts_mut(base.add(PAGE_SIZE - 8), 8) };
        a[0..4].copy_from_slice(&1u32.to_ne_bytes());
        a[4..8].copy_from_slice(&8u32.to_ne_bytes());
        // SAFETY: 8 bytes, as declared.
        assert!(unsafe { t.shim().perf_event_open(a.as_ptr(), -1, 0) }.is_none());
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(base.cast(), 2 * PAGE_SIZE) };
    }
}
