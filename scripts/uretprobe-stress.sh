#!/usr/bin/env bash
# uprobe + uretprobe at JIT speed from several threads and processes: funclatency under one
# libbpf loader, three target processes at once, each 4 threads x 100000 calls of work();
# every call counted, none missed. After a release build and `make -C bpf-examples`:
#   scripts/uretprobe-stress.sh [RUNS]
set -u
cd "$(dirname "$0")/.."
bt=$PWD/target/release/bpftime; ex=$PWD/bpf-examples/build
log=$(mktemp -d); trap 'rm -rf "$log"' EXIT
store=uret-stress-$$; ok=0; runs=${1:-20}
for r in $(seq $runs); do
  $bt --store $store load $ex/funclatency --target $ex/calls --func work > $log/us.log 2>&1 &
  tool=$!
  for _ in $(seq 200); do grep -qx ready $log/us.log && break; sleep 0.05; done
  pids=()
  for p in 1 2 3; do $bt --store $store start $ex/calls 100000 --threads 4 > $log/us-$p.log 2>&1 & pids+=($!); done
  st=0; for p in "${pids[@]}"; do wait $p || st=1; done
  kill -INT $tool; wait $tool
  count=$(sed -n 's/^count=//p' $log/us.log | tail -1); missed=$(sed -n 's/^missed=//p' $log/us.log | tail -1)
  if [ "$st" = 0 ] && [ "$count" = 1200000 ] && [ "$missed" = 0 ]; then ok=$((ok+1)); else echo "run $r: apps $st count $count missed $missed"; fi
  rm -rf /dev/shm/bpftime-$store
done
echo "uretprobe stress: $ok/$runs runs exact (3 processes x 4 threads x 100000 calls each)"
[ "$ok" = "$runs" ]
