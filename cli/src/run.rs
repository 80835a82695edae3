//! `bpftime run prog.bpf.o -- app [args]`: the one-command path. libbpf loads
//! the object inside bpftime (the shim serving it, see `inproc`), every
//! program is attached where its section says, the app runs with the agent,
//! events print as they arrive, and every map prints when the app exits.
//!
//! GPU probes (`cuda:` sections, `cuda__*` kprobes and kretprobes) attach as
//! in any libbpf tool under the shim: libbpf's attach, through the shim's
//! `cuda:` handler or libbpf's own kprobe one, makes a kprobe perf event on the
//! kernel's name, which the shim turns into a GPU link for the agent.
//!
//! Exit status: the app's own; 1 when the object does not load (a rejected
//! program: libbpf prints the verifier's log) or a probe does not attach; 2
//! for usage errors (a missing object, app, target file or function, a
//! program with no target).

use crate::inproc;
use crate::probes::{self, Attachment};
use crate::show::{self, Types};
use crate::symbolize::AppMaps;
use crate::timeline::Sample;
use anyhow::anyhow;
use bpftime_runtime::{GpuAttachPoint, GpuProbeKind};
use libbpf_rs::{
    MapCore, MapHandle, MapType, ObjectBuilder, PerfBufferBuilder, RingBufferBuilder, UprobeOpts,
};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

#[derive(clap::Args)]
pub struct RunArgs {
    /// Attach program PROG at TARGET instead of where its section says.
    /// TARGET is [PATH:]FUNC[+OFFSET] or PATH:0xOFFSET; with no PATH, the app.
    /// For a GPU probe, TARGET is the CUDA kernel's name or a glob.
    #[arg(short, long = "attach", value_name = "PROG=TARGET")]
    attach: Vec<String>,
    /// Show libbpf's debug messages.
    #[arg(short, long)]
    verbose: bool,
    /// Write what the run gathers into DIR (made if missing) instead of printing
    /// each event: every map as at exit (DIR/maps.txt, printed too), every ring
    /// buffer and perf buffer record (DIR/events.txt), and, for records with
    /// `time_ns` and `addr` fields (memtrace's), a memory-access timeline
    /// (DIR/MAP.png: time across, address down, density as colour).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Serve the object's maps as Prometheus metrics at http://ADDR/metrics while the
    /// app runs (ADDR is HOST:PORT, or :PORT for every address): one family per hash or
    /// array map, `bpftime_MAP{KEY MEMBERS...} VALUE`, and the object's global variables.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    #[command(flatten)]
    profiling: crate::Profiling,
    /// The eBPF object (`clang -target bpf -g -c prog.bpf.c`). Sections name
    /// the probes: SEC("uprobe/FUNC") for a function of the app,
    /// SEC("uprobe//PATH:FUNC") or SEC("uretprobe/LIB.so:FUNC") for others,
    /// SEC("tracepoint/syscalls/sys_enter_NAME") (sys_exit_NAME, raw_syscalls/sys_enter,
    /// raw_tracepoint/sys_exit...) for the app's system calls,
    /// SEC("cuda:KERNEL[:entry|exit|launch|ldst|ldst.shared]") for a CUDA kernel.
    object: PathBuf,
    /// The app and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    app: Vec<OsString>,
}

/// How a run fails, by exit status.
enum Failure {
    /// 2: the command line or the environment is wrong.
    Usage(anyhow::Error),
    /// 1: the object did not load or attach.
    Load(anyhow::Error),
}

fn usage(e: impl Into<anyhow::Error>) -> Failure {
    Failure::Usage(e.into())
}

/// Writes a line to stdout; a closed pipe (`| head`) must not stop the app's report.
fn say(line: &str) {
    outln!("{line}");
}

/// `bpftime run`: checks what it can cheaply, then runs the loader with the
/// shim preloaded and cleans the store up after it.
pub fn main(store: &str, args: RunArgs) -> ExitCode {
    if let Err(e) = inproc::check_object(&args.object) {
        errln!("bpftime run: {e:#}");
        return ExitCode::from(2);
    }
    let Some(app) = crate::find_program(Path::new(&args.app[0])) else {
        errln!(
            "bpftime run: {} not found (not a file, and not on PATH)",
            Path::new(&args.app[0]).display()
        );
        return ExitCode::from(2);
    };
    if let Err(e) = crate::check_runnable(&app) {
        errln!("bpftime run: {e:#}");
        return ExitCode::from(2);
    }
    let mut argv: Vec<OsString> = vec!["__run-loader".into()];
    for a in &args.attach {
        argv.push("--attach".into());
        argv.push(a.into());
    }
    if args.verbose {
        argv.push("--verbose".into());
    }
    if let Some(dir) = &args.out {
        match std::fs::create_dir_all(dir).and_then(|()| dir.canonicalize()) {
            Ok(dir) => {
                argv.push("--out".into());
                argv.push(dir.into_os_string());
            }
            Err(e) => {
                errln!("bpftime run: --out {}: {e}", dir.display());
                return ExitCode::from(2);
            }
        }
    }
    if let Some(addr) = &args.metrics {
        argv.push("--metrics".into());
        argv.push(addr.into());
    }
    match args.profiling.to_args() {
        Ok(a) => argv.extend(a),
        Err(e) => {
            errln!("bpftime run: {e:#}");
            return ExitCode::from(2);
        }
    }
    argv.push(args.object.into_os_string());
    argv.push("--".into());
    argv.extend(args.app);
    let _cleanup = match inproc::StoreCleanup::create(store) {
        Ok(c) => c,
        Err(e) => {
            errln!("bpftime run: {e:#}");
            return ExitCode::from(2);
        }
    };
    match inproc::run_with_shim(store, &argv) {
        Ok(status) => inproc::exit_code(status),
        Err(e) => {
            errln!("bpftime run: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// The loader, inside the shim.
pub fn loader_main(store: &str, args: RunArgs) -> ExitCode {
    if let Err(e) = inproc::enter_loader() {
        errln!("bpftime: {e:#}");
        return ExitCode::from(2);
    }
    bpftime_libbpf_print::to_stderr(args.verbose);
    match load_and_run(store, &args) {
        Ok(code) => code,
        Err(Failure::Usage(e)) => {
            errln!("bpftime run: {e:#}");
            ExitCode::from(2)
        }
        Err(Failure::Load(e)) => {
            errln!("bpftime run: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// `--attach PROG=TARGET`, by program; TARGET is read once the program's kind is known.
fn overrides(attach: &[String]) -> Result<HashMap<String, String>, Failure> {
    attach
        .iter()
        .map(|a| {
            let (prog, target) = a.split_once('=').ok_or_else(|| {
                usage(anyhow!(
                    "--attach {a}: expected PROG=[PATH:]FUNC[+OFFSET] (or PROG=KERNEL for a GPU probe)"
                ))
            })?;
            Ok((prog.to_string(), target.to_string()))
        })
        .collect()
}

/// A GPU probe to attach: where its section says (`kernel` None), or on the
/// kernel `--attach` names.
struct GpuAttachment {
    prog: String,
    probe: GpuAttachPoint,
    kernel: Option<String>,
}

impl GpuAttachment {
    fn describe(&self) -> String {
        let kind = self.probe.kind.label();
        let kernel = self.kernel.as_deref().unwrap_or(&self.probe.kernel);
        format!("{} ({kind}) -> CUDA kernel {kernel}", self.prog)
    }
}

/// Where the autoloaded programs of an object attach.
struct Plan {
    uprobes: Vec<Attachment>,
    gpu: Vec<GpuAttachment>,
    /// Programs on system call tracepoints, by name, attached where their sections say.
    tracepoints: Vec<(String, bpftime_syscalls::Event)>,
}

/// Where each autoloaded program of `open` attaches, checked against the files.
fn plan(
    open: &libbpf_rs::OpenObject,
    object: &Path,
    attach: &[String],
    app: &Path,
) -> Result<Plan, Failure> {
    let mut forced = overrides(attach)?;
    let names: Vec<String> = open
        .progs()
        .map(|p| p.name().to_string_lossy().into_owned())
        .collect();
    if let Some(unknown) = forced.keys().find(|k| !names.contains(k)) {
        return Err(usage(anyhow!(
            "--attach: {} has no program `{unknown}`; it has: {}",
            object.display(),
            names.join(", ")
        )));
    }
    let mut plans = Plan {
        uprobes: Vec::new(),
        gpu: Vec::new(),
        tracepoints: Vec::new(),
    };
    for p in open.progs() {
        if !p.autoload() {
            continue;
        }
        let name = p.name().to_string_lossy().into_owned();
        let section = p.section().to_string_lossy().into_owned();
        match bpftime_runtime::gpu_probe(&name, &section) {
            Some(Err(e)) => return Err(usage(anyhow!("program `{name}`: {e}"))),
            Some(Ok(probe)) => {
                let kernel = match forced.remove(&name) {
                    Some(k) if k.is_empty() => {
                        return Err(usage(anyhow!(
                            "--attach {name}=: name the CUDA kernel (a name or a glob)"
                        )))
                    }
                    k => k,
                };
                plans.gpu.push(GpuAttachment {
                    prog: name,
                    probe,
                    kernel,
                });
                continue;
            }
            None => {}
        }
        if let Some(event) = bpftime_syscalls::Event::from_section(&section) {
            if forced.remove(&name).is_some() {
                return Err(usage(anyhow!(
                    "--attach {name}=...: program `{name}` is on the tracepoint {} (SEC(\"{section}\")), which every system call of the app reaches; --attach names functions for uprobes",
                    event.path()
                )));
            }
            plans.tracepoints.push((name, event));
            continue;
        }
        let Some((retprobe, rest)) = probes::uprobe_section(&section) else {
            let hint = if section.starts_with("kprobe") || section.starts_with("kretprobe") {
                " (a kprobe probes a CUDA kernel when its program is named cuda__*, or write SEC(\"cuda:KERNEL\"))".to_string()
            } else {
                String::new()
            };
            return Err(usage(anyhow!(
                "program `{name}`: section `{section}` is not a uprobe, a uretprobe, a system call tracepoint or a GPU probe; bpftime run attaches SEC(\"uprobe/...\"), SEC(\"uretprobe/...\"), SEC(\"tracepoint/syscalls/...\"), SEC(\"tracepoint/raw_syscalls/...\"), SEC(\"raw_tracepoint/sys_enter\") (and sys_exit) and SEC(\"cuda:...\") programs{hint}"
            )));
        };
        let spec = match forced.remove(&name) {
            Some(target) => probes::parse_target(&target)
                .map_err(|e| usage(anyhow!("--attach {name}={target}: {e}")))?,
            None if rest.is_empty() => {
                return Err(usage(anyhow!(
                    "program `{name}`: SEC(\"{section}\") names no target; write SEC(\"{section}/FUNC\") for a function of the app, SEC(\"{section}//PATH:FUNC\") for another binary, or pass --attach {name}=[PATH:]FUNC"
                )))
            }
            None => probes::parse_target(rest).map_err(|e| {
                usage(anyhow!("program `{name}`: section `{section}`: {e}"))
            })?,
        };
        plans
            .uprobes
            .push(probes::resolve(&name, retprobe, &spec, app).map_err(Failure::Usage)?);
    }
    if plans.uprobes.is_empty() && plans.gpu.is_empty() && plans.tracepoints.is_empty() {
        return Err(usage(anyhow!(
            "{} has no program to attach",
            object.display()
        )));
    }
    Ok(plans)
}

/// Attaches a GPU probe. Where its section says, through libbpf's own attach
/// (the shim's `cuda:` handler, or libbpf's kprobe handler for `cuda__*`
/// programs), as in any tool; on another kernel, through the same perf-event
/// path: a kprobe or kretprobe on the kernel's name, or a launch event.
fn attach_gpu(
    prog: &libbpf_rs::ProgramMut<'_>,
    a: &GpuAttachment,
) -> anyhow::Result<libbpf_rs::Link> {
    let Some(kernel) = &a.kernel else {
        return Ok(prog.attach()?);
    };
    match a.probe.kind {
        GpuProbeKind::Entry => Ok(prog.attach_kprobe(false, kernel)?),
        GpuProbeKind::Exit => Ok(prog.attach_kprobe(true, kernel)?),
        GpuProbeKind::Launch | GpuProbeKind::Access | GpuProbeKind::SharedAccess => {
            let config = a.probe.kind.event_config().expect("an event of bpftime's");
            let pfd = gpu_event(kernel, config)?;
            prog.attach_perf_event(pfd).map_err(|e| {
                // SAFETY: our own fd, which the failed attach did not take.
                unsafe { libc::close(pfd) };
                e.into()
            })
        }
    }
}

/// A launch or memory-access event on `kernel`: a perf event of the kprobe PMU
/// (which the shim serves) with bpftime's bits in `config`.
fn gpu_event(kernel: &str, config: u64) -> anyhow::Result<i32> {
    let pmu_type: u32 = std::fs::read_to_string("/sys/bus/event_source/devices/kprobe/type")
        .map_err(|e| anyhow!("cannot read the kprobe PMU's type: {e}"))?
        .trim()
        .parse()
        .map_err(|e| anyhow!("the kprobe PMU's type: {e}"))?;
    let name = std::ffi::CString::new(kernel)
        .map_err(|_| anyhow!("the kernel name `{kernel}` holds a NUL byte"))?;
    // struct perf_event_attr: type, size, config, ..., config1 (at 56), config2 (at 64).
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&pmu_type.to_ne_bytes());
    let size = attr.len() as u32;
    attr[4..8].copy_from_slice(&size.to_ne_bytes());
    attr[8..16].copy_from_slice(&config.to_ne_bytes());
    attr[56..64].copy_from_slice(&(name.as_ptr() as u64).to_ne_bytes());
    const PERF_FLAG_FD_CLOEXEC: libc::c_long = 8;
    // SAFETY: a perf_event_attr of the size it declares, whose config1 points to
    // `name`, alive across the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr.as_ptr(),
            -1 as libc::c_long,
            0 as libc::c_long,
            -1 as libc::c_long,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(anyhow!(
            "cannot open a GPU event on `{kernel}`: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(fd as i32)
}

/// Follows the store's `bpf_trace_printk` output from where it was when we started.
struct TraceTail {
    /// The trace file is opened through the store's handle on its directory.
    store: Option<bpftime_runtime::Store>,
    offset: u64,
    partial: Vec<u8>,
}

impl TraceTail {
    fn new(store: &str) -> TraceTail {
        let store = bpftime_runtime::Store::open(store).ok();
        let offset = store
            .as_ref()
            .and_then(|s| s.open_trace_pipe().ok().flatten())
            .and_then(|f| f.metadata().ok())
            .map_or(0, |m| m.len());
        TraceTail {
            store,
            offset,
            partial: Vec::new(),
        }
    }

    fn drain(&mut self) {
        let Some(Ok(Some(mut f))) = self.store.as_ref().map(|s| s.open_trace_pipe()) else {
            return;
        };
        let mut buf = Vec::new();
        if f.seek(SeekFrom::Start(self.offset)).is_err() || f.read_to_end(&mut buf).is_err() {
            return;
        }
        self.offset += buf.len() as u64;
        self.partial.extend_from_slice(&buf);
        while let Some(nl) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=nl).collect();
            say(String::from_utf8_lossy(&line[..line.len() - 1]).as_ref());
        }
    }
}

fn load_and_run(store: &str, args: &RunArgs) -> Result<ExitCode, Failure> {
    let app = crate::find_program(Path::new(&args.app[0])).ok_or_else(|| {
        usage(anyhow!(
            "{} not found (not a file, and not on PATH)",
            Path::new(&args.app[0]).display()
        ))
    })?;
    inproc::check_object(&args.object).map_err(Failure::Usage)?;
    // Maps are read from the store at the end (see show::dump_maps).
    let store_handle = bpftime_runtime::Store::open(store)
        .map_err(|e| usage(anyhow!("cannot open the store `{store}`: {e}")))?;
    let open = ObjectBuilder::default()
        .open_file(&args.object)
        .map_err(|e| usage(anyhow!("cannot open {}: {e}", args.object.display())))?;
    let plans = plan(&open, &args.object, &args.attach, &app)?;
    let obj = open.load().map_err(|e| {
        Failure::Load(anyhow!(
            "cannot load {}: {e} (libbpf says why above; for a program the verifier rejected, its log is between the BEGIN and END PROG LOAD LOG lines)",
            args.object.display()
        ))
    })?;

    let mut links = Vec::new();
    for a in &plans.gpu {
        let prog = obj
            .progs_mut()
            .find(|p| p.name().to_string_lossy() == a.prog)
            .ok_or_else(|| Failure::Load(anyhow!("program `{}` vanished after load", a.prog)))?;
        let link = attach_gpu(&prog, a)
            .map_err(|e| Failure::Load(anyhow!("cannot attach {}: {e:#}", a.describe())))?;
        errln!("bpftime run: attached {}", a.describe());
        links.push(link);
    }
    for a in &plans.uprobes {
        let prog = obj
            .progs_mut()
            .find(|p| p.name().to_string_lossy() == a.prog)
            .ok_or_else(|| Failure::Load(anyhow!("program `{}` vanished after load", a.prog)))?;
        let opts = UprobeOpts {
            func_name: a.func_name.clone(),
            retprobe: a.retprobe,
            ..Default::default()
        };
        let link = prog
            .attach_uprobe_with_opts(-1, &a.file, a.offset as usize, opts)
            .map_err(|e| Failure::Load(anyhow!("cannot attach {}: {e}", a.describe())))?;
        errln!("bpftime run: attached {}", a.describe());
        links.push(link);
    }

    for (name, event) in &plans.tracepoints {
        let prog = obj
            .progs_mut()
            .find(|p| p.name().to_string_lossy() == *name)
            .ok_or_else(|| Failure::Load(anyhow!("program `{name}` vanished after load")))?;
        // libbpf attaches by the section, finding the tracepoint's id in tracefs (which
        // the shim answers for).
        let link = prog.attach().map_err(|e| {
            Failure::Load(anyhow!(
                "cannot attach {name} to the tracepoint {}: {e}",
                event.path()
            ))
        })?;
        errln!(
            "bpftime run: attached {name} to the tracepoint {}",
            event.path()
        );
        links.push(link);
    }

    let types = Types::new(obj.btf().ok().flatten());
    let events: RefCell<HashMap<String, u64>> = RefCell::new(HashMap::new());
    let out = args
        .out
        .as_deref()
        .map(OutDir::create)
        .transpose()
        .map_err(usage)?;
    let out = RefCell::new(out);
    // Prints an event, or writes it to DIR/events.txt and keeps what a timeline needs.
    let record = |name: &str, data: &[u8]| match out.borrow_mut().as_mut() {
        Some(o) => o.event(&types, name, data),
        None => say(&show::event_line(&types, name, data)),
    };
    let maps: Vec<libbpf_rs::Map<'_>> = obj.maps().collect();
    // bpftime's GPU ring buffers (1527), read as any ring buffer: through a handle whose
    // type comes from BPF_OBJ_GET_INFO_BY_FD, which calls them ring buffers and gives the
    // ring's size (the object's own max_entries counts records).
    let gpu_rings: HashMap<String, MapHandle> = maps
        .iter()
        .filter(|m| show::declared_type(m) == bpftime_isa::uapi::map_type::GPU_RINGBUF)
        .map(|m| {
            let name = m.name().to_string_lossy().into_owned();
            m.info()
                .and_then(|info| MapHandle::from_map_id(info.info.id))
                .map(|h| (name.clone(), h))
                .map_err(|e| Failure::Load(anyhow!("GPU ring buffer `{name}`: {e}")))
        })
        .collect::<Result<_, _>>()?;
    let mut rings = RingBufferBuilder::new();
    let mut have_rings = false;
    let mut perf = Vec::new();
    for m in &maps {
        let name = m.name().to_string_lossy().into_owned();
        match show::served_type(m) {
            MapType::RingBuf => {
                let (record, events) = (&record, &events);
                let ring_map: &dyn MapCore = match gpu_rings.get(&name) {
                    Some(handle) => handle,
                    None => m,
                };
                // A record reaches at most to the end of the ring's second mapping: a
                // longer one is a length read from a damaged ring file (overwritten
                // between the shim's check and libbpf's read), and reading it would go
                // past the mapping.
                let ring = u64::from(ring_map.max_entries());
                rings
                    .add(ring_map, move |data: &[u8]| {
                        if data.len() as u64 + 8 > ring {
                            return 0;
                        }
                        record(&name, data);
                        *events.borrow_mut().entry(name.clone()).or_default() += 1;
                        0
                    })
                    .map_err(|e| {
                        Failure::Load(anyhow!("ring buffer `{}`: {e}", m.name().to_string_lossy()))
                    })?;
                have_rings = true;
            }
            MapType::PerfEventArray => {
                let (record, events) = (&record, &events);
                let lost_name = name.clone();
                let buf = PerfBufferBuilder::new(m)
                    .sample_cb(move |_cpu: i32, data: &[u8]| {
                        // A perf record is at most 64 KiB long (its size is a u16): a
                        // longer sample is a size read from a damaged ring file.
                        if data.len() > usize::from(u16::MAX) {
                            return;
                        }
                        record(&name, data);
                        *events.borrow_mut().entry(name.clone()).or_default() += 1;
                    })
                    .lost_cb(move |cpu: i32, count: u64| {
                        errln!("bpftime run: {lost_name}: {count} events lost on cpu {cpu}");
                    })
                    .build()
                    .map_err(|e| {
                        Failure::Load(anyhow!("perf buffer `{}`: {e}", m.name().to_string_lossy()))
                    })?;
                perf.push(buf);
            }
            _ => {}
        }
    }
    let rings = if have_rings {
        Some(
            rings
                .build()
                .map_err(|e| Failure::Load(anyhow!("ring buffers: {e}")))?,
        )
    } else {
        None
    };
    let metrics = args
        .metrics
        .as_deref()
        .map(crate::metrics::MetricsServer::bind)
        .transpose()
        .map_err(usage)?;
    if let Some(m) = &metrics {
        if let Ok(addr) = m.local_addr() {
            errln!("bpftime run: metrics at http://{addr}/metrics");
        }
    }
    let mut render = || crate::metrics::exposition(&obj, &store_handle, &types);
    let mut trace = TraceTail::new(store);
    // With no ring to wait on, a trace line wakes the loop as soon as it is written.
    let trace_written = crate::trace_pipe::DirWatch::new_for(trace.store.as_ref());

    let command = || -> Result<Command, Failure> {
        let mut command =
            crate::start_command(store, &args.app, &args.profiling).map_err(|e| usage(e.0))?;
        inproc::user_environment(&mut command);
        Ok(command)
    };
    let (mut child, mut app_maps) = spawn_app(&app, command()?, command)?;
    inproc::forward_signals_to(child.id());
    // A poll interrupted by a signal (Ctrl-C, the app's exit) is not an error:
    // the loop looks at the app again.
    let tick = Duration::from_millis(50);
    let status = loop {
        match (&rings, perf.first()) {
            (Some(r), _) => {
                let _ = r.poll(tick);
            }
            (None, Some(p)) => {
                let _ = p.poll(tick);
            }
            (None, None) => trace_written.wait(tick.as_millis() as i32),
        }
        for p in perf.iter().skip(usize::from(rings.is_none())) {
            let _ = p.poll(Duration::ZERO);
        }
        trace.drain();
        if let Some(m) = &metrics {
            m.answer_waiting(&mut render);
        }
        app_maps.refresh();
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => return Err(Failure::Load(anyhow!("waiting for the app: {e}"))),
        }
    };
    // The app is gone: take what is still buffered, then detach.
    if let Some(r) = &rings {
        let _ = r.consume();
    }
    for p in &perf {
        let _ = p.consume();
    }
    trace.drain();
    drop(links);
    errln!(
        "bpftime run: {} exited ({status}); maps of {}:",
        app.display(),
        args.object.display()
    );
    if let Some(hint) = crash_hint(status) {
        errln!("bpftime run: {hint}");
    }
    let mut frame = |ip| app_maps.describe(ip);
    let lines = show::dump_maps(&obj, &store_handle, &types, &events.borrow(), &mut frame);
    for line in &lines {
        say(line);
    }
    if let Some(o) = out.borrow_mut().take() {
        for written in o
            .finish(&lines)
            .map_err(|e| Failure::Load(anyhow!("{e:#}")))?
        {
            errln!("bpftime run: wrote {written}");
        }
    }
    Ok(inproc::exit_code(status))
}

/// For an app that died of a fault or an abort without a crash report: how to get one.
fn crash_hint(status: std::process::ExitStatus) -> Option<&'static str> {
    use std::os::unix::process::ExitStatusExt;
    let crashed = matches!(
        status.signal(),
        Some(libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE | libc::SIGABRT)
    );
    let reported = std::env::var_os("BPFTIME_CRASH_REPORT").is_some_and(|v| v == "1");
    (crashed && !reported).then_some(
        "to see where it died (the application, the CUDA driver or bpftime's agent), run it again with BPFTIME_CRASH_REPORT=1",
    )
}

/// Where `--out DIR` puts a run's results.
struct OutDir {
    dir: PathBuf,
    events: std::io::BufWriter<std::fs::File>,
    /// Per ring or perf buffer whose records have `time_ns` and `addr`: (time, address).
    timelines: HashMap<String, Vec<Sample>>,
}

impl OutDir {
    fn create(dir: &Path) -> anyhow::Result<OutDir> {
        let path = dir.join("events.txt");
        let file = std::fs::File::create(&path)
            .map_err(|e| anyhow!("cannot write {}: {e}", path.display()))?;
        Ok(OutDir {
            dir: dir.to_path_buf(),
            events: std::io::BufWriter::new(file),
            timelines: HashMap::new(),
        })
    }

    fn event(&mut self, types: &Types<'_>, map: &str, data: &[u8]) {
        let _ = writeln!(self.events, "{}", show::event_line(types, map, data));
        let sample = match types.record_fields(data, ["time_ns", "addr", "arg"]) {
            Some([time_ns, addr, arg]) => Some(Sample {
                time_ns,
                addr,
                arg: Some(arg),
            }),
            None => types
                .record_fields(data, ["time_ns", "addr"])
                .map(|[time_ns, addr]| Sample {
                    time_ns,
                    addr,
                    arg: None,
                }),
        };
        if let Some(sample) = sample {
            self.timelines
                .entry(map.to_string())
                .or_default()
                .push(sample);
        }
    }

    /// Writes the maps and the timelines; says what it wrote.
    fn finish(mut self, maps: &[String]) -> anyhow::Result<Vec<String>> {
        self.events.flush()?;
        let mut written = vec![self.dir.join("events.txt").display().to_string()];
        let path = self.dir.join("maps.txt");
        std::fs::write(&path, maps.join("\n") + "\n")
            .map_err(|e| anyhow!("cannot write {}: {e}", path.display()))?;
        written.push(path.display().to_string());
        let mut names: Vec<&String> = self.timelines.keys().collect();
        names.sort();
        for name in names {
            let path = self.dir.join(format!("{name}.png"));
            let summary = crate::timeline::write_png(&self.timelines[name], name, &path)?;
            written.push(format!("{} ({summary})", path.display()));
        }
        Ok(written)
    }
}

/// Runs the app and reads its mappings, which name the frames of user stacks and vanish
/// when it exits. The app starts traced, as under a debugger, so that it stops right after
/// its exec: the mappings are read then, and it is let go. Otherwise a short app could
/// exit before they are read. Where tracing is refused (a seccomp profile, say), `plain`
/// gives a command that starts it untraced, and the mappings are read as soon as it runs.
fn spawn_app(
    app: &Path,
    mut traced: Command,
    plain: impl FnOnce() -> Result<Command, Failure>,
) -> Result<(std::process::Child, AppMaps), Failure> {
    let cannot_run = |e: std::io::Error| usage(anyhow!("cannot run {}: {e}", app.display()));
    // SAFETY: the closure runs between fork and exec and only makes one system call.
    unsafe {
        traced.pre_exec(|| {
            if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = match traced.spawn() {
        Ok(child) => child,
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            let child = plain()?.spawn().map_err(cannot_run)?;
            let maps = AppMaps::new(child.id());
            return Ok((child, maps));
        }
        Err(e) => return Err(cannot_run(e)),
    };
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: waits for our own child; `status` is a plain int.
    let stopped = unsafe { libc::waitpid(pid, &mut status, 0) } == pid && libc::WIFSTOPPED(status);
    let maps = AppMaps::new(child.id());
    if stopped {
        // SAFETY: the child is ours, traced and stopped; detaching lets it run on.
        unsafe { libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0) };
    }
    Ok((child, maps))
}
