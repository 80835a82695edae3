#!/usr/bin/env bash
# memtrace and ldst_count on vectorAdd (2^26 floats, 50 launches), the tiled matmul
# (4096^2, 5 launches) and a small vectorAdd (2^16 floats, 200 launches, for the cost per
# launch), under two builds of bpftime in one run, each against native in
# the same run: the median ms per launch of five runs (CUDA events in the application).
# On the GPU machine, through scripts/gpu.sh's exec part:
#
#   GPU_EXEC='bash scripts/gpu-memtrace-ab.sh OLD_DIR' bash scripts/gpu.sh --on-device exec
#
# OLD_DIR holds the older build's bpftime.xz, libbpftime_agent.so.xz,
# libbpftime_agent_starter.so.xz, libbpftime_syscall_shim.so.xz, libbpf.so.1 and its
# memtrace.bpf.o and bench_ldst_count.bpf.o; the newer is the one gpu.sh unpacked ($BT,
# $OBJS, $CUDA).
set -uo pipefail
old_src=$1
old=$(mktemp -d)
for f in bpftime libbpftime_agent.so libbpftime_agent_starter.so libbpftime_syscall_shim.so; do
    xz -dc "$old_src/$f.xz" >"$old/$f"
done
chmod +x "$old/bpftime"
cp "$old_src"/*.bpf.o "$old_src/libbpf.so.1" "$old/"
source "$(dirname "$0")/bench-lib.sh"
out=$(mktemp -d)
echo "memtrace A/B, $(date -u +%Y-%m-%d), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); median ms per launch of 5 runs"
# The third target shows the cost every launch pays whatever its size: 2^16 elements (a
# kernel of a few microseconds), the application waiting for each launch.
for target in "vec_add:vec_add_sm90 67108864 50" "matmul:matmul_sm90 4096 5" "launch_cost:vec_add_sm90 65536 200"; do
    # AB_ONLY=vec_add, =matmul or =launch_cost runs one of them.
    case "${AB_ONLY:-}" in "" | "${target%%:*}") ;; *) continue ;; esac
    set -- ${target#*:}
    app=$1
    shift
    kernel=vectorAdd
    [ "$app" = matmul_sm90 ] && kernel=matmul
    echo "== $app $*"
    base=""
    bench native "$CUDA/$app" "$@"
    bench "memtrace, old build, old object" timeout 120 "$old/bpftime" --store "ab-old-$$" run --out "$out/old" "$old/memtrace.bpf.o" -- "$CUDA/$app" "$@"
    bench "memtrace, new build, old object" timeout 120 "$BT" --store "ab-new-$$" run --out "$out/mixed" "$old/memtrace.bpf.o" -- "$CUDA/$app" "$@"
    bench "memtrace, new build, new object" timeout 120 "$BT" --store "ab-new-$$" run --out "$out/new" "$OBJS/memtrace.bpf.o" -- "$CUDA/$app" "$@"
    bench "ldst_count, old build" timeout 120 "$old/bpftime" --store "ab-old-$$" run --attach "ldst_count=$kernel" "$old/bench_ldst_count.bpf.o" -- "$CUDA/$app" "$@"
    bench "ldst_count, new build" timeout 120 "$BT" --store "ab-new-$$" run --attach "ldst_count=$kernel" "$OBJS/bench_ldst_count.bpf.o" -- "$CUDA/$app" "$@"
    bench native "$CUDA/$app" "$@"
    for v in old new; do
        echo "  $v: $(grep -E '^accesses\[' "$out/$v/maps.txt" 2>/dev/null | head -3 | tr '\n' ' ')"
    done
done
rm -rf "$old" "$out" /dev/shm/bpftime-ab-*
