#!/usr/bin/env bash
# The uprobe bench's fixed costs on this host (scripts/host-costs.c: a map lock, a locked
# add, rdtsc, the vDSO clock), then bpftime's counting uprobe (globals.bpf.o) and
# funclatency on bench_calls, five runs each, ns per call. Runs from the repository after
# a release build and `make -C bpf-examples`, or on another machine from a folder holding
# bpftime, its three libraries, bench_calls, the two objects and host-costs:
#   scripts/bench-host-costs.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-}
if [ -z "$dir" ]; then
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' EXIT
    cp target/release/{bpftime,libbpftime_syscall_shim.so,libbpftime_agent.so,libbpftime_agent_starter.so} "$dir/"
    cp bpf-examples/build/{bench_calls,globals.bpf.o,funclatency.bpf.o} "$dir/"
    cc -O2 -o "$dir/host-costs" scripts/host-costs.c
fi
echo "host: $(nproc) x $(lscpu | sed -n 's/^Model name: *//p'), clocksource $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
"$dir/host-costs"
"$dir/host-costs"
ns() { grep -o 'ns_per_call=[0-9.]*' | cut -d= -f2 | tr '\n' ' '; }
store="host-costs-$$"
echo "plain call: $(for _ in 1 2 3 4 5; do "$dir/bench_calls" 2000000 | ns; done)"
echo "counting uprobe (globals.bpf.o): $(for _ in 1 2 3 4 5; do "$dir/bpftime" --store "$store" run "$dir/globals.bpf.o" -- "$dir/bench_calls" 2000000 2>/dev/null | ns; done)"
echo "uprobe + uretprobe (funclatency): $(for _ in 1 2 3 4 5; do "$dir/bpftime" --store "$store" run "$dir/funclatency.bpf.o" -- "$dir/bench_calls" 2000000 2>/dev/null | ns; done)"
rm -rf "/dev/shm/bpftime-$store"
