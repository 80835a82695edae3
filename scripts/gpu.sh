#!/usr/bin/env bash
# The GPU tests: the bpf_conformance suite, the GPU helper checks, the GPU examples
# (eBPF inside the kernels of real CUDA programs) and the GPU overhead benchmark, on an
# NVIDIA GPU.
#
#   scripts/gpu.sh              here (no GPU needed): build the release binaries the GPU
#                               machine runs, stripped and xz-compressed (LLVM is linked in
#                               statically), into device-carry/gpu/ with a copy of the
#                               bpf_conformance tests; that folder is what travels
#   scripts/gpu.sh --on-device  on the GPU machine, from the repository root: unpack them,
#                               run everything, print a summary and write it to
#                               $OUT/gpu-conformance.txt ($OUT defaults to results/)
#   scripts/gpu.sh --on-device conformance|examples|bench|stress|ldst-shared|uprobe
#                               only that part (conformance: the suite, the plugin and the
#                               uprobe bench; ldst-shared: the shared-memory access probes'
#                               check alone, scripts/gpu-ldst-shared.sh, which examples
#                               runs too; uprobe: the uprobe bench alone), to fit the
#                               device tool's 10-minute calls
#   GPU_EXEC='CMD' scripts/gpu.sh --on-device exec: CMD with $BT, $OBJS and $CUDA set
#                               (bpftime, the objects, the CUDA programs), for a look at
#                               one case
#
# The examples (scripts/gpu-examples.sh), the overhead benchmark (scripts/gpu-bench.sh)
# and the concurrency stress runs (scripts/gpu-stress.sh, GPU_STRESS_RUNS times, 10 by
# default) build their CUDA programs there with its nvcc; their results go to
# $OUT/gpu-examples.txt, $OUT/gpu-bench.txt and $OUT/gpu-stress.txt.
#
# The GPU machine is also a quiet 16-core host for the CPU uprobe bench: `bpftime run`
# with an empty program, counting programs (global atomics, and bpftrace's per-CPU
# count()), and with uprobe + uretprobe (funclatency), on bench_calls,
# against the plain call (median ns per call of 5 runs each; no kernel comparison there,
# as the machine has no bpftrace). Its lines go to $OUT/uprobe-bench.txt.
#
# The GPU machine needs the NVIDIA driver (libcuda.so.1) and nothing else: no Rust, no
# LLVM, no CUDA toolkit. Exit status: 0 when everything passed, 1 on a failure, 2 when
# something is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

carry=device-carry/gpu
bins=(bpftime-gpu-conformance bpf-conformance-plugin)
# bpftime and the libraries it finds beside itself, for the uprobe bench.
# bpftime-trace-check reads --trace output there, where there is no Node for the tests'
# consumer.
cpu_bins=(bpftime libbpftime_syscall_shim.so libbpftime_agent.so libbpftime_agent_starter.so bpftime-trace-check)
cpu_inputs=(bench_calls globals.bpf.o funclatency.bpf.o uprobe_empty.bpf.o uprobe_percpu.bpf.o uprobe_pair.bpf.o)
# The GPU examples' and benchmark's objects.
gpu_inputs=(cuda_counter.bpf.o threadhist.bpf.o kernelretsnoop.bpf.o kernelretsnoop_perf.bpf.o launchlate.bpf.o hashcount.bpf.o lru_hashcount.bpf.o hashstarts.bpf.o launchsnoop.bpf.o gpu_printk.bpf.o smcount.bpf.o percpu_hashcount.bpf.o bench_empty.bpf.o
    bench_count.bpf.o bench_exit_time.bpf.o bench_ldst_count.bpf.o bench_ldst_ring.bpf.o memtrace.bpf.o access_check.bpf.o access_shared.bpf.o gpu_probes.bpf.o gpu_timeline.bpf.o gpu_streams.bpf.o tensor_copies.bpf.o
    gpu_maps.bpf.o launchlate_gpu.bpf.o)
# The C loaders the examples run under `bpftime load` (Debian's shared libbpf, carried too).
gpu_loaders=(gpu_probes gpu_maps)

build() {
    local target=${CARGO_TARGET_DIR:-target}
    local suite=${BPF_CONFORMANCE_DIR:-../shared/conformance/bpf_conformance}
    if ! ls "$suite"/*.data >/dev/null 2>&1; then
        echo "gpu.sh: no .data files in $suite; set BPF_CONFORMANCE_DIR" >&2
        exit 2
    fi
    cargo build --release -p bpftime-conformance --bins
    rm -rf "$carry"
    mkdir -p "$carry/conformance"
    for b in "${bins[@]}"; do
        strip -o "$carry/$b" "$target/release/$b"
        xz -T0 -6 -f "$carry/$b"
    done
    cp "$suite"/*.data "$carry/conformance/"
    cargo build --release --workspace --bins --lib
    make -s -C bpf-examples
    mkdir -p "$carry/cpu"
    for b in "${cpu_bins[@]}"; do
        # bpftime keeps its symbol table: the shim finds the statically linked libbpf's
        # functions there to register the `cuda:` section handler.
        if [ "$b" = bpftime ]; then
            strip --strip-debug -o "$carry/cpu/$b" "$target/release/$b"
        else
            strip -o "$carry/cpu/$b" "$target/release/$b"
        fi
        xz -T0 -6 -f "$carry/cpu/$b"
    done
    make -s -C bpf-examples gpu
    for f in "${cpu_inputs[@]}" "${gpu_inputs[@]}" "${gpu_loaders[@]}"; do
        cp "bpf-examples/build/$f" "$carry/cpu/"
    done
    # The unmodified libbpf C tool of the stress run, with the Debian libbpf it links.
    cp -L "$(ldconfig -p | sed -n 's/.*libbpf.so.1 .*=> //p' | head -1)" "$carry/cpu/libbpf.so.1"
    du -sh "$carry"
    echo "gpu.sh: carry $carry to the GPU machine and run: bash scripts/gpu.sh --on-device"
}

on_device() {
    local out=${OUT:-results} part=${1:-all}
    mkdir -p "$out"
    if [ "$part" = uprobe ]; then
        uprobe_bench "$out"
        exit $?
    fi
    if [ "$part" != all ] && [ "$part" != conformance ]; then
        gpu_examples "$out" "$part"
        exit $?
    fi
    for b in "${bins[@]}"; do
        if [ ! -f "$carry/$b.xz" ]; then
            echo "gpu.sh: $carry/$b.xz is missing; run scripts/gpu.sh here first and carry $carry" >&2
            exit 2
        fi
    done
    local bin
    bin=$(mktemp -d)
    for b in "${bins[@]}"; do
        xz -dc "$carry/$b.xz" >"$bin/$b"
        chmod +x "$bin/$b"
    done
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

    # The plugin, as the bpf_conformance runner calls it: ldxw r0, [r1]; add r0, r2; exit.
    local plugin_ok=1 r0
    r0=$(echo "6110000000000000 0f20000000000000 9500000000000000" |
        "$bin/bpf-conformance-plugin" --engine gpu 11223344) || plugin_ok=0
    if [ "$plugin_ok" = 1 ] && [ "$r0" = 44332215 ]; then
        echo "plugin --engine gpu: pass (r0 = $r0)"
    else
        echo "plugin --engine gpu: FAIL (r0 = ${r0:-none}, expected 44332215)"
        plugin_ok=0
    fi

    local status=0
    "$bin/bpftime-gpu-conformance" --dir "$carry/conformance" --out "$out/gpu-conformance.txt" ||
        status=$?
    echo "plugin --engine gpu: $([ "$plugin_ok" = 1 ] && echo pass || echo FAIL)" >>"$out/gpu-conformance.txt"
    rm -rf "$bin"
    uprobe_bench "$out" || status=1
    if [ "$part" = all ]; then
        gpu_examples "$out" || status=1
    fi
    if [ "$status" -eq 0 ] && [ "$plugin_ok" = 0 ]; then
        status=1
    fi
    exit "$status"
}

# median (of the numbers on stdin) and the GPU benchmarks' other helpers.
source "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"

# The GPU examples and the overhead benchmark, with bpftime and its libraries unpacked.
gpu_examples() {
    local out=$1 part=${2:-all} dir b f
    export PATH=/usr/local/cuda/bin:$PATH
    dir=$(mktemp -d)
    for b in "${cpu_bins[@]}"; do
        xz -dc "$carry/cpu/$b.xz" >"$dir/$b"
    done
    chmod +x "$dir/bpftime" "$dir/bpftime-trace-check"
    for f in "${gpu_inputs[@]}" "${gpu_loaders[@]}" libbpf.so.1; do
        cp "$carry/cpu/$f" "$dir/"
    done
    local status=0
    if [ "$part" = exec ]; then
        # A command of one's own with what the examples use: $BT (bpftime), $OBJS (the
        # objects) and $CUDA (the CUDA programs, built here).
        make -s -C bpf-examples/cuda OUT="$dir/cuda" NVCC=nvcc >/dev/null 2>&1
        BT=$dir/bpftime OBJS=$dir CUDA=$dir/cuda bash -c "$GPU_EXEC"
        status=$?
        rm -rf "$dir"
        return $status
    fi
    if [ "$part" = ldst-shared ]; then
        bash scripts/gpu-ldst-shared.sh "$dir/bpftime" "$dir" | tee "$out/gpu-ldst-shared.txt"
        status=${PIPESTATUS[0]}
        rm -rf "$dir"
        return $status
    fi
    if [ "$part" = all ] || [ "$part" = examples ]; then
        # A failed check's logs come back in one file (the device returns few files).
        GPU_EXAMPLES_LOGS=$dir/logs bash scripts/gpu-examples.sh "$dir/bpftime" "$dir" "$out/gpu-examples.txt" ||
            { status=1; tar -C "$dir" -cJf "$out/gpu-examples-logs.tar.xz" logs 2>/dev/null; }
    fi
    make -s -C bpf-examples/cuda OUT="$dir/cuda" NVCC=nvcc >/dev/null 2>&1
    if [ "$part" = all ] || [ "$part" = bench ]; then
        bash scripts/gpu-bench.sh "$dir/bpftime" "$dir/cuda" "$dir" "$out/gpu-bench.txt" || status=1
    fi
    if [ "$part" = all ] || [ "$part" = stress ]; then
        bash scripts/gpu-stress.sh "$dir/bpftime" "$dir" "$dir/cuda" "${GPU_STRESS_RUNS:-10}" "$out/gpu-stress.txt" || status=1
    fi
    rm -rf "$dir"
    return $status
}

uprobe_bench() {
    local out=$1 dir b f
    dir=$(mktemp -d)
    for b in "${cpu_bins[@]}"; do
        xz -dc "$carry/cpu/$b.xz" >"$dir/$b"
    done
    chmod +x "$dir/bpftime"
    for f in "${cpu_inputs[@]}"; do
        cp "$carry/cpu/$f" "$dir/"
    done
    local n=2000000 runs=5 plain count both ns
    local bt=("$dir/bpftime" --store "gpu-sh-bench-$$")
    ns() { grep -o 'ns_per_call=[0-9.]*' | cut -d= -f2; }
    local plain_runs count_runs both_runs
    plain_runs=$(for _ in $(seq $runs); do "$dir/bench_calls" $n | ns; done)
    count_runs=$(for _ in $(seq $runs); do "${bt[@]}" run "$dir/globals.bpf.o" -- "$dir/bench_calls" $n | ns; done)
    # The hook alone (an empty program), and bpftrace's count() (a per-CPU array's
    # read-add-write, run as a CPU slot): what counting costs without locked instructions.
    local empty_runs percpu_runs pair_runs
    empty_runs=$(for _ in $(seq $runs); do "${bt[@]}" run "$dir/uprobe_empty.bpf.o" -- "$dir/bench_calls" $n | ns; done)
    percpu_runs=$(for _ in $(seq $runs); do "${bt[@]}" run "$dir/uprobe_percpu.bpf.o" -- "$dir/bench_calls" $n | ns; done)
    # The same count at a uprobe and at a uretprobe: what the return hook adds.
    pair_runs=$(for _ in $(seq $runs); do "${bt[@]}" run "$dir/uprobe_pair.bpf.o" -- "$dir/bench_calls" $n | ns; done)
    both_runs=$(for _ in $(seq $runs); do "${bt[@]}" run "$dir/funclatency.bpf.o" -- "$dir/bench_calls" $n | ns; done)
    # The same with bpf_ktime_get_ns forced onto the vDSO: where the two agree, the TSC
    # clock is not in use on this host (it needs clocksource tsc and an invariant TSC).
    local vdso_runs
    vdso_runs=$(for _ in $(seq $runs); do BPFTIME_KTIME_VDSO=1 "${bt[@]}" run "$dir/funclatency.bpf.o" -- "$dir/bench_calls" $n | ns; done)
    rm -rf "$dir"
    plain=$(median <<<"$plain_runs")
    count=$(median <<<"$count_runs")
    both=$(median <<<"$both_runs")
    if [ -z "$plain" ] || [ -z "$count" ] || [ -z "$both" ]; then
        echo "uprobe bench: FAIL (plain '$plain', count '$count', uprobe+uretprobe '$both')" | tee "$out/uprobe-bench.txt"
        return 1
    fi
    {
        echo "uprobe bench on $(nproc) x $(lscpu | sed -n 's/^Model name: *//p'), kernel $(uname -r):"
        echo "  plain call: $plain ns (median of $runs runs of bench_calls $n)"
        echo "  counting uprobe (globals.bpf.o: call count, sum and last argument in globals): $count ns per call, $(awk "BEGIN {printf \"%.1f\", $count - $plain}") ns added"
        local empty percpu pair
        empty=$(median <<<"$empty_runs") percpu=$(median <<<"$percpu_runs") pair=$(median <<<"$pair_runs")
        echo "  empty uprobe (uprobe_empty.bpf.o): $empty ns per call, $(awk "BEGIN {printf \"%.1f\", $empty - $plain}") ns added"
        echo "  counting uprobe as bpftrace's count() (uprobe_percpu.bpf.o: a per-CPU array, no locked instruction): $percpu ns per call, $(awk "BEGIN {printf \"%.1f\", $percpu - $plain}") ns added"
        echo "  uprobe + uretprobe, each counting as count() (uprobe_pair.bpf.o): $pair ns per call, $(awk "BEGIN {printf \"%.1f\", $pair - $plain}") ns added"
        echo "  uprobe + uretprobe (funclatency.bpf.o): $both ns per call, $(awk "BEGIN {printf \"%.1f\", $both - $plain}") ns added"
        echo "  uprobe + uretprobe with bpf_ktime_get_ns on the vDSO (BPFTIME_KTIME_VDSO=1): $(median <<<"$vdso_runs") ns per call"
        echo "  every run, ns per call: plain" $plain_runs "| counting" $count_runs "| empty" $empty_runs "| per-CPU count" $percpu_runs "| counting pair" $pair_runs "| uprobe + uretprobe" $both_runs "| the same on the vDSO" $vdso_runs
        local cs=/sys/devices/system/clocksource/clocksource0
        echo "  clocksource: $(cat $cs/current_clocksource 2>/dev/null) (available: $(cat $cs/available_clocksource 2>/dev/null | xargs));" \
            "TSC flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(constant_tsc|nonstop_tsc|tsc_reliable|tsc_known_freq|rdtscp)$' | xargs)"
    } | tee "$out/uprobe-bench.txt"
}

case "${1:-}" in
"") build ;;
--on-device) on_device "${2:-all}" ;;
*)
    echo "usage: scripts/gpu.sh [--on-device [all|conformance|examples|bench|stress|ldst-shared|uprobe|exec]]" >&2
    exit 2
    ;;
esac
