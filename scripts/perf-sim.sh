#!/usr/bin/env bash
# Regenerates the simulator figures of docs/PERFORMANCE.md: the headline comparison on the
# design-style mix (with its CDF plot), the three profiles, and a sweep over load, burstiness
# and seeds. Prints Markdown.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --locked -q -p mqfq-sim
sim=target/release/mqfq-sim
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "### Headline: design-style mix, load 0.8, 30 min, seed 1, profile balanced"
echo
echo '`mqfq-sim gen mix --load 0.8 --duration-s 1800 --seed 1 --out mix.csv`'
echo '`mqfq-sim compare --trace mix.csv --plot docs/img/cdf-mix.svg --plot-d docs/img/d-mix.svg`'
echo
"$sim" gen mix --load 0.8 --duration-s 1800 --seed 1 --out "$tmp/mix.csv" 2>/dev/null
mkdir -p docs/img
"$sim" compare --trace "$tmp/mix.csv" --plot docs/img/cdf-mix.svg --plot-d docs/img/d-mix.svg \
    2>/dev/null | tail -n +3
echo
echo "### Profiles on the same trace (mqfq-sticky only)"
echo
echo "| profile | mean s | p99 s | short mean s | Jain | vs fcfs mean / p99 / short | vs mqfq-paper mean / p99 / short |"
echo "|---|---|---|---|---|---|---|"
for p in light balanced throughput; do
    out=$("$sim" compare --trace "$tmp/mix.csv" --profile "$p" 2>/dev/null)
    row=$(echo "$out" | grep '^| mqfq-sticky |' | awk -F'|' '{print $3"|"$5"|"$6"|"$8}')
    f=$(echo "$out" | grep '^mqfq-sticky / fcfs' | sed -E 's/.*mean ([0-9.]+)×, p99 ([0-9.]+)×, short-function mean ([0-9.]+)×.*/\1 \/ \2 \/ \3/')
    q=$(echo "$out" | grep '^mqfq-sticky / mqfq-paper' | sed -E 's/.*mean ([0-9.]+)×, p99 ([0-9.]+)×, short-function mean ([0-9.]+)×.*/\1 \/ \2 \/ \3/')
    echo "| $p |$row| $f | $q |"
done
echo
echo "### Ablation on the same trace: what each of our changes buys (balanced profile)"
echo
echo "| variant | flags | mean s | p99 s | short mean s | Jain |"
echo "|---|---|---|---|---|---|"
ablate() {
    row=$("$sim" compare --trace "$tmp/mix.csv" "${@:3}" 2>/dev/null | grep '^| mqfq-sticky |' | awk -F'|' '{print $3"|"$5"|"$6"|"$8}')
    echo "| $1 | \`$2\` |$row|"
}
ablate "mqfq-sticky as built" "(none)"
ablate "short-slot reserve off" "--short-charge-s 0" --short-charge-s 0
ablate "published T = 5 s" "--overrun-s 5" --overrun-s 5
ablate "D_max = 2 (of which one reserved)" "--d-max 2" --d-max 2
echo
echo "### What moves D: NVML busy-time against measured interference (issue 15)"
echo
echo "Same trace, then the same mix at loads 0.9 and 1.0 (seed 1); \`--d-law busy-time\` runs the published law on"
echo "NVML busy-time, \`--gpm\` adds SM activity (a Hopper-class GPU) to ours."
echo
echo "| load | controller | flags | fcfs mean / p99 s | fcfs mean limit | mqfq-sticky mean / p99 / short s | mqfq-sticky mean limit | mqfq-sticky GPU busy |"
echo "|---|---|---|---|---|---|---|---|"
"$sim" compare --trace "$tmp/mix.csv" --d-law busy-time --plot-d docs/img/d-mix-busy-time.svg \
    >/dev/null 2>&1
for load in 0.8 0.9 1.0; do
    if [ "$load" != 0.8 ]; then
        "$sim" gen mix --load "$load" --duration-s 1800 --seed 1 --out "$tmp/mix.csv" 2>/dev/null
    fi
    for c in "interference (mqfqd)|" "interference + GPM|--gpm" "busy-time law|--d-law busy-time"; do
        name=${c%%|*}
        flags=${c#*|}
        # shellcheck disable=SC2086
        out=$("$sim" compare --trace "$tmp/mix.csv" $flags 2>/dev/null)
        f=$(echo "$out" | grep '^| fcfs |' | awk -F'|' '{print $3" / "$5"|"$11}')
        m=$(echo "$out" | grep '^| mqfq-sticky |' | awk -F'|' '{print $3" / "$5" / "$6"|"$11"|"$9}')
        echo "| $load | $name | \`${flags:-(none)}\` |$f|$m|"
    done
done
"$sim" gen mix --load 0.8 --duration-s 1800 --seed 1 --out "$tmp/mix.csv" 2>/dev/null
echo
echo "### The slowdown target on the headline trace"
echo
echo "| slowdown_target | fcfs mean / p99 s | fcfs mean limit | mqfq-sticky mean / p99 / short s | mqfq-sticky mean limit |"
echo "|---|---|---|---|---|"
for t in 1.2 1.5 2 3; do
    out=$("$sim" compare --trace "$tmp/mix.csv" --slowdown-target "$t" 2>/dev/null)
    f=$(echo "$out" | grep '^| fcfs |' | awk -F'|' '{print $3" / "$5"|"$11}')
    m=$(echo "$out" | grep '^| mqfq-sticky |' | awk -F'|' '{print $3" / "$5" / "$6"|"$11}')
    echo "| $t |$f|$m|"
done
echo
echo "### Memory pressure: 40 functions whose footprints add up to 2× and 3× the GPU's memory, load 0.8"
echo
echo '`mqfq-sim gen mix --functions 40 --memory-factor F --load 0.8 --duration-s 1800 --seed S --out mp.csv`'
echo
echo "| memory factor | seed | fcfs mean / p99 s | mqfq-sticky mean / p99 / short s | mean / fcfs | p99 / fcfs | short / fcfs | GPU busy fcfs / ours |"
echo "|---|---|---|---|---|---|---|---|"
for f in 2 3; do
    for seed in 1 2 3; do
        "$sim" gen mix --functions 40 --memory-factor "$f" --load 0.8 --duration-s 1800 --seed "$seed" \
            --out "$tmp/mp.csv" 2>/dev/null
        out=$("$sim" compare --trace "$tmp/mp.csv" 2>/dev/null)
        fl=$(echo "$out" | grep '^| fcfs |')
        ml=$(echo "$out" | grep '^| mqfq-sticky |')
        fr=$(echo "$fl" | awk -F'|' '{print $3" / "$5}')
        mr=$(echo "$ml" | awk -F'|' '{print $3" / "$5" / "$6}')
        r=$(echo "$out" | grep '^mqfq-sticky / fcfs' | sed -E 's/.*mean ([0-9.]+)×, p99 ([0-9.]+)×, short-function mean ([0-9.]+)×.*/\1 | \2 | \3/')
        b=$(echo "$fl" | awk -F'|' '{print $9}')" /"$(echo "$ml" | awk -F'|' '{print $9}')
        echo "| $f | $seed |$fr |$mr | $r |$b |"
    done
done
echo
echo "### Sweep: ratios of mqfq-sticky (balanced) to fcfs and to mqfq-paper"
echo
echo "| load | burst | seed | mean / fcfs | p99 / fcfs | short / fcfs | mean / paper | p99 / paper | short / paper |"
echo "|---|---|---|---|---|---|---|---|---|"
for load in 0.5 0.7 0.8 0.9; do
    for burst in 1 4; do
        for seed in 1 2 3; do
            "$sim" gen mix --load "$load" --burst "$burst" --seed "$seed" --duration-s 1800 \
                --out "$tmp/s.csv" 2>/dev/null
            out=$("$sim" compare --trace "$tmp/s.csv" 2>/dev/null)
            f=$(echo "$out" | grep '^mqfq-sticky / fcfs' | sed -E 's/.*mean ([0-9.]+)×, p99 ([0-9.]+)×, short-function mean ([0-9.]+)×.*/\1 | \2 | \3/')
            q=$(echo "$out" | grep '^mqfq-sticky / mqfq-paper' | sed -E 's/.*mean ([0-9.]+)×, p99 ([0-9.]+)×, short-function mean ([0-9.]+)×.*/\1 | \2 | \3/')
            echo "| $load | $burst | $seed | $f | $q |"
        done
    done
done
