#!/usr/bin/env bash
# The main job on a bundled example: an unmodified libbpf tool (funclatency:
# uprobe + uretprobe, hash and array maps) and a ring-buffer streamer, loaded
# with `bpftime load`, tracing a target run with `bpftime start`. No kernel
# eBPF and no root needed.
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
lat=$(run_tool "$tmp/lat" "$B/funclatency" --target "$B/calls" --func work)
ev=$(run_tool "$tmp/ev" "$B/ringbuf_events" --target "$B/calls" --func work)
echo "== tools attached; the store holds:"
"$bpftime" --store "$store" list
echo "== running the target: calls 1000 (work() 1000 times)"
"$bpftime" --store "$store" start "$B/calls" 1000
kill -INT "$lat" "$ev"
while kill -0 "$lat" 2>/dev/null || kill -0 "$ev" 2>/dev/null; do sleep 0.1; done
echo "== funclatency (uprobe + uretprobe on work):"
cat "$tmp/lat"
echo "== ringbuf_events (first 5 of the events streamed through a ring buffer):"
grep '^event ' "$tmp/ev" | head -5
grep -v '^event ' "$tmp/ev"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "== a GPU is present, but GPU attach (cuda: probes) is not built yet: the GPU demo is skipped"
else
    echo "== no GPU here: the GPU demo is skipped"
fi
rm -rf "$tmp"
