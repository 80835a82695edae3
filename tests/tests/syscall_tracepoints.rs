//! System call tracepoints under bpftime against the kernel's, on one workload: a libbpf
//! tool of ours (`syscall_tp`: openat's arguments and results through
//! `tracepoint/syscalls/sys_enter_openat` and `sys_exit_openat`, calls counted by number
//! through `raw_tracepoint/sys_enter` and `sys_exit`) watching the `syscalls` target,
//! which opens files on several threads through the C library, its `syscall()` and a
//! `syscall` instruction of its own, then once more in a forked child.
//!
//! The kernel runs the tool with tracefs mounted in a private mount namespace (loaders
//! find tracepoint ids there); under `bpftime load` tracefs stays unmounted, and the
//! shim answers for its files.

use bpftime_syscalls::{Event, Ids};
use bpftime_tests::{examples, kernel_unavailable, Session, Tool};
use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

const ROUNDS: u32 = 20;

/// The tests here run one at a time: bpftrace's syscount.bt counts every process's calls on
/// the kernel, and the others' targets make the same calls.
fn alone() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}
const THREADS: u32 = 4;

/// `program args...` in a private mount namespace with tracefs mounted where loaders
/// look for it; the namespace (and the mount) go when the program exits.
fn with_tracefs(program: &str, args: &[&str]) -> Command {
    let mut c = Command::new("unshare");
    c.args([
        "-m",
        "sh",
        "-c",
        "mount -t tracefs nodev /sys/kernel/tracing && exec \"$@\"",
        "sh",
        program,
    ])
    .args(args);
    c
}

/// What the kernel's tracefs says of every syscall event: (path, id, format text).
fn kernel_formats() -> Vec<(String, u32, String)> {
    let script = "mount -t tracefs nodev /sys/kernel/tracing && cd /sys/kernel/tracing/events && \
                  for f in syscalls/*/format raw_syscalls/sys_enter/format raw_syscalls/sys_exit/format; do \
                  printf '=== %s\\n' \"$f\"; cat \"$f\"; done";
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", script])
        .output()
        .expect("unshare");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    text.split("=== ")
        .filter(|s| !s.is_empty())
        .map(|chunk| {
            let (path, format) = chunk.split_once('\n').unwrap();
            let path = path.trim_end_matches("/format").to_string();
            let id = format
                .lines()
                .find_map(|l| l.strip_prefix("ID: "))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{path}: no id in {format}"));
            (path, id, format.to_string())
        })
        .collect()
}

#[test]
fn formats_are_the_kernels_byte_for_byte_and_every_event_is_served() {
    let _alone = alone();
    if let Some(why) = kernel_unavailable() {
        eprintln!("skipped, no kernel to compare with: {why}");
        return;
    }
    let kernel = kernel_formats();
    assert!(kernel.len() > 600, "{} events", kernel.len());
    for (path, id, format) in &kernel {
        let (group, name) = path.split_once('/').unwrap();
        let event = Event::parse(group, name)
            .unwrap_or_else(|| panic!("the kernel has {path}, which bpftime does not serve"));
        assert_eq!(&event.format(*id), format, "{path}");
    }
    let served = Event::all().count();
    assert_eq!(
        served,
        kernel.len(),
        "events served that this kernel does not have"
    );
    // With tracefs readable, the shim's ids are the kernel's.
    let ids = Ids::from_lookup(|e| {
        let path = e.path();
        kernel
            .iter()
            .find(|(p, _, _)| *p == path)
            .map(|(_, id, _)| *id)
    })
    .expect("the kernel's ids");
    for (path, id, _) in &kernel {
        let (group, name) = path.split_once('/').unwrap();
        assert_eq!(
            ids.id(Event::parse(group, name).unwrap()),
            Some(*id),
            "{path}"
        );
    }
}

/// One openat the tool reported, as compared: the thread and the descriptor number are
/// left out (threads and the descriptors a process holds differ between runs); a
/// failure keeps its errno.
fn open_key(line: &str) -> Option<String> {
    let rest = line.strip_prefix("open ")?;
    let field = |k: &str| {
        rest.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")))
            .unwrap_or("?")
            .to_string()
    };
    let ret: i64 = field("ret").parse().ok()?;
    let file = rest.split_once(" file=")?.1;
    Some(format!(
        "nr={} dfd={} flags={} mode={} ret={} file={file}",
        field("nr"),
        field("dfd"),
        field("flags"),
        field("mode"),
        if ret >= 0 {
            "fd".to_string()
        } else {
            ret.to_string()
        }
    ))
}

/// The tool's openat records under `prefix`, counted, and its counts by key.
fn summary(lines: &[String], prefix: &str) -> (BTreeMap<String, u64>, BTreeMap<u32, u64>) {
    let mut opens = BTreeMap::new();
    for key in lines.iter().filter_map(|l| open_key(l)) {
        if key.contains(&format!("file={prefix}")) {
            *opens.entry(key).or_insert(0) += 1;
        }
    }
    let counts = lines
        .iter()
        .filter_map(|l| {
            let rest = l.strip_prefix("count key=")?;
            let (k, n) = rest.split_once(" n=")?;
            Some((k.parse().ok()?, n.parse().ok()?))
        })
        .collect();
    (opens, counts)
}

/// What the target's workload opens: each file in three ways, once per thread and round
/// and once in its child; the descriptors of files that exist, ENOENT for the other.
fn expected_opens(files: &[String]) -> BTreeMap<String, u64> {
    let times = u64::from(ROUNDS * THREADS + 1);
    let mut out = BTreeMap::new();
    for f in files {
        let ret = if f.ends_with("missing") { "-2" } else { "fd" };
        // open(): AT_FDCWD as the C library passes it (an `int`, zero-extended in rdi),
        // O_RDONLY|O_CLOEXEC; syscall(): O_NONBLOCK; the target's own instruction: a
        // 64-bit AT_FDCWD, O_NOCTTY, mode 0640.
        for (dfd, flags, mode) in [
            ("4294967196", libc::O_CLOEXEC, 0),
            ("4294967196", libc::O_NONBLOCK, 0),
            ("-100", libc::O_NOCTTY, 0o640),
        ] {
            out.insert(
                format!("nr=257 dfd={dfd} flags={flags} mode={mode} ret={ret} file={f}"),
                times,
            );
        }
    }
    out
}

/// Runs the workload `target` (a private copy, so that its command name is this run's)
/// with the tool watching it, on the kernel or under bpftime; returns the tool's lines.
fn workload(s: &Session, target: &str, kernel: bool, files: &[String]) -> Vec<String> {
    let comm = std::path::Path::new(target)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let prefix = s.tmp.to_str().unwrap().to_string();
    let tool_args = ["-c", comm.as_str(), "-p", prefix.as_str()];
    let tool = if kernel {
        Tool::spawn(with_tracefs(examples::SYSCALL_TP, &tool_args))
    } else {
        let mut args = vec![examples::SYSCALL_TP];
        args.extend(tool_args);
        s.load(&args)
    };
    let mut app_args = vec![ROUNDS.to_string(), THREADS.to_string()];
    app_args.extend(files.iter().cloned());
    let out = if kernel {
        Command::new(target).args(&app_args).output().unwrap()
    } else {
        let mut c = s.bpftime();
        c.arg("start").arg(target).args(&app_args);
        bpftime_tests::run_with_timeout(c, Duration::from_secs(120))
    };
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("child=0"),
        "the target failed: {out:?}"
    );
    // The last records reach the ring a little after the target exits.
    std::thread::sleep(Duration::from_millis(300));
    let (code, lines, err) = tool.stop();
    assert_eq!(code, 0, "the tool failed: {lines:?}\n{err}");
    lines
}

#[test]
fn openat_arguments_and_counts_by_number_match_the_kernel() {
    let _alone = alone();
    let s = Session::new("systp");
    let files: Vec<String> = ["one", "two", "missing"]
        .iter()
        .map(|n| s.tmp.join(n).to_str().unwrap().to_string())
        .collect();
    std::fs::write(&files[0], "1").unwrap();
    std::fs::write(&files[1], "2").unwrap();
    let prefix = s.tmp.to_str().unwrap();
    let want_opens = expected_opens(&files);
    let calls = u64::from(ROUNDS * THREADS + 1);
    let check = |who: &str, lines: &[String]| {
        let (opens, counts) = summary(lines, prefix);
        assert_eq!(opens, want_opens, "{who}: openat records");
        // getppid twice per round (C library, own instruction), and once more in the
        // process and in its child to learn their parent, at entry and at return; openat
        // under the prefix through pt_regs at entry.
        assert_eq!(
            counts.get(&110),
            Some(&(2 * calls + 2)),
            "{who}: getppid entries"
        );
        assert_eq!(
            counts.get(&2110),
            Some(&(2 * calls + 2)),
            "{who}: getppid returns"
        );
        assert_eq!(
            counts.get(&1000),
            Some(&(9 * calls)),
            "{who}: openat through pt_regs"
        );
        (opens, counts)
    };
    let ours_named = s.target_copy_named(
        examples::SYSCALLS,
        format!("stb{}", std::process::id() % 100_000),
    );
    let lines = workload(&s, ours_named.to_str().unwrap(), false, &files);
    check("bpftime", &lines);
    match kernel_unavailable() {
        Some(why) => eprintln!("kernel comparison skipped: {why}"),
        None => {
            let k_named = s.target_copy_named(
                examples::SYSCALLS,
                format!("stk{}", std::process::id() % 100_000),
            );
            let lines = workload(&s, k_named.to_str().unwrap(), true, &files);
            check("kernel", &lines);
        }
    }
}

/// A statically linked target has no dynamic loader to preload the agent with: `bpftime
/// start` says so and runs it untraced, as it is; the kernel traces it exactly.
#[test]
fn a_static_target_runs_untraced_with_a_notice_and_the_kernel_traces_it() {
    let _alone = alone();
    let s = Session::new("systp-static");
    let file = s.tmp.join("one");
    std::fs::write(&file, "1").unwrap();
    let named = s.target_copy_named(
        examples::SYSCALLS_STATIC,
        format!("sts{}", std::process::id() % 100_000),
    );
    let files = vec![file.to_str().unwrap().to_string()];
    let mut c = s.bpftime();
    c.arg("start").arg(&named).args(["1", "1"]).args(&files);
    let out = bpftime_tests::run_with_timeout(c, Duration::from_secs(60));
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is statically linked"), "{err}");
    if let Some(why) = kernel_unavailable() {
        eprintln!("kernel comparison skipped: {why}");
        return;
    }
    let lines = workload(&s, named.to_str().unwrap(), true, &files);
    let (opens, _) = summary(&lines, s.tmp.to_str().unwrap());
    assert_eq!(
        opens.values().sum::<u64>(),
        3 * u64::from(ROUNDS * THREADS + 1)
    );
}

/// What a loader says when a program does not attach: gpu_probes' `cannot attach` line.
fn attach_failure(mut c: Command) -> String {
    let out = bpftime_tests::run_with_timeout(
        {
            c.env("LC_ALL", "C");
            c
        },
        Duration::from_secs(60),
    );
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(1),
        "the loader should fail: {out:?}"
    );
    err.lines()
        .find(|l| l.starts_with("cannot attach program"))
        .unwrap_or_else(|| panic!("no attach failure in: {err}"))
        .to_string()
}

/// A tracepoint that does not exist, a raw tracepoint that does not exist, and a program
/// that reads past its record: each refused at attach with the kernel's errno (ENOENT
/// for the id file libbpf reads and for the raw tracepoint, EACCES for the read).
#[test]
fn bad_tracepoints_and_reads_past_the_record_fail_as_on_the_kernel() {
    let _alone = alone();
    let s = Session::new("systp-bad");
    let cases = [
        (
            "nosuch",
            "SEC(\"tracepoint/syscalls/sys_enter_nosuchcall\") int p(void *ctx) { return 0; }",
            "No such file or directory",
        ),
        (
            "rawnosuch",
            "SEC(\"raw_tracepoint/nosuch_tp\") int p(void *ctx) { return 0; }",
            "No such file or directory",
        ),
        (
            "past",
            "SEC(\"tracepoint/syscalls/sys_enter_getppid\") \
             int p(unsigned long long *ctx) { return ctx[2] == 7; }",
            "Permission denied",
        ),
    ];
    for (name, body, errno_text) in cases {
        let source = format!(
            "#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\n{body}\n\
             char LICENSE[] SEC(\"license\") = \"GPL\";\n"
        );
        let obj = s.compile_bpf(name, &source);
        let obj = obj.to_str().unwrap();
        let mut c = s.bpftime();
        c.args(["load", examples::GPU_PROBES, "--obj", obj]);
        let ours = attach_failure(c);
        assert!(ours.ends_with(errno_text), "{name}: {ours}");
        match kernel_unavailable() {
            Some(why) => eprintln!("kernel comparison skipped: {why}"),
            None => {
                let kernel = attach_failure(with_tracefs(examples::GPU_PROBES, &["--obj", obj]));
                assert_eq!(ours, kernel, "{name}");
            }
        }
    }
}

/// `run` under bpftime (`false`) and, where the kernel can answer, on the kernel (`true`):
/// both must give `want`.
fn bpftime_and_kernel_give<T: PartialEq + std::fmt::Debug>(want: &T, run: impl Fn(bool) -> T) {
    assert_eq!(&run(false), want, "bpftime");
    match kernel_unavailable() {
        Some(why) => eprintln!("kernel comparison skipped: {why}"),
        None => assert_eq!(&run(true), want, "kernel"),
    }
}

/// `@[key]: N` lines of a bpftrace map, by key.
fn bpftrace_map(lines: &[String]) -> BTreeMap<String, u64> {
    lines
        .iter()
        .filter_map(|l| {
            let rest = l.strip_prefix("@[")?;
            let (k, n) = rest.rsplit_once("]: ")?;
            Some((k.to_string(), n.trim().parse().ok()?))
        })
        .collect()
}

/// bpftrace's `tracepoint:syscalls:sys_enter_openat` with a filter on `comm`, reading
/// `args->filename` through the format file's layout, under `bpftime load` and on the
/// kernel: the same files, counted the same.
#[test]
fn a_bpftrace_one_liner_on_sys_enter_openat_counts_as_on_the_kernel() {
    let _alone = alone();
    bpftime_tests::require_bpftrace();
    let s = Session::new("systp-bt");
    let files: Vec<String> = ["one", "missing"]
        .iter()
        .map(|n| s.tmp.join(n).to_str().unwrap().to_string())
        .collect();
    std::fs::write(&files[0], "1").unwrap();
    let run = |kernel: bool| -> BTreeMap<String, u64> {
        let comm = format!("sbt{}{}", u8::from(kernel), std::process::id() % 100_000);
        let named = s.target_copy_named(examples::SYSCALLS, &comm);
        let script = format!(
            "tracepoint:syscalls:sys_enter_openat /comm == \"{comm}\"/ {{ @[str(args->filename)] = count(); }}"
        );
        let tool = if kernel {
            let t = Tool::spawn_until(
                with_tracefs("bpftrace", &["-e", &script]),
                "Attaching 1 probe...",
            );
            // A SIGINT in the last part of bpftrace's start-up is lost (see Session::load_bpftrace).
            std::thread::sleep(Duration::from_secs(2));
            t
        } else {
            s.load_bpftrace(&script)
        };
        let mut app = if kernel {
            Command::new(&named)
        } else {
            let mut c = s.bpftime();
            c.arg("start").arg(&named);
            c
        };
        app.args([ROUNDS.to_string(), THREADS.to_string()])
            .args(&files);
        let out = bpftime_tests::run_with_timeout(app, Duration::from_secs(120));
        assert!(out.status.success(), "{out:?}");
        let (_, lines, err) = tool.stop();
        let map = bpftrace_map(&lines);
        assert!(
            !map.is_empty(),
            "bpftrace counted nothing: {lines:?}\n{err}"
        );
        map.into_iter()
            .filter(|(k, _)| k.starts_with(s.tmp.to_str().unwrap()))
            .collect()
    };
    let times = 3 * u64::from(ROUNDS * THREADS + 1);
    let want: BTreeMap<String, u64> = files.iter().map(|f| (f.clone(), times)).collect();
    bpftime_and_kernel_give(&want, run);
}

const OPENSNOOP: &str = "/usr/sbin/opensnoop";
const SYSCOUNT: &str = "/usr/sbin/syscount";

fn require(tool: &str) {
    assert!(
        std::path::Path::new(tool).exists(),
        "{tool} is missing: run scripts/setup.sh (Debian package libbpf-tools)"
    );
}

/// opensnoop's workload: a perf buffer event per open, which the kernel drops when the
/// tool falls behind on a busy machine (it says "lost N events"); kept small.
const SNOOP_ROUNDS: u32 = 4;
const SNOOP_THREADS: u32 = 2;

/// The opens an opensnoop printed (`PID COMM FD ERR PATH`, libbpf-tools' and bpftrace's
/// alike) of files under `prefix`, by command `comm` where given, counted by what they
/// returned: `fd` for a descriptor (its number left out), else the result and errno.
fn snooped_opens(lines: &[String], comm: Option<&str>, prefix: &str) -> BTreeMap<String, u64> {
    let mut opens = BTreeMap::new();
    for l in lines {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() == 5 && comm.is_none_or(|c| f[1] == c) && f[4].starts_with(prefix) {
            let fd = if f[2].parse::<i64>().is_ok_and(|fd| fd >= 0) {
                "fd"
            } else {
                f[2]
            };
            *opens
                .entry(format!("{fd} err={} {}", f[3], f[4]))
                .or_insert(0) += 1;
        }
    }
    opens
}

/// What an opensnoop reports of the snoop workload on `files` (one that exists, one that
/// does not): three opens of each a thread and round, and in the child.
fn expected_snooped_opens(files: &[String]) -> BTreeMap<String, u64> {
    let times = 3 * u64::from(SNOOP_ROUNDS * SNOOP_THREADS + 1);
    [
        (format!("fd err=0 {}", files[0]), times),
        (format!("-1 err=2 {}", files[1]), times),
    ]
    .into_iter()
    .collect()
}

/// libbpf-tools' opensnoop, unmodified, on the workload, under bpftime and on the kernel:
/// the same opens, with the same flags and errors.
#[test]
fn opensnoop_reports_every_open_as_on_the_kernel() {
    let _alone = alone();
    require(OPENSNOOP);
    let s = Session::new("systp-os");
    let files: Vec<String> = ["one", "missing"]
        .iter()
        .map(|n| s.tmp.join(n).to_str().unwrap().to_string())
        .collect();
    std::fs::write(&files[0], "1").unwrap();
    let run = |kernel: bool| -> BTreeMap<String, u64> {
        let comm = format!("sos{}{}", u8::from(kernel), std::process::id() % 100_000);
        let named = s.target_copy_named(examples::SYSCALLS, &comm);
        // Tools print to a pipe in blocks; stdbuf -oL makes their lines arrive as printed.
        let args = ["-oL", OPENSNOOP, "-n", comm.as_str()];
        let header = "PID    COMM              FD ERR PATH";
        let tool = if kernel {
            Tool::spawn_until(with_tracefs("stdbuf", &args), header)
        } else {
            let mut c = s.bpftime();
            c.arg("load").arg("stdbuf").args(args);
            Tool::spawn_until(c, header)
        };
        let mut app = if kernel {
            Command::new(&named)
        } else {
            let mut c = s.bpftime();
            c.arg("start").arg(&named);
            c
        };
        app.args([SNOOP_ROUNDS.to_string(), SNOOP_THREADS.to_string()])
            .args(&files);
        let out = bpftime_tests::run_with_timeout(app, Duration::from_secs(120));
        assert!(out.status.success(), "{out:?}");
        std::thread::sleep(Duration::from_millis(500));
        let (_, lines, err) = tool.stop();
        let opens = snooped_opens(&lines, None, s.tmp.to_str().unwrap());
        assert!(!opens.is_empty(), "opensnoop saw nothing: {lines:?}\n{err}");
        opens
    };
    let want = expected_snooped_opens(&files);
    bpftime_and_kernel_give(&want, run);
}

/// Waits until the agent in process `pid`, which started before the tool, has seen the
/// tool's links and armed the hooks: its SIGSYS handler is installed then, and its threads
/// are armed right after (given half a second).
fn wait_for_hooks(pid: &str) {
    let caught = || -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while caught() & 1 << (libc::SIGSYS - 1) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent never attached"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// libbpf-tools' syscount -p, unmodified, pointed at the workload before it starts (it
/// counts at `raw_syscalls:sys_exit` by number): the same counts of the calls the workload
/// makes a fixed number of times, under bpftime and on the kernel.
#[test]
fn syscount_counts_a_process_calls_as_on_the_kernel() {
    let _alone = alone();
    require(SYSCOUNT);
    let s = Session::new("systp-sc");
    let files: Vec<String> = ["one", "missing"]
        .iter()
        .map(|n| s.tmp.join(n).to_str().unwrap().to_string())
        .collect();
    std::fs::write(&files[0], "1").unwrap();
    let run = |kernel: bool| -> BTreeMap<String, u64> {
        use std::io::{BufRead, BufReader, Write};
        let mut app = if kernel {
            Command::new(examples::SYSCALLS)
        } else {
            let mut c = s.bpftime();
            c.arg("start").arg(examples::SYSCALLS);
            c
        };
        app.args([ROUNDS.to_string(), THREADS.to_string()])
            .args(&files)
            .env("SYSCALLS_WAIT", "1")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        let mut child = app.spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let pid: i32 = line.trim().strip_prefix("pid=").unwrap().parse().unwrap();
        let pid_s = pid.to_string();
        let args = ["-oL", SYSCOUNT, "-p", pid_s.as_str()];
        let ready = "Tracing syscalls, printing top 10... Ctrl+C to quit.";
        let tool = if kernel {
            Tool::spawn_until(with_tracefs("stdbuf", &args), ready)
        } else {
            let mut c = s.bpftime();
            c.arg("load").arg("stdbuf").args(args);
            let t = Tool::spawn_until(c, ready);
            wait_for_hooks(&pid_s);
            std::thread::sleep(Duration::from_millis(500));
            t
        };
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
        assert!(
            child.wait().unwrap().success() && rest.contains("child=0"),
            "{rest}"
        );
        let (_, lines, err) = tool.stop();
        let counts: BTreeMap<String, u64> = lines
            .iter()
            .filter_map(|l| {
                let (name, n) = l.split_once(char::is_whitespace)?;
                Some((name.to_string(), n.trim().parse().ok()?))
            })
            .filter(|(name, _)| ["openat", "getppid", "close"].contains(&name.as_str()))
            .collect();
        assert_eq!(counts.len(), 3, "syscount: {lines:?}\n{err}");
        counts
    };
    // The parent's calls only (-p): each thread's rounds, and the getppid that tells the
    // process its parent; the fork child is another pid.
    let rounds = u64::from(ROUNDS * THREADS);
    let want: BTreeMap<String, u64> = [
        ("openat".to_string(), 3 * 2 * rounds),
        ("close".to_string(), 3 * rounds),
        ("getppid".to_string(), 2 * rounds + 1),
    ]
    .into_iter()
    .collect();
    bpftime_and_kernel_give(&want, run);
}

/// Tools attach and detach, again and again, while the target's threads make system calls
/// without pause: the target's own calls all give their right results (it checks every
/// open and getppid), its threads and its child finish, and each tool run saw calls and
/// exited cleanly.
#[test]
fn tools_attach_and_detach_while_threads_make_system_calls() {
    let _alone = alone();
    let s = Session::new("systp-stress");
    let files: Vec<String> = ["one", "missing"]
        .iter()
        .map(|n| s.tmp.join(n).to_str().unwrap().to_string())
        .collect();
    std::fs::write(&files[0], "1").unwrap();
    let comm = format!("sst{}", std::process::id() % 100_000);
    let named = s.target_copy_named(examples::SYSCALLS, &comm);
    let mut app = s.bpftime();
    app.arg("start")
        .arg(&named)
        .args(["20000", "8"])
        .args(&files)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut app = app.spawn().unwrap();
    let prefix = s.tmp.to_str().unwrap().to_string();
    let (mut runs, mut saw) = (0, 0);
    // While the target runs (seconds under the hooks), up to 8 tool runs.
    while runs < 8 && app.try_wait().unwrap().is_none() {
        let tool = s.load(&[examples::SYSCALL_TP, "-c", &comm, "-p", &prefix]);
        std::thread::sleep(Duration::from_millis(400));
        let (code, lines, err) = tool.stop();
        assert_eq!(code, 0, "tool run {runs}: {err}");
        runs += 1;
        if !summary(&lines, &prefix).0.is_empty() {
            saw += 1;
        }
    }
    let out = app.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("child=0 errors=0"),
        "the target's calls went wrong under attaching and detaching tools: {out:?}"
    );
    assert!(
        saw >= 2,
        "{runs} tool runs, {saw} of which saw calls, before the target finished: {stdout}"
    );
    eprintln!("{runs} tool runs came and went, {saw} saw calls");
}

/// `bpftime attach` into a process started without bpftime, waiting on its stdin: once
/// a tool attaches, the threads it starts and its child are traced as under `bpftime
/// start`.
#[test]
fn an_attached_process_gets_its_system_calls_traced() {
    let _alone = alone();
    use std::io::{BufRead, BufReader, Write};
    let s = Session::new("systp-attach");
    let files: Vec<String> = ["one", "missing"]
        .iter()
        .map(|n| s.tmp.join(n).to_str().unwrap().to_string())
        .collect();
    std::fs::write(&files[0], "1").unwrap();
    let comm = format!("sat{}", std::process::id() % 100_000);
    let named = s.target_copy_named(examples::SYSCALLS, &comm);
    let mut child = Command::new(&named)
        .args([ROUNDS.to_string(), THREADS.to_string()])
        .args(&files)
        .env("SYSCALLS_WAIT", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let pid = line.trim().strip_prefix("pid=").unwrap().to_string();
    let mut attach = s.bpftime();
    attach.args(["attach", &pid]);
    let r = bpftime_tests::run_with_timeout(attach, Duration::from_secs(60));
    assert!(r.status.success(), "{r:?}");
    let prefix = s.tmp.to_str().unwrap().to_string();
    let tool = s.load(&[examples::SYSCALL_TP, "-c", &comm, "-p", &prefix]);
    wait_for_hooks(&pid);
    std::thread::sleep(Duration::from_millis(500));
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(
        child.wait().unwrap().success() && rest.contains("errors=0"),
        "{rest}"
    );
    std::thread::sleep(Duration::from_millis(300));
    let (_, lines, err) = tool.stop();
    let (opens, counts) = summary(&lines, &prefix);
    let calls = u64::from(ROUNDS * THREADS + 1);
    assert_eq!(
        opens.values().sum::<u64>(),
        3 * 2 * calls,
        "{lines:?}\n{err}"
    );
    assert_eq!(counts.get(&110), Some(&(2 * calls + 2)));
}

/// A target that runs under seccomp when a tool first attaches is left alone: one line
/// on its stderr says why, its calls go on unhooked and right, and the tool sees none.
#[test]
fn a_target_under_seccomp_gets_a_notice_and_runs_unaffected() {
    let _alone = alone();
    use std::io::{BufRead, BufReader, Read, Write};
    let s = Session::new("systp-seccomp");
    let file = s.tmp.join("one");
    std::fs::write(&file, "1").unwrap();
    let comm = format!("ssc{}", std::process::id() % 100_000);
    let named = s.target_copy_named(examples::SYSCALLS, &comm);
    let mut app = s.bpftime();
    app.arg("start")
        .arg(&named)
        .args(["2", "2"])
        .arg(&file)
        .env("SYSCALLS_WAIT", "1")
        .env("SYSCALLS_SECCOMP", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = app.spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("pid="), "{line}");
    let prefix = s.tmp.to_str().unwrap().to_string();
    let tool = s.load(&[examples::SYSCALL_TP, "-c", &comm, "-p", &prefix]);
    // The notice comes when the target's agent sees the tool's links.
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut notice = String::new();
    while !notice.contains("seccomp") {
        notice.clear();
        assert!(
            err.read_line(&mut notice).unwrap() > 0,
            "no notice from the target"
        );
    }
    assert!(notice.starts_with("bpftime: "), "{notice}");
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let status = child.wait().unwrap();
    let mut err_rest = String::new();
    let _ = err.read_to_string(&mut err_rest);
    assert!(
        status.success() && rest.contains("errors=0"),
        "{status:?}\nstdout: {rest}\nstderr: {err_rest}"
    );
    let (_, lines, _) = tool.stop();
    let (opens, _) = summary(&lines, &prefix);
    assert!(opens.is_empty(), "{opens:?}");
}

const SIGSNOOP: &str = "/usr/sbin/sigsnoop";

/// libbpf-tools' sigsnoop -k (signals sent by kill, tkill and tgkill, through their
/// `sys_enter_*` and `sys_exit_*` tracepoints), unmodified: every signal the target sends,
/// with its target and result, as on the kernel.
#[test]
fn sigsnoop_reports_every_signal_sent_as_on_the_kernel() {
    let _alone = alone();
    require(SIGSNOOP);
    let s = Session::new("systp-sig");
    const N: u64 = 5;
    let run = |kernel: bool| -> BTreeMap<String, u64> {
        let comm = format!("ssg{}{}", u8::from(kernel), std::process::id() % 100_000);
        let named = s.target_copy_named(examples::SIGNALS, &comm);
        let args = ["-oL", SIGSNOOP, "-k"];
        let header = "TIME     PID     COMM             SIG       TPID    RESULT";
        let tool = if kernel {
            Tool::spawn_until(with_tracefs("stdbuf", &args), header)
        } else {
            let mut c = s.bpftime();
            c.arg("load").arg("stdbuf").args(args);
            Tool::spawn_until(c, header)
        };
        let mut app = if kernel {
            Command::new(&named)
        } else {
            let mut c = s.bpftime();
            c.arg("start").arg(&named);
            c
        };
        app.arg(N.to_string());
        let out = bpftime_tests::run_with_timeout(app, Duration::from_secs(60));
        assert!(out.status.success(), "{out:?}");
        std::thread::sleep(Duration::from_millis(300));
        let (_, lines, err) = tool.stop();
        let mut seen = BTreeMap::new();
        for l in &lines {
            // TIME PID COMM SIG TPID RESULT: the target's own pid as "self".
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() == 6 && f[2] == comm {
                let tpid = if f[4] == f[1] { "self" } else { f[4] };
                *seen
                    .entry(format!("sig={} tpid={tpid} result={}", f[3], f[5]))
                    .or_insert(0) += 1;
            }
        }
        assert!(!seen.is_empty(), "sigsnoop saw nothing: {lines:?}\n{err}");
        seen
    };
    let want: BTreeMap<String, u64> = [
        ("sig=10 tpid=self result=0".to_string(), 2 * N),
        (format!("sig=10 tpid={} result=-3", 1 << 22 | 12345), 1),
    ]
    .into_iter()
    .collect();
    bpftime_and_kernel_give(&want, run);
}

/// Runs one of bpftrace's bundled tools, unmodified, on the kernel (tracefs mounted in a
/// private namespace) or under `bpftime load` while `syscalls ROUNDS THREADS FILE...` runs
/// under the name `comm` (on the kernel as it is, under `bpftime start` otherwise); waits
/// until the tool printed `banner` and its `links` probes are in place first. The tool's
/// lines, after a SIGINT.
fn bundled_bpftrace_tool(
    s: &Session,
    kernel: bool,
    tool: &str,
    banner: &str,
    links: usize,
    comm: &str,
    workload: &[String],
) -> Vec<String> {
    let named = s.target_copy_named(examples::SYSCALLS, comm);
    let script = tool;
    let tool = if kernel {
        Tool::spawn_until(with_tracefs("bpftrace", &[script]), banner)
    } else {
        let mut c = s.bpftime();
        c.args(["load", "bpftrace", script]);
        let t = Tool::spawn_until(c, banner);
        s.wait_for_links(links);
        t
    };
    // A SIGINT in the last part of bpftrace's start-up is lost (see Session::load_bpftrace).
    std::thread::sleep(Duration::from_secs(2));
    let mut app = if kernel {
        Command::new(&named)
    } else {
        let mut c = s.bpftime();
        c.arg("start").arg(&named);
        c
    };
    app.args(workload);
    let out = bpftime_tests::run_with_timeout(app, Duration::from_secs(120));
    assert!(out.status.success(), "{out:?}");
    std::thread::sleep(Duration::from_millis(500));
    let (code, lines, err) = tool.stop();
    assert_eq!(code, 0, "{script}: {lines:?}\n{err}");
    lines
}

/// bpftrace's own opensnoop.bt (`sys_enter_open`/`openat` keep the file name by thread,
/// `sys_exit_*` print it with the result): the target's opens, each with its errno, as
/// the kernel reports them.
#[test]
fn bpftraces_opensnoop_bt_reports_every_open_as_on_the_kernel() {
    let _alone = alone();
    bpftime_tests::require_bpftrace();
    const TOOL: &str = "/usr/sbin/opensnoop.bt";
    assert!(
        std::path::Path::new(TOOL).exists(),
        "{TOOL} is missing: run scripts/setup.sh (Debian package bpftrace)"
    );
    let s = Session::new("systp-osbt");
    let files: Vec<String> = ["one", "missing"]
        .iter()
        .map(|n| s.tmp.join(n).to_str().unwrap().to_string())
        .collect();
    std::fs::write(&files[0], "1").unwrap();
    let run = |kernel: bool| -> BTreeMap<String, u64> {
        let comm = format!("obt{}{}", u8::from(kernel), std::process::id() % 100_000);
        let mut workload = vec![SNOOP_ROUNDS.to_string(), SNOOP_THREADS.to_string()];
        workload.extend(files.iter().cloned());
        let banner = "Tracing open syscalls... Hit Ctrl-C to end.";
        let lines = bundled_bpftrace_tool(&s, kernel, TOOL, banner, 4, &comm, &workload);
        let opens = snooped_opens(&lines, Some(&comm), s.tmp.to_str().unwrap());
        assert!(!opens.is_empty(), "opensnoop.bt saw nothing: {lines:?}");
        opens
    };
    let want = expected_snooped_opens(&files);
    bpftime_and_kernel_give(&want, run);
}

/// bpftrace's own syscount.bt (`tracepoint:raw_syscalls:sys_enter`, counts by call number
/// and by command, the top ten of each printed at the end): the target's getppid calls
/// counted as the kernel counts them (on the kernel the tool sees every process, so only
/// a call nothing else here makes is compared, in a number that puts it in the top ten),
/// and under bpftime only the target's calls, none of the agent's threads.
#[test]
fn bpftraces_syscount_bt_counts_calls_as_on_the_kernel() {
    let _alone = alone();
    bpftime_tests::require_bpftrace();
    const TOOL: &str = "/usr/sbin/syscount.bt";
    assert!(
        std::path::Path::new(TOOL).exists(),
        "{TOOL} is missing: run scripts/setup.sh (Debian package bpftrace)"
    );
    const BIG_ROUNDS: u32 = 500;
    let s = Session::new("systp-scbt");
    let file = s.tmp.join("one").to_str().unwrap().to_string();
    std::fs::write(&file, "1").unwrap();
    let calls = u64::from(BIG_ROUNDS * THREADS + 1);
    let run = |kernel: bool| -> (Option<u64>, BTreeMap<String, u64>) {
        let comm = format!("sct{}{}", u8::from(kernel), std::process::id() % 100_000);
        let workload = [BIG_ROUNDS.to_string(), THREADS.to_string(), file.clone()];
        let banner = "Counting syscalls... Hit Ctrl-C to end.";
        let lines = bundled_bpftrace_tool(&s, kernel, TOOL, banner, 1, &comm, &workload);
        let by_call = bpftrace_map(
            &lines
                .iter()
                .filter(|l| l.starts_with("@syscall["))
                .map(|l| l.replacen("@syscall[", "@[", 1))
                .collect::<Vec<_>>(),
        );
        let by_comm = bpftrace_map(
            &lines
                .iter()
                .filter(|l| l.starts_with("@process["))
                .map(|l| l.replacen("@process[", "@[", 1))
                .collect::<Vec<_>>(),
        );
        assert!(
            !by_call.is_empty(),
            "syscount.bt printed no calls: {lines:?}"
        );
        (by_call.get("110").copied(), by_comm)
    };
    // getppid twice a round on every thread and in the child, and once more in the
    // process and in the child to learn their parent.
    let getppid = 2 * calls + 2;
    let (ours, by_comm) = run(false);
    assert_eq!(ours, Some(getppid), "bpftime: getppid calls");
    let comm = format!("sct0{}", std::process::id() % 100_000);
    assert_eq!(
        by_comm.keys().collect::<Vec<_>>(),
        [&comm],
        "bpftime: calls of other threads than the target's"
    );
    // The command's total: every call from `main` on (three opens, three closes and two
    // getppid a round) and those of the child; the kernel's is larger by the loader's
    // calls before the agent starts, which no process can see of itself.
    let ours_total = by_comm[&comm];
    assert!(ours_total >= 8 * calls, "bpftime: {by_comm:?}");
    match kernel_unavailable() {
        Some(why) => eprintln!("kernel comparison skipped: {why}"),
        None => {
            let (kernel, by_comm) = run(true);
            assert_eq!(kernel, Some(getppid), "kernel: getppid calls");
            let kcomm = format!("sct1{}", std::process::id() % 100_000);
            let theirs = by_comm.get(&kcomm).copied().unwrap_or(0);
            assert!(theirs >= ours_total, "kernel: {by_comm:?}");
            eprintln!("syscount.bt: the command's calls: bpftime {ours_total}, kernel {theirs}");
        }
    }
}

/// What a bpftrace script saw of the process-making calls of the `forks` target named
/// `comm`: each line as `enter NR`, `exit NR parent`, `exit NR child` or `exit NR thread`
/// (the maker is the process whose thread made every call), counted; and the lines that
/// are wrong in themselves: a child's or thread's exit whose ids are not what its maker's
/// return gave, or whose result is not 0.
fn process_making_calls(lines: &[String]) -> (BTreeMap<String, u64>, Vec<String>) {
    let parsed: Vec<(&str, u64, i64, i64, i64)> = lines
        .iter()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let num =
                |k: &str| -> Option<i64> { f.iter().find_map(|w| w.strip_prefix(k)?.parse().ok()) };
            Some((
                *f.first()?,
                num("nr=")? as u64,
                num("pid=")?,
                num("tid=")?,
                num("ret=").unwrap_or(0),
            ))
        })
        .collect();
    let mut makers: BTreeMap<i64, u64> = BTreeMap::new();
    for (kind, _, pid, _, _) in &parsed {
        if *kind == "enter" {
            *makers.entry(*pid).or_insert(0) += 1;
        }
    }
    let maker = makers
        .iter()
        .max_by_key(|(_, n)| **n)
        .map_or(-1, |(p, _)| *p);
    let made: std::collections::BTreeSet<i64> = parsed
        .iter()
        .filter(|(kind, _, pid, tid, ret)| {
            *kind == "exit" && *pid == maker && *tid == maker && *ret > 0
        })
        .map(|(.., ret)| *ret)
        .collect();
    let mut counts = BTreeMap::new();
    let mut wrong = Vec::new();
    for &(kind, nr, pid, tid, ret) in &parsed {
        let key = match kind {
            "enter" => format!("enter {nr}"),
            _ if pid == maker && tid == maker => format!("exit {nr} parent"),
            _ => {
                let (who, id) = if pid == maker {
                    ("thread", tid)
                } else {
                    ("child", pid)
                };
                if ret != 0 || !made.contains(&id) || (who == "child" && tid != pid) {
                    wrong.push(format!("{kind} nr={nr} pid={pid} tid={tid} ret={ret}"));
                }
                format!("exit {nr} {who}")
            }
        };
        *counts.entry(key).or_insert(0) += 1;
    }
    (counts, wrong)
}

/// Every way a program makes a process or a thread (the C library's fork(), whose malloc
/// locks are held over the call; a fork system call of its own; vfork(); posix_spawn();
/// pthread_create()), watched at entry and at return by a bpftrace script that prints
/// (through a perf buffer, whose first write opens it) at each: the calls return in the
/// child too, with 0 and the child's own ids, as on the kernel, and the target is never
/// stuck (the first write from inside fork() once waited for fork's own malloc lock).
#[test]
fn process_making_calls_return_in_the_child_as_on_the_kernel() {
    let _alone = alone();
    bpftime_tests::require_bpftrace();
    const N: u32 = 10;
    let s = Session::new("systp-forks");
    let run = |kernel: bool| -> (BTreeMap<String, u64>, Vec<String>) {
        let comm = format!("fk{}{}", u8::from(kernel), std::process::id() % 100_000);
        let named = s.target_copy_named(examples::FORKS, &comm);
        let filter = format!(
            "comm == \"{comm}\" && (args->id == 56 || args->id == 57 || args->id == 58 || args->id == 435)"
        );
        let script = format!(
            "tracepoint:raw_syscalls:sys_enter /{filter}/ {{ printf(\"enter nr=%d pid=%d tid=%d\\n\", args->id, pid, tid); }} \
             tracepoint:raw_syscalls:sys_exit /{filter}/ {{ printf(\"exit nr=%d pid=%d tid=%d ret=%d\\n\", args->id, pid, tid, args->ret); }}"
        );
        let tool = if kernel {
            let t = Tool::spawn_until(
                with_tracefs("bpftrace", &["-e", &script]),
                "Attaching 2 probes...",
            );
            // A SIGINT in the last part of bpftrace's start-up is lost (see Session::load_bpftrace).
            std::thread::sleep(Duration::from_secs(2));
            t
        } else {
            let mut c = s.bpftime();
            c.args(["load", "bpftrace", "-e", &script]);
            let t = Tool::spawn_until(c, "Attaching 2 probes...");
            s.wait_for_links(2);
            std::thread::sleep(Duration::from_secs(2));
            t
        };
        let mut app = if kernel {
            Command::new(&named)
        } else {
            let mut c = s.bpftime();
            c.arg("start").arg(&named);
            c
        };
        app.arg(N.to_string());
        let out = bpftime_tests::run_with_timeout(app, Duration::from_secs(60));
        assert!(
            out.status.success()
                && String::from_utf8_lossy(&out.stdout)
                    .contains(&format!("forks={} errors=0", 5 * N)),
            "the target failed: {out:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
        let (code, lines, err) = tool.stop();
        assert_eq!(code, 0, "bpftrace failed: {lines:?}\n{err}");
        process_making_calls(&lines)
    };
    let (ours, wrong) = run(false);
    assert!(
        wrong.is_empty(),
        "bpftime: wrong returns in children: {wrong:?}"
    );
    let total = |c: &BTreeMap<String, u64>, what: &str| -> u64 {
        c.iter()
            .filter(|(k, _)| k.contains(what))
            .map(|(_, n)| n)
            .sum()
    };
    // Five makings a round, each entered once and returning once in the maker and once
    // in what it made.
    assert_eq!(total(&ours, "enter"), u64::from(5 * N), "bpftime: {ours:?}");
    assert_eq!(
        total(&ours, "parent"),
        u64::from(5 * N),
        "bpftime: {ours:?}"
    );
    assert_eq!(
        total(&ours, "child") + total(&ours, "thread"),
        u64::from(5 * N),
        "bpftime: {ours:?}"
    );
    match kernel_unavailable() {
        Some(why) => eprintln!("kernel comparison skipped: {why}"),
        None => {
            let (theirs, wrong) = run(true);
            assert!(wrong.is_empty(), "kernel: {wrong:?}");
            assert_eq!(ours, theirs, "bpftime against the kernel");
        }
    }
}
