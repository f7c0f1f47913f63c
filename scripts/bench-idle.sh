#!/usr/bin/env bash
# What the burst idle time trades (bursts per request, request time, slot time held while the
# GPU idles), for several MQFQ_BURST_IDLE_MS values, through ctr on the CPU-only libcuda double
# (release build, a throwaway containerd and mqfqd per value). Needs root.
#   scripts/bench-idle.sh [requests] [pause mean µs] [idle ms list]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --locked -q -p mqfq-shim -p mqfq-daemon -p mqfq-testkit -p mqfq-cuda-hook
target/release/bench-idle "$PWD/target/release" "${1:-40}" "${2:-1000}" "${3:-1,2,5,10,20}"
