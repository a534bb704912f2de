#!/usr/bin/env bash
# RabbitMQ 4.0 (Debian 13's rabbitmq-server 4.0.5) beside the suite's RabbitMQ 3.10.
#
# Debian 12 ships RabbitMQ 3.10 only, and Debian 13's Erlang needs a newer glibc, so the
# broker runs in a Debian 13 (trixie) root made with debootstrap (about 30 s once; kept in
# $RABBITMQ4_ROOT between runs on one machine). It listens on 127.0.0.1:5684 (AMQP 1.0 and
# 0-9-1), with its own Erlang distribution port (25684) and epmd (4370), so it runs beside
# RabbitMQ 3.10 (5682). ANONYMOUS is allowed (RabbitMQ's default) and guest may log in
# from anywhere (loopback_users = none): the suite connects as guest or anonymously.
#
# Usage:
#   bash .ci/install/rabbitmq4.sh          # install (once) + configure + start
#   bash .ci/install/rabbitmq4.sh stop     # stop it, unmount the root's /proc
#   bash .ci/install/rabbitmq4.sh status   # exit 0 if up
set -euo pipefail

ROOT=${RABBITMQ4_ROOT:-/opt/fedgate/rabbitmq4-trixie}
HOST=127.0.0.1
PORT=${RABBITMQ4_PORT:-5684}
DIST_PORT=25684
EPMD_PORT=4370
NODE=rabbit4@localhost
MIRROR=${DEBIAN_MIRROR:-}
STARTUP_TIMEOUT=${RABBITMQ_STARTUP_TIMEOUT:-120}

log() { echo "[rabbitmq4.sh] $*" >&2; }
die() { echo "[rabbitmq4.sh] ERROR: $*" >&2; exit 1; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi; }
port_open() { timeout 2 bash -c "exec 3<>/dev/tcp/$HOST/$PORT" 2>/dev/null; }
in_root() { as_root chroot "$ROOT" env ERL_EPMD_PORT=$EPMD_PORT ERL_EPMD_ADDRESS=127.0.0.1 HOME=/var/lib/rabbitmq "$@"; }
# processes running inside the root (/proc/PID/root is it): the broker's beam.smp, its epmd
root_pids() {
    local pid
    for pid in $(pgrep -f "$1" 2>/dev/null); do
        [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$ROOT" ] && echo "$pid"
    done
    return 0
}
beam_running() { [ -n "$(root_pids 'beam\.smp')" ]; }

mirror() {
    # the Debian mirror the machine's own apt uses
    if [ -n "$MIRROR" ]; then echo "$MIRROR"; return; fi
    local found
    found=$(grep -rhoE '^(URIs:|deb) +https?://[^ ]+/debian/?' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
            | grep -v security | head -1 | awk '{print $2}')
    echo "${found:-http://deb.debian.org/debian}"
}

install_root() {
    if [ -x "$ROOT/usr/sbin/rabbitmq-server" ]; then
        return 0
    fi
    command -v debootstrap >/dev/null 2>&1 || {
        log "installing debootstrap"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends debootstrap \
            >/tmp/rabbitmq4-apt.log 2>&1 || { tail -20 /tmp/rabbitmq4-apt.log >&2; die "apt-get install debootstrap failed"; }
    }
    if [ ! -x "$ROOT/usr/bin/apt-get" ]; then
        log "making a Debian 13 root in $ROOT from $(mirror) (about 30 s, once)"
        as_root rm -rf "$ROOT"
        as_root mkdir -p "$(dirname "$ROOT")"
        as_root debootstrap --variant=minbase trixie "$ROOT" "$(mirror)" >/tmp/rabbitmq4-debootstrap.log 2>&1 \
            || { tail -20 /tmp/rabbitmq4-debootstrap.log >&2; die "debootstrap trixie failed"; }
    fi
    printf '#!/bin/sh\nexit 101\n' | as_root tee "$ROOT/usr/sbin/policy-rc.d" >/dev/null  # no services
    as_root chmod +x "$ROOT/usr/sbin/policy-rc.d"
    mount_proc
    log "installing rabbitmq-server in the root"
    in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends rabbitmq-server \
        >/tmp/rabbitmq4-apt.log 2>&1 || {
        in_root apt-get update >/dev/null 2>&1 || true
        in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends rabbitmq-server \
            >/tmp/rabbitmq4-apt.log 2>&1 || { tail -20 /tmp/rabbitmq4-apt.log >&2; die "apt-get install rabbitmq-server failed"; }
    }
}

mount_proc() {
    as_root mkdir -p "$ROOT/proc"
    mountpoint -q "$ROOT/proc" || as_root mount -t proc proc "$ROOT/proc"
}

configure() {
    as_root cp /etc/hosts "$ROOT/etc/hosts"
    as_root mkdir -p "$ROOT/etc/rabbitmq"
    printf 'NODENAME=%s\nNODE_IP_ADDRESS=127.0.0.1\nNODE_PORT=%s\nDIST_PORT=%s\nSERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"\n' \
        "$NODE" "$PORT" "$DIST_PORT" | as_root tee "$ROOT/etc/rabbitmq/rabbitmq-env.conf" >/dev/null
    printf 'listeners.tcp.default = %s:%s\nloopback_users = none\n' "$HOST" "$PORT" \
        | as_root tee "$ROOT/etc/rabbitmq/rabbitmq.conf" >/dev/null
}

start() {
    if port_open && beam_running; then
        log "running on $HOST:$PORT"
        return 0
    fi
    install_root
    mount_proc
    configure
    if ! beam_running; then
        log "starting RabbitMQ 4 ($NODE)"
        in_root rabbitmq-server -detached >/tmp/rabbitmq4-start.log 2>&1 \
            || { cat /tmp/rabbitmq4-start.log >&2; die "rabbitmq-server -detached failed"; }
    fi
    local deadline=$((SECONDS + STARTUP_TIMEOUT))
    until in_root rabbitmqctl -n "$NODE" await_startup >/tmp/rabbitmq4-await.log 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || { cat /tmp/rabbitmq4-await.log >&2; die "RabbitMQ 4 did not start within ${STARTUP_TIMEOUT}s"; }
        sleep 1
    done
    for _ in $(seq 1 20); do port_open && break; sleep 0.5; done
    port_open || die "RabbitMQ 4 started but nothing listens on $HOST:$PORT"
    log "RabbitMQ $(in_root rabbitmqctl -n "$NODE" version 2>/dev/null || echo 4) is up on $HOST:$PORT"
}

stop() {
    if beam_running; then
        log "stopping $NODE"
        timeout 60 chroot "$ROOT" env ERL_EPMD_PORT=$EPMD_PORT HOME=/var/lib/rabbitmq \
            rabbitmqctl -n "$NODE" stop >/tmp/rabbitmq4-stop.log 2>&1 || kill $(root_pids 'beam\.smp') 2>/dev/null || true
        for _ in $(seq 1 40); do beam_running || break; sleep 0.5; done
        beam_running && die "RabbitMQ 4 still running after stop"
        log "stopped"
    fi
    # its epmd (port 4370) and the root's /proc go too
    local epmd
    epmd=$(root_pids epmd)
    [ -z "$epmd" ] || as_root kill $epmd 2>/dev/null || true
    for _ in $(seq 1 20); do [ -z "$(root_pids epmd)" ] && break; sleep 0.1; done
    if mountpoint -q "$ROOT/proc" 2>/dev/null; then as_root umount "$ROOT/proc" || as_root umount -l "$ROOT/proc"; fi
}

case "${1:-start}" in
    start) start ;;
    stop) stop ;;
    status) if port_open && beam_running; then echo up; else echo down; exit 1; fi ;;
    *) die "usage: $0 [start|stop|status]" ;;
esac
