#!/usr/bin/env bash
# The main job on the bundled examples, with no kernel eBPF and no root:
# `bpftime run` loads a BPF object (funclatency: uprobe + uretprobe, hash and
# array maps; ringbuf_events: a ring buffer), runs a target under it and prints
# the maps and events; then an unmodified libbpf tool, loaded with
# `bpftime load`, traces the same target run with `bpftime start`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo build --release --workspace --bins --lib
make -s -C bpf-examples
B=bpf-examples/build
bpftime=target/release/bpftime
store="demo-$$"
trap 'rm -rf "/dev/shm/bpftime-$store"' EXIT

run_tool() {
    # run_tool OUTFILE TOOL ARGS...: starts a loader under bpftime and waits until it is attached.
    local out=$1; shift
    "$bpftime" --store "$store" load "$@" >"$out" 2>"$out.err" &
    local pid=$!
    for _ in $(seq 100); do
        grep -qx ready "$out" 2>/dev/null && { echo "$pid"; return; }
        kill -0 "$pid" 2>/dev/null || { cat "$out.err" >&2; exit 1; }
        sleep 0.1
    done
    echo "the loader did not attach in time" >&2; cat "$out.err" >&2; exit 1
}

tmp=$(mktemp -d)
echo "== bpftime run funclatency.bpf.o -- calls 1000 (work() 1000 times; the sections name work):"
"$bpftime" --store "$store" run "$B/funclatency.bpf.o" -- "$B/calls" 1000
echo "== bpftime run ringbuf_events.bpf.o -- calls 1000 (first 5 of the events, then the maps):"
"$bpftime" --store "$store" run "$B/ringbuf_events.bpf.o" -- "$B/calls" 1000 >"$tmp/run-ev"
awk '/^event / && n++ < 5' "$tmp/run-ev"
grep -v '^event ' "$tmp/run-ev"
echo "== bpftime verify: the bundled objects, and one the verifier rejects:"
for o in funclatency malloc_count ringbuf_events; do "$bpftime" verify "$B/$o.bpf.o"; done
"$bpftime" verify "$B/rejected.bpf.o" || echo "(exit status $?: rejected, as it should be)"
echo "== the unmodified libbpf tool funclatency under bpftime load, its target under bpftime start:"
lat=$(run_tool "$tmp/lat" "$B/funclatency" --target "$B/calls" --func work)
"$bpftime" --store "$store" list
"$bpftime" --store "$store" start "$B/calls" 1000
kill -INT "$lat"
while kill -0 "$lat" 2>/dev/null; do sleep 0.1; done
cat "$tmp/lat"
# The GPU demo: eBPF inside a CUDA kernel. cuda_counter counts every thread of vectorAdd
# at entry and exit and times it; the CUDA program is built here with nvcc.
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
if ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
    echo "== no GPU here (nvidia-smi finds none): the GPU demo is skipped"
elif [ -z "$nvcc" ]; then
    echo "== a GPU is present but no nvcc (PATH, /usr/local/cuda/bin) to build the CUDA demo: skipped"
else
    echo "== bpftime run cuda_counter.bpf.o -- vec_add 1048576 10 (every thread of vectorAdd, on the GPU):"
    make -s -C bpf-examples gpu
    make -s -C bpf-examples/cuda OUT="$tmp/cuda" NVCC="$nvcc" "$tmp/cuda/vec_add"
    "$bpftime" --store "$store" run "$B/cuda_counter.bpf.o" -- "$tmp/cuda/vec_add" 1048576 10 |
        grep -v '^starts\['
fi
rm -rf "$tmp"
