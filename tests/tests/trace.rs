//! `--trace FILE`: the timeline a user opens in ui.perfetto.dev, read back by a trace reader
//! we did not write: Chrome DevTools' Performance panel trace engine
//! (`@paulirish/trace_engine`, pinned in tests/trace-consumer, installed by
//! scripts/setup.sh), through tests/trace-consumer/summarize.mjs. Spans are counted against
//! what the targets do by construction, on the thread that made each call, nested as the
//! calls nest.

use bpftime_tests::{examples, run_with_timeout, trace_check, Session};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Calls of each function the targets make per round (stack_target's `drive` calls each
/// of `mid` and `leaf` once per call).
const N: usize = 60;

fn consumer_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("trace-consumer")
}

/// What the consumer made of `trace`.
fn consumer(trace: &Path) -> Value {
    let dir = consumer_dir();
    assert!(
        dir.join("node_modules/@paulirish/trace_engine").is_dir(),
        "the trace consumer is not installed: run scripts/setup.sh (it runs `npm ci` in {})",
        dir.display()
    );
    let out = Command::new("node")
        .arg(dir.join("summarize.mjs"))
        .arg(trace)
        .output()
        .unwrap_or_else(|e| panic!("cannot run node ({e}): run scripts/setup.sh"));
    assert!(
        out.status.success(),
        "the consumer failed on {}: {}",
        trace.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the consumer prints JSON")
}

fn threads(summary: &Value) -> &Vec<Value> {
    summary["threads"].as_array().expect("threads")
}

fn spans_named<'a>(thread: &'a Value, name: &str) -> Vec<&'a Value> {
    thread["spans"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["name"] == name)
        .collect()
}

fn end(span: &Value) -> u64 {
    span["ts"].as_u64().unwrap() + span["dur"].as_u64().unwrap()
}

/// Runs `bpftime ARGS`, checks it succeeded, returns its stderr.
fn bpftime_ok(s: &Session, args: &[&str]) -> String {
    let mut c = s.bpftime();
    c.args(args);
    let out = run_with_timeout(c, Duration::from_secs(120));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{args:?}: {err}");
    err
}

/// `bpftime run --trace TRACE TOOL -- TARGET ARGS`, checked to succeed; its stderr.
fn run_traced(s: &Session, trace: &Path, tool: &str, target: &str, args: &[&str]) -> String {
    let mut all = vec![
        "run",
        "--trace",
        trace.to_str().unwrap(),
        tool,
        "--",
        target,
    ];
    all.extend_from_slice(args);
    bpftime_ok(s, &all)
}

const NESTED_TOOL: &str = r#"
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 8);
	__type(key, __u32);
	__type(value, __u64);
} hits SEC(".maps");

static __always_inline int count(__u32 slot)
{
	__u64 *v = bpf_map_lookup_elem(&hits, &slot);

	if (v)
		__sync_fetch_and_add(v, 1);
	return 0;
}

SEC("uprobe/mid") int mid_entry(struct pt_regs *ctx) { return count(0); }
SEC("uretprobe/mid") int mid_exit(struct pt_regs *ctx) { return count(1); }
SEC("uprobe/leaf") int leaf_entry(struct pt_regs *ctx) { return count(2); }
SEC("uretprobe/leaf") int leaf_exit(struct pt_regs *ctx) { return count(3); }
SEC("uprobe/drive") int drive_entry(struct pt_regs *ctx) { return count(4); }

char LICENSE[] SEC("license") = "GPL";
"#;

/// stack_target calls drive -> top_a|top_b -> mid -> leaf, N times each way. With a uprobe
/// and a uretprobe on mid and leaf, and a uprobe alone on drive: a span per call of mid
/// and of leaf, each leaf inside a mid, an instant per call of drive, all on the main
/// thread, and nothing the consumer cannot place.
#[test]
fn run_traces_each_call_as_a_span_nested_as_the_calls_nest() {
    let s = Session::new("trace-nest");
    let tool = s.compile_bpf("nest", NESTED_TOOL);
    let target = s.target_copy(examples::STACK_TARGET);
    let trace = s.tmp.join("trace.json");
    let n = N.to_string();
    let err = run_traced(
        &s,
        &trace,
        tool.to_str().unwrap(),
        target.to_str().unwrap(),
        &[&n],
    );
    assert!(err.contains("bpftime: trace of "), "{err}");
    let summary = consumer(&trace);
    assert_eq!(summary["consumer"], "@paulirish/trace_engine 0.0.65");
    let with_events: Vec<&Value> = threads(&summary)
        .iter()
        .filter(|t| !t["spans"].as_array().unwrap().is_empty())
        .collect();
    assert_eq!(with_events.len(), 1, "one thread made the calls: {summary}");
    let main = with_events[0];
    // The target is single-threaded: its one thread is the process.
    assert_eq!(main["pid"], main["tid"]);
    assert_eq!(
        main["unplaced"], 0,
        "every event placed in the thread's tree"
    );
    let spans = main["spans"].as_array().unwrap();
    let mids = spans_named(main, "mid");
    let leaves = spans_named(main, "leaf");
    assert_eq!(
        (mids.len(), leaves.len(), spans.len()),
        (2 * N, 2 * N, 4 * N)
    );
    for span in spans {
        assert!(
            span["dur"].as_u64().unwrap() > 0,
            "start before end: {span}"
        );
    }
    for mid in &mids {
        assert_eq!(mid["depth"], 0, "mid is outermost: {mid}");
    }
    for leaf in &leaves {
        let parent = &spans[leaf["parent"].as_u64().expect("leaf has a parent") as usize];
        assert_eq!(parent["name"], "mid", "{leaf} in {parent}");
        assert!(parent["ts"].as_u64() <= leaf["ts"].as_u64() && end(leaf) <= end(parent));
    }
    let drives: Vec<&Value> = main["instants"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["name"] == "drive")
        .collect();
    assert_eq!(drives.len(), 2 * N);
    // Each drive hit comes before the mid call it makes, and after the previous one ends.
    let mut mid_starts: Vec<u64> = mids.iter().map(|m| m["ts"].as_u64().unwrap()).collect();
    mid_starts.sort_unstable();
    let mut drive_times: Vec<u64> = drives.iter().map(|d| d["ts"].as_u64().unwrap()).collect();
    drive_times.sort_unstable();
    for (d, m) in drive_times.iter().zip(&mid_starts) {
        assert!(d < m, "drive at {d} before its mid at {m}");
    }
    let checked =
        trace_check::check(&serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap());
    assert!(checked.problems.is_empty(), "{:?}", checked.problems);
    assert_eq!(checked.launches, 0);
}

const WORK_TOOL: &str = r#"
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>

SEC("uprobe/work") int work_entry(struct pt_regs *ctx) { return 0; }
SEC("uretprobe/work") int work_exit(struct pt_regs *ctx) { return 0; }

char LICENSE[] SEC("license") = "GPL";
"#;

/// `calls N --threads 3`: each worker thread calls work() N times; the main thread never
/// does. Each call is a span on the thread that made it.
#[test]
fn run_traces_each_thread_on_its_own_track() {
    let s = Session::new("trace-threads");
    let tool = s.compile_bpf("work", WORK_TOOL);
    let target = s.target_copy(examples::CALLS);
    let trace = s.tmp.join("trace.json");
    let n = N.to_string();
    run_traced(
        &s,
        &trace,
        tool.to_str().unwrap(),
        target.to_str().unwrap(),
        &[&n, "--threads", "3"],
    );
    let summary = consumer(&trace);
    let workers: Vec<&Value> = threads(&summary)
        .iter()
        .filter(|t| !spans_named(t, "work").is_empty())
        .collect();
    assert_eq!(workers.len(), 3, "{summary}");
    for t in workers {
        assert_ne!(t["pid"], t["tid"], "the main thread made no call: {t}");
        assert_eq!(spans_named(t, "work").len(), N, "{t}");
        assert_eq!(t["unplaced"], 0);
        assert!(
            t["name"]
                .as_str()
                .unwrap_or("")
                .contains(&t["tid"].to_string()),
            "{t}"
        );
    }
}

/// `calls 10 --exit-at 5`: work(5) calls exit. The five calls before it are spans; the
/// one the process ended in is a span to the trace's writing, marked unfinished, and
/// the consumer places it with the others.
#[test]
fn a_call_the_process_exits_in_ends_at_the_exit() {
    let s = Session::new("trace-exit");
    let tool = s.compile_bpf("work", WORK_TOOL);
    let target = s.target_copy(examples::CALLS);
    let trace = s.tmp.join("trace.json");
    let err = run_traced(
        &s,
        &trace,
        tool.to_str().unwrap(),
        target.to_str().unwrap(),
        &["10", "--exit-at", "5"],
    );
    assert!(err.contains("1 call had not returned"), "{err}");
    let raw: Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let works: Vec<&Value> = raw["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == "work")
        .collect();
    assert_eq!(works.len(), 6, "{works:?}");
    let unfinished: Vec<&&Value> = works
        .iter()
        .filter(|e| e["args"]["unfinished"] == true)
        .collect();
    assert_eq!(unfinished.len(), 1, "{works:?}");
    let last = works
        .iter()
        .map(|e| e["ts"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert_eq!(unfinished[0]["ts"].as_f64().unwrap(), last, "the last call");
    let summary = consumer(&trace);
    let main: Vec<&Value> = threads(&summary)
        .iter()
        .filter(|t| !spans_named(t, "work").is_empty())
        .collect();
    assert_eq!(main.len(), 1, "{summary}");
    assert_eq!(spans_named(main[0], "work").len(), 6);
    assert_eq!(main[0]["unplaced"], 0);
}

/// An unmodified libbpf tool (funclatency) under `bpftime load`, the target under
/// `bpftime start --trace`: the tool's uprobe and uretprobe on work() make a span per call.
#[test]
fn start_traces_the_probes_of_an_unmodified_libbpf_tool() {
    let s = Session::new("trace-start");
    let target = s.target_copy(examples::CALLS);
    let t = target.to_str().unwrap();
    let trace = s.tmp.join("trace.json");
    let loader = s.load(&[examples::FUNCLATENCY, "--target", t, "--func", "work"]);
    let out = s.start(&["--trace", trace.to_str().unwrap(), t, &N.to_string()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let (code, lines, lerr) = loader.stop();
    assert_eq!(code, 0, "{lerr}");
    assert_eq!(
        bpftime_tests::field(&lines, "count=", "count"),
        Some(N as u64),
        "the tool saw every call: {lines:?}"
    );
    let summary = consumer(&trace);
    let callers: Vec<&Value> = threads(&summary)
        .iter()
        .filter(|t| !spans_named(t, "work").is_empty())
        .collect();
    assert_eq!(callers.len(), 1, "{summary}");
    assert_eq!(callers[0]["pid"], callers[0]["tid"]);
    assert_eq!(spans_named(callers[0], "work").len(), N);
    assert_eq!(callers[0]["unplaced"], 0);
}

/// A trace asked for in a directory that does not exist is a usage error before anything
/// runs, from `start` and from `run`.
#[test]
fn a_trace_into_a_missing_directory_is_refused_up_front() {
    let s = Session::new("trace-dir");
    let marker = s.tmp.join("ran");
    let missing = s.tmp.join("no/such/dir/trace.json");
    let tool = s.compile_bpf("work", WORK_TOOL);
    for args in [
        vec![
            "start",
            "--trace",
            missing.to_str().unwrap(),
            "touch",
            marker.to_str().unwrap(),
        ],
        vec![
            "run",
            "--trace",
            missing.to_str().unwrap(),
            tool.to_str().unwrap(),
            "--",
            "touch",
            marker.to_str().unwrap(),
        ],
    ] {
        let mut c = s.bpftime();
        c.args(&args);
        let out = run_with_timeout(c, Duration::from_secs(60));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("--trace: the directory") && err.contains("does not exist"),
            "{err}"
        );
        assert!(!marker.exists(), "the target ran: {args:?}");
    }
}

/// The consumer is a real check: spans that overlap without nesting are left out of its
/// tree (counted as unplaced), and a flow without its start is not joined.
#[test]
fn the_consumer_flags_a_broken_trace() {
    let s = Session::new("trace-broken");
    let trace = s.tmp.join("broken.json");
    std::fs::write(
        &trace,
        r#"{"traceEvents":[
{"ph":"X","pid":10,"tid":11,"ts":1000.000,"dur":10.000,"cat":"uprobe","name":"a"},
{"ph":"X","pid":10,"tid":11,"ts":1005.000,"dur":10.000,"cat":"uprobe","name":"b"},
{"ph":"X","pid":1073741824,"tid":1,"ts":1030.000,"dur":5.000,"cat":"launch","name":"k"},
{"ph":"f","bp":"e","pid":1073741824,"tid":1,"ts":1030.000,"cat":"launch","name":"launch","id":7}
],"metadata":{"clock":"CLOCK_MONOTONIC"}}"#,
    )
    .unwrap();
    let summary = consumer(&trace);
    let t = threads(&summary)
        .iter()
        .find(|t| t["tid"] == 11)
        .expect("thread 11");
    assert_eq!(t["unplaced"], 1, "{t}");
    assert_eq!(summary["flows"].as_array().unwrap().len(), 0);
    let checked =
        trace_check::check(&serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap());
    assert!(
        checked
            .problems
            .iter()
            .any(|p| p.contains("flow 7 without a launch")),
        "{:?}",
        checked.problems
    );
}

/// Builds `NAME.cu` of the CUDA examples with nvcc into the session's directory; `None`
/// (said why) where there is no GPU or no nvcc.
fn cuda_example(s: &Session, name: &str, check: &str) -> Option<std::path::PathBuf> {
    if let Err(why) = bpftime_conformance::gpu::check_libcuda() {
        eprintln!("skipped: no GPU here ({why}); scripts/gpu-examples.sh runs this check on the GPU machine (`{check}`)");
        return None;
    }
    let Some(nvcc) = bpftime_gpu_ptx::toolchain::find("nvcc", "NVCC") else {
        eprintln!("skipped: no nvcc to build {name} (scripts/setup.sh installs one)");
        return None;
    };
    let exe = s.tmp.join(name);
    let build = Command::new(&nvcc)
        .arg("-O2")
        .arg("-I")
        .arg(examples::CUDA_SOURCES)
        .arg(Path::new(examples::CUDA_SOURCES).join(format!("{name}.cu")))
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run nvcc");
    assert!(
        build.status.success(),
        "{}",
        String::from_utf8_lossy(&build.stderr)
    );
    Some(exe)
}

/// two_paths under `bpftime run --trace` with gpu_timeline (uprobes on the CPU functions
/// that launch `scale`, probes inside `scale`, a printk among them): every launch joined
/// to its kernel, every GPU line inside its kernel, launch calls before their kernels
/// within the reported bound, kernels of one stream in sequence. Needs a GPU and nvcc;
/// scripts/gpu-examples.sh runs the same check on the GPU machine.
#[test]
fn a_cuda_program_traced_on_cpu_and_gpu() {
    let s = Session::new("trace-gpu");
    let Some(exe) = cuda_example(&s, "two_paths", "timeline of CPU and GPU probes") else {
        return;
    };
    let rounds = 10;
    let trace = s.tmp.join("trace.json");
    let rounds_arg = rounds.to_string();
    run_traced(
        &s,
        &trace,
        examples::GPU_TIMELINE_BPF_O,
        exe.to_str().unwrap(),
        &[&rounds_arg],
    );
    let value: Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let r = trace_check::check(&value);
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    // warm_up, then a prepare_batch and a train_step launch per round.
    let launches = 2 * rounds + 1;
    assert_eq!(
        (r.launches, r.kernels, r.joined),
        (launches, launches, launches)
    );
    assert_eq!((r.gpu_lines, r.gpu_lines_inside), (launches, launches));
    assert_eq!(
        r.cpu_spans.get("train_step(Path&, float*, int)"),
        Some(&rounds)
    );
    if consumer_dir().join("node_modules").is_dir() {
        let summary = consumer(&trace);
        assert_eq!(summary["flows"].as_array().unwrap().len(), launches);
    }
}

/// two_streams under `bpftime run --trace` with gpu_streams: `spin` on two streams at once,
/// a line from every block naming its launch (`tag=K` for the K-th), written while both
/// kernels run. Each line must be on the launch that wrote it, inside its kernel's span.
/// Needs a GPU and nvcc; scripts/gpu-examples.sh runs the same check on the GPU machine.
#[test]
fn lines_of_two_kernels_at_once_land_on_the_launch_that_wrote_them() {
    let s = Session::new("trace-streams");
    let check = "timeline of two kernels at once: lines on the launch that wrote them";
    let Some(exe) = cuda_example(&s, "two_streams", check) else {
        return;
    };
    let trace = s.tmp.join("trace.json");
    let out = run_traced(
        &s,
        &trace,
        examples::GPU_STREAMS_BPF_O,
        exe.to_str().unwrap(),
        &["10"],
    );
    assert!(out.contains("check=ok"), "{out}");
    let value: Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let r = trace_check::check(&value);
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert_eq!((r.launches, r.kernels, r.joined), (20, 20, 20));
    assert_eq!((r.gpu_lines, r.gpu_lines_inside), (160, 160));
    let (tagged, misplaced) = r.misplaced_tags();
    assert_eq!(tagged, 160);
    assert!(misplaced.is_empty(), "{misplaced:?}");
}
