#!/usr/bin/env bash
# Every check CI runs: formatting, lints, all tests, and that the benchmarks build.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"

echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
# The containerd integration tests skip themselves where they cannot run; here they must run.
MQFQ_REQUIRE_CONTAINERD=1 cargo test --workspace --locked
echo "== benchmarks compile (scheduler-core holds the criterion benches)"
cargo bench -p scheduler-core --locked --no-run
