#!/usr/bin/env bash
# Writes the Kubernetes manifests with the mqfq-shim image pinned by digest:
#   scripts/pin-image.sh <registry>/mqfq-shim@sha256:<64 hex digits> <output directory>
# The manifests in packaging/kubernetes name the image by tag (mqfq-shim:0.1.0), which a registry
# may move: the node installer runs it privileged on every GPU node, so apply what this writes
# instead. A reference without a digest is refused; so is a manifest naming any other image.
set -euo pipefail
if [ $# -ne 2 ]; then
    echo "usage: scripts/pin-image.sh <image>@sha256:<digest> <output directory>" >&2
    exit 2
fi
ref=$1
out=$(realpath -m "$2")
if ! [[ $ref =~ ^[a-z0-9]([a-z0-9._/:-]*[a-z0-9])?@sha256:[0-9a-f]{64}$ ]]; then
    echo "pin-image.sh: '$ref' is not an image pinned by digest (<name>@sha256:<64 hex digits>)" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
tagged='mqfq-shim:0.1.0'
# The output holds node/ and cluster/ only: a directory with anything else in it is refused, never
# emptied. Written beside it first, moved into place only when every file is right.
if [ -e "$out" ] && [ -n "$(find "$out" -mindepth 1 -maxdepth 1 ! -name node ! -name cluster)" ]; then
    echo "pin-image.sh: $out holds more than node/ and cluster/: give a new or empty directory" >&2
    exit 2
fi
mkdir -p "$out"
work=$(mktemp -d "$out/.pin-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/node" "$work/cluster"
for part in node cluster; do
    for f in packaging/kubernetes/$part/*.yaml; do
        others=$(grep -E '^[[:space:]-]*image:' "$f" | grep -vE "^[[:space:]-]*image: $tagged\$" || true)
        if [ -n "$others" ]; then
            echo "pin-image.sh: $f names an image other than $tagged: $others" >&2
            exit 1
        fi
        sed "s|image: $tagged\$|image: $ref|" "$f" > "$work/$part/$(basename "$f")"
    done
done
if grep -rqF "$tagged" "$work"; then
    echo "pin-image.sh: $tagged left in the output" >&2
    exit 1
fi
rm -rf "$out/node" "$out/cluster"
mv "$work/node" "$work/cluster" "$out/"
rmdir "$work"
trap - EXIT
echo "$out"
