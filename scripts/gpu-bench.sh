#!/usr/bin/env bash
# GPU overhead benchmark, on the GPU machine: the median ms per launch (CUDA events in
# the application) of vectorAdd over 2^26 floats and a tiled 4096^2 matmul, native
# (sm_90 machine code), under bpftime with GPU attach on but no probe, and with each
# probe of bpf-examples/gpu_bench (memory-access probes counting on the GPU and sending
# every access to the host), with memtrace, and with the GPU flame graph on; the native kernel
# built as PTX only (the driver JITs it at load, as ours is re-JITted once instrumented)
# is a second baseline. The timeline (`--trace`) row is launch events plus the driver calls
# recorded, the trace written at exit. Ratios are against native in the same run.
#
#   scripts/gpu-bench.sh BPFTIME CUDA_BUILD_DIR OBJECT_DIR OUT_FILE
set -uo pipefail
bt=$1 cuda=$2 objs=$3 out=$4
store="gpu-bench-$$"
source "$(dirname "$0")/bench-lib.sh"
runs=5
flames=$(mktemp -d)
{
    echo "GPU overhead, $(date -u +%Y-%m-%d), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
    # GPU_BENCH_ONLY=vec_add or =matmul runs one half (each fits a 10-minute call).
    for target in "vec_add_sm90 67108864 50" "matmul_sm90 4096 5"; do
        case "${GPU_BENCH_ONLY:-}" in "" | "${target%%_sm90*}") ;; *) continue ;; esac
        set -- $target
        app=$1; shift
        kernel=vectorAdd; [ "$app" = matmul_sm90 ] && kernel=matmul
        echo "== $app $*"
        base=""
        bench "native" "$cuda/$app" "$@"
        bench "native, PTX only (driver JIT)" "$cuda/${app%_sm90}_ptx90" "$@"
        bench "intercepted, no probe" "$bt" --store "$store" start "$cuda/$app" "$@"
        for p in empty count exit_time; do
            progs=("$p")
            [ "$p" = exit_time ] && progs=(exit_time_entry exit_time)
            attach=()
            for q in "${progs[@]}"; do attach+=(--attach "$q=$kernel"); done
            bench "probe $p" "$bt" --store "$store" run "${attach[@]}" "$objs/bench_$p.bpf.o" -- "$cuda/$app" "$@"
        done
        bench "memory-access probe ldst_count" timeout 120 "$bt" --store "$store" run --attach "ldst_count=$kernel" "$objs/bench_ldst_count.bpf.o" -- "$cuda/$app" "$@"
        bench "memtrace (aggregated, sampled timeline)" timeout 120 "$bt" --store "$store" run --out "$flames/out" "$objs/memtrace.bpf.o" -- "$cuda/$app" "$@"
        bench "launch events (launchsnoop)" "$bt" --store "$store" run "$objs/launchsnoop.bpf.o" -- "$cuda/$app" "$@"
        bench "GPU flame graph" "$bt" --store "$store" start --gpu-flamegraph "$flames/$app" "$cuda/$app" "$@"
        bench "timeline (--trace: launch events, driver calls)" "$bt" --store "$store" start --trace "$flames/$app.json" "$cuda/$app" "$@"
    done
    # An event per access through one ring buffer: every access of every thread contends
    # for the ring's head, so this runs at smaller sizes, once each, against native at
    # the same size.
    runs=1
    for target in "vec_add_sm90 4194304 3" "matmul_sm90 512 3"; do
        case "${GPU_BENCH_ONLY:-}" in "" | "${target%%_sm90*}") ;; *) continue ;; esac
        set -- $target
        app=$1; shift
        kernel=vectorAdd; [ "$app" = matmul_sm90 ] && kernel=matmul
        echo "== per-access ring events, $app $*"
        base=""
        bench "native" "$cuda/$app" "$@"
        bench "memory-access probe ldst_ring" timeout 200 "$bt" --store "$store" run --out "$flames/out" --attach "ldst_ring=$kernel" "$objs/bench_ldst_ring.bpf.o" -- "$cuda/$app" "$@"
        grep -h '^accesses (ringbuf)' "$flames/out/maps.txt" 2>/dev/null
    done
} | tee "$out"
rm -rf "/dev/shm/bpftime-$store" "$flames"
