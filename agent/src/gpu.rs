//! GPU links: programs on CUDA kernels, handed to `bpftime-gpu-attach` once this process
//! has loaded the CUDA driver.
//!
//! GPU attach starts when libcuda is in the process: at the agent's start for a program
//! linked against it, or on the return of the `dlopen` that loads it (cudart, PyTorch and
//! CuPy load it that way), before the first module load. A process that never loads
//! libcuda gets nothing intercepted but `dlopen` (watched only, never changed), and never
//! loads libcuda because of us.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use bpftime_attach::{attach_uretprobe, HookId, PtRegs};
use bpftime_gpu_attach::{GpuAttach, GpuProbe, LaunchContext, LaunchProbe};
use bpftime_gpu_profile::LaunchStacks;
use bpftime_runtime::helpers::{self, ProbeContext};
use bpftime_runtime::GPU_FLAMEGRAPH_ENV;
use bpftime_runtime::{LinkKind, LinkRecord, Map, ProgramRecord, Store};

use crate::program::Runtime;

/// Not a store link: the launch watcher behind `--gpu-flamegraph`.
const FLAMEGRAPH_LINK: u32 = u32::MAX;
/// Not a store link either: the launch watcher behind `--trace` (`trace.rs`).
pub(crate) const TRACE_LINK: u32 = u32::MAX - 1;

/// Records the CPU stack of every kernel launch with the launch's GPU time, and writes the
/// flame graph (`PATH.folded`, `PATH.svg`) at exit.
fn start_flamegraph(path: PathBuf) {
    let own = own_object();
    // The agent's frames and the driver's sit on top of every launch stack; the
    // application's begin below them.
    let stacks = Arc::new(LaunchStacks::new(vec![own, "libcuda.so".into()]));
    let recorder = stacks.clone();
    hand_over(
        FLAMEGRAPH_LINK,
        Pending::Launch(LaunchProbe {
            link_id: FLAMEGRAPH_LINK,
            name: "gpu-flamegraph".into(),
            pattern: "*".into(),
            run: Arc::new(move |ctx: &mut LaunchContext, kernel: &str| {
                recorder.record(ctx, kernel)
            }),
        }),
    );
    let pid = std::process::id();
    bpftime_gpu_attach::after_exit_flush(move || {
        // A child forked from this process inherits the recorder, not the graph.
        if std::process::id() != pid {
            return;
        }
        if !bpftime_gpu_attach::cuda_loaded() {
            eprintln!(
                "bpftime: no GPU flame graph: this process did not load the CUDA driver \
                 (libcuda.so.1), so it launched no kernel"
            );
            return;
        }
        match stacks.write(&path) {
            Ok(w) => {
                let awaiting = stacks.awaiting();
                let untimed = if awaiting > 0 {
                    format!("; {awaiting} launches had no GPU times and are not in it")
                } else {
                    String::new()
                };
                let python = match bpftime_gpu_profile::python_version() {
                    Ok(Some((major, minor))) => format!(", with Python {major}.{minor} frames"),
                    Ok(None) => String::new(),
                    Err(e) => format!("; no Python frames in it: {e}"),
                };
                eprintln!(
                    "bpftime: GPU flame graph of {} launches ({:.3} ms of GPU time, {} stacks) \
                     in {}, {} and {} (pprof){python}{untimed}",
                    w.launches,
                    w.gpu_ns as f64 / 1e6,
                    w.lines,
                    w.svg.display(),
                    w.folded.display(),
                    w.pprof.display()
                );
            }
            Err(e) => eprintln!("bpftime: no GPU flame graph: {e}"),
        }
    });
}

/// The path of the object this code is in (the agent's library).
fn own_object() -> String {
    // One past the start, as a return address into it would be.
    let here = own_object as *const () as usize + 1;
    let (path, _) = bpftime_gpu_profile::containing_object(here);
    if path.is_empty() {
        bpftime_abi::AGENT_LIB.into()
    } else {
        path
    }
}

/// A probe waiting for CUDA: a program for inside kernels, or one for their launches.
pub(crate) enum Pending {
    Device(GpuProbe),
    Launch(LaunchProbe),
}

impl Pending {
    fn describe(&self) -> String {
        match self {
            Pending::Device(p) => format!("{} on {}", p.name, p.pattern),
            Pending::Launch(p) => format!("{} on {}:launch", p.name, p.pattern),
        }
    }

    fn add_to(self, s: &GpuAttach) {
        match self {
            Pending::Device(p) => s.add_probe(p),
            Pending::Launch(p) => s.add_launch_probe(p),
        }
    }
}

/// GPU probes waiting for CUDA, and whether GPU attach is on.
pub(crate) struct GpuLinks {
    pending: Mutex<HashMap<u32, Pending>>,
    attached: Mutex<Vec<u32>>,
    dlopen_watch: OnceLock<Option<HookId>>,
}

static LINKS: OnceLock<Arc<GpuLinks>> = OnceLock::new();

fn links() -> &'static Arc<GpuLinks> {
    LINKS.get_or_init(|| {
        Arc::new(GpuLinks {
            pending: Mutex::new(HashMap::new()),
            attached: Mutex::new(Vec::new()),
            dlopen_watch: OnceLock::new(),
        })
    })
}

/// Starts GPU attach if CUDA is loaded already, else watches `dlopen` for it.
pub(crate) fn start() {
    if let Some(path) = std::env::var_os(GPU_FLAMEGRAPH_ENV).filter(|p| !p.is_empty()) {
        // The graph is this process's: programs it runs would write over the same file.
        // The agent starts before the application's own threads (`start` and `run` set
        // the variable; `attach` never does), so nothing reads the environment meanwhile.
        std::env::remove_var(GPU_FLAMEGRAPH_ENV);
        start_flamegraph(PathBuf::from(path));
    }
    if bpftime_gpu_attach::cuda_loaded() {
        start_gpu_attach();
    } else {
        watch_dlopen();
    }
}

fn session() -> Option<&'static GpuAttach> {
    bpftime_gpu_attach::cuda_loaded()
        .then(bpftime_gpu_attach::install)
        .and_then(|r| r.ok())
}

fn start_gpu_attach() {
    match bpftime_gpu_attach::install() {
        Ok(s) => {
            let pending: Vec<(u32, Pending)> = links()
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .drain()
                .collect();
            let mut attached = links().attached.lock().unwrap_or_else(|e| e.into_inner());
            for (id, p) in pending {
                attached.push(id);
                p.add_to(s);
            }
        }
        Err(e) => {
            tracing::warn!("GPU attach cannot start: {e}");
            eprintln!("bpftime: GPU probes are off in this process: {e}");
        }
    }
}

fn watch_dlopen() {
    links().dlopen_watch.get_or_init(|| {
        let addr = {
            // SAFETY: dlsym with a NUL-terminated name; `dlopen` is libc's (both of its
            // symbol versions are one function).
            let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"dlopen".as_ptr()) };
            p as usize
        };
        if addr == 0 {
            tracing::warn!(
                "no dlopen to watch: GPU probes work only in programs linked against libcuda"
            );
            return None;
        }
        let handler = Arc::new(|_: &mut PtRegs| {
            if bpftime_gpu_attach::cuda_loaded() {
                start_gpu_attach();
            }
        });
        // SAFETY: dlopen is a whole libc function; the handler only looks at which
        // libraries are loaded and, once libcuda is, starts GPU attach.
        match unsafe { attach_uretprobe(addr, handler) } {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::warn!("cannot watch dlopen for CUDA: {e}");
                None
            }
        }
    });
}

/// Attaches a GPU link: a device probe verified under the GPU rules, or a launch program
/// verified as CPU code, handed to GPU attach (now, or when CUDA is loaded). Returns
/// whether it is attached or waiting.
pub(crate) fn attach(store: &Store, runtime: &Arc<Runtime>, rec: &LinkRecord) -> bool {
    let me = std::process::id() as i32;
    if rec.pid != -1 && rec.pid != me {
        return false;
    }
    let kind = match rec.kind {
        LinkKind::Gpu(kind) => kind,
        LinkKind::Uprobe | LinkKind::Uretprobe | LinkKind::Tracepoint | LinkKind::RawTracepoint => {
            return false
        }
    };
    // A launch program runs on the CPU; every other kind is spliced into kernels.
    let Some(point) = bpftime_gpu_attach::probe_point(kind) else {
        return attach_launch(store, runtime, rec);
    };
    let programs = &runtime.programs;
    let prog = match ProgramRecord::read(store, rec.prog_id) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(link = rec.id, "cannot read the program: {e}");
            return false;
        }
    };
    let maps: Vec<Arc<Map>> = match prog
        .map_ids
        .iter()
        .map(|&id| programs.map(store, id))
        .collect::<Result<_, _>>()
    {
        Ok(m) => m,
        Err(e) => {
            tracing::error!(link = rec.id, "cannot open the program's maps: {e}");
            return false;
        }
    };
    if let Err(e) = programs.verify_for_gpu(store, &prog) {
        eprintln!(
            "bpftime: GPU probe {} on {} is not attached: {e}",
            prog.name, rec.path
        );
        return false;
    }
    let probe = GpuProbe {
        link_id: rec.id,
        name: prog.name.clone(),
        insns: prog.insns.clone(),
        maps,
        point,
        pattern: rec.path.clone(),
    };
    tracing::info!(link = rec.id, program = %prog.name, kernel = %rec.path, ?point, "GPU probe");
    hand_over(rec.id, Pending::Device(probe));
    true
}

/// A launch program: CPU code, run on the launch's context (`LaunchContext`) at each launch
/// of the kernels it names and again once each completed.
fn attach_launch(store: &Store, runtime: &Arc<Runtime>, rec: &LinkRecord) -> bool {
    let prog = match runtime.programs.load(store, rec.prog_id) {
        Ok(p) => p,
        Err(e) => {
            eprintln!(
                "bpftime: launch program on {} is not attached: {e}",
                rec.path
            );
            return false;
        }
    };
    let name = prog.name.clone();
    let rt = runtime.clone();
    let cookie = rec.cookie;
    let run = Arc::new(move |ctx: &mut LaunchContext, _kernel: &str| {
        helpers::set_probe_context(ProbeContext {
            func_ip: ctx.function,
            cookie,
        });
        rt.run(&prog, ctx as *mut LaunchContext as u64);
    });
    tracing::info!(link = rec.id, program = %name, kernel = %rec.path, "launch program");
    hand_over(
        rec.id,
        Pending::Launch(LaunchProbe {
            link_id: rec.id,
            name,
            pattern: rec.path.clone(),
            run,
        }),
    );
    true
}

/// Gives a probe to GPU attach, or keeps it until CUDA is loaded.
pub(crate) fn hand_over(id: u32, probe: Pending) {
    match session() {
        Some(s) => {
            links()
                .attached
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(id);
            probe.add_to(s);
        }
        None => {
            links()
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id, probe);
            watch_dlopen();
            report_pending_at_exit();
        }
    }
}

/// At exit, one line if GPU probes waited for a CUDA driver that never came.
fn report_pending_at_exit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    extern "C" fn report() {
        let Some(links) = LINKS.get() else { return };
        let Ok(pending) = links.pending.try_lock() else {
            return;
        };
        if pending.is_empty() || bpftime_gpu_attach::cuda_loaded() {
            return;
        }
        // The flame graph and the trace say for themselves what they have.
        let mut names: Vec<String> = pending
            .iter()
            .filter(|(&id, _)| id != FLAMEGRAPH_LINK && id != TRACE_LINK)
            .map(|(_, p)| p.describe())
            .collect();
        if names.is_empty() {
            return;
        }
        names.sort();
        eprintln!(
            "bpftime: GPU probes never ran ({}): this process did not load the CUDA driver \
             (libcuda.so.1); it ran as it would without bpftime",
            names.join(", ")
        );
    }
    // SAFETY: registers a plain function that only reads our own state and writes stderr.
    ONCE.call_once(|| unsafe {
        libc::atexit(report);
    });
}

/// Detaches the GPU link `id`, if it is one.
pub(crate) fn detach(id: u32) {
    links()
        .pending
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&id);
    let mut attached = links().attached.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(i) = attached.iter().position(|&l| l == id) {
        attached.remove(i);
        if let Some(s) = session() {
            s.remove_probe(id);
            tracing::info!(link = id, "GPU probe detached");
        }
    }
}
