//! `bpftime`: run eBPF tools and their targets in userspace.

use anyhow::{bail, Context, Result};
use bpftime_runtime::{
    LinkKind, LinkRecord, Map, ObjectKind, PerfEventKind, PerfEventRecord, ProgramRecord, Store,
    DEFAULT_STORE_NAME, STORE_ENV,
};
use clap::{Parser, Subcommand};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

#[macro_use]
mod output;
mod attach;
mod histogram;
mod inproc;
mod metrics;
mod probes;
mod run;
mod show;
mod symbolize;
mod timeline;
mod trace_pipe;
mod verify;

use bpftime_abi::{AGENT_LIB, AGENT_STARTER_LIB, SYSCALL_SHIM_LIB as SHIM_LIB};

#[derive(Parser)]
#[command(
    name = "bpftime",
    version,
    about = "Userspace eBPF: run libbpf and bpftrace tools and attach them to processes without the kernel"
)]
struct Cli {
    /// Name of the shared-memory store that tools and targets meet in.
    #[arg(long, global = true, env = STORE_ENV, default_value = DEFAULT_STORE_NAME)]
    store: String,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run an unmodified eBPF loader (libbpf tool, bpftrace) with its bpf() calls served in userspace.
    Load {
        /// The loader and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        tool: Vec<OsString>,
    },
    /// Run a target with the agent, which runs the programs attached to it.
    Start {
        #[command(flatten)]
        profiling: Profiling,
        /// The target and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        app: Vec<OsString>,
    },
    /// Show what the store holds.
    List {
        /// Also say how many objects had lost their last reference (they are freed either way).
        #[arg(long)]
        clean: bool,
    },
    /// Stream what programs print with bpf_printk, like `cat /sys/kernel/tracing/trace_pipe`.
    TracePipe,
    /// Load the agent into a running process (ptrace; same user or root), following the store.
    Attach(attach::AttachArgs),
    /// Load an eBPF object, attach every program its sections name, run the app, then print every map.
    Run(run::RunArgs),
    /// Check the programs of an eBPF object with the verifier, printing a kernel-style log.
    Verify(verify::VerifyArgs),
    /// `run`'s loader, with the syscall shim preloaded.
    #[command(name = "__run-loader", hide = true)]
    RunLoader(run::RunArgs),
    /// `verify`'s loader, with the syscall shim preloaded.
    #[command(name = "__verify-loader", hide = true)]
    VerifyLoader(verify::VerifyArgs),
}

/// What the agent records in the target besides running programs.
#[derive(clap::Args, Default, Clone)]
pub struct Profiling {
    /// Write a GPU flame graph at the target's exit: the CPU stack of every kernel launch,
    /// weighted by that launch's GPU time, to PATH.svg and PATH.folded (folded stacks that
    /// flamegraph.pl and inferno read). Works for kernels without PTX too.
    #[arg(long, value_name = "PATH")]
    pub gpu_flamegraph: Option<PathBuf>,
    /// Write a trace of the target at its exit to FILE, in the Trace Event Format that
    /// ui.perfetto.dev and chrome://tracing open: the calls of every function a uprobe
    /// watches (spans from entry to return where a uretprobe watches it too), CUDA driver
    /// calls, kernel launches joined to their kernels' spans on each GPU and stream, and the
    /// lines GPU probes print, on one clock (CLOCK_MONOTONIC).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
}

impl Profiling {
    /// The output paths, made absolute (the target may change directory), each with the
    /// option that asked for it and the variable that tells the agent; a path whose
    /// directory does not exist is refused.
    fn outputs(&self) -> Result<Vec<(&'static str, &'static str, PathBuf)>> {
        let mut out = Vec::new();
        for (option, env, path) in [
            (
                "--gpu-flamegraph",
                bpftime_runtime::GPU_FLAMEGRAPH_ENV,
                &self.gpu_flamegraph,
            ),
            ("--trace", bpftime_runtime::TRACE_ENV, &self.trace),
        ] {
            let Some(p) = path else { continue };
            let p = absolute(p)?;
            if let Some(dir) = p.parent().filter(|d| !d.is_dir()) {
                bail!(
                    "{option}: the directory {} does not exist (make it first, or name a file \
                     in a directory that does)",
                    dir.display()
                );
            }
            out.push((option, env, p));
        }
        Ok(out)
    }

    /// The same options as arguments.
    pub fn to_args(&self) -> Result<Vec<OsString>> {
        let mut args = Vec::new();
        for (option, _, path) in self.outputs()? {
            args.push(option.into());
            args.push(path.into_os_string());
        }
        Ok(args)
    }
}

fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("cannot resolve {}", path.display()))
}

/// Usage and environment errors exit 2; the traced thing failing exits 1.
struct UsageError(anyhow::Error);

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.command {
        Cmd::Load { tool } => {
            load_command(&cli.store, &tool).and_then(|c| exec(&cli.store, c, &tool))
        }
        Cmd::Start { profiling, app } => {
            start_command(&cli.store, &app, &profiling).and_then(|c| exec(&cli.store, c, &app))
        }
        Cmd::Attach(args) => return attach::main(&cli.store, args),
        Cmd::Run(args) => return run::main(&cli.store, args),
        Cmd::Verify(args) => return verify::main(args),
        Cmd::RunLoader(args) => return run::loader_main(&cli.store, args),
        Cmd::VerifyLoader(args) => return verify::loader_main(args),
        Cmd::List { clean } => list(&cli.store, clean).map_err(UsageError),
        Cmd::TracePipe => trace_pipe::main(&cli.store).map_err(UsageError),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(UsageError(e)) => {
            errln!("bpftime: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn library(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find the bpftime executable")?;
    let dir = exe
        .parent()
        .context("the bpftime executable has no directory")?;
    let lib = dir.join(name);
    if !lib.is_file() {
        bail!(
            "{} is missing; bpftime looks for its libraries beside itself (build them with `cargo build --release`)",
            lib.display()
        );
    }
    Ok(lib)
}

fn find_program(name: &Path) -> Option<PathBuf> {
    if name.components().count() > 1 {
        return name.is_file().then(|| name.to_path_buf());
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Replaces this process with `command` (`argv`), in `store`, made now that nothing
/// else can fail first: signals and the exit status are then the program's own. A
/// store this made is removed again when the program cannot start.
fn exec(store: &str, mut command: Command, argv: &[OsString]) -> Result<(), UsageError> {
    let existed = Store::dir_for(store).join("store").exists();
    Store::create_or_open(store)
        .with_context(|| format!("cannot open the store `{store}`"))
        .map_err(UsageError)?;
    let err = command.exec();
    if !existed {
        let _ = std::fs::remove_dir_all(Store::dir_for(store));
    }
    Err(UsageError(anyhow::anyhow!(
        "cannot run {}: {err}",
        Path::new(&argv[0]).display()
    )))
}

/// Checks that `path` is something exec runs as a program: an executable ELF file or
/// a script with a `#!` line. Anything else, exec hands to the shell as a script,
/// which runs an empty or text file silently and fails on others with a shell error.
pub fn check_runnable(path: &Path) -> Result<()> {
    use std::io::Read;
    let mut head = [0u8; 18];
    let mut n = 0;
    let mut f =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    while n < head.len() {
        match f.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
    }
    let head = &head[..n];
    // e_type at offset 16: 2 is an executable, 3 a position-independent one (or a library).
    let elf_type = head.get(16..18).map(|t| u16::from_le_bytes([t[0], t[1]]));
    let what = if head.starts_with(b"#!") {
        None
    } else if head.starts_with(b"\x7fELF") {
        match elf_type {
            Some(2 | 3) => None,
            _ => Some("an ELF file but not an executable (an object file or a core dump?)"),
        }
    } else if head.is_empty() {
        Some("empty")
    } else {
        Some("neither an executable (ELF) nor a script starting with a #! line")
    };
    if let Some(what) = what {
        bail!(
            "{} is {what}; give a program to run (a compiled executable, or a script whose first line is #!INTERPRETER)",
            path.display()
        );
    }
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .with_context(|| format!("{} holds a NUL byte", path.display()))?;
    // SAFETY: access with a NUL-terminated path; it only checks permissions.
    if unsafe { libc::access(c.as_ptr(), libc::X_OK) } != 0 {
        bail!(
            "{} is not executable by you: {} (chmod +x it, or run it as a user who may)",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Whether `path` is an ELF executable without an interpreter (the dynamic loader, which
/// is what honours `LD_PRELOAD`).
fn statically_linked(path: &Path) -> bool {
    let Ok(bytes) = std::fs::read(path) else {
        return false;
    };
    match goblin::elf::Elf::parse(&bytes) {
        Ok(elf) => !elf
            .program_headers
            .iter()
            .any(|p| p.p_type == goblin::elf::program_header::PT_INTERP),
        Err(_) => false,
    }
}

/// What `bpftime load` runs: `tool` with the syscall shim preloaded. A statically linked
/// tool (or a script run by one) cannot have the shim preloaded, so its `bpf()` calls
/// would reach the kernel's eBPF: it is refused, never run.
fn load_command(store: &str, tool: &[OsString]) -> Result<Command, UsageError> {
    let command = preload_command(store, SHIM_LIB, tool)?;
    let found = find_program(Path::new(&tool[0])).unwrap_or_else(|| PathBuf::from(&tool[0]));
    let runs = script_interpreter(&found).unwrap_or_else(|| found.clone());
    if statically_linked(&runs) {
        let via = if runs == found {
            String::new()
        } else {
            format!(" (the interpreter of {})", found.display())
        };
        return Err(UsageError(anyhow::anyhow!(
            "{}{via} is statically linked: the syscall shim cannot be preloaded into it, so its bpf() calls would reach the kernel's eBPF; bpftime load does not run it (use a dynamically linked build of the tool, as distributions ship them)",
            runs.display()
        )));
    }
    Ok(command)
}

/// The program a `#!` script names as its interpreter, if `path` is such a script.
fn script_interpreter(path: &Path) -> Option<PathBuf> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(path).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|b| *b == b'\n').next()?;
    let interp = line
        .split(|b| *b == b' ' || *b == b'\t')
        .find(|w| !w.is_empty())?;
    Some(PathBuf::from(
        <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(interp),
    ))
}

/// What `bpftime start` runs: `app` with the agent's starter preloaded, in
/// `store` (also used by `bpftime run`, which starts the app itself).
fn start_command(
    store: &str,
    app: &[OsString],
    profiling: &Profiling,
) -> Result<Command, UsageError> {
    library(AGENT_LIB).map_err(UsageError)?;
    let outputs = profiling.outputs().map_err(UsageError)?;
    let mut command = preload_command(store, AGENT_STARTER_LIB, app)?;
    if let Some(found) = find_program(Path::new(&app[0])).filter(|p| statically_linked(p)) {
        errln!(
            "bpftime: {} is statically linked: no library can be preloaded into it, so it runs without the agent and nothing is attached to it",
            found.display()
        );
    }
    for (_, env, path) in outputs {
        command.env(env, path);
    }
    Ok(command)
}

/// `argv` with `lib` preloaded and `store` named in its environment (the store is
/// made when the command runs: see [`exec`]).
fn preload_command(store: &str, lib: &str, argv: &[OsString]) -> Result<Command, UsageError> {
    let lib = library(lib).map_err(UsageError)?;
    let prog = Path::new(&argv[0]);
    let Some(found) = find_program(prog) else {
        return Err(UsageError(anyhow::anyhow!(
            "{} not found (not a file, and not on PATH)",
            prog.display()
        )));
    };
    check_runnable(&found).map_err(UsageError)?;
    let mut preload = OsString::from(lib.as_os_str());
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|s| !s.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let mut command = Command::new(prog);
    command
        .args(&argv[1..])
        .env("LD_PRELOAD", preload)
        .env(STORE_ENV, store);
    Ok(command)
}

fn list(store: &str, clean: bool) -> Result<()> {
    let store = Store::open(store)?;
    // What nothing refers to any more is gone, as in the kernel; a listing never
    // shows it (`--clean` only says how much there was).
    let removed = bpftime_runtime::collect_garbage(&store);
    if clean {
        outln!("removed {} objects without references", removed.len());
    }
    let owner = |kind, id| {
        store
            .info(kind, id)
            .map(|i| {
                format!(
                    "pid {}{}",
                    i.owner_pid,
                    if i.owner_alive { "" } else { " (exited)" }
                )
            })
            .unwrap_or_default()
    };
    outln!("store {} ({})", store.name(), store.dir().display());
    for id in store.ids(ObjectKind::Map) {
        match Map::open(&store, id) {
            Ok(m) => outln!(
                "map  {id:>5}  type {:<4} key {:<3} value {:<5} max {:<8} {:<16} {}{}",
                m.map_type(),
                m.key_size(),
                m.value_size(),
                m.max_entries(),
                m.name(),
                owner(ObjectKind::Map, id),
                if m.dropped() > 0 {
                    format!("  dropped {}", m.dropped())
                } else {
                    String::new()
                }
            ),
            Err(e) => outln!("map  {id:>5}  unreadable: {e}"),
        }
    }
    for id in store.ids(ObjectKind::Program) {
        match ProgramRecord::read(&store, id) {
            Ok(p) => outln!(
                "prog {id:>5}  type {:<4} insns {:<6} {:<16} {}",
                p.prog_type,
                p.insns.len(),
                p.name,
                owner(ObjectKind::Program, id)
            ),
            Err(e) => outln!("prog {id:>5}  unreadable: {e}"),
        }
    }
    for id in store.ids(ObjectKind::Link) {
        match LinkRecord::read(&store, id) {
            Ok(l) => outln!(
                "link {id:>5}  prog {:<5} {} {}",
                l.prog_id,
                link_target(&l),
                owner(ObjectKind::Link, id)
            ),
            Err(e) => outln!("link {id:>5}  unreadable: {e}"),
        }
    }
    for pin in store.pins() {
        outln!(
            "pin  {}  {} {}",
            pin.path.display(),
            pin.kind.prefix(),
            pin.id
        );
    }
    for id in store.ids(ObjectKind::PerfEvent) {
        match PerfEventRecord::read(&store, id) {
            Ok(e) => outln!(
                "perf {id:>5}  {} {}",
                perf_event_target(&e),
                owner(ObjectKind::PerfEvent, id)
            ),
            Err(e) => outln!("perf {id:>5}  unreadable: {e}"),
        }
    }
    Ok(())
}

/// `uprobe /path/bin:0x1139 pid -1`, `gpu-exit vectorAdd` for a CUDA kernel,
/// `tracepoint syscalls/sys_enter_openat pid -1`.
fn link_target(l: &LinkRecord) -> String {
    if matches!(l.kind, LinkKind::Tracepoint | LinkKind::RawTracepoint) {
        format!("{} {} pid {}", l.kind.label(), l.path, l.pid)
    } else if l.kind.is_gpu() {
        format!("{} {}", l.kind.label(), l.path)
    } else {
        format!(
            "{} {}:{:#x} pid {}",
            l.kind.label(),
            l.path,
            l.offset,
            l.pid
        )
    }
}

/// What a perf event is on: `uprobe /path/bin:0x1139 pid -1`, `kprobe vectorAdd`,
/// `bpf-output cpu 0`.
fn perf_event_target(e: &PerfEventRecord) -> String {
    let label = e.kind.label();
    match e.kind {
        PerfEventKind::Uprobe | PerfEventKind::Uretprobe => {
            format!("{label} {}:{:#x} pid {}", e.path, e.offset, e.pid)
        }
        PerfEventKind::Kprobe
        | PerfEventKind::Kretprobe
        | PerfEventKind::GpuLaunch
        | PerfEventKind::GpuAccess
        | PerfEventKind::GpuSharedAccess => {
            if e.offset == 0 {
                format!("{label} {}", e.path)
            } else {
                format!("{label} {}+{:#x}", e.path, e.offset)
            }
        }
        PerfEventKind::BpfOutput => format!("{label} cpu {}", e.cpu),
        PerfEventKind::Tracepoint => format!("{label} {} pid {}", e.path, e.pid),
    }
}
