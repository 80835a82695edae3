#!/usr/bin/env bash
# Uprobes at JIT speed from several threads and processes: one libbpf loader, three target
# processes at once, each 4 threads x 100000 calls of work(), every call counted. After a
# release build and `make -C bpf-examples`:
#   scripts/uprobe-stress.sh count [RUNS]   globals.bpf.o: a lone JIT handler reading only
#                                           its first argument (the hook's short save),
#                                           adding to global counters atomically
#   scripts/uprobe-stress.sh return [RUNS]  funclatency: uprobe + uretprobe, none missed
set -u
cd "$(dirname "$0")/.."
kind=${1:?count or return}; runs=${2:-20}
bt=$PWD/target/release/bpftime; ex=$PWD/bpf-examples/build
log=$(mktemp -d); trap 'rm -rf "$log"' EXIT
store=uprobe-stress-$$; ok=0
case $kind in
count) tool=globals ;;
return) tool=funclatency ;;
*) echo "uprobe-stress.sh: count or return, not $kind" >&2; exit 2 ;;
esac
# exact LOG: whether the tool's last report counts every call.
exact() {
    case $kind in
    count) [ "$(sed -n 's/^calls=\([0-9]*\) sum=\([0-9]*\).*/\1 \2/p' "$1" | tail -1)" = "1200000 1200000" ] ;;
    return) [ "$(sed -n 's/^count=//p' "$1" | tail -1)" = 1200000 ] && [ "$(sed -n 's/^missed=//p' "$1" | tail -1)" = 0 ] ;;
    esac
}
# A loader that reads commands on stdin until SIGINT gets a FIFO this script holds open,
# which nothing writes: it keeps waiting.
mkfifo "$log/in"; exec 3<>"$log/in"
for r in $(seq "$runs"); do
    "$bt" --store $store load "$ex/$tool" --target "$ex/calls" --func work <&3 >"$log/tool.log" 2>&1 &
    loader=$!
    for _ in $(seq 200); do grep -qx ready "$log/tool.log" && break; sleep 0.05; done
    pids=()
    for p in 1 2 3; do "$bt" --store $store start "$ex/calls" 100000 --threads 4 >"$log/app-$p.log" 2>&1 & pids+=($!); done
    st=0; for p in "${pids[@]}"; do wait "$p" || st=1; done
    kill -INT $loader; wait $loader
    if [ "$st" = 0 ] && exact "$log/tool.log"; then
        ok=$((ok + 1))
    else
        echo "run $r: apps $st; the tool's last lines: $(tail -3 "$log/tool.log" | tr '\n' ' ')"
    fi
    rm -rf /dev/shm/bpftime-$store
done
echo "uprobe stress ($tool): $ok/$runs runs exact (3 processes x 4 threads x 100000 calls each)"
[ "$ok" = "$runs" ]
