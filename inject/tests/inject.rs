//! Loading a library into real running processes: blocked in read(), asleep
//! in nanosleep(), spinning with live vector registers. Each process must
//! carry on exactly as it would have without us.

use bpftime_inject::{inject, InjectError, Target};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

struct Built {
    target: PathBuf,
    probe: PathBuf,
}

fn has_avx2() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|s| s.contains(" avx2"))
}

/// Compiles the C target and probe library once per test run.
fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("inject-c");
        std::fs::create_dir_all(&out).unwrap();
        let simd: &[&str] = if has_avx2() { &["-mavx2"] } else { &[] };
        let cc = |args: &[&str]| {
            let st = Command::new("cc").args(args).status().expect("run cc");
            assert!(st.success(), "cc {args:?} failed");
        };
        let target = out.join("target");
        let probe = out.join("probe.so");
        let mut a = vec![
            "-O2",
            "-pthread",
            "-ffp-contract=off",
            "-o",
            target.to_str().unwrap(),
        ];
        a.extend_from_slice(simd);
        a.push(src.join("target.c").to_str().unwrap().to_owned().leak());
        cc(&a);
        let mut a = vec!["-O2", "-shared", "-fPIC", "-o", probe.to_str().unwrap()];
        a.extend_from_slice(simd);
        a.push(src.join("probe.c").to_str().unwrap().to_owned().leak());
        cc(&a);
        Built { target, probe }
    })
}

/// A private scratch directory for one test.
fn scratch(tag: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("inject-{tag}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    probe_out: PathBuf,
}

impl Proc {
    fn spawn(dir: &Path, args: &[&str]) -> Proc {
        let probe_out = dir.join("probe.out");
        let mut child = Command::new(&built().target)
            .args(args)
            .env("PROBE_OUT", &probe_out)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn target");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        let p = Proc {
            child,
            stdin,
            lines,
            probe_out,
        };
        assert_eq!(p.line(), "ready");
        p
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn line(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(30))
            .expect("the target printed nothing within 30 s")
    }

    /// Waits until the main thread is blocked in system call `nr`.
    fn wait_in_syscall(&self, nrs: &[u64]) {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let s = std::fs::read_to_string(format!("/proc/{}/syscall", self.pid()))
                .unwrap_or_default();
            let nr = s.split_whitespace().next().and_then(|n| n.parse().ok());
            if nr.is_some_and(|n| nrs.contains(&n)) {
                return;
            }
            assert!(Instant::now() < end, "target never blocked in {nrs:?}: {s}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn status_field(&self, key: &str) -> String {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
            .unwrap_or_default()
    }

    fn feed(&mut self, text: &str) {
        self.stdin
            .as_mut()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }

    fn exit_code(mut self) -> i32 {
        drop(self.stdin.take());
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.code().unwrap_or(-1);
            }
            if Instant::now() > end {
                let _ = self.child.kill();
                panic!("target did not exit");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn probe_lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.probe_out)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const SYS_READ: u64 = 0;
const SYS_NANOSLEEP: u64 = 35;
const SYS_CLOCK_NANOSLEEP: u64 = 230;

#[test]
fn loads_into_a_process_blocked_in_read_which_keeps_reading() {
    let dir = scratch("read");
    let mut p = Proc::spawn(&dir, &["read"]);
    p.wait_in_syscall(&[SYS_READ]);
    let loaded = inject(p.pid(), &built().probe).expect("inject");
    assert!(loaded.was_in_syscall);
    assert_eq!(loaded.tid, p.pid());
    assert_ne!(loaded.handle, 0);
    assert_eq!(
        p.probe_lines(),
        [format!("loaded pid={0} tid={0} store=-", p.pid())]
    );
    // Detached, and back in the same read().
    assert_eq!(p.status_field("TracerPid:"), "0");
    p.wait_in_syscall(&[SYS_READ]);
    p.feed("hello\n");
    assert_eq!(p.line(), "got hello");
    assert_eq!(p.exit_code(), 7);
}

#[test]
fn loads_into_a_sleeping_process_whose_sleep_runs_its_full_length() {
    let dir = scratch("sleep");
    let p = Proc::spawn(&dir, &["sleep", "1500"]);
    p.wait_in_syscall(&[SYS_NANOSLEEP, SYS_CLOCK_NANOSLEEP]);
    let loaded = inject(p.pid(), &built().probe).expect("inject");
    assert!(loaded.was_in_syscall);
    assert_eq!(p.probe_lines().len(), 1);
    let line = p.line();
    let slept: u64 = line
        .strip_prefix("slept_ms=")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("unexpected output {line:?}"));
    assert!(line.ends_with(" rc=0"), "nanosleep was cut short: {line}");
    assert!(slept >= 1500, "slept only {slept} ms of 1500: {line}");
    assert_eq!(p.exit_code(), 0);
}

#[test]
fn loads_into_a_spinning_process_without_disturbing_its_registers() {
    let dir = scratch("spin");
    let p = Proc::spawn(&dir, &["spin"]);
    // Three libraries, each loaded at whatever point the loop is in.
    for i in 0..3 {
        std::thread::sleep(Duration::from_millis(30));
        let copy = dir.join(format!("probe{i}.so"));
        std::fs::copy(&built().probe, &copy).unwrap();
        let loaded = inject(p.pid(), &copy).expect("inject");
        assert!(!loaded.was_in_syscall, "the spinner makes no system calls");
    }
    assert_eq!(p.probe_lines().len(), 3, "{:?}", p.probe_lines());
    // SAFETY: signals our own child.
    unsafe { libc::kill(p.pid(), libc::SIGUSR1) };
    let line = p.line();
    assert!(
        line.starts_with("spin n=") && line.ends_with(" ok"),
        "the spinner's state changed under it: {line}"
    );
    assert_eq!(p.exit_code(), 0);
}

#[test]
fn loads_into_a_process_whose_main_thread_has_exited() {
    let dir = scratch("leader");
    let mut p = Proc::spawn(&dir, &["leader-exits"]);
    let loaded = inject(p.pid(), &built().probe).expect("inject");
    assert_ne!(loaded.tid, p.pid(), "the main thread is gone");
    assert_eq!(
        p.probe_lines(),
        [format!("loaded pid={} tid={} store=-", p.pid(), loaded.tid)]
    );
    p.feed("from the other thread\n");
    assert_eq!(p.line(), "got from the other thread");
    assert_eq!(p.exit_code(), 7);
}

#[test]
fn loads_into_a_process_whose_other_thread_keeps_allocating() {
    let dir = scratch("threads");
    let mut p = Proc::spawn(&dir, &["threads"]);
    for i in 0..3 {
        let copy = dir.join(format!("probe{i}.so"));
        std::fs::copy(&built().probe, &copy).unwrap();
        let loaded = inject(p.pid(), &copy).expect("inject");
        assert_eq!(loaded.tid, p.pid());
    }
    assert_eq!(p.probe_lines().len(), 3);
    p.feed("busy\n");
    assert_eq!(p.line(), "got busy");
    assert_eq!(p.exit_code(), 7);
}

#[test]
fn a_library_already_loaded_is_refused() {
    let dir = scratch("twice");
    let mut p = Proc::spawn(&dir, &["read"]);
    let copy = dir.join("probe.so");
    std::fs::copy(&built().probe, &copy).unwrap();
    inject(p.pid(), &copy).expect("first inject");
    let err = inject(p.pid(), &copy).unwrap_err();
    assert!(matches!(err, InjectError::AlreadyLoaded { .. }), "{err}");
    assert!(err.is_refusal());
    assert_eq!(p.probe_lines().len(), 1);
    p.feed("again\n");
    assert_eq!(p.line(), "got again");
    assert_eq!(p.exit_code(), 7);
}

#[test]
fn a_signal_arriving_during_the_call_is_delivered_afterwards() {
    let dir = scratch("signal");
    let p = Proc::spawn(&dir, &["spin"]);
    // The probe announces itself, then sleeps inside its constructor, i.e.
    // inside our dlopen call; the signal is sent in that window.
    let probe_out = p.probe_out.clone();
    let pid = p.pid();
    let sender = std::thread::spawn(move || {
        let end = Instant::now() + Duration::from_secs(30);
        while !std::fs::read_to_string(&probe_out).is_ok_and(|s| s.contains("sleeping")) {
            assert!(Instant::now() < end, "probe never started");
            std::thread::sleep(Duration::from_millis(2));
        }
        // SAFETY: signals our own child's main thread.
        unsafe { libc::syscall(libc::SYS_tgkill, pid, pid, libc::SIGUSR1) };
    });
    let slow = dir.join("slow.so");
    std::fs::copy(&built().probe, &slow).unwrap();
    // The target's environment is fixed: the sleep is asked for in a file.
    std::fs::write(dir.join("probe.out.sleep"), "300").unwrap();
    let loaded = inject(pid, &slow).expect("inject");
    sender.join().unwrap();
    assert_eq!(loaded.held_signals, [libc::SIGUSR1]);
    let line = p.line();
    assert!(line.ends_with(" ok"), "{line}");
    assert_eq!(p.exit_code(), 0);
}

#[test]
fn a_failing_dlopen_is_reported_with_dlerror_and_the_process_carries_on() {
    let dir = scratch("fail");
    let mut p = Proc::spawn(&dir, &["read"]);
    p.wait_in_syscall(&[SYS_READ]);
    let bogus = dir.join("not-a-library.so");
    std::fs::write(
        &bogus,
        "this is not an ELF file, it is long enough to be read\n".repeat(20),
    )
    .unwrap();
    let err = inject(p.pid(), &bogus).unwrap_err();
    match &err {
        InjectError::DlopenFailed { message, .. } => {
            assert!(message.contains("not-a-library.so"), "{message}");
            assert!(message.contains("ELF"), "{message}");
        }
        other => panic!("expected a dlopen failure, got {other}"),
    }
    assert!(!err.is_refusal());
    assert_eq!(p.status_field("TracerPid:"), "0");
    p.feed("still here\n");
    assert_eq!(p.line(), "got still here");
    assert_eq!(p.exit_code(), 7);
}

#[test]
fn a_missing_library_is_refused_before_touching_the_process() {
    let dir = scratch("missing");
    let mut p = Proc::spawn(&dir, &["read"]);
    let err = inject(p.pid(), &dir.join("nope.so")).unwrap_err();
    assert!(matches!(err, InjectError::Library { .. }), "{err}");
    assert!(err.to_string().contains("nope.so"), "{err}");
    assert_eq!(p.status_field("TracerPid:"), "0");
    p.feed("x\n");
    assert_eq!(p.line(), "got x");
    assert_eq!(p.exit_code(), 7);
}

#[test]
fn a_process_that_is_gone_is_refused() {
    let mut c = Command::new("true").spawn().unwrap();
    let pid = c.id() as i32;
    c.wait().unwrap();
    let err = inject(pid, &built().probe).unwrap_err();
    assert!(
        matches!(err, InjectError::NoSuchProcess { pid: p } if p == pid),
        "{err}"
    );
    assert!(err.to_string().contains(&format!("no process {pid}")));
    assert!(err.is_refusal());
}

#[test]
fn a_zombie_is_refused() {
    let mut c = Command::new("true").spawn().unwrap();
    let pid = c.id() as i32;
    let end = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    }) {
        assert!(Instant::now() < end);
        std::thread::sleep(Duration::from_millis(2));
    }
    let err = inject(pid, &built().probe).unwrap_err();
    c.wait().unwrap();
    assert!(matches!(err, InjectError::Zombie { .. }), "{err}");
    assert!(err.to_string().contains("has exited"), "{err}");
}

#[test]
fn a_stopped_process_is_refused_with_the_way_to_resume_it() {
    let dir = scratch("stopped");
    let mut p = Proc::spawn(&dir, &["read"]);
    // SAFETY: signals our own child.
    unsafe { libc::kill(p.pid(), libc::SIGSTOP) };
    let end = Instant::now() + Duration::from_secs(10);
    while !p.status_field("State:").starts_with('T') {
        assert!(Instant::now() < end);
        std::thread::sleep(Duration::from_millis(2));
    }
    let err = inject(p.pid(), &built().probe).unwrap_err();
    assert!(matches!(err, InjectError::Stopped { .. }), "{err}");
    assert!(err.to_string().contains(&format!("kill -CONT {}", p.pid())));
    // SAFETY: as above.
    unsafe { libc::kill(p.pid(), libc::SIGCONT) };
    p.feed("resumed\n");
    assert_eq!(p.line(), "got resumed");
    assert_eq!(p.exit_code(), 7);
    assert!(probe_never_ran(&dir));
}

fn probe_never_ran(dir: &Path) -> bool {
    !dir.join("probe.out").exists()
}

#[test]
fn a_process_traced_by_someone_else_is_refused() {
    let dir = scratch("traced");
    let p = Proc::spawn(&dir, &["read"]);
    // SAFETY: PTRACE_SEIZE with no options on our own child.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_SEIZE,
            p.pid(),
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    let err = inject(p.pid(), &built().probe).unwrap_err();
    match &err {
        InjectError::AlreadyTraced { tracer, .. } => {
            assert_eq!(*tracer as u32, std::process::id())
        }
        other => panic!("expected already traced, got {other}"),
    }
    assert!(err.to_string().contains("detach that debugger"), "{err}");
    // Proc's drop kills it, which also ends our trace.
}

#[test]
fn a_kernel_thread_is_refused() {
    let comm = std::fs::read_to_string("/proc/2/comm").unwrap_or_default();
    if comm.trim() != "kthreadd" {
        eprintln!("skipped: pid 2 is not kthreadd here (a pid namespace?)");
        return;
    }
    let err = inject(2, &built().probe).unwrap_err();
    assert!(matches!(err, InjectError::KernelThread { .. }), "{err}");
}

#[test]
fn dropping_a_seized_target_detaches_and_the_process_runs_on() {
    let dir = scratch("drop");
    let mut p = Proc::spawn(&dir, &["read"]);
    p.wait_in_syscall(&[SYS_READ]);
    let t = Target::attach(p.pid()).expect("attach");
    // TracerPid names the tracing thread.
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() };
    assert_eq!(p.status_field("TracerPid:"), me.to_string());
    drop(t);
    assert_eq!(p.status_field("TracerPid:"), "0");
    p.wait_in_syscall(&[SYS_READ]);
    p.feed("after\n");
    assert_eq!(p.line(), "got after");
    assert_eq!(p.exit_code(), 7);
    assert!(probe_never_ran(&dir));
}
