#!/bin/sh
# The node installer's work (the DaemonSet in installer.yaml runs it from the mqfq image):
# puts mqfq-shim on the host, starts mqfqd, registers the runtime with containerd, and undoes
# all of it on `uninstall` (the cleanup DaemonSet). Idempotent; containerd is restarted only
# when its config changed (a restart leaves running containers alone: their shims live on).
#
#   mqfq-node-installer.sh install | uninstall
#
# Environment: HOST (default /host): the host's root; SRC (default /opt/mqfq): the image's
# files (bin/, lib/libmqfq_cuda.so, mqfq-containerd.sh, systemd/mqfqd.service); CONFIG
# (default /etc/mqfq-config/mqfqd.toml): mqfqd's config from the ConfigMap; SYSTEMCTL: how to
# reach the host's systemd (default: nsenter into PID 1's namespaces, which needs hostPID);
# CONTAINERD (default: the host's own, run chrooted into HOST): the containerd that checks the
# new config before it replaces the host's (that check is required here).
set -eu

HOST=${HOST:-/host}
SRC=${SRC:-/opt/mqfq}
CONFIG=${CONFIG:-/etc/mqfq-config/mqfqd.toml}
SYSTEMCTL=${SYSTEMCTL:-nsenter -t 1 -m -u -i -n -p -- systemctl}
BINS="containerd-shim-mqfq-v2 mqfqd mqfqctl"

log() { echo "mqfq-node-installer: $*" >&2; }

# Refuses a destination under $HOST reached through a symbolic link: with the host's root
# mounted at $HOST, an absolute link resolves inside this container and a relative one anywhere
# on the host, so a link planted at, say, /etc/mqfq would aim a root write elsewhere.
no_links() {
    rest=${1#"$HOST"}
    p=$HOST
    while [ -n "$rest" ]; do
        rest=${rest#/}
        part=${rest%%/*}
        rest=${rest#"$part"}
        [ -n "$part" ] || continue
        p=$p/$part
        if [ -L "$p" ]; then
            log "refusing $1: ${p#"$HOST"} is a symbolic link"
            exit 1
        fi
    done
}

# Copies $1 to $2 (mode $3) unless it is already there, byte for byte; says whether it copied.
put() {
    no_links "$2"
    if [ -f "$2" ] && cmp -s "$1" "$2"; then
        return 1
    fi
    # Called as an `if` condition, where `set -e` does not apply: each step checks itself. The
    # temporary name is removed first (a link planted there would take the copy elsewhere).
    { mkdir -p "$(dirname "$2")" && rm -f "$2.mqfq-new" && cp "$1" "$2.mqfq-new" &&
        chmod "$3" "$2.mqfq-new" &&
        mv "$2.mqfq-new" "$2"; } || { log "cannot install $2"; rm -f "$2.mqfq-new"; exit 1; }
    return 0
}

install() {
    daemon_changed=no
    for b in $BINS; do
        if put "$SRC/bin/$b" "$HOST/usr/local/bin/$b" 0755; then
            log "installed /usr/local/bin/$b"
            daemon_changed=yes
        fi
    done
    put "$SRC/lib/libmqfq_cuda.so" "$HOST/usr/lib/mqfq/libmqfq_cuda.so" 0644 &&
        log "installed /usr/lib/mqfq/libmqfq_cuda.so" || true
    if put "$CONFIG" "$HOST/etc/mqfq/mqfqd.toml" 0644; then
        log "installed /etc/mqfq/mqfqd.toml"
        daemon_changed=yes
    fi
    if put "$SRC/systemd/mqfqd.service" "$HOST/etc/systemd/system/mqfqd.service" 0644; then
        $SYSTEMCTL daemon-reload
        daemon_changed=yes
    fi
    if [ "$daemon_changed" = yes ]; then
        # mqfqd's restart leaves containers alone (KillMode=process; shims re-register).
        $SYSTEMCTL enable mqfqd.service
        $SYSTEMCTL restart mqfqd.service
        log "mqfqd (re)started"
    fi
    changed=$(ROOT="$HOST" MQFQ_REQUIRE_CHECK=1 MQFQ_SHIM_PATH=/usr/local/bin/containerd-shim-mqfq-v2 \
        sh "$SRC/mqfq-containerd.sh" register)
    if [ "$changed" = changed ]; then
        $SYSTEMCTL restart containerd.service
        log "containerd restarted with the mqfq runtime"
    fi
    log "installed"
}

uninstall() {
    changed=$(ROOT="$HOST" sh "$SRC/mqfq-containerd.sh" unregister)
    if [ "$changed" = changed ]; then
        $SYSTEMCTL restart containerd.service
        log "containerd restarted without the mqfq runtime"
    fi
    if [ -f "$HOST/etc/systemd/system/mqfqd.service" ]; then
        $SYSTEMCTL disable --now mqfqd.service || true
        rm -f "$HOST/etc/systemd/system/mqfqd.service"
        $SYSTEMCTL daemon-reload
    fi
    for b in $BINS; do rm -f "$HOST/usr/local/bin/$b"; done
    rm -f "$HOST/usr/lib/mqfq/libmqfq_cuda.so"
    rmdir "$HOST/usr/lib/mqfq" 2>/dev/null || true
    rm -f "$HOST/etc/mqfq/mqfqd.toml"
    rmdir "$HOST/etc/mqfq" 2>/dev/null || true
    log "uninstalled"
}

case ${1:-} in
    install) install ;;
    uninstall) uninstall ;;
    *) echo "usage: $0 install|uninstall" >&2; exit 2 ;;
esac
