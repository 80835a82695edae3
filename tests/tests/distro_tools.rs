//! The uprobe tools Debian 12 ships, unmodified, under `bpftime load` against targets
//! under `bpftime start`, each compared with the same tool and target on the kernel.
//!
//! Which tools these are was read from the tools themselves: the section names of the
//! BPF objects embedded in each of libbpf-tools' binaries (package libbpf-tools
//! 0.26.0), and the probe types in each of bpftrace's `.bt` scripts (package bpftrace
//! 0.17.0, `/usr/sbin/*.bt`).
//!
//! Covered, every one whose probes are uprobes, uretprobes or USDT:
//! - libbpf-tools `bashreadline` (uretprobe on bash's `readline`): here.
//! - libbpf-tools `funclatency -u` and `-c`, `gethostlatency` (their programs are in
//!   `kprobe` sections and attached as uprobes by the tool), `javagc` (USDT): in
//!   `libbpf_tools.rs`.
//! - bpftrace `bashreadline.bt`, `sslsnoop.bt`, `ssllatency.bt`, `threadsnoop.bt`: here;
//!   `gethostlatency.bt`: in `bpftrace.rs`.
//!
//! Left out, because every probe they have is in the kernel:
//! - libbpf-tools with kprobes or kretprobes: bindsnoop, biotop, capable, filelife,
//!   filetop, ksnoop, oomkill, slabratetop, tcpconnect, tcptop, tcptracer; with fentry
//!   or fexit (and kprobes as their fallback): biosnoop, biostacks, btrfsdist,
//!   btrfsslower, cachestat, ext4dist, ext4slower, fsdist, fsslower, klockstat, mdflush,
//!   nfsdist, nfsslower, numamove, readahead, solisten, tcpconnlat, tcprtt, tcpsynbl,
//!   vfsstat, xfsdist, xfsslower; with tracepoints (classic, raw or BTF): biolatency,
//!   biopattern, bitesize, cpudist, drsnoop, execsnoop, exitsnoop, hardirqs,
//!   killsnoop, mountsnoop, offcputime, opensnoop, runqlat, runqslower, sigsnoop,
//!   softirqs, statsnoop, syscount, tcplife, tcpstates, wakeuptime; with perf events
//!   (CPU sampling, hardware counters): cpufreq, llcstat, runqlen.
//! - `.bt` scripts with kprobes or kretprobes: biolatency, biosnoop, biostacks,
//!   capable, dcsnoop, mdflush, oomkill, swapin, tcpaccept, tcpconnect, tcplife,
//!   tcpretrans, tcpsynbl, undump, vfscount, vfsstat, xfsdist; with tracepoints:
//!   bitesize, execsnoop, killsnoop, naptime, opensnoop, pidpersec, runqlat, setuids,
//!   statsnoop, syncsnoop, syscount, tcpdrop, writeback; with CPU sampling (`profile`)
//!   or kernel memory read at an `interval`: cpuwalk, loads, runqlen.

mod support;

use bpftime_tests::{bpftime, examples, kernel_unavailable, require_bpftrace, Session, Tool};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use support::Driven;

/// Held while bpftrace runs on the kernel: one at a time, as in `bpftrace.rs`
/// (several at once on 2 cores were seen to ignore SIGINT for over a minute).
fn kernel_bpftrace_turn() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|p| p.into_inner())
}

fn require(tool: &str, package: &str) {
    assert!(
        Path::new(tool).exists(),
        "{tool} is missing: run scripts/setup.sh (Debian package {package})"
    );
}

// ---------------------------------------------------------------------------
// bashreadline: an interactive bash, typed at through a pseudo-terminal.

/// What is typed at the shell, one line each; then `exit`. Builtins only, so the
/// shell runs no other program. Each prints a line starting with `mark-`, which the
/// test waits for before typing the next (the last names the shell's pid).
const TYPED: &[(&str, &str)] = &[
    ("echo mark-1", "mark-1"),
    ("echo  mark-2   with   spaces", "mark-2 with spaces"),
    (
        "x=21; echo mark-$((x * 2)) \"quoted  text\" 'and $x'",
        "mark-42 quoted  text and $x",
    ),
    ("echo mark-$$", "mark-"),
];

/// Runs `command` (a shell command line starting the private bash) in a pseudo-terminal
/// through util-linux's `script`, types `TYPED` and `exit`; returns the shell's pid.
fn type_at_bash(tmp: &Path, command: &str) -> u32 {
    // Readline wraps each line it reads in bracketed-paste escapes unless told not to.
    let inputrc = tmp.join("inputrc");
    std::fs::write(&inputrc, "set enable-bracketed-paste off\n").unwrap();
    let mut c = Command::new("script");
    c.args(["-qfc", command, "/dev/null"])
        .env("SHELL", "/bin/sh")
        .env("INPUTRC", &inputrc)
        .env("HISTFILE", tmp.join("history"))
        .env_remove("BPFTIME_STORE");
    let mut bash = Driven::spawn(c);
    let mut pid = 0;
    for (line, out) in TYPED {
        bash.send(line);
        let got = bash.wait_for(out);
        if *out == "mark-" {
            pid = got["mark-".len()..]
                .trim_end()
                .parse()
                .expect("the shell's pid");
        }
    }
    bash.send("exit");
    let (status, _, err) = bash.finish();
    assert!(status.success(), "bash under script failed: {err}");
    pid
}

/// The (pid, command) of each event line: the time takes 10 columns, then the pid,
/// left-aligned in `pid_width` columns, a space and the command exactly as typed.
fn commands(lines: &[String], pid_width: usize) -> Vec<(u32, String)> {
    lines
        .iter()
        .filter_map(|l| {
            let rest = l.get(10..)?;
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            let pid = rest[..digits].parse().ok()?;
            let gap = pid_width.saturating_sub(digits) + 1;
            let after = &rest[digits..];
            (after.len() >= gap && after.bytes().take(gap).all(|b| b == b' '))
                .then(|| (pid, after[gap..].to_string()))
        })
        .collect()
}

fn typed(pid: u32) -> Vec<(u32, String)> {
    TYPED
        .iter()
        .map(|(l, _)| *l)
        .chain(["exit"])
        .map(|l| (pid, l.to_string()))
        .collect()
}

/// A private copy of bash named `bash` (bashreadline keeps only the events of a task
/// named `bash`): uprobes are per file, and a probe on /bin/bash would fire in every
/// shell on the machine.
fn private_bash(s: &Session, tag: &str) -> String {
    let dir = s.tmp.join(tag);
    std::fs::create_dir_all(&dir).unwrap();
    let bash = dir.join("bash");
    bpftime_tests::copy_executable("/bin/bash", &bash);
    bash.to_str().unwrap().to_string()
}

const BASH_ARGS: &str = "--norc --noprofile -i";

/// `bpftime start` of the private bash, as a command line for `script`.
fn bash_under_bpftime(s: &Session, bash: &str) -> String {
    format!(
        "{} --store {} start {bash} {BASH_ARGS}",
        bpftime().display(),
        s.store
    )
}

/// libbpf-tools' bashreadline, pointed at the private bash with `-s` (the option for
/// the library that holds `readline`; bash here has it built in): every line typed,
/// exactly, with the shell's pid, as on the kernel.
#[test]
fn bashreadline_prints_every_typed_line_like_the_kernel() {
    const BASHREADLINE: &str = "/usr/sbin/bashreadline";
    require(BASHREADLINE, "libbpf-tools");
    let header = "TIME      PID     COMMAND";
    let s = Session::new("dt-bashrl");
    let bash = private_bash(&s, "ours");
    let mut c = s.bpftime();
    c.args(["load", "stdbuf", "-oL", BASHREADLINE, "-s", &bash]);
    let tool = Tool::spawn_until(c, header);
    s.wait_for_links(1);
    let pid = type_at_bash(&s.tmp, &bash_under_bpftime(&s, &bash));
    std::thread::sleep(Duration::from_secs(1));
    let (_, lines, err) = tool.stop();
    assert_eq!(commands(&lines, 7), typed(pid), "{lines:?} {err}");

    if let Some(why) = kernel_unavailable() {
        eprintln!("kernel comparison skipped: {why}");
        return;
    }
    let bash = private_bash(&s, "kernel");
    let mut c = Command::new("stdbuf");
    c.args(["-oL", BASHREADLINE, "-s", &bash]);
    let tool = Tool::spawn_until(c, header);
    let pid = type_at_bash(&s.tmp, &format!("{bash} {BASH_ARGS}"));
    std::thread::sleep(Duration::from_secs(1));
    let (_, lines, err) = tool.stop();
    assert_eq!(commands(&lines, 7), typed(pid), "kernel: {lines:?} {err}");
}

/// bpftrace's bashreadline.bt names /bin/bash in its probe; the script is copied with
/// that path replaced by the private bash's, and is otherwise Debian's.
#[test]
fn the_bundled_bashreadline_tool_prints_every_typed_line_like_the_kernel() {
    require_bpftrace();
    const TOOL: &str = "/usr/sbin/bashreadline.bt";
    require(TOOL, "bpftrace");
    let original = std::fs::read_to_string(TOOL).unwrap();
    let probe = "uretprobe:/bin/bash:readline";
    assert!(original.contains(probe), "{TOOL} no longer has `{probe}`");
    let header = "TIME      PID    COMMAND";
    let s = Session::new("dt-bashrl-bt");
    let script_for = |bash: &str, tag: &str| {
        let script = s.tmp.join(format!("bashreadline-{tag}.bt"));
        std::fs::write(
            &script,
            original.replace(probe, &format!("uretprobe:{bash}:readline")),
        )
        .unwrap();
        script
    };
    let bash = private_bash(&s, "ours");
    let mut c = s.bpftime();
    c.args(["load", "bpftrace"]).arg(script_for(&bash, "ours"));
    let tool = Tool::spawn_until(c, header);
    s.wait_for_links(1);
    // bpftrace prints its header before it is ready for a SIGINT (see `load_bpftrace`).
    std::thread::sleep(Duration::from_secs(2));
    let pid = type_at_bash(&s.tmp, &bash_under_bpftime(&s, &bash));
    std::thread::sleep(Duration::from_secs(1));
    let (_, lines, err) = tool.stop();
    assert_eq!(commands(&lines, 6), typed(pid), "{lines:?} {err}");

    if let Some(why) = kernel_unavailable() {
        eprintln!("kernel comparison skipped: {why}");
        return;
    }
    let bash = private_bash(&s, "kernel");
    let _turn = kernel_bpftrace_turn();
    let mut c = Command::new("bpftrace");
    c.arg(script_for(&bash, "kernel"));
    let tool = Tool::spawn_until(c, header);
    std::thread::sleep(Duration::from_secs(2));
    let pid = type_at_bash(&s.tmp, &format!("{bash} {BASH_ARGS}"));
    std::thread::sleep(Duration::from_secs(1));
    let (_, lines, err) = tool.stop();
    assert_eq!(commands(&lines, 6), typed(pid), "kernel: {lines:?} {err}");
}

// ---------------------------------------------------------------------------
// sslsnoop.bt and ssllatency.bt: OpenSSL's libssl and libcrypto, in the `tls_pair`
// target. The scripts probe the system's libraries, which every process on the
// machine shares; both runs pass bpftrace `-p PID`, so only the target counts.

const ROUNDS: usize = 20;

/// Held for the whole of each test of libssl, its bpftime run and its kernel run: the two
/// tests run one after the other. bpftrace's `-p` filters events in its program, not
/// where the kernel writes its breakpoints: a kernel uprobe on libssl puts an `int3` over
/// the first byte of the function in every process that maps libssl, the one under
/// `bpftime start` included, where that byte is our jump's opcode, and puts the file's
/// byte back on detach. Either way our jump is cut, and the target, on its next call,
/// runs the rest of the jump as code and faults (seen: SIGSEGV at SSL_do_handshake+1
/// while the other test ran bpftrace on the kernel).
fn libssl_turn() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|p| p.into_inner())
}
/// The uprobe links each script makes: a uprobe and a uretprobe on SSL_read, SSL_write,
/// SSL_do_handshake, RSA_sign and RSA_verify. Their other functions (rsa_ossl_*,
/// ossl_ecdsa_*, the ECDH ones) are local symbols of a stripped libcrypto: bpftrace
/// skips them, on the kernel too.
const SSL_LINKS: usize = 10;

/// Runs `script` against `tls_pair ROUNDS`: starts the target (`target`), attaches
/// bpftrace to its pid (`tool`), lets the target run, waits for `events` lines that
/// `is_event` (or a second, when there are none to wait for) and stops bpftrace
/// while the target is still alive (bpftrace names `func` from the target's maps when it
/// prints). Returns bpftrace's stdout and the target's pid.
/// A script's run: its lines, the target's pid and the tool's stderr; an error where the
/// tool did not exit on SIGINT.
type SslRun = Result<(Vec<String>, u32, String), String>;

fn run_ssl_script(
    target: Command,
    tool: &dyn Fn(u32) -> Command,
    wait_attached: &dyn Fn(&Driven),
    (is_event, events): (fn(&str) -> bool, usize),
) -> SslRun {
    let mut app = Driven::spawn(target);
    let pid: u32 = app.wait_for("pid=")[4..].parse().unwrap();
    let mut t = Tool::spawn_until(tool(pid), "Tracing SSL/TLS handshake... Hit Ctrl-C to end.");
    wait_attached(&app);
    std::thread::sleep(Duration::from_secs(2));
    app.send("go");
    assert_eq!(app.wait_for("rounds="), format!("rounds={ROUNDS}"));
    if events == 0 {
        std::thread::sleep(Duration::from_secs(1));
    } else {
        // A short count is left for the comparison to show.
        t.wait_for_count(is_event, events, Duration::from_secs(10));
    }
    let stopped = t.try_stop();
    app.send("end");
    let (status, _, app_err) = app.finish();
    assert!(status.success(), "tls_pair failed: {app_err}");
    let (_, lines, err) = stopped?;
    Ok((lines, pid, err))
}

/// The lines of sslsnoop.bt that report a call, and how many tls_pair makes; none for
/// ssllatency.bt, which prints at its end.
type Events = (fn(&str) -> bool, usize);

///
/// bpftrace 0.17 checks for SIGINT only when `epoll_wait` returns interrupted or with
/// events: one that lands while it is outside the call leaves it polling on (seen on the
/// kernel; under bpftime a stuck bpftrace was found with the signal caught, none pending,
/// in `epoll_wait` at a 100 ms timeout, and it exited once a debugger's attach
/// interrupted the call). A run whose bpftrace does not stop is asked again, in a store of
/// its own (`tag`-2: none of the first run's links), as the kernel's is; a second one
/// fails.
fn ssl_under_bpftime(tag: &str, script: &str, events: Events) -> (Vec<String>, u32, String) {
    let mut stuck = String::new();
    for attempt in 1..=2 {
        let s = Session::new(&format!("{tag}-{attempt}"));
        let target = s.target_copy(examples::TLS_PAIR);
        let mut app = s.bpftime();
        // The agent says which links it attached: the calls begin only once every probe
        // is in place (its JIT may take seconds on a busy machine).
        app.env("BPFTIME_LOG", "info")
            .arg("start")
            .arg(&target)
            .arg(ROUNDS.to_string());
        match run_ssl_script(
            app,
            &|pid| {
                let mut c = s.bpftime();
                c.args(["load", "bpftrace", "-p", &pid.to_string(), script]);
                c
            },
            &|app| {
                s.wait_for_links(SSL_LINKS);
                assert!(
                    app.wait_for_stderr(" attached ", SSL_LINKS, Duration::from_secs(120)),
                    "the agent did not attach {SSL_LINKS} links in time"
                );
            },
            events,
        ) {
            Ok(run) => return run,
            Err(why) => {
                eprintln!("bpftrace under bpftime did not stop (run {attempt}): {why}");
                stuck = why;
            }
        }
    }
    panic!("bpftrace under bpftime did not stop on SIGINT twice: {stuck}")
}

/// The same on the kernel: `None` where it cannot run, an error where the kernel's
/// bpftrace did not exit on SIGINT (bpftrace 0.17's own bug, seen on the kernel too).
fn ssl_on_kernel(script: &str, events: Events) -> Option<SslRun> {
    if let Some(why) = kernel_unavailable() {
        eprintln!("kernel comparison skipped: {why}");
        return None;
    }
    let _turn = kernel_bpftrace_turn();
    let mut app = Command::new(examples::TLS_PAIR);
    app.arg(ROUNDS.to_string());
    Some(run_ssl_script(
        app,
        &|pid| {
            let mut c = Command::new("bpftrace");
            c.args(["-p", &pid.to_string(), script]);
            c
        },
        &|_| {},
        events,
    ))
}

/// sslsnoop.bt: a line per return of a probed function, with the thread, the command,
/// the return value and the function's name (its time and latency aside). Each line
/// as (thread: client is the main one, server the other; comm; ret; func), sorted.
fn ssl_calls(lines: &[String], pid: u32) -> Vec<(&'static str, String, i64, String)> {
    let mut calls: Vec<_> = lines
        .iter()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() != 6 || f[0].parse::<u64>().is_err() || f[3].parse::<u64>().is_err() {
                return None;
            }
            let tid: u32 = f[1].parse().ok()?;
            let who = if tid == pid { "client" } else { "server" };
            Some((who, f[2].to_string(), f[4].parse().ok()?, f[5].to_string()))
        })
        .collect();
    calls.sort();
    calls
}

/// What tls_pair calls, per thread: a handshake with one RSA signature (server) and its
/// check (client), then ROUNDS of 16-byte messages each way.
fn tls_pair_calls() -> Vec<(&'static str, String, i64, String)> {
    let mut want = Vec::new();
    for who in ["client", "server"] {
        let rsa = if who == "client" {
            "RSA_verify"
        } else {
            "RSA_sign"
        };
        want.push((who, "tls_pair".to_string(), 1, rsa.to_string()));
        want.push((
            who,
            "tls_pair".to_string(),
            1,
            "SSL_do_handshake".to_string(),
        ));
        for _ in 0..ROUNDS {
            for f in ["SSL_read", "SSL_write"] {
                want.push((who, "tls_pair".to_string(), 16, f.to_string()));
            }
        }
    }
    want.sort();
    want
}

// Not in CI: about one run in seven, bpftrace 0.17 running sslsnoop.bt ignores SIGINT for
// over a minute, on the kernel as under bpftime, and once the kernel's run lost the server
// thread's events; a CI run would fail on bpftrace's flake, not ours. Passes 6 runs in 7
// (`cargo test --release -p bpftime-tests --test distro_tools -- --ignored`).
#[test]
#[ignore = "bpftrace 0.17 itself ignores SIGINT about one run in seven with sslsnoop.bt (on the kernel too)"]
fn the_bundled_sslsnoop_tool_prints_every_tls_call_like_the_kernel() {
    require_bpftrace();
    const TOOL: &str = "/usr/sbin/sslsnoop.bt";
    require(TOOL, "bpftrace");
    let _libssl = libssl_turn();
    let calls: Events = (
        |l| l.contains(" tls_pair ") && l.split_whitespace().count() == 6,
        tls_pair_calls().len(),
    );
    let (lines, pid, err) = ssl_under_bpftime("dt-sslsnoop", TOOL, calls);
    assert_eq!(ssl_calls(&lines, pid), tls_pair_calls(), "{lines:?} {err}");
    if let Some(kernel) = ssl_on_kernel(TOOL, calls) {
        let (k, kpid, err) = kernel.unwrap_or_else(|why| panic!("kernel: {why}"));
        assert_eq!(ssl_calls(&k, kpid), tls_pair_calls(), "kernel: {k:?} {err}");
    }
}

/// ssllatency.bt: per function, the count of its `stats()` of latencies (successful
/// calls in `@stat`, failed ones in `@statF`) and the functions of its histograms.
fn ssl_stats(lines: &[String]) -> Vec<String> {
    let mut out: Vec<String> = lines
        .iter()
        .filter_map(|l| {
            if let Some(key) = l.strip_prefix("@hist") {
                return Some(format!("@hist{}", key.split_once(':')?.0));
            }
            let (key, rest) = l.split_once(": count ")?;
            Some(format!("{key}: {}", rest.split(',').next()?))
        })
        .collect();
    out.sort();
    out
}

#[test]
fn the_bundled_ssllatency_tool_counts_every_tls_call_like_the_kernel() {
    require_bpftrace();
    const TOOL: &str = "/usr/sbin/ssllatency.bt";
    require(TOOL, "bpftrace");
    let _libssl = libssl_turn();
    let mut want: Vec<String> = [
        ("RSA_sign", 1),
        ("RSA_verify", 1),
        ("SSL_do_handshake", 2),
        ("SSL_read", 2 * ROUNDS),
        ("SSL_write", 2 * ROUNDS),
    ]
    .iter()
    .flat_map(|(f, n)| [format!("@hist[{f}]"), format!("@stat[{f}]: {n}")])
    .collect();
    want.sort();
    let at_end: Events = (|_| false, 0);
    let (lines, _, err) = ssl_under_bpftime("dt-ssllat", TOOL, at_end);
    assert_eq!(ssl_stats(&lines), want, "{lines:?} {err}");
    // The kernel's bpftrace names `func` from the return address after the fact, and now
    // and then leaves some as raw addresses (`@stat[0x7f...]`), and now and then ignores
    // SIGINT (bpftrace 0.17's bug), and now and then ends before printing its second map
    // (seen on 6.18: the @hist lines and no @stat line, after failing to detach through
    // the unmounted tracefs): a run like any of these is asked again, and a second one
    // leaves the comparison to the hand count above.
    let unresolved = |k: &[String]| {
        k.iter().any(|l| l.starts_with("@stat[0x")) || !k.iter().any(|l| l.starts_with("@stat["))
    };
    for attempt in 1..=2 {
        let Some(kernel) = ssl_on_kernel(TOOL, at_end) else {
            return;
        };
        let (k, _, err) = match kernel {
            Ok(run) => run,
            Err(why) => {
                eprintln!("the kernel's bpftrace did not stop (run {attempt}): {why}");
                continue;
            }
        };
        if unresolved(&k) {
            eprintln!(
                "the kernel's bpftrace left function names unresolved or its output unfinished (run {attempt}): {k:?}"
            );
            continue;
        }
        assert_eq!(ssl_stats(&k), want, "kernel: {k:?} {err}");
        return;
    }
    eprintln!(
        "kernel comparison skipped: the kernel's bpftrace left names unresolved, its output \
         unfinished, or ignored SIGINT twice"
    );
}

/// threadsnoop.bt probes `libpthread:pthread_create`, but Debian 12's glibc (2.36) has
/// pthread_create in libc, and libpthread.so.0 is an empty stub: bpftrace finds no such
/// function and attaches BEGIN alone, so the tool prints nothing for a thread made. The
/// same here: no more probes, no line, while tls_pair makes its thread.
#[test]
fn the_bundled_threadsnoop_tool_attaches_what_it_attaches_on_the_kernel() {
    require_bpftrace();
    const TOOL: &str = "/usr/sbin/threadsnoop.bt";
    require(TOOL, "bpftrace");
    let header = "TIME(ms)   PID    COMM             FUNC";
    let run = |tool: Command, target: Command| {
        let t = Tool::spawn_until(tool, header);
        std::thread::sleep(Duration::from_secs(2));
        let mut app = Driven::spawn(target);
        app.wait_for("pid=");
        app.send("go");
        app.wait_for("rounds=");
        app.send("end");
        let (status, _, app_err) = app.finish();
        assert!(status.success(), "tls_pair failed: {app_err}");
        std::thread::sleep(Duration::from_secs(1));
        let (_, lines, err) = t.stop();
        let printed: Vec<String> = lines.into_iter().filter(|l| !l.is_empty()).collect();
        (printed, err)
    };
    let s = Session::new("dt-threadsnoop");
    let target = s.target_copy(examples::TLS_PAIR);
    let mut c = s.bpftime();
    c.args(["load", "bpftrace", TOOL]);
    let mut app = s.bpftime();
    app.arg("start").arg(&target).arg("1");
    let (ours, err) = run(c, app);
    assert_eq!(ours, vec!["Attaching 1 probe...", header], "{err}");
    if let Some(why) = kernel_unavailable() {
        eprintln!("kernel comparison skipped: {why}");
        return;
    }
    let _turn = kernel_bpftrace_turn();
    let mut c = Command::new("bpftrace");
    c.arg(TOOL);
    let mut app = Command::new(examples::TLS_PAIR);
    app.arg("1");
    let (kernel, err) = run(c, app);
    assert_eq!(kernel, ours, "kernel: {err}");
}
