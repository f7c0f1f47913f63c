#!/usr/bin/env bash
# Resume of a pooled GPU container (Hot, and Warm: evicted by mqfqd, restored by the shim) vs a
# runc-v2 resume, through ctr (release build, one throwaway containerd, CPU-only libcuda double:
# the control path, not PCIe). Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
n=${1:-20}
cargo build --release --locked -q -p mqfq-shim -p mqfq-daemon -p mqfq-testkit -p mqfq-cuda-hook
target/release/bench-pool "$PWD/target/release" "$n"
