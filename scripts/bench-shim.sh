#!/usr/bin/env bash
# `ctr run --rm` through containerd-shim-mqfq-v2 vs io.containerd.runc.v2 (release build,
# alternating, N runs each, one throwaway containerd), and each shim's RSS. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
n=${1:-30}
cargo build --release --locked -q -p mqfq-shim -p mqfq-daemon -p mqfq-testkit
target/release/bench-ctr-run "$PWD/target/release" "$n"
