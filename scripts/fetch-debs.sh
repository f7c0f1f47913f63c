#!/usr/bin/env bash
# Fetches Debian packages by pool path from the mirror this machine's apt sources name, checks
# each pinned hash and extracts them all (no change to apt or to installed packages) into DIR,
# which is kept while its .version is TAG. Prints DIR.
#   scripts/fetch-debs.sh DIR TAG POOL_PATH SHA256 [POOL_PATH SHA256 ...]
set -euo pipefail
[ $# -ge 4 ] && [ $(( ($# - 2) % 2 )) = 0 ] || { echo "usage: $0 DIR TAG (POOL_PATH SHA256)..." >&2; exit 2; }
dir=$1 tag=$2
shift 2
if [ -f "$dir/.version" ] && [ "$(cat "$dir/.version")" = "$tag" ]; then
    echo "$dir"
    exit 0
fi
mirror=$("$(dirname "$0")/debian-mirror.sh") || { echo "fetch-debs: cannot fetch without it" >&2; exit 1; }
dl=$(mktemp -d)
trap 'rm -rf "$dl"' EXIT
rm -rf "$dir.tmp" "$dir"
mkdir -p "$dir.tmp"
while [ $# -gt 0 ]; do
    deb="$dl/$(basename "$1")"
    curl -fsSL --retry 2 -o "$deb" "$mirror/$1"
    echo "$2  $deb" | sha256sum -c --quiet -
    dpkg-deb -x "$deb" "$dir.tmp"
    shift 2
done
echo "$tag" > "$dir.tmp/.version"
mv "$dir.tmp" "$dir"
echo "$dir"
