#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine and runs the whole test suite.
# Tests that need root (the kernel as oracle) or a GPU say so and skip visibly.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo build --release --workspace --bins --lib
cargo test --release --workspace --no-fail-fast 2>&1 | tee target/test.log
echo
echo "summary:"
grep -E '^test result:' target/test.log | awk '{p+=$4; f+=$6; i+=$8} END {printf "%d passed, %d failed, %d skipped\n", p, f, i}'
