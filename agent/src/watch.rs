//! Following the store: attach what is linked to this process, detach what is
//! gone or whose owner exited.

use crate::program::LoadedProgram;
use crate::program::{self, Programs, Runtime};
use bpftime_attach::{
    attach_uprobe, attach_uprobe_code, attach_uretprobe, attach_uretprobe_code, detach, plan_site,
    runtime_address, runtime_data_address, AttachError, CodeHandler, Handler, HookId, PtRegs,
    SitePlan,
};
use bpftime_runtime::helpers::{self, ProbeContext};
use bpftime_runtime::{cpu_slots, LinkKind, LinkRecord, ObjectKind, ProgramRecord, Store};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};

struct Agent {
    runtime: Arc<Runtime>,
    /// Links handled so far: what each holds in this process (nothing when the link
    /// points elsewhere).
    links: Mutex<HashMap<u32, Attachment>>,
    /// Damaged store objects already warned about, each named once.
    warned: Mutex<HashSet<String>>,
}

/// What a link holds in this process while it exists.
#[derive(Default)]
struct Attachment {
    hook: Option<HookId>,
    /// Raised when the hook went in, lowered when it comes out.
    semaphore: Option<Semaphore>,
    /// While hooked: what was attached, to tell when its store files are damaged.
    source: Option<Source>,
}

/// The store objects an attached link stands on, as they were when it was attached.
struct Source {
    link: LinkRecord,
    link_stamp: Option<Stamp>,
    program: ProgramRecord,
    program_stamp: Option<Stamp>,
    loaded: Arc<LoadedProgram>,
}

/// What `stat` says of a record file: a record is read again only when this changes.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime: i64,
    mtime_ns: i64,
    ino: u64,
}

impl Stamp {
    fn of(path: &Path) -> Option<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(Stamp {
            len: m.len(),
            mtime: m.mtime(),
            mtime_ns: m.mtime_nsec(),
            ino: m.ino(),
        })
    }
}

/// A damaged store object, as a warning names it, and what was found.
struct Found {
    object: String,
    why: String,
}

/// A USDT semaphore (the `u16` that `<sys/sdt.h>` code tests before preparing a probe's
/// arguments), raised by one for as long as this value lives, as the kernel does for a
/// uprobe with a `ref_ctr_offset`.
struct Semaphore(&'static AtomicU16);

impl Semaphore {
    fn raise(binary: &Path, file_offset: u64) -> Result<Semaphore, AttachError> {
        let addr = runtime_data_address(binary, file_offset)?;
        if addr % std::mem::align_of::<AtomicU16>() != 0 {
            return Err(AttachError::Unhookable {
                addr,
                reason: "the USDT semaphore is not 2-byte aligned".into(),
            });
        }
        // SAFETY: `addr` is in a writable mapping of the binary (runtime_data_address
        // only answers those), aligned for a u16, and stays mapped while the binary is,
        // which the hook it goes with needs too. The traced code only reads it; other
        // tracers (the kernel) add and subtract as we do.
        let counter = unsafe { &*(addr as *const AtomicU16) };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(Semaphore(counter))
    }
}

impl Drop for Semaphore {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

pub(crate) fn start(args: &bpftime_abi::AgentStart) {
    let bpftime_abi::AgentStart {
        hook_flag_tp_offset,
        on_starter_thread,
        ids_tp_offset,
        shadow_tp_offset,
        cpu_slot_tp_offset,
        rseq_tp_offset,
        syscall_tp_offset,
        ..
    } = *args;
    bpftime_runtime::init_logging();
    crate::crash::install_if_asked();
    if rseq_tp_offset != 0 {
        // SAFETY: the starter's 32-byte rseq area in static TLS, `cpu_id` -1 in every
        // thread, used by nothing else; before anything asks where the CPU number is.
        unsafe { bpftime_runtime::cpu_slots::use_own_rseq_area(rseq_tp_offset) };
    }
    // First: a thread masked from handlers before the switch would not stay masked.
    if hook_flag_tp_offset != 0 {
        // SAFETY: the starter's byte of static TLS, zero in every thread and used by
        // nothing else; nothing is attached yet.
        if let Err(e) = unsafe { bpftime_attach::use_static_tls_flag(hook_flag_tp_offset) } {
            tracing::warn!("hooks keep their per-thread flag in dynamic TLS: {e}");
        }
    }
    if shadow_tp_offset != 0 {
        // SAFETY: the starter's 8 bytes of static TLS, zero in every thread and used by
        // nothing else; nothing is attached yet.
        if let Err(e) = unsafe { bpftime_attach::use_static_tls_shadow(shadow_tp_offset) } {
            tracing::warn!("hooks keep their shadow stacks in dynamic TLS only: {e}");
        }
    }
    if syscall_tp_offset != 0 {
        // SAFETY: the starter's 24 bytes of static TLS, zero in every thread and used by
        // nothing else.
        unsafe { bpftime_syscall_hooks::use_static_tls(syscall_tp_offset) };
    }
    // The starter's thread runs on (frees, exits) once probes are live; the kernel
    // would never see those calls, so neither may the tools.
    if on_starter_thread {
        bpftime_attach::never_run_handlers_on_this_thread();
    }
    bpftime_runtime::thread::init_process();
    if ids_tp_offset != 0 {
        // SAFETY: the starter's 8 bytes of static TLS, zero in every thread and used by
        // nothing else.
        unsafe { bpftime_runtime::thread::use_static_tls_ids(ids_tp_offset) };
    }
    // User stacks read through pending uretprobes, whose trampoline stands in
    // for the caller's return address on the stack, as the kernel's do.
    bpftime_runtime::stack::set_return_address_resolver(bpftime_attach::original_return_address);
    let hint = inject_hint();
    let name = hint
        .as_ref()
        .map(|h| h.1.clone())
        .unwrap_or_else(Store::name_from_env);
    let store = match Store::create_or_open(&name) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bpftime agent: cannot open the store, the target runs uninstrumented: {e}");
            if let Some((p, _)) = &hint {
                bpftime_runtime::report_to_attach(p, &format!("cannot open the store: {e}"));
            }
            return;
        }
    };
    if cpu_slot_tp_offset != 0 {
        // SAFETY: the starter's 8 bytes of static TLS, zero in every thread and used by
        // nothing else; no program runs yet.
        unsafe { bpftime_runtime::cpu_slots::use_static_tls_slot(cpu_slot_tp_offset) };
        if let Err(e) = bpftime_runtime::cpu_slots::install(&store) {
            tracing::warn!("programs run as the CPU their thread is on (per-CPU values may lose updates to preemption): {e}");
        }
    }
    helpers::set_trace_output(&store);
    let use_jit = program::jit_wanted();
    tracing::info!(
        pid = std::process::id(),
        store = %name,
        engine = if use_jit { "x86-64 JIT" } else { "interpreter" },
        "bpftime agent started"
    );
    let runtime = Arc::new(Runtime {
        store,
        programs: Programs::new(use_jit),
    });
    runtime.activate();
    crate::trace::start();
    crate::gpu::start();
    let agent = Arc::new(Agent {
        runtime,
        links: Mutex::new(HashMap::new()),
        warned: Mutex::new(HashSet::new()),
    });
    // The agent's own work (allocations, file reads) is not the target's: no
    // probe fires on the agent's thread. It is started before anything is
    // attached, so even its start-up is unobserved; the first sync happens on
    // it while this thread waits, so no call of the target's is missed.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let a = agent.clone();
    let spawned = std::thread::Builder::new()
        .name("bpftime-agent".into())
        .spawn(move || {
            // The agent's own allocations and file reads are not the application's.
            bpftime_attach::never_run_handlers_on_this_thread();
            a.sync();
            let _ = ready_tx.send(());
            a.watch();
        });
    match spawned {
        Ok(_) => {
            let _ = ready_rx.recv();
            // Removing the hint tells a waiting `bpftime attach` that we are attached.
            if let Some((p, _)) = &hint {
                let _ = std::fs::remove_file(p);
            }
        }
        Err(e) => tracing::warn!("cannot start the agent thread; nothing is attached: {e}"),
    }
}

impl Agent {
    fn store(&self) -> &Store {
        &self.runtime.store
    }

    fn sync(self: &Arc<Self>) {
        // A tool killed without closing its descriptors drops its references, but
        // no process of its own frees what they held: whoever looks next does, and
        // an agent looks twice a second.
        bpftime_runtime::collect_garbage(self.store());
        let present = self.store().ids(ObjectKind::Link);
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        // A link lives while something refers to it (a descriptor, a pin); freed,
        // it leaves the store and is detached here.
        let gone: Vec<u32> = links
            .keys()
            .copied()
            .filter(|id| !present.contains(id))
            .collect();
        for id in gone {
            crate::gpu::detach(id);
            crate::syscalls::detach(id);
            crate::trace::detached(id);
            let Some(held) = links.remove(&id) else {
                continue;
            };
            if let Some(hook) = held.hook {
                match detach(hook) {
                    Ok(()) => tracing::info!(link = id, "detached"),
                    Err(e) => tracing::warn!(link = id, "detach failed: {e}"),
                }
            }
            // The semaphore drops after the hook is out, as the kernel lowers it after
            // removing the breakpoint.
            drop(held.semaphore);
        }
        for id in present {
            if links.contains_key(&id) {
                continue;
            }
            let held = match LinkRecord::read(self.store(), id) {
                Ok(rec) => self.attach(&rec),
                Err(e) => {
                    tracing::warn!(link = id, "unreadable link: {e}");
                    Attachment::default()
                }
            };
            links.insert(id, held);
        }
        self.detach_damaged(&mut links);
    }

    /// Detaches every link whose store objects are damaged (its own record, its
    /// program's, a map the program uses, the CPU slot table it runs with), with one
    /// warning per damaged object; the target goes on without them. Damage is what a
    /// fault on a truncated file or an operation that met garbage marked, and what the
    /// records and headers show now: this runs twice a second, off the probes' path.
    fn detach_damaged(&self, links: &mut HashMap<u32, Attachment>) {
        if let Some(d) = self.store().check_damage() {
            self.warn_once(
                &format!(
                    "the store header {}",
                    self.store().dir().join("store").display()
                ),
                d.describe(),
                "new tools cannot be loaded into this store; what is attached stays",
            );
        }
        let mut detached: Vec<(Found, u32)> = Vec::new();
        for (&id, held) in links.iter_mut() {
            let (Some(hook), Some(source)) = (held.hook, held.source.as_mut()) else {
                continue;
            };
            let Some(found) = self.damage_under(id, source) else {
                continue;
            };
            if let Err(e) = detach(hook) {
                tracing::warn!(link = id, "detach failed: {e}");
                continue;
            }
            held.hook = None;
            held.source = None;
            drop(held.semaphore.take());
            crate::trace::detached(id);
            detached.push((found, id));
        }
        let mut by_object: Vec<(Found, Vec<u32>)> = Vec::new();
        for (found, id) in detached {
            match by_object.iter_mut().find(|(f, _)| f.object == found.object) {
                Some((_, ids)) => ids.push(id),
                None => by_object.push((found, vec![id])),
            }
        }
        for (found, ids) in by_object {
            let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
            let what = format!(
                "detached link {} that stands on it; the target goes on without it (remove the store with `bpftime list --clean` and load the tool again)",
                ids.join(", ")
            );
            if !self.warn_once(&found.object, &found.why, &what) {
                tracing::info!(object = %found.object, links = %ids.join(", "), "detached links on a damaged object");
            }
        }
    }

    /// Warns that `object` is damaged, once per object; false when it was said before.
    fn warn_once(&self, object: &str, why: &str, what: &str) -> bool {
        let mut warned = self.warned.lock().unwrap_or_else(|p| p.into_inner());
        if !warned.insert(object.to_string()) {
            return false;
        }
        tracing::warn!("{object} is damaged: {why}; {what}");
        true
    }

    /// The first damaged object link `id` stands on, if any.
    fn damage_under(&self, id: u32, source: &mut Source) -> Option<Found> {
        let store = self.store();
        let link_path = store.path(ObjectKind::Link, id);
        let stamp = Stamp::of(&link_path);
        if stamp.is_some() && stamp != source.link_stamp {
            match LinkRecord::read(store, id) {
                Ok(rec) if rec == source.link => source.link_stamp = stamp,
                Ok(_) => {
                    return Some(Found {
                        object: format!("link {id} ({})", link_path.display()),
                        why: "its record changed under the attached probe".into(),
                    })
                }
                Err(e) => {
                    return Some(Found {
                        object: format!("link {id} ({})", link_path.display()),
                        why: format!("its record no longer reads: {e}"),
                    })
                }
            }
        }
        let prog_id = source.program.id;
        let prog_path = store.path(ObjectKind::Program, prog_id);
        let stamp = Stamp::of(&prog_path);
        if stamp.is_some() && stamp != source.program_stamp {
            let object = format!("program {prog_id} ({})", prog_path.display());
            match ProgramRecord::read(store, prog_id) {
                Ok(rec) if rec == source.program => source.program_stamp = stamp,
                Ok(_) => {
                    return Some(Found {
                        object,
                        why: "its record changed under the running program".into(),
                    })
                }
                Err(e) => {
                    return Some(Found {
                        object,
                        why: format!("its record no longer reads: {e}"),
                    })
                }
            }
        }
        for m in source.loaded.maps() {
            if let Some(d) = m.check_damage() {
                return Some(Found {
                    object: format!("map {} ({})", m.id(), m.path().display()),
                    why: d.describe().into(),
                });
            }
        }
        if source.loaded.runs_as_cpu() {
            if let Some(d) = cpu_slots::damage() {
                return Some(Found {
                    object: format!("the CPU slot table {}", store.dir().join("cpus").display()),
                    why: d.describe().into(),
                });
            }
        }
        None
    }

    fn attach(self: &Arc<Self>, rec: &LinkRecord) -> Attachment {
        let Some((hook, loaded)) = self.hook(rec) else {
            return Attachment::default();
        };
        let store = self.store();
        // Stamped before the program's record is read again: a change in between shows
        // as a changed stamp at the next check.
        let link_stamp = Stamp::of(&store.path(ObjectKind::Link, rec.id));
        let program_stamp = Stamp::of(&store.path(ObjectKind::Program, rec.prog_id));
        let source = ProgramRecord::read(store, rec.prog_id)
            .ok()
            .map(|program| Source {
                link: rec.clone(),
                link_stamp,
                program,
                program_stamp,
                loaded,
            });
        let semaphore = (rec.ref_ctr_offset != 0)
            .then(|| Semaphore::raise(Path::new(&rec.path), rec.ref_ctr_offset))
            .and_then(|r| {
                r.inspect_err(|e| {
                    tracing::warn!(link = rec.id, path = %rec.path, ref_ctr_offset = rec.ref_ctr_offset, "the probe's USDT semaphore cannot be raised, so the traced code may skip the probe: {e}")
                })
                .ok()
            });
        Attachment {
            hook: Some(hook),
            semaphore,
            source,
        }
    }

    fn hook(self: &Arc<Self>, rec: &LinkRecord) -> Option<(HookId, Arc<LoadedProgram>)> {
        let retprobe = match rec.kind {
            LinkKind::Uprobe => false,
            LinkKind::Uretprobe => true,
            LinkKind::Gpu(_) => {
                crate::gpu::attach(self.store(), &self.runtime, rec);
                return None;
            }
            LinkKind::Tracepoint | LinkKind::RawTracepoint => {
                crate::syscalls::attach(self.store(), &self.runtime, rec);
                return None;
            }
        };
        let me = std::process::id() as i32;
        if rec.pid != -1 && rec.pid != me {
            return None;
        }
        // A link for a binary this process does not map is someone else's.
        let addr = runtime_address(Path::new(&rec.path), rec.offset).ok()?;
        let prog = match self.runtime.programs.load(self.store(), rec.prog_id) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(link = rec.id, "cannot load the program: {e}");
                return None;
            }
        };
        let loaded = prog.clone();
        let agent = self.clone();
        let ctx = ProbeContext {
            func_ip: addr as u64,
            cookie: rec.cookie,
        };
        // Handlers never nest on a thread (the attach crate's guard), so a helper that
        // calls a hooked function does not run programs again, as with kernel uprobes.
        // A compiled program that needs nothing set before it runs is the handler
        // itself; the others run through a closure.
        let code =
            prog.jit
                .as_ref()
                .filter(|_| !helpers::reads_probe_context(&prog.insns))
                .map(|jit| {
                    // SAFETY: the entry of a JIT-compiled program has the C signature
                    // `(r1, r2, tail depth) -> r0` and never unwinds; `owner` keeps the code,
                    // its maps and the runtime that resolves its tail calls alive.
                    let entry = unsafe {
                        std::mem::transmute::<
                            usize,
                            unsafe extern "C" fn(*mut PtRegs, u64, u64) -> u64,
                        >(jit.entry_address() as usize)
                    };
                    CodeHandler {
                        entry,
                        arg: 0,
                        owner: Arc::new((agent.clone(), prog.clone())),
                        keeps_vector_registers: jit.keeps_vector_registers(),
                        regs_read: prog.ctx_words_read,
                    }
                });
        // A uprobe where the binary's symbols say a function starts gets the hook that
        // skips the dead flags; inside a function, the jump where nothing else can reach
        // the bytes it replaces, and a breakpoint elsewhere; every flag is kept there.
        let plan = match plan_site(Path::new(&rec.path), rec.offset) {
            Ok(plan) => plan,
            Err(e @ bpftime_attach::AttachError::NotAnInstruction { .. }) => {
                tracing::error!(link = rec.id, "cannot attach: {e}");
                return None;
            }
            Err(e) => SitePlan::Breakpoint(format!("the binary's code cannot be read: {e}")),
        };
        if let SitePlan::Breakpoint(why) = &plan {
            tracing::info!(link = rec.id, path = %rec.path, offset = rec.offset, "probed with a breakpoint (a signal per hit), as {why}");
        }
        let at = plan.at(addr);
        // SAFETY: `addr` is the file offset the tool asked for, mapped at its runtime
        // address in this process, where an instruction starts (`plan_site` checked it
        // against the function's code where there is one, as the kernel's uprobes do not),
        // a function's when `plan_site` says so (uretprobes are function entries by
        // definition), and patched with a jump only where `plan_site` found nothing else
        // reaching the bytes it replaces. A program's code is verified and compiled for a
        // pt_regs context, which is what handlers get.
        let r = unsafe {
            match (retprobe, code) {
                (false, Some(code)) => attach_uprobe_code(at, code),
                (true, Some(code)) => attach_uretprobe_code(addr, code),
                (retprobe, None) => {
                    let handler: Handler = Arc::new(move |regs: &mut PtRegs| {
                        helpers::set_probe_context(ctx);
                        agent.runtime.run(&prog, regs as *mut PtRegs as u64);
                    });
                    if retprobe {
                        attach_uretprobe(addr, handler)
                    } else {
                        attach_uprobe(at, handler)
                    }
                }
            }
        };
        match r {
            Ok(h) => {
                tracing::info!(link = rec.id, path = %rec.path, offset = rec.offset, addr, "attached");
                crate::trace::attached(rec, addr, at, retprobe);
                Some((h, loaded))
            }
            Err(e) => {
                tracing::error!(link = rec.id, path = %rec.path, "cannot attach: {e}");
                None
            }
        }
    }

    /// Waits for changes in the store directory (inotify), and re-checks tool
    /// liveness twice a second.
    fn watch(self: Arc<Self>) {
        // SAFETY: plain syscall wrapper.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
        let wd = if fd < 0 {
            -1
        } else {
            self.store()
                .watch(fd, libc::IN_CREATE | libc::IN_MOVED_TO | libc::IN_DELETE)
                .unwrap_or(-1)
        };
        if fd < 0 || wd < 0 {
            tracing::warn!("inotify unavailable; polling the store");
        }
        let mut buf = [0u8; 4096];
        loop {
            if fd >= 0 && wd >= 0 {
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                if unsafe { libc::poll(&mut pfd, 1, 500) } > 0 {
                    // SAFETY: reads into a local buffer.
                    unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
                }
            } else {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            self.sync();
        }
    }
}

/// The store `bpftime attach` named for this process (it cannot change an
/// injected process's environment), from a file only root or we could have written.
fn inject_hint() -> Option<(std::path::PathBuf, String)> {
    let path = bpftime_abi::attach_hint_path(std::process::id());
    let name = bpftime_runtime::read_attach_hint(&path)?;
    Some((path, name))
}
