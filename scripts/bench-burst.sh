#!/usr/bin/env bash
# What burst admission adds to a CUDA launch: the first of a burst (the interposer asks its
# shim, the shim asks mqfqd; uncontended) and every later one, against the same client without
# the interposer, through ctr (release build, one throwaway containerd, CPU-only libcuda
# double). Needs root.   scripts/bench-burst.sh [bursts] [calls per burst]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --locked -q -p mqfq-shim -p mqfq-daemon -p mqfq-testkit -p mqfq-cuda-hook
target/release/bench-burst "$PWD/target/release" "${1:-300}" "${2:-2000}"
