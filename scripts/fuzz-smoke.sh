#!/usr/bin/env bash
# Builds the cargo-fuzz targets (fuzz/) and runs each for a short while over its
# committed corpus: a crash, a panic, a hang (-timeout) or a runaway allocation
# (-rss_limit_mb) fails the script, with the input left under fuzz/artifacts/.
#
# Stable Rust: cargo-fuzz passes nightly flags (-Zsanitizer, -Cpasses=sancov),
# which stable rustc takes under RUSTC_BOOTSTRAP=1; the address sanitizer's
# runtime ships with the stable toolchain. FUZZ_SECONDS (default 60) sets the
# time per target, FUZZ_SANITIZER (default address) the sanitizer (none is faster).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${FUZZ_SECONDS:-60}
sanitizer=${FUZZ_SANITIZER:-address}
export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz-smoke: cargo-fuzz is missing; scripts/setup.sh installs it (cargo install cargo-fuzz --locked)" >&2
    exit 2
fi
targets=(shim_bpf store_files object_verify)
cargo fuzz build -s "$sanitizer"
for t in "${targets[@]}"; do
    # New inputs go to a scratch directory: the committed corpus is read only.
    scratch=$(mktemp -d)
    echo "fuzz-smoke: $t for ${secs}s over fuzz/corpus/$t"
    if ! cargo fuzz run -s "$sanitizer" "$t" "$scratch" "corpus/$t" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
        2>&1 | tail -n 60; then
        rm -rf "$scratch"
        echo "fuzz-smoke: $t FAILED (input under fuzz/artifacts/$t/)" >&2
        exit 1
    fi
    rm -rf "$scratch"
done
echo "fuzz-smoke: all targets ran ${secs}s without a crash"
