//! System call tracepoints in this process: `tracepoint/syscalls/sys_enter_NAME` and
//! `sys_exit_NAME`, `tracepoint/raw_syscalls/sys_enter` and `sys_exit`, and
//! `raw_tracepoint/sys_enter` and `sys_exit`, run by the attach crate's system call hooks
//! with the context the kernel gives them.
//!
//! A record is laid out as the event's tracefs format says: the 8 bytes of `common_*`
//! fields (`common_type` the event's id, `common_pid` the thread), then `__syscall_nr`
//! (an `int`; a `long id` for `raw_syscalls`), then at 16 each argument as 8 bytes, or
//! the return value. A raw tracepoint's context is its two arguments: a pointer to the
//! registers as `struct pt_regs` (read with `bpf_probe_read_kernel`, as on the kernel) and
//! the number, or the return value. Records sit in a zeroed buffer as large as a
//! `pt_regs`, so that a stack helper handed the record reads zeros past it.
//!
//! The programs attached are kept in an immutable snapshot, replaced whole on each attach
//! and detach; a thread may be running the old one, so replaced snapshots are never freed
//! (a few kilobytes per change).

use crate::program::{LoadedProgram, Runtime};
use bpftime_attach::PtRegs;
use bpftime_runtime::helpers::{self, ProbeContext};
use bpftime_runtime::{LinkKind, LinkRecord, Store};
use bpftime_syscalls::{Event, ARGS_OFFSET, NR_OFFSET};
use std::collections::HashMap;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex};

/// Numbers below this are watched one by one (the attach crate's table).
const NR_LIMIT: usize = 512;
/// The record buffer: a `pt_regs`' worth, which covers every record.
const RECORD: usize = bpftime_verifier::PT_REGS_SIZE as usize;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Point {
    /// A tracepoint program at a `syscalls` or `raw_syscalls` event, with its id.
    Tracepoint(Event, u32),
    /// A raw tracepoint program at `sys_enter` (true) or `sys_exit`.
    Raw { enter: bool },
}

struct Attached {
    point: Point,
    /// The arguments a `sys_enter_NAME` record holds.
    args: usize,
    cookie: u64,
    prog: Arc<LoadedProgram>,
    runtime: Arc<Runtime>,
    /// Whether the program reads its link's cookie (so it is set before each run).
    reads_context: bool,
}

impl Attached {
    fn run(&self, ctx: &[u64]) {
        if self.reads_context {
            helpers::set_probe_context(ProbeContext {
                func_ip: 0,
                cookie: self.cookie,
            });
        }
        self.runtime.run(&self.prog, ctx.as_ptr() as u64);
    }
}

/// What runs at each system call, as one immutable value.
#[derive(Default)]
struct Snapshot {
    /// By number below `NR_LIMIT`: 0 for none, else 1 + an index into `lists`.
    enter: Vec<u16>,
    exit: Vec<u16>,
    lists: Vec<Vec<Arc<Attached>>>,
    /// At every number: `raw_syscalls` tracepoints and raw tracepoints.
    raw_enter: Vec<Arc<Attached>>,
    raw_exit: Vec<Arc<Attached>>,
}

impl Snapshot {
    fn at(&self, index: &[u16], nr: u64) -> &[Arc<Attached>] {
        match index.get(nr as usize) {
            Some(&i) if i != 0 => &self.lists[i as usize - 1],
            _ => &[],
        }
    }
}

static CURRENT: AtomicPtr<Snapshot> = AtomicPtr::new(std::ptr::null_mut());

/// Every syscall link of this process, by link id; the snapshot is built from it.
static LINKS: Mutex<Option<HashMap<u32, Arc<Attached>>>> = Mutex::new(None);

fn snapshot() -> Option<&'static Snapshot> {
    let p = CURRENT.load(Ordering::Acquire);
    // SAFETY: snapshots are published once built and never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

fn header(words: &mut [u64; RECORD / 8], id: u32) {
    let pid = bpftime_runtime::thread::pid_tgid() as u32;
    words[0] = u64::from(id as u16) | u64::from(pid) << 32;
}

fn on_enter(regs: &PtRegs) {
    let Some(s) = snapshot() else {
        return;
    };
    let nr = regs.orig_ax;
    let args = [regs.di, regs.si, regs.dx, regs.r10, regs.r8, regs.r9];
    for a in s.at(&s.enter, nr) {
        let Point::Tracepoint(event, id) = a.point else {
            continue;
        };
        let mut rec = [0u64; RECORD / 8];
        header(&mut rec, id);
        rec[NR_OFFSET as usize / 8] = nr & 0xffff_ffff;
        let at = ARGS_OFFSET as usize / 8;
        rec[at..at + a.args].copy_from_slice(&args[..a.args]);
        debug_assert!(event.is_enter());
        a.run(&rec);
    }
    for a in &s.raw_enter {
        match a.point {
            Point::Tracepoint(_, id) => {
                let mut rec = [0u64; RECORD / 8];
                header(&mut rec, id);
                rec[1] = nr;
                rec[2..8].copy_from_slice(&args);
                a.run(&rec);
            }
            Point::Raw { .. } => {
                let mut ctx = [0u64; RECORD / 8];
                ctx[0] = regs as *const PtRegs as u64;
                ctx[1] = nr;
                a.run(&ctx);
            }
        }
    }
}

fn on_exit(regs: &PtRegs) {
    let Some(s) = snapshot() else {
        return;
    };
    let nr = regs.orig_ax;
    let ret = regs.ax;
    for a in s.at(&s.exit, nr) {
        let Point::Tracepoint(_, id) = a.point else {
            continue;
        };
        let mut rec = [0u64; RECORD / 8];
        header(&mut rec, id);
        rec[1] = nr & 0xffff_ffff;
        rec[2] = ret;
        a.run(&rec);
    }
    for a in &s.raw_exit {
        let mut rec = [0u64; RECORD / 8];
        match a.point {
            Point::Tracepoint(_, id) => {
                header(&mut rec, id);
                rec[1] = nr;
                rec[2] = ret;
            }
            Point::Raw { .. } => {
                rec[0] = regs as *const PtRegs as u64;
                rec[1] = ret;
            }
        }
        a.run(&rec);
    }
}

/// Where link `rec` runs, if it is a system call link bpftime serves.
fn point_of(rec: &LinkRecord) -> Option<Point> {
    match rec.kind {
        LinkKind::Tracepoint => {
            let (group, name) = rec.path.split_once('/')?;
            Some(Point::Tracepoint(
                Event::parse(group, name)?,
                rec.offset as u32,
            ))
        }
        LinkKind::RawTracepoint => match rec.path.as_str() {
            "sys_enter" => Some(Point::Raw { enter: true }),
            "sys_exit" => Some(Point::Raw { enter: false }),
            _ => None,
        },
        _ => None,
    }
}

/// Attaches a system call link: its program runs at every matching system call of every
/// thread of this process (a tracepoint's pid is not a filter for eBPF, on the kernel
/// either).
pub(crate) fn attach(store: &Store, runtime: &Arc<Runtime>, rec: &LinkRecord) {
    let Some(point) = point_of(rec) else {
        tracing::warn!(link = rec.id, path = %rec.path, "not a system call tracepoint bpftime serves");
        return;
    };
    let prog = match runtime.programs.load(store, rec.prog_id) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(link = rec.id, "cannot load the program: {e}");
            return;
        }
    };
    let args = match point {
        Point::Tracepoint(Event::Enter(nr), _) => bpftime_syscalls::by_nr(nr)
            .map_or(0, |s| s.args.len())
            .min(bpftime_syscalls::MAX_ARGS),
        _ => 0,
    };
    let attached = Arc::new(Attached {
        point,
        args,
        cookie: rec.cookie,
        reads_context: helpers::reads_probe_context(&prog.insns),
        prog,
        runtime: runtime.clone(),
    });
    let mut links = LINKS.lock().unwrap_or_else(|e| e.into_inner());
    let first = links.as_ref().is_none_or(|l| l.is_empty());
    links
        .get_or_insert_with(HashMap::new)
        .insert(rec.id, attached);
    publish(links.as_ref().into_iter().flat_map(|l| l.values()));
    tracing::info!(link = rec.id, point = ?point, "attached to system calls");
    if first {
        arm();
    }
}

pub(crate) fn detach(id: u32) {
    let mut links = LINKS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(map) = links.as_mut() else {
        return;
    };
    if map.remove(&id).is_none() {
        return;
    }
    publish(map.values());
    tracing::info!(link = id, "detached from system calls");
    if map.is_empty() {
        if let Err(e) = bpftime_syscall_hooks::disarm() {
            tracing::warn!("system call hooks stay armed: {e}");
        }
    }
}

/// Builds the snapshot of `links`, tells the hooks which numbers to stop at, and
/// publishes it.
fn publish<'a>(links: impl Iterator<Item = &'a Arc<Attached>>) {
    let mut by_nr: HashMap<(bool, u64), Vec<Arc<Attached>>> = HashMap::new();
    let mut s = Snapshot {
        enter: vec![0; NR_LIMIT],
        exit: vec![0; NR_LIMIT],
        ..Snapshot::default()
    };
    for a in links {
        match a.point {
            Point::Tracepoint(Event::Enter(nr), _) => {
                by_nr.entry((true, nr.into())).or_default().push(a.clone())
            }
            Point::Tracepoint(Event::Exit(nr), _) => {
                by_nr.entry((false, nr.into())).or_default().push(a.clone())
            }
            Point::Tracepoint(Event::RawEnter, _) | Point::Raw { enter: true } => {
                s.raw_enter.push(a.clone())
            }
            Point::Tracepoint(Event::RawExit, _) | Point::Raw { enter: false } => {
                s.raw_exit.push(a.clone())
            }
        }
    }
    for ((enter, nr), list) in by_nr {
        let Some(slot) = (if enter { &mut s.enter } else { &mut s.exit }).get_mut(nr as usize)
        else {
            continue;
        };
        s.lists.push(list);
        *slot = s.lists.len() as u16;
    }
    for nr in 0..NR_LIMIT {
        let enter = !s.raw_enter.is_empty() || s.enter[nr] != 0;
        let exit = !s.raw_exit.is_empty() || s.exit[nr] != 0;
        bpftime_syscall_hooks::watch_syscall(Some(nr as u32), enter, exit);
    }
    // The old snapshot may still be read by a thread inside a system call: never freed.
    CURRENT.store(Box::into_raw(Box::new(s)), Ordering::Release);
}

/// Arms the hooks once a first system call program is attached; says what cannot be done.
fn arm() {
    bpftime_syscall_hooks::set_syscall_handlers(on_enter, on_exit);
    bpftime_syscall_hooks::set_new_task_handler(bpftime_runtime::thread::forget_cached_ids);
    match bpftime_syscall_hooks::arm() {
        Ok(report) => {
            tracing::info!(
                armed = report.armed,
                unanswered = report.unanswered,
                "system calls hooked"
            );
            if let Some(why) = &report.slow_only {
                eprintln!("bpftime: system calls are traced through a signal each (microseconds per call): {why}");
            }
            if report.unanswered > 0 {
                eprintln!(
                    "bpftime: {} thread(s) did not answer and are not traced until they start others",
                    report.unanswered
                );
            }
        }
        Err(e) => eprintln!("bpftime: system call tracepoints do not run in this process: {e}"),
    }
}
