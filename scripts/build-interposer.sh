#!/usr/bin/env bash
# Builds the CUDA interposer so that it loads into images with a glibc as old as 2.17 (linked
# against glibc 2.17's symbol versions through zig; see scripts/tools.sh) and prints its path:
#   target/<arch>-unknown-linux-gnu/release/libmqfq_cuda.so
# for the architecture named (x86_64, the default, or aarch64: rustup's target
# aarch64-unknown-linux-gnu must be installed). Install that file as
# /usr/lib/mqfq/libmqfq_cuda.so (hooks/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
arch=${1:-x86_64}
case "$arch" in
    x86_64 | aarch64) ;;
    *) echo "build-interposer.sh: architecture x86_64 or aarch64, not $arch" >&2; exit 2 ;;
esac
# shellcheck source=scripts/tools.sh
source scripts/tools.sh
cargo zigbuild --quiet --locked --release -p mqfq-cuda-hook --lib \
    --target "$arch-unknown-linux-gnu.2.17" >&2
echo "$PWD/target/$arch-unknown-linux-gnu/release/libmqfq_cuda.so"
