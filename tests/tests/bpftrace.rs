//! bpftrace (Debian's 0.17) under `bpftime load`: one-liners print what they
//! print on the kernel.

use bpftime_tests::{examples, kernel_unavailable, require_bpftrace, Session, Tool};
use std::process::Command;
use std::time::Duration;

const N: u64 = 200;

fn ours(s: &Session, script: &str, target: &str, last: Option<&str>) -> Vec<String> {
    let mut tool = s.load_bpftrace(script);
    let out = s.start(&[target, &N.to_string()]);
    assert!(out.status.success());
    // Printed events arrive through the perf buffer; let the last one in, as a
    // user waits to see it before pressing Ctrl-C.
    if let Some(l) = last {
        tool.wait_for_line(l, Duration::from_secs(10));
    }
    let (_, lines, _) = tool.stop();
    lines
}

/// Held while bpftrace runs on the kernel. Several kernel bpftrace instances at
/// once on our 2-core machines were seen to ignore SIGINT for over a minute;
/// one at a time, they exit promptly. bpftrace under bpftime is not serialized.
fn kernel_bpftrace_turn() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|p| p.into_inner())
}

fn kernel(script: &str, target: &str, last: Option<&str>) -> Option<Vec<String>> {
    if let Some(why) = kernel_unavailable() {
        eprintln!("kernel comparison skipped: {why}");
        return None;
    }
    let _turn = kernel_bpftrace_turn();
    let mut c = Command::new("bpftrace");
    c.args(["-e", script]);
    let tool = Tool::spawn_until(c, "Attaching 1 probe...");
    std::thread::sleep(Duration::from_secs(2));
    let mut tool = tool;
    assert!(Command::new(target)
        .arg(N.to_string())
        .status()
        .unwrap()
        .success());
    if let Some(l) = last {
        tool.wait_for_line(l, Duration::from_secs(10));
    }
    let (_, lines, _) = tool.stop();
    Some(lines)
}

fn nonempty(lines: Vec<String>) -> Vec<String> {
    lines
        .into_iter()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("Attaching"))
        .collect()
}

#[test]
fn count_and_printf_one_liners_match_the_kernel() {
    require_bpftrace();
    let s = Session::new("bpftrace");
    let t = s.target_copy(examples::CALLS);
    let t = t.to_str().unwrap();
    let count = format!("uprobe:{t}:work {{ @c = count(); }}");
    let got = nonempty(ours(&s, &count, t, None));
    assert_eq!(got, vec![format!("@c: {N}")]);
    let printf = format!("uprobe:{t}:work {{ printf(\"arg=%d\\n\", arg0); }}");
    let got_printf = nonempty(ours(&s, &printf, t, Some(&format!("arg={}", N - 1))));
    let want: Vec<String> = (0..N).map(|i| format!("arg={i}")).collect();
    assert_eq!(got_printf, want);
    let keyed = format!("uprobe:{t}:work /arg0 < 5/ {{ @[arg0] = count(); }}");
    let got_keyed = nonempty(ours(&s, &keyed, t, None));
    let kt = s.tmp.join("kernel-calls");
    bpftime_tests::copy_executable(examples::CALLS, &kt);
    let kt = kt.to_str().unwrap();
    if let Some(k) = kernel(&count.replace(t, kt), kt, None) {
        assert_eq!(nonempty(k), got);
    }
    if let Some(k) = kernel(&printf.replace(t, kt), kt, Some(&format!("arg={}", N - 1))) {
        assert_eq!(nonempty(k), got_printf);
    }
    // bpftrace prints equal counts in hash order, which is the map's own: compare as sets.
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    assert_eq!(
        sorted(got_keyed.clone()),
        (0..5).map(|i| format!("@[{i}]: 1")).collect::<Vec<_>>()
    );
    if let Some(k) = kernel(&keyed.replace(t, kt), kt, None) {
        assert_eq!(sorted(nonempty(k)), sorted(got_keyed));
    }
}

/// `count()` and `sum()` read this CPU's copy of a per-CPU value, add and write it back;
/// the kernel runs that with preemption off, so no update is lost. Under bpftime a thread
/// preempted between the read and the write must not erase what other threads (of this
/// or another process) added meanwhile: three processes of four threads each, on a
/// machine with fewer CPUs than threads, and every call counted, in a per-CPU array
/// (`@c`) and a per-CPU hash (`@[arg0 % 3]`), on the JIT and on the interpreter; and
/// again with glibc's rseq registration turned off, as in a glibc before 2.35 (RHEL 8
/// and 9, Ubuntu 20.04), where each thread registers the agent's own rseq area.
#[test]
fn per_cpu_aggregations_are_exact_from_many_threads_and_processes() {
    require_bpftrace();
    const CALLS: u64 = 200_000;
    const THREADS: u64 = 4;
    const PROCESSES: u64 = 3;
    let s = Session::new("bpftrace-threads");
    let t = s.target_copy(examples::CALLS);
    let t = t.to_str().unwrap();
    let script =
        format!("uprobe:{t}:work {{ @c = count(); @s = sum(arg0 % 3); @[arg0 % 3] = count(); }}");
    // Each thread calls work(0..CALLS): arg0 % 3 is 0 for ceil(CALLS / 3) of them.
    let per_residue = |r: u64| (CALLS + 2 - r) / 3 * THREADS * PROCESSES;
    let total = CALLS * THREADS * PROCESSES;
    let sum = per_residue(1) + 2 * per_residue(2);
    let mut want = vec![
        format!("@c: {total}"),
        format!("@s: {sum}"),
        format!("@[0]: {}", per_residue(0)),
        format!("@[1]: {}", per_residue(1)),
        format!("@[2]: {}", per_residue(2)),
    ];
    want.sort();
    let glibc_rseq = [None, Some("glibc.pthread.rseq=0")];
    for (engine, tunables) in ["jit", "interpreter"]
        .into_iter()
        .flat_map(|e| glibc_rseq.map(|t| (e, t)))
    {
        let tool = s.load_bpftrace(&script);
        let runs: Vec<_> = (0..PROCESSES)
            .map(|_| {
                let mut c = s.bpftime();
                c.args([
                    "start",
                    t,
                    &CALLS.to_string(),
                    "--threads",
                    &THREADS.to_string(),
                ]);
                if engine == "interpreter" {
                    c.env("BPFTIME_JIT", "0");
                }
                if let Some(t) = tunables {
                    c.env("GLIBC_TUNABLES", t);
                }
                c.spawn().unwrap()
            })
            .collect();
        for mut r in runs {
            assert!(r.wait().unwrap().success());
        }
        let (_, lines, _) = tool.stop();
        let mut got = nonempty(lines);
        got.sort();
        assert_eq!(got, want, "on the {engine}, GLIBC_TUNABLES {tunables:?}");
    }
}

/// `uretprobe` with every aggregation whose output is deterministic: the
/// histograms, sum, avg, min, max and stats of `work`'s return value (4 * arg + 6).
#[test]
fn aggregations_at_a_uretprobe_match_the_kernel() {
    require_bpftrace();
    let s = Session::new("bpftrace-agg");
    let t = s.target_copy(examples::CALLS);
    let t = t.to_str().unwrap();
    let script = format!(
        "uretprobe:{t}:work {{ @h = hist(retval); @l = lhist(retval, 0, 1000, 100); \
         @s = sum(retval); @a = avg(retval); @mn = min(retval); @mx = max(retval); \
         @st = stats(retval); }}"
    );
    let got = nonempty(ours(&s, &script, t, None));
    // 4 * i + 6 for i in 0..N.
    let values: Vec<u64> = (0..N).map(|i| 4 * i + 6).collect();
    let sum: u64 = values.iter().sum();
    assert!(got.contains(&format!("@s: {sum}")), "{got:#?}");
    assert!(got.contains(&format!("@a: {}", sum / N)), "{got:#?}");
    assert!(got.contains(&"@mn: 6".to_string()), "{got:#?}");
    assert!(
        got.contains(&format!("@mx: {}", 4 * (N - 1) + 6)),
        "{got:#?}"
    );
    assert!(
        got.contains(&format!("@st: count {N}, average {}, total {sum}", sum / N)),
        "{got:#?}"
    );
    // lhist: [0, 100) holds 6..98 step 4 (24 values), then 25 per bucket.
    assert!(
        got.iter()
            .any(|l| l.starts_with("[0, 100)") && l.contains(" 24 |")),
        "{got:#?}"
    );
    let kt = s.tmp.join("kernel-calls");
    bpftime_tests::copy_executable(examples::CALLS, &kt);
    let kt = kt.to_str().unwrap();
    if let Some(k) = kernel(&script.replace(t, kt), kt, None) {
        assert_eq!(nonempty(k), got);
    }
}

/// Waits until process `pid` has exited by itself (a zombie or gone).
fn wait_for_exit(pid: u32, timeout: Duration) -> bool {
    let end = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < end {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next());
        if matches!(state, None | Some("Z") | Some("X")) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Runs a script that ends itself with `exit()`: returns its output, printed
/// without any signal from us.
fn exits_by_itself(tool: Tool, run_target: impl FnOnce()) -> (Vec<String>, String) {
    std::thread::sleep(Duration::from_secs(2));
    run_target();
    assert!(
        wait_for_exit(tool.pid(), Duration::from_secs(30)),
        "bpftrace did not exit after exit(); printed {:?}",
        tool.seen
    );
    // Already exited: the SIGINT that `stop` sends reaches nobody.
    let (code, lines, err) = tool.stop();
    assert_eq!(code, 0, "{err}");
    (lines, err)
}

#[test]
fn exit_ends_bpftrace_with_its_maps_printed_like_the_kernel() {
    require_bpftrace();
    // The last call triggers exit(), so no call happens between exit() and
    // bpftrace's detach, on the kernel and here alike.
    const CALLS: u64 = 10;
    let s = Session::new("bpftrace-exit");
    let t = s.target_copy(examples::CALLS);
    let t = t.to_str().unwrap();
    let script = format!(
        "uprobe:{t}:work {{ @c = count(); @last = max(arg0); if (arg0 == {}) {{ exit(); }} }}",
        CALLS - 1
    );
    let mut c = s.bpftime();
    c.args(["load", "bpftrace", "-e", &script]);
    let tool = Tool::spawn_until(c, "Attaching 1 probe...");
    s.wait_for_links(1);
    let (got, err) = exits_by_itself(tool, || {
        assert!(s.start(&[t, &CALLS.to_string()]).status.success());
    });
    let got = nonempty(got);
    // Nothing bpftrace asks of the kernel is refused here: not the locked-memory
    // limit, not the tracefs list of legacy uprobes read on detach. And the shim
    // writes nothing of its own into the tool's terminal: bpftrace's feature probes
    // expect some programs to be rejected, and the kernel prints nothing for them.
    assert!(
        !err.contains("ERROR") && !err.contains("refused"),
        "bpftrace reported errors under bpftime:\n{err}"
    );
    assert!(
        !err.contains("WARN") && !err.contains("program rejected"),
        "the shim wrote into bpftrace's terminal:\n{err}"
    );
    assert_eq!(
        got,
        vec![format!("@c: {CALLS}"), format!("@last: {}", CALLS - 1)]
    );
    if let Some(why) = kernel_unavailable() {
        eprintln!("kernel comparison skipped: {why}");
        return;
    }
    let kt = s.tmp.join("kernel-calls");
    bpftime_tests::copy_executable(examples::CALLS, &kt);
    let kt = kt.to_str().unwrap();
    let _turn = kernel_bpftrace_turn();
    let mut c = Command::new("bpftrace");
    c.args(["-e", &script.replace(t, kt)]);
    let tool = Tool::spawn_until(c, "Attaching 1 probe...");
    let (k, _) = exits_by_itself(tool, || {
        assert!(Command::new(kt)
            .arg(CALLS.to_string())
            .status()
            .unwrap()
            .success());
    });
    let k = nonempty(k);
    assert_eq!(k, got);
}

/// Entries of a keyed map whose keys span several lines (stacks), in a
/// stable order: bpftrace prints equal counts in hash order.
fn blocks(lines: Vec<String>) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    for l in lines {
        let end = l.starts_with(']');
        cur.push(l);
        if end {
            out.push(std::mem::take(&mut cur));
        }
    }
    assert!(cur.is_empty(), "unterminated entry: {cur:?}");
    out.sort();
    out
}

#[test]
fn ustack_keys_are_the_kernels_frames() {
    require_bpftrace();
    let s = Session::new("bpftrace-ustack");
    let t = s.target_copy(examples::STACK_TARGET);
    let t = t.to_str().unwrap();
    // Five frames: leaf, mid, top_a or top_b, drive, main. The target has no
    // PIE, so the addresses are the same in every run; libc's frames above
    // main would not be.
    let script = format!("uprobe:{t}:leaf {{ @[ustack(5)] = count(); }}");
    let got = blocks(nonempty(ours(&s, &script, t, None)));
    assert_eq!(got.len(), 2, "two call chains: {got:#?}");
    for b in &got {
        assert_eq!(b.len(), 7, "{b:?}");
        assert_eq!(b[6], format!("]: {N}"));
    }
    let kt = s.tmp.join("kernel-stack_target");
    bpftime_tests::copy_executable(examples::STACK_TARGET, &kt);
    let kt = kt.to_str().unwrap();
    if let Some(k) = kernel(&script.replace(t, kt), kt, None) {
        assert_eq!(blocks(nonempty(k)), got);
    }
}

/// `BEGIN` and `END` run where the kernel would run them, once each, around
/// the probes: bpftrace test-runs them (`BPF_PROG_TEST_RUN`), which bpftime
/// serves in bpftrace's own process.
#[test]
fn begin_and_end_probes_run_like_on_the_kernel() {
    require_bpftrace();
    let s = Session::new("bpftrace-begin");
    let t = s.target_copy(examples::CALLS);
    let t = t.to_str().unwrap();
    let script = format!(
        "BEGIN {{ printf(\"start\\n\"); }} uprobe:{t}:work {{ @c = count(); }} \
         END {{ printf(\"end\\n\"); }}"
    );
    let run = |mut c: Command, target: &dyn Fn()| {
        c.args(["-e", &script]);
        let mut tool = Tool::spawn_until(c, "Attaching 3 probes...");
        tool.wait_for_line("start", Duration::from_secs(10));
        std::thread::sleep(Duration::from_secs(2));
        target();
        let (code, lines, err) = tool.stop();
        assert_eq!(code, 0, "{err}");
        nonempty(lines)
    };
    let mut c = s.bpftime();
    c.args(["load", "bpftrace"]);
    let got = run(c, &|| {
        s.wait_for_links(1);
        assert!(s.start(&[t, &N.to_string()]).status.success());
    });
    // What bpftrace 0.17 prints on the kernel for this script. The kernel run is
    // not repeated here: there, bpftrace with BEGIN and END probes was seen to
    // ignore SIGINT in epoll_wait for over a minute in clean-clone CI runs, so the
    // comparison could not be made reliably.
    assert_eq!(
        got,
        vec!["start".to_string(), "end".into(), format!("@c: {N}")]
    );
}

/// bpftrace's own gethostlatency.bt, as Debian installs it (uprobes and uretprobes on
/// libc's getaddrinfo, gethostbyname and gethostbyname2): a line per lookup of the
/// `lookups` target, naming the host, as many as on the kernel.
#[test]
fn the_bundled_gethostlatency_tool_prints_every_lookup_like_the_kernel() {
    require_bpftrace();
    const TOOL: &str = "/usr/sbin/gethostlatency.bt";
    assert!(
        std::path::Path::new(TOOL).exists(),
        "{TOOL} is missing: run scripts/setup.sh (Debian package bpftrace)"
    );
    const ROUNDS: usize = 4;
    let ready = "Tracing getaddr/gethost calls... Hit Ctrl-C to end.";
    let lookups = |lines: &[String]| {
        lines
            .iter()
            .filter(|l| l.contains(" lookups ") && l.ends_with(" localhost"))
            .count()
    };
    let s = Session::new("bt-gethost");
    let t = s.target_copy(examples::LOOKUPS);
    let t = t.to_str().unwrap();
    let mut c = s.bpftime();
    c.args(["load", "bpftrace", TOOL]);
    let tool = Tool::spawn_until(c, ready);
    s.wait_for_links(6);
    std::thread::sleep(Duration::from_secs(2));
    let out = s.start(&[t, &ROUNDS.to_string()]);
    assert!(out.status.success(), "{out:?}");
    std::thread::sleep(Duration::from_secs(1));
    let (_, ours, err) = tool.stop();
    assert_eq!(lookups(&ours), 2 * ROUNDS, "{ours:?} {err}");
    if let Some(why) = kernel_unavailable() {
        eprintln!("kernel comparison skipped: {why}");
        return;
    }
    let _turn = kernel_bpftrace_turn();
    let mut c = Command::new("bpftrace");
    c.arg(TOOL);
    let tool = Tool::spawn_until(c, ready);
    std::thread::sleep(Duration::from_secs(2));
    let out = Command::new(t).arg(ROUNDS.to_string()).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    std::thread::sleep(Duration::from_secs(1));
    let (_, kernel, err) = tool.stop();
    // The kernel's probe_read of a host name on a page not yet touched can come back
    // empty; lines are compared by count.
    let kernel_lines = kernel.iter().filter(|l| l.contains(" lookups ")).count();
    assert_eq!(kernel_lines, lookups(&ours), "kernel: {kernel:?} {err}");
}
