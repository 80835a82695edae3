//! `ringbuf_events_rs`: the `ringbuf_events` example loader, written with
//! libbpf-rs (libbpf vendored and linked statically) instead of C.
//!
//! It loads the same `ringbuf_events.bpf.o` (embedded; `--obj` loads another
//! file), takes the same options and prints the same output as the C loader:
//!
//! ```text
//! ready                                        once the uprobe is attached
//! event pid=<tgid> tid=<tid> arg=<arg> ts=<ns> via=<reserve|output>
//! events=<n>                                   after SIGINT/SIGTERM
//! dropped=<n>
//! ```

use std::cell::Cell;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bpftime_bpf_examples::loader::{
    array_slot, attach_uprobe, find_map, parse_args, resolve_library, setup_libbpf_logging, u32_at,
    u64_at, Args, ExitSignals,
};
use libbpf_rs::{ObjectBuilder, RingBufferBuilder};

/// The BPF object built by `make`, embedded so the binary stands alone.
const OBJECT: &[u8] = include_bytes!(env!("BPF_EXAMPLES_RINGBUF_EVENTS_BPF_O"));

const USAGE: &str = "\
Usage: ringbuf_events_rs --target BINARY --func NAME [--obj FILE] [--verbose]
Prints an event line for every call of NAME in BINARY until
SIGINT/SIGTERM, then the number of events.
";

/// `struct event` from ringbuf_events.h:
/// { u32 pid; u32 tid; s64 arg; u64 ts; u32 path; u32 pad; }
const EVENT_SIZE: usize = 32;
/// `enum event_path`: 0 = reserve/submit, 1 = bpf_ringbuf_output.
const PATH_RESERVE: u32 = 0;

fn format_event(data: &[u8]) -> String {
    let via = if u32_at(data, 24) == PATH_RESERVE {
        "reserve"
    } else {
        "output"
    };
    format!(
        "event pid={} tid={} arg={} ts={} via={via}",
        u32_at(data, 0),
        u32_at(data, 4),
        u64_at(data, 8) as i64,
        u64_at(data, 16)
    )
}

fn run(args: Args) -> Result<()> {
    let (Some(target), Some(func)) = (args.target.as_deref(), args.func.as_deref()) else {
        bail!("--target and --func are required");
    };
    let target = resolve_library(target)?;
    setup_libbpf_logging(args.verbose);

    let mut builder = ObjectBuilder::default();
    let open = match &args.obj {
        Some(path) => builder
            .open_file(path)
            .with_context(|| format!("cannot open BPF object {}", path.display()))?,
        None => builder
            .name("ringbuf_events")?
            .open_memory(OBJECT)
            .context("cannot open the embedded BPF object")?,
    };
    let obj = open.load().context("cannot load BPF object")?;
    let events = find_map(&obj, "events")?;
    let dropped = find_map(&obj, "dropped")?;

    // Called by libbpf for every record; prints it and counts it.
    let count = Cell::new(0u64);
    let stdout = std::io::stdout();
    let mut rb = RingBufferBuilder::new();
    rb.add(&events, |data: &[u8]| {
        if data.len() < EVENT_SIZE {
            eprintln!("short event: {} bytes", data.len());
            return 0;
        }
        // A closed stdout is not worth stopping the poll loop for.
        let _ = writeln!(stdout.lock(), "{}", format_event(data));
        count.set(count.get() + 1);
        0
    })?;
    let rb = rb.build().context("cannot set up the ring buffer")?;

    let signals = ExitSignals::block();
    let link = attach_uprobe(&obj, "on_call", &target, func, false)?;

    {
        let mut out = stdout.lock();
        writeln!(out, "ready")?;
        out.flush()?;
    }

    // Poll in short slices, checking for a pending SIGINT/SIGTERM between.
    while !signals.pending() {
        rb.poll(Duration::from_millis(100))
            .context("ring_buffer__poll")?;
    }

    // Stop producing, then drain what is still in the ring.
    drop(link);
    rb.consume().context("ring_buffer__consume")?;
    let lost = u64_at(&array_slot(&dropped, 0)?, 0);
    let mut out = stdout.lock();
    writeln!(out, "events={}", count.get())?;
    writeln!(out, "dropped={lost}")?;
    out.flush()?;
    Ok(())
}

fn main() -> ExitCode {
    match parse_args(std::env::args().skip(1), USAGE) {
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(args)) if args.target.is_none() || args.func.is_none() => {
            eprint!("--target and --func are required\n{USAGE}");
            ExitCode::from(2)
        }
        Ok(Some(args)) => match run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("ringbuf_events_rs: {err:#}");
                ExitCode::FAILURE
            }
        },
        Err(err) => {
            eprintln!("{err}");
            ExitCode::from(2)
        }
    }
}
