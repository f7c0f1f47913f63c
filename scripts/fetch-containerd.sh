#!/usr/bin/env bash
# Fetches containerd of another release line from Debian's archive — 1.7.24 (trixie) or 2.1.9
# (forky / sid) — from the mirror this machine's apt sources name, checks the pinned hash and
# extracts it (no change to apt or to installed packages) under $MQFQ_TOOLS/containerd-<line>,
# whose bin directory (containerd, ctr, containerd-shim-runc-v2) it prints. The test kit runs
# that containerd when MQFQ_CONTAINERD_DIR names the directory. Debian 12's runc is kept (sid's
# needs a newer glibc).
#   scripts/fetch-containerd.sh 1.7|2.1
set -euo pipefail
MQFQ_TOOLS=${MQFQ_TOOLS:-$HOME/.cache/mqfq-tools}
case "${1:-}" in
    1.7) version=1.7.24~ds1-6+deb13u1
         sha256=ed708deb96fe476a3bce4efa5c0538dfbcf717ab9a7c7944ba7260342c25899c ;;
    2.1) version=2.1.9+ds1-5
         sha256=2dda86ce7033fd612fc50e136679d8174ccad680eb29cd4611e0d2a1b84cf591 ;;
    *) echo "usage: $0 1.7|2.1" >&2; exit 2 ;;
esac
dir=$("$(dirname "$0")/fetch-debs.sh" "$MQFQ_TOOLS/containerd-$1" "$version" \
    "pool/main/c/containerd/containerd_${version}_amd64.deb" "$sha256")
echo "$dir/usr/bin"
