#!/usr/bin/env bash
# What the interposer costs per allocation: N cuMemAlloc + cuMemFree pairs of 4 KiB through it
# (conversion: the caller's stack searched for a listed library, the allocation recorded) against
# the CPU-only libcuda double's own cuMemAllocManaged without it, in one run, three rounds.
#   scripts/bench-alloc.sh [pairs]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --locked -q -p mqfq-cuda-hook
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
cc -shared -fPIC -O1 -Wl,-Bsymbolic-functions -o "$d/libcuda.so.1" tests/doubles/cuda.c
cc -shared -fPIC -O1 -o "$d/libnccl.so.2" tests/doubles/commlib.c -L"$d" -l:libcuda.so.1
cc -O1 -o "$d/ipc_client" tests/doubles/ipc_client.c -L"$d" -l:libcuda.so.1 -l:libnccl.so.2 \
    -Wl,-rpath,"$d" -ldl
mkdir -p "$d/ctl"
n=${1:-20000}
for round in 1 2 3; do
    base=$("$d/ipc_client" allocbench "$n" managed | awk '{print $2}')
    with=$(LD_PRELOAD="$PWD/target/release/libmqfq_cuda.so" MQFQ_CTL_DIR="$d/ctl" \
        "$d/ipc_client" allocbench "$n" alloc 2>/dev/null | awk '{print $2}')
    echo "round $round: double alone ${base} ns/pair, through the interposer ${with} ns/pair"
done
