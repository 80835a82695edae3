//! `--trace FILE`: one timeline of the target, written at its exit as a Perfetto/Chrome
//! trace (`bpftime_gpu_profile::timeline`).
//!
//! With the trace on, the agent puts handlers of its own beside each uprobe and uretprobe
//! a tool attached: a function with a uretprobe gets a span per call (its entry to its
//! return), a uprobe alone an instant per hit. GPU attach tells the timeline of every CUDA
//! driver call and GPU probe line (`observer`), and a launch watcher on every kernel adds
//! launches and their kernels. With the trace off none of this exists: no handler, no
//! observer, no watcher.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bpftime_attach::{
    attach_uprobe, attach_uretprobe, detach, function_at, HookAddress, HookId, PtRegs,
};
use bpftime_gpu_attach::{LaunchContext, LaunchProbe};
use bpftime_gpu_profile::timeline::{function_name, symbol_at};
use bpftime_gpu_profile::{Name, Timeline};
use bpftime_runtime::{LinkRecord, TRACE_ENV};

use crate::gpu::TRACE_LINK;

static TIMELINE: OnceLock<Arc<Timeline>> = OnceLock::new();

/// A probed address's handlers of ours.
struct Site {
    name: Name,
    /// The uprobe links there, and the uretprobe links (function entries only).
    uprobes: Vec<u32>,
    uretprobes: Vec<u32>,
    entry: Option<HookId>,
    ret: Option<HookId>,
    /// Whether calls there make spans (a return handler is in): entries then open a call
    /// rather than mark a hit.
    spans: Arc<AtomicBool>,
}

static SITES: Mutex<Option<HashMap<usize, Site>>> = Mutex::new(None);

/// Starts the timeline if this process was asked for one.
pub(crate) fn start() {
    let Some(path) = std::env::var_os(TRACE_ENV).filter(|p| !p.is_empty()) else {
        return;
    };
    // The trace is this process's: children it runs would write over the same file. The
    // agent starts before the application's own threads, so nothing reads the
    // environment meanwhile.
    std::env::remove_var(TRACE_ENV);
    let path = PathBuf::from(path);
    let timeline = Arc::new(Timeline::new());
    if TIMELINE.set(timeline.clone()).is_err() {
        return;
    }
    if bpftime_gpu_attach::observer::observe(timeline.clone()).is_err() {
        tracing::warn!("the CUDA driver has another observer: the trace has no CUDA calls");
    }
    let recorder = timeline.clone();
    crate::gpu::hand_over(
        TRACE_LINK,
        crate::gpu::Pending::Launch(LaunchProbe {
            link_id: TRACE_LINK,
            name: "trace".into(),
            pattern: "*".into(),
            run: Arc::new(move |ctx: &mut LaunchContext, kernel: &str| {
                recorder.launch(ctx, kernel)
            }),
        }),
    );
    let pid = std::process::id();
    bpftime_gpu_attach::after_exit_flush(move || {
        // A child forked from this process inherits the recorder, not the trace.
        if std::process::id() != pid {
            return;
        }
        if let Some(s) = bpftime_gpu_attach::installed() {
            for d in s.devices() {
                let clock = d.calibration.map(|c| (c.offset_ns, c.error_ns));
                timeline.set_gpu(d.ordinal, &d.name, clock);
            }
        }
        match timeline.write(&path) {
            Ok(s) => {
                let gpu = if s.launches > 0 || s.gpu_lines > 0 {
                    format!(
                        ", {} launches ({} kernels timed), {} GPU lines",
                        s.launches, s.kernels, s.gpu_lines
                    )
                } else {
                    String::new()
                };
                let dropped = if s.dropped > 0 {
                    format!("; {} events over a thread's limit are not in it", s.dropped)
                } else {
                    String::new()
                };
                let unfinished = match s.unfinished {
                    0 => String::new(),
                    1 => "; 1 call had not returned (its span ends here, marked unfinished)"
                        .to_string(),
                    n => format!(
                        "; {n} calls had not returned (their spans end here, marked unfinished)"
                    ),
                };
                eprintln!(
                    "bpftime: trace of {} CPU events{gpu} in {} (open it in ui.perfetto.dev){dropped}{unfinished}",
                    s.cpu_events,
                    s.path.display()
                );
            }
            Err(e) => eprintln!("bpftime: no trace: {e}"),
        }
    });
}

fn timeline() -> Option<&'static Arc<Timeline>> {
    TIMELINE.get()
}

/// A tool's uprobe (`retprobe` false, at `at`) or uretprobe (at the function entry `addr`)
/// went in for `link`: our handlers go beside it.
pub(crate) fn attached(rec: &LinkRecord, addr: usize, at: HookAddress, retprobe: bool) {
    let Some(tl) = timeline() else { return };
    let link = rec.id;
    let mut sites = SITES.lock().unwrap_or_else(|e| e.into_inner());
    let sites = sites.get_or_insert_with(HashMap::new);
    let key = if retprobe { addr } else { at.addr };
    let site = sites.entry(key).or_insert_with(|| Site {
        name: tl.name(&site_name(rec, key)),
        uprobes: Vec::new(),
        uretprobes: Vec::new(),
        entry: None,
        ret: None,
        spans: Arc::new(AtomicBool::new(false)),
    });
    if retprobe {
        site.uretprobes.push(link);
    } else {
        site.uprobes.push(link);
    }
    if site.entry.is_none() {
        let (tl, name, spans) = (tl.clone(), site.name, site.spans.clone());
        let handler = Arc::new(move |regs: &mut PtRegs| {
            if spans.load(Ordering::Relaxed) {
                tl.call_entered(name, regs.sp);
            } else {
                tl.hit(name);
            }
        });
        // SAFETY: the tool's own hook is at this very address, placed as its link asked
        // (`at` for a uprobe, the function entry for a uretprobe); the handler only
        // records a time.
        match unsafe {
            attach_uprobe(
                if retprobe {
                    HookAddress::function_entry(addr)
                } else {
                    at
                },
                handler,
            )
        } {
            Ok(h) => site.entry = Some(h),
            Err(e) => tracing::warn!(link, "the trace cannot follow this probe: {e}"),
        }
    }
    if retprobe && site.ret.is_none() {
        let (tl, name) = (tl.clone(), site.name);
        let handler = Arc::new(move |regs: &mut PtRegs| tl.call_returned(name, regs.sp));
        // SAFETY: a function entry the tool's uretprobe is attached at; the handler only
        // records a time.
        match unsafe { attach_uretprobe(addr, handler) } {
            Ok(h) => {
                site.ret = Some(h);
                // Only now: an entry that opens a call must have its return seen.
                site.spans.store(true, Ordering::Release);
            }
            Err(e) => tracing::warn!(link, "the trace cannot follow this probe's returns: {e}"),
        }
    }
}

/// The traced function's name: from the binary's symbols (demangled, `+0xN` inside a
/// function), else from what this process's loader knows of `addr`.
fn site_name(rec: &LinkRecord, addr: usize) -> String {
    match function_at(Path::new(&rec.path), rec.offset) {
        Ok(Some((symbol, offset))) => function_name(&symbol, offset),
        _ => symbol_at(addr),
    }
}

/// `link` is gone: our handlers go with the last link at their address.
pub(crate) fn detached(link: u32) {
    if timeline().is_none() {
        return;
    }
    let mut sites = SITES.lock().unwrap_or_else(|e| e.into_inner());
    let Some(sites) = sites.as_mut() else { return };
    let Some((&key, site)) = sites
        .iter_mut()
        .find(|(_, s)| s.uprobes.contains(&link) || s.uretprobes.contains(&link))
    else {
        return;
    };
    site.uprobes.retain(|&l| l != link);
    site.uretprobes.retain(|&l| l != link);
    if site.uretprobes.is_empty() {
        site.spans.store(false, Ordering::Release);
        if let Some(h) = site.ret.take() {
            let _ = detach(h);
        }
    }
    if site.uprobes.is_empty() && site.uretprobes.is_empty() {
        if let Some(h) = site.entry.take() {
            let _ = detach(h);
        }
        sites.remove(&key);
    }
}
