//! Example eBPF programs and their loaders, built for the real kernel and
//! for bpftime alike.
//!
//! `build.rs` compiles everything in this crate's directory with `make`
//! (see the README); this library says where the results are:
//!
//! ```no_run
//! let loader = bpftime_bpf_examples::artifact("malloc_count");
//! let object = bpftime_bpf_examples::MALLOC_COUNT_BPF_O;
//! # let _ = (loader, object);
//! ```

use std::path::{Path, PathBuf};

pub mod loader;

/// Directory holding every artifact (`$OUT_DIR/bpf-examples`).
pub const BUILD_DIR: &str = env!("BPF_EXAMPLES_BUILD_DIR");

/// `malloc_count` loader (C, shared libbpf).
pub const MALLOC_COUNT: &str = env!("BPF_EXAMPLES_MALLOC_COUNT");
/// BPF object loaded by `malloc_count` and `malloc_count_rs`.
pub const MALLOC_COUNT_BPF_O: &str = env!("BPF_EXAMPLES_MALLOC_COUNT_BPF_O");
/// `funclatency` loader (C, shared libbpf).
pub const FUNCLATENCY: &str = env!("BPF_EXAMPLES_FUNCLATENCY");
/// BPF object loaded by `funclatency`.
pub const FUNCLATENCY_BPF_O: &str = env!("BPF_EXAMPLES_FUNCLATENCY_BPF_O");
/// `ringbuf_events` loader (C, shared libbpf).
pub const RINGBUF_EVENTS: &str = env!("BPF_EXAMPLES_RINGBUF_EVENTS");
/// BPF object loaded by `ringbuf_events`.
pub const RINGBUF_EVENTS_BPF_O: &str = env!("BPF_EXAMPLES_RINGBUF_EVENTS_BPF_O");
/// Test target `calls N`, position-independent executable.
/// ringbuf_events' program submitting one call in 1000 into a 64 KiB ring (the
/// loader takes it with `--obj`).
pub const RINGBUF_SPARSE_BPF_O: &str = env!("BPF_EXAMPLES_RINGBUF_SPARSE_BPF_O");
pub const CALLS: &str = env!("BPF_EXAMPLES_CALLS");
/// Test target `lookups N`: N rounds of getaddrinfo and gethostbyname of localhost.
pub const LOOKUPS: &str = env!("BPF_EXAMPLES_LOOKUPS");
/// Test target `tls_pair N`: prints `pid=PID`, waits for a line on stdin, then a TLS 1.2
/// handshake and N request/reply rounds between two threads over OpenSSL.
pub const TLS_PAIR: &str = env!("BPF_EXAMPLES_TLS_PAIR");
/// Test target `calls N`, built with `-no-pie`.
pub const CALLS_NOPIE: &str = env!("BPF_EXAMPLES_CALLS_NOPIE");
/// `bench_calls N`: prints the median cost of one call of `work()` (benchmarks);
/// `bench_calls --windows MS` prints it for every window of MS ms until end of input.
pub const BENCH_CALLS: &str = env!("BPF_EXAMPLES_BENCH_CALLS");

/// A program every verifier must reject: it dereferences a map lookup's
/// result without checking it for NULL (`rejected/rejected.bpf.c`).
pub const REJECTED_BPF_O: &str = env!("BPF_EXAMPLES_REJECTED_BPF_O");

/// `globals` loader (C, shared libbpf, `bpftool gen skeleton` skeleton): counts
/// calls in `.bss`, filtered by `.rodata`, weighted by `.data`; driven on stdin.
pub const GLOBALS: &str = env!("BPF_EXAMPLES_GLOBALS");
/// BPF object of `globals` (also embedded in its skeleton).
pub const GLOBALS_BPF_O: &str = env!("BPF_EXAMPLES_GLOBALS_BPF_O");
/// `stacks` loader (C, shared libbpf): user stacks at a uprobe and a uretprobe.
pub const STACKS: &str = env!("BPF_EXAMPLES_STACKS");
/// BPF object loaded by `stacks`.
pub const STACKS_BPF_O: &str = env!("BPF_EXAMPLES_STACKS_BPF_O");
/// `pinning` loader (C, shared libbpf): pins, reopens and unpins maps and links on
/// command from stdin (`pinning/pinning.c` lists the commands).
pub const PINNING: &str = env!("BPF_EXAMPLES_PINNING");
/// BPF object of `pinning`: a uprobe counting into a `LIBBPF_PIN_BY_NAME` map; not in
/// [`ARTIFACTS`], whose objects tests load into the kernel as they are (this one would
/// leave a pin in the kernel's /sys/fs/bpf).
pub const PINNING_BPF_O: &str = env!("BPF_EXAMPLES_PINNING_BPF_O");
/// `printk` loader (C, shared libbpf): bpf_printk at a uprobe.
pub const PRINTK: &str = env!("BPF_EXAMPLES_PRINTK");
/// BPF object loaded by `printk`.
pub const PRINTK_BPF_O: &str = env!("BPF_EXAMPLES_PRINTK_BPF_O");
/// Test target `ticker`: calls `work()` in batches read from stdin.
pub const TICKER: &str = env!("BPF_EXAMPLES_TICKER");
/// Test target `usdt_target N` (or `-`, driven through stdin): two USDT probes
/// (`bpftime_test:tick`, and `bpftime_test:guarded` behind its semaphore) and
/// `loop_sum`, whose one-byte `nop` at +2 sits right before its loop head at +3.
pub const USDT_TARGET: &str = env!("BPF_EXAMPLES_USDT_TARGET");
/// `usdt_count` loader (C, shared libbpf): `bpf_program__attach_usdt` on
/// usdt_target's probes and uprobes at `loop_sum+2` and `+3`, counted.
pub const USDT_COUNT: &str = env!("BPF_EXAMPLES_USDT_COUNT");
/// BPF object loaded by `usdt_count`.
pub const USDT_COUNT_BPF_O: &str = env!("BPF_EXAMPLES_USDT_COUNT_BPF_O");
/// `syscall_tp` loader (C, shared libbpf): system call tracepoints of the processes
/// named `-c COMM` (openat's arguments and results, counts by number).
pub const SYSCALL_TP: &str = env!("BPF_EXAMPLES_SYSCALL_TP");
/// BPF object loaded by `syscall_tp`.
pub const SYSCALL_TP_BPF_O: &str = env!("BPF_EXAMPLES_SYSCALL_TP_BPF_O");
/// Test target `syscalls ROUNDS THREADS FILE...`: opens each file in three ways (C
/// library, `syscall()`, its own instruction) on each thread, then once in a child.
pub const SYSCALLS: &str = env!("BPF_EXAMPLES_SYSCALLS");
/// The same, linked statically.
pub const SYSCALLS_STATIC: &str = env!("BPF_EXAMPLES_SYSCALLS_STATIC");
/// Test target `signals N`: SIGUSR1 to itself N times by kill() and N times by tgkill(),
/// then a kill() of a pid that cannot exist.
pub const SIGNALS: &str = env!("BPF_EXAMPLES_SIGNALS");
/// Test target `forks N`: N times each, a child by the C library's fork(), by a fork
/// system call of its own, by vfork() and by posix_spawn(), and a thread.
pub const FORKS: &str = env!("BPF_EXAMPLES_FORKS");
/// Test target `stack_target N`: fixed call chains (no PIE, frame pointers).
pub const STACK_TARGET: &str = env!("BPF_EXAMPLES_STACK_TARGET");

/// `gpu_probes` loader (C, shared libbpf): attaches every program of an object
/// where its section says (`--obj FILE`), prints `ready`, waits for SIGINT.
pub const GPU_PROBES: &str = env!("BPF_EXAMPLES_GPU_PROBES");
/// GPU probes in every spelling (`cuda:` sections, a `cuda__*` kprobe); not in
/// [`ARTIFACTS`]: the kernel's libbpf does not take `cuda:` sections.
pub const GPU_PROBES_BPF_O: &str = env!("BPF_EXAMPLES_GPU_PROBES_BPF_O");
/// `gpu_maps` loader (C, shared libbpf): loads [`GPU_MAPS_BPF_O`] (`--obj FILE`), prints
/// each map's id and `ready`, reads its GPU ring buffer through bpftime's poll function
/// (libbpf's ring buffer with `GPU_MAPS_READER=ringbuf`) until SIGINT, then prints what
/// each map holds (`gpu_maps/gpu_maps.c` says how).
pub const GPU_MAPS: &str = env!("BPF_EXAMPLES_GPU_MAPS");
/// bpftime's GPU map types (per-thread array, GPU array, GPU hash, GPU ring buffer) on
/// vectorAdd; not in [`ARTIFACTS`]: the kernel knows none of those types.
pub const GPU_MAPS_BPF_O: &str = env!("BPF_EXAMPLES_GPU_MAPS_BPF_O");
/// `launchlate` with the maps its CPU uprobe and GPU probe share as bpftime's GPU arrays.
pub const LAUNCHLATE_GPU_BPF_O: &str = env!("BPF_EXAMPLES_LAUNCHLATE_GPU_BPF_O");
/// A GPU probe with bpftime's GPU helpers; not in [`ARTIFACTS`] either.
pub const GPU_BLOCK_COUNT_BPF_O: &str = env!("BPF_EXAMPLES_GPU_BLOCK_COUNT_BPF_O");
/// `threadhist`: exits of the CUDA kernel vectorAdd by threadIdx.x (`cuda:` exit probe).
pub const THREADHIST_BPF_O: &str = env!("BPF_EXAMPLES_THREADHIST_BPF_O");
/// `launchsnoop`: a launch program (`cuda:*:launch`, CPU code) on every CUDA kernel.
pub const LAUNCHSNOOP_BPF_O: &str = env!("BPF_EXAMPLES_LAUNCHSNOOP_BPF_O");
/// `percpu_hashcount`: per-CPU hash maps on the GPU, written by the CPU between
/// launches (a `cuda:` entry probe and a launch program).
pub const PERCPU_HASHCOUNT_BPF_O: &str = env!("BPF_EXAMPLES_PERCPU_HASHCOUNT_BPF_O");
/// `lru_hashcount`: LRU hash maps on the GPU, one that never fills and two (plain and
/// per-CPU) that evict on nearly every update (a `cuda:` entry probe).
pub const LRU_HASHCOUNT_BPF_O: &str = env!("BPF_EXAMPLES_LRU_HASHCOUNT_BPF_O");
/// `hashstarts`: per-thread start times in a hash map, inserted at a kernel's entry and
/// deleted at its exit, over many launches.
pub const HASHSTARTS_BPF_O: &str = env!("BPF_EXAMPLES_HASHSTARTS_BPF_O");
/// `access_shared`: global and shared-memory accesses of vectorAdd and the tiled matmul
/// by kind and space (`cuda:KERNEL:ldst.shared`).
pub const ACCESS_SHARED_BPF_O: &str = env!("BPF_EXAMPLES_ACCESS_SHARED_BPF_O");
/// `memtrace`: a memory-access probe on every kernel (`cuda:*:ldst`): counts per kernel
/// and kind, log2 histograms of offsets into each buffer, a sampled timeline.
pub const MEMTRACE_BPF_O: &str = env!("BPF_EXAMPLES_MEMTRACE_BPF_O");
/// `kernelretsnoop`: a record per thread of `vectorAdd` at its exit, into a ring buffer.
pub const KERNELRETSNOOP_BPF_O: &str = env!("BPF_EXAMPLES_KERNELRETSNOOP_BPF_O");
/// The same records through a perf event array (`bpf_perf_event_output`).
pub const KERNELRETSNOOP_PERF_BPF_O: &str = env!("BPF_EXAMPLES_KERNELRETSNOOP_PERF_BPF_O");
/// `gpu_timeline`: uprobes and a uretprobe on two_paths' CPU functions and probes inside
/// its `scale` kernel (a printk among them), for `bpftime run --trace`.
pub const GPU_TIMELINE_BPF_O: &str = env!("BPF_EXAMPLES_GPU_TIMELINE_BPF_O");
/// `gpu_streams`: a line from every block of two_streams' `spin` kernel naming its launch
/// (`tag=K` for the K-th), for `bpftime run --trace` with two kernels at once.
pub const GPU_STREAMS_BPF_O: &str = env!("BPF_EXAMPLES_GPU_STREAMS_BPF_O");
/// The header of launch programs' context, `struct bpftime_cuda_launch`.
pub const CUDA_LAUNCH_H: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/common/cuda_launch.h");
/// Directory of the CUDA programs the GPU examples trace (sources; built with nvcc).
pub const CUDA_SOURCES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/cuda");

/// Size that `calls` passes to each of its N `malloc` calls.
pub const CALLS_MALLOC_SIZE: u64 = 7919;

/// Names of all artifacts, as accepted by [`artifact`].
pub const ARTIFACTS: &[&str] = &[
    "malloc_count",
    "malloc_count.bpf.o",
    "funclatency",
    "funclatency.bpf.o",
    "ringbuf_events",
    "ringbuf_events.bpf.o",
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
    "rejected.bpf.o",
    "gpu_probes",
    "gpu_maps",
];

/// Path of a built artifact, by its file name (one of [`ARTIFACTS`]).
///
/// # Panics
///
/// If `name` is not one of [`ARTIFACTS`].
pub fn artifact(name: &str) -> PathBuf {
    assert!(
        ARTIFACTS.contains(&name),
        "unknown bpf-examples artifact {name:?}; known: {ARTIFACTS:?}"
    );
    Path::new(BUILD_DIR).join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_artifact_exists() {
        for name in ARTIFACTS {
            assert!(artifact(name).is_file(), "{name} missing");
        }
        for path in [GPU_PROBES_BPF_O, GPU_BLOCK_COUNT_BPF_O] {
            assert!(Path::new(path).is_file(), "{path} missing");
        }
        assert_eq!(artifact("calls"), Path::new(CALLS));
        assert_eq!(
            artifact("malloc_count.bpf.o"),
            Path::new(MALLOC_COUNT_BPF_O)
        );
    }
}
