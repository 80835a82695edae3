//! `bpftime run` and `bpftime verify` on the bundled examples: exact counts,
//! every event, the histogram, the app's exit status, and the errors a user
//! gets for a rejected program, a missing file or function, or no target.

use bpftime_tests::kernel_version::{self, Row, Version};
use bpftime_tests::{examples, function_symbols, Session};
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const N: u64 = 1000;

struct Outcome {
    code: Option<i32>,
    stdout: Vec<String>,
    stderr: String,
}

impl Outcome {
    fn context(&self) -> String {
        format!(
            "exit {:?}\nstdout:\n{}\nstderr:\n{}",
            self.code,
            self.stdout.join("\n"),
            self.stderr
        )
    }

    /// The value of `name[key]: value` lines whose key part contains `key`.
    fn entry(&self, name: &str, key: &str) -> Option<String> {
        self.stdout.iter().find_map(|l| {
            let rest = l.strip_prefix(&format!("{name}["))?;
            let (k, v) = rest.split_once("]: ")?;
            k.contains(key).then(|| v.to_string())
        })
    }
}

/// Runs bpftime to completion. Its output goes to files, not pipes: a run
/// prints more than a pipe holds, and nobody reads the pipe until it exits.
fn bpftime(s: &Session, args: &[&str]) -> Outcome {
    bpftime_env(s, args, &[])
}

/// [`bpftime`] with `env` added to its environment.
fn bpftime_env(s: &Session, args: &[&str], env: &[(&str, &str)]) -> Outcome {
    bpftime_within(s, args, env, Duration::from_secs(120))
}

/// [`bpftime_env`], killed and failed after `limit`.
fn bpftime_within(s: &Session, args: &[&str], env: &[(&str, &str)], limit: Duration) -> Outcome {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let n = RUNS.fetch_add(1, Ordering::Relaxed);
    let (out_path, err_path) = (
        s.tmp.join(format!("stdout-{n}")),
        s.tmp.join(format!("stderr-{n}")),
    );
    let mut c = s.bpftime();
    c.args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).unwrap())
        .stderr(File::create(&err_path).unwrap());
    let mut child = c.spawn().expect("spawn bpftime");
    let end = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "timed out: {c:?}\nstderr: {}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |p: &PathBuf| String::from_utf8_lossy(&std::fs::read(p).unwrap()).into_owned();
    Outcome {
        code: status.code(),
        stdout: read(&out_path).lines().map(str::to_string).collect(),
        stderr: read(&err_path),
    }
}

/// `bpftime run OBJECT [extra...] -- <private copy of calls> N`.
fn run_on_calls(s: &Session, object: &str, extra: &[&str]) -> Outcome {
    run_on_calls_env(s, object, extra, &[])
}

fn run_on_calls_env(s: &Session, object: &str, extra: &[&str], env: &[(&str, &str)]) -> Outcome {
    let calls = s.target_copy(examples::CALLS);
    let n = N.to_string();
    let mut args = vec!["run", object];
    args.extend_from_slice(extra);
    args.extend(["--", calls.to_str().unwrap(), n.as_str()]);
    bpftime_env(s, &args, env)
}

fn assert_store_removed(s: &Session) {
    assert!(
        !bpftime_runtime::Store::dir_for(&s.store).exists(),
        "the store of the run was left behind"
    );
}

/// The numbers in a histogram's bucket lines (`[lo, hi)   count |@@@|`).
fn histogram_counts(out: &Outcome, map: &str) -> Vec<u64> {
    let start = out
        .stdout
        .iter()
        .position(|l| l.starts_with(&format!("{map} (log2 histogram")))
        .unwrap_or_else(|| panic!("no histogram for {map}\n{}", out.context()));
    out.stdout[start + 1..]
        .iter()
        .take_while(|l| l.starts_with('['))
        .map(|l| {
            let (_, after) = l.split_once(')').expect("bucket label");
            let count = after.split_whitespace().next().expect("count");
            assert!(l.ends_with('|'), "bar missing: {l}");
            count.parse().expect("bucket count")
        })
        .collect()
}

#[test]
fn run_funclatency_counts_every_call_and_draws_the_histogram() {
    let s = Session::new("run-funclat");
    let out = run_on_calls(&s, examples::FUNCLATENCY_BPF_O, &[]);
    assert_eq!(out.code, Some(0), "{}", out.context());
    // stats: [0] completed calls, [2] returns without an entry.
    assert_eq!(
        out.entry("stats", "0").as_deref(),
        Some("1000"),
        "{}",
        out.context()
    );
    assert_eq!(
        out.entry("stats", "2").as_deref(),
        Some("0"),
        "{}",
        out.context()
    );
    let buckets = histogram_counts(&out, "hist");
    assert!(!buckets.is_empty());
    assert_eq!(buckets.iter().sum::<u64>(), N, "{}", out.context());
    assert!(
        out.stderr.contains("attached func_entry (uprobe)")
            && out.stderr.contains("attached func_exit (uretprobe)"),
        "{}",
        out.context()
    );
    assert_store_removed(&s);
}

#[test]
fn run_malloc_count_on_libc_decodes_struct_keys_and_values() {
    let s = Session::new("run-malloc");
    let out = run_on_calls(&s, examples::MALLOC_COUNT_BPF_O, &[]);
    assert_eq!(out.code, Some(0), "{}", out.context());
    let size_key = format!("size={} }}", examples::CALLS_MALLOC_SIZE);
    assert_eq!(
        out.entry("per_size", &size_key).as_deref(),
        Some("1000"),
        "exactly N mallocs of the target's size: {}",
        out.context()
    );
    // Only the app runs the program: its one per_pid entry is the total.
    let totals = out.entry("totals", "0").expect("totals[0]");
    assert!(totals.starts_with("{ calls="), "{totals}");
    let per_pid: Vec<&String> = out
        .stdout
        .iter()
        .filter(|l| l.starts_with("per_pid["))
        .collect();
    assert_eq!(per_pid.len(), 1, "{}", out.context());
    assert!(
        per_pid[0].ends_with(&format!(": {totals}")),
        "{}",
        out.context()
    );
    assert_store_removed(&s);
}

#[test]
fn run_ringbuf_events_prints_every_event_as_it_arrives() {
    let s = Session::new("run-ringbuf");
    let out = run_on_calls(&s, examples::RINGBUF_EVENTS_BPF_O, &[]);
    assert_eq!(out.code, Some(0), "{}", out.context());
    // Each record printed field by field from the object's BTF (struct event { pid tid
    // arg ts path pad }): `arg` is the argument of work().
    let args: Vec<u64> = out
        .stdout
        .iter()
        .filter(|l| l.starts_with("event events 32B struct event { pid="))
        .map(|l| {
            let arg = l.split_once(" arg=").expect("an arg field").1;
            arg.split(' ').next().unwrap().parse().expect("arg")
        })
        .collect();
    assert_eq!(
        args,
        (0..N).collect::<Vec<_>>(),
        "every call once, in order"
    );
    assert!(out
        .stdout
        .contains(&"events (ringbuf): 1000 events".to_string()));
    assert_eq!(out.entry("dropped", "0").as_deref(), Some("0"));
    assert_store_removed(&s);
}

#[test]
fn run_globals_counts_every_call_in_its_global_variables() {
    let s = Session::new("run-globals");
    let out = run_on_calls(&s, examples::GLOBALS_BPF_O, &[]);
    assert_eq!(out.code, Some(0), "{}", out.context());
    assert!(
        out.stderr.contains("attached count_call (uprobe) -> ")
            && out.stderr.contains("/calls:work"),
        "{}",
        out.context()
    );
    // Every section, each variable under its own: the .rodata filter off
    // (-1), the .data weight 1, and in .bss one count per call of work(i).
    let want = [
        "globals.rodata (global variables):",
        "parity: -1",
        "globals.data (global variables):",
        "weight: 1",
        "globals.bss (global variables):",
        &format!("calls: {N}"),
        &format!("sum: {N}"),
        &format!("last_arg: {}", N - 1),
        "last_weight: 1",
    ];
    assert_eq!(out.stdout, want, "{}", out.context());
    assert_store_removed(&s);
}

#[test]
fn run_printk_prints_every_record_as_the_trace_pipe_shows_it() {
    let s = Session::new("run-printk");
    let out = run_on_calls(&s, examples::PRINTK_BPF_O, &[]);
    assert_eq!(out.code, Some(0), "{}", out.context());
    // Two records per call, in call order, each ended by a newline as the
    // kernel's trace pipe ends them: the second has its own, so an empty line
    // follows it.
    let at = out
        .stdout
        .iter()
        .position(|l| l == "printk.rodata (global variables):")
        .unwrap_or_else(|| panic!("no maps printed: {}", out.context()));
    let (records, maps) = out.stdout.split_at(at);
    let mut want = Vec::new();
    for i in 0..N {
        want.push(format!("call arg={i}"));
        want.push(format!("four {i} {} {} {}", i + 1, i + 2, i + 3));
        want.push(String::new());
    }
    let messages: Vec<String> = records
        .iter()
        .map(|l| match l.split_once(": bpf_trace_printk: ") {
            Some((head, msg)) => {
                assert!(head.trim_start().starts_with("calls-"), "{l}");
                msg.to_string()
            }
            None => {
                assert!(l.is_empty(), "not a trace pipe line: {l:?}");
                String::new()
            }
        })
        .collect();
    assert_eq!(messages, want);
    assert_eq!(
        maps,
        [
            "printk.rodata (global variables):",
            "____on_call.____fmt: \"call arg=%d\"",
            "____on_call.___fmt: \"four %d %d %d %d\\n\"",
        ],
        "{}",
        out.context()
    );
    assert_store_removed(&s);
}

/// One trace of a stack trace map as `bpftime run` prints it, and the file
/// each frame named.
fn printed_traces(out: &Outcome, map: &str) -> HashMap<u32, (Vec<String>, Vec<String>)> {
    let start = out
        .stdout
        .iter()
        .position(|l| l.starts_with(&format!("{map} (stack_trace, ")))
        .unwrap_or_else(|| panic!("no stack trace map {map}: {}", out.context()));
    let mut traces: HashMap<u32, (Vec<String>, Vec<String>)> = HashMap::new();
    let mut current = None;
    for line in &out.stdout[start + 1..] {
        if let Some(frame) = line.strip_prefix("    ") {
            let (func, file) = frame
                .strip_suffix(')')
                .and_then(|f| f.split_once(" ("))
                .unwrap_or_else(|| panic!("not a frame: {line:?}"));
            let t = traces
                .get_mut(current.as_ref().expect("a frame before any id"))
                .unwrap();
            t.0.push(func.to_string());
            t.1.push(file.to_string());
        } else if let Some(id) = line
            .strip_prefix(&format!("{map}["))
            .and_then(|r| r.strip_suffix("]:"))
        {
            let id: u32 = id.parse().expect("stack id");
            traces.insert(id, Default::default());
            current = Some(id);
        } else {
            break;
        }
    }
    traces
}

#[test]
fn run_stacks_prints_stack_trace_maps_as_symbolized_user_frames() {
    let s = Session::new("run-stacks");
    let target = s.target_copy(examples::STACK_TARGET);
    let t = target.to_str().unwrap();
    let n = 3u64;
    let out = bpftime(
        &s,
        &["run", examples::STACKS_BPF_O, "--", t, &n.to_string()],
    );
    assert_eq!(out.code, Some(0), "{}", out.context());
    for attached in [
        "attached on_entry (uprobe) -> ",
        "attached on_return (uretprobe) -> ",
        "attached on_outer_return (uretprobe) -> ",
    ] {
        assert!(out.stderr.contains(attached), "{}", out.context());
    }
    // mid's uretprobe (on_outer_return) is pending under every stack taken in
    // leaf, and must not show: every frame is the real caller, at the offset
    // of its return address (or of leaf's entry), in stack_target itself.
    let syms = function_symbols(t);
    let file = std::fs::canonicalize(&target).unwrap();
    let traces = printed_traces(&out, "stacks");
    let mut chains: Vec<Vec<String>> = traces
        .values()
        .map(|(frames, files)| {
            assert!(
                files.iter().all(|f| Path::new(f) == file),
                "{files:?} {}",
                out.context()
            );
            frames
                .iter()
                .map(|f| f.split('+').next().unwrap().to_string())
                .collect()
        })
        .collect();
    chains.sort();
    let chain = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    assert_eq!(
        chains,
        vec![
            chain(&["leaf", "mid", "top_a", "drive"]),
            chain(&["leaf", "mid", "top_b", "drive"]),
            chain(&["mid", "top_a", "drive", "main"]),
            chain(&["mid", "top_b", "drive", "main"]),
        ],
        "{}",
        out.context()
    );
    // The offsets are those of the addresses the ring buffer events carry
    // (struct stack_event: at_return, arg, len, frames[4], ...), named with nm.
    let name = |ip: u64| -> String {
        let (func, (addr, _)) = syms
            .iter()
            .find(|(_, &(addr, size))| ip >= addr && ip < addr + size)
            .unwrap_or_else(|| panic!("{ip:#x} is in no function of {t}"));
        format!("{func}+{}", ip - addr)
    };
    let mut from_events: Vec<Vec<String>> = out
        .stdout
        .iter()
        .filter(|l| l.starts_with("event events 80B "))
        .map(|l| {
            let words: Vec<u64> = l
                .split_once("u64[")
                .expect("u64 dump")
                .1
                .split(']')
                .next()
                .unwrap()
                .split(' ')
                .map(|w| w.parse().unwrap())
                .collect();
            words[2..6].iter().map(|&ip| name(ip)).collect()
        })
        .collect();
    assert_eq!(from_events.len(), 4 * n as usize, "{}", out.context());
    from_events.sort();
    from_events.dedup();
    let mut printed: Vec<Vec<String>> = traces.values().map(|t| t.0.clone()).collect();
    printed.sort();
    assert_eq!(printed, from_events, "{}", out.context());
    // The ids bpf_get_stackid answered at leaf's entry (what=0), each for n
    // calls, are those of the two traces that start in leaf.
    let mut entry_ids: Vec<String> = traces
        .iter()
        .filter(|(_, t)| t.0[0] == "leaf+0")
        .map(|(id, _)| id.to_string())
        .collect();
    entry_ids.sort();
    let mut answered: Vec<String> = out
        .stdout
        .iter()
        .filter_map(|l| {
            let id = l
                .strip_prefix("results[{ what=0 ret=")?
                .strip_suffix(&format!(" }}]: {n}"))?;
            Some(id.to_string())
        })
        .collect();
    answered.sort();
    assert_eq!(answered, entry_ids, "{}", out.context());
    // Every return of mid is counted (what=9).
    assert_eq!(
        out.entry("results", "what=9 ret=0").as_deref(),
        Some(&*(2 * n).to_string()),
        "{}",
        out.context()
    );
    assert_store_removed(&s);
}

#[test]
fn run_passes_the_apps_exit_status_on() {
    let s = Session::new("run-status");
    let out = bpftime(
        &s,
        &[
            "run",
            examples::MALLOC_COUNT_BPF_O,
            "--",
            "/bin/sh",
            "-c",
            "exit 7",
        ],
    );
    assert_eq!(out.code, Some(7), "{}", out.context());
    assert!(out
        .stdout
        .iter()
        .any(|l| l.starts_with("totals[0]: { calls=")));
    assert_store_removed(&s);
}

#[test]
fn run_prints_the_verifier_log_of_a_rejected_program_and_exits_1() {
    let s = Session::new("run-rejected");
    let out = run_on_calls(&s, examples::REJECTED_BPF_O, &[]);
    assert_eq!(out.code, Some(1), "{}", out.context());
    assert!(
        out.stderr.contains("BEGIN PROG LOAD LOG"),
        "{}",
        out.context()
    );
    assert!(
        out.stderr
            .contains("R0 invalid mem access 'map_value_or_null'"),
        "{}",
        out.context()
    );
    assert!(
        !out.stderr.contains("exited"),
        "the app must not run when loading fails: {}",
        out.context()
    );
    assert!(out.stdout.is_empty(), "{}", out.context());
    assert_store_removed(&s);
}

#[test]
fn run_with_a_missing_target_file_or_function_exits_2_with_the_reason() {
    let s = Session::new("run-missing");
    let out = run_on_calls(
        &s,
        examples::FUNCLATENCY_BPF_O,
        &["--attach", "func_entry=/no/such/binary:work"],
    );
    assert_eq!(out.code, Some(2), "{}", out.context());
    assert!(
        out.stderr.contains(
            "program `func_entry`: the probe's target file /no/such/binary does not exist"
        ),
        "{}",
        out.context()
    );
    let out = run_on_calls(
        &s,
        examples::FUNCLATENCY_BPF_O,
        &["--attach", "func_exit=no_such_function"],
    );
    assert_eq!(out.code, Some(2), "{}", out.context());
    assert!(
        out.stderr
            .contains("program `func_exit`: no function `no_such_function`"),
        "{}",
        out.context()
    );
    assert!(out.stdout.is_empty(), "{}", out.context());
    let out = run_on_calls(&s, examples::FUNCLATENCY_BPF_O, &["--attach", "nope=work"]);
    assert_eq!(out.code, Some(2), "{}", out.context());
    assert!(
        out.stderr.contains("no program `nope`"),
        "{}",
        out.context()
    );
    assert_store_removed(&s);
}

#[test]
fn run_attach_moves_a_probe_to_another_function() {
    let s = Session::new("run-retarget");
    // malloc_count's program, moved from libc's malloc to the app's work().
    let out = run_on_calls(
        &s,
        examples::MALLOC_COUNT_BPF_O,
        &["--attach", "count_malloc=work"],
    );
    assert_eq!(out.code, Some(0), "{}", out.context());
    let totals = out.entry("totals", "0").expect("totals[0]");
    // work(i) gets i as its first argument: N calls and 0 + 1 + ... + (N-1) "bytes".
    assert_eq!(
        totals,
        format!("{{ calls={N} bytes={} }}", N * (N - 1) / 2),
        "{}",
        out.context()
    );
}

/// Compiles a one-function BPF object with clang, as the Makefile does.
fn compile(s: &Session, name: &str, source: &str) -> Option<PathBuf> {
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang-19".into());
    let src = s.tmp.join(format!("{name}.bpf.c"));
    let obj = s.tmp.join(format!("{name}.bpf.o"));
    std::fs::write(&src, source).unwrap();
    match Command::new(&clang)
        .args(["-g", "-O2", "-target", "bpf", "-c"])
        .arg(&src)
        .arg("-o")
        .arg(&obj)
        .output()
    {
        Ok(o) if o.status.success() => Some(obj),
        Ok(o) => panic!("{clang} failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            eprintln!("skipped: cannot run {clang}: {e}");
            None
        }
    }
}

fn program_in_section(section: &str) -> String {
    format!(
        "__attribute__((section(\"{section}\"), used)) int probe(void *ctx) {{ return 0; }}\n\
         char LICENSE[] __attribute__((section(\"license\"), used)) = \"GPL\";\n"
    )
}

#[test]
fn run_refuses_a_program_whose_section_names_no_target() {
    let s = Session::new("run-notarget");
    let Some(obj) = compile(&s, "bare", &program_in_section("uprobe")) else {
        return;
    };
    let out = run_on_calls(&s, obj.to_str().unwrap(), &[]);
    assert_eq!(out.code, Some(2), "{}", out.context());
    assert!(
        out.stderr
            .contains("program `probe`: SEC(\"uprobe\") names no target"),
        "{}",
        out.context()
    );
    // The same object runs once --attach names the target.
    let out = run_on_calls(&s, obj.to_str().unwrap(), &["--attach", "probe=work"]);
    assert_eq!(out.code, Some(0), "{}", out.context());
}

#[test]
fn run_takes_paths_and_offsets_from_the_section() {
    let s = Session::new("run-sections");
    let calls = s.target_copy(examples::CALLS);
    let section = format!("uprobe/{}:no_such_function", calls.display());
    let Some(obj) = compile(&s, "missing_sym", &program_in_section(&section)) else {
        return;
    };
    let out = bpftime(&s, &["run", obj.to_str().unwrap(), "--", "/bin/true"]);
    assert_eq!(out.code, Some(2), "{}", out.context());
    assert!(
        out.stderr.contains("no function `no_such_function`"),
        "{}",
        out.context()
    );
    let Some(obj) = compile(
        &s,
        "missing_file",
        &program_in_section("uretprobe//no/such/lib.so:f"),
    ) else {
        return;
    };
    let out = bpftime(&s, &["run", obj.to_str().unwrap(), "--", "/bin/true"]);
    assert_eq!(out.code, Some(2), "{}", out.context());
    assert!(
        out.stderr.contains("/no/such/lib.so does not exist"),
        "{}",
        out.context()
    );
    // libbpf's `path:func+offset` form, in the app named by its path.
    let section = format!("uprobe/{}:work+0", calls.display());
    let Some(obj) = compile(&s, "offset", &program_in_section(&section)) else {
        return;
    };
    let out = bpftime(
        &s,
        &[
            "run",
            obj.to_str().unwrap(),
            "--",
            calls.to_str().unwrap(),
            "3",
        ],
    );
    assert_eq!(out.code, Some(0), "{}", out.context());
    assert!(
        out.stderr.contains("attached probe (uprobe) -> "),
        "{}",
        out.context()
    );
}

/// A perf event array, global variables and bpf_trace_printk, which the
/// examples do not use: each call of work() sends { arg, magic } and counts
/// itself in `hits`; the global `last` puts `struct sample` into the object's
/// BTF; work(7) prints a line.
const PERF_AND_GLOBALS: &str = r#"
typedef unsigned long long u64;
struct sample { u64 arg; u64 magic; };
struct {
	int (*type)[4];
	int (*key_size)[4];
	int (*value_size)[4];
} samples __attribute__((section(".maps"), used));
u64 hits __attribute__((used));
struct sample last __attribute__((used));
static long (*perf_event_output)(void *ctx, void *map, u64 flags, void *data, u64 size) = (void *)25;
static long (*trace_printk)(const char *fmt, unsigned int fmt_size, ...) = (void *)6;
__attribute__((section("uprobe/work"), used)) int sample_work(void *ctx)
{
	/* 112: the first argument's register in struct pt_regs (x86-64). */
	struct sample s = { .arg = *(u64 *)((char *)ctx + 112), .magic = 0xfeed };
	__sync_fetch_and_add(&hits, 1);
	last = s;
	perf_event_output(ctx, &samples, 0xffffffffULL, &s, sizeof(s));
	if (s.arg == 7) {
		char fmt[] = "work(%llu)\n";
		trace_printk(fmt, sizeof(fmt), s.arg);
	}
	return 0;
}
char LICENSE[] __attribute__((section("license"), used)) = "GPL";
"#;

#[test]
fn run_streams_perf_buffer_events_decoded_with_btf_and_prints_globals() {
    let s = Session::new("run-perf");
    let Some(obj) = compile(&s, "perf", PERF_AND_GLOBALS) else {
        return;
    };
    let out = run_on_calls(&s, obj.to_str().unwrap(), &[]);
    assert_eq!(out.code, Some(0), "{}", out.context());
    // A perf record carries 4 bytes of padding after the 16-byte sample. Each
    // CPU has its own buffer, so calls made on different CPUs may come out of order.
    let mut args: Vec<u64> = out
        .stdout
        .iter()
        .filter(|l| l.starts_with("event samples "))
        .map(|l| {
            let arg = l
                .strip_prefix("event samples 20B struct sample { arg=")
                .and_then(|r| r.strip_suffix(" magic=65261 }"))
                .unwrap_or_else(|| panic!("unexpected event line {l:?}"));
            arg.parse().expect("arg")
        })
        .collect();
    args.sort_unstable();
    assert_eq!(args, (0..N).collect::<Vec<_>>(), "{}", out.context());
    assert!(out
        .stdout
        .contains(&"samples (perf_event_array): 1000 events".to_string()));
    assert!(
        out.stdout
            .contains(&"perf.bss (global variables):".to_string()),
        "{}",
        out.context()
    );
    assert!(
        out.stdout.contains(&"hits: 1000".to_string()),
        "{}",
        out.context()
    );
    assert!(
        out.stdout
            .contains(&"last: { arg=999 magic=65261 }".to_string()),
        "{}",
        out.context()
    );
    let printed: Vec<&String> = out
        .stdout
        .iter()
        .filter(|l| l.contains("bpf_trace_printk: "))
        .collect();
    assert_eq!(printed.len(), 1, "{}", out.context());
    assert!(
        printed[0].ends_with("bpf_trace_printk: work(7)"),
        "{printed:?}"
    );
    assert!(
        out.stdout
            .iter()
            .any(|l| l.ends_with("(string constants): \"work(%llu)\\n\"")),
        "{}",
        out.context()
    );
}

/// Loads every program of `object` into the kernel with bpftool, when the
/// kernel can serve as the oracle: Some(the log) when it refuses, Some("")
/// when it accepts.
fn kernel_verdict(s: &Session, object: &str) -> Option<String> {
    if let Some(why) = bpftime_tests::kernel_bpffs_unavailable() {
        eprintln!("kernel comparison skipped: {why}");
        return None;
    }
    let pins = std::path::Path::new("/sys/fs/bpf").join(format!("bpftime-{}", s.store));
    let out = match Command::new("bpftool")
        .args(["prog", "loadall", object])
        .arg(&pins)
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            eprintln!("kernel comparison skipped: cannot run bpftool: {e}");
            return None;
        }
    };
    let _ = std::fs::remove_dir_all(&pins);
    if out.status.success() {
        Some(String::new())
    } else {
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            log.contains("BEGIN PROG LOAD LOG"),
            "bpftool failed otherwise: {log}"
        );
        Some(log)
    }
}

fn verify(s: &Session, args: &[&str]) -> Outcome {
    let mut all = vec!["verify"];
    all.extend_from_slice(args);
    bpftime(s, &all)
}

#[test]
fn verify_accepts_every_example() {
    let s = Session::new("verify-ok");
    let cases: [(&str, &[&str]); 3] = [
        (examples::FUNCLATENCY_BPF_O, &["func_entry", "func_exit"]),
        (examples::MALLOC_COUNT_BPF_O, &["count_malloc"]),
        (examples::RINGBUF_EVENTS_BPF_O, &["on_call"]),
    ];
    for (object, progs) in cases {
        if let Some(log) = kernel_verdict(&s, object) {
            assert_eq!(log, "", "the kernel refuses {object}");
        }
        let out = verify(&s, &[object]);
        assert_eq!(out.code, Some(0), "{object}: {}", out.context());
        assert_eq!(out.stdout.len(), progs.len(), "{}", out.context());
        for (line, prog) in out.stdout.iter().zip(progs) {
            let n: u64 = line
                .strip_prefix(&format!("{prog}: ok ("))
                .and_then(|r| r.strip_suffix(" insns processed)"))
                .unwrap_or_else(|| panic!("unexpected line {line:?}"))
                .parse()
                .unwrap();
            assert!(n > 0, "{line}");
        }
    }
}

#[test]
fn verify_accepts_every_bpf_examples_object_the_kernel_accepts() {
    let s = Session::new("verify-all");
    let objects = examples::ARTIFACTS
        .iter()
        .filter(|a| a.ends_with(".bpf.o") && **a != "rejected.bpf.o");
    for name in objects {
        let object = examples::artifact(name);
        let object = object.to_str().unwrap();
        if let Some(log) = kernel_verdict(&s, object) {
            assert_eq!(log, "", "the kernel refuses {object}");
        }
        let out = verify(&s, &[object]);
        assert_eq!(out.code, Some(0), "{object}: {}", out.context());
        assert!(!out.stdout.is_empty());
        for line in &out.stdout {
            assert!(
                line.contains(": ok (") && line.ends_with(" insns processed)"),
                "{object}: {line}"
            );
        }
    }
}

#[test]
fn verify_rejects_the_bad_program_with_the_log_and_exits_1() {
    let s = Session::new("verify-bad");
    let out = verify(&s, &[examples::REJECTED_BPF_O]);
    assert_eq!(out.code, Some(1), "{}", out.context());
    assert!(
        out.stdout[0].starts_with("read_without_check: rejected"),
        "{}",
        out.context()
    );
    let text = out.stdout.join("\n");
    let reason = "R0 invalid mem access 'map_value_or_null'";
    assert!(text.contains("call bpf_map_lookup_elem"), "{text}");
    assert!(text.contains(reason), "{text}");
    // The object carries BTF line info (-g): the log names the failing source
    // line, `; <text> @ <file>:<line>`, right before the failing instruction.
    let source = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../bpf-examples/rejected/rejected.bpf.c"
    );
    let source = std::fs::read_to_string(source).expect("rejected.bpf.c");
    let failing = source
        .lines()
        .position(|l| l.trim() == "return *value;")
        .expect("rejected.bpf.c dereferences `value`")
        + 1;
    let source_line = format!("; return *value; @ rejected.bpf.c:{failing}");
    let at = out
        .stdout
        .iter()
        .position(|l| l.trim() == source_line)
        .unwrap_or_else(|| panic!("no `{source_line}` in:\n{text}"));
    assert!(
        out.stdout[at + 1..]
            .iter()
            .take_while(|l| !l.contains(reason))
            .all(|l| !l.starts_with("; ")),
        "the source line must precede the failing instruction: {text}"
    );
    if let Some(log) = kernel_verdict(&s, examples::REJECTED_BPF_O) {
        assert!(
            log.contains(reason),
            "the kernel refuses it otherwise: {log}"
        );
        assert!(
            log.contains(&source_line),
            "the kernel names the same source line: {log}"
        );
    }
}

#[test]
fn verify_v_prints_the_full_log_of_accepted_programs() {
    let s = Session::new("verify-v");
    let quiet = verify(&s, &["--prog", "on_call", examples::RINGBUF_EVENTS_BPF_O]);
    let full = verify(
        &s,
        &["-v", "--prog", "on_call", examples::RINGBUF_EVENTS_BPF_O],
    );
    assert_eq!(full.code, Some(0), "{}", full.context());
    assert_eq!(quiet.stdout.len(), 1, "{}", quiet.context());
    assert_eq!(full.stdout[0], quiet.stdout[0]);
    // Every instruction of the program appears in the level-2 log.
    assert!(
        full.stdout.iter().any(|l| l.starts_with("0: (")),
        "{}",
        full.context()
    );
    assert!(full
        .stdout
        .iter()
        .any(|l| l.contains("call bpf_ringbuf_reserve")));
}

#[test]
fn verify_bad_input_exits_2() {
    let s = Session::new("verify-usage");
    let out = verify(&s, &["--prog", "nope", examples::MALLOC_COUNT_BPF_O]);
    assert_eq!(out.code, Some(2), "{}", out.context());
    assert!(
        out.stderr
            .contains("no program `nope`; it has: count_malloc"),
        "{}",
        out.context()
    );
    let out = verify(&s, &[examples::CALLS]);
    assert_eq!(out.code, Some(2), "{}", out.context());
    assert!(out.stderr.contains("not a BPF object"), "{}", out.context());
    let out = verify(&s, &["/no/such/file.bpf.o"]);
    assert_eq!(out.code, Some(2), "{}", out.context());
    assert!(
        out.stderr.contains("cannot read /no/such/file.bpf.o"),
        "{}",
        out.context()
    );
}

/// bpftime's GPU programs (a `kprobe/<kernel>` named `cuda__*`) verify under the
/// GPU rules, with the GPU helpers the CPU does not have.
#[test]
fn verify_accepts_the_gpu_example_under_gpu_rules() {
    let s = Session::new("verify-gpu");
    // Not in `examples::ARTIFACTS`, which the kernel must accept: it has no GPU helpers.
    let object = std::path::Path::new(examples::BUILD_DIR).join("gpu_block_count.bpf.o");
    assert!(
        object.is_file(),
        "{} is missing: run `make -C bpf-examples`",
        object.display()
    );
    let out = verify(&s, &[object.to_str().unwrap()]);
    assert_eq!(out.code, Some(0), "{}", out.context());
    assert_eq!(out.stdout.len(), 1, "{}", out.context());
    assert!(
        out.stdout[0].starts_with("cuda__block_starts: ok ("),
        "{}",
        out.context()
    );
    // A `cuda:` exit probe writing its records to a ring buffer, and to a perf event array.
    for object in [
        examples::KERNELRETSNOOP_BPF_O,
        examples::KERNELRETSNOOP_PERF_BPF_O,
    ] {
        let out = verify(&s, &[object]);
        assert_eq!(out.code, Some(0), "{object}: {}", out.context());
        assert!(
            out.stdout.len() == 1 && out.stdout[0].starts_with("thread_exit: ok ("),
            "{object}: {}",
            out.context()
        );
    }
}

/// The shim prints nothing of its own into the tool's terminal for what the kernel
/// answers silently: where libbpf probes a command bpftime does not serve (on the GPU
/// machine's 6.18 kernel it asks for BPF_TOKEN_CREATE, command 36, and the shim printed
/// a WARN line into every `bpftime run`), it gets the kernel's errno back and stderr
/// stays clean; `BPFTIME_LOG=info` shows the refusals.
#[test]
fn run_prints_nothing_for_refused_feature_probes() {
    let s = Session::new("run-quiet");
    let out = run_on_calls(&s, examples::RINGBUF_EVENTS_BPF_O, &[]);
    assert_eq!(out.code, Some(0), "{}", out.context());
    assert!(
        !out.stderr.contains("WARN") && !out.stderr.contains("refused"),
        "the shim wrote into the tool's terminal:\n{}",
        out.stderr
    );
}

/// `--out DIR`: records go to DIR/events.txt instead of the terminal, the maps to
/// DIR/maps.txt as well, and records with `time_ns` and `addr` fields become a
/// timeline picture, DIR/MAP.png. Here every call of work(i) records (now, i * 4096).
#[test]
fn run_out_writes_events_maps_and_a_timeline() {
    let s = Session::new("run-out");
    let obj = s.compile_bpf(
        "sweep",
        "#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\n\
         struct sample { __u64 time_ns; __u64 addr; };\n\
         const struct sample *sample_type __attribute__((unused));\n\
         struct { __uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 1 << 20); } sweep SEC(\".maps\");\n\
         SEC(\"uprobe/work\") int on_work(__u64 *ctx) {\n\
             struct sample s = { bpf_ktime_get_ns(), ctx[14] * 4096 };\n\
             bpf_ringbuf_output(&sweep, &s, sizeof(s), 0);\n\
             return 0;\n\
         }\n\
         char LICENSE[] SEC(\"license\") = \"GPL\";\n",
    );
    let dir = s.tmp.join("out/new");
    let out = run_on_calls(&s, obj.to_str().unwrap(), &["--out", dir.to_str().unwrap()]);
    assert_eq!(out.code, Some(0), "{}", out.context());
    assert!(
        !out.stdout.iter().any(|l| l.starts_with("event ")),
        "records went to the terminal: {}",
        out.context()
    );
    assert!(out
        .stdout
        .contains(&"sweep (ringbuf): 1000 events".to_string()));
    let events = std::fs::read_to_string(dir.join("events.txt")).unwrap();
    assert_eq!(
        events
            .lines()
            .filter(|l| l.starts_with("event sweep 16B struct sample { time_ns="))
            .count(),
        N as usize,
        "{events}"
    );
    let maps = std::fs::read_to_string(dir.join("maps.txt")).unwrap();
    assert!(maps.contains("sweep (ringbuf): 1000 events"), "{maps}");
    let png = std::fs::read(dir.join("sweep.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(
        out.stderr.contains("sweep.png (1000 sampled accesses over"),
        "{}",
        out.context()
    );
    // A directory that cannot be made is a usage error before anything runs.
    let blocker = s.tmp.join("file");
    std::fs::write(&blocker, b"").unwrap();
    let bad = blocker.join("dir");
    let out = run_on_calls(&s, obj.to_str().unwrap(), &["--out", bad.to_str().unwrap()]);
    assert_eq!(out.code, Some(2), "{}", out.context());
    assert!(out.stderr.contains("--out "), "{}", out.context());
}

/// A bloom filter used from a program: each even argument of work() is pushed, then
/// every argument is tested. A filter never loses a value (all 500 even ones found) and
/// rarely claims one it never saw (odd ones: false positives, few at this size).
#[test]
fn a_bloom_filter_finds_every_value_pushed_from_a_program() {
    let s = Session::new("run-bloom");
    let obj = s.compile_bpf(
        "bloom",
        "#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\n\
         struct { __uint(type, BPF_MAP_TYPE_BLOOM_FILTER); __uint(max_entries, 1000);\n\
                  __type(value, __u64); } seen SEC(\".maps\");\n\
         struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 2);\n\
                  __type(key, __u32); __type(value, __u64); } found SEC(\".maps\");\n\
         SEC(\"uprobe/work\") int on_work(__u64 *ctx) {\n\
             __u64 v = ctx[14];\n\
             if (!(v & 1)) bpf_map_push_elem(&seen, &v, BPF_ANY);\n\
             if (bpf_map_peek_elem(&seen, &v) == 0) {\n\
                 __u32 k = v & 1; __u64 *n = bpf_map_lookup_elem(&found, &k);\n\
                 if (n) __sync_fetch_and_add(n, 1);\n\
             }\n\
             return 0;\n\
         }\n\
         char LICENSE[] SEC(\"license\") = \"GPL\";\n",
    );
    let out = run_on_calls(&s, obj.to_str().unwrap(), &[]);
    assert_eq!(out.code, Some(0), "{}", out.context());
    assert_eq!(
        out.entry("found", "0").as_deref(),
        Some("500"),
        "{}",
        out.context()
    );
    let odd: u64 = out.entry("found", "1").unwrap().parse().unwrap();
    assert!(
        odd < 25,
        "{odd} of 500 odd values claimed: {}",
        out.context()
    );
}

/// An LPM trie used from a program: work(i) stores i under the 30-bit prefix of i (big
/// endian, the first of each group of four wins: BPF_NOEXIST) and looks i up with all
/// 32 bits: the longest stored prefix answers, the first value of i's group.
#[test]
fn an_lpm_trie_answers_lookups_with_the_longest_stored_prefix() {
    let s = Session::new("run-lpm");
    let obj = s.compile_bpf(
        "lpm",
        "#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\n\
         struct key { __u32 prefixlen; __u8 data[4]; };\n\
         struct { __uint(type, BPF_MAP_TYPE_LPM_TRIE); __uint(max_entries, 256);\n\
                  __uint(map_flags, BPF_F_NO_PREALLOC);\n\
                  __type(key, struct key); __type(value, __u64); } prefixes SEC(\".maps\");\n\
         struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 2);\n\
                  __type(key, __u32); __type(value, __u64); } outcome SEC(\".maps\");\n\
         SEC(\"uprobe/work\") int on_work(__u64 *ctx) {\n\
             __u64 i = ctx[14];\n\
             struct key k = { 30, { i >> 24, i >> 16, i >> 8, i } };\n\
             bpf_map_update_elem(&prefixes, &k, &i, BPF_NOEXIST);\n\
             k.prefixlen = 32;\n\
             __u64 *v = bpf_map_lookup_elem(&prefixes, &k);\n\
             __u32 o = v && *v == (i & ~3ULL) ? 0 : 1;\n\
             __u64 *n = bpf_map_lookup_elem(&outcome, &o);\n\
             if (n) __sync_fetch_and_add(n, 1);\n\
             return 0;\n\
         }\n\
         char LICENSE[] SEC(\"license\") = \"GPL\";\n",
    );
    let out = run_on_calls(&s, obj.to_str().unwrap(), &[]);
    assert_eq!(out.code, Some(0), "{}", out.context());
    assert_eq!(
        out.entry("outcome", "0").as_deref(),
        Some("1000"),
        "{}",
        out.context()
    );
    assert_eq!(
        out.entry("outcome", "1").as_deref(),
        Some("0"),
        "{}",
        out.context()
    );
}

/// Maps of maps from a program: libbpf fills `outer` (an array of maps) and `odd` (a
/// hash of maps) from their static initialisers with map fds; work(i) looks up the inner
/// map of its parity in `outer`, counts in its key 0 and stores i in its key 1, and odd
/// calls count once more through `odd[1]`. The kernel accepts the same object.
#[test]
fn maps_of_maps_give_programs_the_inner_maps_libbpf_put_in_them() {
    let s = Session::new("run-mapinmap");
    let source = "#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\n\
         struct inner { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 2);\n\
                  __type(key, __u32); __type(value, __u64); } even SEC(\".maps\"), odd_calls SEC(\".maps\");\n\
         struct { __uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS); __uint(max_entries, 2);\n\
                  __type(key, __u32); __array(values, struct inner); } outer SEC(\".maps\") =\n\
                  { .values = { &even, &odd_calls } };\n\
         struct { __uint(type, BPF_MAP_TYPE_HASH_OF_MAPS); __uint(max_entries, 4);\n\
                  __type(key, __u32); __array(values, struct inner); } odd SEC(\".maps\") =\n\
                  { .values = { [1] = &odd_calls } };\n\
         SEC(\"uprobe/work\") int on_work(__u64 *ctx) {\n\
             __u64 i = ctx[14];\n\
             __u32 parity = i & 1, k = 0;\n\
             void *m = bpf_map_lookup_elem(&outer, &parity);\n\
             if (!m) return 0;\n\
             __u64 *n = bpf_map_lookup_elem(m, &k);\n\
             if (n) __sync_fetch_and_add(n, 1);\n\
             k = 1;\n\
             bpf_map_update_elem(m, &k, &i, BPF_ANY);\n\
             if (!parity) return 0;\n\
             m = bpf_map_lookup_elem(&odd, &parity);\n\
             if (!m) return 0;\n\
             k = 0;\n\
             n = bpf_map_lookup_elem(m, &k);\n\
             if (n) __sync_fetch_and_add(n, 1);\n\
             return 0;\n\
         }\n\
         char LICENSE[] SEC(\"license\") = \"GPL\";\n";
    let obj = s.compile_bpf("mapinmap", source);
    let obj = obj.to_str().unwrap();
    if let Some(log) = kernel_verdict(&s, obj) {
        assert_eq!(log, "", "the kernel refuses the program");
    }
    // The JIT, then the interpreter.
    for engine in ["1", "0"] {
        let out = run_on_calls_env(&s, obj, &[], &[("BPFTIME_JIT", engine)]);
        assert_eq!(out.code, Some(0), "{}", out.context());
        for (map, key, want) in [
            ("even", "0", N / 2),
            ("even", "1", N - 2),
            ("odd_calls", "0", N),
            ("odd_calls", "1", N - 1),
        ] {
            assert_eq!(
                out.entry(map, key).as_deref(),
                Some(want.to_string().as_str()),
                "BPFTIME_JIT={engine}: {map}[{key}]\n{}",
                out.context()
            );
        }
    }

    // Without the null check, both verifiers refuse to use the inner map.
    let unchecked = s.compile_bpf(
        "mapinmap_unchecked",
        &source
            .replace("if (!m) return 0;\\n", "")
            .replace("if (!m) return 0;", ""),
    );
    let unchecked = unchecked.to_str().unwrap();
    let ours = verify(&s, &[unchecked]);
    assert_eq!(ours.code, Some(1), "{}", ours.context());
    // Ours names the type as the newest kernel in the table does.
    let refusal = "R1 type=map_ptr_or_null expected=map_ptr";
    assert!(
        ours.stdout.iter().any(|l| l.contains(refusal)),
        "{}",
        ours.context()
    );
    if let Some(log) = kernel_verdict(&s, unchecked) {
        let kernel_refusal = kernel_version::for_running(UNCHECKED_INNER_MAP);
        assert!(log.contains(kernel_refusal), "kernel: {log}");
    }
}

/// The kernel's refusal of an inner map used before its null check. 6.1 calls the
/// lookup's result a map value; 6.18 a map pointer. Between them no machine of ours
/// has shown which; the boundary is at 6.18 until one does.
const UNCHECKED_INNER_MAP: &[Row<&str>] = &[
    Row {
        from: Version(6, 1),
        until: Some(Version(6, 18)),
        value: "R1 type=map_value_or_null expected=map_ptr",
    },
    Row {
        from: Version(6, 18),
        until: None,
        value: "R1 type=map_ptr_or_null expected=map_ptr",
    },
];

/// Task storage from a uprobe program: each of T threads of `calls` counts its own
/// calls to work() in its task's storage (created on the first call, which first finds
/// none), and at its N-th call notes that it reached N and deletes its storage. Exact
/// per-thread counts show that the storage is per thread. The kernel accepts the same
/// object, and both verifiers refuse a task that is a plain number
/// (`bpf_get_current_task()`).
#[test]
fn task_storage_keeps_state_per_thread_of_a_target() {
    const THREADS: u64 = 4;
    let s = Session::new("run-taskstorage");
    let source = format!(
        "#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\n\
         struct {{ __uint(type, BPF_MAP_TYPE_TASK_STORAGE); __uint(map_flags, BPF_F_NO_PREALLOC);\n\
                  __type(key, int); __type(value, __u64); }} per_thread SEC(\".maps\");\n\
         struct {{ __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 4);\n\
                  __type(key, __u32); __type(value, __u64); }} totals SEC(\".maps\");\n\
         static void add(__u32 k) {{ __u64 *v = bpf_map_lookup_elem(&totals, &k); if (v) __sync_fetch_and_add(v, 1); }}\n\
         SEC(\"uprobe/work\") int on_work(void *ctx) {{\n\
             struct task_struct *t = bpf_get_current_task_btf();\n\
             if (!bpf_task_storage_get(&per_thread, t, 0, 0)) add(0);\n\
             __u64 *n = bpf_task_storage_get(&per_thread, t, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);\n\
             if (!n) return 0;\n\
             *n += 1;\n\
             add(1);\n\
             if (*n == {N}) {{ add(2); if (bpf_task_storage_delete(&per_thread, t) == 0) add(3); }}\n\
             return 0;\n\
         }}\n\
         char LICENSE[] SEC(\"license\") = \"GPL\";\n"
    );
    let obj = s.compile_bpf("taskstorage", &source);
    let obj = obj.to_str().unwrap();
    if let Some(log) = kernel_verdict(&s, obj) {
        assert_eq!(log, "", "the kernel refuses the program");
    }
    let calls = s.target_copy(examples::CALLS);
    let (n, threads) = (N.to_string(), THREADS.to_string());
    for engine in ["1", "0"] {
        let args = [
            "run",
            obj,
            "--",
            calls.to_str().unwrap(),
            n.as_str(),
            "--threads",
            threads.as_str(),
        ];
        let out = bpftime_env(&s, &args, &[("BPFTIME_JIT", engine)]);
        assert_eq!(out.code, Some(0), "{}", out.context());
        // 0: first calls (storage absent), 1: all calls, 2: threads that reached N,
        // 3: storage deleted.
        for (key, want) in [
            ("0", THREADS),
            ("1", THREADS * N),
            ("2", THREADS),
            ("3", THREADS),
        ] {
            assert_eq!(
                out.entry("totals", key).as_deref(),
                Some(want.to_string().as_str()),
                "BPFTIME_JIT={engine}: totals[{key}]\n{}",
                out.context()
            );
        }
    }

    // A task as a number is no task: both verifiers refuse it.
    let scalar = s.compile_bpf(
        "taskstorage_scalar",
        &source.replace(
            "struct task_struct *t = bpf_get_current_task_btf();",
            "struct task_struct *t = (void *)bpf_get_current_task();",
        ),
    );
    let scalar = scalar.to_str().unwrap();
    let ours = verify(&s, &[scalar]);
    assert_eq!(ours.code, Some(1), "{}", ours.context());
    let refusal = "R2 type=scalar expected=";
    assert!(
        ours.stdout.iter().any(|l| l.contains(refusal)),
        "{}",
        ours.context()
    );
    if let Some(log) = kernel_verdict(&s, scalar) {
        assert!(log.contains(refusal), "kernel: {log}");
    }
}

/// A target that faults, under `BPFTIME_CRASH_REPORT=1`: one report on stderr names the
/// signal, the faulting address, the binary whose code faulted and the stack, and the
/// target still dies of the same signal. Without the variable `run` says how to get one.
#[test]
fn a_crash_report_says_where_the_target_faulted() {
    let s = Session::new("run-crash");
    let src = s.tmp.join("faults.c");
    std::fs::write(
        &src,
        "#include <stdlib.h>\n\
         int main(void) { free(malloc(16)); *(volatile int *)0x40 = 1; return 0; }\n",
    )
    .unwrap();
    let exe = s.tmp.join("faults");
    let st = Command::new("cc")
        .args(["-O1", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed");
    let args = [
        "run",
        examples::MALLOC_COUNT_BPF_O,
        "--",
        exe.to_str().unwrap(),
    ];
    let out = bpftime_env(&s, &args, &[("BPFTIME_CRASH_REPORT", "1")]);
    assert_eq!(out.code, Some(128 + 11), "{}", out.context());
    let report = out
        .stderr
        .lines()
        .skip_while(|l| !l.starts_with("bpftime crash report: signal 11 code 1 address 0x40 "))
        .collect::<Vec<_>>();
    assert!(!report.is_empty(), "{}", out.context());
    assert!(
        report[1].starts_with("  ip ") && report[1].ends_with(exe.to_str().unwrap()),
        "the faulting instruction's mapping: {}",
        out.context()
    );
    assert_eq!(
        report[2],
        "  address 0x40 is in no mapping",
        "{}",
        out.context()
    );
    assert!(
        report
            .iter()
            .any(|l| l.contains("libc.so.6(__libc_start_main")),
        "the stack down to libc's start: {}",
        out.context()
    );
    assert!(
        !out.stderr
            .contains("run it again with BPFTIME_CRASH_REPORT=1"),
        "{}",
        out.context()
    );
    // Without the report, `run` says how to get one.
    let out = bpftime(&s, &args);
    assert_eq!(out.code, Some(128 + 11), "{}", out.context());
    assert!(!out.stderr.contains("crash report"), "{}", out.context());
    assert!(
        out.stderr
            .contains("run it again with BPFTIME_CRASH_REPORT=1"),
        "{}",
        out.context()
    );
}

/// An array of 2^31 values and a per-CPU array of 2^28, each with a few entries set:
/// `run` prints them in time that follows what they hold, not their size (walking
/// every index took hours), and says how many zero entries it left out.
#[test]
fn run_prints_huge_arrays_by_their_nonzero_entries() {
    let s = Session::new("run-huge-array");
    let source = r#"
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1u << 31);
	__type(key, __u32);
	__type(value, __u64);
} big SEC(".maps");
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1u << 28);
	__type(key, __u32);
	__type(value, __u64);
} spread SEC(".maps");
static void add(void *map, __u32 k, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(map, &k);
	if (v)
		__sync_fetch_and_add(v, n);
}
SEC("uprobe/work")
int on_work(void *ctx)
{
	add(&big, 3, 1);
	add(&big, 1u << 30, 2);
	add(&big, (1u << 31) - 1, 3);
	add(&spread, 100000, 1);
	return 0;
}
char LICENSE[] SEC("license") = "GPL";
"#;
    let obj = s.compile_bpf("huge", source);
    let start = Instant::now();
    let calls = s.target_copy(examples::CALLS);
    let out = bpftime_within(
        &s,
        &[
            "run",
            obj.to_str().unwrap(),
            "--",
            calls.to_str().unwrap(),
            &N.to_string(),
        ],
        &[],
        Duration::from_secs(60),
    );
    eprintln!(
        "bpftime run with a 2^31-entry array and a 2^28-entry per-CPU array took {:?}",
        start.elapsed()
    );
    assert_eq!(out.code, Some(0), "{}", out.context());
    let lines = &out.stdout;
    let has = |l: &str| lines.iter().any(|x| x == l);
    for line in [
        "big (array __u32 -> __u64, 2147483648 entries):".to_string(),
        format!("big[3]: {N}"),
        format!("big[1073741824]: {}", 2 * N),
        format!("big[2147483647]: {}", 3 * N),
        "(2147483645 zero entries of big not shown)".to_string(),
        "spread (percpu_array __u32 -> __u64, 268435456 entries):".to_string(),
        format!("spread[100000]: {N}"),
        "(268435455 zero entries of spread not shown)".to_string(),
    ] {
        assert!(has(&line), "no line `{line}`:\n{}", out.context());
    }
    let big_entries = lines.iter().filter(|l| l.starts_with("big[")).count();
    assert_eq!(big_entries, 3, "{}", out.context());
    assert_store_removed(&s);
}

/// A program whose name is not UTF-8 (a damaged object) and that the verifier
/// rejects: libbpf's message naming it used to abort `verify` (exit 134) on the way
/// out of libbpf's print callback.
#[test]
fn verify_survives_a_program_name_that_is_not_utf8() {
    let s = Session::new("verify-non-utf8");
    let bytes = std::fs::read(examples::REJECTED_BPF_O).unwrap();
    let name = b"read_without_check";
    let mut damaged = bytes.clone();
    let mut found = 0;
    let mut i = 0;
    while let Some(at) = damaged[i..].windows(name.len()).position(|w| w == name) {
        damaged[i + at + 4] = 0xff;
        found += 1;
        i += at + name.len();
    }
    assert!(found > 0, "rejected.bpf.o names read_without_check");
    let path = s.tmp.join("non-utf8.bpf.o");
    std::fs::write(&path, &damaged).unwrap();
    let out = verify(&s, &[path.to_str().unwrap()]);
    assert_eq!(out.code, Some(1), "{}", out.context());
    assert!(
        out.stdout[0].starts_with("read\u{fffd}without_check: rejected"),
        "{}",
        out.context()
    );
    assert!(
        out.stdout
            .join("\n")
            .contains("R0 invalid mem access 'map_value_or_null'"),
        "{}",
        out.context()
    );
    assert!(!out.stderr.contains("panicked"), "{}", out.context());
}

/// Byte-mutated copies of every bundled CPU object: `verify` gives a verdict or an
/// error for each, and never dies of a signal (an abort was 134).
#[test]
fn verify_never_dies_of_a_signal_on_mutated_objects() {
    use std::os::unix::process::ExitStatusExt;
    const PER_OBJECT: usize = 200;
    let s = Session::new("verify-mutants");
    // xorshift64*: the same mutants on every run.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let objects: Vec<PathBuf> = examples::ARTIFACTS
        .iter()
        .filter(|a| a.ends_with(".bpf.o"))
        .map(|a| examples::artifact(a))
        .collect();
    assert!(objects.len() >= 5, "{objects:?}");
    let mut codes: HashMap<i32, usize> = HashMap::new();
    let start = Instant::now();
    for object in &objects {
        let original = std::fs::read(object).unwrap();
        let path = s.tmp.join("mutant.bpf.o");
        for n in 0..PER_OBJECT {
            let mut bytes = original.clone();
            // Keep the ELF magic and machine, which `verify` checks itself, so the
            // mutants reach libbpf.
            for _ in 0..1 + next() % 4 {
                let at = 20 + (next() % (bytes.len() as u64 - 20)) as usize;
                bytes[at] ^= (1 + next() % 255) as u8;
            }
            std::fs::write(&path, &bytes).unwrap();
            let mut c = s.bpftime();
            c.arg("verify")
                .arg(&path)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            let out = bpftime_tests::run_with_timeout(c, Duration::from_secs(60));
            let status = out.status;
            let stderr = String::from_utf8_lossy(&out.stderr);
            if let Some(sig) = status.signal() {
                let keep = s.tmp.join(format!("dead-{n}.bpf.o"));
                std::fs::write(&keep, &bytes).unwrap();
                panic!(
                    "verify of mutant {n} of {} died of signal {sig}; kept as {}\n{stderr}",
                    object.display(),
                    keep.display()
                );
            }
            let code = status.code().unwrap();
            assert!(
                matches!(code, 0..=2) && !stderr.contains("panicked"),
                "verify of mutant {n} of {}: exit {code}\n{stderr}",
                object.display()
            );
            *codes.entry(code).or_default() += 1;
        }
    }
    eprintln!(
        "{} mutants of {} objects in {:?}: exit codes {codes:?}",
        PER_OBJECT * objects.len(),
        objects.len(),
        start.elapsed()
    );
}

/// Runs `script` with bash, `BPFTIME` naming the executable and `STORE` the store,
/// and returns what it prints (the exit status of bpftime it reports).
fn bash(s: &Session, script: &str) -> String {
    let mut c = Command::new("bash");
    c.arg("-c")
        .arg(script)
        .env("BPFTIME", bpftime_tests::bpftime())
        .env("STORE", &s.store)
        .env_remove("BPFTIME_STORE")
        .stdin(Stdio::null());
    let out = bpftime_tests::run_with_timeout(c, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Commands whose reader goes away (`| head -1`) or whose stdout and stderr are
/// closed stop writing and exit as they would have; they never abort (134).
#[test]
fn commands_exit_as_usual_when_their_output_is_closed() {
    let s = Session::new("closed-output");
    let calls = s.target_copy(examples::CALLS);
    let calls = calls.to_str().unwrap();
    let cases = [
        // (command, the exit status it has when its output is read)
        (format!("run {} -- {calls} 10", examples::REJECTED_BPF_O), 1),
        (
            format!("run {} -- {calls} 10", examples::FUNCLATENCY_BPF_O),
            0,
        ),
        (format!("verify {}", examples::REJECTED_BPF_O), 1),
        (format!("verify {}", examples::FUNCLATENCY_BPF_O), 0),
        ("list".to_string(), 0),
    ];
    // `list` needs the store to exist.
    bpftime_runtime::Store::create_or_open(&s.store).unwrap();
    for (command, code) in cases {
        let cmd = format!("\"$BPFTIME\" --store \"$STORE\" {command}");
        for (how, script) in [
            (
                "piped into head -1",
                // The pipe closes at once: head exits before bpftime writes.
                format!("{cmd} 2>&1 | head -c0; echo ${{PIPESTATUS[0]}}"),
            ),
            (
                "stdout into head -1",
                format!("{cmd} 2>/dev/null | head -1 >/dev/null; echo ${{PIPESTATUS[0]}}"),
            ),
            (
                "stdout and stderr closed",
                format!("{cmd} >&- 2>&-; echo $? >&3"),
            ),
        ] {
            let script = if how.contains("closed") {
                format!("exec 3>&1; {script}")
            } else {
                script
            };
            let got = bash(&s, &script);
            assert_eq!(
                got,
                code.to_string(),
                "`bpftime {command}` with its output {how}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(bpftime_runtime::Store::dir_for(&s.store));
}

/// `load` and `start` refuse what exec would not run as a program (or would hand to
/// the shell: an empty file "runs" and exits 0), with exit 2, and make no store for it.
#[test]
fn load_and_start_refuse_what_is_not_a_program_and_leave_no_store() {
    use std::os::unix::fs::PermissionsExt;
    let s = Session::new("not-a-program");
    let empty = s.tmp.join("empty");
    std::fs::write(&empty, b"").unwrap();
    let text = s.tmp.join("text");
    std::fs::write(&text, b"echo hello\n").unwrap();
    let object = s.tmp.join("object.o");
    std::fs::copy(examples::FUNCLATENCY_BPF_O, &object).unwrap();
    for f in [&empty, &text, &object] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let unexecutable = s.tmp.join("calls-noexec");
    std::fs::copy(examples::CALLS, &unexecutable).unwrap();
    std::fs::set_permissions(&unexecutable, std::fs::Permissions::from_mode(0o644)).unwrap();
    let missing = s.tmp.join("missing");
    let cases = [
        (&empty, "is empty"),
        (&text, "neither an executable (ELF) nor a script"),
        (&object, "an ELF file but not an executable"),
        (&unexecutable, "is not executable by you"),
        (&missing, "not found"),
    ];
    for command in ["load", "start"] {
        for (file, reason) in &cases {
            let out = bpftime(&s, &[command, file.to_str().unwrap()]);
            assert_eq!(
                out.code,
                Some(2),
                "{command} {}: {}",
                file.display(),
                out.context()
            );
            assert!(
                out.stderr.contains(reason) && out.stderr.contains(file.to_str().unwrap()),
                "{command} {}: {}",
                file.display(),
                out.context()
            );
            assert!(
                !bpftime_runtime::Store::dir_for(&s.store).exists(),
                "`bpftime {command} {}` left a store behind",
                file.display()
            );
        }
    }
    // A script with a #! line runs.
    let script = s.tmp.join("script");
    std::fs::write(&script, b"#!/bin/sh\nexit 7\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = bpftime(&s, &["load", script.to_str().unwrap()]);
    assert_eq!(out.code, Some(7), "{}", out.context());
    let _ = std::fs::remove_dir_all(bpftime_runtime::Store::dir_for(&s.store));
}

/// A map too big for the store is named with the limit, not blamed on the program
/// (which the loader's E2BIG, "Argument list too long", did).
#[test]
fn verify_names_a_map_too_big_and_the_limit() {
    let s = Session::new("verify-map-too-big");
    let source = r#"
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1u << 31);
	__type(key, __u32);
	__type(value, __u8[256]);
} huge SEC(".maps");
SEC("uprobe/work")
int on_work(void *ctx)
{
	__u32 k = 5;
	__u8 *v = bpf_map_lookup_elem(&huge, &k);
	if (v)
		*v = 1;
	return 0;
}
char LICENSE[] SEC("license") = "GPL";
"#;
    let obj = s.compile_bpf("toobig", source);
    let out = verify(&s, &[obj.to_str().unwrap()]);
    assert_eq!(out.code, Some(2), "{}", out.context());
    assert!(
        out.stderr
            .contains("map `huge` (2147483648 entries of 256 bytes) cannot be made")
            && out.stderr.contains("limit of 64 GiB of data per map"),
        "{}",
        out.context()
    );
    assert!(
        !out.stdout.iter().any(|l| l.contains("on_work: rejected")),
        "{}",
        out.context()
    );
}

/// A bad store stops `run` and `verify` before libbpf loads anything (as root, libbpf's
/// probes and loads would reach the kernel): the store's error is all they print.
#[test]
fn run_and_verify_check_the_store_before_loading() {
    let s = Session::new("run-bad-store");
    let calls = s.target_copy(examples::CALLS);
    let mut c = Command::new(bpftime_tests::bpftime());
    c.args(["--store", "../x", "run", examples::FUNCLATENCY_BPF_O, "--"])
        .arg(&calls)
        .arg("10")
        .env_remove("BPFTIME_STORE")
        .stdin(Stdio::null());
    let out = bpftime_tests::run_with_timeout(c, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("bpftime run: cannot open the store `../x`")
            && stderr.lines().count() == 1,
        "{stderr}"
    );
}

/// A tool's object with programs on system call tracepoints, under `bpftime run`: attached
/// where their sections say (a `syscalls` tracepoint and the raw `sys_exit`), they count
/// the app's calls exactly; `--attach` on one is refused with the reason.
#[test]
fn run_attaches_system_call_tracepoints_where_their_sections_say() {
    let s = Session::new("run-systp");
    let obj = s.compile_bpf(
        "systp_count",
        r#"
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 2);
    __type(key, __u32);
    __type(value, __u64);
} counts SEC(".maps");
static void bump(__u32 k)
{
    __u64 *v = bpf_map_lookup_elem(&counts, &k);
    if (v)
        __sync_fetch_and_add(v, 1);
}
SEC("tracepoint/syscalls/sys_enter_getppid")
int on_getppid(void *ctx) { bump(0); return 0; }
SEC("raw_tracepoint/sys_exit")
int on_exit(struct bpf_raw_tracepoint_args *ctx) { bump(1); return 0; }
char LICENSE[] SEC("license") = "GPL";
"#,
    );
    let obj = obj.to_str().unwrap();
    let file = s.tmp.join("one");
    std::fs::write(&file, "1").unwrap();
    let (rounds, threads) = (5u64, 3u64);
    let out = bpftime(
        &s,
        &[
            "run",
            obj,
            "--",
            examples::SYSCALLS,
            &rounds.to_string(),
            &threads.to_string(),
            file.to_str().unwrap(),
        ],
    );
    assert_eq!(out.code, Some(0), "{}", out.context());
    for want in [
        "attached on_getppid to the tracepoint syscalls/sys_enter_getppid",
        "attached on_exit to the tracepoint raw_syscalls/sys_exit",
    ] {
        assert!(
            out.stderr.contains(want),
            "says not `{want}`: {}",
            out.context()
        );
    }
    let count = |key: u32| -> Option<u64> {
        out.stdout.iter().find_map(|l| {
            l.strip_prefix(&format!("counts[{key}]: "))?
                .trim()
                .parse()
                .ok()
        })
    };
    // getppid twice a round on each thread and in the child, and once more in the
    // process and in the child (as syscall_tracepoints.rs checks against the kernel).
    let calls = rounds * threads + 1;
    assert_eq!(count(0), Some(2 * calls + 2), "{}", out.context());
    // Every return the process and its child saw: at least the getppid and the three
    // opens and closes a round.
    assert!(
        count(1).is_some_and(|n| n >= 8 * calls),
        "{}",
        out.context()
    );

    let refused = bpftime(
        &s,
        &[
            "run",
            "--attach",
            "on_getppid=work",
            obj,
            "--",
            examples::SYSCALLS,
            "1",
            "1",
        ],
    );
    assert_eq!(refused.code, Some(2), "{}", refused.context());
    assert!(
        refused
            .stderr
            .contains("is on the tracepoint syscalls/sys_enter_getppid"),
        "{}",
        refused.context()
    );
}
