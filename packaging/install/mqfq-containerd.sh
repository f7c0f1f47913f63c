#!/bin/sh
# Registers (or unregisters) the mqfq runtime with containerd's CRI plugin, as a package or the
# Kubernetes node installer does it, and prints "changed" or "unchanged" (restart containerd
# only on "changed"). Idempotent; the result is checked with `containerd config dump` before it
# replaces anything, where containerd is at hand.
#
# - Config version 3 (containerd 2.x): a drop-in, conf.d/mqfq.toml next to config.toml, and one
#   entry in config.toml's top-level `imports`. containerd 2 merges imports table by table.
# - Config version 2 (containerd 1.6 / 1.7): those merge an imported file's plugin table over
#   the whole of config.toml's (a drop-in naming the CRI plugin would drop every other CRI
#   setting: the sandbox image, the other runtimes), so the runtime's table is appended to
#   config.toml between "# BEGIN mqfq-shim" and "# END mqfq-shim" lines instead.
#
# Nothing else in config.toml is rewritten. `unregister` puts it back byte for byte (or removes
# it if `register` created it) unless it was edited since; then only what register added (the
# import entry, or the marked block) is taken out.
#
#   mqfq-containerd.sh register | unregister
#
# On containerd 2.x the runtime is registered with runtime_type io.containerd.runc.v2 and
# runtime_path naming the shim: CRI asks only runtimes of runc's type for their features (the
# shim's `-info` reports its runc's), and without them the kubelet refuses recursive read-only
# mounts and user namespaces on the handler. containerd 1.6 / 1.7 ask no runtime for features,
# and 1.6.20's runtime_path does not work, so there it stays io.containerd.mqfq.v2.
#
# Environment: ROOT (default /): the host's root as this process sees it (a DaemonSet mounts it
# at /host); CONTAINERD (default containerd): for its version when there is no config, and for
# the check; MQFQ_CONTAINERD_CONFIG (default /etc/containerd/config.toml, under ROOT);
# MQFQ_SHIM_PATH (default /usr/bin/containerd-shim-mqfq-v2): the shim on the host.
set -eu

ROOT=${ROOT:-/}
SHIM_PATH=${MQFQ_SHIM_PATH:-/usr/bin/containerd-shim-mqfq-v2}
case $SHIM_PATH in
    /*) ;;
    *) echo "mqfq-containerd: MQFQ_SHIM_PATH must be an absolute path, not $SHIM_PATH" >&2; exit 1 ;;
esac
case $SHIM_PATH in
    *[!A-Za-z0-9/._-]*) echo "mqfq-containerd: MQFQ_SHIM_PATH has characters it may not: $SHIM_PATH" >&2; exit 1 ;;
    */containerd-shim-mqfq-v2) ;;
    *) echo "mqfq-containerd: MQFQ_SHIM_PATH must name the shim, .../containerd-shim-mqfq-v2: $SHIM_PATH" >&2; exit 1 ;;
esac
CONFIG=${ROOT%/}${MQFQ_CONTAINERD_CONFIG:-/etc/containerd/config.toml}
DIR=$(dirname "$CONFIG")
DROPIN_REL=conf.d/mqfq.toml
DROPIN=$DIR/$DROPIN_REL
ORIG=$DIR/.mqfq-config.orig      # config.toml as it was before register changed it
OURS=$DIR/.mqfq-config.ours      # config.toml as register left it
CREATED=$DIR/.mqfq-config.created
BEGIN='# BEGIN mqfq-shim (mqfq-containerd.sh; unregister removes this block)'
END='# END mqfq-shim'

die() { echo "mqfq-containerd: $*" >&2; exit 1; }

# Whether $CONFIG holds register's block as a matched pair: one begin marker (a second line
# starting like it is no pair), then an end marker after it. An end marker anywhere else (above
# the block: a user's copy) is no end, and what follows a begin marker without one is the
# user's, never deleted.
paired() {
    awk -v begin="$BEGIN" -v end="$END" '
        index($0, "# BEGIN mqfq-shim") == 1 { begins++; open = ($0 == begin); next }
        open && $0 == end { found++; open = 0 }
        END { exit !(begins == 1 && found == 1) }' "$CONFIG"
}

# $CONFIG without register's block (the matched pair, exactly as `paired` finds it), or with it
# replaced by the file named in $1.
block_replaced() {
    # The block's file name through the environment: awk -v would read backslashes as escapes.
    MQFQ_BLOCK=${1:-} awk -v begin="$BEGIN" -v end="$END" '
        !done && $0 == begin {
            block = ENVIRON["MQFQ_BLOCK"]
            if (block != "") while ((getline line < block) > 0) print line
            skip = 1; next
        }
        skip && $0 == end { skip = 0; done = 1; next }
        !skip' "$CONFIG"
}

# Register's block as it stands in $CONFIG (the matched pair).
current_block() {
    awk -v begin="$BEGIN" -v end="$END" '
        $0 == begin { on = 1 }
        on { print }
        on && $0 == end { exit }' "$CONFIG"
}

# Runs the containerd that checks configs with the arguments given: CONTAINERD, or with ROOT
# set and CONTAINERD not, the host's own containerd chrooted into ROOT. Status 127 when none
# can run here.
run_containerd() {
    if [ -n "${CONTAINERD:-}" ] || [ "$ROOT" = / ]; then
        "${CONTAINERD:-containerd}" --version >/dev/null 2>&1 || return 127
        "${CONTAINERD:-containerd}" "$@"
    else
        chroot "$ROOT" containerd --version >/dev/null 2>&1 || return 127
        chroot "$ROOT" containerd "$@"
    fi
}

# The config version in force: config.toml's `version`, else containerd's default (3 from 2.0).
config_version() {
    if [ -f "$CONFIG" ]; then
        v=$(sed -n 's/^[[:space:]]*version[[:space:]]*=[[:space:]]*\([0-9]\)[[:space:]]*\(#.*\)\{0,1\}$/\1/p' "$CONFIG" | head -n 1)
        echo "${v:-1}"
        return
    fi
    major=$(run_containerd --version 2>/dev/null |
        sed -n 's/^containerd [^ ]* v\{0,1\}\([0-9][0-9]*\)\.[0-9].*/\1/p' | head -n 1) || true
    if [ "${major:-1}" -ge 2 ]; then echo 3; else echo 2; fi
}

# The runtime's table for config version $1.
runtime_table() {
    case $1 in
        3) echo "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.mqfq]"
           echo '  # runc'"'"'s type, so that CRI asks the shim for its features (its runc'"'"'s).'
           echo '  runtime_type = "io.containerd.runc.v2"'
           echo "  runtime_path = \"$SHIM_PATH\"" ;;
        2) echo '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.mqfq]'
           echo '  runtime_type = "io.containerd.mqfq.v2"' ;;
        *) die "$CONFIG: config version $1 is not supported (containerd 1.6 or later: version 2 or 3)" ;;
    esac
    cat <<'TOML'
  # The scheduling annotations, from the pod to the containers' specs (docs/USAGE.md).
  pod_annotations = ["io.mqfq.*", "serving.knative.dev/*"]
  container_annotations = ["io.mqfq.*"]
TOML
}

# Whether config.toml already registers the shim itself: a runtime of type io.containerd.mqfq.v2,
# or one whose runtime_path is the shim.
registered_inline() {
    grep -Eq '^[[:space:]]*(runtime_type[[:space:]]*=[[:space:]]*"io\.containerd\.mqfq\.v2"|runtime_path[[:space:]]*=[[:space:]]*"[^"]*/containerd-shim-mqfq-v2")' "$CONFIG" 2>/dev/null
}

# The keys config.toml gives the mqfq runtime's options table (one a line). On containerd 2.x
# the runtime has runc's type, so CRI reads that table as runc's options and drops every other
# key without a word.
options_keys() {
    awk '
        /^[[:space:]]*\[/ { in_opts = ($0 ~ /runtimes\.["'"'"']?mqfq["'"'"']?\.options[[:space:]]*\]/) ; next }
        in_opts && /^[[:space:]]*[A-Za-z_][A-Za-z0-9_]*[[:space:]]*=/ { sub(/^[[:space:]]*/, ""); sub(/[[:space:]]*=.*/, ""); print }
    ' "$CONFIG" 2>/dev/null
}

# Refuses (config version 3) options for the mqfq runtime that runc's options do not have.
check_options() {
    bad=$(options_keys | grep -Eiv '^(BinaryName|Root|SystemdCgroup|NoPivotRoot|NoNewKeyring|ShimCgroup|IoUid|IoGid|CriuImagePath|CriuWorkPath)$' |
        tr '\n' ' ') || true
    [ -z "$bad" ] ||
        die "$CONFIG gives the mqfq runtime options containerd 2.x would pass as runc's and silently drop: $bad- use runc's names (BinaryName, Root, SystemdCgroup, NoPivotRoot, NoNewKeyring; docs/USAGE.md), then register again"
}

# Whether config.toml has a table for a runtime named mqfq, in any quoting of the key.
runtime_named_mqfq() {
    grep -Eq "^[[:space:]]*\[.*runtimes\.[\"']?mqfq[\"']?[[:space:]]*\]" "$CONFIG" 2>/dev/null
}

# Whether config.toml's imports already name the drop-in (or a glob over conf.d).
imported() {
    grep -Eq "^[[:space:]]*imports[[:space:]]*=.*[\"']($DROPIN_REL|/etc/containerd/$DROPIN_REL|conf\.d/\*\.toml|/etc/containerd/conf\.d/\*\.toml)[\"']" "$CONFIG" 2>/dev/null
}

# config.toml with the drop-in added to its imports (on stdout).
with_import() {
    if grep -Eq '^[[:space:]]*imports[[:space:]]*=' "$CONFIG"; then
        grep -Eq '^[[:space:]]*imports[[:space:]]*=[[:space:]]*\[.*\][[:space:]]*(#.*)?$' "$CONFIG" ||
            die "$CONFIG: its imports span several lines; add \"$DROPIN_REL\" to them by hand"
        sed -E "s|^([[:space:]]*imports[[:space:]]*=[[:space:]]*\[)[[:space:]]*\]|\1\"$DROPIN_REL\"]|; t; s|^([[:space:]]*imports[[:space:]]*=[[:space:]]*\[)|\1\"$DROPIN_REL\", |" "$CONFIG"
    else
        # A top-level key goes before any table: the first line is always top level.
        printf 'imports = ["%s"]\n' "$DROPIN_REL"
        cat "$CONFIG"
    fi
}

# config.toml with the runtime's table appended between the markers (on stdout).
with_block() {
    cat "$CONFIG"
    # A file that does not end with a newline gets one first.
    [ -z "$(tail -c 1 "$CONFIG")" ] || echo
    echo
    echo "$BEGIN"
    runtime_table 2
    echo "$END"
}

# containerd's `config dump` of config file $1 (a path as this process sees it; chrooted, the
# same file at its path inside ROOT), on stdout; status 127 when no containerd can run here.
containerd_dump() {
    if [ -n "${CONTAINERD:-}" ] || [ "$ROOT" = / ]; then
        run_containerd --config "$1" config dump 2>&1
    else
        run_containerd --config "${1#"${ROOT%/}"}" config dump 2>&1
    fi
}

# Whether containerd accepts config $1 with the mqfq runtime in it (or none can run here and
# MQFQ_REQUIRE_CHECK is not 1); says why not on stderr.
config_ok() {
    status=0
    dump=$(containerd_dump "$1") || status=$?
    if [ "$status" = 127 ]; then
        [ "${MQFQ_REQUIRE_CHECK:-0}" != 1 ] && return 0
        echo "mqfq-containerd: no containerd to check the new config with (MQFQ_REQUIRE_CHECK=1)" >&2
        return 1
    elif [ "$status" != 0 ]; then
        echo "mqfq-containerd: containerd refuses the new config: $dump" >&2
        return 1
    fi
    printf '%s' "$dump" | grep -Eq 'io\.containerd\.mqfq\.v2|/containerd-shim-mqfq-v2' && return 0
    echo "mqfq-containerd: containerd's config dump does not show the mqfq runtime" >&2
    return 1
}

# Checks a candidate config with containerd and puts it in place (file mode and owner kept).
install_config() {
    config_ok "$1" || { rm -f "$1"; exit 1; }
    if [ -f "$CONFIG" ]; then
        chmod --reference="$CONFIG" "$1" 2>/dev/null || true
        chown --reference="$CONFIG" "$1" 2>/dev/null || true
    fi
    mv "$1" "$CONFIG"
}

# The config as it is now becomes the one unregister gives back.
take_backup() {
    cp -p "$CONFIG" "$ORIG"
    rm -f "$CREATED"
}

# Puts the drop-in back as it was before this run (the exit trap while it is being changed).
undo_dropin() {
    if [ -f "$DROPIN.mqfq-old" ]; then
        mv "$DROPIN.mqfq-old" "$DROPIN"
    else
        rm -f "$DROPIN"
        rmdir "$DIR/conf.d" 2>/dev/null || true
    fi
    rm -f "$CONFIG.tmp" "$DROPIN.tmp"
}

# Refuses what register or unregister must not touch, and says when there is nothing to do.
preflight() {
    [ ! -L "$CONFIG" ] && [ ! -L "$DIR" ] ||
        die "$CONFIG (or its directory) is a symbolic link: register the runtime in the file it names by hand"
}

# Whether config.toml turns containerd's CRI plugin off (Docker's containerd.io does).
cri_disabled() {
    grep -Eq '^[[:space:]]*disabled_plugins[[:space:]]*=.*"(cri|io\.containerd\.grpc\.v1\.cri|io\.containerd\.cri\.v1\.runtime)"' "$CONFIG" 2>/dev/null
}

register() {
    changed=unchanged
    preflight
    if cri_disabled; then
        echo "mqfq-containerd: $CONFIG turns containerd's CRI plugin off (as Docker's containerd.io ships it): nothing to register; Docker, ctr and nerdctl name the runtime io.containerd.mqfq.v2 themselves" >&2
        echo unchanged
        return
    fi
    version=$(config_version)
    if [ ! -f "$CONFIG" ]; then
        mkdir -p "$DIR"
        if [ "$version" = 3 ]; then
            printf 'version = 3\nimports = ["%s"]\n' "$DROPIN_REL" > "$CONFIG.tmp"
            mkdir -p "$DIR/conf.d"
            trap undo_dropin EXIT
            { echo '# Written by mqfq-containerd.sh (mqfq-shim).'; echo 'version = 3'; echo; runtime_table 3; } > "$DROPIN"
        else
            { echo 'version = 2'; echo; echo "$BEGIN"; runtime_table 2; echo "$END"; } > "$CONFIG.tmp"
        fi
        install_config "$CONFIG.tmp"
        trap - EXIT
        : > "$CREATED"
        cp "$CONFIG" "$OURS"
        echo changed
        return
    fi
    if [ "$version" = 3 ]; then
        check_options
        if runtime_named_mqfq && ! registered_inline; then
            die "$CONFIG already has a runtime named mqfq of another type; remove or rename it first"
        fi
        want=$({ echo '# Written by mqfq-containerd.sh (mqfq-shim).'; echo 'version = 3'; echo; runtime_table 3; })
        dropin_changed=no
        if [ ! -f "$DROPIN" ] || [ "$(cat "$DROPIN")" != "$want" ]; then
            # In place only once containerd has accepted it with the config: undone otherwise.
            mkdir -p "$DIR/conf.d"
            rm -f "$DROPIN.mqfq-old"
            [ ! -f "$DROPIN" ] || cp -p "$DROPIN" "$DROPIN.mqfq-old"
            trap undo_dropin EXIT
            printf '%s\n' "$want" > "$DROPIN.tmp"
            mv "$DROPIN.tmp" "$DROPIN"
            dropin_changed=yes
            changed=changed
        fi
        if ! imported; then
            with_import > "$CONFIG.tmp"
            take_backup
            install_config "$CONFIG.tmp"
            cp "$CONFIG" "$OURS"
            changed=changed
        elif [ "$dropin_changed" = yes ]; then
            config_ok "$CONFIG" || exit 1
        fi
        trap - EXIT
        rm -f "$DROPIN.mqfq-old"
    elif [ "$version" = 2 ]; then
        if grep -qxF "$BEGIN" "$CONFIG" && ! paired; then
            die "$CONFIG has the mqfq-shim begin marker but not its end marker after it (or more than one block): nothing changed; take the mqfq runtime's table out by hand, or end it with a line '$END'"
        fi
        if paired; then
            # Ours already: brought up to this version's table (an upgrade) where it differs.
            { echo "$BEGIN"; runtime_table 2; echo "$END"; } > "$CONFIG.block"
            if [ "$(current_block)" != "$(cat "$CONFIG.block")" ]; then
                block_replaced "$CONFIG.block" > "$CONFIG.tmp"
                rm -f "$CONFIG.block"
                install_config "$CONFIG.tmp"
                cp "$CONFIG" "$OURS"
                changed=changed
            fi
            rm -f "$CONFIG.block"
        elif ! registered_inline; then
            ! runtime_named_mqfq ||
                die "$CONFIG already has a runtime named mqfq of another type; remove or rename it first"
            with_block > "$CONFIG.tmp"
            take_backup
            install_config "$CONFIG.tmp"
            cp "$CONFIG" "$OURS"
            changed=changed
        fi
    else
        runtime_table "$version" >/dev/null
    fi
    echo "$changed"
}

unregister() {
    changed=unchanged
    preflight
    if [ -f "$DROPIN" ]; then rm -f "$DROPIN"; changed=changed; fi
    rmdir "$DIR/conf.d" 2>/dev/null || true
    if [ -f "$OURS" ] && [ -f "$CONFIG" ] && cmp -s "$OURS" "$CONFIG"; then
        # Untouched since register: back as it was.
        if [ -f "$CREATED" ]; then
            rm -f "$CONFIG"
        elif [ -f "$ORIG" ]; then
            cp -p "$ORIG" "$CONFIG.tmp"
            mv "$CONFIG.tmp" "$CONFIG"
        fi
        changed=changed
    elif [ -f "$CONFIG" ] && grep -qF "$BEGIN" "$CONFIG" && ! paired; then
        # The block's end marker is gone: deleting to the end of the file could take the user's
        # settings with it, so nothing is touched.
        echo "mqfq-containerd: $CONFIG has the mqfq-shim begin marker but not its end marker after it (or more than one block): nothing removed; take the mqfq runtime's table out by hand (the config before register is kept at $ORIG)" >&2
        rm -f "$OURS" "$CREATED"
        echo "$changed"
        return
    elif [ -f "$CONFIG" ] && { grep -qF "$BEGIN" "$CONFIG" || grep -qF "\"$DROPIN_REL\"" "$CONFIG"; }; then
        # Edited since: take out only what register added.
        block_replaced |
            sed -E "s|\"$DROPIN_REL\"[[:space:]]*,[[:space:]]*||; s|,[[:space:]]*\"$DROPIN_REL\"||; s|\"$DROPIN_REL\"||" > "$CONFIG.tmp"
        chmod --reference="$CONFIG" "$CONFIG.tmp" 2>/dev/null || true
        chown --reference="$CONFIG" "$CONFIG.tmp" 2>/dev/null || true
        mv "$CONFIG.tmp" "$CONFIG"
        echo "mqfq-containerd: $CONFIG was edited since register: only what register added was removed" >&2
        changed=changed
    elif [ -f "$ORIG" ] && [ -f "$CONFIG" ] && registered_inline; then
        echo "mqfq-containerd: $CONFIG registers the mqfq runtime without register's markers: nothing removed; take it out by hand (the config before register is kept at $ORIG)" >&2
        rm -f "$OURS" "$CREATED"
        echo "$changed"
        return
    fi
    rm -f "$ORIG" "$OURS" "$CREATED"
    echo "$changed"
}

case ${1:-} in
    register) register ;;
    unregister) unregister ;;
    *) echo "usage: $0 register|unregister" >&2; exit 2 ;;
esac
