//! `bpftime attach PID`: the agent (or a test library that follows the same
//! contract) loaded into a process that is already running, which then runs on
//! as before; and clear refusals where attaching is not possible.

use bpftime_tests::{bpftime, examples, field, run_with_timeout, Session};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

struct Probes {
    /// Follows the attach contract.
    ready: PathBuf,
    /// Declares no contract.
    no_contract: PathBuf,
    /// Declares the contract but never reports that it is ready.
    never_ready: PathBuf,
    /// Reports that it cannot start.
    failing: PathBuf,
}

/// The test library of the inject crate, built in three variants.
fn probes() -> &'static Probes {
    static PROBES: OnceLock<Probes> = OnceLock::new();
    PROBES.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../inject/tests/c/probe.c");
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("attach-pid");
        std::fs::create_dir_all(&out).unwrap();
        let build = |name: &str, defines: &[&str]| {
            let so = out.join(name);
            let st = Command::new("cc")
                .args(["-O2", "-shared", "-fPIC", "-o"])
                .arg(&so)
                .args(defines)
                .arg(&src)
                .status()
                .expect("run cc");
            assert!(st.success(), "cc failed for {name}");
            so
        };
        Probes {
            ready: build("probe.so", &[]),
            no_contract: build("probe-no-contract.so", &["-DNO_CONTRACT"]),
            never_ready: build("probe-never-ready.so", &["-DNO_READY"]),
            failing: build("probe-failing.so", &["-DREPORT_ERROR"]),
        }
    })
}

/// `calls N --wait-for GO`: blocked in its polling sleep until GO exists, then
/// makes its N calls and exits 0.
struct Target {
    child: Child,
    go: PathBuf,
    probe_out: PathBuf,
}

impl Target {
    fn spawn(s: &Session, exe: &Path, n: u64, env: &[(&str, &str)]) -> Target {
        let go = s.tmp.join("go");
        let probe_out = s.tmp.join("probe.out");
        let mut c = Command::new(exe);
        c.arg(n.to_string())
            .arg("--wait-for")
            .arg(&go)
            .env("PROBE_OUT", &probe_out)
            .env_remove("BPFTIME_STORE")
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            c.env(k, v);
        }
        let child = c.spawn().expect("spawn target");
        let t = Target {
            child,
            go,
            probe_out,
        };
        // Its libraries are mapped once it polls for GO.
        let end = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(format!("/proc/{}/maps", t.pid()))
            .is_ok_and(|m| m.contains("libc.so"))
        {
            assert!(Instant::now() < end, "target never started");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(50));
        t
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn status_field(&self, key: &str) -> String {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
            .unwrap_or_default()
    }

    fn probe_lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.probe_out)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Lets it make its calls; returns its exit code.
    fn finish(mut self) -> i32 {
        std::fs::write(&self.go, "").unwrap();
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.code().unwrap_or(-1);
            }
            assert!(Instant::now() < end, "target did not finish");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn attach(s: &Session, pid: i32, extra: &[&str]) -> Output {
    let mut c = s.bpftime();
    c.arg("attach").arg(pid.to_string()).args(extra);
    run_with_timeout(c, Duration::from_secs(120))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn hint_path(pid: i32) -> PathBuf {
    PathBuf::from(format!("/dev/shm/bpftime-inject-{pid}"))
}

#[test]
fn attach_hands_the_store_to_a_running_process_that_runs_on_after_bpftime_exits() {
    let s = Session::new("attach-probe");
    let t = Target::spawn(&s, Path::new(examples::CALLS), 100, &[]);
    let agent = probes().ready.to_str().unwrap();
    let out = attach(&s, t.pid(), &["--agent", agent]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(&format!("attached to process {}", t.pid())),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(
        t.probe_lines(),
        [format!(
            "loaded pid={0} tid={0} store={1}",
            t.pid(),
            s.store
        )]
    );
    assert!(
        !hint_path(t.pid()).exists(),
        "the store hint was left behind"
    );
    // bpftime has exited: the process is neither traced nor stopped, and it
    // finishes its work as it would have.
    assert_eq!(t.status_field("TracerPid:"), "0");
    let state = t.status_field("State:");
    assert!(state.starts_with('S') || state.starts_with('R'), "{state}");
    assert_eq!(t.finish(), 0);
}

#[test]
fn attach_twice_is_refused_the_second_time() {
    let s = Session::new("attach-twice");
    let t = Target::spawn(&s, Path::new(examples::CALLS), 10, &[]);
    let agent = probes().ready.to_str().unwrap();
    assert_eq!(
        attach(&s, t.pid(), &["--agent", agent]).status.code(),
        Some(0)
    );
    let out = attach(&s, t.pid(), &["--agent", agent]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("is already loaded in process"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(t.probe_lines().len(), 1);
    assert_eq!(t.finish(), 0);
}

#[test]
fn attach_to_a_process_that_does_not_exist_exits_2() {
    let s = Session::new("attach-gone");
    let mut c = Command::new("true").spawn().unwrap();
    let pid = c.id() as i32;
    c.wait().unwrap();
    // With a library that would be refused too: the pid is what is named.
    let out = attach(
        &s,
        pid,
        &["--agent", probes().no_contract.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("no process {pid}: it has exited or never existed")),
        "{err}"
    );
}

#[test]
fn attach_to_pid_0_is_a_usage_error() {
    let s = Session::new("attach-zero");
    let out = attach(&s, 0, &[]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn attach_as_another_user_is_refused_with_the_way_out() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to run bpftime as another user");
        return;
    }
    let s = Session::new("attach-uid");
    let t = Target::spawn(&s, Path::new(examples::CALLS), 10, &[]);
    let mut c = Command::new(bpftime());
    c.arg("--store")
        .arg(&s.store)
        .arg("attach")
        .arg(t.pid().to_string())
        .arg("--agent")
        .arg(&probes().ready);
    std::os::unix::process::CommandExt::uid(&mut c, 65534);
    std::os::unix::process::CommandExt::gid(&mut c, 65534);
    let out = run_with_timeout(c, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("not permitted to trace process {}", t.pid())),
        "{err}"
    );
    assert!(
        err.contains("runs as uid 0 and bpftime as uid 65534"),
        "{err}"
    );
    assert!(
        err.contains("run `bpftime load` and `bpftime attach` as uid 0"),
        "{err}"
    );
    assert!(t.probe_lines().is_empty());
    assert_eq!(t.finish(), 0);
}

#[test]
fn attach_refuses_a_library_without_the_contract_and_leaves_the_process_alone() {
    let s = Session::new("attach-nocontract");
    let t = Target::spawn(&s, Path::new(examples::CALLS), 10, &[]);
    let out = attach(
        &s,
        t.pid(),
        &["--agent", probes().no_contract.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("does not export BPFTIME_ATTACH_CONTRACT") && err.contains("bpftime start"),
        "{err}"
    );
    assert!(t.probe_lines().is_empty());
    assert_eq!(t.status_field("TracerPid:"), "0");
    assert_eq!(t.finish(), 0);
}

#[test]
fn attach_fails_when_the_agent_never_reports_that_it_attached() {
    let s = Session::new("attach-notready");
    let t = Target::spawn(&s, Path::new(examples::CALLS), 10, &[]);
    let out = attach(
        &s,
        t.pid(),
        &[
            "--timeout",
            "1",
            "--agent",
            probes().never_ready.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("did not report that it attached within 1 s"),
        "{err}"
    );
    assert!(
        !hint_path(t.pid()).exists(),
        "the store hint was left behind"
    );
    // The library did load (and the process is fine): only the report is missing.
    assert_eq!(t.probe_lines().len(), 1);
    assert_eq!(t.finish(), 0);
}

#[test]
fn attach_reports_an_agent_that_cannot_start() {
    let s = Session::new("attach-agentfail");
    let t = Target::spawn(&s, Path::new(examples::CALLS), 10, &[]);
    let out = attach(
        &s,
        t.pid(),
        &["--agent", probes().failing.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!(
            "the agent was loaded into process {} but could not start: probe refused",
            t.pid()
        )),
        "{err}"
    );
    assert!(
        !hint_path(t.pid()).exists(),
        "the store hint was left behind"
    );
    assert_eq!(t.finish(), 0);
}

#[test]
fn attach_to_a_target_started_with_the_agent_is_refused() {
    let s = Session::new("attach-started");
    let mut c = s.bpftime();
    c.arg("start")
        .arg(examples::CALLS)
        .arg("1")
        .arg("--wait-for")
        .arg(s.tmp.join("go"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let mut child = c.spawn().unwrap();
    let pid = child.id() as i32;
    let end = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .is_ok_and(|m| m.contains("libbpftime_agent.so"))
    {
        assert!(Instant::now() < end, "the agent never loaded");
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = attach(&s, pid, &[]);
    std::fs::write(s.tmp.join("go"), "").unwrap();
    let status = child.wait().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("is already loaded in process"),
        "{}",
        text(&out.stderr)
    );
    assert!(status.success());
}

/// The real agent, attached to a running target while a libbpf tool is
/// loaded, counts every call the target makes afterwards; the store named by
/// `attach` wins over the target's own BPFTIME_STORE.
#[test]
fn attached_agent_counts_every_call_of_a_running_target() {
    const N: u64 = 1000;
    let s = Session::new("attach-agent");
    let exe = s.target_copy(examples::CALLS);
    let loader = s.load(&[
        examples::FUNCLATENCY,
        "--target",
        exe.to_str().unwrap(),
        "--func",
        "work",
    ]);
    let decoy = format!("{}-decoy", s.store);
    let t = Target::spawn(&s, &exe, N, &[("BPFTIME_STORE", &decoy)]);
    let out = attach(&s, t.pid(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(t.status_field("TracerPid:"), "0");
    assert_eq!(t.finish(), 0);
    let (code, lines, lerr) = loader.stop();
    assert_eq!(code, 0, "loader failed: {lerr}");
    assert_eq!(field(&lines, "count=", "count"), Some(N), "{lines:?}");
    assert!(
        !bpftime_runtime::Store::dir_for(&decoy).exists(),
        "the agent followed the target's BPFTIME_STORE instead of the attached store"
    );
}

/// Only the application's calls reach the tools. The threads the agent brings into
/// an attached process run no probe: the starter's thread, which frees memory and
/// exits after the probes are live, and the agent's own. The kernel would see none
/// of their calls.
#[test]
fn attached_agent_runs_no_probe_on_its_own_threads() {
    bpftime_tests::require_bpftrace();
    let s = Session::new("attach-own-threads");
    let exe = s.target_copy(examples::CALLS);
    let tool = s.load_bpftrace("uprobe:libc:free { @[comm] = count(); }");
    let t = Target::spawn(&s, &exe, 100, &[]);
    let out = attach(&s, t.pid(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(t.finish(), 0);
    let (code, lines, err) = tool.stop();
    assert_eq!(code, 0, "bpftrace failed: {err}");
    let keys: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("@[")?.split_once("]: ").map(|(k, _)| k))
        .collect();
    // `calls` frees memory as it exits; that much must be seen.
    assert!(keys.contains(&"calls"), "{lines:?}");
    assert_eq!(keys, ["calls"], "calls from bpftime's threads were probed");
}
