#!/usr/bin/env bash
# Build tools the interposer's portable build needs, pinned and checked, cached under
# $MQFQ_TOOLS (default ~/.cache/mqfq-tools); nothing is installed system-wide.
#   - zig 0.17.0, from PyPI's ziglang wheel (sha256 pinned), as the linker: it links against
#     stub C libraries of any glibc version, so the interposer can load into old images;
#   - cargo-zigbuild 0.24.1, which drives cargo with it: its maintainer's binary from PyPI's
#     cargo-zigbuild wheel (sha256 pinned), not compiled here (a fresh CI machine's minutes).
# Source it; it exports ZIG and puts cargo-zigbuild on PATH.
set -euo pipefail
MQFQ_TOOLS=${MQFQ_TOOLS:-$HOME/.cache/mqfq-tools}
ZIG_VERSION=0.17.0
ZIG_WHEEL_SHA256=97079827064a7492cce5541ceb438ae8003ce1e54e399676da2d62fb7a5dc08b
ZIGBUILD_VERSION=0.24.1
ZIGBUILD_WHEEL_SHA256=238a1ab54a95053a4eadc34775c81f795a8ad75f80bfed63f3f445f518102375
mkdir -p "$MQFQ_TOOLS"
ZIG="$MQFQ_TOOLS/zig-$ZIG_VERSION/ziglang/zig"
if [ ! -x "$ZIG" ]; then
    dl=$(mktemp -d)
    printf 'ziglang==%s --hash=sha256:%s\n' "$ZIG_VERSION" "$ZIG_WHEEL_SHA256" > "$dl/req.txt"
    python3 -m pip download --quiet --no-deps --only-binary=:all: --require-hashes \
        --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 \
        -r "$dl/req.txt" -d "$dl"
    rm -rf "$MQFQ_TOOLS/zig-$ZIG_VERSION"
    mkdir -p "$MQFQ_TOOLS/zig-$ZIG_VERSION"
    python3 -m zipfile -e "$dl"/ziglang-*.whl "$MQFQ_TOOLS/zig-$ZIG_VERSION"
    chmod +x "$ZIG"
    rm -rf "$dl"
fi
export ZIG
export CARGO_ZIGBUILD_ZIG_PATH="$ZIG"
export PATH="$MQFQ_TOOLS/bin:$PATH"
if ! cargo-zigbuild --version 2>/dev/null | grep -q " $ZIGBUILD_VERSION"; then
    dl=$(mktemp -d)
    printf 'cargo-zigbuild==%s --hash=sha256:%s\n' "$ZIGBUILD_VERSION" "$ZIGBUILD_WHEEL_SHA256" > "$dl/req.txt"
    python3 -m pip download --quiet --no-deps --only-binary=:all: --require-hashes \
        --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -r "$dl/req.txt" -d "$dl"
    python3 -m zipfile -e "$dl"/cargo_zigbuild-*.whl "$dl/x"
    mkdir -p "$MQFQ_TOOLS/bin"
    install -m 0755 "$dl/x/cargo_zigbuild-$ZIGBUILD_VERSION.data/scripts/cargo-zigbuild" "$MQFQ_TOOLS/bin/"
    rm -rf "$dl"
    cargo-zigbuild --version | grep -q " $ZIGBUILD_VERSION"
fi
