#!/usr/bin/env bash
# Install and start a one-member etcd 3.4 (Debian bookworm's etcd-server, and etcd-client for
# etcdctl, which the TLS and authentication test uses) for the test suite,
# on test ports of its own: clients 127.0.0.1:2479, peers 127.0.0.1:2480 (ETCD_PORT and
# ETCD_PEER_PORT override), data in .tools/etcd/ (wiped at each start: a fresh store per run).
# The 3-member clusters and restarted members some tests need are started by the tests
# themselves (tests/support/etcd.py) on free ports under pytest's temporary directory.
#
# Idempotent: a second start while it runs only checks it (well under a second).
#
# Usage:
#   bash .ci/install/etcd.sh          # install + start (default)
#   bash .ci/install/etcd.sh start
#   bash .ci/install/etcd.sh stop     # stop it if running
#   bash .ci/install/etcd.sh status   # exit 0 if it answers, else 1
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HOST=127.0.0.1
PORT=${ETCD_PORT:-2479}
PEER_PORT=${ETCD_PEER_PORT:-2480}
DIR=$ROOT/.tools/etcd
PID_FILE=$DIR/etcd.pid
LOG=$DIR/etcd.log
STARTUP_TIMEOUT=${ETCD_STARTUP_TIMEOUT:-30}

log() { echo "[etcd.sh] $*" >&2; }
die() { echo "[etcd.sh] ERROR: $*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi
}

healthy() {  # etcd's /health answers {"health":"true"} once it has a leader
    timeout 2 bash -c "exec 3<>/dev/tcp/$HOST/$PORT && printf 'GET /health HTTP/1.0\r\n\r\n' >&3 && cat <&3" \
        2>/dev/null | grep -q '"health":"true"'
}

port_open() {  # $1 = port
    timeout 2 bash -c "exec 3<>/dev/tcp/$HOST/$1" 2>/dev/null
}

running_pid() {
    local pid
    pid=$(cat "$PID_FILE" 2>/dev/null || true)
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && grep -q etcd "/proc/$pid/cmdline" 2>/dev/null \
        && echo "$pid"
}

install_pkg() {
    if command -v etcd >/dev/null 2>&1 && command -v etcdctl >/dev/null 2>&1; then
        return 0
    fi
    log "installing etcd-server and etcd-client (Debian packages)"
    export DEBIAN_FRONTEND=noninteractive
    # the package's own service (2379) is not ours: policy-rc.d or systemd may start it
    if ! as_root apt-get install -y --no-install-recommends etcd-server etcd-client >/tmp/etcd-apt.log 2>&1; then
        as_root apt-get update >/dev/null 2>&1 || true
        as_root apt-get install -y --no-install-recommends etcd-server etcd-client >/tmp/etcd-apt.log 2>&1 \
            || { tail -20 /tmp/etcd-apt.log >&2; die "apt-get install etcd-server etcd-client failed"; }
    fi
    command -v etcd >/dev/null 2>&1 || die "etcd not found after installing etcd-server"
}

start_etcd() {
    if [ -n "$(running_pid)" ] && healthy; then
        log "already running on $HOST:$PORT"
        return 0
    fi
    # the test etcd of another checkout (its data is disposable, as ours): stopped, so that
    # `make test` in one checkout after another works, as for the brokers
    local other
    for other in $(pgrep -f "etcd --name fedgate-test" 2>/dev/null || true); do
        if grep -q -- "--listen-client-urls.http://$HOST:$PORT" <(tr '\0' ' ' <"/proc/$other/cmdline") 2>/dev/null; then
            log "stopping the test etcd of another checkout (pid $other)"
            kill "$other" 2>/dev/null || true
            for _ in $(seq 50); do kill -0 "$other" 2>/dev/null || break; sleep 0.1; done
            kill -9 "$other" 2>/dev/null || true
        fi
    done
    for port in "$PORT" "$PEER_PORT"; do
        port_open "$port" && die "port $port is taken by another process (ETCD_PORT/ETCD_PEER_PORT)"
    done
    rm -rf "$DIR/data"
    mkdir -p "$DIR"
    log "starting etcd $(etcd --version 2>/dev/null | head -1 | awk '{print $3}') on $HOST:$PORT"
    setsid nohup etcd --name fedgate-test --data-dir "$DIR/data" \
        --listen-client-urls "http://$HOST:$PORT" --advertise-client-urls "http://$HOST:$PORT" \
        --listen-peer-urls "http://$HOST:$PEER_PORT" --initial-advertise-peer-urls "http://$HOST:$PEER_PORT" \
        --initial-cluster "fedgate-test=http://$HOST:$PEER_PORT" --initial-cluster-state new \
        --log-level warn >"$LOG" 2>&1 </dev/null &
    echo $! >"$PID_FILE"
    local deadline=$((SECONDS + STARTUP_TIMEOUT))
    until healthy; do
        [ -n "$(running_pid)" ] || { tail -20 "$LOG" >&2; die "etcd exited during startup"; }
        [ "$SECONDS" -lt "$deadline" ] || { tail -20 "$LOG" >&2; die "etcd not healthy within ${STARTUP_TIMEOUT}s"; }
        sleep 0.2
    done
    log "etcd is up on $HOST:$PORT"
}

stop_etcd() {
    local pid
    pid=$(running_pid || true)
    if [ -z "$pid" ]; then
        port_open "$PORT" && die "something else listens on $HOST:$PORT"
        log "not running"
        return 0
    fi
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
    rm -f "$PID_FILE"
    for port in "$PORT" "$PEER_PORT"; do
        port_open "$port" && die "port $port still open after stopping etcd"
    done
    log "stopped"
}

case "${1:-start}" in
    start) install_pkg; start_etcd ;;
    stop) stop_etcd ;;
    status) if healthy; then echo up; else echo down; exit 1; fi ;;
    *) die "usage: $0 [start|stop|status]" ;;
esac
