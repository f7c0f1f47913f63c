#!/usr/bin/env bash
# Every check CI runs: formatting, lints, all tests, and that the benchmarks build. Needs root
# (run by another user, it runs itself again through sudo).
set -euo pipefail
# shellcheck source=scripts/as-root.sh
source "$(dirname "$0")/as-root.sh"
cd "$(dirname "$0")/.."

# One time budget for the whole run (CI stops it at 90 minutes; a fresh machine took about 45):
# every step runs within what is left of it, so no sum of per-step limits can outrun CI's, and a
# hang ends the run with a message naming the step. Each step prints when it started.
BUDGET_S=${MQFQ_TEST_BUDGET_S:-5100}
step() { echo "== $* (at ${SECONDS}s of ${BUDGET_S}s)"; }
# within CAP_S CMD…: CMD with at most CAP_S seconds, and never past the budget.
within() {
    local cap=$1 left=$((BUDGET_S - SECONDS))
    shift
    if [ "$left" -le 60 ]; then
        echo "ERROR: the run's ${BUDGET_S}s are spent before: $*" >&2
        exit 1
    fi
    [ "$cap" -le "$left" ] || cap=$left
    timeout -k 30 "$cap" "$@"
}

step "dependencies (scripts/deps.sh)"
within 900 scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"

step "cargo fmt --check"
cargo fmt --all --check
step "cargo clippy -D warnings"
within 1200 cargo clippy --workspace --all-targets --locked -- -D warnings
# The fuzzing entry points too (off in the product build).
within 600 cargo clippy -p mqfq-shim -p mqfq-daemon -p mqfq-cuda-hook --features fuzzing --locked -- \
    -D warnings
step "cargo deny (licences, bans, duplicate versions, sources)"
within 900 scripts/deny.sh
step "portable interposer (glibc >= 2.17) and an old glibc to test it on"
MQFQ_PORTABLE_INTERPOSER=$(within 900 scripts/build-interposer.sh)
export MQFQ_PORTABLE_INTERPOSER
# The same for aarch64 (shim/runtime/tests/interposer_glibc.rs checks the versions it asks for).
MQFQ_PORTABLE_INTERPOSER_AARCH64=$(within 900 scripts/build-interposer.sh aarch64)
export MQFQ_PORTABLE_INTERPOSER_AARCH64
# shellcheck source=scripts/tools.sh
source scripts/tools.sh
export MQFQ_ZIG="$ZIG"
# The old-glibc run is what README, INSTALL-DEBIAN and SECURITY §6 cite: without it, CI fails.
if ! MQFQ_OLD_GLIBC_ROOT=$(within 300 scripts/fetch-old-glibc.sh); then
    echo "ERROR: Debian 11's glibc could not be fetched from Debian's archive" >&2
    exit 1
fi
export MQFQ_OLD_GLIBC_ROOT MQFQ_REQUIRE_PORTABLE=1
step "Docker Engine 26.1 from Debian 13's packages (shim/runtime/tests/docker.rs runs it on each containerd)"
if ! MQFQ_DOCKER_DIR=$(within 300 scripts/fetch-docker.sh); then
    echo "ERROR: Docker could not be fetched from Debian's archive" >&2
    exit 1
fi
export MQFQ_DOCKER_DIR MQFQ_REQUIRE_DOCKER=1
step "cargo test"
# The containerd integration tests skip themselves where they cannot run; here they must run.
# Every wait in the tests is bounded; the limit only makes a hang end the run with a message.
MQFQ_REQUIRE_CONTAINERD=1 within 2400 cargo test --workspace --locked
step "containerd integration tests on the other release lines (1.7, 2.1; the above ran on the system's)"
# The shim's tests run mqfqd and mqfqctl as `cargo test --workspace` built them. --workspace here
# too: the same features as that build, so nothing is compiled again.
for line in 1.7 2.1; do
    if ! dir=$(within 300 scripts/fetch-containerd.sh "$line"); then
        echo "ERROR: containerd $line could not be fetched from Debian's archive" >&2
        exit 1
    fi
    step "containerd $line"
    MQFQ_CONTAINERD_DIR="$dir" MQFQ_CONTAINERD_LINE="$line" MQFQ_REQUIRE_CONTAINERD=1 \
        within 1200 cargo test --locked --workspace --test ctr --test cri --test cri_pods \
        --test daemon --test nvidia --test pool --test nvml_pool --test security --test bursts --test install \
        --test docker
done
step "the Debian package: packed twice to the same bytes, then installed, used, removed and purged"
deb=$(within 1800 scripts/build-deb.sh)
cp "$deb" target/debian-first.deb
deb=$(within 600 scripts/build-deb.sh)
cmp target/debian-first.deb "$deb" || { echo "ERROR: two packings of one build differ" >&2; exit 1; }
rm -f target/debian-first.deb
step "lintian"
within 300 lintian --fail-on error,warning "$deb"
# The test installs and purges the package and rewrites containerd's config: whatever happens
# to it (a kill skips its own clean-up), the machine is put back as it was.
had_config=no
if [ -e /etc/containerd/config.toml ]; then
    cp -p /etc/containerd/config.toml target/containerd-config.saved
    had_config=yes
fi
deb_status=0
MQFQ_DEB="$deb" MQFQ_REQUIRE_CONTAINERD=1 within 900 cargo test --locked --workspace --test deb ||
    deb_status=$?
dpkg -P mqfq-shim >/dev/null 2>&1 || true
if [ "$had_config" = yes ]; then
    cp -p target/containerd-config.saved /etc/containerd/config.toml
else
    rm -f /etc/containerd/config.toml
fi
rm -f target/containerd-config.saved
[ "$deb_status" = 0 ] || exit "$deb_status"
step "fuzz: every target, 10 s each"
within 1500 scripts/fuzz.sh 10
# Built unoptimized (the test build's dependencies serve): that they build and link is the check;
# scripts/bench-*.sh build them optimized to run them. (clippy above checked them too.)
step "every benchmark builds (criterion and the end-to-end ones)"
within 900 cargo build --workspace --benches --bins --locked --profile dev
step "done in ${SECONDS}s"
