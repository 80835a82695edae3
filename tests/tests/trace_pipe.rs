//! `bpf_printk` output under bpftime, read with `bpftime trace-pipe` as the
//! kernel's is read from `/sys/kernel/tracing/trace_pipe`: the same record
//! layout, records in order, and reading consumes them.
//!
//! The kernel is not used as the oracle here: its trace pipe is one buffer
//! for the whole machine (other programs write to it and reading it consumes
//! their records), and tracefs is not mounted everywhere.

mod support;

use bpftime_tests::{examples, Session};
use std::process::Command;
use support::Driven;

fn monotonic_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// One record line, split as the kernel lays it out:
/// `<comm right-aligned in 16>-<pid left-aligned in 7> [<cpu, 3 digits>] <flags> <secs>.<usecs>: bpf_trace_printk: <msg>`.
#[derive(Debug)]
struct Record {
    comm: String,
    pid: u32,
    cpu: u32,
    ts: f64,
    msg: String,
}

fn not_a_record<T>(line: &str) -> T {
    panic!("not a trace pipe record: {line:?}")
}

fn parse(line: &str) -> Record {
    let (head, msg) = line
        .split_once(": bpf_trace_printk: ")
        .unwrap_or_else(|| not_a_record(line));
    let (task, rest) = head.split_once(" [").unwrap_or_else(|| not_a_record(line));
    let (comm, pid) = task
        .trim_end()
        .rsplit_once('-')
        .unwrap_or_else(|| not_a_record(line));
    let (cpu, rest) = rest.split_once("] ").unwrap_or_else(|| not_a_record(line));
    let (flags, ts) = rest.split_once(' ').unwrap_or_else(|| not_a_record(line));
    assert_eq!(flags, ".....", "{line:?}");
    let (secs, usecs) = ts
        .trim()
        .split_once('.')
        .unwrap_or_else(|| not_a_record(line));
    assert_eq!(usecs.len(), 6, "{line:?}");
    let r = Record {
        comm: comm.trim_start().to_string(),
        pid: pid.parse().unwrap_or_else(|_| not_a_record(line)),
        cpu: cpu.parse().unwrap_or_else(|_| not_a_record(line)),
        ts: format!("{secs}.{usecs}")
            .parse()
            .unwrap_or_else(|_| not_a_record(line)),
        msg: msg.to_string(),
    };
    // The widths, re-rendered: the layout itself must be the kernel's.
    let again = format!(
        "{:>16}-{:<7} [{:03}] ..... {:>5}.{}: bpf_trace_printk: {}",
        r.comm, r.pid, r.cpu, secs, usecs, r.msg
    );
    assert_eq!(again, line);
    r
}

/// Runs the target under `bpftime start` and returns its pid (start replaces
/// itself with the target, so the child's pid is the target's).
fn run_target(s: &Session, target: &str, n: u32) -> u32 {
    let mut c = s.bpftime();
    c.args(["start", target, &n.to_string()]);
    let mut child = c.spawn().expect("start target");
    let pid = child.id();
    assert!(child.wait().unwrap().success());
    pid
}

/// The records (and empty lines) that `n` calls of work(0..n) print.
fn expected_messages(n: u32) -> Vec<String> {
    (0..n)
        .flat_map(|i| {
            [
                format!("call arg={i}"),
                format!("four {i} {} {} {}", i + 1, i + 2, i + 3),
                String::new(),
            ]
        })
        .collect()
}

fn read_lines(reader: &mut Driven, count: usize) -> Vec<String> {
    let mut lines = Vec::new();
    while lines.len() < count {
        lines.push(reader.wait_for(""));
    }
    lines
}

#[test]
fn printk_records_stream_in_the_kernels_layout_and_are_consumed_once() {
    let s = Session::new("tracepipe");
    let t = s.target_copy(examples::CALLS);
    let t = t.to_str().unwrap();
    let mut trace_cmd = s.bpftime();
    trace_cmd.arg("trace-pipe");
    // Started before anything prints, as `cat trace_pipe` usually is.
    let mut reader = Driven::spawn(trace_cmd);
    let tool = s.load(&[examples::PRINTK, "--target", t, "--func", "work"]);

    let before = monotonic_secs();
    let pid = run_target(&s, t, 3);
    let after = monotonic_secs();
    let lines = read_lines(&mut reader, 9);
    let mut messages = Vec::new();
    let mut last_ts = 0.0;
    for line in &lines {
        if line.is_empty() {
            // The kernel ends every record with a newline, so a message that
            // has its own is followed by an empty line.
            messages.push(String::new());
            continue;
        }
        let r = parse(line);
        assert_eq!(r.comm, "calls", "{line}");
        assert_eq!(r.pid, pid, "the calling thread's id: {line}");
        assert!(r.cpu < bpftime_runtime::possible_cpus(), "{line}");
        assert!(
            r.ts >= last_ts && r.ts >= before - 1e-6 && r.ts <= after + 1e-6,
            "timestamp {} outside the run [{before}, {after}] or out of order",
            r.ts
        );
        last_ts = r.ts;
        messages.push(r.msg);
    }
    assert_eq!(messages, expected_messages(3));

    // What the first reader read is gone: a second reader sees only new records.
    reader.kill();
    run_target(&s, t, 1);
    let mut trace_cmd = s.bpftime();
    trace_cmd.arg("trace-pipe");
    let mut second = Driven::spawn(trace_cmd);
    let lines = read_lines(&mut second, 3);
    let messages: Vec<String> = lines
        .iter()
        .map(|l| {
            if l.is_empty() {
                String::new()
            } else {
                parse(l).msg
            }
        })
        .collect();
    assert_eq!(messages, expected_messages(1));
    second.kill();
    let (code, _, err) = tool.stop();
    assert_eq!(code, 0, "{err}");
}

#[test]
fn trace_pipe_of_a_store_name_that_is_invalid_fails_with_exit_2() {
    let out = Command::new(bpftime_tests::bpftime())
        .args(["--store", "no/such", "trace-pipe"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("store name"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
