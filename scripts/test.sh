#!/usr/bin/env bash
# Every check CI runs: formatting, lints, all tests, and that the benchmarks build. Needs root
# (run by another user, it runs itself again through sudo).
set -euo pipefail
# shellcheck source=scripts/as-root.sh
source "$(dirname "$0")/as-root.sh"
cd "$(dirname "$0")/.."
scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"

echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
# The fuzzing entry points too (off in the product build).
cargo clippy -p mqfq-shim -p mqfq-daemon -p mqfq-cuda-hook --features fuzzing --locked -- -D warnings
echo "== cargo deny (licences, bans, duplicate versions, sources)"
scripts/deny.sh
echo "== portable interposer (glibc >= 2.17) and an old glibc to test it on"
MQFQ_PORTABLE_INTERPOSER=$(scripts/build-interposer.sh)
export MQFQ_PORTABLE_INTERPOSER
# shellcheck source=scripts/tools.sh
source scripts/tools.sh
export MQFQ_ZIG="$ZIG"
# The old-glibc run is what README, INSTALL-DEBIAN and SECURITY §6 cite: without it, CI fails.
if ! MQFQ_OLD_GLIBC_ROOT=$(scripts/fetch-old-glibc.sh); then
    echo "ERROR: Debian 11's glibc could not be fetched from Debian's archive" >&2
    exit 1
fi
export MQFQ_OLD_GLIBC_ROOT MQFQ_REQUIRE_PORTABLE=1
echo "== Docker Engine 26.1 from Debian 13's packages (shim/tests/docker.rs runs it on each containerd)"
if ! MQFQ_DOCKER_DIR=$(scripts/fetch-docker.sh); then
    echo "ERROR: Docker could not be fetched from Debian's archive" >&2
    exit 1
fi
export MQFQ_DOCKER_DIR MQFQ_REQUIRE_DOCKER=1
echo "== cargo test"
# The containerd integration tests skip themselves where they cannot run; here they must run.
# Every wait in the tests is bounded; these limits only make a hang end the run with a message.
MQFQ_REQUIRE_CONTAINERD=1 timeout -k 30 2400 cargo test --workspace --locked
echo "== containerd integration tests on the other release lines (1.7, 2.1; the above ran on the system's)"
# The shim's tests run mqfqd and mqfqctl from the daemon's crate (built above; kept fresh here).
cargo build --locked -p mqfq-daemon --bins
for line in 1.7 2.1; do
    if ! dir=$(scripts/fetch-containerd.sh "$line"); then
        echo "ERROR: containerd $line could not be fetched from Debian's archive" >&2
        exit 1
    fi
    echo "-- containerd $line"
    MQFQ_CONTAINERD_DIR="$dir" MQFQ_CONTAINERD_LINE="$line" MQFQ_REQUIRE_CONTAINERD=1 timeout -k 30 1200 cargo test --locked -p mqfq-shim \
        --test ctr --test cri --test cri_pods --test daemon --test nvidia --test pool --test security --test bursts \
        --test install --test docker
done
echo "== the Debian package: packed twice to the same bytes, then installed, used, removed and purged"
deb=$(scripts/build-deb.sh)
cp "$deb" target/debian-first.deb
deb=$(scripts/build-deb.sh)
cmp target/debian-first.deb "$deb" || { echo "ERROR: two packings of one build differ" >&2; exit 1; }
rm -f target/debian-first.deb
echo "-- lintian"
lintian --fail-on error,warning "$deb"
# The test installs and purges the package and rewrites containerd's config: whatever happens
# to it (a kill skips its own clean-up), the machine is put back as it was.
had_config=no
if [ -e /etc/containerd/config.toml ]; then
    cp -p /etc/containerd/config.toml target/containerd-config.saved
    had_config=yes
fi
deb_status=0
MQFQ_DEB="$deb" MQFQ_REQUIRE_CONTAINERD=1 timeout -k 30 900 cargo test --locked -p mqfq-shim --test deb ||
    deb_status=$?
dpkg -P mqfq-shim >/dev/null 2>&1 || true
if [ "$had_config" = yes ]; then
    cp -p target/containerd-config.saved /etc/containerd/config.toml
else
    rm -f /etc/containerd/config.toml
fi
rm -f target/containerd-config.saved
[ "$deb_status" = 0 ] || exit "$deb_status"
echo "== fuzz: every target, 10 s each"
scripts/fuzz.sh 10
echo "== every benchmark compiles (criterion and the end-to-end ones; scripts/bench-*.sh run them)"
cargo build --workspace --benches --bins --locked
