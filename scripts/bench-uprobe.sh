#!/usr/bin/env bash
# Cost added per hit by a uprobe running a counting program (bpftrace's
# `@c = count()`), by a uprobe and a uretprobe each counting, and by uprobe +
# uretprobe (funclatency), under bpftime and on the kernel, against the plain
# call: medians from bench_calls, one run.
# Usage: scripts/bench-uprobe.sh [--record]   (--record appends to BENCHMARKS.md)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --bins --lib >/dev/null 2>&1
make -s -C bpf-examples
B=bpf-examples/build
bpftime=target/release/bpftime
store="bench-$$"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "/dev/shm/bpftime-$store"; jobs -p | xargs -r kill 2>/dev/null' EXIT
cp "$B/bench_calls" "$tmp/bench_calls"
T="$tmp/bench_calls"
N_FAST=2000000
N_KERNEL=50000

ns() { grep -o 'ns_per_call=[0-9.]*' | cut -d= -f2; }

wait_links() {
    for _ in $(seq 200); do
        "$bpftime" --store "$store" list 2>/dev/null | grep -q '^link' && return
        sleep 0.05
    done
    echo "no link appeared" >&2; exit 1
}

# SIGINT, as a user stops a tool; the kernel's bpftrace 0.17 sometimes ignores it for
# minutes, so after 10 s it gets SIGTERM, then SIGKILL (its probes go with its fds).
stop() {
    kill -INT "$1" 2>/dev/null
    for sig in TERM KILL; do
        for _ in $(seq 200); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.05; done
        kill -"$sig" "$1" 2>/dev/null
    done
    while kill -0 "$1" 2>/dev/null; do sleep 0.05; done
}

plain=$("$T" "$N_FAST" | ns)

# Each tool once; the target runs under it with the JIT, then with the interpreter.
"$bpftime" --store "$store" load bpftrace -e "uprobe:$T:work { @c = count(); }" >"$tmp/bt" 2>&1 &
pid=$!; wait_links
ours_uprobe=$("$bpftime" --store "$store" start "$T" "$N_FAST" | ns)
interp_uprobe=$(BPFTIME_JIT=0 "$bpftime" --store "$store" start "$T" "$N_FAST" | ns)
stop $pid

pair_script="uprobe:$T:work { @calls = count(); } uretprobe:$T:work { @returns = count(); }"
"$bpftime" --store "$store" load bpftrace -e "$pair_script" >"$tmp/btpair" 2>&1 &
pid=$!; wait_links
ours_pair=$("$bpftime" --store "$store" start "$T" "$N_FAST" | ns)
stop $pid

"$bpftime" --store "$store" load "$B/funclatency" --target "$T" --func work >"$tmp/fl" 2>&1 &
pid=$!; wait_links
ours_both=$("$bpftime" --store "$store" start "$T" "$N_FAST" | ns)
interp_both=$(BPFTIME_JIT=0 "$bpftime" --store "$store" start "$T" "$N_FAST" | ns)
stop $pid

# The hook alone, and the same count() shape from a libbpf object (no bpftrace codegen).
ours_empty=$("$bpftime" --store "$store" run "$B/uprobe_empty.bpf.o" -- "$T" "$N_FAST" | ns)
ours_percpu=$("$bpftime" --store "$store" run "$B/uprobe_percpu.bpf.o" -- "$T" "$N_FAST" | ns)
ours_pair_obj=$("$bpftime" --store "$store" run "$B/uprobe_pair.bpf.o" -- "$T" "$N_FAST" | ns)

kernel_uprobe=n/a; kernel_pair=n/a; kernel_both=n/a
if [ "$(id -u)" -eq 0 ] && [ -e /sys/bus/event_source/devices/uprobe/type ]; then
    bpftrace -e "uprobe:$T:work { @c = count(); }" >"$tmp/kbt" 2>&1 &
    pid=$!; sleep 3
    kernel_uprobe=$("$T" "$N_KERNEL" | ns)
    stop $pid
    bpftrace -e "$pair_script" >"$tmp/kbtpair" 2>&1 &
    pid=$!; sleep 3
    kernel_pair=$("$T" "$N_KERNEL" | ns)
    stop $pid
    "$B/funclatency" --target "$T" --func work >"$tmp/kfl" 2>&1 &
    pid=$!; sleep 2
    kernel_both=$("$T" "$N_KERNEL" | ns)
    stop $pid
fi

added() { awk -v a="$1" -v b="$plain" 'BEGIN { if (a == "n/a") print "n/a"; else printf "%.1f", a - b }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "n/a" || b == "n/a") print "n/a"; else printf "%.1fx", (a - p) / (b - p) }' p="$plain"; }

table=$(cat <<EOT
| probe on work() | ns per call (median) | added ns per hit | kernel's added / ours |
|---|---|---|---|
| none | $plain | 0 | |
| bpftime uprobe, empty program | $ours_empty | $(added "$ours_empty") | |
| bpftime uprobe, per-CPU count (libbpf object) | $ours_percpu | $(added "$ours_percpu") | |
| bpftime uprobe, count() (bpftrace) | $ours_uprobe | $(added "$ours_uprobe") | $(ratio "$kernel_uprobe" "$ours_uprobe") |
| the same on bpftime's interpreter | $interp_uprobe | $(added "$interp_uprobe") | $(ratio "$kernel_uprobe" "$interp_uprobe") |
| kernel uprobe, count() (bpftrace) | $kernel_uprobe | $(added "$kernel_uprobe") | |
| bpftime uprobe + uretprobe, per-CPU counts (libbpf object) | $ours_pair_obj | $(added "$ours_pair_obj") | |
| bpftime uprobe + uretprobe, count() each (bpftrace) | $ours_pair | $(added "$ours_pair") | $(ratio "$kernel_pair" "$ours_pair") |
| kernel uprobe + uretprobe, count() each (bpftrace) | $kernel_pair | $(added "$kernel_pair") | |
| bpftime uprobe + uretprobe (funclatency) | $ours_both | $(added "$ours_both") | $(ratio "$kernel_both" "$ours_both") |
| the same on bpftime's interpreter | $interp_both | $(added "$interp_both") | $(ratio "$kernel_both" "$interp_both") |
| kernel uprobe + uretprobe (funclatency) | $kernel_both | $(added "$kernel_both") | |
EOT
)
echo "$table"
if [ "${1:-}" = "--record" ]; then
    {
        echo
        echo "### Uprobe cost, $(date -u +%Y-%m-%d), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), commit $(git rev-parse --short HEAD)"
        echo
        echo "Engine: x86-64 JIT (interpreter rows: BPFTIME_JIT=0). bench_calls runs $N_FAST calls ($N_KERNEL on the kernel) in 11 rounds; medians."
        echo
        echo "$table"
    } >> BENCHMARKS.md
fi
