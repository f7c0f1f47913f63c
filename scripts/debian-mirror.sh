#!/usr/bin/env bash
# Prints the Debian mirror named in this machine's apt sources (deb822 or one-line format),
# without a trailing slash, so scripts fetch Debian's packages without a host name in the repo.
set -euo pipefail
mirror=$(
    { grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources || true
      grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list || true
    } | awk '{for (i = 2; i <= NF; i++) if ($i ~ /^https?:\/\//) {print $i; break}}' |
        grep -E '/debian/?$' | head -n1 || true
)
if [ -z "$mirror" ]; then
    echo "no Debian mirror in the apt sources" >&2
    exit 1
fi
echo "${mirror%/}"
