//! Kernel-oracle tests: run each example loader on the real kernel against
//! the `calls` target and check exact results.
//!
//! These need root and working kernel eBPF with uprobes. Without them each
//! test prints why it is skipped and passes.
//!
//! Every test runs its own copy of the target binary: kernel uprobes are
//! attached per file (inode), so tests running in parallel cannot see each
//! other's calls to `work`.

use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use bpftime_bpf_examples as examples;

// The oracle tests' shared proof that an fd is the kernel's (bpftime-tests owns it).
#[path = "../../tests/src/kernel_object.rs"]
mod kernel_object;

/// How many times the target calls `work` and `malloc`.
const N: u64 = 1000;
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

/// Why kernel eBPF cannot be used here, or `None` if it can.
fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not running as root".into());
    }
    if !Path::new("/sys/bus/event_source/devices/uprobe/type").exists() {
        return Some("the kernel has no uprobe PMU".into());
    }
    // Create (and close) a tiny array map: proves bpf() works for us.
    let mut attr = [0u32; 32];
    attr[0] = 2; // BPF_MAP_TYPE_ARRAY
    attr[1] = 4; // key_size
    attr[2] = 8; // value_size
    attr[3] = 1; // max_entries
                 // SAFETY: BPF_MAP_CREATE (0) reads `size_of_val(&attr)` bytes of attr.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            0,
            attr.as_mut_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if fd < 0 {
        return Some(format!(
            "bpf(BPF_MAP_CREATE) failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    // The loaders run as processes of their own, which do not link the syscall
    // shim; this process's bpf() must reach the kernel too, or the probe proves
    // nothing.
    kernel_object::assert_kernel_object(
        fd as i32,
        kernel_object::BpfObject::Map,
        "the probe's BPF_MAP_CREATE",
    );
    // SAFETY: fd was just returned by the kernel and is ours.
    unsafe { libc::close(fd as i32) };
    None
}

macro_rules! require_kernel_ebpf {
    () => {
        if let Some(reason) = skip_reason() {
            // Written to the real stderr (not eprintln!, which the test
            // harness captures) so the skip shows in every test run.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {}: kernel eBPF unavailable: {reason}",
                std::thread::current().name().unwrap_or("test")
            );
            return;
        }
    };
}

/// A private copy of a target binary, removed on drop.
struct TargetCopy {
    dir: PathBuf,
    path: PathBuf,
}

impl TargetCopy {
    fn new(test: &str, original: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("bpf-examples-{test}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let name = Path::new(original).file_name().unwrap();
        let path = dir.join(name);
        fs::copy(original, &path).unwrap();
        TargetCopy { dir, path }
    }

    /// Run `calls N` to completion and return its pid.
    fn run_calls(&self, n: u64) -> u32 {
        let mut child = spawn_retrying(Command::new(&self.path).arg(n.to_string()));
        let pid = child.id();
        let status = child.wait().unwrap();
        assert!(
            status.success(),
            "target {} failed: {status}",
            self.path.display()
        );
        pid
    }
}

impl Drop for TargetCopy {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Spawn, retrying on ETXTBSY: a file we just wrote can be briefly held
/// open by a child that another test thread is forking at that moment.
fn spawn_retrying(cmd: &mut Command) -> Child {
    for _ in 0..50 {
        match cmd.spawn() {
            Ok(child) => return child,
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("cannot start {cmd:?}: {e}"),
        }
    }
    panic!("cannot start {cmd:?}: text file busy");
}

/// A running loader whose stdout is collected line by line.
struct Loader {
    child: Child,
    lines: Receiver<String>,
    stderr: Option<thread::JoinHandle<String>>,
}

impl Loader {
    /// Start `program args...` and wait until it prints `ready`.
    fn start(program: &str, args: &[&str]) -> Self {
        let mut child = spawn_retrying(
            Command::new(program)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
        );
        let stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                if tx.send(line.unwrap()).is_err() {
                    break;
                }
            }
        });
        let stderr = thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        let mut loader = Loader {
            child,
            lines,
            stderr: Some(stderr),
        };
        match loader.lines.recv_timeout(READY_TIMEOUT) {
            Ok(line) if line == "ready" => loader,
            Ok(line) => panic!("{program}: expected `ready`, got {line:?}"),
            Err(_) => {
                let _ = loader.child.kill();
                let _ = loader.child.wait();
                panic!(
                    "{program} never said ready; stderr:\n{}",
                    loader.stderr.take().unwrap().join().unwrap()
                );
            }
        }
    }

    /// SIGINT the loader and return its exit status and remaining output.
    fn stop(mut self) -> (ExitStatus, Vec<String>, String) {
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let deadline = Instant::now() + EXIT_TIMEOUT;
        let mut output = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => output.push(line),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    panic!("loader did not exit within {EXIT_TIMEOUT:?} of SIGINT")
                }
            }
        }
        let status = self.child.wait().unwrap();
        let stderr = self.stderr.take().unwrap().join().unwrap();
        (status, output, stderr)
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Parse `key=value` words of one output line (other words are ignored).
fn fields(line: &str) -> HashMap<&str, &str> {
    line.split_whitespace()
        .filter_map(|word| word.split_once('='))
        .collect()
}

fn num(map: &HashMap<&str, &str>, key: &str) -> u64 {
    map.get(key)
        .unwrap_or_else(|| panic!("no {key}= in {map:?}"))
        .parse()
        .unwrap()
}

/// Run a malloc_count loader (C or Rust) and check the target's numbers.
fn check_malloc_count(test: &str, loader: &str) {
    let target = TargetCopy::new(test, examples::CALLS);
    let running = Loader::start(loader, &["--sizes"]);
    let pid = target.run_calls(N);
    let (status, out, stderr) = running.stop();
    assert!(status.success(), "{loader} failed: {status}\n{stderr}");

    let pid = pid.to_string();
    let per_pid: Vec<_> = out
        .iter()
        .map(|l| fields(l))
        .filter(|f| f.get("pid") == Some(&pid.as_str()))
        .collect();
    let totals = per_pid
        .iter()
        .find(|f| !f.contains_key("size"))
        .unwrap_or_else(|| panic!("no pid={pid} line in {out:?}"));
    let marker = per_pid
        .iter()
        .find(|f| f.get("size") == Some(&"7919"))
        .unwrap_or_else(|| panic!("no pid={pid} size=7919 line"));
    let last = fields(out.last().expect("no output"));

    let (calls, bytes) = (num(totals, "calls"), num(totals, "bytes"));
    eprintln!(
        "{test}: pid {pid}: calls={calls} bytes={bytes}, size 7919 calls={}; \
         total calls={}",
        num(marker, "calls"),
        num(&last, "calls")
    );
    assert_eq!(num(marker, "calls"), N, "mallocs of the marker size");
    assert!(calls >= N, "calls={calls} < {N}");
    assert!(bytes >= N * examples::CALLS_MALLOC_SIZE, "bytes={bytes}");
    assert!(out.last().unwrap().starts_with("total "));
    assert!(num(&last, "calls") >= calls);
}

#[test]
fn malloc_count_c_counts_every_malloc() {
    require_kernel_ebpf!();
    check_malloc_count("malloc_count_c", examples::MALLOC_COUNT);
}

#[test]
fn malloc_count_rs_counts_every_malloc() {
    require_kernel_ebpf!();
    check_malloc_count("malloc_count_rs", env!("CARGO_BIN_EXE_malloc_count_rs"));
}

#[test]
fn malloc_count_c_and_rs_share_the_cli() {
    // No kernel needed: both reject a bad option the same way.
    for loader in [
        examples::MALLOC_COUNT,
        env!("CARGO_BIN_EXE_malloc_count_rs"),
    ] {
        let out = Command::new(loader).arg("--bogus").output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{loader}");
        let help = Command::new(loader).arg("--help").output().unwrap();
        assert!(help.status.success(), "{loader}");
        assert!(String::from_utf8_lossy(&help.stdout).starts_with("Usage: malloc_count"));
    }
}

fn check_funclatency(test: &str, calls: &str) {
    let target = TargetCopy::new(test, calls);
    let path = target.path.to_str().unwrap().to_string();
    let running = Loader::start(
        examples::FUNCLATENCY,
        &["--target", &path, "--func", "work"],
    );
    target.run_calls(N);
    let (status, out, stderr) = running.stop();
    assert!(status.success(), "funclatency failed: {status}\n{stderr}");

    let value = |key: &str| -> u64 {
        let line = out
            .iter()
            .find(|l| l.starts_with(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key}= line in {out:?}"));
        num(&fields(line), key)
    };
    let hist: Vec<_> = out
        .iter()
        .filter(|l| l.starts_with("hist "))
        .map(|l| fields(l))
        .collect();
    let in_hist: u64 = hist.iter().map(|f| num(f, "count")).sum();
    eprintln!(
        "{test}: count={} missed={} total_ns={} buckets={}",
        value("count"),
        value("missed"),
        value("total_ns"),
        hist.len()
    );
    assert_eq!(value("count"), N);
    assert_eq!(value("missed"), 0);
    assert_eq!(in_hist, N);
    for f in &hist {
        assert!(num(f, "lo") <= num(f, "hi"));
    }
}

#[test]
fn funclatency_times_every_call_pie() {
    require_kernel_ebpf!();
    check_funclatency("funclatency_pie", examples::CALLS);
}

#[test]
fn funclatency_times_every_call_nopie() {
    require_kernel_ebpf!();
    check_funclatency("funclatency_nopie", examples::CALLS_NOPIE);
}

fn check_ringbuf_events(test: &str, loader: &str, calls: &str) {
    let target = TargetCopy::new(test, calls);
    let path = target.path.to_str().unwrap().to_string();
    let running = Loader::start(loader, &["--target", &path, "--func", "work"]);
    let pid = target.run_calls(N).to_string();
    let (status, out, stderr) = running.stop();
    assert!(
        status.success(),
        "ringbuf_events failed: {status}\n{stderr}"
    );

    let events: Vec<_> = out
        .iter()
        .filter(|l| l.starts_with("event "))
        .map(|l| fields(l))
        .collect();
    let summary = |key: &str| -> u64 {
        let line = out
            .iter()
            .find(|l| l.starts_with(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key}= line"));
        num(&fields(line), key)
    };
    let mut args: Vec<u64> = events.iter().map(|f| num(f, "arg")).collect();
    let via_output = events.iter().filter(|f| f["via"] == "output").count();
    eprintln!(
        "{test}: events={} dropped={} lines={} via output={via_output}",
        summary("events"),
        summary("dropped"),
        events.len()
    );
    assert_eq!(summary("events"), N);
    assert_eq!(summary("dropped"), 0);
    assert!(events.iter().all(|f| f["pid"] == pid));
    // Events from one thread arrive in order.
    assert!(args.windows(2).all(|w| w[0] < w[1]), "events out of order");
    let ts: Vec<u64> = events.iter().map(|f| num(f, "ts")).collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]), "timestamps go back");
    args.sort_unstable();
    assert_eq!(args, (0..N).collect::<Vec<_>>());
    // Odd arguments go through bpf_ringbuf_output, even ones reserve/submit.
    assert_eq!(via_output as u64, N / 2);
}

#[test]
fn ringbuf_events_sees_every_call_pie() {
    require_kernel_ebpf!();
    check_ringbuf_events(
        "ringbuf_events_pie",
        examples::RINGBUF_EVENTS,
        examples::CALLS,
    );
}

#[test]
fn ringbuf_events_sees_every_call_nopie() {
    require_kernel_ebpf!();
    check_ringbuf_events(
        "ringbuf_events_nopie",
        examples::RINGBUF_EVENTS,
        examples::CALLS_NOPIE,
    );
}

#[test]
fn ringbuf_events_rs_sees_every_call() {
    require_kernel_ebpf!();
    check_ringbuf_events(
        "ringbuf_events_rs",
        env!("CARGO_BIN_EXE_ringbuf_events_rs"),
        examples::CALLS,
    );
}

#[test]
fn loaders_fail_clearly() {
    // Usage errors need no kernel.
    for loader in [
        examples::FUNCLATENCY,
        examples::RINGBUF_EVENTS,
        env!("CARGO_BIN_EXE_ringbuf_events_rs"),
    ] {
        let out = Command::new(loader)
            .args(["--target", "x"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{loader}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--func are required"));
    }
    require_kernel_ebpf!();
    // A function that does not exist: attach fails, exit status 1.
    let out = Command::new(examples::FUNCLATENCY)
        .args(["--target", examples::CALLS, "--func", "no_such_function"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot attach"), "{stderr}");
    assert!(out.stdout.is_empty(), "no `ready` on failure");
}
