#!/usr/bin/env bash
# mqfqd admission latency (uncontended p50/p99) and admitted starts per second, over the real
# ttrpc socket, release build. N calls (default 5000).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
N=${1:-5000} cargo bench --locked -q -p mqfq-daemon --bench admission
