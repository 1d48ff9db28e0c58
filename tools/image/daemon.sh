#!/usr/bin/env bash
# The Docker daemon the image is built and tested with.
#
#   tools/image/daemon.sh start   a daemon answering on /var/run/docker.sock: the one running, or dockerd started
#                                 now (Debian's docker.io, installed with apt when missing and this is root), its
#                                 log in $cache/dockerd.log; prints what it did. Exit 2 when neither can be had.
#   tools/image/daemon.sh stop    stops the dockerd that `start` started (its pid in $cache/dockerd.pid), and only
#                                 that one; a daemon that was running before is left alone.
#
# $cache is $QP_IMAGE_CACHE, default ~/.cache/queue-processor/image (outside the clone).
set -euo pipefail

cache="${QP_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/queue-processor/image}"
pidfile="$cache/dockerd.pid"
mkdir -p "$cache"

# Debian packages, installed when a command is missing: "command package" pairs.
install_missing() {
    local missing=()
    while (($#)); do
        command -v "$1" >/dev/null || missing+=("$2")
        shift 2
    done
    ((${#missing[@]})) || return 0
    if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
        echo "daemon.sh: ${missing[*]} missing, and only root with apt-get installs them here" >&2
        exit 2
    fi
    echo "daemon.sh: installing Debian's ${missing[*]} (apt-get install)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >"$cache/apt.log" 2>&1 || {
        DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$cache/apt.log" 2>&1
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >>"$cache/apt.log" 2>&1
    } || { echo "daemon.sh: apt-get install ${missing[*]} failed: see $cache/apt.log" >&2; exit 2; }
}

start() {
    # containerd, runc (both with docker.io) and the CNI plugins also run the real node (real_node.py).
    install_missing docker docker.io dockerd docker.io mmdebstrap mmdebstrap /usr/lib/cni/bridge containernetworking-plugins
    if docker info >/dev/null 2>&1; then
        echo "daemon.sh: dockerd already running"
        return 0
    fi
    echo "daemon.sh: starting dockerd (log: $cache/dockerd.log; stop it with tools/image/daemon.sh stop)"
    dockerd >"$cache/dockerd.log" 2>&1 &
    echo $! >"$pidfile"
    for _ in $(seq 1 120); do
        docker info >/dev/null 2>&1 && return 0
        kill -0 "$(cat "$pidfile")" 2>/dev/null || break
        sleep 0.5
    done
    echo "daemon.sh: dockerd did not answer within 60 s: tail of $cache/dockerd.log:" >&2
    tail -5 "$cache/dockerd.log" >&2
    exit 2
}

stop() {
    [[ -f "$pidfile" ]] || return 0
    local pid
    pid="$(cat "$pidfile")"
    rm -f "$pidfile"
    kill -0 "$pid" 2>/dev/null || return 0
    echo "daemon.sh: stopping the dockerd it started (pid $pid)"
    kill -TERM "$pid"
    for _ in $(seq 1 60); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.5
    done
    kill -KILL "$pid" 2>/dev/null || true
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: tools/image/daemon.sh start|stop" >&2; exit 64 ;;
esac
