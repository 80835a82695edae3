//! Harness for end-to-end tests: runs real loaders under `bpftime load`, real
//! targets under `bpftime start` (or on the kernel, as the oracle), and reads
//! what they print.

pub mod bpf;
pub mod kernel_object;
pub mod kernel_version;
pub mod trace_check;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Directory of the build that holds `bpftime` and its libraries
/// (`target/<profile>`), found from this test executable.
pub fn build_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test>
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

/// The `bpftime` executable; panics with the command that builds it when missing.
pub fn bpftime() -> PathBuf {
    let dir = build_dir();
    for f in [
        "bpftime",
        "libbpftime_syscall_shim.so",
        "libbpftime_agent.so",
        "libbpftime_agent_starter.so",
    ] {
        assert!(
            dir.join(f).is_file(),
            "{} is missing: build the workspace first (`cargo build --workspace --release` for `cargo test --release`)",
            dir.join(f).display()
        );
    }
    dir.join("bpftime")
}

/// A workspace binary of another crate (the libbpf-rs loaders), beside bpftime.
pub fn workspace_bin(name: &str) -> PathBuf {
    let p = build_dir().join(name);
    assert!(
        p.is_file(),
        "{} is missing: build the workspace first",
        p.display()
    );
    p
}

pub use bpftime_bpf_examples as examples;

/// Copies an executable for a test to run. The copy is made by a `cp` process,
/// never by this one: tests run on many threads, and a child forked by another
/// thread while this process held the copy open for writing would keep that fd
/// until its exec, making the copy's own exec fail with ETXTBSY.
pub fn copy_executable(src: impl AsRef<Path>, dst: impl AsRef<Path>) {
    let (src, dst) = (src.as_ref(), dst.as_ref());
    let status = Command::new("cp")
        .arg(src)
        .arg(dst)
        .status()
        .expect("run cp");
    assert!(
        status.success(),
        "cp {} {} failed",
        src.display(),
        dst.display()
    );
}

/// Name -> (address, size) of the functions defined in `binary`, from `nm`
/// (binutils), for naming the frames of user stacks.
pub fn function_symbols(binary: &str) -> std::collections::HashMap<String, (u64, u64)> {
    let out = Command::new("nm")
        .args(["-S", "--defined-only", binary])
        .output()
        .expect("nm (binutils) is needed to symbolize stacks");
    assert!(out.status.success(), "nm {binary} failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 4 && f[2].eq_ignore_ascii_case("t")).then(|| {
                (
                    f[3].to_string(),
                    (
                        u64::from_str_radix(f[0], 16).unwrap(),
                        u64::from_str_radix(f[1], 16).unwrap(),
                    ),
                )
            })
        })
        .collect()
}

/// A private store, removed at the end of the test.
pub struct Session {
    pub store: String,
    pub tmp: PathBuf,
}

impl Session {
    pub fn new(tag: &str) -> Session {
        let store = format!("test-{tag}-{}", std::process::id());
        let _ = std::fs::remove_dir_all(bpftime_runtime::Store::dir_for(&store));
        let tmp = std::env::temp_dir().join(format!("bpftime-{store}"));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).expect("temp dir");
        Session { store, tmp }
    }

    /// A private copy of the `calls` target: uprobes are per file, so tests
    /// running at once must not share one.
    pub fn target_copy(&self, src: &str) -> PathBuf {
        self.target_copy_named(src, Path::new(src).file_name().expect("file name"))
    }

    /// [`target_copy`](Self::target_copy) under another file name: its command name
    /// (`comm`) is then this run's own, for filters that pick its events.
    pub fn target_copy_named(&self, src: &str, name: impl AsRef<Path>) -> PathBuf {
        let dst = self.tmp.join(name);
        copy_executable(src, &dst);
        dst
    }

    /// Builds `source` (BPF C) into `NAME.bpf.o` in the session's directory with clang
    /// (`$CLANG`, clang-19 by default), as a tool's author would.
    pub fn compile_bpf(&self, name: &str, source: &str) -> PathBuf {
        let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang-19".into());
        let src = self.tmp.join(format!("{name}.bpf.c"));
        let obj = self.tmp.join(format!("{name}.bpf.o"));
        std::fs::write(&src, source).unwrap();
        let multiarch = Command::new("gcc")
            .arg("-print-multiarch")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let out = Command::new(&clang)
            .args(["-g", "-O2", "-target", "bpf"])
            .arg(format!("-I/usr/include/{multiarch}"))
            .arg("-c")
            .arg(&src)
            .arg("-o")
            .arg(&obj)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {clang}: {e}"));
        assert!(
            out.status.success(),
            "{clang} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        obj
    }

    pub fn bpftime(&self) -> Command {
        let mut c = Command::new(bpftime());
        c.arg("--store").arg(&self.store);
        c.env_remove("BPFTIME_STORE");
        c
    }

    /// Starts `bpftime load <tool...>` and waits for the tool to print `ready`.
    pub fn load(&self, tool: &[&str]) -> Tool {
        let mut c = self.bpftime();
        c.arg("load").args(tool);
        Tool::spawn(c)
    }

    /// Runs a one-probe bpftrace script under `bpftime load`; returns once its probe
    /// is attached and it can take a SIGINT.
    pub fn load_bpftrace(&self, script: &str) -> Tool {
        let mut c = self.bpftime();
        c.args(["load", "bpftrace", "-e", script]);
        let tool = Tool::spawn_until(c, "Attaching 1 probe...");
        self.wait_for_links(1);
        // bpftrace prints no line once it is ready; a SIGINT in the last part of its
        // start-up is lost (on the kernel too), so give it the time the kernel run gets.
        std::thread::sleep(Duration::from_secs(2));
        tool
    }

    /// Waits until the store holds at least `n` links (a loader that prints no
    /// `ready` line, like bpftrace, has attached).
    pub fn wait_for_links(&self, n: usize) {
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end {
            if let Ok(store) = bpftime_runtime::Store::open(&self.store) {
                if store.ids(bpftime_runtime::ObjectKind::Link).len() >= n {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("no link appeared in store {}", self.store);
    }

    /// Runs `bpftime start <app...>` to completion.
    pub fn start(&self, app: &[&str]) -> std::process::Output {
        let mut c = self.bpftime();
        c.arg("start").args(app);
        run_with_timeout(c, Duration::from_secs(60))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(bpftime_runtime::Store::dir_for(&self.store));
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

/// Panics with the way out when bpftrace is missing (the setup script installs it).
pub fn require_bpftrace() {
    let installed = Command::new("bpftrace")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        installed,
        "bpftrace is not installed: run scripts/setup.sh (Debian package bpftrace)"
    );
}

/// A loader running in the background.
pub struct Tool {
    child: Child,
    lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
    /// While set, nothing reads the tool's stdout: its pipe fills and its writes
    /// block, as behind a slow reader such as `less`.
    output_held: Arc<AtomicBool>,
}

impl Tool {
    pub fn spawn(c: Command) -> Tool {
        Self::spawn_until(c, "ready")
    }

    /// Starts a loader and waits until it prints `line`.
    pub fn spawn_until(mut c: Command, line: &str) -> Tool {
        c.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null());
        let mut child = c.spawn().expect("spawn loader");
        let out = child.stdout.take().expect("stdout");
        let mut err = child.stderr.take().expect("stderr");
        let (tx, lines) = mpsc::channel();
        let output_held = Arc::new(AtomicBool::new(false));
        let held = output_held.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                while held.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let stderr = Some(std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        }));
        let mut t = Tool {
            child,
            lines,
            seen: Vec::new(),
            stderr,
            output_held,
        };
        t.wait_for_line(line, Duration::from_secs(30));
        t
    }

    /// Waits until `n` of the lines the tool printed so far satisfy `is_event`, for a tool
    /// whose lines carry times and so cannot be waited for by their text; returns false at
    /// the timeout, leaving the tool running for `stop` to collect what it said.
    pub fn wait_for_count(
        &mut self,
        is_event: impl Fn(&str) -> bool,
        n: usize,
        timeout: Duration,
    ) -> bool {
        let end = Instant::now() + timeout;
        while self.seen.iter().filter(|l| is_event(l)).count() < n {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => self.seen.push(l),
                Err(_) => return false,
            }
        }
        true
    }

    /// Waits until the tool prints `line`; panics with everything it said otherwise.
    pub fn wait_for_line(&mut self, line: &str, timeout: Duration) {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let hit = l == line;
                    self.seen.push(l);
                    if hit {
                        return;
                    }
                }
                Err(_) => {
                    let err = self.kill_and_take_stderr();
                    panic!(
                        "loader never printed `{line}`; stdout: {:?}\nstderr: {err}",
                        self.seen
                    );
                }
            }
        }
    }

    /// Kills the tool and returns what it wrote to stderr (for failure messages).
    fn kill_and_take_stderr(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }

    /// Interrupts the tool as Ctrl-C would and returns (exit code, stdout lines, stderr).
    pub fn stop(self) -> (i32, Vec<String>, String) {
        self.try_stop().unwrap_or_else(|why| panic!("{why}"))
    }

    /// [`Tool::stop`], or why not: the tool did not exit within 60 s of SIGINT (it is
    /// killed then). For a tool the test runs as an oracle (bpftrace on the kernel),
    /// whose own failure says nothing of ours.
    ///
    /// A tool still running 10 s after a SIGINT gets another, as a user presses Ctrl-C
    /// again: bpftrace 0.17 checks for the signal only when `epoll_wait` returns, and one
    /// that lands just before it enters the call leaves it polling (on the kernel too).
    pub fn try_stop(mut self) -> Result<(i32, Vec<String>, String), String> {
        let interrupt = |child: &Child| {
            // SAFETY: sends SIGINT to our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        };
        interrupt(&self.child);
        self.output_held.store(false, Ordering::Release);
        let started = Instant::now();
        let end = started + Duration::from_secs(60);
        let mut next_interrupt = started + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                break s;
            }
            if Instant::now() > next_interrupt {
                interrupt(&self.child);
                next_interrupt += Duration::from_secs(10);
            }
            if Instant::now() > end {
                let err = self.kill_and_take_stderr();
                return Err(format!(
                    "loader did not exit within 60 s of SIGINT; stdout {:?}\nstderr: {err}",
                    self.seen
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(2)) {
            self.seen.push(l);
        }
        let err = self
            .stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        Ok((
            status.code().unwrap_or(-1),
            std::mem::take(&mut self.seen),
            err,
        ))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops reading the tool's stdout until `stop` (see `output_held`).
    pub fn hold_output(&self) {
        self.output_held.store(true, Ordering::Release);
    }

    /// Waits until the tool's main thread is blocked writing to its stdout pipe,
    /// which `hold_output` has let fill up.
    pub fn wait_until_blocked_writing(&mut self, timeout: Duration) {
        let proc = format!("/proc/{}", self.pid());
        let end = Instant::now() + timeout;
        loop {
            let syscall = std::fs::read_to_string(format!("{proc}/syscall")).unwrap_or_default();
            let wchan = std::fs::read_to_string(format!("{proc}/wchan")).unwrap_or_default();
            // x86-64 write(2) is syscall 1; its first argument, fd 1.
            if syscall.starts_with("1 0x1 ") && wchan.contains("pipe_write") {
                return;
            }
            if Instant::now() > end {
                let err = self.kill_and_take_stderr();
                panic!(
                    "the tool never blocked writing its output (syscall {syscall:?}, \
                     wchan {wchan:?}); stderr: {err}"
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Tool {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn run_with_timeout(mut c: Command, timeout: Duration) -> std::process::Output {
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("spawn");
    let end = Instant::now() + timeout;
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() > end {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "timed out: {:?}\nstderr: {}",
                c,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The value of `key=` in the first line that starts with `prefix`.
pub fn field(lines: &[String], prefix: &str, key: &str) -> Option<u64> {
    lines
        .iter()
        .filter(|l| l.starts_with(prefix))
        .find_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{key}=")))
                .and_then(|v| v.parse().ok())
        })
}

/// Why the kernel cannot serve as the oracle here, if it cannot.
pub fn kernel_unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not running as root".into());
    }
    if !Path::new("/sys/bus/event_source/devices/uprobe/type").exists() {
        return Some("the kernel has no uprobe PMU".into());
    }
    None
}

/// Why the kernel cannot pin (serve as the oracle for pinning and `bpftool prog loadall`),
/// if it cannot. A freshly booted machine may have nothing mounted at `/sys/fs/bpf`
/// (systemd mounts it on most distributions, and bpftool mounts it when it pins): the
/// kernel's pins then fail with ENOENT until something mounts it, so a test that compares
/// with the kernel mounts bpffs there first, as bpftool would.
pub fn kernel_bpffs_unavailable() -> Option<String> {
    if let Some(why) = kernel_unavailable() {
        return Some(why);
    }
    static MOUNTED: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = MOUNTED.lock().unwrap_or_else(|e| e.into_inner());
    let root = c"/sys/fs/bpf";
    // From the mount table, not statfs(): this process links the syscall shim, whose
    // statfs() answers for paths under /sys/fs/bpf from a store.
    let is_bpffs = || {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .rev()
            .find_map(|l| {
                // The last mount at a path is the one its users see.
                let mount_point = l.split(' ').nth(4)?;
                let fs_type = l.split(" - ").nth(1)?.split(' ').next()?;
                (mount_point == "/sys/fs/bpf").then_some(fs_type == "bpf")
            })
            .unwrap_or(false)
    };
    if is_bpffs() {
        return None;
    }
    // SAFETY: NUL-terminated strings; mounting a new bpffs instance changes nothing else.
    let r = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            root.as_ptr(),
            c"bpf".as_ptr(),
            0,
            c"mode=0700".as_ptr().cast(),
        )
    };
    let mount_error = std::io::Error::last_os_error();
    if r != 0 && !is_bpffs() {
        return Some(format!(
            "no bpffs at /sys/fs/bpf, and mounting one failed: {mount_error}"
        ));
    }
    None
}
