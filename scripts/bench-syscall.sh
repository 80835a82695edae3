#!/usr/bin/env bash
# Cost added per system call by syscall tracepoints: getppid() timed by bench_syscalls
# with nothing attached, under bpftime (hooks armed for another call; an empty program
# on sys_enter_getppid; a per-CPU count there; a count by number on raw_tracepoint/
# sys_enter, which runs at every call; the count with every call through SIGSYS) and on
# the kernel (the same objects, loaded by gpu_probes with tracefs mounted in a private
# mount namespace): medians, one run.
# Usage: scripts/bench-syscall.sh [--record]   (--record appends to BENCHMARKS.md)
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
cargo build --release -p bpftime -p bpftime-syscall-shim-preload -p bpftime-agent \
    -p bpftime-agent-starter >/dev/null 2>&1
B=$(mktemp -d)
make -s -C bpf-examples OUT="$B" "$B/bench_syscalls" "$B/gpu_probes" \
    "$B/syscall_empty.bpf.o" "$B/syscall_count.bpf.o" "$B/syscall_rawcount.bpf.o" \
    "$B/syscall_other.bpf.o"
bpftime=$target/release/bpftime
store="bench-sys-$$"
trap 'rm -rf "$B" "/dev/shm/bpftime-$(id -u)-$store"; jobs -p | xargs -r kill 2>/dev/null' EXIT
T="$B/bench_syscalls"
N=2000000
N_SLOW=100000

# "median min user sys": bench_syscalls' median and fastest round, and the process's
# user and system CPU time per call (getrusage, through GNU time), which split a hook's
# cost into ours and the kernel's.
measure() {
    local n=$1; shift
    /usr/bin/time -f 'cpu %U %S' -o "$B/time" "$@" >"$B/out"
    local med min
    med=$(grep -o 'ns_per_call=[0-9.]*' "$B/out" | cut -d= -f2)
    min=$(grep -o 'min=[0-9.]*' "$B/out" | cut -d= -f2)
    # bench_syscalls makes 11 * n calls, and n / 10 + 1000 to warm up.
    read -r _ u s < <(grep '^cpu' "$B/time")
    awk -v med="$med" -v min="$min" -v u="$u" -v s="$s" -v n="$n" \
        'BEGIN { c = 11 * n + int(n / 10) + 1000; printf "%s %s %.1f %.1f\n", med, min, u * 1e9 / c, s * 1e9 / c }'
}

# Waits for a tool writing to $1 to print "ready".
ready() {
    for _ in $(seq 400); do
        grep -q '^ready' "$1" 2>/dev/null && return
        sleep 0.05
    done
    echo "the tool never got ready: $(cat "$1")" >&2; exit 1
}

stop() {
    kill -INT "$1" 2>/dev/null
    for _ in $(seq 200); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.05; done
    kill -KILL "$1" 2>/dev/null || true
}

# Runs bench_syscalls under bpftime with object $1 loaded; extra environment in $2.
ours() {
    "$bpftime" --store "$store" load "$B/gpu_probes" --obj "$1" >"$B/tool" 2>&1 &
    local pid=$!
    ready "$B/tool"
    measure "${3:-$N}" env ${2:-} "$bpftime" --store "$store" start "$T" "${3:-$N}"
    stop $pid
}

kernel() {
    unshare -m sh -c 'mount -t tracefs nodev /sys/kernel/tracing && exec "$@"' sh \
        "$B/gpu_probes" --obj "$1" >"$B/ktool" 2>&1 &
    local pid=$!
    ready "$B/ktool"
    measure "$N" "$T" "$N"
    stop $pid
}

load=$(cut -d' ' -f1-3 /proc/loadavg)
plain_all=$(measure "$N" "$T" "$N")
# The rewritten sites' figures: where the CPU cannot make page 0 execute-only (no
# protection keys, as on our AMD EPYC VM) rewriting is off unless asked for, so it is.
ours_other=$(ours "$B/syscall_other.bpf.o" BPFTIME_SYSCALL_REWRITE=1)
ours_empty=$(ours "$B/syscall_empty.bpf.o" BPFTIME_SYSCALL_REWRITE=1)
ours_count=$(ours "$B/syscall_count.bpf.o" BPFTIME_SYSCALL_REWRITE=1)
ours_raw=$(ours "$B/syscall_rawcount.bpf.o" BPFTIME_SYSCALL_REWRITE=1)
ours_sigsys=$(ours "$B/syscall_count.bpf.o" BPFTIME_SYSCALL_REWRITE=0 "$N_SLOW")
kernel_empty="n/a n/a n/a n/a"; kernel_count=$kernel_empty; kernel_raw=$kernel_empty
if [ "$(id -u)" -eq 0 ]; then
    kernel_empty=$(kernel "$B/syscall_empty.bpf.o")
    kernel_count=$(kernel "$B/syscall_count.bpf.o")
    kernel_raw=$(kernel "$B/syscall_rawcount.bpf.o")
fi

# A row: label, the measurement, the kernel's for the ratio (or empty).
row() {
    awk -v label="$1" -v m="$2" -v k="$3" -v p="$plain_all" 'BEGIN {
        split(m, a, " "); split(p, b, " "); split(k, c, " ")
        if (a[1] == "n/a") { printf "| %s | n/a | n/a | n/a | n/a | n/a | |\n", label; exit }
        ratio = (k == "" || c[1] == "n/a") ? "" : sprintf("%.1fx", (c[1] - b[1]) / (a[1] - b[1]))
        printf "| %s | %s | %s | %+.1f | %+.1f | %+.1f | %s |\n", label, a[1], a[2], a[1] - b[1], a[3] - b[3], a[4] - b[4], ratio
    }'
}

table=$(cat <<EOT
| getppid() with | ns per call (median) | fastest round | added ns (median) | added user ns | added system ns | kernel's added / ours |
|---|---|---|---|---|---|---|
$(row "nothing" "$plain_all" "")
$(row "bpftime, hooks armed, nothing on getppid" "$ours_other" "")
$(row "bpftime, empty program on sys_enter_getppid" "$ours_empty" "$kernel_empty")
$(row "kernel, empty program on sys_enter_getppid" "$kernel_empty" "")
$(row "bpftime, per-CPU count on sys_enter_getppid" "$ours_count" "$kernel_count")
$(row "kernel, per-CPU count on sys_enter_getppid" "$kernel_count" "")
$(row "bpftime, count by number on raw_tracepoint/sys_enter" "$ours_raw" "$kernel_raw")
$(row "kernel, count by number on raw_tracepoint/sys_enter" "$kernel_raw" "")
$(row "bpftime, per-CPU count, every call through SIGSYS" "$ours_sigsys" "$kernel_count")
EOT
)
echo "$table"
if [ "${1:-}" = "--record" ]; then
    {
        echo
        echo "### Syscall tracepoint cost, $(date -u +%Y-%m-%d), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), Linux $(uname -r), commit $(git rev-parse --short HEAD)"
        echo
        echo "Engine: x86-64 JIT. bench_syscalls times $N getppid() calls ($N_SLOW through SIGSYS) in 11 rounds: the median round and the fastest; user and system CPU time per call from getrusage over the whole run (bpftime's include the agent's start). Sites rewritten to \`call *%rax\` (root). Load average at the start: $load."
        echo
        echo "$table"
    } >> BENCHMARKS.md
fi
