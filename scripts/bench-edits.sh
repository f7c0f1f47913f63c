#!/usr/bin/env bash
# Shim time per GPU container to apply the cached NVIDIA edits vs an empty hook process per
# container (release build; N containers, default 1000).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
N=${1:-1000} cargo bench --locked -q -p mqfq-shim --bench edits
