//! `malloc_count_rs`: the `malloc_count` example loader, written with
//! libbpf-rs (libbpf vendored and linked statically) instead of C.
//!
//! It loads the same `malloc_count.bpf.o` (embedded in the binary; `--obj`
//! loads another file), takes the same options and prints the same output
//! as the C loader:
//!
//! ```text
//! ready                                  once the uprobe is attached
//! pid=<tgid> calls=<n> bytes=<sum>       after SIGINT/SIGTERM, per process
//! pid=<tgid> size=<bytes> calls=<n>      only with --sizes
//! total calls=<n> bytes=<sum>            always last
//! ```

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result};
use bpftime_bpf_examples::loader::{
    array_slot, attach_uprobe, find_map, parse_args, resolve_library, setup_libbpf_logging, u32_at,
    u64_at, Args, ExitSignals,
};
use libbpf_rs::{MapCore, MapFlags, Object, ObjectBuilder};

/// The BPF object built by `make`, embedded so the binary stands alone.
const OBJECT: &[u8] = include_bytes!(env!("BPF_EXAMPLES_MALLOC_COUNT_BPF_O"));

const USAGE: &str = "\
Usage: malloc_count_rs [--target LIB] [--func NAME] [--obj FILE] [--sizes] [--verbose]
Counts calls to LIB's malloc (default libc.so.6) and the bytes asked for,
per process, until SIGINT/SIGTERM; then prints the counts.
";

/// Print the maps in the documented format (see the module docs).
fn print_maps(obj: &Object, sizes: bool, out: &mut impl Write) -> Result<()> {
    // per_pid: u32 tgid -> struct malloc_stats { u64 calls; u64 bytes; }
    let per_pid = find_map(obj, "per_pid")?;
    for key in per_pid.keys() {
        if let Some(value) = per_pid.lookup(&key, MapFlags::ANY)? {
            let (calls, bytes) = (u64_at(&value, 0), u64_at(&value, 8));
            writeln!(out, "pid={} calls={calls} bytes={bytes}", u32_at(&key, 0))?;
        }
    }
    if sizes {
        // per_size: struct size_key { u32 tgid; u32 pad; u64 size; } -> u64
        let per_size = find_map(obj, "per_size")?;
        for key in per_size.keys() {
            if let Some(value) = per_size.lookup(&key, MapFlags::ANY)? {
                let (tgid, size) = (u32_at(&key, 0), u64_at(&key, 8));
                writeln!(out, "pid={tgid} size={size} calls={}", u64_at(&value, 0))?;
            }
        }
    }
    // totals: an array with one struct malloc_stats.
    let total = array_slot(&find_map(obj, "totals")?, 0)?;
    writeln!(
        out,
        "total calls={} bytes={}",
        u64_at(&total, 0),
        u64_at(&total, 8)
    )?;
    Ok(())
}

fn run(args: Args) -> Result<()> {
    let target = resolve_library(args.target.as_deref().unwrap_or("libc.so.6"))?;
    let func = args.func.as_deref().unwrap_or("malloc");
    setup_libbpf_logging(args.verbose);

    let mut builder = ObjectBuilder::default();
    let open = match &args.obj {
        Some(path) => builder
            .open_file(path)
            .with_context(|| format!("cannot open BPF object {}", path.display()))?,
        None => builder
            .name("malloc_count")?
            .open_memory(OBJECT)
            .context("cannot open the embedded BPF object")?,
    };
    let obj = open.load().context("cannot load BPF object")?;

    let signals = ExitSignals::block();
    let link = attach_uprobe(&obj, "count_malloc", &target, func, false)?;

    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "ready")?;
    stdout.flush()?;

    signals.wait();
    // Stop counting before we read, so the numbers hold still.
    drop(link);

    print_maps(&obj, args.sizes, &mut stdout)?;
    stdout.flush()?;
    Ok(())
}

fn main() -> ExitCode {
    match parse_args(std::env::args().skip(1), USAGE) {
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(args)) => match run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("malloc_count_rs: {err:#}");
                ExitCode::FAILURE
            }
        },
        Err(err) => {
            eprintln!("{err}");
            ExitCode::from(2)
        }
    }
}
