#!/usr/bin/env bash
# Builds the CUDA interposer so that it loads into images with a glibc as old as 2.17 (linked
# against glibc 2.17's symbol versions through zig; see scripts/tools.sh) and prints its path:
#   target/x86_64-unknown-linux-gnu/release/libmqfq_cuda.so
# Install that file as /usr/lib/mqfq/libmqfq_cuda.so (hooks/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
# shellcheck source=scripts/tools.sh
source scripts/tools.sh
cargo zigbuild --quiet --locked --release -p mqfq-cuda-hook --lib \
    --target x86_64-unknown-linux-gnu.2.17 >&2
echo "$PWD/target/x86_64-unknown-linux-gnu/release/libmqfq_cuda.so"
