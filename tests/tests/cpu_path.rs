//! An unmodified libbpf tool under `bpftime load`, its target under
//! `bpftime start`: exact counts, and the same counts the kernel gives.

use bpftime_tests::{
    examples, field, kernel_unavailable, run_with_timeout, workspace_bin, Session, Tool,
};
use std::process::Command;
use std::time::Duration;

const N: u64 = 1000;

/// Runs `tool` under bpftime with a private copy of `target` as its
/// `--target`, runs the target with `N`, stops the tool and returns its output.
/// Kernel runs against bpftime runs. A kernel uprobe on a library function puts a
/// breakpoint at its entry in every process mapping the library, ours included, and
/// bpftime cannot hook a function while the kernel's breakpoint is there (the agent
/// says so): malloc_count's kernel run must not overlap a bpftime run probing libc's
/// malloc. Kernel runs take this exclusively, bpftime runs shared.
static KERNEL_RUN: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn under_bpftime(s: &Session, tool: &str, args: &[&str], target: &str) -> Vec<String> {
    let _shared = KERNEL_RUN.read().unwrap_or_else(|p| p.into_inner());
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
/// Returns the tool's output and the target's pid (a kernel uprobe on a library
/// sees every process that calls it).
fn on_kernel(s: &Session, tool: &str, args: &[&str], target: &str) -> Option<(Vec<String>, u32)> {
    if let Some(why) = kernel_unavailable() {
        eprintln!("kernel comparison skipped: {why}");
        return None;
    }
    let _exclusive = KERNEL_RUN.write().unwrap_or_else(|p| p.into_inner());
    let dir = s.tmp.join("kernel");
    std::fs::create_dir_all(&dir).unwrap();
    let t = dir.join(std::path::Path::new(target).file_name().unwrap());
    bpftime_tests::copy_executable(target, &t);
    let t = t.to_str().unwrap().to_string();
    let mut c = Command::new(tool);
    c.args(
        args.iter()
            .map(|a| if *a == "@TARGET" { t.as_str() } else { a }),
    );
    let loader = Tool::spawn(c);
    let mut app = Command::new(&t)
        .arg(N.to_string())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = app.id();
    assert!(app.wait().unwrap().success());
    let (code, lines, err) = loader.stop();
    assert_eq!(code, 0, "kernel loader failed: {err}");
    Some((lines, pid))
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
    if let Some((k, _)) = on_kernel(&s, examples::FUNCLATENCY, &args, examples::CALLS) {
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

/// malloc_count's figures for one process: (calls, bytes, calls of the target's
/// `CALLS_MALLOC_SIZE`). `pid` None: the only process in the output (under
/// bpftime only the target runs the agent).
fn malloc_figures(lines: &[String], pid: Option<u32>) -> (u64, u64, u64) {
    let pids: std::collections::BTreeSet<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("pid="))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let pid = match pid {
        Some(p) => p.to_string(),
        None => {
            assert_eq!(pids.len(), 1, "one process expected: {lines:?}");
            pids.first().unwrap().to_string()
        }
    };
    let mine: Vec<String> = lines
        .iter()
        .filter(|l| l.split_whitespace().next() == Some(&format!("pid={pid}")))
        .cloned()
        .collect();
    let totals: Vec<String> = mine
        .iter()
        .filter(|l| l.contains(" bytes="))
        .cloned()
        .collect();
    let marker = format!(" size={} ", examples::CALLS_MALLOC_SIZE);
    let sized: Vec<String> = mine
        .iter()
        .filter(|l| l.contains(&marker))
        .cloned()
        .collect();
    (
        field(&totals, "pid=", "calls").unwrap_or_else(|| panic!("no totals for {pid}: {lines:?}")),
        field(&totals, "pid=", "bytes").unwrap(),
        field(&sized, "pid=", "calls").unwrap_or(0),
    )
}

#[test]
fn malloc_count_c_loader_on_libc_like_the_kernel() {
    let s = Session::new("malloc");
    let ours = under_bpftime(&s, examples::MALLOC_COUNT, &["--sizes"], examples::CALLS);
    let (calls, bytes, sized) = malloc_figures(&ours, None);
    assert_eq!(sized, N, "{ours:?}");
    if let Some((k, pid)) = on_kernel(&s, examples::MALLOC_COUNT, &["--sizes"], examples::CALLS) {
        // Every malloc of the target, the agent's own excluded, as the kernel counts them.
        assert_eq!(
            malloc_figures(&k, Some(pid)),
            (calls, bytes, sized),
            "kernel {k:?}\nours {ours:?}"
        );
    }
}

#[test]
fn malloc_count_libbpf_rs_loader_with_static_libbpf() {
    let s = Session::new("mallocrs");
    let tool = workspace_bin("malloc_count_rs");
    let ours = under_bpftime(&s, tool.to_str().unwrap(), &["--sizes"], examples::CALLS);
    assert_eq!(malloc_figures(&ours, None).2, N, "{ours:?}");
}

/// The `arg=` of every `event` line ringbuf_events printed, in order.
fn event_args(lines: &[String]) -> Vec<i64> {
    lines
        .iter()
        .filter(|l| l.starts_with("event "))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("arg="))
                .and_then(|v| v.parse().ok())
        })
        .collect()
}

fn check_events(lines: &[String]) {
    assert_eq!(field(lines, "events=", "events"), Some(N), "{lines:?}");
    assert_eq!(field(lines, "dropped=", "dropped"), Some(0));
    assert_eq!(
        event_args(lines),
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
    if let Some((k, _)) = on_kernel(&s, examples::RINGBUF_EVENTS, &args, examples::CALLS) {
        check_events(&k);
    }
}

/// Runs `calls FULL_CALLS` while the loader is stopped (so nothing is consumed),
/// then lets it drain: returns (events, dropped, the event arguments in order).
fn with_stopped_consumer(mut loader: Tool, target: Command) -> (u64, u64, Vec<i64>) {
    // SAFETY: signals to our own child.
    unsafe { libc::kill(loader.pid() as i32, libc::SIGSTOP) };
    // kill() returns before the stop takes effect; a consumer still running would
    // free ring space and change how many records fit.
    let stat = format!("/proc/{}/stat", loader.pid());
    let stopped = |s: &str| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('T'))
    };
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&stat).is_ok_and(|s| stopped(&s)) {
        assert!(std::time::Instant::now() < end, "the loader never stopped");
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = run_with_timeout(target, Duration::from_secs(60));
    assert!(out.status.success(), "target failed: {out:?}");
    // Ctrl-C while the tool waits on a slow reader of its output must cost no
    // event: the interrupted write is not allowed to lose what stdio held.
    loader.hold_output();
    // SAFETY: as above.
    unsafe { libc::kill(loader.pid() as i32, libc::SIGCONT) };
    loader.wait_until_blocked_writing(Duration::from_secs(30));
    let (code, lines, err) = loader.stop();
    assert_eq!(code, 0, "loader failed: {err}");
    (
        field(&lines, "events=", "events").expect("events= line"),
        field(&lines, "dropped=", "dropped").expect("dropped= line"),
        event_args(&lines),
    )
}

/// Far more events than the 256 KiB ring holds (40 bytes each).
const FULL_CALLS: u64 = 20_000;

#[test]
fn a_full_ringbuf_drops_and_counts_without_corrupting_what_it_kept() {
    let s = Session::new("ringfull");
    let t = s.target_copy(examples::CALLS);
    let t = t.to_str().unwrap();
    let loader = s.load(&[examples::RINGBUF_EVENTS, "--target", t, "--func", "work"]);
    let mut target = s.bpftime();
    target.args(["start", t, &FULL_CALLS.to_string()]);
    let (events, dropped, args) = with_stopped_consumer(loader, target);
    assert_eq!(
        events + dropped,
        FULL_CALLS,
        "every call is an event or a drop"
    );
    assert!(
        dropped > 0 && events > 0,
        "events {events} dropped {dropped}"
    );
    // Nothing was consumed while the target ran: the ring kept the first calls.
    assert_eq!(args, (0..events as i64).collect::<Vec<_>>());

    if let Some(why) = kernel_unavailable() {
        eprintln!("kernel comparison skipped: {why}");
        return;
    }
    let dir = s.tmp.join("kernel");
    std::fs::create_dir_all(&dir).unwrap();
    let kt = dir.join("calls");
    bpftime_tests::copy_executable(examples::CALLS, &kt);
    let mut c = Command::new(examples::RINGBUF_EVENTS);
    c.args(["--target", kt.to_str().unwrap(), "--func", "work"]);
    let loader = Tool::spawn(c);
    let mut target = Command::new(&kt);
    target.arg(FULL_CALLS.to_string());
    let (k_events, k_dropped, k_args) = with_stopped_consumer(loader, target);
    assert_eq!(
        (events, dropped),
        (k_events, k_dropped),
        "the kernel's ring holds as many records"
    );
    assert_eq!(k_args, args, "the kernel's loader printed the same events");
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
