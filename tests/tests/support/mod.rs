//! A process driven line by line through its stdin, for tests where the
//! order of a target's calls and a tool's actions must be exact.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const TIMEOUT: Duration = Duration::from_secs(30);

pub struct Driven {
    what: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    /// Everything printed on stdout so far.
    pub seen: Vec<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
    /// What it wrote to stderr so far, line by line as it came.
    stderr_so_far: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Driven {
    pub fn spawn(mut c: Command) -> Driven {
        let what = format!("{c:?}");
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}"));
        let stdin = child.stdin.take();
        let out = child.stdout.take().expect("stdout");
        let mut err = child.stderr.take().expect("stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let stderr_so_far = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let so_far = stderr_so_far.clone();
        let stderr = Some(std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                match err.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => so_far
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push_str(&String::from_utf8_lossy(&buf[..n])),
                }
            }
            so_far.lock().unwrap_or_else(|e| e.into_inner()).clone()
        }));
        Driven {
            what,
            child,
            stdin,
            lines,
            seen: Vec::new(),
            stderr,
            stderr_so_far,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends one line to the process.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin already closed");
        if let Err(e) = writeln!(stdin, "{line}").and_then(|_| stdin.flush()) {
            let err = self.kill();
            panic!("{}: cannot send `{line}`: {e}\nstderr: {err}", self.what);
        }
    }

    /// Waits for the next stdout line that starts with `prefix`, and returns it.
    pub fn wait_for(&mut self, prefix: &str) -> String {
        let end = Instant::now() + TIMEOUT;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if l.starts_with(prefix) {
                        return l;
                    }
                }
                Err(e) => {
                    let status = self.child.try_wait().ok().flatten();
                    let err = self.kill();
                    panic!(
                        "{} never printed `{prefix}...` ({e:?}; exit status {status:?}); stdout {:?}\nstderr: {err}",
                        self.what, self.seen
                    );
                }
            }
        }
    }

    /// Waits until the process wrote `n` stderr lines holding `text`; false at the timeout.
    pub fn wait_for_stderr(&self, text: &str, n: usize, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        loop {
            let seen = self
                .stderr_so_far
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .lines()
                .filter(|l| l.contains(text))
                .count();
            if seen >= n {
                return true;
            }
            if Instant::now() > end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Closes stdin (end of input) and waits for the process to exit; returns
    /// its status, and its remaining stdout lines and whole stderr.
    pub fn finish(mut self) -> (ExitStatus, Vec<String>, String) {
        drop(self.stdin.take());
        let end = Instant::now() + TIMEOUT;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                break s;
            }
            if Instant::now() > end {
                let err = self.kill();
                panic!(
                    "{} did not exit at end of input; stdout {:?}\nstderr: {err}",
                    self.what, self.seen
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut rest = Vec::new();
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(2)) {
            rest.push(l);
        }
        let err = self
            .stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        (status, rest, err)
    }

    /// Kills the process and returns its stderr.
    pub fn kill(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Driven {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The first `n` bytes of code at `addr` in process `pid`, as it runs now.
pub fn code_in_memory(pid: u32, addr: u64, n: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).expect("open /proc/pid/mem");
    let mut b = vec![0u8; n];
    mem.read_exact_at(&mut b, addr).expect("read target memory");
    b
}

/// The first `n` bytes of code at `addr` in process `pid`, as its file holds them.
pub fn code_in_file(pid: u32, addr: u64, n: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (lo, hi) = f[0].split_once('-').unwrap();
        let lo = u64::from_str_radix(lo, 16).unwrap();
        let hi = u64::from_str_radix(hi, 16).unwrap();
        if addr >= lo && addr < hi && f.len() >= 6 {
            let off = u64::from_str_radix(f[2], 16).unwrap();
            let file = std::fs::File::open(f[5]).expect("open mapped file");
            let mut b = vec![0u8; n];
            file.read_exact_at(&mut b, addr - lo + off)
                .expect("read file");
            return b;
        }
    }
    panic!("{addr:#x} is not mapped from a file in process {pid}");
}

/// Waits until `cond` holds, polling; panics with `what` after the timeout.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + TIMEOUT;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Parses `key=0x...` from a line such as ticker's `work=0x55...`.
pub fn hex_field(line: &str, key: &str) -> u64 {
    let v = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in `{line}`"));
    u64::from_str_radix(v.trim_start_matches("0x"), 16)
        .unwrap_or_else(|e| panic!("bad {key}= in `{line}`: {e}"))
}
