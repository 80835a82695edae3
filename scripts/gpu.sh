#!/usr/bin/env bash
# The GPU tests: the bpf_conformance suite and the GPU helper checks on an NVIDIA GPU.
#
#   scripts/gpu.sh              here (no GPU needed): build the release binaries the GPU
#                               machine runs, stripped and xz-compressed (LLVM is linked in
#                               statically), into device-carry/gpu/ with a copy of the
#                               bpf_conformance tests; that folder is what travels
#   scripts/gpu.sh --on-device  on the GPU machine, from the repository root: unpack them,
#                               run everything, print a summary and write it to
#                               $OUT/gpu-conformance.txt ($OUT defaults to results/)
#
# The GPU machine needs the NVIDIA driver (libcuda.so.1) and nothing else: no Rust, no
# LLVM, no CUDA toolkit. Exit status: 0 when everything passed, 1 on a failure, 2 when
# something is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

carry=device-carry/gpu
bins=(bpftime-gpu-conformance bpf-conformance-plugin)

build() {
    local target=${CARGO_TARGET_DIR:-target}
    local suite=${BPF_CONFORMANCE_DIR:-../shared/conformance/bpf_conformance}
    if ! ls "$suite"/*.data >/dev/null 2>&1; then
        echo "gpu.sh: no .data files in $suite; set BPF_CONFORMANCE_DIR" >&2
        exit 2
    fi
    cargo build --release -p bpftime-conformance --bins
    rm -rf "$carry"
    mkdir -p "$carry/conformance"
    for b in "${bins[@]}"; do
        strip -o "$carry/$b" "$target/release/$b"
        xz -T0 -6 -f "$carry/$b"
    done
    cp "$suite"/*.data "$carry/conformance/"
    du -sh "$carry"
    echo "gpu.sh: carry $carry to the GPU machine and run: bash scripts/gpu.sh --on-device"
}

on_device() {
    local out=${OUT:-results}
    mkdir -p "$out"
    for b in "${bins[@]}"; do
        if [ ! -f "$carry/$b.xz" ]; then
            echo "gpu.sh: $carry/$b.xz is missing; run scripts/gpu.sh here first and carry $carry" >&2
            exit 2
        fi
    done
    local bin
    bin=$(mktemp -d)
    for b in "${bins[@]}"; do
        xz -dc "$carry/$b.xz" >"$bin/$b"
        chmod +x "$bin/$b"
    done
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

    # The plugin, as the bpf_conformance runner calls it: ldxw r0, [r1]; add r0, r2; exit.
    local plugin_ok=1 r0
    r0=$(echo "6110000000000000 0f20000000000000 9500000000000000" |
        "$bin/bpf-conformance-plugin" --engine gpu 11223344) || plugin_ok=0
    if [ "$plugin_ok" = 1 ] && [ "$r0" = 44332215 ]; then
        echo "plugin --engine gpu: pass (r0 = $r0)"
    else
        echo "plugin --engine gpu: FAIL (r0 = ${r0:-none}, expected 44332215)"
        plugin_ok=0
    fi

    local status=0
    "$bin/bpftime-gpu-conformance" --dir "$carry/conformance" --out "$out/gpu-conformance.txt" ||
        status=$?
    echo "plugin --engine gpu: $([ "$plugin_ok" = 1 ] && echo pass || echo FAIL)" >>"$out/gpu-conformance.txt"
    rm -rf "$bin"
    if [ "$status" -eq 0 ] && [ "$plugin_ok" = 0 ]; then
        status=1
    fi
    exit "$status"
}

case "${1:-}" in
"") build ;;
--on-device) on_device ;;
*)
    echo "usage: scripts/gpu.sh [--on-device]" >&2
    exit 2
    ;;
esac
