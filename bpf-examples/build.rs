//! Builds the C examples with `make` and tells the crate where they are.
//!
//! Runs `make -C <crate dir> OUT=$OUT_DIR/bpf-examples` and exports
//! `BPF_EXAMPLES_BUILD_DIR` (the directory) plus one
//! `BPF_EXAMPLES_<ARTIFACT>` variable per artifact (for example
//! `BPF_EXAMPLES_MALLOC_COUNT_BPF_O`) to the crate's code via `env!`.

use std::env;
use std::path::{Path, PathBuf};
use std::process::{exit, Command};

/// Everything the Makefile builds; keep in sync with `src/lib.rs`.
const ARTIFACTS: &[&str] = &[
    "malloc_count",
    "malloc_count.bpf.o",
    "funclatency",
    "funclatency.bpf.o",
    "ringbuf_events",
    "ringbuf_events.bpf.o",
    "ringbuf_sparse.bpf.o",
    "calls",
    "calls-nopie",
    "bench_calls",
    "globals",
    "globals.bpf.o",
    "stacks",
    "stacks.bpf.o",
    "printk",
    "printk.bpf.o",
    "ticker",
    "stack_target",
    "lookups",
    "usdt_target",
    "tls_pair",
    "usdt_count",
    "usdt_count.bpf.o",
    "rejected.bpf.o",
    "gpu_probes",
    "gpu_maps",
    "pinning",
    "pinning.bpf.o",
    "syscall_tp",
    "syscall_tp.bpf.o",
    "syscalls",
    "syscalls-static",
    "signals",
    "forks",
];

/// GPU objects, built too: only bpftime loads them (GPU helpers, or `cuda:`
/// sections that libbpf takes only with bpftime's handler), so they stay out
/// of `ARTIFACTS`, every object of which the kernel accepts.
const GPU_ARTIFACTS: &[&str] = &[
    "gpu_probes.bpf.o",
    "gpu_block_count.bpf.o",
    "cuda_counter.bpf.o",
    "threadhist.bpf.o",
    "kernelretsnoop.bpf.o",
    "kernelretsnoop_perf.bpf.o",
    "launchlate.bpf.o",
    "launchlate_gpu.bpf.o",
    "gpu_maps.bpf.o",
    "hashcount.bpf.o",
    "lru_hashcount.bpf.o",
    "hashstarts.bpf.o",
    "launchsnoop.bpf.o",
    "gpu_printk.bpf.o",
    "gpu_timeline.bpf.o",
    "gpu_streams.bpf.o",
    "tensor_copies.bpf.o",
    "smcount.bpf.o",
    "percpu_hashcount.bpf.o",
    "access_shared.bpf.o",
    "memtrace.bpf.o",
    "bench_empty.bpf.o",
    "bench_count.bpf.o",
    "bench_exit_time.bpf.o",
];

/// Inputs whose change must rebuild the examples.
const SOURCES: &[&str] = &[
    "Makefile",
    "common",
    "malloc_count",
    "funclatency",
    "ringbuf_events",
    "targets",
    "usdt_count",
    "globals",
    "stacks",
    "printk",
    "pinning",
    "syscall_tp",
    "syscall_costs",
    "rejected",
    "gpu_probes",
    "gpu_maps",
    "gpu_block_count",
    "cuda_counter",
    "threadhist",
    "kernelretsnoop",
    "launchlate",
    "hashcount",
    "lru_hashcount",
    "hashstarts",
    "launchsnoop",
    "gpu_printk",
    "gpu_timeline",
    "gpu_streams",
    "tensor_copies",
    "smcount",
    "percpu_hashcount",
    "memtrace",
    "access_check",
    "access_shared",
    "gpu_bench",
];

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    exit(1);
}

/// Check the tools up front, so a missing package is named plainly
/// instead of surfacing as a compiler error deep in make's output.
fn check_tools(clang: &str) {
    let clang_ok = Command::new(clang)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !clang_ok {
        fail(&format!(
            "`{clang}` is needed to compile the eBPF programs; \
             install it with `apt-get install clang-19` (or set CLANG)"
        ));
    }
    let has_libbpf = [
        "/usr/include/bpf/libbpf.h",
        "/usr/local/include/bpf/libbpf.h",
    ]
    .iter()
    .any(|p| Path::new(p).exists());
    if !has_libbpf {
        fail(
            "libbpf headers not found (bpf/libbpf.h); install them with \
             `apt-get install libbpf-dev libelf-dev zlib1g-dev`",
        );
    }
    if Command::new("make").arg("--version").output().is_err() {
        fail("`make` not found; install it with `apt-get install make`");
    }
}

fn env_name(artifact: &str) -> String {
    let upper: String = artifact
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("BPF_EXAMPLES_{upper}")
}

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").unwrap()).join("bpf-examples");
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang-19".to_string());

    println!("cargo:rerun-if-env-changed=CLANG");
    for source in SOURCES {
        println!("cargo:rerun-if-changed={source}");
    }

    check_tools(&clang);

    let status = Command::new("make")
        .arg("-C")
        .arg(&manifest_dir)
        .arg(format!("OUT={}", out_dir.display()))
        .arg(format!("CLANG={clang}"))
        .status()
        .unwrap_or_else(|e| fail(&format!("cannot run make: {e}")));
    if !status.success() {
        fail(&format!(
            "`make -C {} OUT={}` failed ({status}); see the output above",
            manifest_dir.display(),
            out_dir.display()
        ));
    }

    println!(
        "cargo:rustc-env=BPF_EXAMPLES_BUILD_DIR={}",
        out_dir.display()
    );
    for artifact in ARTIFACTS.iter().chain(GPU_ARTIFACTS) {
        let path = out_dir.join(artifact);
        if !path.exists() {
            fail(&format!("make did not produce {}", path.display()));
        }
        println!("cargo:rustc-env={}={}", env_name(artifact), path.display());
    }
}
