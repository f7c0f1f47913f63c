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
cargo test --workspace --locked
echo "== benchmarks compile"
cargo bench --workspace --locked --no-run
