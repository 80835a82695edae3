//! `bpftime`: run eBPF tools and their targets in userspace.

use anyhow::{bail, Context, Result};
use bpftime_runtime::{
    LinkRecord, Map, ObjectKind, ProgramRecord, Store, DEFAULT_STORE_NAME, STORE_ENV,
};
use clap::{Parser, Subcommand};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const SHIM_LIB: &str = "libbpftime_syscall_shim.so";
const AGENT_LIB: &str = "libbpftime_agent.so";

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
        /// The target and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        app: Vec<OsString>,
    },
    /// Show what the store holds.
    List {
        /// Remove objects whose owning tool has exited.
        #[arg(long)]
        clean: bool,
    },
}

/// Usage and environment errors exit 2; the traced thing failing exits 1.
struct UsageError(anyhow::Error);

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.command {
        Cmd::Load { tool } => exec_with(&cli.store, SHIM_LIB, &tool),
        Cmd::Start { app } => exec_with(&cli.store, AGENT_LIB, &app),
        Cmd::List { clean } => list(&cli.store, clean).map_err(UsageError),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(UsageError(e)) => {
            eprintln!("bpftime: {e:#}");
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

/// Replaces this process with `argv`, `lib` preloaded: signals and the exit
/// status are then the program's own.
fn exec_with(store: &str, lib: &str, argv: &[OsString]) -> Result<(), UsageError> {
    let lib = library(lib).map_err(UsageError)?;
    let prog = Path::new(&argv[0]);
    if find_program(prog).is_none() {
        return Err(UsageError(anyhow::anyhow!(
            "{} not found (not a file, and not on PATH)",
            prog.display()
        )));
    }
    Store::create_or_open(store)
        .with_context(|| format!("cannot open the store `{store}`"))
        .map_err(UsageError)?;
    let mut preload = OsString::from(lib.as_os_str());
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|s| !s.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let err = Command::new(prog)
        .args(&argv[1..])
        .env("LD_PRELOAD", preload)
        .env(STORE_ENV, store)
        .exec();
    Err(UsageError(anyhow::anyhow!(
        "cannot run {}: {err}",
        prog.display()
    )))
}

fn list(store: &str, clean: bool) -> Result<()> {
    let store = Store::open(store)?;
    if clean {
        let removed = store.collect_garbage();
        println!("removed {} objects of exited tools", removed.len());
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
    println!("store {} ({})", store.name(), store.dir().display());
    for id in store.ids(ObjectKind::Map) {
        match Map::open(&store, id) {
            Ok(m) => println!(
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
            Err(e) => println!("map  {id:>5}  unreadable: {e}"),
        }
    }
    for id in store.ids(ObjectKind::Program) {
        match ProgramRecord::read(&store, id) {
            Ok(p) => println!(
                "prog {id:>5}  type {:<4} insns {:<6} {:<16} {}",
                p.prog_type,
                p.insns.len(),
                p.name,
                owner(ObjectKind::Program, id)
            ),
            Err(e) => println!("prog {id:>5}  unreadable: {e}"),
        }
    }
    for id in store.ids(ObjectKind::Link) {
        match LinkRecord::read(&store, id) {
            Ok(l) => println!(
                "link {id:>5}  prog {:<5} {:?} {}:{:#x} pid {} {}",
                l.prog_id,
                l.kind,
                l.path,
                l.offset,
                l.pid,
                owner(ObjectKind::Link, id)
            ),
            Err(e) => println!("link {id:>5}  unreadable: {e}"),
        }
    }
    Ok(())
}
