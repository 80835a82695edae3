#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine and runs the whole test suite.
# Tests that need root (the kernel as oracle) or a GPU say so and skip visibly.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo build --release --workspace --bins --lib
# --show-output keeps what passing tests printed, so that a test which returned early for
# want of a GPU, root or a tool (and said so) is counted here, not only as passed.
cargo test --release --workspace --no-fail-fast -- --show-output 2>&1 | tee target/test.log
echo
echo "skipped at run time, all or part (their own words):"
awk '/^---- .* stdout ----$/ { name = $2; said = 0; next }
     /^(successes|failures):$/ { name = "" }
     name != "" && !said && /([Ss]kipp(ed|ing)|SKIPPED)/ && !/[0-9]+ skipped/ { said = 1; n++; print "  " name ": " substr($0, 1, 200) }
     END { printf "%d tests\n", n + 0 }' target/test.log | tee target/skipped.log
echo
echo "summary:"
grep -E '^test result:' target/test.log | awk '{p+=$4; f+=$6; i+=$8} END {printf "%d passed, %d failed, %d skipped (ignored)\n", p, f, i}'
echo "of the passed, $(tail -1 target/skipped.log) skipped all or part of their checks at run time (listed above)"
echo
# The user guide builds and its links resolve.
./scripts/docs-check.sh
# A short run of each fuzz target over its committed corpus (fuzz/README.md).
./scripts/fuzz-smoke.sh
