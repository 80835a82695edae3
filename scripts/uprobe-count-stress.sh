#!/usr/bin/env bash
# A counting uprobe at JIT speed from several threads and processes: globals.bpf.o (a lone
# JIT handler reading only its first argument, so the hook's short save, and adding to
# global counters atomically) under one libbpf loader, three target processes at once,
# each 4 threads x 100000 calls of work(); every call counted. After a release build and
# `make -C bpf-examples`:
#   scripts/uprobe-count-stress.sh [RUNS]
set -u
cd "$(dirname "$0")/.."
bt=$PWD/target/release/bpftime; ex=$PWD/bpf-examples/build
log=$(mktemp -d); trap 'rm -rf "$log"' EXIT
store=count-stress-$$; ok=0; runs=${1:-20}
# The loader reads commands on stdin until SIGINT: a FIFO this script holds open, which
# nothing writes, keeps it waiting.
mkfifo $log/in; exec 3<>$log/in
for r in $(seq $runs); do
  $bt --store $store load $ex/globals --target $ex/calls --func work <&3 > $log/g.log 2>&1 &
  tool=$!
  for _ in $(seq 200); do grep -qx ready $log/g.log && break; sleep 0.05; done
  pids=()
  for p in 1 2 3; do $bt --store $store start $ex/calls 100000 --threads 4 > $log/app-$p.log 2>&1 & pids+=($!); done
  st=0; for p in "${pids[@]}"; do wait $p || st=1; done
  kill -INT $tool; wait $tool
  calls=$(sed -n 's/^calls=\([0-9]*\) sum=\([0-9]*\).*/\1 \2/p' $log/g.log | tail -1)
  if [ "$st" = 0 ] && [ "$calls" = "1200000 1200000" ]; then ok=$((ok+1)); else echo "run $r: apps $st calls and sum: ${calls:-none}"; fi
  rm -rf /dev/shm/bpftime-$store
done
echo "uprobe count stress: $ok/$runs runs exact (3 processes x 4 threads x 100000 calls each)"
[ "$ok" = "$runs" ]
