#!/usr/bin/env bash
# Fetches an old glibc userland — Debian 11's libc6 and libc-bin 2.31 — from Debian's archive
# (the mirror this machine's own apt sources name), checks the pinned hashes, and extracts it
# (no system change) under $MQFQ_TOOLS/glibc-2.31, whose path it prints. The interposer test
# runs a program of that release with its own loader and the interposer preloaded.
set -euo pipefail
MQFQ_TOOLS=${MQFQ_TOOLS:-$HOME/.cache/mqfq-tools}
VERSION=2.31-13+deb11u11
declare -A SHA256=(
    [libc6]=05f7264da867b37f4c5ce49266b558ea1e81e05a9464f623152fca70f3550282
    [libc-bin]=f6335f60b75d564649ad2bb8f5f46900c3f3908ce6b7aff9f226620e96e0eba6
)
root="$MQFQ_TOOLS/glibc-2.31"
if [ -e "$root/lib/x86_64-linux-gnu/ld-2.31.so" ] && [ -x "$root/usr/bin/iconv" ]; then
    echo "$root"
    exit 0
fi
mirror=$("$(dirname "$0")/debian-mirror.sh") || { echo "fetch-old-glibc: cannot fetch without it" >&2; exit 1; }
dl=$(mktemp -d)
trap 'rm -rf "$dl"' EXIT
rm -rf "$root.tmp"
mkdir -p "$root.tmp"
for pkg in libc6 libc-bin; do
    deb="${pkg}_${VERSION}_amd64.deb"
    curl -fsSL --retry 2 -o "$dl/$deb" "$mirror/pool/main/g/glibc/$deb"
    echo "${SHA256[$pkg]}  $dl/$deb" | sha256sum -c --quiet -
    dpkg-deb -x "$dl/$deb" "$root.tmp"
done
rm -rf "$root"
mv "$root.tmp" "$root"
echo "$root"
