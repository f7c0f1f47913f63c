#!/usr/bin/env bash
# Supply-chain check: cargo-deny 0.20.2 (pinned, cached under $MQFQ_TOOLS) over deny.toml —
# licences, banned crates and duplicate versions, sources. Offline once the crates are fetched
# (`cargo fetch` brings every platform's, which cargo metadata needs).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
MQFQ_TOOLS=${MQFQ_TOOLS:-$HOME/.cache/mqfq-tools}
if ! "$MQFQ_TOOLS/bin/cargo-deny" --version 2>/dev/null | grep -q " 0.20.2"; then
    cargo install --quiet --locked cargo-deny@0.20.2 --no-default-features --root "$MQFQ_TOOLS"
fi
cargo fetch --locked --quiet
"$MQFQ_TOOLS/bin/cargo-deny" --offline check --hide-inclusion-graph licenses bans sources
