//! bcc's libbpf-tools as Debian ships them (package libbpf-tools: statically linked
//! with their own libbpf), run unmodified under `bpftime load` against targets under
//! `bpftime start`, and on the kernel as the oracle where it can.

mod support;

use bpftime_tests::{examples, kernel_unavailable, Session, Tool};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use support::Driven;

const CALLS: u64 = 1000;
const FUNCLATENCY: &str = "/usr/sbin/funclatency";

/// The calls a funclatency histogram counts: the sum of its `A -> B : N` lines.
fn histogram_total(lines: &[String]) -> u64 {
    lines
        .iter()
        .filter(|l| l.contains("->") && l.contains(':'))
        .filter_map(|l| {
            l.split(':')
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

fn require_funclatency() {
    assert!(
        Path::new(FUNCLATENCY).exists(),
        "{FUNCLATENCY} is missing: run scripts/setup.sh (Debian package libbpf-tools)"
    );
}

/// Tools print to a pipe in blocks; `stdbuf -oL` makes their lines arrive as printed.
///
/// `funclatency -u TARGET:work [extra]` under bpftime while the target (under `bpftime
/// start`, in `cgroup` when given) calls work() CALLS times; the calls it counted.
fn under_bpftime(s: &Session, target: &str, extra: &[&str], cgroup: Option<&Path>) -> u64 {
    let probe = format!("{target}:work");
    let mut c = s.bpftime();
    c.args(["load", "stdbuf", "-oL", FUNCLATENCY, "-u", &probe])
        .args(extra);
    let tool = Tool::spawn_until(c, &tracing(&probe));
    let mut app = s.bpftime();
    app.args(["start", target, &CALLS.to_string()]);
    run_in(app, cgroup);
    let (_, lines, err) = tool.stop();
    finished(&lines, &err);
    histogram_total(&lines)
}

/// The same on the kernel.
fn on_kernel(target: &str, extra: &[&str], cgroup: Option<&Path>) -> u64 {
    let probe = format!("{target}:work");
    let mut c = Command::new("stdbuf");
    c.args(["-oL", FUNCLATENCY, "-u", &probe]).args(extra);
    let tool = Tool::spawn_until(c, &tracing(&probe));
    let mut app = Command::new(target);
    app.arg(CALLS.to_string());
    run_in(app, cgroup);
    let (_, lines, err) = tool.stop();
    finished(&lines, &err);
    histogram_total(&lines)
}

/// funclatency ran to its end (it prints no histogram when it counted nothing).
fn finished(lines: &[String], err: &str) {
    assert!(
        lines.iter().any(|l| l.starts_with("Exiting trace of ")),
        "funclatency did not finish: {lines:?} {err}"
    );
}

/// What funclatency prints once its probes are attached.
fn tracing(probe: &str) -> String {
    format!("Tracing {probe}.  Hit Ctrl-C to exit")
}

/// Runs `c` to completion, moved into `cgroup` first when given.
fn run_in(mut c: Command, cgroup: Option<&Path>) {
    if let Some(cg) = cgroup {
        let procs = cg.join("cgroup.procs");
        // SAFETY: the closure runs between fork and exec and only writes a file.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut c, move || {
                std::fs::write(&procs, b"0")
            });
        }
    }
    let out = c.output().expect("run the target");
    assert!(out.status.success(), "target failed: {out:?}");
}

#[test]
fn funclatency_counts_every_call_of_a_uprobe_like_the_kernel() {
    require_funclatency();
    let s = Session::new("lt-funclat");
    let t = s.target_copy(examples::CALLS);
    let t = t.to_str().unwrap();
    assert_eq!(under_bpftime(&s, t, &[], None), CALLS);
    match kernel_unavailable() {
        Some(why) => eprintln!("kernel comparison skipped: {why}"),
        None => assert_eq!(on_kernel(t, &[], None), CALLS),
    }
}

/// `-c CGROUP` keeps the calls of threads in that cgroup (v2) or below it, through a
/// cgroup array and `bpf_current_task_under_cgroup`.
#[test]
fn funclatency_filters_by_cgroup_like_the_kernel() {
    require_funclatency();
    let Some(root) = bpftime_runtime::cgroup::cgroup2_root() else {
        eprintln!("no cgroup2 hierarchy mounted: nothing to filter by");
        return;
    };
    let s = Session::new("lt-funclat-cg");
    let t = s.target_copy(examples::CALLS);
    let t = t.to_str().unwrap();
    let cg = root.join(format!("bpftime-test-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir(&cg) {
        eprintln!(
            "cannot make a cgroup under {}: {e}: nothing to filter by",
            root.display()
        );
        return;
    }
    let cgs = cg.to_str().unwrap();
    let inside = under_bpftime(&s, t, &["-c", cgs], Some(&cg));
    let outside = under_bpftime(&s, t, &["-c", cgs], None);
    let kernel = kernel_unavailable().is_none().then(|| {
        (
            on_kernel(t, &["-c", cgs], Some(&cg)),
            on_kernel(t, &["-c", cgs], None),
        )
    });
    let _ = std::fs::remove_dir(&cg);
    assert_eq!(
        (inside, outside),
        (CALLS, 0),
        "calls counted in and outside {cgs}"
    );
    if let Some(k) = kernel {
        assert_eq!(k, (CALLS, 0), "the kernel's counts in and outside {cgs}");
    }
}

/// gethostlatency: a uprobe and a uretprobe on libc's getaddrinfo, gethostbyname and
/// gethostbyname2, a line per lookup: as many lines, naming the host, as the kernel
/// prints for the same target.
#[test]
fn gethostlatency_prints_every_lookup_like_the_kernel() {
    const GETHOSTLATENCY: &str = "/usr/sbin/gethostlatency";
    assert!(
        Path::new(GETHOSTLATENCY).exists(),
        "{GETHOSTLATENCY} is missing: run scripts/setup.sh (Debian package libbpf-tools)"
    );
    const ROUNDS: usize = 5;
    let header = "TIME     PID     COMM             LATms      HOST";
    // The kernel's probe_read of the host name can fail on a page not yet touched
    // (an empty HOST); ours reads it in the process. Lines are compared by count.
    let lookups_of = |lines: &[String]| lines.iter().filter(|l| l.contains(" lookups ")).count();
    let s = Session::new("lt-gethost");
    let t = s.target_copy(examples::LOOKUPS);
    let t = t.to_str().unwrap();
    let is_lookup = |l: &str| l.contains(" lookups ");
    let mut c = s.bpftime();
    c.args(["load", "stdbuf", "-oL", GETHOSTLATENCY]);
    let mut tool = Tool::spawn_until(c, header);
    let mut app = s.bpftime();
    app.args(["start", t, &ROUNDS.to_string()]);
    run_in(app, None);
    // gethostlatency stops polling at Ctrl-C without draining its buffer: a line not yet
    // read then is lost, on the kernel as here, so both are given time to print them.
    tool.wait_for_count(is_lookup, 2 * ROUNDS, Duration::from_secs(10));
    let (_, ours, err) = tool.stop();
    // getaddrinfo and gethostbyname, each round, each naming the host.
    assert_eq!(lookups_of(&ours), 2 * ROUNDS, "{ours:?} {err}");
    assert!(
        ours.iter()
            .filter(|l| l.contains(" lookups "))
            .all(|l| l.ends_with(" localhost")),
        "{ours:?}"
    );
    if let Some(why) = kernel_unavailable() {
        eprintln!("kernel comparison skipped: {why}");
        return;
    }
    let mut c = Command::new("stdbuf");
    c.args(["-oL", GETHOSTLATENCY]);
    let mut tool = Tool::spawn_until(c, header);
    let mut app = Command::new(t);
    app.arg(ROUNDS.to_string());
    run_in(app, None);
    tool.wait_for_count(is_lookup, 2 * ROUNDS, Duration::from_secs(10));
    let (_, kernel, err) = tool.stop();
    assert_eq!(
        lookups_of(&kernel),
        lookups_of(&ours),
        "kernel: {kernel:?} {err}"
    );
}

/// javagc (HotSpot's `gc__begin`/`gc__end` USDT probes in libjvm.so, attached with
/// libbpf's USDT support to one JVM by pid) times every collection of a JVM under
/// `bpftime start`: one line per collection the JVM itself counted, as on the kernel.
#[test]
fn javagc_times_every_collection_of_a_jvm_like_the_kernel() {
    const JAVAGC: &str = "/usr/sbin/javagc";
    const GCS: u64 = 20;
    assert!(
        Path::new(JAVAGC).exists(),
        "{JAVAGC} is missing: run scripts/setup.sh (Debian package libbpf-tools)"
    );
    let s = Session::new("lt-javagc");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bpf-examples/targets/GcLoop.java");
    let javac = Command::new("javac")
        .arg("-d")
        .arg(&s.tmp)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run javac ({e}): run scripts/setup.sh (Debian package openjdk-17-jdk-headless)"));
    assert!(
        javac.status.success(),
        "{}",
        String::from_utf8_lossy(&javac.stderr)
    );
    let classes = s.tmp.to_str().unwrap().to_string();
    let java = |mut c: Command| {
        c.args([
            "java",
            "-XX:+UseSerialGC",
            "-Xmx256m",
            "-cp",
            &classes,
            "GcLoop",
        ])
        .arg(GCS.to_string());
        c
    };
    let collections = |lines: &[String], pid: u32| {
        lines
            .iter()
            .filter(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() == 4 && f[2] == pid.to_string() && f[3].parse::<u64>().is_ok()
            })
            .count() as u64
    };
    // One run: the JVM starts, javagc attaches to it, then the JVM collects.
    let run = |mut jvm: Driven, tool: &dyn Fn(u32) -> Command, wait_for_links: &dyn Fn()| {
        let pid: u32 = jvm.wait_for("pid=")[4..].parse().unwrap();
        let mut t = Tool::spawn_until(tool(pid), "Tracing javagc time... Hit Ctrl-C to end.");
        t.wait_for_line("TIME     CPU     PID     GC TIME", Duration::from_secs(10));
        wait_for_links();
        jvm.send("go");
        let counted: u64 = jvm.wait_for("gcs=")[4..].parse().unwrap();
        let (status, _, err) = jvm.finish();
        assert!(status.success(), "the JVM failed: {err}");
        assert_eq!(
            counted, GCS,
            "the JVM collected more than asked: the heap is too small"
        );
        std::thread::sleep(Duration::from_millis(500));
        let (_, lines, err) = t.stop();
        (collections(&lines, pid), lines, err)
    };

    let ours = run(
        Driven::spawn(java({
            let mut c = s.bpftime();
            c.arg("start");
            c
        })),
        &|pid| {
            let mut c = s.bpftime();
            c.args([
                "load",
                "stdbuf",
                "-oL",
                JAVAGC,
                "-p",
                &pid.to_string(),
                "-t",
                "0",
            ]);
            c
        },
        // javagc attaches gc__begin, gc__end and the memory pools' begin and end; the
        // agent in the JVM hooks them as the links appear.
        &|| {
            s.wait_for_links(4);
            std::thread::sleep(Duration::from_secs(2));
        },
    );
    assert_eq!(ours.0, GCS, "javagc under bpftime: {:?} {}", ours.1, ours.2);

    if let Some(why) = kernel_unavailable() {
        eprintln!("kernel comparison skipped: {why}");
        return;
    }
    let kernel = run(
        Driven::spawn(java(Command::new("env"))),
        &|pid| {
            let mut c = Command::new("stdbuf");
            c.args(["-oL", JAVAGC, "-p", &pid.to_string(), "-t", "0"]);
            c
        },
        &|| std::thread::sleep(Duration::from_secs(2)),
    );
    assert_eq!(
        kernel.0, ours.0,
        "the kernel's javagc: {:?} {}",
        kernel.1, kernel.2
    );
}
