#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU (one call, ≤ 9 minutes). Writes everything to
# $OUT (default ./gpu-out): results.txt plus raw files. Each step is guarded: a missing piece is
# recorded as such, never fatal. Binaries come from gpu-bin/ (built beforehand with
# `scripts/gpu-prepare.sh`) or, when cargo is available, by running that script here.
#
# Measures: (1) CUDA context creation in a fresh process, with no other CUDA process and while a
# held primary context keeps the driver warm; (2) mqfqd's discovery and edits against the real
# driver (CDI spec or driver root) and its NVML view; (3) where containerd and runc exist, a GPU
# container created with the cached edits; (4) the CUDA interposer: a real kernel's results kept
# across evict/prefetch, evict/prefetch bandwidth against pinned cuMemcpy, hot and warm restore,
# NVML's per-process memory after an eviction; (5) managed-memory compatibility: what the driver
# answers for managed memory (IPC and dma-buf export, pointer attributes, address range), a
# two-process IPC exchange without the interposer, with it and the native setting, and with it
# by default (the export of converted memory refused, later allocations native), and pointer
# queries on converted memory; (6) load signals and burst cost under 1-8 concurrent invocations;
# (7) the burst monitor beside a stream capture and a context reset (the driver's own rules); (8)
# oversubscribed UVM: fault-driven migration's rate and two processes thrashing; (9) the driver's
# checkpoint API driven from another process (issue 36): lock / checkpoint / restore / unlock of
# 1, 4 and 16 GiB of native memory, against step 4's prefetch of the same bytes, NVML's
# per-process used memory of the application running, checkpointed and restored, and, where GPUs
# 0 and 1 are one model, a restore onto GPU 1 by the driver's GPU pairs; then an IPC export and
# a graph capture left open across a checkpoint (ckptcompat).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
R="$OUT/results.txt"
: > "$R"
say() { echo "$*" | tee -a "$R"; }

say "# mqfq-shim GPU check $(date -u +%FT%TZ) on $(hostname)"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=index,name,uuid,driver_version,persistence_mode,mig.mode.current,memory.total \
        --format=csv | tee -a "$R"
else
    say "nvidia-smi: not found"
fi

BIN=gpu-bin
if [ ! -x "$BIN/mqfqd" ]; then
    if command -v cargo >/dev/null; then
        # The same build as beforehand: every binary below, into gpu-bin/.
        timeout 600 scripts/gpu-prepare.sh > "$OUT/gpu-prepare.txt" 2>&1 ||
            say "gpu-prepare.sh failed: see gpu-prepare.txt"
    fi
fi
[ -x "$BIN/mqfqd" ] || say "mqfqd: no binary (run scripts/gpu-prepare.sh first)"

# (1) Context creation: cold (fresh process; persistence mode as found), then warm (another
# process holds the primary context).
CTX=$BIN/ctxbench
if [ ! -x "$CTX" ] && command -v cc >/dev/null; then
    cc -O2 -o "$OUT/ctxbench" tests/gpu/ctxbench.c -ldl && CTX=$OUT/ctxbench
fi
if [ -x "$CTX" ]; then
    say "## context creation, no other CUDA process (3 runs)"
    for i in 1 2 3; do timeout 60 "$CTX" once 2>&1 | tr '\n' ' ' | tee -a "$R"; echo | tee -a "$R"; done
    timeout 90 "$CTX" hold 40 > "$OUT/holder.txt" 2>&1 &
    HOLDER=$!
    sleep 5
    say "## context creation while a held primary context keeps the driver warm (3 runs)"
    for i in 1 2 3; do timeout 60 "$CTX" once 2>&1 | tr '\n' ' ' | tee -a "$R"; echo | tee -a "$R"; done
    kill "$HOLDER" 2>/dev/null; wait "$HOLDER" 2>/dev/null
else
    say "ctxbench: no binary and no cc"
fi

# (2) Discovery and edits against the real driver, and the NVML view.
if [ -x "$BIN/mqfqd" ]; then
    cat > "$OUT/mqfqd.toml" <<TOML
socket = "$OUT/mqfqd.sock"
metrics_addr = ""
backend = "nvml"
dispatch_log = "$OUT/dispatch.jsonl"
[nvidia]
edits_file = "$OUT/nvidia-edits.json"
TOML
    ls /etc/cdi /var/run/cdi > "$OUT/cdi-dirs.txt" 2>&1
    start=$(date +%s%N)
    "$BIN/mqfqd" --config "$OUT/mqfqd.toml" 2> "$OUT/mqfqd.log" &
    D=$!
    for _ in $(seq 100); do [ -s "$OUT/nvidia-edits.json" ] && break; sleep 0.1; done
    end=$(date +%s%N)
    if [ -s "$OUT/nvidia-edits.json" ]; then
        say "## mqfqd with NVML: edits published $(( (end - start) / 1000000 )) ms after exec (daemon start included)"
    else
        say "## mqfqd with NVML: no edits after 10 s"
    fi
    sleep 2
    "$BIN/mqfqctl" --socket "$OUT/mqfqd.sock" status 2>&1 | head -20 | tee -a "$R"
    "$BIN/mqfqctl" --socket "$OUT/mqfqd.sock" status --json > "$OUT/status.json" 2>&1
    if [ -s "$OUT/nvidia-edits.json" ]; then
        python3 - "$OUT/nvidia-edits.json" <<'PY' | tee -a "$R"
import json, sys
e = json.load(open(sys.argv[1]))
c = e["common"]
print(f"edits: source={e['source']} driver={e['driver_version']} error={e.get('error')}")
print(f"  common: {len(c.get('deviceNodes', []))} device nodes, {len(c.get('mounts', []))} mounts, "
      f"{len(c.get('symlinks', []))} symlinks, hooks not run: {[h['args'][1:2] for h in c.get('hooks', [])]}")
print(f"  devices: {[d['names'] for d in e['devices']]}")
PY
    else
        say "edits: none published (see mqfqd.log)"
    fi
    grep -E "warm driver|page cache|NVIDIA" "$OUT/mqfqd.log" | tee -a "$R"
    # (3) A GPU container with the cached edits, where containerd and runc exist.
    if command -v containerd >/dev/null && command -v runc >/dev/null && [ -x "$BIN/mqfq-demo" ]; then
        say "## containerd present: see demo.txt for GPU containers through the shim"
        timeout 150 "$BIN/mqfq-demo" "$PWD/$BIN" > "$OUT/demo.txt" 2>&1
        tail -20 "$OUT/demo.txt" | tee -a "$R"
    else
        say "## no containerd/runc here: container creation with the edits not checked on this machine"
    fi
    kill "$D" 2>/dev/null; wait "$D" 2>/dev/null
fi
# (4) The interposer on the real driver (no toolkit needed: the kernel is PTX).
UVM=$BIN/uvmbench
if [ ! -x "$UVM" ] && command -v cc >/dev/null; then
    cc -O2 -o "$OUT/uvmbench" tests/gpu/uvmbench.c -ldl && UVM=$OUT/uvmbench
fi
LIB=$BIN/libmqfq_cuda.so
if [ -x "$UVM" ] && [ -f "$LIB" ]; then
    mkdir -p "$OUT/ctl"
    for mib in 1024 4096; do
        say "## pinned cuMemcpy, ${mib} MiB (native device memory, no interposer)"
        timeout 60 "$UVM" baseline "$mib" 2>&1 | tee -a "$R"
        say "## under the interposer, ${mib} MiB"
        LD_PRELOAD="$PWD/$LIB" MQFQ_CTL_DIR="$OUT/ctl" MQFQ_CONTAINER_ID=bench \
            timeout 120 "$UVM" uvm "$mib" 2>&1 | tee -a "$R"
        say "uvmbench exit: ${PIPESTATUS[0]}"
    done
    python3 - "$R" <<'PY' | tee -a "$R"
import re, sys
t = open(sys.argv[1]).read()
def vals(k):
    return [float(v) for v in re.findall(rf"{k} ([0-9.]+)", t)]
htod, pre, ev = vals("pinned_htod_GBps"), vals("prefetch_GBps"), vals("evict_GBps")
if htod and pre:
    print(f"summary: prefetch {max(pre):.1f} GB/s vs pinned HtoD {max(htod):.1f} GB/s = "
          f"{max(pre) / max(htod):.2f}x (goal >= 0.8); evict best {max(ev):.1f} GB/s")
hot, warm = vals("hot_kernel_ms"), vals("warm_restore_ms")
if hot:
    print(f"summary: hot kernel {min(hot):.3f} ms (goal <= 10 ms); warm restore {min(warm):.1f}-{max(warm):.1f} ms")
PY
else
    say "## interposer: uvmbench or $LIB missing (run scripts/gpu-prepare.sh first)"
fi
# (5) Managed-memory compatibility (issue 13).
CC=$BIN/compatcheck
if [ ! -x "$CC" ] && command -v cc >/dev/null; then
    cc -O2 -o "$OUT/compatcheck" tests/gpu/compatcheck.c -ldl && CC=$OUT/compatcheck
fi
if [ -x "$CC" ] && [ -f "$LIB" ]; then
    say "## compat: the driver on cuMemAlloc vs cuMemAllocManaged memory (no interposer)"
    timeout 60 "$CC" probe 2>&1 | tee -a "$R"
    for mode in plain setting default; do
        d="$OUT/ipc-$mode"
        rm -rf "$d" && mkdir -p "$d/ctl"
        pre=()
        case $mode in
            setting) pre=(env LD_PRELOAD="$PWD/$LIB" MQFQ_CTL_DIR="$d/ctl" MQFQ_CONTAINER_ID=c MQFQ_NATIVE=all) ;;
            default) pre=(env LD_PRELOAD="$PWD/$LIB" MQFQ_CTL_DIR="$d/ctl" MQFQ_CONTAINER_ID=c) ;;
        esac
        say "## compat: two-process IPC exchange, $mode"
        ( timeout 60 "${pre[@]}" "$CC" export "$d" > "$d/export.txt" 2>&1; echo "exporter exit $?" >> "$d/export.txt" ) &
        E=$!
        if [ "$mode" != default ]; then
            timeout 60 "${pre[@]}" "$CC" import "$d" 2>&1 | sed 's/^/importer: /' | tee -a "$R"
        fi
        wait "$E"
        sed 's/^/exporter: /' "$d/export.txt" | tee -a "$R"
    done
    say "## compat: pointer queries on converted memory (under the interposer)"
    mkdir -p "$OUT/ctl-attrs"
    LD_PRELOAD="$PWD/$LIB" MQFQ_CTL_DIR="$OUT/ctl-attrs" MQFQ_CONTAINER_ID=c \
        timeout 60 "$CC" attrs 2>&1 | tee -a "$R"
else
    say "## compat: compatcheck or $LIB missing (run scripts/gpu-prepare.sh first)"
fi
# (6) Load signals under concurrency: 1, 2, 4 and 8 invocations of short bursts, as processes
# (own contexts, time-sliced) and as streams of one context; one line each in results.txt and a
# table per mode (conc-procs.csv, conc-streams.csv) for the simulator's controllers. Bounded to
# about a minute: no new run starts once the step has taken 50 s.
CB=$BIN/concbench
if [ ! -x "$CB" ] && command -v cc >/dev/null; then
    cc -O2 -o "$OUT/concbench" tests/gpu/concbench.c -ldl -lpthread && CB=$OUT/concbench
fi
if [ -x "$CB" ]; then
    step_start=$SECONDS
    for mode in procs streams; do
        say "## concurrency, $mode: N invocations of 2 ms bursts (GPU time, CONCBENCH_SPIN=ontime) with 2 ms gaps, 3 s each (fractions; nan: no GPM)"
        csv="$OUT/conc-$mode.csv"
        echo "streams,busy,sm,dram,bursts_per_s,burst_ms" > "$csv"
        for n in 1 2 4 8; do
            if [ $((SECONDS - step_start)) -ge 50 ]; then
                say "concbench $mode $n: skipped (step over its time)"
                continue
            fi
            # Fixed GPU time per burst, so time slicing shows as the slowdown it causes.
            line=$(CONCBENCH_SPIN=ontime timeout 15 "$CB" "$mode" "$n" 3 2> "$OUT/conc-$mode-$n.err")
            rc=$?
            if [ "${line%% *}" = conc ]; then
                say "$line"
                echo "$line" | awk -v n="$n" '{
                    for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
                    print n "," v["busy"] "," v["sm"] "," v["dram"] "," v["bursts_per_s"] "," v["burst_ms"]
                }' >> "$csv"
            else
                say "concbench $mode $n: exit $rc: $(tail -n 1 "$OUT/conc-$mode-$n.err")"
            fi
        done
    done
    if [ -x "$BIN/mqfq-sim" ]; then
        for mode in procs streams; do
            if [ "$(wc -l < "$OUT/conc-$mode.csv")" -gt 1 ]; then
                say "## controllers replayed in closed loop over the measured $mode table"
                timeout 10 "$BIN/mqfq-sim" controllers --table "$OUT/conc-$mode.csv" 2>&1 | tee -a "$R"
            else
                say "## controllers, $mode: no measurements to replay"
            fi
        done
    else
        say "## mqfq-sim: no binary (run scripts/gpu-prepare.sh first): controllers not replayed"
    fi
else
    say "## concurrency: concbench: no binary and no cc"
fi
# (7) The burst monitor under the driver's rules (issue 35): a stream capture left open across
# many burst idle times must end well (synchronizing its context would invalidate it), and a
# primary context reset mid-burst must never be used again; the program is its own shim.
LC=$BIN/lifecheck
if [ ! -x "$LC" ] && command -v cc >/dev/null; then
    cc -O2 -o "$OUT/lifecheck" tests/gpu/lifecheck.c -ldl -lpthread && LC=$OUT/lifecheck
fi
if [ -x "$LC" ] && [ -f "$LIB" ]; then
    say "## burst monitor: capture open across idle times, context reset mid-burst"
    mkdir -p "$OUT/ctl-life"
    LD_PRELOAD="$PWD/$LIB" MQFQ_CTL_DIR="$OUT/ctl-life" MQFQ_BURST=1 MQFQ_CONTAINER_ID=life \
        timeout 60 "$LC" > "$OUT/lifecheck.txt" 2> "$OUT/lifecheck.err"
    rc=$?
    tee -a "$R" < "$OUT/lifecheck.txt"
    say "lifecheck exit: $rc"
else
    say "## burst monitor: lifecheck or $LIB missing (run scripts/gpu-prepare.sh first)"
fi
# (8) Oversubscribed UVM (issue 34's `none` under managed memory): fault-driven migration's rate
# (the first pass over 8 GiB written on the host) against pinned cuMemcpy's (step 4), then two
# processes of 8 GiB at once on a GPU shrunk to 12 GiB free by a third holding the rest: their
# passes against one alone show the thrash (the simulator's UVM_FAULT_SHARE and uvm-thrash).
if [ -x "$UVM" ] && command -v nvidia-smi >/dev/null; then
    say "## oversubscribed UVM: 8 GiB alone, then two at once with 12 GiB free"
    total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | tr -d ' ')
    case "$total" in '' | *[!0-9]*) total=0 ;; esac
    hog=$((total - 12288 - 2048))
    timeout 60 "$UVM" oversub 8192 3 2>&1 | sed 's/^/solo_unshrunk /' | tee -a "$R"
    if [ "$hog" -gt 0 ]; then
        timeout 300 "$UVM" hold "$hog" 280 > "$OUT/hold.txt" 2>&1 &
        H=$!
        for _ in $(seq 1 100); do grep -q holding "$OUT/hold.txt" && break; sleep 0.1; done
        say "held: $(cat "$OUT/hold.txt")"
    fi
    if [ "$hog" -gt 0 ] && grep -q holding "$OUT/hold.txt"; then
        timeout 100 "$UVM" oversub 8192 3 2>&1 | sed 's/^/solo /' | tee -a "$R"
        timeout 120 "$UVM" oversub 8192 3 > "$OUT/pair-a.txt" 2>&1 &
        A=$!
        timeout 120 "$UVM" oversub 8192 3 > "$OUT/pair-b.txt" 2>&1
        say "pair b exit: $?"
        wait "$A"
        say "pair a exit: $?"
        sed 's/^/pair_a /' "$OUT/pair-a.txt" | tee -a "$R"
        sed 's/^/pair_b /' "$OUT/pair-b.txt" | tee -a "$R"
        kill "$H" 2>/dev/null
        wait "$H" 2>/dev/null
    else
        if [ -n "${H:-}" ]; then kill "$H" 2>/dev/null; fi
        say "GPU of $total MiB: could not shrink it to 12 GiB free (too small, or the hold failed)"
    fi
else
    say "## oversubscribed UVM: uvmbench or nvidia-smi missing"
fi
# (9) The checkpoint backend (issue 36): a controller suspends and resumes an application holding
# native device memory, as the shim does; the restore rate is the Warm tier's under `checkpoint`.
CK=$BIN/ckptbench
if [ ! -x "$CK" ] && command -v cc >/dev/null; then
    cc -O2 -o "$OUT/ckptbench" tests/gpu/ckptbench.c -ldl && CK=$OUT/ckptbench
fi
if [ -x "$CK" ]; then
    for mib in 1024 4096 16384; do
        say "## checkpoint API, ${mib} MiB native"
        timeout 120 "$CK" "$mib" 2 2>&1 | sed "s/^/ckpt_${mib} /" | tee -a "$R"
        say "ckptbench exit: ${PIPESTATUS[0]}"
    done
    python3 - "$R" <<'PY' | tee -a "$R"
import re, sys
t = open(sys.argv[1]).read()
def vals(k):
    return [float(v) for v in re.findall(rf"(?:^|\s){k} ([0-9.]+)", t, re.M)]
ck, rs, pre = vals("checkpoint_GBps"), vals("restore_GBps"), vals("prefetch_GBps")
if rs:
    print(f"summary: checkpoint best {max(ck):.1f} GB/s, restore best {max(rs):.1f} GB/s"
          + (f" vs UVM prefetch {max(pre):.1f} GB/s" if pre else ""))
mv = vals("moved_restore_GBps")
moved_wrong = re.findall(r"moved_results_wrong (\d+)", t)
if mv:
    print(f"summary: restore onto another GPU best {max(mv):.1f} GB/s; "
          f"results wrong {moved_wrong}")
for why in re.findall(r"moved: (.*)", t)[:1]:
    print(f"summary: restore onto another GPU not measured: {why}")
# NVML's per-process used memory (what mqfqd charges a function): allocated MiB vs listed.
for mib, when, used in re.findall(r"^ckpt_(\d+) nvml_(\w+) \d+, (\d+) MiB", t, re.M):
    print(f"summary: NVML per process, {mib} MiB allocated, {when}: {used} MiB"
          + (f" (context and driver {int(used) - int(mib)} MiB)" if when == "running" else ""))
PY
else
    say "## checkpoint: ckptbench missing"
fi
# What `uvm` refuses, across a checkpoint: an IPC export shared after the restore, and a graph
# capture left open while the process is suspended, then ended and launched.
CC=$BIN/ckptcompat
if [ ! -x "$CC" ] && command -v cc >/dev/null; then
    cc -O2 -o "$OUT/ckptcompat" tests/gpu/ckptcompat.c -ldl && CC=$OUT/ckptcompat
fi
if [ -x "$CC" ]; then
    say "## checkpoint API: IPC export and open capture across a checkpoint"
    timeout -k 10 240 "$CC" 2>&1 | sed "s/^/ckpt_compat /" | tee -a "$R"
    say "ckptcompat exit: ${PIPESTATUS[0]}"
else
    say "## checkpoint: ckptcompat missing"
fi
say "# done $(date -u +%FT%TZ)"
