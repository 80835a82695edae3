//! The syscall shim's command surface: a sequence of `bpf()` calls (every command
//! number 0..40, arbitrary attributes), `perf_event_open`, `ioctl`, `mmap`, `dup`
//! and `close`, served by `Shim` in a private store, fresh for each input.
//!
//! The harness is a well-behaved caller in one respect only: every pointer it
//! puts in an attribute points to a buffer of its own at least as large as the
//! kernel's ABI says (the sizes come from the attribute's own size fields, which
//! are bounded first, or from the map the call names). A real caller's bad
//! pointer faults in the caller's own process, as it would in the kernel's
//! `copy_from_user`'s absence: that is the caller's bug, not the shim's. Each
//! buffer ends at a guard page, so the shim reading or writing past what the
//! ABI grants it crashes here. Everything else (commands, sizes, flags, ids,
//! descriptors, contents) is the fuzzer's.

#![no_main]

use bpftime_fuzz::{private_store_root, Bytes, Guarded};
use bpftime_isa::uapi::cmd;
use bpftime_runtime::Store;
use bpftime_shim::{KprobePmu, Object, Shim, UprobePmu};
use libfuzzer_sys::fuzz_target;
use std::os::fd::RawFd;

const PERF_EVENT_IOC_ENABLE: u64 = 0x2400;
const PERF_EVENT_IOC_DISABLE: u64 = 0x2401;
const PERF_EVENT_IOC_RESET: u64 = 0x2403;
const PERF_EVENT_IOC_SET_BPF: u64 = 0x4004_2408;

/// Calls per input: enough for create, load, attach and their uses.
const MAX_CALLS: usize = 48;
/// The largest map the harness asks for (see MAP_CREATE below).
const MAX_ENTRIES: u32 = 1 << 16;
const MAX_ELEM_SIZE: u32 = 1 << 20;
const MAX_MAP_BYTES: u64 = 1 << 24;

struct Harness {
    shim: Shim,
    /// Descriptors the shim handed out (and their dups), closed at the end.
    fds: Vec<RawFd>,
    /// Buffers of the call in progress.
    bufs: Vec<Guarded>,
    /// Offsets of the pointer fields the call in progress holds.
    ptrs: Vec<usize>,
}

fn put32(a: &mut [u8], off: usize, v: u32) {
    a[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put64(a: &mut [u8], off: usize, v: u64) {
    a[off..off + 8].copy_from_slice(&v.to_ne_bytes());
}

fn get32(a: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes(a[off..off + 4].try_into().unwrap())
}

impl Harness {
    /// One of the descriptors we hold, or the attribute's own value.
    fn fd_field(&self, b: &mut Bytes, a: &mut [u8], off: usize) {
        let sel = b.u8();
        if sel < 0xc0 && !self.fds.is_empty() {
            put32(a, off, self.fds[sel as usize % self.fds.len()] as u32);
        } else if sel < 0xe0 {
            put32(a, off, u32::MAX);
        }
    }

    /// A pointer field: null, or a buffer of `len` bytes filled from the input.
    fn ptr_field(&mut self, b: &mut Bytes, a: &mut [u8], off: usize, len: usize) {
        self.ptrs.push(off);
        if b.u8() < 0x10 {
            put64(a, off, 0);
            return;
        }
        let fill = b.u16() as usize;
        let g = Guarded::new(len, b.take(fill.min(len)));
        put64(a, off, g.addr());
        self.bufs.push(g);
    }

    /// A pointer field holding a NUL-terminated string.
    fn str_field(&mut self, b: &mut Bytes, a: &mut [u8], off: usize, prefixes: &[&[u8]]) {
        self.ptrs.push(off);
        let sel = b.u8();
        if sel < 0x10 {
            put64(a, off, 0);
            return;
        }
        let mut s = prefixes[sel as usize % prefixes.len()].to_vec();
        let n = b.u8() as usize % 48;
        s.extend_from_slice(b.take(n));
        let g = Guarded::c_string(&s);
        put64(a, off, g.addr());
        self.bufs.push(g);
    }

    /// Key and value sizes of the map behind `fd` as `bpf()` copies them.
    fn map_sizes(&mut self, fd: u32) -> (usize, usize) {
        match self.shim.object(fd as RawFd).map(|o| &o.object) {
            Some(Object::Map(m)) => (m.key_size() as usize, m.syscall_value_size()),
            _ => (8, 8),
        }
    }

    /// Bounds the size field at `off` to `max` and returns it.
    fn bound32(a: &mut [u8], off: usize, max: u32) -> usize {
        let v = get32(a, off) % (max + 1);
        put32(a, off, v);
        v as usize
    }

    fn bpf(&mut self, b: &mut Bytes) {
        let command = b.u8() as u32 % 40;
        let size = match b.u8() % 4 {
            0 | 1 => 128,
            2 => b.u8() as usize,
            _ => 128 + b.u8() as usize,
        };
        let mut a = b.fill(256);
        match command {
            cmd::MAP_CREATE => {
                // Creating a map takes time and memory in proportion to its size, with
                // no cap below the machine's (fuzz/README.md, findings): bounded here so
                // that the fuzzer keeps reaching the rest.
                let ks = Self::bound32(&mut a, 4, MAX_ELEM_SIZE) as u64;
                let vs = Self::bound32(&mut a, 8, MAX_ELEM_SIZE) as u64;
                let n = Self::bound32(&mut a, 12, MAX_ENTRIES) as u64;
                if (ks + vs) * n > MAX_MAP_BYTES {
                    put32(&mut a, 12, (MAX_MAP_BYTES / (ks + vs)).max(1) as u32);
                }
                self.fd_field(b, &mut a, 20);
                self.fd_field(b, &mut a, 48);
            }
            cmd::MAP_LOOKUP_ELEM
            | cmd::MAP_UPDATE_ELEM
            | cmd::MAP_DELETE_ELEM
            | cmd::MAP_GET_NEXT_KEY
            | cmd::MAP_LOOKUP_AND_DELETE_ELEM => {
                self.fd_field(b, &mut a, 0);
                let (ks, vs) = self.map_sizes(get32(&a, 0));
                self.ptr_field(b, &mut a, 8, ks);
                // GET_NEXT_KEY's second pointer is the next key.
                self.ptr_field(b, &mut a, 16, ks.max(vs));
            }
            cmd::MAP_FREEZE | cmd::LINK_DETACH | cmd::PROG_TEST_RUN | cmd::OBJ_GET_INFO_BY_FD => {
                self.fd_field(b, &mut a, 0);
                match command {
                    cmd::PROG_TEST_RUN => {
                        let n_in = Self::bound32(&mut a, 8, 4096);
                        let n_out = Self::bound32(&mut a, 12, 4096);
                        let c_in = Self::bound32(&mut a, 40, 4096);
                        let c_out = Self::bound32(&mut a, 44, 4096);
                        self.ptr_field(b, &mut a, 16, n_in);
                        self.ptr_field(b, &mut a, 24, n_out);
                        self.ptr_field(b, &mut a, 48, c_in);
                        self.ptr_field(b, &mut a, 56, c_out);
                    }
                    cmd::OBJ_GET_INFO_BY_FD => self.info(b, &mut a),
                    _ => {}
                }
            }
            cmd::MAP_LOOKUP_BATCH
            | cmd::MAP_LOOKUP_AND_DELETE_BATCH
            | cmd::MAP_UPDATE_BATCH
            | cmd::MAP_DELETE_BATCH => {
                self.fd_field(b, &mut a, 36);
                let (ks, vs) = self.map_sizes(get32(&a, 36));
                let count = Self::bound32(&mut a, 32, 64);
                self.ptr_field(b, &mut a, 0, ks.max(8));
                self.ptr_field(b, &mut a, 8, ks.max(8));
                self.ptr_field(b, &mut a, 16, count * ks);
                self.ptr_field(b, &mut a, 24, count * vs);
            }
            cmd::PROG_LOAD => self.prog_load(b, &mut a),
            cmd::OBJ_PIN | cmd::OBJ_GET => {
                self.str_field(
                    b,
                    &mut a,
                    0,
                    &[
                        b"/sys/fs/bpf/",
                        b"/sys/fs/bpf/a/",
                        b"",
                        b"/sys/fs/bpf/../",
                        b"/tmp/",
                    ],
                );
                self.fd_field(b, &mut a, 8);
                self.fd_field(b, &mut a, 16);
            }
            cmd::BTF_LOAD => {
                if b.u8() & 1 == 0 {
                    a[..2].copy_from_slice(&0xeb9fu16.to_ne_bytes());
                }
                let n = Self::bound32(&mut a, 16, 4096);
                let log = Self::bound32(&mut a, 20, 4096);
                self.ptr_field(b, &mut a, 0, n);
                self.ptr_field(b, &mut a, 8, log);
            }
            cmd::RAW_TRACEPOINT_OPEN => {
                self.str_field(
                    b,
                    &mut a,
                    0,
                    &[b"sys_enter", b"sys_exit", b"sched_switch", b""],
                );
                self.fd_field(b, &mut a, 8);
            }
            cmd::BTF_GET_FD_BY_ID => {
                // The kernel's BTF, which the shim serves from sysfs, or a store id.
                if b.u8() & 1 == 0 {
                    put32(&mut a, 0, bpftime_shim::KERNEL_BTF_ID);
                }
            }
            cmd::LINK_CREATE
            | cmd::LINK_UPDATE
            | cmd::PROG_BIND_MAP
            | cmd::PROG_ATTACH
            | cmd::PROG_DETACH => {
                self.fd_field(b, &mut a, 0);
                self.fd_field(b, &mut a, 4);
                // The old program of LINK_UPDATE; elsewhere this is the attach type.
                if command == cmd::LINK_UPDATE {
                    self.fd_field(b, &mut a, 8);
                }
            }
            _ => {
                // The rest take no pointer bpftime reads; a descriptor first is common.
                self.fd_field(b, &mut a, 0);
            }
        }
        // A size that ends inside a pointer field would hand over part of an address:
        // a caller's bug, so such a field is null here (the part inside reads as 0).
        for off in std::mem::take(&mut self.ptrs) {
            if off < size && size < off + 8 {
                put64(&mut a, off, 0);
            }
        }
        let attr = Guarded::new(size, &a);
        // SAFETY: attr holds `size` bytes, and every pointer in it points to a live
        // buffer of ours of the size the ABI gives it (see the top of this file).
        let r = unsafe { self.shim.bpf(command, attr.ptr(), size) };
        let makes_fd = matches!(
            command,
            cmd::MAP_CREATE
                | cmd::PROG_LOAD
                | cmd::OBJ_GET
                | cmd::BTF_LOAD
                | cmd::MAP_GET_FD_BY_ID
                | cmd::PROG_GET_FD_BY_ID
                | cmd::LINK_GET_FD_BY_ID
                | cmd::LINK_CREATE
                | cmd::RAW_TRACEPOINT_OPEN
                | cmd::BTF_GET_FD_BY_ID
        );
        if let (true, Ok(fd)) = (makes_fd, r) {
            self.fds.push(fd as RawFd);
        }
        self.bufs.clear();
    }

    fn prog_load(&mut self, b: &mut Bytes, a: &mut [u8]) {
        let cnt = Self::bound32(a, 4, 512);
        let code = b.fill(cnt * 8);
        // Map references by index (ld_imm64, src 5 or 6) decide fd_array's length.
        let max_index = code
            .chunks(8)
            .filter(|i| i[0] == 0x18 && matches!(i[1] >> 4, 5 | 6))
            .map(|i| u32::from_le_bytes([i[4], i[5], i[6], i[7]]) as usize)
            .max();
        let g = Guarded::new(code.len(), &code);
        put64(a, 8, g.addr());
        self.ptrs.push(8);
        self.bufs.push(g);
        self.str_field(b, a, 16, &[b"GPL", b"", b"Dual BSD/GPL"]);
        let log = Self::bound32(a, 28, 1 << 16);
        self.ptr_field(b, a, 32, log);
        self.fd_field(b, a, 72);
        let rec = Self::bound32(a, 92, 300);
        let lines = Self::bound32(a, 104, 64);
        self.ptr_field(b, a, 96, rec * lines);
        // func_info and CO-RE relocations: bpftime reads neither; null them so no
        // stray pointer is handed over.
        put64(a, 80, 0);
        put64(a, 128, 0);
        match max_index {
            Some(m) if m < 1024 && b.u8() >= 0x10 => {
                let mut fds = Vec::with_capacity((m + 1) * 4);
                for _ in 0..=m {
                    let sel = b.u8();
                    let fd = if self.fds.is_empty() {
                        sel as i32
                    } else {
                        self.fds[sel as usize % self.fds.len()]
                    };
                    fds.extend_from_slice(&fd.to_ne_bytes());
                }
                let g = Guarded::new(fds.len(), &fds);
                put64(a, 120, g.addr());
                self.ptrs.push(120);
                self.bufs.push(g);
            }
            _ => put64(a, 120, 0),
        }
    }

    /// `BPF_OBJ_GET_INFO_BY_FD`: the info struct, and the pointers inside it that
    /// the kernel fills for the object's kind.
    fn info(&mut self, b: &mut Bytes, a: &mut [u8]) {
        let len = Self::bound32(a, 4, 512);
        let mut info = b.fill(len);
        let kind = self
            .shim
            .object(get32(a, 0) as RawFd)
            .map(|o| o.object.clone());
        let mut inner = Vec::new();
        let mut set = |info: &mut Vec<u8>, b: &mut Bytes, ptr_off: usize, n: usize| {
            if info.len() >= ptr_off + 8 {
                let g = Guarded::new(n, b.take(n));
                let v = if b.u8() < 0x10 { 0 } else { g.addr() };
                put64(info, ptr_off, v);
                inner.push(g);
            }
        };
        match kind {
            Some(Object::Program(_)) => {
                let xlated = if info.len() >= 24 {
                    Self::bound32(&mut info, 20, 4096)
                } else {
                    0
                };
                set(&mut info, b, 32, xlated);
                let nr = if info.len() >= 56 {
                    Self::bound32(&mut info, 52, 64)
                } else {
                    0
                };
                set(&mut info, b, 56, nr * 4);
            }
            Some(Object::Btf { .. }) => {
                let cap = if info.len() >= 12 {
                    Self::bound32(&mut info, 8, 1 << 16)
                } else {
                    0
                };
                set(&mut info, b, 0, cap);
            }
            Some(Object::KernelBtf { .. }) => {
                let cap = if info.len() >= 12 {
                    Self::bound32(&mut info, 8, 1 << 16)
                } else {
                    0
                };
                set(&mut info, b, 0, cap);
                let name = if info.len() >= 28 {
                    Self::bound32(&mut info, 24, 64)
                } else {
                    0
                };
                set(&mut info, b, 16, name);
            }
            _ => {}
        }
        let g = Guarded::new(len, &info);
        put64(a, 8, g.addr());
        self.ptrs.push(8);
        self.bufs.push(g);
        self.bufs.extend(inner);
    }

    fn perf_event_open(&mut self, b: &mut Bytes, uprobe: u32, kprobe: u32) {
        let mut a = b.fill(256);
        let ty = match b.u8() % 5 {
            0 => 1, // PERF_TYPE_SOFTWARE (BPF output with config 10)
            1 => uprobe,
            2 => kprobe,
            _ => get32(&a, 0),
        };
        put32(&mut a, 0, ty);
        let declared = match b.u8() % 6 {
            0 => 0,
            1 => 64,
            2 => 72,
            3 => 128,
            4 => 136,
            _ => b.u8() as u32,
        };
        put32(&mut a, 4, declared);
        // A size of 0 means the first version's 64 bytes; the kernel refuses other
        // sizes below that after reading the size itself.
        let len = match declared {
            0 => 64,
            n => (n as usize).max(8),
        };
        self.str_field(
            b,
            &mut a,
            56,
            &[
                b"/proc/self/exe",
                b"/bin/true",
                b"vectorAdd",
                b"",
                b"/nonexistent/",
            ],
        );
        let pid = match b.u8() % 3 {
            0 => -1,
            1 => 0,
            _ => b.u32() as i32,
        };
        let cpu = match b.u8() % 3 {
            0 => -1,
            1 => 0,
            _ => b.u32() as i32,
        };
        let attr = Guarded::new(len, &a);
        // SAFETY: attr holds the declared size (64 for 0), config1 a string of ours.
        let r = unsafe { self.shim.perf_event_open(attr.ptr(), pid, cpu) };
        if let Some(Ok(fd)) = r {
            self.fds.push(fd);
        }
        self.bufs.clear();
        self.ptrs.clear();
    }

    fn ioctl(&mut self, b: &mut Bytes) {
        let fd = self.pick_fd(b);
        let request = match b.u8() % 5 {
            0 => PERF_EVENT_IOC_ENABLE,
            1 => PERF_EVENT_IOC_DISABLE,
            2 => PERF_EVENT_IOC_RESET,
            3 => PERF_EVENT_IOC_SET_BPF,
            _ => b.u32() as u64,
        };
        let arg = self.pick_fd(b) as u64;
        let _ = self.shim.ioctl(fd, request, arg);
    }

    fn pick_fd(&self, b: &mut Bytes) -> RawFd {
        let sel = b.u8();
        if sel < 0xf0 && !self.fds.is_empty() {
            self.fds[sel as usize % self.fds.len()]
        } else {
            sel as RawFd
        }
    }

    fn close(&mut self, b: &mut Bytes) {
        if self.fds.is_empty() {
            return;
        }
        let i = b.u8() as usize % self.fds.len();
        let fd = self.fds.swap_remove(i);
        // As the preloaded close(): forget, close, then free what lost its last reference.
        let ours = self.shim.close(fd);
        // SAFETY: fd is a descriptor the shim handed us (or our dup of one).
        unsafe { libc::close(fd) };
        if ours {
            self.shim.collect();
        }
    }

    fn dup(&mut self, b: &mut Bytes) {
        if self.fds.is_empty() {
            return;
        }
        let old = self.fds[b.u8() as usize % self.fds.len()];
        // SAFETY: dup of a descriptor we hold.
        let new = unsafe { libc::dup(old) };
        if new >= 0 {
            self.shim.dup(old, new);
            self.fds.push(new);
        }
    }

    fn mmap(&mut self, b: &mut Bytes) {
        let fd = self.pick_fd(b);
        let len = match b.u8() % 4 {
            0 => 4096,
            1 => 4096 + 2 * (4096 << (b.u8() % 6)),
            2 => 4096 << (b.u8() % 8),
            _ => b.u32() as usize % (1 << 22),
        };
        let off = match b.u8() % 3 {
            0 => 0,
            1 => 4096,
            _ => (b.u32() as i64) << 12,
        };
        let prot = match b.u8() % 3 {
            0 => libc::PROT_READ,
            1 => libc::PROT_READ | libc::PROT_WRITE,
            _ => libc::PROT_NONE,
        };
        let flags = if b.u8() & 1 == 0 {
            libc::MAP_SHARED
        } else {
            libc::MAP_PRIVATE
        };
        // SAFETY: no MAP_FIXED: the kernel picks a free range.
        let r = unsafe {
            self.shim
                .mmap(std::ptr::null_mut(), len, prot, flags, fd, off)
        };
        if let Some(Ok(p)) = r {
            // SAFETY: unmaps what the call above mapped, at the length it was asked for.
            unsafe { libc::munmap(p, len) };
        }
    }
}

fuzz_target!(|data: &[u8]| {
    private_store_root();
    let name = "shim";
    let dir = Store::dir_for(name);
    let _ = std::fs::remove_dir_all(&dir);
    let store = Store::create_or_open(name).expect("create the fuzzer's store");
    let uprobe = UprobePmu::detect().type_;
    let kprobe = KprobePmu::get().type_;
    let mut h = Harness {
        shim: Shim::new(store),
        fds: Vec::new(),
        bufs: Vec::new(),
        ptrs: Vec::new(),
    };
    let mut b = Bytes::new(data);
    for _ in 0..MAX_CALLS {
        if b.is_empty() {
            break;
        }
        match b.u8() % 10 {
            0..=4 => h.bpf(&mut b),
            5 => h.perf_event_open(&mut b, uprobe, kprobe),
            6 => h.ioctl(&mut b),
            7 => h.close(&mut b),
            8 => h.dup(&mut b),
            _ => h.mmap(&mut b),
        }
    }
    for fd in std::mem::take(&mut h.fds) {
        h.shim.close(fd);
        // SAFETY: a descriptor the shim handed us, closed once.
        unsafe { libc::close(fd) };
    }
    drop(h);
    let _ = std::fs::remove_dir_all(&dir);
});
