//! A CUDA application traced on a machine without a GPU or its driver: it runs as it
//! would without bpftime (same output, same exit status), the CUDA driver is never
//! loaded on our account, and one line says why the GPU probes never ran. The program
//! is nvcc's own output (static cudart, built here with the pinned PyPI nvcc that
//! scripts/setup.sh installs); on a machine with a GPU this test has nothing to show and
//! says so (scripts/gpu.sh covers that machine).

use bpftime_tests::{examples, run_with_timeout, Session};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn nvcc() -> PathBuf {
    bpftime_gpu_ptx::toolchain::find("nvcc", "NVCC").unwrap_or_else(|| {
        panic!("nvcc not found (tried $NVCC, PATH, /usr/local/cuda/bin and pip's nvidia-cuda-nvcc); run scripts/setup.sh")
    })
}

/// vec_add, built statically against cudart.
fn vec_add(dir: &Path) -> PathBuf {
    let nvcc = nvcc();
    let out = dir.join("vec_add");
    let mut c = Command::new(&nvcc);
    c.arg("-O2").arg("-o").arg(&out);
    // pip's wheel keeps cudart_static next to its bin folder.
    if let Some(lib) = nvcc.parent().and_then(Path::parent).map(|p| p.join("lib")) {
        if lib.join("libcudart_static.a").is_file() {
            c.arg(format!("-L{}", lib.display()));
        }
    }
    c.arg(Path::new(examples::CUDA_SOURCES).join("vec_add.cu"));
    let o = c.output().expect("run nvcc");
    assert!(
        o.status.success(),
        "nvcc failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

#[test]
fn a_cuda_app_without_a_gpu_runs_as_without_bpftime_with_one_notice() {
    if bpftime_conformance::gpu::check_libcuda().is_ok() {
        eprintln!("skipped: this machine has the CUDA driver; the no-GPU path needs one without (scripts/gpu.sh tests the GPU path)");
        return;
    }
    let s = Session::new("nogpu");
    let app = vec_add(&s.tmp);
    let plain = run_with_timeout(
        {
            let mut c = Command::new(&app);
            c.args(["4096", "1"]);
            c
        },
        Duration::from_secs(60),
    );
    let mut c = s.bpftime();
    c.arg("run")
        .arg(examples::THREADHIST_BPF_O)
        .arg("--")
        .arg(&app)
        .args(["4096", "1"]);
    let traced = run_with_timeout(c, Duration::from_secs(60));
    let plain_err = String::from_utf8_lossy(&plain.stderr);
    let traced_err = String::from_utf8_lossy(&traced.stderr);
    // The application's own failure, unchanged: no device, so its first CUDA call fails.
    assert!(
        !plain.status.success(),
        "vec_add ran without a GPU? {plain_err}"
    );
    assert_eq!(
        traced.status.code(),
        plain.status.code(),
        "plain: {plain_err}\ntraced: {traced_err}"
    );
    let app_line = plain_err
        .lines()
        .next()
        .expect("vec_add says why it failed");
    assert!(traced_err.contains(app_line), "{traced_err}");
    let notices: Vec<&str> = traced_err
        .lines()
        .filter(|l| l.starts_with("bpftime: GPU probes never ran"))
        .collect();
    assert_eq!(notices.len(), 1, "{traced_err}");
    assert!(
        notices[0].contains("thread_exit on vectorAdd") && notices[0].contains("libcuda.so.1"),
        "{}",
        notices[0]
    );
}

/// A launch program reads `struct bpftime_cuda_launch` from cuda_launch.h; the agent hands
/// it a `LaunchContext`. The C compiler's layout of the header and Rust's must agree field
/// by field, or a tool reads the grid where the stream is.
#[test]
fn the_launch_context_header_matches_what_the_agent_passes() {
    use bpftime_gpu_attach::LaunchContext;
    use std::mem::{offset_of, size_of};
    let s = Session::new("launchctx");
    let src = s.tmp.join("layout.c");
    let fields = [
        "launch_id",
        "function",
        "stream",
        "grid",
        "block",
        "shared_mem_bytes",
        "device",
        "cpu_ns",
        "gpu_start_ns",
        "gpu_end_ns",
        "clock_error_ns",
        "phase",
        "result",
        "name_len",
        "name",
    ];
    let mut c = format!(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"{}\"\nint main(void) {{\n\
         printf(\"size %zu\\n\", sizeof(struct bpftime_cuda_launch));\n",
        examples::CUDA_LAUNCH_H
    );
    for f in fields {
        c.push_str(&format!(
            "printf(\"{f} %zu\\n\", offsetof(struct bpftime_cuda_launch, {f}));\n"
        ));
    }
    c.push_str("printf(\"phases %d %d\\n\", BPFTIME_LAUNCH_CALLED, BPFTIME_LAUNCH_COMPLETED);\nreturn 0;\n}\n");
    std::fs::write(&src, c).unwrap();
    let exe = s.tmp.join("layout");
    let o = Command::new("gcc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run gcc");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = Command::new(&exe).output().expect("run the layout program");
    let c_layout = String::from_utf8_lossy(&out.stdout).into_owned();
    let rust_offsets = [
        offset_of!(LaunchContext, launch_id),
        offset_of!(LaunchContext, function),
        offset_of!(LaunchContext, stream),
        offset_of!(LaunchContext, grid),
        offset_of!(LaunchContext, block),
        offset_of!(LaunchContext, shared_mem_bytes),
        offset_of!(LaunchContext, device),
        offset_of!(LaunchContext, cpu_ns),
        offset_of!(LaunchContext, gpu_start_ns),
        offset_of!(LaunchContext, gpu_end_ns),
        offset_of!(LaunchContext, clock_error_ns),
        offset_of!(LaunchContext, phase),
        offset_of!(LaunchContext, result),
        offset_of!(LaunchContext, name_len),
        offset_of!(LaunchContext, name),
    ];
    let mut rust_layout = format!("size {}\n", size_of::<LaunchContext>());
    for (f, off) in fields.iter().zip(rust_offsets) {
        rust_layout.push_str(&format!("{f} {off}\n"));
    }
    rust_layout.push_str(&format!(
        "phases {} {}\n",
        bpftime_gpu_attach::PHASE_LAUNCHED,
        bpftime_gpu_attach::PHASE_COMPLETED
    ));
    assert_eq!(c_layout, rust_layout);
}

/// A launch program is CPU code: `bpftime verify` checks it against the launch context
/// (168 bytes, a kprobe's), not under the GPU rules.
#[test]
fn a_launch_program_verifies_as_cpu_code() {
    let s = Session::new("launchverify");
    let mut c = s.bpftime();
    c.arg("verify").arg(examples::LAUNCHSNOOP_BPF_O);
    let o = run_with_timeout(c, Duration::from_secs(60));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("launch: ok"), "{out}");
}

/// `--gpu-flamegraph` on a CUDA application without a GPU: the application runs as it
/// would without bpftime, no graph is written, and one line says why.
#[test]
fn a_gpu_flame_graph_without_a_gpu_says_why_there_is_none() {
    if bpftime_conformance::gpu::check_libcuda().is_ok() {
        eprintln!("skipped: this machine has the CUDA driver; the no-GPU path needs one without (scripts/gpu.sh tests the GPU path)");
        return;
    }
    let s = Session::new("nogpuflame");
    let app = vec_add(&s.tmp);
    let plain = run_with_timeout(
        {
            let mut c = Command::new(&app);
            c.args(["4096", "1"]);
            c
        },
        Duration::from_secs(60),
    );
    let graph = s.tmp.join("graph");
    let mut c = s.bpftime();
    c.arg("start")
        .arg("--gpu-flamegraph")
        .arg(&graph)
        .arg(&app)
        .args(["4096", "1"]);
    let traced = run_with_timeout(c, Duration::from_secs(60));
    let traced_err = String::from_utf8_lossy(&traced.stderr);
    assert_eq!(traced.status.code(), plain.status.code(), "{traced_err}");
    assert_eq!(
        traced_err
            .matches("no GPU flame graph: this process did not load the CUDA driver")
            .count(),
        1,
        "{traced_err}"
    );
    // One line for the graph, not a second one for the recorder behind it.
    assert!(!traced_err.contains("GPU probes never ran"), "{traced_err}");
    assert!(!graph.with_extension("svg").exists());
    assert!(!graph.with_extension("folded").exists());
}

/// A graph asked for in a directory that does not exist is a usage error before the
/// target runs: the target would otherwise run to its end for nothing.
#[test]
fn a_gpu_flame_graph_into_a_missing_directory_is_refused_up_front() {
    let s = Session::new("flamedir");
    let marker = s.tmp.join("ran");
    let mut c = s.bpftime();
    c.arg("start")
        .arg("--gpu-flamegraph")
        .arg(s.tmp.join("no/such/dir/graph"))
        .arg("touch")
        .arg(&marker);
    let out = run_with_timeout(c, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--gpu-flamegraph: the directory") && err.contains("does not exist"),
        "{err}"
    );
    assert!(!marker.exists(), "the target ran");
}
