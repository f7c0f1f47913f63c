#!/usr/bin/env bash
# Installs what building and testing mqfq-shim needs on Debian 12. Idempotent; safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
# containerd, runc, busybox-static: the shim's integration tests start a real containerd;
# protobuf-compiler: the CRI test's client (k8s-cri) compiles the CRI protos;
# python3-pip: fetches the pinned zig toolchain for the portable interposer (scripts/tools.sh);
# containernetworking-plugins, iproute2: the CRI tests' pods get network namespaces of their own
# on a bridge (in a network namespace made for their containerd); lintian checks the package;
# openssl makes the certificates the extender's TLS tests use; qemu-user and libc6-arm64-cross
# run the aarch64 interposer (shim/runtime/tests/interposer_glibc.rs) on an aarch64 glibc, emulated.
for pkg in build-essential pkg-config ca-certificates curl git containerd runc busybox-static \
    protobuf-compiler python3 python3-pip containernetworking-plugins iproute2 lintian openssl \
    qemu-user libc6-arm64-cross; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "deps: missing ${need_apt[*]}; run as root (sudo) to install them" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

export PATH="$HOME/.cargo/bin:$PATH"
# The toolchain CI uses is pinned (rust-toolchain.toml), with its components and targets.
pinned=$(sed -n 's/^channel = "\(.*\)"[[:space:]]*$/\1/p' rust-toolchain.toml)
if [ -z "$pinned" ]; then
    echo "deps: no channel = \"…\" line in rust-toolchain.toml" >&2
    exit 1
fi
if ! command -v rustup >/dev/null 2>&1 && ! command -v cargo >/dev/null 2>&1; then
    # Debian 12's own rustc (1.63) is too old for this workspace (edition 2024): use rustup.
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal \
        --default-toolchain "$pinned" --component clippy,rustfmt
fi
if ! rustup run "$pinned" cargo --version >/dev/null 2>&1; then
    rustup toolchain install "$pinned" --profile minimal --component clippy,rustfmt \
        --target aarch64-unknown-linux-gnu
fi
for comp in clippy rustfmt; do
    if ! cargo "${comp/rustfmt/fmt}" --version >/dev/null 2>&1; then
        rustup component add "$comp"
    fi
done
# The interposer is also built for aarch64 (scripts/build-interposer.sh aarch64): its std.
if ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
    rustup target add aarch64-unknown-linux-gnu
fi
