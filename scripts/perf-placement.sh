#!/usr/bin/env bash
# Regenerates the placement figures of docs/PERFORMANCE.md §1b: mqfq-sticky on a heterogeneous
# node (an A30 and an H100) under each placement — fitness (scheduler-core's, what mqfqd runs),
# least-loaded (the node core's routing), round-robin, random — on the design mix with half of
# each kind's functions memory-bound, with the H100 at the simulator's 24 GB and at its own 80 GB;
# then four heterogeneous nodes, each invocation's node
# picked by mqfq's extender (from what the nodes published), round-robin or at random, with the
# nodes' API writes per minute. Prints Markdown.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --locked -q -p mqfq-sim
sim=target/release/mqfq-sim
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
models="NVIDIA A30,NVIDIA H100 80GB HBM3"

# The design mix on two A30s' worth of load $1, seed $2, into $tmp/h.csv.
gen() {
    "$sim" gen mix --gpus 2 --load "$1" --memory-bound 0.5 --duration-s 1800 --seed "$2" \
        --out "$tmp/h.csv" 2>/dev/null
}

# Seed 1 at each load, every placement, the H100 with $1 MB.
seed1_tables() {
    for load in 0.8 1.2 1.6; do
        gen "$load" 1
        echo "Load $load (of two A30s' capacity), H100 $(($1 / 1024)) GB:"
        echo
        "$sim" placements --trace "$tmp/h.csv" --gpus 2 --gpu-models "$models" \
            --gpu-mems-mb "24576,$1" | tail -n +3
        echo
    done
}

echo "### Placement on an A30 + H100 node, seed 1"
echo
echo '`mqfq-sim gen mix --gpus 2 --load L --memory-bound 0.5 --duration-s 1800 --seed 1 --out het.csv`'
echo "\`mqfq-sim placements --trace het.csv --gpus 2 --gpu-models \"$models\"\`"
echo
seed1_tables 24576
echo "### The H100 with its own 80 GB, seed 1"
echo
echo "Above, both GPUs have the simulator's 24 GB; here the H100 has the 80 GB of the real part"
echo "(\`--gpu-mems-mb 24576,81920\`), so the trace's functions fit on it without eviction."
echo
seed1_tables 81920
echo "### Seeds 1-3: least-loaded and round-robin against fitness (mean / std of completion time)"
echo
echo "| load | seed | H100 memory | least-loaded mean / fitness | least-loaded std / fitness | round-robin mean / fitness | round-robin std / fitness |"
echo "|---|---|---|---|---|---|---|"
for load in 0.8 1.2 1.6; do
    for seed in 1 2 3; do
        gen "$load" "$seed"
        for mem in 24576 81920; do
            out=$("$sim" placements --trace "$tmp/h.csv" --gpus 2 --gpu-models "$models" \
                --gpu-mems-mb "24576,$mem")
            ll=$(echo "$out" | grep '^| least-loaded |' | awk -F'|' '{print $9" |"$10}')
            rr=$(echo "$out" | grep '^| round-robin |' | awk -F'|' '{print $9" |"$10}')
            echo "| $load | $seed | $((mem / 1024)) GB |$ll |$rr |"
        done
    done
done
echo
echo "### Seed 1: fitness under other weights (mean / std of completion time, s)"
echo
echo '`mqfq-sim placements --trace het.csv --gpus 2 --gpu-models "..." --placement-weights W`'
echo
echo "| load | defaults | queue=2 | queue=4 | balance=0 | fitness=0,queue=1,balance=0 | least-loaded |"
echo "|---|---|---|---|---|---|---|"
for load in 0.8 1.2 1.6; do
    gen "$load" 1
    row="| $load |"
    for w in "" "queue=2" "queue=4" "balance=0" "fitness=0,queue=1,balance=0"; do
        out=$("$sim" placements --trace "$tmp/h.csv" --gpus 2 --gpu-models "$models" \
            ${w:+--placement-weights "$w"})
        row="$row$(echo "$out" | grep '^| fitness |' | awk -F'|' '{print $3" /"$5" |"}')"
    done
    row="$row$(echo "$out" | grep '^| least-loaded |' | awk -F'|' '{print $3" /"$5" |"}')"
    echo "$row"
done
echo
echo "### Seed 1: with GPM (utilization = SM activity, as on Hopper), mean / std of completion time, s"
echo
echo '`mqfq-sim placements --trace het.csv --gpus 2 --gpu-models "..." --gpm`'
echo
echo "| load | fitness | least-loaded | fitness GPU busy | least-loaded GPU busy |"
echo "|---|---|---|---|---|"
for load in 0.8 1.2 1.6; do
    gen "$load" 1
    out=$("$sim" placements --trace "$tmp/h.csv" --gpus 2 --gpu-models "$models" --gpm)
    f=$(echo "$out" | grep '^| fitness |' | awk -F'|' '{print $3" /"$5"|"$7}')
    l=$(echo "$out" | grep '^| least-loaded |' | awk -F'|' '{print $3" /"$5"|"$7}')
    echo "| $load | ${f%%|*} | ${l%%|*} | ${f##*|} | ${l##*|} |"
done
echo
echo "### Cluster: four nodes of two GPUs (A30, H100, L4, H200 nodes), seed 1"
echo
cmodels="NVIDIA A30,NVIDIA A30,NVIDIA H100 80GB HBM3,NVIDIA H100 80GB HBM3,NVIDIA L4,NVIDIA L4,NVIDIA H200,NVIDIA H200"
echo '`mqfq-sim gen mix --gpus 8 --load L --memory-bound 0.5 --duration-s 900 --seed 1 [--burst 4] --out c.csv`'
echo "\`mqfq-sim cluster --trace c.csv --gpus 8 --nodes 4 --gpu-models \"$cmodels\"\`"
echo
for shape in "steady:1" "bursty:4"; do
    name=${shape%%:*}
    burst=${shape##*:}
    for load in 0.8 1.2; do
        "$sim" gen mix --gpus 8 --load "$load" --memory-bound 0.5 --duration-s 900 --seed 1 \
            --burst "$burst" --out "$tmp/c.csv" 2>/dev/null
        echo "Load $load (of eight A30s' capacity), $name arrivals (--burst $burst):"
        echo
        "$sim" cluster --trace "$tmp/c.csv" --gpus 8 --nodes 4 --gpu-models "$cmodels" | tail -n +3
        echo
    done
done
