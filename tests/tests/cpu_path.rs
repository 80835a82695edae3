//! An unmodified libbpf tool under `bpftime load`, its target under
//! `bpftime start`: exact counts, and the same counts the kernel gives.

use bpftime_tests::{examples, field, kernel_unavailable, workspace_bin, Session, Tool};
use std::process::Command;
use std::time::Duration;

const N: u64 = 1000;

/// Runs `tool` under bpftime with a private copy of `target` as its
/// `--target`, runs the target with `N`, stops the tool and returns its output.
fn under_bpftime(s: &Session, tool: &str, args: &[&str], target: &str) -> Vec<String> {
    let t = s.target_copy(target);
    let t = t.to_str().unwrap();
    let mut argv = vec![tool];
    argv.extend(args.iter().map(|a| if *a == "@TARGET" { t } else { a }));
    let loader = s.load(&argv);
    let out = s.start(&[t, &N.to_string()]);
    assert!(
        out.status.success(),
        "target failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, lines, err) = loader.stop();
    assert_eq!(code, 0, "loader failed: {err}");
    lines
}

/// The same on the real kernel, when it can serve as the oracle.
fn on_kernel(s: &Session, tool: &str, args: &[&str], target: &str) -> Option<Vec<String>> {
    if let Some(why) = kernel_unavailable() {
        eprintln!("kernel comparison skipped: {why}");
        return None;
    }
    let dir = s.tmp.join("kernel");
    std::fs::create_dir_all(&dir).unwrap();
    let t = dir.join(std::path::Path::new(target).file_name().unwrap());
    std::fs::copy(target, &t).unwrap();
    let t = t.to_str().unwrap().to_string();
    let mut c = Command::new(tool);
    c.args(
        args.iter()
            .map(|a| if *a == "@TARGET" { t.as_str() } else { a }),
    );
    let loader = Tool::spawn(c);
    let out = Command::new(&t).arg(N.to_string()).output().unwrap();
    assert!(out.status.success());
    let (code, lines, err) = loader.stop();
    assert_eq!(code, 0, "kernel loader failed: {err}");
    Some(lines)
}

#[test]
fn funclatency_c_loader_counts_every_call_like_the_kernel() {
    let s = Session::new("funclat");
    let args = ["--target", "@TARGET", "--func", "work"];
    let ours = under_bpftime(&s, examples::FUNCLATENCY, &args, examples::CALLS);
    assert_eq!(field(&ours, "count=", "count"), Some(N), "{ours:?}");
    assert_eq!(field(&ours, "missed=", "missed"), Some(0));
    let buckets: u64 = ours
        .iter()
        .filter(|l| l.starts_with("hist "))
        .filter_map(|l| field(std::slice::from_ref(l), "hist", "count"))
        .sum();
    assert_eq!(buckets, N, "histogram holds every call");
    if let Some(k) = on_kernel(&s, examples::FUNCLATENCY, &args, examples::CALLS) {
        assert_eq!(
            field(&k, "count=", "count"),
            field(&ours, "count=", "count")
        );
        assert_eq!(
            field(&k, "missed=", "missed"),
            field(&ours, "missed=", "missed")
        );
    }
}

#[test]
fn funclatency_on_a_non_pie_target() {
    let s = Session::new("nopie");
    let ours = under_bpftime(
        &s,
        examples::FUNCLATENCY,
        &["--target", "@TARGET", "--func", "work"],
        examples::CALLS_NOPIE,
    );
    assert_eq!(field(&ours, "count=", "count"), Some(N), "{ours:?}");
}

fn target_malloc_calls(lines: &[String]) -> Option<u64> {
    let marker = format!("size={}", examples::CALLS_MALLOC_SIZE);
    lines
        .iter()
        .find(|l| l.starts_with("pid=") && l.contains(&marker))
        .and_then(|l| field(std::slice::from_ref(l), "pid=", "calls"))
}

#[test]
fn malloc_count_c_loader_on_libc_like_the_kernel() {
    let s = Session::new("malloc");
    let ours = under_bpftime(&s, examples::MALLOC_COUNT, &["--sizes"], examples::CALLS);
    assert_eq!(target_malloc_calls(&ours), Some(N), "{ours:?}");
    // The agent's own allocations must not show up in the target's counts.
    let per_pid_calls = field(&ours, "pid=", "calls").unwrap();
    let per_pid_bytes = field(&ours, "pid=", "bytes").unwrap();
    if let Some(k) = on_kernel(&s, examples::MALLOC_COUNT, &["--sizes"], examples::CALLS) {
        assert_eq!(target_malloc_calls(&k), Some(N));
        let pid_line = k
            .iter()
            .find(|l| l.starts_with("pid=") && l.contains(" bytes="))
            .filter(|_| true);
        // On the kernel every process's malloc is counted; compare the target's own line.
        let target_pid = k
            .iter()
            .find(|l| l.contains(&format!("size={}", examples::CALLS_MALLOC_SIZE)))
            .and_then(|l| l.split_whitespace().next().map(str::to_string))
            .unwrap();
        let kernel_line: Vec<String> = k
            .iter()
            .filter(|l| l.starts_with(&format!("{target_pid} calls=")))
            .cloned()
            .collect();
        let _ = pid_line;
        assert_eq!(
            field(&kernel_line, "pid=", "calls"),
            Some(per_pid_calls),
            "kernel {kernel_line:?} ours {ours:?}"
        );
        assert_eq!(field(&kernel_line, "pid=", "bytes"), Some(per_pid_bytes));
    }
}

#[test]
fn malloc_count_libbpf_rs_loader_with_static_libbpf() {
    let s = Session::new("mallocrs");
    let tool = workspace_bin("malloc_count_rs");
    let ours = under_bpftime(&s, tool.to_str().unwrap(), &["--sizes"], examples::CALLS);
    assert_eq!(target_malloc_calls(&ours), Some(N), "{ours:?}");
}

fn check_events(lines: &[String]) {
    assert_eq!(field(lines, "events=", "events"), Some(N), "{lines:?}");
    assert_eq!(field(lines, "dropped=", "dropped"), Some(0));
    let args: Vec<i64> = lines
        .iter()
        .filter(|l| l.starts_with("event "))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("arg="))
                .and_then(|v| v.parse().ok())
        })
        .collect();
    assert_eq!(
        args,
        (0..N as i64).collect::<Vec<_>>(),
        "every argument once, in order"
    );
}

#[test]
fn ringbuf_events_c_loader_streams_every_event() {
    let s = Session::new("ringbuf");
    let args = ["--target", "@TARGET", "--func", "work"];
    let ours = under_bpftime(&s, examples::RINGBUF_EVENTS, &args, examples::CALLS);
    check_events(&ours);
    if let Some(k) = on_kernel(&s, examples::RINGBUF_EVENTS, &args, examples::CALLS) {
        check_events(&k);
    }
}

#[test]
fn ringbuf_events_libbpf_rs_loader() {
    let s = Session::new("ringbufrs");
    let tool = workspace_bin("ringbuf_events_rs");
    let ours = under_bpftime(
        &s,
        tool.to_str().unwrap(),
        &["--target", "@TARGET", "--func", "work"],
        examples::CALLS,
    );
    check_events(&ours);
}

#[test]
fn two_tools_on_one_target_both_count_exactly() {
    let s = Session::new("two");
    let t = s.target_copy(examples::CALLS);
    let t = t.to_str().unwrap();
    let lat = s.load(&[examples::FUNCLATENCY, "--target", t, "--func", "work"]);
    let ev = s.load(&[examples::RINGBUF_EVENTS, "--target", t, "--func", "work"]);
    let out = s.start(&[t, &N.to_string()]);
    assert!(out.status.success());
    let (_, lat_lines, _) = lat.stop();
    let (_, ev_lines, _) = ev.stop();
    assert_eq!(field(&lat_lines, "count=", "count"), Some(N));
    check_events(&ev_lines);
}

#[test]
fn a_tool_that_exits_detaches_and_a_killed_tool_leaves_nothing_attached() {
    let s = Session::new("detach");
    let t = s.target_copy(examples::CALLS);
    let t = t.to_str().unwrap();
    // A tool killed with SIGKILL leaves its objects in the store...
    let killed = s.load(&[examples::FUNCLATENCY, "--target", t, "--func", "work"]);
    killed.kill();
    // ...which a new tool's session cleans up, and the agent never attaches.
    let live = s.load(&[examples::FUNCLATENCY, "--target", t, "--func", "work"]);
    let out = s.start(&[t, &N.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, lines, _) = live.stop();
    assert_eq!(
        field(&lines, "count=", "count"),
        Some(N),
        "counted once, not twice: {lines:?}"
    );
    let list = s.bpftime().args(["list"]).output().unwrap();
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(
        !text.contains("link "),
        "no links remain after both tools exited... list:\n{text}"
    );
    let _ = Duration::from_secs(0);
}

#[test]
fn a_missing_symbol_fails_the_tool_with_a_message() {
    let s = Session::new("nosym");
    let t = s.target_copy(examples::CALLS);
    let out = s
        .bpftime()
        .args([
            "load",
            examples::FUNCLATENCY,
            "--target",
            t.to_str().unwrap(),
            "--func",
            "no_such_function",
        ])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("ready"), "{stdout}");
    assert!(!out.stderr.is_empty());
}

#[test]
fn cli_reports_missing_programs_and_stores_with_exit_2() {
    let s = Session::new("cli");
    let out = s
        .bpftime()
        .args(["start", "/no/such/program"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
    let out = Command::new(bpftime_tests::bpftime())
        .args(["--store", "never-created-store", "list"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
}
