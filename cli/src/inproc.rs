//! Loading an object with libbpf inside bpftime, with the syscall shim serving
//! libbpf's calls (for `bpftime run` and `bpftime verify`).
//!
//! bpftime re-executes itself into a hidden subcommand with
//! `libbpftime_syscall_shim.so` preloaded. Why not link the shim in: libbpf
//! reaches the kernel through libc's `syscall`, `mmap`, `epoll_*` and `close`,
//! and the preload is what puts the shim in front of them, so the loader gets
//! exactly the path every `bpftime load` tool gets (dup tracking, ring buffer
//! wake-ups and all). Interposing those symbols from the bpftime executable
//! itself would also capture them for `load`, `start` and `list`. The parent
//! stays outside the shim: it waits, passes the exit status on, and cleans up
//! the store even when the loader dies.

use anyhow::{anyhow, bail, Context, Result};
use bpftime_runtime::{Store, STORE_ENV};
use std::ffi::OsString;
use std::process::{Command, ExitCode, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};

/// The app must not inherit the shim: the parent keeps the user's own
/// `LD_PRELOAD` here, and the loader puts it back before starting anything.
use bpftime_abi::USER_LD_PRELOAD_ENV as USER_PRELOAD_ENV;
/// The shim's own warnings (libbpf's probes it refuses, the rejected program's
/// log that libbpf prints anyway) would bury the report: unless the user set
/// `BPFTIME_LOG`, the loader gets errors only, and the app the default again.
const LOG_ENV: &str = "BPFTIME_LOG";
const QUIET_MARK_ENV: &str = "BPFTIME_RUN_QUIET_SHIM";
static QUIETED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    if sig == libc::SIGTERM {
        let child = CHILD.load(Ordering::Relaxed);
        if child > 0 {
            // SAFETY: kill is async-signal-safe; the pid is our own child.
            unsafe { libc::kill(child, libc::SIGTERM) };
        }
    }
}

/// Ctrl-C reaches the whole foreground group: the app stops, and we stay to
/// report and clean up. SIGTERM sent to us alone is passed on to `child`
/// (the loader's child is the app). A handler, not
/// SIG_IGN, so that programs started later get the default back at exec.
pub fn forward_signals_to(child: u32) {
    CHILD.store(child as i32, Ordering::Relaxed);
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        for sig in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: a zeroed sigaction with a plain handler that only does
            // async-signal-safe work.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
                sa.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut sa.sa_mask);
                libc::sigaction(sig, &sa, std::ptr::null_mut());
            }
        }
    });
}

/// An exit status as a shell reports it: the code, or 128 + the signal.
pub fn exit_code(status: ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1);
    ExitCode::from(code.clamp(0, 255) as u8)
}

/// Removes what a run left in the store: the whole store when this run
/// created it, otherwise only objects of processes that have exited.
pub struct StoreCleanup {
    name: String,
    existed: bool,
}

impl StoreCleanup {
    /// Opens the store `name`, creating it if needed, with the store's own checks:
    /// before the loader starts, so that a bad store stops the command before libbpf
    /// does anything.
    pub fn create(name: &str) -> Result<StoreCleanup> {
        let existed = Store::dir_for(name).join("store").exists();
        Store::create_or_open(name).with_context(|| format!("cannot open the store `{name}`"))?;
        Ok(StoreCleanup {
            name: name.to_string(),
            existed,
        })
    }
}

impl Drop for StoreCleanup {
    fn drop(&mut self) {
        if self.existed {
            if let Ok(store) = Store::open(&self.name) {
                bpftime_runtime::collect_garbage(&store);
            }
        } else {
            let _ = std::fs::remove_dir_all(Store::dir_for(&self.name));
        }
    }
}

/// Runs `bpftime --store STORE <args>` with the shim preloaded, and waits.
pub fn run_with_shim(store: &str, args: &[OsString]) -> Result<ExitStatus> {
    let shim = crate::library(crate::SHIM_LIB)?;
    let exe = std::env::current_exe().context("cannot find the bpftime executable")?;
    let user_preload = std::env::var_os("LD_PRELOAD").unwrap_or_default();
    let mut preload = OsString::from(shim.as_os_str());
    if !user_preload.is_empty() {
        preload.push(":");
        preload.push(&user_preload);
    }
    let mut command = Command::new(exe);
    command
        .arg("--store")
        .arg(store)
        .args(args)
        .env("LD_PRELOAD", preload)
        .env(USER_PRELOAD_ENV, &user_preload)
        .env(STORE_ENV, store);
    if std::env::var_os(LOG_ENV).is_none() {
        command.env(LOG_ENV, "error").env(QUIET_MARK_ENV, "1");
    }
    let mut child = command.spawn().context("cannot start bpftime's loader")?;
    forward_signals_to(child.id());
    let status = child.wait().context("waiting for bpftime's loader")?;
    CHILD.store(0, Ordering::Relaxed);
    Ok(status)
}

/// In the loader: checks that the shim serves this process (so nothing
/// reaches the kernel), and gives programs we start the user's `LD_PRELOAD`.
pub fn enter_loader() -> Result<()> {
    keep_libbpf_handler_api();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    if !maps.contains(crate::SHIM_LIB) {
        bail!("this is an internal command of `bpftime run` and `bpftime verify`; use those");
    }
    match std::env::var_os(USER_PRELOAD_ENV) {
        Some(v) if !v.is_empty() => std::env::set_var("LD_PRELOAD", v),
        _ => std::env::remove_var("LD_PRELOAD"),
    }
    std::env::remove_var(USER_PRELOAD_ENV);
    if std::env::var_os(QUIET_MARK_ENV).is_some() {
        QUIETED.store(true, Ordering::Relaxed);
        std::env::remove_var(QUIET_MARK_ENV);
    }
    Ok(())
}

/// The shim registers its `cuda:` section handler in this executable's static
/// libbpf, found in our symbol table, before `main`. bpftime never calls these
/// two functions itself, and the linker drops what nothing refers to: this
/// reference keeps them, so that `run` and `verify` take `cuda:` sections.
fn keep_libbpf_handler_api() {
    std::hint::black_box([
        libbpf_rs::libbpf_sys::libbpf_register_prog_handler as *const () as usize,
        libbpf_rs::libbpf_sys::bpf_program__set_type as *const () as usize,
    ]);
}

/// Gives a program the loader starts the environment the user gave bpftime.
pub fn user_environment(command: &mut Command) {
    if QUIETED.load(Ordering::Relaxed) {
        command.env_remove(LOG_ENV);
    }
}

/// Checks that `path` looks like a file we can hand to libbpf.
pub fn check_object(path: &std::path::Path) -> Result<()> {
    let bytes = std::fs::read(path).map_err(|e| anyhow!("cannot read {}: {e}", path.display()))?;
    if !bytes.starts_with(b"\x7fELF") {
        bail!(
            "{} is not an ELF object; give a BPF object built with `clang -target bpf -g -c prog.bpf.c`",
            path.display()
        );
    }
    // e_machine at offset 18: EM_BPF is 247.
    let machine = bytes.get(18..20).map(|b| u16::from_le_bytes([b[0], b[1]]));
    if machine != Some(247) {
        bail!(
            "{} is an ELF file but not a BPF object (machine {:?}); build it with `clang -target bpf`",
            path.display(),
            machine.unwrap_or(0)
        );
    }
    Ok(())
}
