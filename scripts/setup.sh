#!/usr/bin/env bash
# Installs what building and testing bpftime needs on Debian 12: LLVM 19 and
# clang-19 (the JIT and the BPF compiler), libbpf 1.1 and bpftool (real loaders),
# bpftrace and bcc's libbpf-tools (tools nobody here wrote, run as a user runs them),
# libelf/zlib for the static libbpf that libbpf-rs builds, <sys/sdt.h> for the USDT
# test target, a JDK (HotSpot's USDT probes, for javagc), and libssl-dev for the TLS
# target of bpftrace's sslsnoop.bt and ssllatency.bt; Node and a pinned trace reader for
# the --trace tests; a sans font for the words of the memory timeline's picture;
# Prometheus and Go's pprof, which read bpftime's metrics and profiles in the tests.
set -euo pipefail

packages=(
    build-essential pkg-config make
    clang-19 llvm-19-dev libpolly-19-dev libzstd-dev zlib1g-dev libelf-dev
    libbpf-dev bpftool bpftrace libbpf-tools systemtap-sdt-dev openjdk-17-jdk-headless libssl-dev
    fonts-dejavu-core
)

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

# Readers of what bpftime writes for other tools, without what Debian recommends beside
# them: Prometheus, which scrapes `bpftime run --metrics` in the metrics test (on a host
# that runs systemd, Debian's package starts its service on :9090; `systemctl disable
# --now prometheus` stops it), and Go, whose `go tool pprof` reads the flame graph's
# pprof profile in its test.
readers=()
command -v prometheus >/dev/null 2>&1 || readers+=(prometheus)
command -v go >/dev/null 2>&1 || readers+=(golang-go)
if [ "${#readers[@]}" -gt 0 ]; then
    echo "setup: installing ${readers[*]} (tests read bpftime's metrics and profiles with them)"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${readers[@]}"
fi

# ptxas, to check generated PTX without a GPU, pinned to the GPU machine's CUDA 13.0
# (with only nvcc pinned, pip takes an nvvm that emits PTX 13.0's ptxas refuses).
ptxas_pins=(nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96)
if ! python3 -m pip show nvidia-cuda-nvcc 2>/dev/null | grep -qx 'Version: 13.0.88'; then
    echo "setup: installing ptxas (${ptxas_pins[*]})"
    python3 -m pip install -q "${ptxas_pins[@]}" ||
        python3 -m pip install -q --break-system-packages "${ptxas_pins[@]}"
fi

# The trace tests read --trace output back with a reader we did not write: Chrome DevTools'
# trace engine, at the version pinned in tests/trace-consumer/package-lock.json, from npm.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "setup: installing nodejs and npm (the trace tests' consumer runs on Node)"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm
fi
consumer=tests/trace-consumer
if [ ! -d "$(dirname "$0")/../$consumer/node_modules/@paulirish/trace_engine" ]; then
    echo "setup: installing the trace consumer (npm ci in $consumer)"
    (cd "$(dirname "$0")/../$consumer" && npm ci --no-audit --no-fund --loglevel=error)
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo is not installed; install Rust (https://rustup.rs) and run this again" >&2
    exit 2
fi

# scripts/fuzz-smoke.sh runs the cargo-fuzz targets under fuzz/ (libFuzzer's C++ is
# built with the compiler build-essential brings).
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "setup: installing cargo-fuzz (cargo install cargo-fuzz --locked)"
    cargo install cargo-fuzz --locked
fi

# scripts/docs-check.sh builds the user guide (docs/) with mdBook.
if ! mdbook --version >/dev/null 2>&1; then
    echo "setup: installing mdbook (cargo install mdbook --locked --version 0.4.52)"
    cargo install mdbook --locked --version 0.4.52
fi
