#!/usr/bin/env bash
# The demo. Today: the policy simulator on the design's mixed workload (one A30-class GPU,
# 0.02 s / 2.25 s / 4.48 s functions, 70 % short), comparing every policy and drawing latency
# CDFs. The containerd + mqfqd demo replaces this once the daemon lands (issue 4).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"

out=${OUT_DIR:-out/demo}
mkdir -p "$out"
cargo build --release --locked -q -p mqfq-sim
sim=target/release/mqfq-sim
"$sim" gen mix --load 0.8 --duration-s 1800 --seed 1 --out "$out/mix.csv"
"$sim" compare --trace "$out/mix.csv" --plot "$out/cdf.svg" --json "$out/summary.json"
echo
echo "Latency CDFs: $out/cdf.svg   Per-policy JSON: $out/summary.json"
echo "One policy, per invocation: $sim run --trace $out/mix.csv --policy mqfq-sticky --per-invocation $out/ours.csv"
