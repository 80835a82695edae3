//! GPU probes reach the store as links from every loader path: an unmodified
//! libbpf 1.1 C loader (`cuda:` sections through the handler the shim
//! registers in libbpf, `cuda__*` kprobes through libbpf's own kprobe attach),
//! `bpftime run` (libbpf-rs's static libbpf) and bpftrace's `kprobe:` and
//! `kretprobe:`. Nothing here runs on a GPU: the links are what the agent
//! reads, and `bpftime list` shows them.

use bpftime_runtime::{
    GpuProbeKind, LinkKind, LinkRecord, ObjectKind, PerfEventKind, PerfEventRecord, Store,
};
use bpftime_tests::{examples, require_bpftrace, run_with_timeout, Session, Tool};
use std::time::Duration;

/// The links in the store: (kind, kernel pattern, program name), sorted.
fn links(s: &Session) -> Vec<(LinkKind, String, String)> {
    let store = Store::open(&s.store).expect("the store");
    let mut out: Vec<(LinkKind, String, String)> = store
        .ids(ObjectKind::Link)
        .into_iter()
        .map(|id| {
            let l = LinkRecord::read(&store, id).unwrap();
            assert_eq!(l.offset, 0, "{l:?}");
            let prog = bpftime_runtime::ProgramRecord::read(&store, l.prog_id).unwrap();
            (l.kind, l.path, prog.name)
        })
        .collect();
    sort_links(&mut out);
    out
}

fn sort_links(links: &mut [(LinkKind, String, String)]) {
    links.sort_by(|a, b| (a.0.label(), &a.1, &a.2).cmp(&(b.0.label(), &b.1, &b.2)));
}

fn perf_events(s: &Session) -> Vec<(PerfEventKind, String)> {
    let store = Store::open(&s.store).expect("the store");
    let mut out: Vec<(PerfEventKind, String)> = store
        .ids(ObjectKind::PerfEvent)
        .into_iter()
        .map(|id| PerfEventRecord::read(&store, id).unwrap())
        .filter(|e| e.kind != PerfEventKind::BpfOutput)
        .map(|e| (e.kind, e.path))
        .collect();
    out.sort_by(|a, b| (a.0.label(), &a.1).cmp(&(b.0.label(), &b.1)));
    out
}

fn list(s: &Session) -> String {
    let out = s.bpftime().arg("list").output().unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn link(kind: LinkKind, kernel: &str, prog: &str) -> (LinkKind, String, String) {
    (kind, kernel.to_string(), prog.to_string())
}

/// What `gpu_probes.bpf.o` attaches to (program names as the store keeps them,
/// 15 bytes at most).
fn gpu_probes_links(exit: &str, mangled: &str, launch: &str) -> Vec<(LinkKind, String, String)> {
    let mut v = vec![
        link(
            LinkKind::Gpu(GpuProbeKind::Entry),
            "vectorAdd",
            "cuda__vector_ad",
        ),
        link(LinkKind::Gpu(GpuProbeKind::Entry), mangled, "mangled_entry"),
        link(LinkKind::Gpu(GpuProbeKind::Exit), exit, "vector_add_exit"),
        link(
            LinkKind::Gpu(GpuProbeKind::Launch),
            launch,
            "vector_add_laun",
        ),
    ];
    sort_links(&mut v);
    v
}

/// A program calling `bpf_get_current_comm`, which GPU programs lack.
fn comm_program(section: &str, name: &str) -> String {
    format!(
        "#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\n\
         SEC(\"{section}\") int {name}(void *ctx) {{\n\
             char comm[16];\n\
             bpf_get_current_comm(comm, sizeof(comm));\n\
             return comm[0];\n\
         }}\n\
         char LICENSE[] SEC(\"license\") = \"GPL\";\n"
    )
}

fn text(out: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn a_libbpf_c_loader_attaches_every_spelling_of_gpu_probe_as_links() {
    let s = Session::new("gpu-c");
    let tool = s.load(&[examples::GPU_PROBES, "--obj", examples::GPU_PROBES_BPF_O]);
    assert_eq!(
        links(&s),
        gpu_probes_links("vectorAdd", "_Z9vectorAddPKfS0_Pfi", "vectorAdd")
    );
    // Each link came through a kprobe perf event on the kernel's name (a launch
    // event for the launch probe), as in the kernel's attach path.
    assert_eq!(
        perf_events(&s),
        vec![
            (PerfEventKind::GpuLaunch, "vectorAdd".into()),
            (PerfEventKind::Kprobe, "_Z9vectorAddPKfS0_Pfi".into()),
            (PerfEventKind::Kprobe, "vectorAdd".into()),
            (PerfEventKind::Kretprobe, "vectorAdd".into()),
        ]
    );
    let shown = list(&s);
    for line in [
        "gpu-exit vectorAdd",
        "gpu-entry vectorAdd",
        "gpu-entry _Z9vectorAddPKfS0_Pfi",
        "gpu-launch vectorAdd",
    ] {
        assert!(
            shown
                .lines()
                .any(|l| l.starts_with("link ") && l.contains(line)),
            "`{line}` missing from:\n{shown}"
        );
    }
    assert!(
        shown
            .lines()
            .any(|l| l.starts_with("perf ") && l.contains("kretprobe vectorAdd")),
        "{shown}"
    );
    let (code, lines, err) = tool.stop();
    assert_eq!(code, 0, "{lines:?}\n{err}");
    assert!(lines.contains(&"count[0]=0".to_string()), "{lines:?}");
    // The loader's libbpf destroyed its links on the way out.
    assert!(links(&s).is_empty());
    // Nothing on the tool's terminal but what the loader prints itself.
    assert!(err.trim().is_empty(), "{err}");
}

#[test]
fn a_cuda_section_the_gpu_rules_reject_fails_to_load_with_the_log() {
    let s = Session::new("gpu-c-rejected");
    let obj = s.compile_bpf("comm", &comm_program("cuda:vectorAdd:exit", "comm_on_gpu"));
    let mut c = s.bpftime();
    c.args(["load", examples::GPU_PROBES, "--obj", obj.to_str().unwrap()]);
    let out = run_with_timeout(c, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    // libbpf prints the log the shim put in its buffer.
    let start = err
        .find("-- BEGIN PROG LOAD LOG --")
        .unwrap_or_else(|| panic!("{}", text(&out)));
    let end = err
        .find("-- END PROG LOAD LOG --")
        .unwrap_or_else(|| panic!("{}", text(&out)));
    assert!(
        err[start..end].contains("helper bpf_get_current_comm#16 is not available on the GPU"),
        "{}",
        text(&out)
    );
    assert!(err.contains("cannot load BPF object"), "{}", text(&out));
    // The same program in a launch probe runs on the CPU, where it is fine.
    let launch = s.compile_bpf(
        "launch",
        &comm_program("cuda:vectorAdd:launch", "comm_at_launch"),
    );
    let tool = s.load(&[examples::GPU_PROBES, "--obj", launch.to_str().unwrap()]);
    assert_eq!(
        links(&s),
        vec![link(
            LinkKind::Gpu(GpuProbeKind::Launch),
            "vectorAdd",
            "comm_at_launch"
        )]
    );
    assert_eq!(tool.stop().0, 0);
}

/// In bpftime every kprobe is a CUDA kernel probe: one not named `cuda__*`
/// loads under the CPU rules and is checked under the GPU rules when attached.
#[test]
fn a_plain_kprobe_the_gpu_rules_reject_fails_to_attach_and_says_why_once() {
    let s = Session::new("gpu-c-attach");
    let obj = s.compile_bpf("kprobe", &comm_program("kprobe/vectorAdd", "comm_probe"));
    let mut c = s.bpftime();
    c.args(["load", examples::GPU_PROBES, "--obj", obj.to_str().unwrap()]);
    let out = run_with_timeout(c, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let first = "bpftime: program `comm_probe` cannot be attached to the CUDA kernel `vectorAdd`";
    assert_eq!(err.matches(first).count(), 1, "{}", text(&out));
    assert!(
        err.contains("helper bpf_get_current_comm#16 is not available on the GPU"),
        "{}",
        text(&out)
    );
    assert!(
        err.contains("cannot attach program 'comm_probe' (kprobe/vectorAdd)"),
        "{}",
        text(&out)
    );
}

#[test]
fn bpftrace_kprobe_and_kretprobe_become_gpu_links() {
    require_bpftrace();
    let s = Session::new("gpu-bpftrace");
    let mut c = s.bpftime();
    c.args([
        "load",
        "bpftrace",
        "-e",
        "kprobe:vectorAdd { @entries = count(); } kretprobe:vectorAdd { @exits = count(); }",
    ]);
    let tool = Tool::spawn_until(c, "Attaching 2 probes...");
    s.wait_for_links(2);
    let got: Vec<(LinkKind, String)> = links(&s).into_iter().map(|l| (l.0, l.1)).collect();
    assert_eq!(
        got,
        vec![
            (LinkKind::Gpu(GpuProbeKind::Entry), "vectorAdd".to_string()),
            (LinkKind::Gpu(GpuProbeKind::Exit), "vectorAdd".to_string()),
        ]
    );
    let shown = list(&s);
    assert!(shown.contains("gpu-entry vectorAdd"), "{shown}");
    assert!(shown.contains("gpu-exit vectorAdd"), "{shown}");
    std::thread::sleep(Duration::from_secs(2));
    let (code, lines, err) = tool.stop();
    assert_eq!(code, 0, "{lines:?}\n{err}");
    assert!(lines.contains(&"@entries: 0".to_string()), "{lines:?}");
    // Detaching reads tracefs's list of legacy kprobes, which the shim answers for.
    assert!(!err.contains("ERROR"), "{err}");
}

#[test]
fn a_bpftrace_kprobe_the_gpu_rules_reject_fails_at_attach_with_the_log() {
    require_bpftrace();
    let s = Session::new("gpu-bpftrace-rejected");
    let mut c = s.bpftime();
    c.args([
        "load",
        "bpftrace",
        "-e",
        "kprobe:vectorAdd { @[comm] = count(); }",
    ]);
    let out = run_with_timeout(c, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        err.matches("cannot be attached to the CUDA kernel `vectorAdd`")
            .count(),
        1,
        "{}",
        text(&out)
    );
    assert!(
        err.contains("helper bpf_get_current_comm#16 is not available on the GPU"),
        "{}",
        text(&out)
    );
    assert!(
        err.contains("Error attaching probe: 'kprobe:vectorAdd'"),
        "{}",
        text(&out)
    );
}

/// `bpftime run` attaches through libbpf-rs's static libbpf, in which the shim
/// registered its `cuda:` handler from bpftime's own symbol table. The app lists
/// the store while the links exist.
#[test]
fn bpftime_run_creates_gpu_links_and_attach_overrides_the_kernel() {
    let s = Session::new("gpu-run");
    let bpftime = bpftime_tests::bpftime();
    let app = format!("LD_PRELOAD= {} --store {} list", bpftime.display(), s.store);
    let run = |extra: &[&str]| {
        let mut c = s.bpftime();
        c.args(["run", examples::GPU_PROBES_BPF_O]);
        c.args(extra);
        c.args(["--", "sh", "-c", &app]);
        run_with_timeout(c, Duration::from_secs(120))
    };
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    for (line, attached) in [
        (
            "gpu-exit vectorAdd",
            "vector_add_exit (gpu-exit) -> CUDA kernel vectorAdd",
        ),
        (
            "gpu-entry vectorAdd",
            "cuda__vector_add_entry (gpu-entry) -> CUDA kernel vectorAdd",
        ),
        (
            "gpu-entry _Z9vectorAddPKfS0_Pfi",
            "mangled_entry (gpu-entry) -> CUDA kernel _Z9vectorAddPKfS0_Pfi",
        ),
        (
            "gpu-launch vectorAdd",
            "vector_add_launch (gpu-launch) -> CUDA kernel vectorAdd",
        ),
    ] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("link ") && l.contains(line)),
            "`{line}` missing: {}",
            text(&out)
        );
        assert!(
            stderr.contains(&format!("bpftime run: attached {attached}")),
            "{}",
            text(&out)
        );
    }
    assert!(stdout.contains("counts[0]: 0"), "{}", text(&out));
    // --attach names another kernel: a demangled name, a glob.
    let out = run(&[
        "--attach",
        "vector_add_exit=ns::kern",
        "--attach",
        "vector_add_launch=*gemm*",
        "--attach",
        "mangled_entry=void k<int>(int)",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for line in [
        "gpu-exit ns::kern",
        "gpu-launch *gemm*",
        "gpu-entry void k<int>(int)",
        "gpu-entry vectorAdd",
    ] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("link ") && l.contains(line)),
            "`{line}` missing: {}",
            text(&out)
        );
    }
    assert!(!stdout.contains("gpu-exit vectorAdd"), "{}", text(&out));
}

#[test]
fn bpftime_run_attaches_memory_access_probes_and_refuses_gpu_rejections() {
    let s = Session::new("gpu-run-refused");
    // Ours, on one kernel, and bpftime's memory capture, on every kernel.
    let ldst = s.compile_bpf(
        "ldst",
        "#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\n\
         SEC(\"cuda:ns::kern:ldst\") int mem(void *ctx) { return 0; }\n\
         SEC(\"kprobe/__memcapture\") int cuda__capture(void *ctx) { return 0; }\n\
         char LICENSE[] SEC(\"license\") = \"GPL\";\n",
    );
    let mut c = s.bpftime();
    c.args(["run", ldst.to_str().unwrap(), "--", "true"]);
    let out = run_with_timeout(c, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for line in [
        "attached mem (gpu-ldst) -> CUDA kernel ns::kern",
        "attached cuda__capture (gpu-ldst) -> CUDA kernel *",
    ] {
        assert!(stderr.contains(line), "`{line}` missing: {}", text(&out));
    }
    // A program the GPU rules reject does not load: libbpf prints the log, exit 1.
    let obj = s.compile_bpf("comm", &comm_program("cuda:vectorAdd", "comm_on_gpu"));
    let mut c = s.bpftime();
    c.args(["run", obj.to_str().unwrap(), "--", "true"]);
    let out = run_with_timeout(c, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("helper bpf_get_current_comm#16 is not available on the GPU"),
        "{}",
        text(&out)
    );
}

/// `:ldst.shared` probes reach the store as links of their own kind, through the shim's
/// `cuda:` handler (the section's kernel) and `bpftime run`'s own perf event (`--attach`
/// on another kernel); bpftime's `__memcapture` stays a global-only probe.
#[test]
fn bpftime_run_attaches_shared_memory_access_probes_on_both_paths() {
    let s = Session::new("gpu-run-shared");
    let obj = s.compile_bpf(
        "ldst_shared",
        "#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\n\
         SEC(\"cuda:ns::kern:ldst.shared\") int mem_shared(void *ctx) { return 0; }\n\
         SEC(\"cuda:vectorAdd:ldst.shared\") int moved_shared(void *ctx) { return 0; }\n\
         SEC(\"kprobe/__memcapture\") int cuda__capture(void *ctx) { return 0; }\n\
         char LICENSE[] SEC(\"license\") = \"GPL\";\n",
    );
    let mut c = s.bpftime();
    c.args([
        "run",
        obj.to_str().unwrap(),
        "--attach",
        "moved_shared=matmul",
        "--",
        "sleep",
        "5",
    ]);
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = c.spawn().expect("bpftime run");
    let expected = {
        let mut v = vec![
            link(
                LinkKind::Gpu(GpuProbeKind::SharedAccess),
                "ns::kern",
                "mem_shared",
            ),
            link(
                LinkKind::Gpu(GpuProbeKind::SharedAccess),
                "matmul",
                "moved_shared",
            ),
            link(LinkKind::Gpu(GpuProbeKind::Access), "*", "cuda__capture"),
        ];
        sort_links(&mut v);
        v
    };
    // Read while the app runs: the links go with `bpftime run`.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut seen = Vec::new();
    while std::time::Instant::now() < deadline {
        if Store::open(&s.store).is_ok() {
            seen = links(&s);
            if seen == expected {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let events = perf_events(&s);
    let shown = list(&s);
    let out = child.wait_with_output().expect("bpftime run's output");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(seen, expected, "{}", text(&out));
    assert_eq!(
        events,
        vec![
            (PerfEventKind::GpuAccess, "*".into()),
            (PerfEventKind::GpuSharedAccess, "matmul".into()),
            (PerfEventKind::GpuSharedAccess, "ns::kern".into()),
        ]
    );
    for line in ["gpu-ldst.shared ns::kern", "gpu-ldst.shared matmul"] {
        assert!(
            shown
                .lines()
                .any(|l| l.starts_with("link ") && l.contains(line)),
            "`{line}` missing from:\n{shown}"
        );
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    for line in [
        "attached mem_shared (gpu-ldst.shared) -> CUDA kernel ns::kern",
        "attached moved_shared (gpu-ldst.shared) -> CUDA kernel matmul",
    ] {
        assert!(stderr.contains(line), "`{line}` missing: {}", text(&out));
    }
}

/// The GPU example with bpftime's GPU helpers (a `cuda__*` kprobe) runs too.
#[test]
fn bpftime_run_attaches_the_gpu_helper_example() {
    let s = Session::new("gpu-run-helpers");
    let mut c = s.bpftime();
    c.args(["run", examples::GPU_BLOCK_COUNT_BPF_O, "--", "true"]);
    let out = run_with_timeout(c, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(
            "bpftime run: attached cuda__block_starts (gpu-entry) -> CUDA kernel vectorAdd"
        ),
        "{}",
        text(&out)
    );
}

/// `bpftime verify OBJECT` exits 0 and says `PROG: ok (` for each of `progs`.
fn assert_verifies(s: &Session, object: &str, progs: &[&str]) {
    let mut c = s.bpftime();
    c.args(["verify", object]);
    let out = run_with_timeout(c, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for prog in progs {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("{prog}: ok ("))),
            "{}",
            text(&out)
        );
    }
}

/// The shared-memory example checks under the GPU rules with its access context.
#[test]
fn bpftime_verify_accepts_the_shared_memory_access_example() {
    let s = Session::new("gpu-verify-shared");
    assert_verifies(
        &s,
        examples::ACCESS_SHARED_BPF_O,
        &["vector_add_access", "matmul_access"],
    );
}

/// A GPU probe on per-CPU hash maps (a value per SM on the device) verifies under the
/// GPU rules, beside the launch program that writes them on the CPU.
#[test]
fn bpftime_verify_accepts_per_cpu_hash_maps_on_the_gpu() {
    let s = Session::new("gpu-verify-pcpu");
    assert_verifies(
        &s,
        examples::PERCPU_HASHCOUNT_BPF_O,
        &["count_thread", "after_call"],
    );
}

/// A GPU probe on LRU hash maps verifies under the GPU rules.
#[test]
fn bpftime_verify_accepts_lru_hash_maps_on_the_gpu() {
    let s = Session::new("gpu-verify-lru");
    assert_verifies(&s, examples::LRU_HASHCOUNT_BPF_O, &["count_thread"]);
    assert_verifies(
        &s,
        examples::HASHSTARTS_BPF_O,
        &["start_thread", "end_thread"],
    );
}

/// `bpftime verify` loads through the same handler: `cuda:` entry and exit
/// programs are checked under the GPU rules, launch programs under the CPU's.
#[test]
fn bpftime_verify_checks_cuda_sections_under_the_gpu_rules() {
    let s = Session::new("gpu-verify");
    assert_verifies(
        &s,
        examples::GPU_PROBES_BPF_O,
        &[
            "vector_add_exit",
            "cuda__vector_add_entry",
            "mangled_entry",
            "vector_add_launch",
        ],
    );
    let exit = s.compile_bpf("exit", &comm_program("cuda:vectorAdd:exit", "comm_at_exit"));
    let launch = s.compile_bpf(
        "launch",
        &comm_program("cuda:vectorAdd:launch", "comm_at_launch"),
    );
    let mut c = s.bpftime();
    c.args(["verify", exit.to_str().unwrap()]);
    let out = run_with_timeout(c, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("helper bpf_get_current_comm#16 is not available on the GPU"),
        "{}",
        text(&out)
    );
    let mut c = s.bpftime();
    c.args(["verify", launch.to_str().unwrap()]);
    let out = run_with_timeout(c, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}
