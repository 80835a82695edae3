//! `bpftime attach PID`: loads the agent into a process that is already
//! running, with ptrace (the bpftime-inject crate), and tells it which store
//! to follow.
//!
//! The contract with the library loaded (version [`CONTRACT_VERSION`]):
//!
//! 1. The library declares it with an exported `u32` named
//!    [`CONTRACT_SYMBOL`] holding the version; a library without it is
//!    refused before the process is touched.
//! 2. Before loading it, this command writes the store name (no newline) to
//!    [`bpftime_abi::attach_hint_path`] for the pid as the process sees
//!    itself (`/dev/shm/bpftime-inject-<pid>`), mode 0644.
//! 3. The library is loaded by `dlopen` on a borrowed thread of the process,
//!    which holds the process's loader lock while the constructors run: a
//!    constructor must not wait for another thread (a new thread's first
//!    access to the library's thread-locals takes that lock). The agent is
//!    started on a thread of its own, which gets going once `dlopen` returns.
//! 4. The library takes the store name from the file when it is a plain file
//!    (opened without following a link) owned by root or by its own effective
//!    uid, in preference to `BPFTIME_STORE`. Once attached (first pass over the
//!    store done), it unlinks the file; if it cannot start, it replaces the
//!    contents with `error: <reason>`, only in such a file, never creating one.
//!
//! A store belongs to one user, so the process must run as the user who attaches:
//! the agent opens that user's store of the name given (see the README's threat
//! model); another user's process is refused before it is touched.
//! 5. This command waits for either, up to `--timeout`, then removes the file
//!    in every case.

use bpftime_inject::{InjectError, Target};
use bpftime_runtime::Store;
use goblin::elf::{program_header::PT_LOAD, Elf};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use bpftime_abi::{
    AGENT_DISABLE_ENV as DISABLE_ENV, ATTACH_CONTRACT_SYMBOL as CONTRACT_SYMBOL,
    ATTACH_CONTRACT_VERSION as CONTRACT_VERSION,
};

#[derive(clap::Args)]
pub struct AttachArgs {
    /// The process to load the agent into.
    #[arg(value_parser = clap::value_parser!(i32).range(1..))]
    pid: i32,
    /// Seconds to wait for the agent to report that it has attached.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    timeout: u64,
    /// Load this library instead of the agent beside bpftime (for testing an agent build).
    #[arg(long, value_name = "LIBRARY")]
    agent: Option<PathBuf>,
}

/// An error and its exit status: 2 when the request or the environment is at
/// fault (the process was left untouched), 1 when loading the agent failed.
struct Failure {
    code: u8,
    message: String,
}

fn refused(message: impl std::fmt::Display) -> Failure {
    Failure {
        code: 2,
        message: message.to_string(),
    }
}

fn failed(message: impl std::fmt::Display) -> Failure {
    Failure {
        code: 1,
        message: message.to_string(),
    }
}

impl From<InjectError> for Failure {
    fn from(e: InjectError) -> Failure {
        Failure {
            code: if e.is_refusal() { 2 } else { 1 },
            message: e.to_string(),
        }
    }
}

pub fn main(store: &str, args: AttachArgs) -> ExitCode {
    bpftime_runtime::init_logging();
    match attach(store, &args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            errln!("bpftime: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

fn agent_library(args: &AttachArgs) -> Result<PathBuf, Failure> {
    if let Some(path) = &args.agent {
        if !path.is_file() {
            return Err(refused(format!(
                "{} is not a file (--agent names the library to load)",
                path.display()
            )));
        }
        return Ok(path.clone());
    }
    // The starter loads the agent from its own directory: both must be there.
    crate::library(crate::AGENT_LIB).map_err(|e| refused(format!("{e:#}")))?;
    crate::library(crate::AGENT_STARTER_LIB).map_err(|e| refused(format!("{e:#}")))
}

fn attach(store: &str, args: &AttachArgs) -> Result<(), Failure> {
    let library = agent_library(args)?;
    // The process first (a typo in the pid is the likelier mistake), then the
    // library, both before anything is done to the process.
    Target::check(args.pid)?;
    check_same_user(args.pid)?;
    check_contract(&library)?;
    // Seized but still running; dropping it on an error below detaches.
    let target = Target::attach(args.pid)?;
    if environment_has(args.pid, DISABLE_ENV) {
        return Err(refused(format!(
            "process {} has {DISABLE_ENV} in its environment, which keeps the agent out of it",
            args.pid
        )));
    }
    Store::create_or_open(store)
        .map_err(|e| refused(format!("cannot open the store `{store}`: {e}")))?;
    let hint = bpftime_abi::attach_hint_path(target.pid_in_namespace() as u32);
    write_hint(&hint, store)?;
    let outcome = target
        .load_library(&library)
        .map_err(Failure::from)
        .and_then(|_| wait_until_ready(&hint, args.pid, Duration::from_secs(args.timeout)));
    let _ = std::fs::remove_file(&hint);
    outcome?;
    outln!(
        "attached to process {}: agent running, store `{store}`",
        args.pid
    );
    Ok(())
}

/// Refuses a process of another user: its agent could open only its own user's store,
/// never ours (a store belongs to one user).
fn check_same_user(pid: i32) -> Result<(), Failure> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .and_then(|id| id.parse::<u32>().ok());
    // SAFETY: no preconditions.
    let me = unsafe { libc::geteuid() };
    match euid {
        Some(uid) if uid != me => Err(refused(format!(
            "process {pid} runs as uid {uid} and you as uid {me}; a store belongs to one user, so its agent could not use yours: run `bpftime load` and `bpftime attach` as uid {uid}"
        ))),
        _ => Ok(()),
    }
}

/// Refuses a library that does not declare the contract (loading one that
/// waits in its constructor would hang the process for good).
fn check_contract(library: &Path) -> Result<(), Failure> {
    let data = std::fs::read(library)
        .map_err(|e| refused(format!("cannot read {}: {e}", library.display())))?;
    let elf = Elf::parse(&data).map_err(|e| {
        refused(format!(
            "{} is not a shared library: {e}",
            library.display()
        ))
    })?;
    let version = elf
        .dynsyms
        .iter()
        .filter(|s| s.st_shndx != 0 && s.st_size == 4)
        .find(|s| elf.dynstrtab.get_at(s.st_name) == Some(CONTRACT_SYMBOL))
        .and_then(|s| {
            let ph = elf.program_headers.iter().find(|ph| {
                ph.p_type == PT_LOAD && (ph.p_vaddr..ph.p_vaddr + ph.p_filesz).contains(&s.st_value)
            })?;
            let at = (s.st_value - ph.p_vaddr + ph.p_offset) as usize;
            Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
        });
    match version {
        Some(CONTRACT_VERSION) => Ok(()),
        Some(v) => Err(refused(format!(
            "{} follows version {v} of the attach contract and this bpftime version {CONTRACT_VERSION}; use a bpftime and agent built together",
            library.display()
        ))),
        None => Err(refused(format!(
            "{} cannot be loaded into a running process: it does not export {CONTRACT_SYMBOL} (a build without `bpftime attach` support); start the program with `bpftime start` instead",
            library.display()
        ))),
    }
}

fn environment_has(pid: i32, name: &str) -> bool {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    environ.split(|b| *b == 0).any(|kv| {
        kv.strip_prefix(name.as_bytes())
            .is_some_and(|rest| rest.first() == Some(&b'='))
    })
}

fn write_hint(hint: &Path, store: &str) -> Result<(), Failure> {
    // A file left by an attach that was killed midway is stale.
    match std::fs::remove_file(hint) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(refused(format!(
                "cannot remove the stale {}: {e}; remove it by hand",
                hint.display()
            )))
        }
    }
    let write = || -> std::io::Result<()> {
        // Created here (O_EXCL, which never follows a link), so it is ours.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(hint)?;
        // The name is no secret, and the agent must be able to read it whatever
        // our umask (a target with a real uid other than its effective one).
        f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        f.write_all(store.as_bytes())
    };
    write().map_err(|e| refused(format!("cannot write {}: {e}", hint.display())))
}

/// Waits for the agent to unlink the hint (attached) or to write its error there.
fn wait_until_ready(hint: &Path, pid: i32, timeout: Duration) -> Result<(), Failure> {
    let end = Instant::now() + timeout;
    loop {
        let read = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(hint)
            .and_then(std::io::read_to_string);
        match read {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Ok(text) => {
                if let Some(why) = text.strip_prefix("error: ") {
                    return Err(failed(format!(
                        "the agent was loaded into process {pid} but could not start: {}",
                        why.trim()
                    )));
                }
            }
            Err(_) => {}
        }
        if Instant::now() >= end {
            return Err(failed(format!(
                "the agent was loaded into process {pid} but did not report that it attached within {} s; \
                 look at that process's standard error (BPFTIME_LOG=info in its environment says more)",
                timeout.as_secs()
            )));
        }
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return Err(failed(format!(
                "process {pid} exited before the agent reported that it attached"
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
