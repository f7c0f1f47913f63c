#!/usr/bin/env bash
# Builds the Debian package with cargo-deb (pinned, from crates.io) and prints its path:
#   target/debian/mqfq-shim_<version>+<commit time>-1_amd64.deb
# (the commit time in the version, so a later commit's package upgrades an earlier one's).
# Towards reproducible: file times are SOURCE_DATE_EPOCH (default: the last commit's time) and
# the build directory and cargo's home are remapped out of the binaries; CI checks that two
# packings of one build give the same bytes (a rebuild elsewhere also needs the same Rust
# toolchain: rust-toolchain.toml pins it). A DEBIAN/md5sums is added for `dpkg --verify`.
# What goes in it: shim/daemon/Cargo.toml, [package.metadata.deb]; docs/INSTALL-DEBIAN.md.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
# shellcheck source=scripts/tools.sh
source scripts/tools.sh
CARGO_DEB_VERSION=3.8.0
if ! cargo-deb --version 2>/dev/null | grep -q "$CARGO_DEB_VERSION"; then
    cargo install --quiet --locked "cargo-deb@$CARGO_DEB_VERSION" --root "$MQFQ_TOOLS" >&2
fi
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
export SOURCE_DATE_EPOCH
cargo_home=${CARGO_HOME:-$HOME/.cargo}
export RUSTFLAGS="--remap-path-prefix=$PWD=/build/mqfq-shim --remap-path-prefix=$cargo_home=/cargo"

# The interposer for any image with glibc 2.17 or newer; the programs for this glibc.
interposer=$(scripts/build-interposer.sh)
cargo build --quiet --locked --release -p mqfq-shim --bin containerd-shim-mqfq-v2 \
    -p mqfq-daemon --bin mqfqd --bin mqfqctl >&2

stage=target/deb-stage
rm -rf "$stage"
mkdir -p "$stage"
cp "$interposer" "$stage/libmqfq_cuda.so"
# The packaged programs live in /usr/bin (the unit in packaging/systemd names /usr/local/bin,
# where a hand or node-installer install puts them).
sed 's|/usr/local/bin/mqfqd|/usr/bin/mqfqd|' packaging/systemd/mqfqd.service > "$stage/mqfqd.service"
grep -q '^ExecStart=/usr/bin/mqfqd ' "$stage/mqfqd.service"
target/release/mqfqctl man | gzip -9n > "$stage/mqfqctl.8.gz"
for page in mqfqd containerd-shim-mqfq-v2; do
    gzip -9n < "packaging/man/$page.8" > "$stage/$page.8.gz"
done
target/release/mqfqctl completions bash > "$stage/mqfqctl.bash"
target/release/mqfqctl completions zsh > "$stage/_mqfqctl"
target/release/mqfqctl completions fish > "$stage/mqfqctl.fish"

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
stamp=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y%m%d%H%M%S)
# The package's Debian changelog: one entry for this build, dated by the commit (reproducible).
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
{
    echo "mqfq-shim ($version+$stamp-1) unstable; urgency=medium"
    echo
    echo "  * Built from mqfq-shim commit $commit."
    echo
    echo " -- mqfq-shim developers <mqfq-shim@example.invalid>  $(LC_ALL=C date -u -R -d "@$SOURCE_DATE_EPOCH")"
} > "$stage/changelog"
rm -rf target/debian
cargo deb --quiet --locked --no-build -p mqfq-daemon --deb-version "$version+$stamp-1" \
    -o target/debian/ 1>&2
deb=$(ls "$PWD"/target/debian/mqfq-shim_*.deb)
# cargo-deb writes no md5sums: unpack, add them, pack again with the same times.
root=target/deb-root
rm -rf "$root"
dpkg-deb -R "$deb" "$root"
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -print | sed 's|^\./||' | LC_ALL=C sort |
    xargs -d '\n' md5sum) > "$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/md5sums"
find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >&2
rm -rf "$root"
echo "$deb"
