#!/usr/bin/env bash
# Shared-memory access probes (`cuda:KERNEL:ldst.shared`) on the GPU, exact against a count
# by hand (bpf-examples/access_shared): the tiled matmul (TILE 16) makes, per thread and
# tile step, one global load in a, one in b, 2 shared stores and 2 x 16 shared loads, and
# one global store in c per thread; vectorAdd makes n loads in a and in b, n stores in c
# and no shared access. Every shared address must be a generic one outside the three
# buffers, every access 4 bytes. matrix_rows' matrix loads and stores count a 16-byte row
# per lane that names one. One PASS or FAIL line per check, then `N passed, M failed`.
# scripts/gpu-examples.sh runs it; alone, on the GPU machine:
#
#   scripts/gpu-ldst-shared.sh BPFTIME OBJECT_DIR [CUDA_DIR]
#
# OBJECT_DIR holds access_shared.bpf.o; CUDA_DIR the CUDA programs of bpf-examples/cuda
# (built there with nvcc when it lacks them; default a scratch directory).
set -uo pipefail
bt=$1 objs=$2
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cuda=${3:-$work/cuda}
passed=0 failed=0
result() {  # result NAME OK DETAIL
    if [ "$2" = 1 ]; then
        passed=$((passed + 1)); echo "PASS $1${3:+: $3}"
    else
        failed=$((failed + 1)); echo "FAIL $1${3:+: $3}"
    fi
}
value() {  # value LOG MAP KEY
    sed -n "s/^$2\[$3\]: \([0-9]*\)$/\1/p" "$1" | head -1
}
if [ ! -x "$cuda/matmul" ] || [ ! -x "$cuda/vec_add" ] || [ ! -x "$cuda/matrix_rows" ]; then
    if ! make -s -C bpf-examples/cuda OUT="$cuda" NVCC=nvcc "$cuda/matmul" "$cuda/vec_add" "$cuda/matrix_rows" >"$work/make.log" 2>&1; then
        result "build matmul, vec_add and matrix_rows for the shared-memory access probes" 0 "$(tail -3 "$work/make.log")"
        echo "$passed passed, $failed failed"
        exit 1
    fi
fi

check() {  # check NAME MAP LOADS_A_B STORES_C SHARED_LOADS SHARED_STORES APP ARGS...
    local name=$1 map=$2 loads=$3 stores=$4 sloads=$5 sstores=$6
    shift 6
    local log=$work/ldst-shared-$map
    timeout 300 "$bt" --store "gpu-ldst-shared-$$" run "$objs/access_shared.bpf.o" -- "$@" >"$log.out" 2>&1
    echo "exit=$?" >>"$log.out"
    local la lb sc sl ss other window size all expect_all
    la=$(value "$log.out" "$map" 0) lb=$(value "$log.out" "$map" 1) sc=$(value "$log.out" "$map" 2)
    sl=$(value "$log.out" "$map" 3) ss=$(value "$log.out" "$map" 4) other=$(value "$log.out" "$map" 5)
    window=$(value "$log.out" "$map" 6) size=$(value "$log.out" "$map" 7) all=$(value "$log.out" "$map" 8)
    expect_all=$((2 * loads + stores + sloads + sstores))
    local ok=0
    if grep -q 'check=ok' "$log.out" && grep -q '^exit=0' "$log.out" &&
        [ "$la" = "$loads" ] && [ "$lb" = "$loads" ] && [ "$sc" = "$stores" ] &&
        [ "$sl" = "$sloads" ] && [ "$ss" = "$sstores" ] && [ "$other" = 0 ] &&
        [ "$window" = 0 ] && [ "$size" = 0 ] && [ "$all" = "$expect_all" ]; then
        ok=1
    fi
    result "shared-memory access probe (ldst.shared) on $name, exact" $ok "global loads a $la b $lb (expected $loads each), stores c $sc (expected $stores); shared loads $sl (expected $sloads), stores $ss (expected $sstores); other $other, shared not generic or in a buffer $window, not 4 bytes $size, all $all (expected $expect_all)"
    [ $ok = 1 ] || grep -v '^\(vector_add\|matmul\)\[' "$log.out" | tail -20
}

n=512 iters=2
steps=$((n / 16))
# Per launch: n^2 threads x n/16 steps, each 1 load of a and of b, 2 shared stores and 32
# shared loads; n^2 stores of c.
per=$((n * n * steps))
check "matmul ${n}x${n}" matmul $((per * iters)) $((n * n * iters)) $((32 * per * iters)) $((2 * per * iters)) \
    "$cuda/matmul" $n $iters
n=1048576 iters=3
check "vectorAdd (no shared memory)" vector_add $((n * iters)) $((n * iters)) 0 0 "$cuda/vec_add" $n $iters
# Matrix loads and stores (matrix_rows.cu): per launch of W warps and REPS turns, 56 W REPS
# 16-byte row loads (ldmatrix .x1, .x2, .x4: 8 + 16 + 32 lanes), 32 W REPS row stores
# (stmatrix .x4) and 32 W 16-byte stores (the fill), 32 W 2-byte shared loads, 32 W
# 16-byte global loads and 32 W 4-byte global stores.
blocks=64 reps=5 iters=2
w=$((4 * blocks))
log=$work/ldst-shared-matrix_rows
timeout 300 "$bt" --store "gpu-ldst-shared-$$" run "$objs/access_shared.bpf.o" -- "$cuda/matrix_rows" $blocks $reps $iters >"$log.out" 2>&1
echo "exit=$?" >>"$log.out"
got=""
for i in 0 1 2 3 4 5 6 7; do got="$got $(value "$log.out" matrix_rows $i)"; done
# shellcheck disable=SC2086
set -- $got
want="$((56 * w * reps * iters)) $((32 * w * (reps + 1) * iters)) $((32 * w * iters)) $((32 * w * iters)) $((32 * w * iters)) 0 0 $(((56 * reps + 32 * (reps + 1) + 96) * w * iters))"
ok=0
grep -q 'check=ok' "$log.out" && grep -q '^exit=0' "$log.out" && [ "$(echo $got)" = "$want" ] && ok=1
result "shared-memory access probe (ldst.shared) on matrix loads and stores (ldmatrix, stmatrix), exact" $ok \
    "row loads ${1:-?} row stores and fills ${2:-?} 2-byte loads ${3:-?} global loads ${4:-?} global stores ${5:-?} other ${6:-?} misplaced ${7:-?} all ${8:-?} (expected $want)"
[ $ok = 1 ] || grep -v '^matrix_rows\[' "$log.out" | tail -20
rm -rf "/dev/shm/bpftime-gpu-ldst-shared-$$"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
