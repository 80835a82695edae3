use crate::attr::{self, write_back_u32, Attr};
use crate::perf::{KprobePmu, UprobePmu};
use bpftime_isa::uapi::cmd;
use bpftime_runtime::{
    GpuProbeKind, LinkKind, LinkRecord, Map, ObjectKind, PerfEventRecord, ProgramRecord, Store,
};
use std::collections::{HashMap, HashSet};
use std::os::fd::{IntoRawFd, RawFd};
use std::sync::Arc;

/// What a file descriptor handed to the loader stands for.
#[derive(Debug, Clone)]
pub enum Object {
    Map(Arc<Map>),
    Program(Arc<ProgramRecord>),
    Link(u32),
    PerfEvent {
        record: PerfEventRecord,
        /// The link made by `PERF_EVENT_IOC_SET_BPF`, removed when the event closes.
        link: Option<u32>,
    },
    Btf {
        id: u32,
        size: u32,
    },
    /// The kernel's own BTF (`/sys/kernel/btf/vmlinux`), which loaders look for among the
    /// BTF objects to read kernel types from (bpftrace does, for tracepoints' arguments);
    /// its descriptor is the sysfs file.
    KernelBtf {
        size: u32,
    },
}

/// The id the kernel's BTF goes by here: above any the store hands out.
pub const KERNEL_BTF_ID: u32 = 0x7fff_fff0;
/// Where the kernel exposes its BTF.
pub(crate) const KERNEL_BTF_PATH: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug, Clone)]
pub struct ObjectRef {
    pub kind: ObjectKind,
    pub id: u32,
    pub object: Object,
    dev: u64,
    ino: u64,
}

/// A result in the kernel's terms: a value, or an errno.
pub type SysResult<T = i64> = Result<T, i32>;

/// The userspace kernel of one loader process.
pub struct Shim {
    store: Store,
    fds: HashMap<RawFd, ObjectRef>,
    pub(crate) pmu: UprobePmu,
    pub(crate) kprobe_pmu: KprobePmu,
    /// Program names (as `BPF_PROG_LOAD` carries them, 15 bytes at most) that
    /// libbpf's `cuda:` handler announced: they run on the GPU.
    gpu_names: HashSet<String>,
    /// Programs that passed the GPU rules, at load or at a first GPU attach.
    gpu_verified: HashSet<u32>,
    /// Programs the GPU rules refused at attach; their log was printed once.
    gpu_rejected: HashSet<u32>,
    /// Source lines of kprobe programs verified for the CPU at load, for the
    /// log of a GPU check at attach.
    source_lines: HashMap<u32, Vec<bpftime_verifier::SourceLine>>,
    /// Rings registered on each epoll instance: (FIFO fd, the loader's fd, the ring).
    pub(crate) epolls: HashMap<RawFd, Vec<(RawFd, RawFd, crate::perf::Waker)>>,
    /// Programs run here by `BPF_PROG_TEST_RUN`, verified and relocated once.
    pub(crate) test_runs: HashMap<u32, Arc<crate::test_run::Runnable>>,
    /// Mappings of store files the loader holds, in the fault table until it unmaps them.
    pub(crate) handed: Vec<crate::handed::Handed>,
    /// Rings found damaged (and reported): their pages read as zeros here.
    pub(crate) condemned: HashSet<crate::handed::Owner>,
    /// How far into its context each program loaded here reads (the verifier's
    /// `ctx_read_end`), for the checks at a tracepoint attach.
    pub(crate) ctx_read_ends: HashMap<u32, u32>,
    /// GPU ring buffers read through perf buffers, by map id.
    pub(crate) gpu_ring_pumps: HashMap<u32, crate::gpu_ring::PerfPump>,
}

/// Told of every descriptor the shim hands out (`true`) or forgets (`false`): the
/// preload layer keeps a bitmap of them so that it asks the shim only about its own.
static FD_OBSERVER: std::sync::OnceLock<fn(RawFd, bool)> = std::sync::OnceLock::new();

/// Sets the function told of the shim's descriptors (the preload layer's, once).
pub fn set_fd_observer(observer: fn(RawFd, bool)) {
    let _ = FD_OBSERVER.set(observer);
}

fn observe_fd(fd: RawFd, ours: bool) {
    if let Some(observer) = FD_OBSERVER.get() {
        observer(fd, ours);
    }
}

/// The kernel-internal ENOTSUPP, which `bpf()` hands to user space as is.
pub(crate) const ENOTSUPP: i32 = 524;

fn fd_is_open(fd: RawFd) -> bool {
    // SAFETY: F_GETFD only reads the descriptor's flags.
    (unsafe { libc::fcntl(fd, libc::F_GETFD) }) >= 0
}

fn stat_fd(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: zeroed stat is a valid out buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out pointer; fstat checks fd.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some((st.st_dev, st.st_ino))
}

/// Says why a call is refused (at `info`: the tool gets the errno, as from the kernel,
/// which prints nothing into the tool's terminal; `BPFTIME_LOG=info` shows the reason).
pub(crate) fn refuse(errno: i32, what: std::fmt::Arguments) -> i32 {
    tracing::info!("refused: {what} (errno {errno})");
    errno
}

impl Shim {
    pub fn new(store: Store) -> Shim {
        // Programs run here too (BPF_PROG_TEST_RUN); their bpf_printk goes
        // where the agents' does.
        bpftime_runtime::thread::init_process();
        bpftime_runtime::helpers::set_trace_output(&store);
        let removed = bpftime_runtime::collect_garbage(&store);
        if !removed.is_empty() {
            tracing::info!(
                count = removed.len(),
                "removed objects left by exited processes"
            );
        }
        Shim {
            store,
            fds: HashMap::new(),
            pmu: UprobePmu::detect(),
            kprobe_pmu: KprobePmu::get(),
            gpu_names: HashSet::new(),
            gpu_verified: HashSet::new(),
            gpu_rejected: HashSet::new(),
            source_lines: HashMap::new(),
            epolls: HashMap::new(),
            test_runs: HashMap::new(),
            handed: Vec::new(),
            condemned: HashSet::new(),
            ctx_read_ends: HashMap::new(),
            gpu_ring_pumps: HashMap::new(),
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Tells `BPF_PROG_LOAD` that the kprobe program called `name` runs on the
    /// GPU, so it is verified under the GPU rules with the log in the loader's
    /// buffer (libbpf's `cuda:` handler calls this before each load).
    pub fn expect_gpu_program(&mut self, name: &str) {
        // BPF_PROG_LOAD carries BPF_OBJ_NAME_LEN - 1 bytes of the name.
        let mut end = name.len().min(15);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        self.gpu_names.insert(name[..end].to_string());
    }

    /// The object behind `fd`, if `fd` is one of ours and still refers to it.
    pub fn object(&mut self, fd: RawFd) -> Option<&ObjectRef> {
        let ok = match self.fds.get(&fd) {
            None => return None,
            Some(o) => stat_fd(fd) == Some((o.dev, o.ino)),
        };
        if !ok {
            self.fds.remove(&fd);
            return None;
        }
        self.fds.get(&fd)
    }

    pub fn is_ours(&mut self, fd: RawFd) -> bool {
        self.object(fd).is_some()
    }

    fn hold_refs(&self) -> SysResult<bpftime_runtime::StoreLock> {
        self.store.hold_refs().map_err(|e| {
            refuse(
                e.errno(),
                format_args!("cannot lock the store against collection: {e}"),
            )
        })
    }

    /// Frees what no descriptor, pin or object refers to any more (after a close).
    pub fn collect(&mut self) {
        let freed = bpftime_runtime::collect_garbage(&self.store);
        if !freed.is_empty() {
            tracing::debug!(count = freed.len(), "freed objects without references");
        }
    }

    /// `unlink()` (or `rmdir()`, `dir`) of a path in bpffs: unpinning.
    pub fn bpffs_unlink(&mut self, rel: &std::path::Path, dir: bool) -> SysResult<()> {
        let r = if dir {
            self.store.bpffs_rmdir(rel)
        } else {
            self.store.unpin(rel)
        };
        r.map_err(|e| refuse(e.errno(), format_args!("{e}")))?;
        // The pin may have been the last reference.
        self.collect();
        Ok(())
    }

    /// `mkdir()` in bpffs.
    pub fn bpffs_mkdir(&mut self, rel: &std::path::Path) -> SysResult<()> {
        self.store
            .bpffs_mkdir(rel)
            .map_err(|e| refuse(e.errno(), format_args!("{e}")))
    }

    /// The file or directory standing for a bpffs path, if there is one.
    pub fn bpffs_dir(&mut self, rel: &std::path::Path) -> Option<std::path::PathBuf> {
        self.store
            .bpffs_exists(rel)
            .then(|| self.store.bpffs_path(rel))
    }

    /// A new descriptor for an object that exists (by id, or by pin).
    fn open_by_id(&mut self, kind: ObjectKind, id: u32) -> SysResult {
        let object = match kind {
            ObjectKind::Map => {
                Object::Map(Arc::new(Map::open(&self.store, id).map_err(|e| e.errno())?))
            }
            ObjectKind::Program => Object::Program(Arc::new(
                ProgramRecord::read(&self.store, id).map_err(|e| e.errno())?,
            )),
            ObjectKind::Link => {
                LinkRecord::read(&self.store, id).map_err(|e| e.errno())?;
                Object::Link(id)
            }
            ObjectKind::Btf => {
                let blob = bpftime_runtime::read_btf(&self.store, id).map_err(|e| e.errno())?;
                Object::Btf {
                    id,
                    size: blob.len() as u32,
                }
            }
            _ => return Err(libc::EINVAL),
        };
        self.open_fd(kind, id, object).map(|fd| fd as i64)
    }

    /// A descriptor for the kernel's BTF: its sysfs file, read-only. Reading it is no
    /// call of the kernel's eBPF; the file is what `btf__load_vmlinux_btf` reads too.
    fn open_kernel_btf(&mut self) -> SysResult {
        let file = std::fs::File::open(KERNEL_BTF_PATH)
            .map_err(|e| e.raw_os_error().unwrap_or(libc::ENOENT))?;
        let size = file.metadata().map(|m| m.len() as u32).unwrap_or(0);
        let fd = std::os::fd::IntoRawFd::into_raw_fd(file);
        let Some((dev, ino)) = stat_fd(fd) else {
            // SAFETY: opened above, not handed out.
            unsafe { libc::close(fd) };
            return Err(libc::EIO);
        };
        observe_fd(fd, true);
        self.fds.insert(
            fd,
            ObjectRef {
                kind: ObjectKind::Btf,
                id: KERNEL_BTF_ID,
                object: Object::KernelBtf { size },
                dev,
                ino,
            },
        );
        Ok(fd as i64)
    }

    /// The pathname of `BPF_OBJ_PIN` and `BPF_OBJ_GET`, below `/sys/fs/bpf`.
    fn bpffs_path(&self, a: &Attr, what: &str) -> SysResult<Result<std::path::PathBuf, String>> {
        let ptr = a.u64(attr::obj::PATHNAME) as *const libc::c_char;
        if ptr.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: the ABI makes `pathname` a NUL-terminated string in the caller's memory.
        let path = unsafe { std::ffi::CStr::from_ptr(ptr) };
        let path = std::path::Path::new(
            <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(path.to_bytes()),
        );
        Ok(bpftime_runtime::bpffs_relative(path).ok_or_else(|| {
            format!(
                "{what} {}: bpftime serves bpffs at {} only",
                path.display(),
                bpftime_runtime::BPFFS_ROOT
            )
        }))
    }

    fn obj_pin(&mut self, a: &Attr) -> SysResult {
        let rel = match self.bpffs_path(a, "BPF_OBJ_PIN")? {
            Ok(r) => r,
            // The kernel's answer for a path in a filesystem other than bpffs.
            Err(why) => return Err(refuse(libc::EPERM, format_args!("{why}"))),
        };
        let fd = a.u32(attr::obj::BPF_FD) as RawFd;
        let (kind, id) = match self.object(fd) {
            Some(o)
                if matches!(
                    o.object,
                    Object::Map(_) | Object::Program(_) | Object::Link(_)
                ) =>
            {
                (o.kind, o.id)
            }
            Some(_) => return Err(libc::EINVAL),
            None if fd_is_open(fd) => return Err(libc::EINVAL),
            None => return Err(libc::EBADF),
        };
        self.store
            .pin(&rel, kind, id)
            .map_err(|e| refuse(e.errno(), format_args!("BPF_OBJ_PIN: {e}")))?;
        tracing::info!(kind = kind.prefix(), id, path = %rel.display(), "pinned");
        Ok(0)
    }

    fn obj_get(&mut self, a: &Attr) -> SysResult {
        let rel = match self.bpffs_path(a, "BPF_OBJ_GET")? {
            Ok(r) => r,
            Err(why) => {
                let ptr = a.u64(attr::obj::PATHNAME) as *const libc::c_char;
                // SAFETY: as in bpffs_path, which read it already.
                let exists = unsafe { libc::access(ptr, libc::F_OK) } == 0;
                // A file that is not a BPF object: EACCES, as the kernel says.
                let errno = if exists { libc::EACCES } else { libc::ENOENT };
                return Err(refuse(errno, format_args!("{why}")));
            }
        };
        let (kind, id) = self
            .store
            .pinned_object(&rel)
            .map_err(|e| refuse(e.errno(), format_args!("BPF_OBJ_GET: {e}")))?;
        self.open_by_id(kind, id)
    }

    pub(crate) fn open_fd(
        &mut self,
        kind: ObjectKind,
        id: u32,
        object: Object,
    ) -> SysResult<RawFd> {
        let fd = self
            .store
            .open_object(kind, id)
            .map_err(|e| e.errno())?
            .into_raw_fd();
        let held = bpftime_runtime::hold(fd);
        let stat = stat_fd(fd);
        let (Ok(()), Some((dev, ino))) = (held, stat) else {
            // SAFETY: the fd was opened above and is not handed out.
            unsafe { libc::close(fd) };
            return Err(refuse(
                libc::EIO,
                format_args!("cannot hold {} {id} through a descriptor", kind.prefix()),
            ));
        };
        observe_fd(fd, true);
        self.fds.insert(
            fd,
            ObjectRef {
                kind,
                id,
                object,
                dev,
                ino,
            },
        );
        Ok(fd)
    }

    pub(crate) fn map(&mut self, fd: u32) -> SysResult<Arc<Map>> {
        match self.object(fd as RawFd).map(|o| &o.object) {
            Some(Object::Map(m)) => Ok(m.clone()),
            Some(_) => Err(libc::EINVAL),
            None => Err(libc::EBADF),
        }
    }

    pub(crate) fn program(&mut self, fd: u32) -> SysResult<Arc<ProgramRecord>> {
        match self.object(fd as RawFd).map(|o| &o.object) {
            Some(Object::Program(p)) => Ok(p.clone()),
            Some(_) => Err(libc::EINVAL),
            None => Err(libc::EBADF),
        }
    }

    /// Serves one `bpf(cmd, attr, size)` call.
    ///
    /// # Safety
    /// `attr` must point to `size` readable and writable bytes, and every
    /// pointer inside the attribute must be valid as the kernel's ABI defines.
    pub unsafe fn bpf(&mut self, command: u32, attr: *mut u8, size: usize) -> SysResult {
        // SAFETY: caller obligation.
        let a = unsafe { Attr::read(attr, size) };
        let listing = matches!(
            command,
            cmd::MAP_GET_NEXT_ID
                | cmd::PROG_GET_NEXT_ID
                | cmd::LINK_GET_NEXT_ID
                | cmd::BTF_GET_NEXT_ID
        );
        if listing && a.u32(attr::get_id::START_ID) == 0 {
            // A listing shows what the kernel would still hold.
            self.collect();
        }
        // Whatever this call refers to must not be collected under it.
        let _refs = self.hold_refs()?;
        match command {
            cmd::MAP_CREATE => self.map_create(&a),
            // SAFETY: forwarded caller obligation for the pointers inside `a`.
            cmd::MAP_LOOKUP_ELEM
            | cmd::MAP_UPDATE_ELEM
            | cmd::MAP_DELETE_ELEM
            | cmd::MAP_GET_NEXT_KEY
            | cmd::MAP_LOOKUP_AND_DELETE_ELEM => unsafe { self.map_elem(command, &a) },
            cmd::MAP_FREEZE => {
                let m = self.map(a.u32(attr::elem::MAP_FD))?;
                m.freeze().map(|_| 0).map_err(|e| e.errno())
            }
            cmd::MAP_LOOKUP_BATCH
            | cmd::MAP_LOOKUP_AND_DELETE_BATCH
            | cmd::MAP_UPDATE_BATCH
            // SAFETY: forwarded caller obligation.
            | cmd::MAP_DELETE_BATCH => unsafe { self.map_batch(command, &a, attr, size) },
            // SAFETY: forwarded caller obligation.
            cmd::PROG_LOAD => unsafe { self.prog_load(&a, attr, size) },
            cmd::BTF_LOAD => self.btf_load(&a),
            // SAFETY: forwarded caller obligation.
            cmd::PROG_TEST_RUN => unsafe { self.prog_test_run(&a, attr, size) },
            // SAFETY: forwarded caller obligation.
            cmd::OBJ_GET_INFO_BY_FD => unsafe { self.get_info(&a, attr, size) },
            cmd::LINK_CREATE => self.link_create(&a),
            // SAFETY: forwarded caller obligation for the name pointer.
            cmd::RAW_TRACEPOINT_OPEN => unsafe { self.raw_tracepoint_open(&a) },
            cmd::LINK_DETACH => {
                let fd = a.u32(0) as RawFd;
                match self.object(fd).cloned() {
                    Some(ObjectRef { object: Object::Link(id), .. }) => {
                        let _ = self.store.remove(ObjectKind::Link, id);
                        Ok(0)
                    }
                    Some(_) => Err(libc::EINVAL),
                    None => Err(libc::EBADF),
                }
            }
            cmd::PROG_BIND_MAP => {
                self.program(a.u32(0))?;
                self.map(a.u32(4))?;
                Ok(0)
            }
            cmd::MAP_GET_NEXT_ID | cmd::PROG_GET_NEXT_ID | cmd::LINK_GET_NEXT_ID | cmd::BTF_GET_NEXT_ID => {
                let kind = match command {
                    cmd::MAP_GET_NEXT_ID => ObjectKind::Map,
                    cmd::PROG_GET_NEXT_ID => ObjectKind::Program,
                    cmd::LINK_GET_NEXT_ID => ObjectKind::Link,
                    _ => ObjectKind::Btf,
                };
                let start = a.u32(attr::get_id::START_ID);
                let mut ids = self.store.ids(kind);
                if kind == ObjectKind::Btf && std::path::Path::new(KERNEL_BTF_PATH).exists() {
                    ids.push(KERNEL_BTF_ID);
                }
                let next = ids.into_iter().find(|&i| i > start).ok_or(libc::ENOENT)?;
                // SAFETY: caller obligation: attr holds `size` writable bytes.
                unsafe { write_back_u32(attr, size, attr::get_id::NEXT_ID, next) };
                Ok(0)
            }
            cmd::MAP_GET_FD_BY_ID => self.open_by_id(ObjectKind::Map, a.u32(0)),
            cmd::PROG_GET_FD_BY_ID => self.open_by_id(ObjectKind::Program, a.u32(0)),
            cmd::LINK_GET_FD_BY_ID => self.open_by_id(ObjectKind::Link, a.u32(0)),
            cmd::BTF_GET_FD_BY_ID if a.u32(0) == KERNEL_BTF_ID => self.open_kernel_btf(),
            cmd::BTF_GET_FD_BY_ID => self.open_by_id(ObjectKind::Btf, a.u32(0)),
            cmd::OBJ_PIN => self.obj_pin(&a),
            cmd::OBJ_GET => self.obj_get(&a),
            cmd::PROG_ATTACH | cmd::PROG_DETACH => Err(refuse(
                libc::EINVAL,
                format_args!("BPF_PROG_ATTACH attaches cgroup and socket programs, which bpftime does not run"),
            )),
            _ => Err(refuse(
                libc::EINVAL,
                format_args!("bpf command {command} is not served by bpftime"),
            )),
        }
    }

    /// # Safety
    /// Pointers in `a` must be valid as `BPF_PROG_LOAD` defines them.
    unsafe fn prog_load(&mut self, a: &Attr, attr: *mut u8, size: usize) -> SysResult {
        use attr::prog_load as f;
        let insn_cnt = a.u32(f::INSN_CNT) as usize;
        let insns_ptr = a.u64(f::INSNS) as *const u8;
        let log_level = a.u32(f::LOG_LEVEL);
        let log_size = a.u32(f::LOG_SIZE) as usize;
        let log_buf = a.u64(f::LOG_BUF) as *mut u8;
        if log_level != 0 && (log_buf.is_null() || log_size < 128) {
            return Err(libc::EINVAL);
        }
        if insn_cnt == 0 || insn_cnt > bpftime_isa::uapi::MAX_INSNS || insns_ptr.is_null() {
            return Err(if insn_cnt == 0 {
                libc::EINVAL
            } else {
                libc::E2BIG
            });
        }
        // SAFETY: caller obligation: insns holds insn_cnt instructions.
        let raw = unsafe { std::slice::from_raw_parts(insns_ptr, insn_cnt * 8) };
        let insns = bpftime_isa::decode(raw).map_err(|_| libc::EINVAL)?;
        let license_ptr = a.u64(f::LICENSE) as *const libc::c_char;
        let gpl = !license_ptr.is_null() && {
            // SAFETY: the license is a NUL-terminated string (caller obligation).
            let l = unsafe { std::ffi::CStr::from_ptr(license_ptr) }.to_string_lossy();
            [
                "GPL",
                "GPL v2",
                "GPL and additional rights",
                "Dual BSD/GPL",
                "Dual MIT/GPL",
                "Dual MPL/GPL",
            ]
            .contains(&l.as_ref())
        };
        let fd_array = a.u64(f::FD_ARRAY) as *const i32;
        let prog_type = a.u32(f::PROG_TYPE);
        let name = a.str(f::NAME, 16);
        // Map references: file descriptors become store ids.
        let mut maps: HashMap<u32, Arc<Map>> = HashMap::new();
        let resolved = bpftime_prepare::resolve_maps(&insns, |fd, by_index| {
            let fd = if by_index {
                if fd_array.is_null() {
                    return Err(libc::EINVAL);
                }
                // SAFETY: fd_array holds the indices the program uses (caller obligation).
                unsafe { *fd_array.add(fd as usize) }
            } else {
                fd
            };
            let m = self.map(fd as u32)?;
            let id = m.id();
            maps.insert(id, m);
            Ok(id)
        });
        let (insns, map_ids) = match resolved {
            Ok(r) => r,
            Err((errno, log)) => {
                // SAFETY: caller obligation for log_buf.
                unsafe { write_log(log_buf, log_size, &log, attr, size) };
                return Err(errno);
            }
        };
        // SAFETY: caller obligation for the line info pointer.
        let source_lines = unsafe { self.source_lines(a, insn_cnt) };
        let lookup = |id: u32| bpftime_prepare::desc_of(&maps, id);
        // bpftime's GPU programs: a kprobe whose name starts with `cuda__` probes a
        // CUDA kernel (docs/ARCHITECTURE.md, compatibility contract), and so does one from a
        // `cuda:` section (libbpf's handler names it before the load). Any other
        // kprobe is checked for the GPU when it is attached to a CUDA kernel.
        let kprobe = prog_type == bpftime_isa::uapi::prog_type::KPROBE;
        let gpu = kprobe
            && (name.starts_with(bpftime_runtime::CUDA_PROGRAM_PREFIX)
                || self.gpu_names.contains(&name));
        let kept_lines = (kprobe && !gpu).then(|| source_lines.clone());
        let checked = bpftime_prepare::check_program_full(
            &insns,
            prog_type,
            &lookup,
            log_level,
            source_lines,
            gpu,
        );
        let (log, ctx_read_end) = match checked {
            Ok(done) => done,
            Err((errno, log)) => {
                // The log goes back to the tool, whose loader prints it (libbpf does);
                // feature probes that expect a rejection print nothing, as on the kernel.
                tracing::info!(program = %name, "program rejected:\n{log}");
                // SAFETY: caller obligation for log_buf.
                unsafe { write_log(log_buf, log_size, &log, attr, size) };
                return Err(errno);
            }
        };
        if log_level != 0 {
            // SAFETY: caller obligation for log_buf.
            unsafe { write_log(log_buf, log_size, &log, attr, size) };
        }
        let id = self.store.alloc_id();
        let rec = ProgramRecord {
            id,
            prog_type,
            expected_attach_type: a.u32(f::EXPECTED_ATTACH_TYPE),
            name,
            insns,
            map_ids,
            gpl,
            owner_pid: std::process::id(),
        };
        rec.publish(&self.store).map_err(|e| e.errno())?;
        self.ctx_read_ends.insert(id, ctx_read_end);
        if gpu {
            self.gpu_verified.insert(id);
            // Announced for this load; libbpf loads again only after a failure.
            self.gpu_names.remove(&rec.name);
        }
        if let Some(lines) = kept_lines.filter(|l| !l.is_empty()) {
            self.source_lines.insert(id, lines);
        }
        self.open_fd(ObjectKind::Program, id, Object::Program(Arc::new(rec)))
            .map(|fd| fd as i64)
    }

    /// The program's source lines, from its line info and the BTF behind
    /// `prog_btf_fd`; empty when either is missing or malformed, since they only
    /// improve the rejection log.
    ///
    /// # Safety
    /// `line_info` in `a`, when set, must point to `line_info_cnt` records of
    /// `line_info_rec_size` bytes (the `BPF_PROG_LOAD` contract).
    unsafe fn source_lines(
        &mut self,
        a: &Attr,
        insn_cnt: usize,
    ) -> Vec<bpftime_verifier::SourceLine> {
        use attr::prog_load as f;
        let ptr = a.u64(f::LINE_INFO) as *const u8;
        let rec_size = a.u32(f::LINE_INFO_REC_SIZE) as usize;
        let cnt = a.u32(f::LINE_INFO_CNT) as usize;
        // The kernel bounds both the same way: a record per instruction at most,
        // and records of a sane size.
        if ptr.is_null() || cnt == 0 || cnt > insn_cnt || !(16..=256).contains(&rec_size) {
            return Vec::new();
        }
        let btf_fd = a.u32(f::PROG_BTF_FD);
        let btf_id = match self.object(btf_fd as RawFd) {
            Some(ObjectRef {
                object: Object::Btf { id, .. },
                ..
            }) if btf_fd != 0 => *id,
            _ => return Vec::new(),
        };
        let Ok(btf) = bpftime_runtime::read_btf(&self.store, btf_id) else {
            return Vec::new();
        };
        // SAFETY: caller obligation: cnt records of rec_size bytes.
        let records = unsafe { std::slice::from_raw_parts(ptr, cnt * rec_size) };
        bpftime_prepare::source_lines(&btf, records, rec_size)
    }

    fn btf_load(&mut self, a: &Attr) -> SysResult {
        use attr::btf_load as f;
        let ptr = a.u64(f::BTF) as *const u8;
        let len = a.u32(f::SIZE) as usize;
        if ptr.is_null() || len < 24 {
            return Err(libc::EINVAL);
        }
        // SAFETY: the loader's BTF blob holds `len` bytes (ABI contract).
        let blob = unsafe { std::slice::from_raw_parts(ptr, len) };
        if u16::from_ne_bytes([blob[0], blob[1]]) != 0xeb9f {
            return Err(refuse(
                libc::EINVAL,
                format_args!("BTF blob has a bad magic"),
            ));
        }
        let id = self.store.alloc_id();
        bpftime_runtime::publish_btf(&self.store, id, blob).map_err(|e| e.errno())?;
        self.open_fd(
            ObjectKind::Btf,
            id,
            Object::Btf {
                id,
                size: len as u32,
            },
        )
        .map(|fd| fd as i64)
    }

    fn link_create(&mut self, a: &Attr) -> SysResult {
        use attr::link_create as f;
        let attach_type = a.u32(f::ATTACH_TYPE);
        if attach_type == bpftime_isa::uapi::attach_type::TRACE_KPROBE_MULTI {
            // Tools (bpftrace) probe for multi-kprobe links at start; there are no
            // kernel functions to attach to here, and the answer is a kernel's
            // without the feature, which is nothing to warn about.
            tracing::debug!("BPF_LINK_CREATE for kprobe_multi: kernel functions do not exist in userspace (errno {})", libc::EINVAL);
            return Err(libc::EINVAL);
        }
        if attach_type != bpftime_isa::uapi::attach_type::PERF_EVENT {
            return Err(refuse(
                libc::EINVAL,
                format_args!("BPF_LINK_CREATE with attach type {attach_type}: bpftime links programs to uprobe, kprobe (CUDA kernel) and tracepoint perf events only"),
            ));
        }
        let prog = self.program(a.u32(f::PROG_FD))?;
        let target = a.u32(f::TARGET_FD) as RawFd;
        let ev = match self.object(target).map(|o| o.object.clone()) {
            Some(Object::PerfEvent { record, .. }) => record,
            Some(_) => return Err(libc::EINVAL),
            None => return Err(libc::EBADF),
        };
        let id = self.make_link(&prog, &ev, a.u64(f::PERF_EVENT_COOKIE), false)?;
        self.open_link_fd(id)
    }

    /// A descriptor for the new link `id`.
    pub(crate) fn open_link_fd(&mut self, id: u32) -> SysResult {
        self.open_fd(ObjectKind::Link, id, Object::Link(id))
            .map(|fd| fd as i64)
    }

    pub(crate) fn make_link(
        &mut self,
        prog: &ProgramRecord,
        ev: &PerfEventRecord,
        cookie: u64,
        owned_by_event: bool,
    ) -> SysResult<u32> {
        let kind = ev.kind.link_kind().ok_or(libc::EINVAL)?;
        if kind == LinkKind::Tracepoint {
            self.check_tracepoint_program(prog, &ev.path)?;
        } else if prog.prog_type != bpftime_isa::uapi::prog_type::KPROBE {
            return Err(refuse(
                libc::EINVAL,
                format_args!(
                    "program `{}` has type {}; uprobes and CUDA kernel probes take kprobe programs",
                    prog.name, prog.prog_type
                ),
            ));
        }
        if kind.is_gpu() {
            if ev.offset != 0 {
                tracing::info!(
                    prog = %prog.name,
                    kernel = %ev.path,
                    offset = ev.offset,
                    "refused (errno {}): CUDA kernel probes attach at a kernel's entry, exit or launch, not at an offset into it",
                    libc::EINVAL
                );
                return Err(libc::EINVAL);
            }
            // A launch program runs on the CPU, under the rules it was loaded with.
            if kind != LinkKind::Gpu(GpuProbeKind::Launch) {
                self.check_for_gpu(prog, &ev.path)?;
            }
        }
        let id = self.store.alloc_id();
        let rec = LinkRecord {
            id,
            prog_id: prog.id,
            perf_event_id: ev.id,
            kind,
            path: ev.path.clone(),
            offset: ev.offset,
            pid: ev.pid,
            cookie,
            ref_ctr_offset: ev.ref_ctr_offset,
            owned_by_event,
            owner_pid: std::process::id(),
        };
        rec.publish(&self.store).map_err(|e| e.errno())?;
        tracing::info!(link = id, prog = %prog.name, kind = kind.label(), path = %ev.path, offset = ev.offset, "attached");
        Ok(id)
    }

    /// Checks a kprobe program attached to a CUDA kernel under the GPU rules,
    /// unless it passed them at load. A refusal is the user's to act on, and
    /// libbpf and bcc report a failed attach without the reason: the verifier's
    /// log goes to stderr, once per program.
    fn check_for_gpu(&mut self, prog: &ProgramRecord, kernel: &str) -> SysResult<()> {
        if self.gpu_verified.contains(&prog.id) {
            return Ok(());
        }
        if self.gpu_rejected.contains(&prog.id) {
            return Err(libc::EINVAL);
        }
        let mut maps = HashMap::new();
        for &id in &prog.map_ids {
            let m = Map::open(&self.store, id).map_err(|e| e.errno())?;
            maps.insert(id, Arc::new(m));
        }
        let lookup = |id: u32| bpftime_prepare::desc_of(&maps, id);
        let lines = self.source_lines.get(&prog.id).cloned().unwrap_or_default();
        let checked = bpftime_prepare::check_program_with_lines(
            &prog.insns,
            prog.prog_type,
            &lookup,
            1,
            lines,
            true,
        );
        match checked {
            Ok(_) => {
                tracing::info!(prog = %prog.name, kernel, "program passes the GPU rules");
                self.gpu_verified.insert(prog.id);
                self.source_lines.remove(&prog.id);
                Ok(())
            }
            Err((_, log)) => {
                self.gpu_rejected.insert(prog.id);
                self.source_lines.remove(&prog.id);
                eprintln!(
                    "bpftime: program `{}` cannot be attached to the CUDA kernel `{kernel}`: the verifier rejects it under the GPU rules (every kprobe is a GPU probe in bpftime):\n{}",
                    prog.name,
                    log.trim_end()
                );
                Err(libc::EINVAL)
            }
        }
    }

    pub(crate) fn register_perf_event(&mut self, record: PerfEventRecord) -> SysResult<RawFd> {
        let _refs = self.hold_refs()?;
        record.publish(&self.store).map_err(|e| e.errno())?;
        let id = record.id;
        self.open_fd(
            ObjectKind::PerfEvent,
            id,
            Object::PerfEvent { record, link: None },
        )
    }

    pub(crate) fn set_perf_link(&mut self, fd: RawFd, prog_fd: RawFd) -> SysResult<i32> {
        let _refs = self.hold_refs()?;
        let prog = self.program(prog_fd as u32)?;
        let ev = match self.object(fd).map(|o| o.object.clone()) {
            Some(Object::PerfEvent { record, link: None }) => record,
            Some(Object::PerfEvent { link: Some(_), .. }) => return Err(libc::EEXIST),
            _ => return Err(libc::EBADF),
        };
        let link = self.make_link(&prog, &ev, 0, true)?;
        if let Some(ObjectRef {
            object: Object::PerfEvent { link: l, .. },
            ..
        }) = self.fds.get_mut(&fd)
        {
            *l = Some(link);
        }
        Ok(0)
    }

    /// Forgets `fd` before the caller closes it. The object itself dies when its
    /// last reference goes (a link detaches then, as in the kernel): the caller runs
    /// [`Shim::collect`] once the descriptor is really closed.
    pub fn close(&mut self, fd: RawFd) -> bool {
        if self.object(fd).is_none() {
            return false;
        }
        self.fds.remove(&fd);
        observe_fd(fd, false);
        if let Some(list) = self.epolls.remove(&fd) {
            for (fifo, _, _) in list {
                // SAFETY: the FIFO fd was opened by us for this epoll instance.
                unsafe { libc::close(fifo) };
            }
        }
        true
    }
}

/// Copies the verifier log to the loader's buffer, NUL-terminated and truncated
/// as the kernel does, and reports the full size in `log_true_size`.
///
/// # Safety
/// `buf` must hold `size` writable bytes (or be null); `attr` as for `bpf()`.
unsafe fn write_log(buf: *mut u8, size: usize, log: &str, attr: *mut u8, attr_size: usize) {
    if !buf.is_null() && size > 0 {
        let n = log.len().min(size - 1);
        // SAFETY: caller obligation; n + 1 <= size.
        unsafe {
            std::ptr::copy_nonoverlapping(log.as_ptr(), buf, n);
            *buf.add(n) = 0;
        }
    }
    // SAFETY: caller obligation.
    unsafe {
        write_back_u32(
            attr,
            attr_size,
            attr::prog_load::LOG_TRUE_SIZE,
            log.len() as u32 + 1,
        )
    };
}

impl Shim {
    /// Records that `new` is a duplicate of our fd `old`.
    pub fn dup(&mut self, old: RawFd, new: RawFd) {
        if let Some(o) = self.object(old).cloned() {
            if stat_fd(new) == Some((o.dev, o.ino)) {
                observe_fd(new, true);
                let o = match o.object {
                    // A duplicated perf event shares the link of the original.
                    Object::PerfEvent { record, .. } => ObjectRef {
                        object: Object::PerfEvent { record, link: None },
                        ..o
                    },
                    _ => o,
                };
                self.fds.insert(new, o);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bpftime_isa::uapi::{self, map_type};

    use crate::test_support::TempShim;

    /// bpftrace reads kernel types from the kernel's BTF object, found by walking BTF ids
    /// (`bpf_btf_get_next_id`) for the one named vmlinux, and read with libbpf's
    /// `btf__load_from_kernel_by_id`: a 4 KiB buffer first, then one of the size reported.
    #[test]
    fn the_kernels_btf_is_listed_opened_and_read_as_the_kernel_gives_it() {
        let Ok(want) = std::fs::read(KERNEL_BTF_PATH) else {
            eprintln!("no {KERNEL_BTF_PATH} here");
            return;
        };
        let mut t = TempShim::new("core-kernel-btf");
        let mut a = [0u8; 128];
        let mut seen = Vec::new();
        let mut start = 0u32;
        loop {
            a[0..4].copy_from_slice(&start.to_ne_bytes());
            if t.bpf(cmd::BTF_GET_NEXT_ID, &mut a).is_err() {
                break;
            }
            start = u32::from_ne_bytes(a[4..8].try_into().unwrap());
            seen.push(start);
        }
        assert!(seen.contains(&KERNEL_BTF_ID), "{seen:?}");
        let mut a = [0u8; 128];
        a[0..4].copy_from_slice(&KERNEL_BTF_ID.to_ne_bytes());
        let fd = t.bpf(cmd::BTF_GET_FD_BY_ID, &mut a).unwrap() as u32;
        let info = |t: &mut TempShim, buf: &mut [u8], name: &mut [u8]| -> ([u8; 32], SysResult) {
            let mut info = [0u8; 32];
            info[0..8].copy_from_slice(&(buf.as_mut_ptr() as u64).to_ne_bytes());
            info[8..12].copy_from_slice(&(buf.len() as u32).to_ne_bytes());
            info[16..24].copy_from_slice(&(name.as_mut_ptr() as u64).to_ne_bytes());
            info[24..28].copy_from_slice(&(name.len() as u32).to_ne_bytes());
            let mut a = [0u8; 128];
            a[0..4].copy_from_slice(&fd.to_ne_bytes());
            a[4..8].copy_from_slice(&32u32.to_ne_bytes());
            a[8..16].copy_from_slice(&(info.as_mut_ptr() as u64).to_ne_bytes());
            let r = t.bpf(cmd::OBJ_GET_INFO_BY_FD, &mut a);
            (info, r)
        };
        let mut small = vec![0u8; 4096];
        let mut name = [0u8; 64];
        let (got, r) = info(&mut t, &mut small, &mut name);
        assert_eq!(r, Ok(0), "a short buffer gets what fits");
        let size = u32::from_ne_bytes(got[8..12].try_into().unwrap()) as usize;
        assert_eq!(size, want.len());
        assert_eq!(&small[..], &want[..4096]);
        assert_eq!(&name[..8], b"vmlinux\0");
        assert_eq!(u32::from_ne_bytes(got[24..28].try_into().unwrap()), 7);
        assert_eq!(
            u32::from_ne_bytes(got[28..32].try_into().unwrap()),
            1,
            "kernel_btf"
        );
        let mut all = vec![0u8; size];
        let (_, r) = info(&mut t, &mut all, &mut name);
        assert_eq!(r, Ok(0));
        assert_eq!(all, want);
    }

    /// Found by the fuzzer (fuzz/, target shim_bpf): a batch call with a count and a
    /// null `keys` or `values` made slices over null pointers.
    #[test]
    fn batch_calls_with_null_arrays_fail_with_efault() {
        let mut t = TempShim::new("core-batch-null");
        let mut a = [0u8; 128];
        a[0..4].copy_from_slice(&map_type::HASH.to_ne_bytes());
        a[4..8].copy_from_slice(&4u32.to_ne_bytes());
        a[8..12].copy_from_slice(&8u32.to_ne_bytes());
        a[12..16].copy_from_slice(&8u32.to_ne_bytes());
        let fd = t.bpf(cmd::MAP_CREATE, &mut a).expect("hash map") as u32;
        let key = 1u32.to_ne_bytes();
        let value = [7u8; 8];
        let mut a = [0u8; 128];
        a[0..4].copy_from_slice(&fd.to_ne_bytes());
        a[8..16].copy_from_slice(&(key.as_ptr() as u64).to_ne_bytes());
        a[16..24].copy_from_slice(&(value.as_ptr() as u64).to_ne_bytes());
        t.bpf(cmd::MAP_UPDATE_ELEM, &mut a)
            .expect("an element to walk to");
        let mut cursor = 0u32;
        let mut keys = [0u8; 4];
        let mut values = [0u8; 8];
        for command in [
            cmd::MAP_LOOKUP_BATCH,
            cmd::MAP_LOOKUP_AND_DELETE_BATCH,
            cmd::MAP_UPDATE_BATCH,
            cmd::MAP_DELETE_BATCH,
        ] {
            let uses_values = command != cmd::MAP_DELETE_BATCH;
            let cases: &[(u64, u64)] = &[
                (0, values.as_mut_ptr() as u64),
                (keys.as_mut_ptr() as u64, 0),
                (0, 0),
            ];
            for &(k, v) in cases {
                let mut a = [0u8; 128];
                a[8..16].copy_from_slice(&(&mut cursor as *mut u32 as u64).to_ne_bytes());
                a[16..24].copy_from_slice(&k.to_ne_bytes());
                a[24..32].copy_from_slice(&v.to_ne_bytes());
                a[32..36].copy_from_slice(&1u32.to_ne_bytes());
                a[36..40].copy_from_slice(&fd.to_ne_bytes());
                let r = t.bpf(command, &mut a);
                if k == 0 || uses_values {
                    assert_eq!(
                        r,
                        Err(libc::EFAULT),
                        "command {command}, keys {k:#x}, values {v:#x}"
                    );
                }
            }
        }
        // The element is still there: nothing above reached the map.
        let mut out = [0u8; 8];
        let mut a = [0u8; 128];
        a[0..4].copy_from_slice(&fd.to_ne_bytes());
        a[8..16].copy_from_slice(&(key.as_ptr() as u64).to_ne_bytes());
        a[16..24].copy_from_slice(&(out.as_mut_ptr() as u64).to_ne_bytes());
        assert_eq!(t.bpf(cmd::MAP_LOOKUP_ELEM, &mut a), Ok(0));
        assert_eq!(out, value);
    }

    /// `bpf_snprintf(out, 64, fmt, data, data_len)` with `fmt` at the start of map
    /// `fd`'s value, as `BPF_PROG_LOAD` answers it.
    fn load_snprintf(t: &mut TempShim, fd: u32, data_len: i32) -> SysResult {
        let mut insns = bpftime_isa::asm::assemble(&format!(
            "mov %r1, %r10\nadd %r1, -80\nmov %r2, 64\nlddw %r3, 0\nmov %r4, %r10\n\
             add %r4, -16\nmov %r5, {data_len}\ncall 165\nmov %r0, 0\nexit"
        ))
        .unwrap();
        insns[3].src = bpftime_isa::opcode::PSEUDO_MAP_VALUE;
        insns[3].imm = fd as i32;
        let code = bpftime_isa::encode(&insns);
        let mut a = [0u8; 128];
        a[0..4].copy_from_slice(&uapi::prog_type::KPROBE.to_ne_bytes());
        a[4..8].copy_from_slice(&(insns.len() as u32).to_ne_bytes());
        a[8..16].copy_from_slice(&(code.as_ptr() as u64).to_ne_bytes());
        a[16..24].copy_from_slice(&(c"GPL".as_ptr() as u64).to_ne_bytes());
        t.bpf(cmd::PROG_LOAD, &mut a)
    }

    /// The verifier reads `bpf_snprintf`'s format from the map at load, as the kernel
    /// does: only once the map is frozen, and then from what the map holds.
    #[test]
    fn a_format_counts_once_its_read_only_map_is_frozen() {
        let mut t = TempShim::new("core-const-str");
        let mut a = [0u8; 128];
        a[0..4].copy_from_slice(&map_type::ARRAY.to_ne_bytes());
        a[4..8].copy_from_slice(&4u32.to_ne_bytes());
        a[8..12].copy_from_slice(&16u32.to_ne_bytes());
        a[12..16].copy_from_slice(&1u32.to_ne_bytes());
        a[16..20].copy_from_slice(&uapi::map_flags::RDONLY_PROG.to_ne_bytes());
        let fd = t.bpf(cmd::MAP_CREATE, &mut a).expect("array") as u32;
        let key = 0u32.to_ne_bytes();
        let fmt = *b"%d %d\0\0\0\0\0\0\0\0\0\0";
        let mut a = [0u8; 128];
        a[0..4].copy_from_slice(&fd.to_ne_bytes());
        a[8..16].copy_from_slice(&(key.as_ptr() as u64).to_ne_bytes());
        a[16..24].copy_from_slice(&(fmt.as_ptr() as u64).to_ne_bytes());
        t.bpf(cmd::MAP_UPDATE_ELEM, &mut a).expect("the format");
        assert_eq!(
            load_snprintf(&mut t, fd, 16),
            Err(libc::EACCES),
            "not frozen"
        );
        let mut a = [0u8; 128];
        a[0..4].copy_from_slice(&fd.to_ne_bytes());
        assert_eq!(t.bpf(cmd::MAP_FREEZE, &mut a), Ok(0));
        assert!(load_snprintf(&mut t, fd, 16).is_ok(), "two arguments");
        assert_eq!(
            load_snprintf(&mut t, fd, 8),
            Err(libc::EINVAL),
            "one argument: an invalid format is EINVAL, as in the kernel"
        );
    }
}
