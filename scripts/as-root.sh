#!/usr/bin/env bash
# Sourced first by the README's two commands (scripts/demo.sh, scripts/test.sh): they need root
# (apt, containerd, mounts). Run by another user, the script runs itself again through sudo,
# keeping the MQFQ_* settings it was given (sudo's env_reset would drop them; nothing else is
# kept) — those that name programs (MQFQ_CONTAINERD_DIR, MQFQ_DOCKER_DIR, …) then run as root,
# as the README's old `sudo ./scripts/…` ran them; the build's files in target/ are root's. Run
# as root, on a minimal Debian without sudo, it just goes on.
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "$(basename "$0"): needs root: run it as root, or install sudo and run it again" >&2
        exit 1
    fi
    mqfq_env=()
    while IFS= read -r -d '' kv; do
        case $kv in MQFQ_*=*) mqfq_env+=("$kv") ;; esac
    done < <(env -0)
    exec sudo env "${mqfq_env[@]}" "$(realpath "$0")" "$@"
fi
