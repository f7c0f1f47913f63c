#!/usr/bin/env bash
# The demo: a private containerd with containerd-shim-mqfq-v2, a private mqfqd (a simulated GPU
# when no NVIDIA GPU exists), and a mixed workload of annotated busybox "GPU functions" through
# `ctr`; prints per-function queue wait, latency and fairness, then mqfqctl's view; then the pool
# (paused CUDA containers evicted by mqfqd and restored). Needs root.
# The policy simulator's comparison is `scripts/perf-sim.sh`.
# MQFQ_CONTAINERD=1.7 or 2.1 runs it on that containerd release (fetched from Debian's archive by
# scripts/fetch-containerd.sh) instead of the system's. Run by a user other than root, it runs
# itself again through sudo.
set -euo pipefail
# shellcheck source=scripts/as-root.sh
source "$(dirname "$0")/as-root.sh"
cd "$(dirname "$0")/.."
scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
if [ -n "${MQFQ_CONTAINERD:-}" ]; then
    MQFQ_CONTAINERD_DIR=$(scripts/fetch-containerd.sh "$MQFQ_CONTAINERD")
    export MQFQ_CONTAINERD_DIR
fi
cargo build --release --locked -q -p mqfq-shim -p mqfq-daemon -p mqfq-testkit -p mqfq-cuda-hook
exec target/release/mqfq-demo "$PWD/target/release"
