#!/usr/bin/env bash
# Builds what tests/gpu/run.sh needs into gpu-bin/ (release binaries, the simulator, ctxbench,
# uvmbench, compatcheck, concbench, lifecheck, ckptbench and ckptcompat), small enough to carry to a GPU machine that has no Rust
# toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --locked -q -p mqfq-shim -p mqfq-daemon -p mqfq-testkit -p mqfq-cuda-hook \
    -p mqfq-sim
mkdir -p gpu-bin
cp target/release/{mqfqd,mqfqctl,containerd-shim-mqfq-v2,mqfq-demo,libmqfq_cuda.so,mqfq-sim} gpu-bin/
strip gpu-bin/* 2>/dev/null || true
cc -O2 -o gpu-bin/ctxbench tests/gpu/ctxbench.c -ldl
cc -O2 -o gpu-bin/uvmbench tests/gpu/uvmbench.c -ldl
cc -O2 -o gpu-bin/compatcheck tests/gpu/compatcheck.c -ldl
cc -O2 -o gpu-bin/concbench tests/gpu/concbench.c -ldl -lpthread
cc -O2 -o gpu-bin/lifecheck tests/gpu/lifecheck.c -ldl -lpthread
cc -O2 -o gpu-bin/ckptbench tests/gpu/ckptbench.c -ldl
cc -O2 -o gpu-bin/ckptcompat tests/gpu/ckptcompat.c -ldl
du -sh gpu-bin
