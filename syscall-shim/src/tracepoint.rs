//! System call tracepoints: `perf_event_open` of `PERF_TYPE_TRACEPOINT` for a
//! `syscalls` or `raw_syscalls` event, `BPF_RAW_TRACEPOINT_OPEN` for `sys_enter` and
//! `sys_exit`, and the tracefs files that give loaders their ids and formats.
//!
//! Agents run the programs at every system call of their targets; nothing reaches
//! the kernel's tracepoints. Ids are the kernel's where its tracefs can be read
//! (loaders read them there), else bpftime's own, which the shim then answers for.

use crate::attr::Attr;
use crate::core::{refuse, Shim, SysResult};
use bpftime_runtime::{LinkKind, LinkRecord, PerfEventKind, PerfEventRecord};
use bpftime_syscalls::{Event, Ids};
use std::cell::Cell;
use std::os::fd::RawFd;
use std::sync::OnceLock;

thread_local! {
    /// Set while this thread reads the kernel's ids: its reads come back through the
    /// preloaded `open`, which must leave them to the kernel.
    static DETECTING: Cell<bool> = const { Cell::new(false) };
}

/// The tracepoint ids of this process, found once.
pub fn tracepoint_ids() -> &'static Ids {
    static IDS: OnceLock<Ids> = OnceLock::new();
    IDS.get_or_init(|| {
        DETECTING.with(|d| d.set(true));
        let ids = Ids::detect();
        DETECTING.with(|d| d.set(false));
        tracing::debug!(
            kernel = ids.kernel,
            "syscall tracepoint ids ({})",
            if ids.kernel {
                "the kernel's, from its tracefs"
            } else {
                "bpftime's own: the kernel's tracefs cannot be read"
            }
        );
        ids
    })
}

/// What a tracefs file the kernel cannot give (tracefs not mounted, or not readable by
/// this user) reads when the shim serves it: the `id` and `format` of a system call
/// tracepoint, and `available_events`. None for every other path.
pub fn served_tracefs_file(path: &[u8]) -> Option<String> {
    if DETECTING.with(|d| d.get()) {
        return None;
    }
    bpftime_syscalls::served_file(path, tracepoint_ids())
}

/// Whether a tracefs path the kernel gives none of is one of the served events' (their
/// directories, `id` and `format` files) or `available_events`.
pub fn served_tracefs_path_exists(path: &[u8]) -> bool {
    !DETECTING.with(|d| d.get()) && bpftime_syscalls::served_path_exists(path, tracepoint_ids())
}

/// `BPF_RAW_TRACEPOINT_OPEN`'s attribute: the tracepoint's name, the program.
mod raw_open {
    pub const NAME: usize = 0;
    pub const PROG_FD: usize = 8;
    pub const COOKIE: usize = 16;
}

impl Shim {
    /// A tracepoint perf event on tracepoint `id`: the kernel's EINVAL for an id that
    /// is no system call tracepoint.
    pub(crate) fn tracepoint_event(&mut self, id: u64, pid: i32, cpu: i32) -> SysResult<RawFd> {
        let Some(event) = tracepoint_ids().event(id) else {
            return Err(refuse(
                libc::EINVAL,
                format_args!("tracepoint id {id}: bpftime serves the syscalls and raw_syscalls tracepoints only"),
            ));
        };
        tracing::info!(tracepoint = %event.path(), id, "perf event on a system call tracepoint");
        let record = PerfEventRecord {
            id: self.store().alloc_id(),
            kind: PerfEventKind::Tracepoint,
            path: event.path(),
            offset: id,
            pid,
            cpu,
            ref_ctr_offset: 0,
            owner_pid: std::process::id(),
        };
        self.register_perf_event(record)
    }

    /// Checks that `prog` may run at tracepoint `path` (`GROUP/NAME`): a tracepoint
    /// program that reads no further than the record goes (the kernel's EINVAL and
    /// EACCES otherwise).
    pub(crate) fn check_tracepoint_program(
        &mut self,
        prog: &bpftime_runtime::ProgramRecord,
        path: &str,
    ) -> SysResult<()> {
        if prog.prog_type != bpftime_isa::uapi::prog_type::TRACEPOINT {
            return Err(refuse(
                libc::EINVAL,
                format_args!(
                    "program `{}` has type {}; a tracepoint takes tracepoint programs",
                    prog.name, prog.prog_type
                ),
            ));
        }
        let event = path
            .split_once('/')
            .and_then(|(g, n)| Event::parse(g, n))
            .ok_or(libc::EINVAL)?;
        let end = self.ctx_read_end(prog)?;
        if end > event.record_size() {
            return Err(refuse(
                libc::EACCES,
                format_args!(
                    "program `{}` reads its context up to byte {end}; a {} record has {}",
                    prog.name,
                    event.path(),
                    event.record_size()
                ),
            ));
        }
        Ok(())
    }

    /// `BPF_RAW_TRACEPOINT_OPEN`: a raw tracepoint program at `sys_enter` or `sys_exit`,
    /// which take two arguments (the registers and the number, or the return value).
    ///
    /// # Safety
    /// The attribute's name is null or points to a NUL-terminated string.
    pub(crate) unsafe fn raw_tracepoint_open(&mut self, a: &Attr) -> SysResult {
        let name_ptr = a.u64(raw_open::NAME) as *const libc::c_char;
        if name_ptr.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: caller obligation.
        let name = unsafe { std::ffi::CStr::from_ptr(name_ptr) }
            .to_string_lossy()
            .into_owned();
        let prog = self.program(a.u32(raw_open::PROG_FD))?;
        if !matches!(name.as_str(), "sys_enter" | "sys_exit") {
            return Err(refuse(
                libc::ENOENT,
                format_args!("raw tracepoint `{name}`: bpftime serves sys_enter and sys_exit only"),
            ));
        }
        if prog.prog_type != bpftime_isa::uapi::prog_type::RAW_TRACEPOINT {
            return Err(refuse(
                libc::EINVAL,
                format_args!(
                    "program `{}` has type {}; BPF_RAW_TRACEPOINT_OPEN takes raw tracepoint programs",
                    prog.name, prog.prog_type
                ),
            ));
        }
        let end = self.ctx_read_end(&prog)?;
        if end > 16 {
            return Err(refuse(
                libc::EINVAL,
                format_args!(
                    "program `{}` reads argument {} of raw tracepoint {name}, which has 2",
                    prog.name,
                    end.div_ceil(8)
                ),
            ));
        }
        let id = self.store().alloc_id();
        let rec = LinkRecord {
            id,
            prog_id: prog.id,
            perf_event_id: 0,
            kind: LinkKind::RawTracepoint,
            path: name.clone(),
            offset: 0,
            pid: -1,
            cookie: a.u64(raw_open::COOKIE),
            ref_ctr_offset: 0,
            owned_by_event: false,
            owner_pid: std::process::id(),
        };
        rec.publish(self.store()).map_err(|e| e.errno())?;
        tracing::info!(link = id, prog = %prog.name, raw_tracepoint = %name, "attached");
        self.open_link_fd(id)
    }

    /// How far into its context `prog` loads: known from its load here, or found by
    /// verifying it again (a program another process loaded).
    fn ctx_read_end(&mut self, prog: &bpftime_runtime::ProgramRecord) -> SysResult<u32> {
        if let Some(&end) = self.ctx_read_ends.get(&prog.id) {
            return Ok(end);
        }
        let mut maps = std::collections::HashMap::new();
        for &id in &prog.map_ids {
            let m = bpftime_runtime::Map::open(self.store(), id).map_err(|e| e.errno())?;
            maps.insert(id, std::sync::Arc::new(m));
        }
        let lookup = |id: u32| bpftime_prepare::desc_of(&maps, id);
        let (_, end) = bpftime_prepare::check_program_full(
            &prog.insns,
            prog.prog_type,
            &lookup,
            0,
            Vec::new(),
            false,
        )
        .map_err(|(errno, _)| errno)?;
        self.ctx_read_ends.insert(prog.id, end);
        Ok(end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::TempShim;
    use crate::PERF_EVENT_IOC_SET_BPF;
    use bpftime_isa::uapi::{attach_type, cmd, prog_type};
    use bpftime_runtime::ObjectKind;

    fn links(shim: &mut Shim) -> Vec<(LinkKind, String)> {
        let store = shim.store();
        store
            .ids(ObjectKind::Link)
            .into_iter()
            .filter_map(|id| LinkRecord::read(store, id).ok())
            .map(|l| (l.kind, l.path))
            .collect()
    }

    fn load(t: &mut TempShim, prog_type: u32, src: &str) -> SysResult<RawFd> {
        let code = bpftime_isa::encode(&bpftime_isa::asm::assemble(src).unwrap());
        let mut a = [0u8; 128];
        a[0..4].copy_from_slice(&prog_type.to_ne_bytes());
        a[4..8].copy_from_slice(&((code.len() / 8) as u32).to_ne_bytes());
        a[8..16].copy_from_slice(&(code.as_ptr() as u64).to_ne_bytes());
        a[16..24].copy_from_slice(&(c"GPL".as_ptr() as u64).to_ne_bytes());
        t.bpf(cmd::PROG_LOAD, &mut a).map(|fd| fd as RawFd)
    }

    fn tracepoint(t: &mut TempShim, id: u64) -> SysResult<RawFd> {
        let mut a = [0u8; 128];
        a[0..4].copy_from_slice(&2u32.to_ne_bytes()); // PERF_TYPE_TRACEPOINT
        a[4..8].copy_from_slice(&128u32.to_ne_bytes());
        a[8..16].copy_from_slice(&id.to_ne_bytes());
        // SAFETY: a perf_event_attr of the size it declares.
        unsafe { t.shim().perf_event_open(a.as_ptr(), -1, 0) }.expect("served here")
    }

    fn raw_open(t: &mut TempShim, name: Option<&std::ffi::CStr>, prog: RawFd) -> SysResult {
        let mut a = [0u8; 128];
        let ptr = name.map_or(0, |n| n.as_ptr() as u64);
        a[0..8].copy_from_slice(&ptr.to_ne_bytes());
        a[8..12].copy_from_slice(&(prog as u32).to_ne_bytes());
        t.bpf(cmd::RAW_TRACEPOINT_OPEN, &mut a)
    }

    fn id_of(group: &str, name: &str) -> u64 {
        tracepoint_ids()
            .id(Event::parse(group, name).unwrap())
            .unwrap() as u64
    }

    #[test]
    fn syscall_tracepoints_take_tracepoint_programs_that_read_within_their_record() {
        let mut t = TempShim::new("tp-attach");
        let openat = id_of("syscalls", "sys_enter_openat");
        // Arguments end at 48 for openat's four: the last one, read whole, fits.
        let fits = load(&mut t, prog_type::TRACEPOINT, "ldxdw %r0, [%r1+40]\nexit").unwrap();
        let past = load(&mut t, prog_type::TRACEPOINT, "ldxdw %r0, [%r1+48]\nexit").unwrap();
        let kprobe = load(&mut t, prog_type::KPROBE, "mov %r0, 0\nexit").unwrap();
        let ev = tracepoint(&mut t, openat).unwrap();
        assert_eq!(
            t.shim().ioctl(ev, PERF_EVENT_IOC_SET_BPF, past as u64),
            Some(Err(libc::EACCES))
        );
        assert_eq!(
            t.shim().ioctl(ev, PERF_EVENT_IOC_SET_BPF, kprobe as u64),
            Some(Err(libc::EINVAL))
        );
        assert_eq!(
            t.shim().ioctl(ev, PERF_EVENT_IOC_SET_BPF, fits as u64),
            Some(Ok(0))
        );
        // Through BPF_LINK_CREATE, on the exit of the same call (a record of 24 bytes).
        let exit = tracepoint(&mut t, id_of("syscalls", "sys_exit_openat")).unwrap();
        let mut a = [0u8; 128];
        a[0..4].copy_from_slice(&(fits as u32).to_ne_bytes());
        a[4..8].copy_from_slice(&(exit as u32).to_ne_bytes());
        a[8..12].copy_from_slice(&attach_type::PERF_EVENT.to_ne_bytes());
        assert_eq!(t.bpf(cmd::LINK_CREATE, &mut a), Err(libc::EACCES));
        let ret = load(&mut t, prog_type::TRACEPOINT, "ldxdw %r0, [%r1+16]\nexit").unwrap();
        a[0..4].copy_from_slice(&(ret as u32).to_ne_bytes());
        t.bpf(cmd::LINK_CREATE, &mut a).unwrap();
        let mut got = links(t.shim());
        got.sort_by(|a, b| a.1.cmp(&b.1));
        assert_eq!(
            got,
            vec![
                (LinkKind::Tracepoint, "syscalls/sys_enter_openat".into()),
                (LinkKind::Tracepoint, "syscalls/sys_exit_openat".into()),
            ]
        );
        // An id that is no system call tracepoint: the kernel's EINVAL.
        assert_eq!(tracepoint(&mut t, 999_999), Err(libc::EINVAL));
    }

    #[test]
    fn raw_tracepoints_open_at_sys_enter_and_sys_exit_only() {
        let mut t = TempShim::new("tp-raw");
        let regs = load(
            &mut t,
            prog_type::RAW_TRACEPOINT,
            "ldxdw %r0, [%r1+8]\nexit",
        )
        .unwrap();
        let third = load(
            &mut t,
            prog_type::RAW_TRACEPOINT,
            "ldxdw %r0, [%r1+16]\nexit",
        )
        .unwrap();
        let tp = load(&mut t, prog_type::TRACEPOINT, "mov %r0, 0\nexit").unwrap();
        assert_eq!(raw_open(&mut t, None, regs), Err(libc::EFAULT));
        assert_eq!(
            raw_open(&mut t, Some(c"sched_switch"), regs),
            Err(libc::ENOENT)
        );
        assert_eq!(
            raw_open(&mut t, Some(c"sys_enter"), third),
            Err(libc::EINVAL)
        );
        assert_eq!(raw_open(&mut t, Some(c"sys_enter"), tp), Err(libc::EINVAL));
        raw_open(&mut t, Some(c"sys_enter"), regs).unwrap();
        raw_open(&mut t, Some(c"sys_exit"), regs).unwrap();
        let mut got = links(t.shim());
        got.sort_by(|a, b| a.1.cmp(&b.1));
        assert_eq!(
            got,
            vec![
                (LinkKind::RawTracepoint, "sys_enter".into()),
                (LinkKind::RawTracepoint, "sys_exit".into()),
            ]
        );
    }

    #[test]
    fn tracefs_files_are_served_only_where_the_kernel_gives_none() {
        let ids = tracepoint_ids();
        let served =
            served_tracefs_file(b"/sys/kernel/tracing/events/syscalls/sys_enter_openat/id");
        let id = ids
            .id(Event::parse("syscalls", "sys_enter_openat").unwrap())
            .unwrap();
        assert_eq!(served, Some(format!("{id}\n")));
        // While the ids are read from the kernel, nothing is answered in its place.
        DETECTING.with(|d| d.set(true));
        assert_eq!(
            served_tracefs_file(b"/sys/kernel/tracing/events/syscalls/sys_enter_openat/id"),
            None
        );
        DETECTING.with(|d| d.set(false));
    }
}
