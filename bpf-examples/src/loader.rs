//! Helpers shared by the Rust (libbpf-rs) example loaders; the Rust side of
//! `common/loader.h`. They follow the C loaders' conventions: the same
//! options, `ready` on stdout once attached, results after SIGINT/SIGTERM.

use std::fs;
use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::ptr;

use anyhow::{anyhow, bail, Context, Result};
use libbpf_rs::{Link, Map, MapCore, Object, UprobeOpts};

/// The loaders' common command line.
#[derive(Debug, Clone, Default)]
pub struct Args {
    /// `--target`: binary or library to probe.
    pub target: Option<String>,
    /// `--func`: function to probe.
    pub func: Option<String>,
    /// `--obj`: BPF object file to load instead of the embedded one.
    pub obj: Option<PathBuf>,
    /// `--sizes`: extra per-size output (malloc_count).
    pub sizes: bool,
    /// `--verbose`: show libbpf's debug messages.
    pub verbose: bool,
}

/// Parse `argv` (without the program name). `Ok(None)` means `--help` was
/// given and `usage` printed.
pub fn parse_args(argv: impl IntoIterator<Item = String>, usage: &str) -> Result<Option<Args>> {
    let mut args = Args::default();
    let mut argv = argv.into_iter();
    while let Some(arg) = argv.next() {
        // Accept both `--opt value` and `--opt=value`, like getopt_long.
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (arg.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| argv.next())
                .ok_or_else(|| anyhow!("option {name} needs a value\n{usage}"))
        };
        match name.as_str() {
            "--target" | "-t" => args.target = Some(value()?),
            "--func" | "-f" => args.func = Some(value()?),
            "--obj" | "-o" => args.obj = Some(value()?.into()),
            "--sizes" | "-s" => args.sizes = true,
            "--verbose" | "-v" => args.verbose = true,
            "--help" | "-h" => {
                print!("{usage}");
                return Ok(None);
            }
            _ => bail!("unexpected argument: {arg}\n{usage}"),
        }
    }
    Ok(Some(args))
}

/// Send libbpf's messages to stderr, debug ones only when `verbose`.
pub fn setup_libbpf_logging(verbose: bool) {
    bpftime_libbpf_print::to_stderr(verbose);
}

/// Resolve a bare library name ("libc.so.6") to the file this process
/// loaded it from, by reading /proc/self/maps; paths pass through.
pub fn resolve_library(name: &str) -> Result<PathBuf> {
    if name.contains('/') {
        return Ok(name.into());
    }
    let maps = fs::read_to_string("/proc/self/maps").context("reading /proc/self/maps")?;
    maps.lines()
        .filter_map(|line| line.find('/').map(|i| &line[i..]))
        .find(|path| {
            path.rsplit('/')
                .next()
                .is_some_and(|base| base.starts_with(name))
        })
        .map(PathBuf::from)
        .ok_or_else(|| anyhow!("cannot find {name}; pass its path with --target"))
}

/// SIGINT and SIGTERM, blocked so that they stay pending until collected.
/// Create this before attaching, so that no signal is lost.
pub struct ExitSignals {
    set: libc::sigset_t,
}

impl ExitSignals {
    /// Block SIGINT and SIGTERM for this thread (and threads it starts).
    pub fn block() -> Self {
        // SAFETY: plain libc calls on a local, initialised signal set.
        unsafe {
            let mut set = MaybeUninit::<libc::sigset_t>::zeroed().assume_init();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigprocmask(libc::SIG_BLOCK, &set, ptr::null_mut());
            ExitSignals { set }
        }
    }

    /// Sleep until one of the signals arrives.
    pub fn wait(&self) {
        let mut sig = 0;
        // SAFETY: `set` is a valid signal set and `sig` a valid out pointer.
        while unsafe { libc::sigwait(&self.set, &mut sig) } != 0 {}
    }

    /// Collect a pending signal without waiting; true if there was one.
    pub fn pending(&self) -> bool {
        let zero = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: valid set and timeout; we do not want the siginfo.
        unsafe { libc::sigtimedwait(&self.set, ptr::null_mut(), &zero) > 0 }
    }
}

/// Find a map of a loaded object by name.
/// Attaches program `prog` of `obj` as a uprobe (or uretprobe) on `func` in
/// `target`, for every process (pid -1) that maps it; libbpf finds the symbol
/// in the ELF file itself (offset 0 with `func_name`).
pub fn attach_uprobe(
    obj: &Object,
    prog: &str,
    target: &std::path::Path,
    func: &str,
    retprobe: bool,
) -> Result<Link> {
    let p = obj
        .progs_mut()
        .find(|p| p.name() == prog)
        .ok_or_else(|| anyhow!("program '{prog}' not found in object"))?;
    let opts = UprobeOpts {
        func_name: Some(func.to_string()),
        retprobe,
        ..Default::default()
    };
    p.attach_uprobe_with_opts(-1, target, 0, opts)
        .with_context(|| format!("cannot attach uprobe to {}:{func}", target.display()))
}

pub fn find_map<'a>(obj: &'a Object, name: &str) -> Result<Map<'a>> {
    obj.maps()
        .find(|m| m.name() == name)
        .ok_or_else(|| anyhow!("map '{name}' not found in object"))
}

/// Read a native-endian u64 at `offset` of a map key or value.
pub fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[offset..offset + 8]);
    u64::from_ne_bytes(word)
}

/// Read a native-endian u32 at `offset` of a map key or value.
pub fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[offset..offset + 4]);
    u32::from_ne_bytes(word)
}

/// Value of slot `index` of an array map, as raw bytes.
pub fn array_slot(map: &Map<'_>, index: u32) -> Result<Vec<u8>> {
    map.lookup(&index.to_ne_bytes(), libbpf_rs::MapFlags::ANY)
        .with_context(|| format!("cannot read {:?}[{index}]", map.name()))?
        .ok_or_else(|| anyhow!("{:?}[{index}] is missing", map.name()))
}
