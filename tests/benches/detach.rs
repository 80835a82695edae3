//! Detaching restores the uninstrumented cost: one target process, measured
//! before a tool is loaded, while a late-attached counting uprobe runs in it,
//! and after the tool exited and the agent took the hook out again; and the
//! same target without bpftime at all, as the plain baseline.
//!
//! The target is `bench_calls --windows`, which calls `work()` without end and
//! prints the mean cost of one call for every window of `WINDOW_MS`, in the
//! calling thread's CPU time (time spent descheduled on a shared machine is
//! left out; the agent's own threads are too). The plain baseline is a second
//! copy of it started without bpftime, running alongside the whole time on the
//! same CPU (this process pins itself to one before starting anything, and its
//! children inherit that): the machine's load drifts over seconds and differs
//! between CPUs, and the windows the plain copy timed during each phase say
//! what that CPU gave a plain loop then. The tool is the
//! `globals` skeleton loader (a uprobe on `work()` counting calls in `.bss`),
//! loaded with `bpftime load` after the target started. Phases begin when the
//! target's code says so: the hook's jump at `work()` for (b), the file's own
//! bytes back for (c); windows that started before that (and during one
//! settling window) are dropped.
//!
//! Run: `cargo build --release --workspace --bins --lib && cargo bench -p
//! bpftime-tests --bench detach`. Prints Markdown tables of medians and
//! ratios; timings are reported, never asserted.

#[path = "../tests/support/mod.rs"]
mod support;

use bpftime_tests::{examples, field, Session};
use std::process::Command;
use support::{code_in_file, code_in_memory, hex_field, wait_until, Driven};

const WINDOW_MS: u64 = 100;
/// Windows kept per phase.
const WINDOWS: usize = 40;

fn monotonic_ns() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 * 1e9 + ts.tv_nsec as f64
}

fn value_of(line: &str, key: &str) -> f64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in the target's line `{line}`"))
}

/// One line of `bench_calls --windows`.
struct Window {
    start_ns: f64,
    ns_per_call: f64,
}

/// A `bench_calls --windows` process and its windows, read in order.
struct Timed {
    process: Driven,
    /// A window read past the end of the last span asked for.
    pending: Option<Window>,
}

impl Timed {
    fn spawn(mut c: Command) -> (Timed, u64) {
        c.args(["--windows", &WINDOW_MS.to_string()]);
        let mut process = Driven::spawn(c);
        let work = hex_field(&process.wait_for("work="), "work");
        let t = Timed {
            process,
            pending: None,
        };
        (t, work)
    }

    fn next(&mut self) -> Window {
        self.pending.take().unwrap_or_else(|| {
            let line = self.process.wait_for("window ");
            Window {
                start_ns: value_of(&line, "start_ns"),
                ns_per_call: value_of(&line, "ns_per_call"),
            }
        })
    }

    /// The next `n` windows that started after one settling window from now.
    fn phase(&mut self, n: usize) -> Vec<Window> {
        let since = monotonic_ns() + WINDOW_MS as f64 * 1e6;
        let mut v = Vec::with_capacity(n);
        while v.len() < n {
            let w = self.next();
            if w.start_ns >= since {
                v.push(w);
            }
        }
        v
    }

    /// ns per call of the windows that started at the same times as `phase`'s.
    fn alongside(&mut self, phase: &[Window]) -> Vec<f64> {
        let first = phase.first().expect("a phase has windows").start_ns;
        let last = phase.last().expect("a phase has windows").start_ns;
        let mut v = Vec::new();
        loop {
            let w = self.next();
            if w.start_ns > last {
                self.pending = Some(w);
                return v;
            }
            if w.start_ns >= first {
                v.push(w.ns_per_call);
            }
        }
    }

    fn finish(self, what: &str) {
        let (status, _, err) = self.process.finish();
        assert!(status.success(), "{what} failed: {err}");
    }
}

fn costs(phase: &[Window]) -> Vec<f64> {
    phase.iter().map(|w| w.ns_per_call).collect()
}

fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[((s.len() - 1) as f64 * q).round() as usize]
}

fn median(v: &[f64]) -> f64 {
    quantile(v, 0.5)
}

/// Pins this process, and so everything it starts later, to the last CPU it
/// may run on; returns that CPU.
fn pin_to_one_cpu() -> usize {
    // SAFETY: cpu_set_t is plain data; the affinity calls read and write the
    // set we own, for this process only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let size = std::mem::size_of::<libc::cpu_set_t>();
        assert_eq!(
            libc::sched_getaffinity(0, size, &mut set),
            0,
            "sched_getaffinity"
        );
        let cpu = (0..libc::CPU_SETSIZE as usize)
            .rev()
            .find(|&c| libc::CPU_ISSET(c, &set))
            .expect("this process may run on some CPU");
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, size, &set),
            0,
            "sched_setaffinity"
        );
        cpu
    }
}

fn main() {
    // `cargo test --benches` runs bench binaries without `--bench`: this one
    // takes about 20 s, so it runs only when asked for as a benchmark.
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("detach: skipped outside `cargo bench` (it runs for about 20 s)");
        return;
    }
    let cpu = pin_to_one_cpu();
    let s = Session::new("detach-bench");
    let target = s.target_copy(examples::BENCH_CALLS);
    let target = target.to_str().expect("UTF-8 temp path");

    let (mut plain, _) = Timed::spawn(Command::new(target));
    let mut start = s.bpftime();
    start.args(["start", target]);
    let (mut app, work) = Timed::spawn(start);
    let pid = app.process.pid();
    let original = code_in_file(pid, work, 8);
    // The agent starts with the process; give it a few windows to settle.
    std::thread::sleep(std::time::Duration::from_millis(3 * WINDOW_MS));
    let before = app.phase(WINDOWS);

    let mut tool_cmd = s.bpftime();
    tool_cmd.args([
        "load",
        examples::GLOBALS,
        "--target",
        target,
        "--func",
        "work",
    ]);
    let mut tool = Driven::spawn(tool_cmd);
    tool.wait_for("ready");
    wait_until("the agent hooks work()", || {
        code_in_memory(pid, work, 1) == [0xe9]
    });
    let attached = app.phase(WINDOWS);
    let (status, rest, err) = tool.finish();
    assert!(status.success(), "tool failed: {err}");
    let counted = field(&rest, "calls=", "calls").unwrap_or(0);
    assert!(
        counted > 0,
        "the tool counted no call, so (b) measured no probe: {rest:?}"
    );

    wait_until("the agent unhooks work()", || {
        code_in_memory(pid, work, 8) == original
    });
    let after = app.phase(WINDOWS);
    app.finish("target under bpftime");

    let plain_before = plain.alongside(&before);
    let plain_attached = plain.alongside(&attached);
    let plain_after = plain.alongside(&after);
    plain.finish("plain target");

    let (a, b, c) = (
        median(&costs(&before)),
        median(&costs(&attached)),
        median(&costs(&after)),
    );
    let (da, db, dc) = (
        median(&plain_before),
        median(&plain_attached),
        median(&plain_after),
    );
    let all_plain: Vec<f64> = [plain_before, plain_attached, plain_after].concat();
    let d = median(&all_plain);
    println!(
        "{WINDOWS} windows of {WINDOW_MS} ms per phase, on CPU {cpu}; the plain target timed {} \
         windows alongside; the tool counted {counted} calls while attached",
        all_plain.len()
    );
    println!();
    println!(
        "| phase | ns per call (median) | interquartile range | plain target at the same time | phase / plain |"
    );
    println!("|---|---|---|---|---|");
    for (name, v, p) in [
        ("(a) `bpftime start`, nothing attached", &before, da),
        (
            "(b) counting uprobe attached late (`globals`)",
            &attached,
            db,
        ),
        ("(c) after the tool exited and detached", &after, dc),
    ] {
        let v = costs(v);
        println!(
            "| {name} | {:.2} | {:.2} - {:.2} | {p:.2} | {:.2}x |",
            median(&v),
            quantile(&v, 0.25),
            quantile(&v, 0.75),
            median(&v) / p
        );
    }
    println!(
        "| (d) no bpftime, all phases | {d:.2} | {:.2} - {:.2} | | |",
        quantile(&all_plain, 0.25),
        quantile(&all_plain, 0.75)
    );
    println!();
    println!("| ratio | of medians | each phase against the plain target at its time |");
    println!("|---|---|---|");
    println!("| (c)/(a) | {:.2}x | {:.2}x |", c / a, (c / dc) / (a / da));
    println!("| (c)/(d) | {:.2}x | {:.2}x |", c / d, c / dc);
    println!("| (b)/(a) | {:.1}x | {:.1}x |", b / a, (b / db) / (a / da));
    println!("| (a)/(d) | {:.2}x | {:.2}x |", a / d, a / da);
}
