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
    bpftime_gpu_attach::toolchain::find("nvcc", "NVCC").unwrap_or_else(|| {
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
    if bpftime_gpu_attach::runner::check_libcuda().is_ok() {
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
