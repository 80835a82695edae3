//! Programs, perf events and links: small records, written once and read by
//! agents. Each file is an [`ObjectHeader`] followed by little-endian fields.

use crate::layout::{ObjectHeader, ObjectKind};
use crate::store::{new_object_header, Store};
use crate::{Error, GpuProbeKind, Result};
use bpftime_isa::Insn;
use std::path::PathBuf;

struct Writer(Vec<u8>);

impl Writer {
    fn new(kind: ObjectKind, id: u32) -> Self {
        let h = new_object_header(kind, id);
        let mut v = vec![0u8; std::mem::size_of::<ObjectHeader>()];
        // SAFETY: `v` is exactly one ObjectHeader long; write_unaligned copes with its alignment.
        unsafe { std::ptr::write_unaligned(v.as_mut_ptr().cast::<ObjectHeader>(), h) };
        Writer(v)
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        self
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: PathBuf,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8], path: PathBuf) -> Self {
        Reader {
            bytes,
            pos: std::mem::size_of::<ObjectHeader>(),
            path,
        }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(Error::invalid(
                libc::EINVAL,
                format!("{} is truncated", self.path.display()),
            ));
        };
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().unwrap_or_default(),
        ))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().unwrap_or_default(),
        ))
    }
    fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn owner(&self) -> u32 {
        // SAFETY: check_header verified the header is present; plain old data.
        let h: ObjectHeader = unsafe { std::ptr::read_unaligned(self.bytes.as_ptr().cast()) };
        h.owner_pid
    }
}

/// A loaded program as the store keeps it. In `insns`, every `lddw` that refers
/// to a map (`src` = `PSEUDO_MAP_FD` or `PSEUDO_MAP_VALUE`) carries the map's
/// store id in `imm` instead of a file descriptor.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgramRecord {
    pub id: u32,
    pub prog_type: u32,
    pub expected_attach_type: u32,
    pub name: String,
    pub insns: Vec<Insn>,
    pub map_ids: Vec<u32>,
    pub gpl: bool,
    pub owner_pid: u32,
}

impl ProgramRecord {
    pub fn publish(&self, store: &Store) -> Result<PathBuf> {
        let mut w = Writer::new(ObjectKind::Program, self.id);
        w.u32(self.prog_type)
            .u32(self.expected_attach_type)
            .u32(self.gpl as u32)
            .bytes(self.name.as_bytes())
            .bytes(&bpftime_isa::encode(&self.insns));
        w.u32(self.map_ids.len() as u32);
        for m in &self.map_ids {
            w.u32(*m);
        }
        store.publish_bytes(ObjectKind::Program, self.id, &w.0)
    }

    pub fn read(store: &Store, id: u32) -> Result<Self> {
        let bytes = store.read_object(ObjectKind::Program, id)?;
        let path = store.path(ObjectKind::Program, id);
        let mut r = Reader::new(&bytes, path.clone());
        let prog_type = r.u32()?;
        let expected_attach_type = r.u32()?;
        let gpl = r.u32()? != 0;
        let name = String::from_utf8_lossy(r.bytes()?).into_owned();
        let insns = bpftime_isa::decode(r.bytes()?)
            .map_err(|e| Error::invalid(libc::EINVAL, format!("{}: {e}", path.display())))?;
        let n = r.u32()?;
        let map_ids = (0..n).map(|_| r.u32()).collect::<Result<_>>()?;
        Ok(ProgramRecord {
            id,
            prog_type,
            expected_attach_type,
            name,
            insns,
            map_ids,
            gpl,
            owner_pid: r.owner(),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PerfEventKind {
    Uprobe,
    Uretprobe,
    /// A `PERF_COUNT_SW_BPF_OUTPUT` event: the ring a perf event array writes into.
    BpfOutput,
    /// A kprobe by function name. Kernel functions do not exist in userspace:
    /// in bpftime the name is a CUDA kernel's, and a program attached here is a
    /// GPU entry probe.
    Kprobe,
    /// A kretprobe by function name: a GPU exit probe.
    Kretprobe,
    /// Each launch of a CUDA kernel (bpftime's own event, see
    /// [`crate::GPU_LAUNCH_CONFIG_BIT`]).
    GpuLaunch,
    /// Every global memory access of a CUDA kernel (bpftime's own event, see
    /// [`crate::GPU_ACCESS_CONFIG_BIT`]).
    GpuAccess,
    /// Those and every shared-memory access ([`crate::GPU_SHARED_ACCESS_CONFIG_BIT`]).
    GpuSharedAccess,
    /// A tracepoint (`PERF_TYPE_TRACEPOINT`); `path` is `GROUP/NAME` (a system call's
    /// `syscalls/sys_enter_openat`, or `raw_syscalls/sys_enter`), `offset` its id.
    Tracepoint,
}

impl PerfEventKind {
    fn to_u32(self) -> u32 {
        match self {
            PerfEventKind::Uprobe => 1,
            PerfEventKind::Uretprobe => 2,
            PerfEventKind::BpfOutput => 3,
            PerfEventKind::Kprobe => 4,
            PerfEventKind::Kretprobe => 5,
            PerfEventKind::GpuLaunch => 6,
            PerfEventKind::GpuAccess => 7,
            PerfEventKind::GpuSharedAccess => 8,
            PerfEventKind::Tracepoint => 9,
        }
    }
    fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(PerfEventKind::Uprobe),
            2 => Some(PerfEventKind::Uretprobe),
            3 => Some(PerfEventKind::BpfOutput),
            4 => Some(PerfEventKind::Kprobe),
            5 => Some(PerfEventKind::Kretprobe),
            6 => Some(PerfEventKind::GpuLaunch),
            7 => Some(PerfEventKind::GpuAccess),
            8 => Some(PerfEventKind::GpuSharedAccess),
            9 => Some(PerfEventKind::Tracepoint),
            _ => None,
        }
    }

    /// The kind as `bpftime list` shows it.
    pub fn label(self) -> &'static str {
        match self {
            PerfEventKind::Uprobe => "uprobe",
            PerfEventKind::Uretprobe => "uretprobe",
            PerfEventKind::BpfOutput => "bpf-output",
            PerfEventKind::Kprobe => "kprobe",
            PerfEventKind::Kretprobe => "kretprobe",
            PerfEventKind::GpuLaunch => "gpu-launch",
            PerfEventKind::GpuAccess => "gpu-ldst",
            PerfEventKind::GpuSharedAccess => "gpu-ldst.shared",
            PerfEventKind::Tracepoint => "tracepoint",
        }
    }

    /// The link a program attached to such an event makes; `None` for a
    /// BPF output ring, which takes no program.
    pub fn link_kind(self) -> Option<LinkKind> {
        Some(match self {
            PerfEventKind::Uprobe => LinkKind::Uprobe,
            PerfEventKind::Uretprobe => LinkKind::Uretprobe,
            PerfEventKind::Kprobe => LinkKind::Gpu(GpuProbeKind::Entry),
            PerfEventKind::Kretprobe => LinkKind::Gpu(GpuProbeKind::Exit),
            PerfEventKind::GpuLaunch => LinkKind::Gpu(GpuProbeKind::Launch),
            PerfEventKind::GpuAccess => LinkKind::Gpu(GpuProbeKind::Access),
            PerfEventKind::GpuSharedAccess => LinkKind::Gpu(GpuProbeKind::SharedAccess),
            PerfEventKind::Tracepoint => LinkKind::Tracepoint,
            PerfEventKind::BpfOutput => return None,
        })
    }
}

/// What `perf_event_open` created: a uprobe point, a kprobe (a CUDA kernel),
/// or a BPF output ring.
#[derive(Debug, Clone, PartialEq)]
pub struct PerfEventRecord {
    pub id: u32,
    pub kind: PerfEventKind,
    /// Binary of a uprobe; for a kprobe or a launch event, the function name
    /// exactly as the loader gave it (a CUDA kernel's name or pattern).
    pub path: String,
    /// File offset of a uprobe in `path`; a kprobe's offset into the function.
    pub offset: u64,
    /// Process filter, -1 for every process.
    pub pid: i32,
    /// CPU of a BPF output ring.
    pub cpu: i32,
    /// File offset in `path` of a uprobe's USDT semaphore (a `u16` counting the tools
    /// attached, which the traced code checks before preparing the probe's arguments);
    /// 0 for none.
    pub ref_ctr_offset: u64,
    pub owner_pid: u32,
}

impl PerfEventRecord {
    pub fn publish(&self, store: &Store) -> Result<PathBuf> {
        let mut w = Writer::new(ObjectKind::PerfEvent, self.id);
        w.u32(self.kind.to_u32())
            .u64(self.offset)
            .u32(self.pid as u32)
            .u32(self.cpu as u32)
            .bytes(self.path.as_bytes())
            .u64(self.ref_ctr_offset);
        let p = store.publish_bytes(ObjectKind::PerfEvent, self.id, &w.0)?;
        store.bump_generation();
        Ok(p)
    }

    pub fn read(store: &Store, id: u32) -> Result<Self> {
        let bytes = store.read_object(ObjectKind::PerfEvent, id)?;
        let path = store.path(ObjectKind::PerfEvent, id);
        let mut r = Reader::new(&bytes, path.clone());
        let kind = PerfEventKind::from_u32(r.u32()?).ok_or_else(|| {
            Error::invalid(
                libc::EINVAL,
                format!("{}: unknown event kind", path.display()),
            )
        })?;
        let offset = r.u64()?;
        let pid = r.u32()? as i32;
        let cpu = r.u32()? as i32;
        let p = String::from_utf8_lossy(r.bytes()?).into_owned();
        let ref_ctr_offset = r.u64()?;
        Ok(PerfEventRecord {
            id,
            kind,
            path: p,
            offset,
            pid,
            cpu,
            ref_ctr_offset,
            owner_pid: r.owner(),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkKind {
    Uprobe,
    Uretprobe,
    /// In a CUDA kernel's life, where the kind says (the type a section name is read
    /// into, so that a program's place travels unchanged from its section to the agent);
    /// `path` is the kernel name pattern (mangled, demangled, or a glob such as
    /// `*gemm*`), `offset` 0.
    Gpu(GpuProbeKind),
    /// A tracepoint program at a tracepoint; `path` is its `GROUP/NAME`
    /// (`syscalls/sys_enter_openat`), `offset` its id.
    Tracepoint,
    /// A raw tracepoint program (`BPF_RAW_TRACEPOINT_OPEN`); `path` is the tracepoint's
    /// name (`sys_enter`, `sys_exit`).
    RawTracepoint,
}

impl LinkKind {
    fn to_u32(self) -> u32 {
        match self {
            LinkKind::Uprobe => 1,
            LinkKind::Uretprobe => 2,
            LinkKind::Gpu(GpuProbeKind::Entry) => 3,
            LinkKind::Gpu(GpuProbeKind::Exit) => 4,
            LinkKind::Gpu(GpuProbeKind::Launch) => 5,
            LinkKind::Gpu(GpuProbeKind::Access) => 6,
            LinkKind::Gpu(GpuProbeKind::SharedAccess) => 7,
            LinkKind::Tracepoint => 8,
            LinkKind::RawTracepoint => 9,
        }
    }

    fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            1 => LinkKind::Uprobe,
            2 => LinkKind::Uretprobe,
            3 => LinkKind::Gpu(GpuProbeKind::Entry),
            4 => LinkKind::Gpu(GpuProbeKind::Exit),
            5 => LinkKind::Gpu(GpuProbeKind::Launch),
            6 => LinkKind::Gpu(GpuProbeKind::Access),
            7 => LinkKind::Gpu(GpuProbeKind::SharedAccess),
            8 => LinkKind::Tracepoint,
            9 => LinkKind::RawTracepoint,
            _ => return None,
        })
    }

    /// The kind as `bpftime list` shows it.
    pub fn label(self) -> &'static str {
        match self {
            LinkKind::Uprobe => "uprobe",
            LinkKind::Uretprobe => "uretprobe",
            LinkKind::Gpu(kind) => kind.label(),
            LinkKind::Tracepoint => "tracepoint",
            LinkKind::RawTracepoint => "raw-tracepoint",
        }
    }

    /// Whether the link names a CUDA kernel rather than a place in a binary.
    pub fn is_gpu(self) -> bool {
        matches!(self, LinkKind::Gpu(_))
    }
}

/// A program attached to a point. Agents run the program at the point while the
/// link exists.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkRecord {
    pub id: u32,
    pub prog_id: u32,
    /// The perf event the link was made through (0 for none).
    pub perf_event_id: u32,
    pub kind: LinkKind,
    /// Binary of a uprobe; the CUDA kernel name pattern of a GPU link.
    pub path: String,
    /// File offset of a uprobe in `path`; 0 for a GPU link.
    pub offset: u64,
    pub pid: i32,
    pub cookie: u64,
    /// The USDT semaphore of a uprobe, as in [`PerfEventRecord::ref_ctr_offset`]: raised
    /// in each traced process while the link exists.
    pub ref_ctr_offset: u64,
    /// Made by `PERF_EVENT_IOC_SET_BPF`: the perf event holds the link, which has no
    /// descriptor of its own and dies with the event (see `lifetime.rs`).
    pub owned_by_event: bool,
    pub owner_pid: u32,
}

impl LinkRecord {
    pub fn publish(&self, store: &Store) -> Result<PathBuf> {
        let mut w = Writer::new(ObjectKind::Link, self.id);
        w.u32(self.prog_id)
            .u32(self.perf_event_id)
            .u32(self.kind.to_u32())
            .u64(self.offset)
            .u32(self.pid as u32)
            .u64(self.cookie)
            .bytes(self.path.as_bytes())
            .u64(self.ref_ctr_offset)
            .u32(self.owned_by_event as u32);
        let p = store.publish_bytes(ObjectKind::Link, self.id, &w.0)?;
        store.bump_generation();
        Ok(p)
    }

    pub fn read(store: &Store, id: u32) -> Result<Self> {
        let bytes = store.read_object(ObjectKind::Link, id)?;
        let path = store.path(ObjectKind::Link, id);
        let mut r = Reader::new(&bytes, path.clone());
        let prog_id = r.u32()?;
        let perf_event_id = r.u32()?;
        let k = r.u32()?;
        let kind = LinkKind::from_u32(k).ok_or_else(|| {
            Error::invalid(
                libc::EINVAL,
                format!("{}: unknown link kind {k}", path.display()),
            )
        })?;
        let offset = r.u64()?;
        let pid = r.u32()? as i32;
        let cookie = r.u64()?;
        let p = String::from_utf8_lossy(r.bytes()?).into_owned();
        let ref_ctr_offset = r.u64()?;
        let owned_by_event = r.u32()? != 0;
        Ok(LinkRecord {
            id,
            prog_id,
            perf_event_id,
            kind,
            path: p,
            offset,
            pid,
            cookie,
            ref_ctr_offset,
            owned_by_event,
            owner_pid: r.owner(),
        })
    }
}

/// Stores a BTF blob loaded with `BPF_BTF_LOAD`.
pub fn publish_btf(store: &Store, id: u32, blob: &[u8]) -> Result<PathBuf> {
    let mut w = Writer::new(ObjectKind::Btf, id);
    w.bytes(blob);
    store.publish_bytes(ObjectKind::Btf, id, &w.0)
}

/// Reads a BTF blob back.
pub fn read_btf(store: &Store, id: u32) -> Result<Vec<u8>> {
    let bytes = store.read_object(ObjectKind::Btf, id)?;
    let mut r = Reader::new(&bytes, store.path(ObjectKind::Btf, id));
    Ok(r.bytes()?.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct TempStore(Option<Store>, String);

    impl TempStore {
        fn new(tag: &str) -> Self {
            let name = format!("unit-objects-{tag}-{}", std::process::id());
            let _ = std::fs::remove_dir_all(Store::dir_for(&name));
            TempStore(Some(Store::create_or_open(&name).unwrap()), name)
        }
    }

    impl Drop for TempStore {
        fn drop(&mut self) {
            drop(self.0.take());
            let _ = std::fs::remove_dir_all(Store::dir_for(&self.1));
        }
    }

    /// The numbers on disk are the format agents read: existing ones must not move.
    #[test]
    fn kind_codes_are_stable() {
        let links = [
            (LinkKind::Uprobe, 1),
            (LinkKind::Uretprobe, 2),
            (LinkKind::Gpu(GpuProbeKind::Entry), 3),
            (LinkKind::Gpu(GpuProbeKind::Exit), 4),
            (LinkKind::Gpu(GpuProbeKind::Launch), 5),
            (LinkKind::Gpu(GpuProbeKind::Access), 6),
            (LinkKind::Gpu(GpuProbeKind::SharedAccess), 7),
            (LinkKind::Tracepoint, 8),
            (LinkKind::RawTracepoint, 9),
        ];
        for (k, code) in links {
            assert_eq!(k.to_u32(), code);
            assert_eq!(LinkKind::from_u32(code), Some(k));
        }
        let events = [
            (PerfEventKind::Uprobe, 1),
            (PerfEventKind::Uretprobe, 2),
            (PerfEventKind::BpfOutput, 3),
            (PerfEventKind::Kprobe, 4),
            (PerfEventKind::Kretprobe, 5),
            (PerfEventKind::GpuLaunch, 6),
            (PerfEventKind::GpuAccess, 7),
            (PerfEventKind::GpuSharedAccess, 8),
            (PerfEventKind::Tracepoint, 9),
        ];
        for (k, code) in events {
            assert_eq!(k.to_u32(), code);
            assert_eq!(PerfEventKind::from_u32(code), Some(k));
        }
        assert_eq!(LinkKind::from_u32(10), None);
        assert_eq!(PerfEventKind::from_u32(10), None);
    }

    #[test]
    fn gpu_links_and_kprobe_events_round_trip() {
        let t = TempStore::new("gpu");
        let store = t.0.as_ref().unwrap();
        for (i, kind) in [
            LinkKind::Gpu(GpuProbeKind::Entry),
            LinkKind::Gpu(GpuProbeKind::Exit),
            LinkKind::Gpu(GpuProbeKind::Launch),
            LinkKind::Gpu(GpuProbeKind::Access),
            LinkKind::Gpu(GpuProbeKind::SharedAccess),
        ]
        .into_iter()
        .enumerate()
        {
            let rec = LinkRecord {
                id: store.alloc_id(),
                prog_id: 7,
                perf_event_id: 9,
                kind,
                path: ["ns::kern", "*gemm*", "_Z9vectorAddPKfS0_Pfi", "*", "matmul"][i].into(),
                offset: 0,
                pid: -1,
                cookie: 42,
                ref_ctr_offset: 0x3a2,
                owned_by_event: i == 1,
                owner_pid: std::process::id(),
            };
            rec.publish(store).unwrap();
            assert_eq!(LinkRecord::read(store, rec.id).unwrap(), rec);
        }
        for kind in [
            PerfEventKind::Kprobe,
            PerfEventKind::Kretprobe,
            PerfEventKind::GpuLaunch,
            PerfEventKind::GpuAccess,
            PerfEventKind::GpuSharedAccess,
        ] {
            let rec = PerfEventRecord {
                id: store.alloc_id(),
                kind,
                path: "vectorAdd".into(),
                offset: 16,
                pid: -1,
                cpu: 0,
                ref_ctr_offset: 0x3a2,
                owner_pid: std::process::id(),
            };
            rec.publish(store).unwrap();
            assert_eq!(PerfEventRecord::read(store, rec.id).unwrap(), rec);
        }
    }
}
