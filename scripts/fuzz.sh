#!/usr/bin/env bash
# Runs every fuzz target (fuzz/) for SECONDS each (default 10; CI's short run), with libFuzzer's
# hang (-timeout) and memory (-rss_limit_mb) limits: a panic, a hang or a memory blow-up fails.
# Short runs (under a minute) use a debug build without AddressSanitizer (it builds in half the
# time, and the parsers are safe Rust); longer runs an optimized build with AddressSanitizer.
# cargo-fuzz 0.13.2 is installed pinned under $MQFQ_TOOLS; it needs nightly flags, which the
# stable toolchain accepts with RUSTC_BOOTSTRAP=1 (AddressSanitizer included).
#   scripts/fuzz.sh [SECONDS] [TARGET…]
# New inputs go to a scratch directory, never into fuzz/corpus (the seeds kept in the repo).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
MQFQ_TOOLS=${MQFQ_TOOLS:-$HOME/.cache/mqfq-tools}
seconds=${1:-10}
shift || true
if ! "$MQFQ_TOOLS/bin/cargo-fuzz" --version 2>/dev/null | grep -q "0.13.2"; then
    cargo install --quiet --locked cargo-fuzz@0.13.2 --root "$MQFQ_TOOLS"
fi
export PATH="$MQFQ_TOOLS/bin:$PATH"
export RUSTC_BOOTSTRAP=1
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cd fuzz && cargo fuzz list)
fi
if [ "$seconds" -lt 60 ]; then
    build=(--dev --sanitizer none)
else
    build=(-O)
fi
(cd fuzz && cargo fuzz build "${build[@]}")
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for t in "${targets[@]}"; do
    mkdir -p "$scratch/$t"
    echo "== fuzz $t (${seconds}s)"
    if ! (cd fuzz && cargo fuzz run "${build[@]}" "$t" "$scratch/$t" "corpus/$t" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$scratch/$t.log" 2>&1); then
        tail -n 60 "$scratch/$t.log"
        echo "fuzz: $t failed (the input is in fuzz/artifacts/$t/)" >&2
        exit 1
    fi
    grep -E '^(Done|stat::peak_rss_mb)' "$scratch/$t.log" || true
done
echo "fuzz: ${#targets[@]} targets, ${seconds}s each: no crash, hang or blow-up"
