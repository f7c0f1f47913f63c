#!/usr/bin/env bash
# Fetches Docker Engine 26.1 (dockerd and the docker CLI) from Debian 13's packages docker.io and
# docker-cli, pinned by version and hash, and extracts them under $MQFQ_TOOLS/docker-26.1 (no
# change to apt or to installed packages); prints that directory (usr/sbin/dockerd, usr/bin/docker).
# They run on Debian 12 (glibc 2.34 and libsystemd0 are all they link). shim/runtime/tests/docker.rs
# runs dockerd from there against a private containerd when MQFQ_DOCKER_DIR names it.
set -euo pipefail
MQFQ_TOOLS=${MQFQ_TOOLS:-$HOME/.cache/mqfq-tools}
version=26.1.5+dfsg1-9+deb13u1+b1
dir=$("$(dirname "$0")/fetch-debs.sh" "$MQFQ_TOOLS/docker-26.1" "$version" \
    "pool/main/d/docker.io/docker.io_${version}_amd64.deb" \
    53ae1a99f15113f0a0d2226808ec0d24ee31b3b87b87ab8ec35be09a1a2ee13b \
    "pool/main/d/docker.io/docker-cli_${version}_amd64.deb" \
    596647bc4ffaaaf2e2321116b8a10f6a6086ada797c17a7117798cb391a72776)
echo "$dir"
