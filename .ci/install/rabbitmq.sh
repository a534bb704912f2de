#!/usr/bin/env bash
# Install, configure and start a local RabbitMQ 3.10 (Debian bookworm package)
# with the AMQP 1.0 plugin, listening on 127.0.0.1:5682 only: a port of its own, so a
# fedgate node (make run) can take AMQP's 5672 while it runs (RABBITMQ_PORT overrides).
#
# Idempotent: each step is skipped when already done; a second run while the
# broker is up only checks it (well under 3 s).
#
# Usage:
#   bash .ci/install/rabbitmq.sh          # install + configure + start (default)
#   bash .ci/install/rabbitmq.sh start    # same as above
#   bash .ci/install/rabbitmq.sh stop     # stop the broker if running
#   bash .ci/install/rabbitmq.sh status   # exit 0 if up (port open, server VM running), else 1
#
# Environment:
#   RABBITMQ_STARTUP_TIMEOUT  seconds to wait for startup (default 120)
set -euo pipefail

NODE=rabbit@localhost
HOST=127.0.0.1
PORT=${RABBITMQ_PORT:-5682}
STARTUP_TIMEOUT=${RABBITMQ_STARTUP_TIMEOUT:-120}
# Any Erlang VM started here (server or CLI) may spawn epmd: keep it on loopback.
export ERL_EPMD_ADDRESS=127.0.0.1
ENV_CONF=/etc/rabbitmq/rabbitmq-env.conf
CONF=/etc/rabbitmq/rabbitmq.conf
# NODENAME/NODE_IP_ADDRESS as in shared/REFERENCE.md; the extra Erlang arg keeps
# the inter-node distribution port (25672) on loopback too.
ENV_CONTENT=$'NODENAME=rabbit@localhost\nNODE_IP_ADDRESS=127.0.0.1\nSERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"\n'
CONF_CONTENT="listeners.tcp.default = 127.0.0.1:$PORT"$'\n'

log() { echo "[rabbitmq.sh] $*" >&2; }
die() { echo "[rabbitmq.sh] ERROR: $*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi
}

# True when something accepts TCP connections on HOST:PORT (bash /dev/tcp, no deps).
port_open() {
    timeout 2 bash -c "exec 3<>/dev/tcp/$HOST/$PORT" 2>/dev/null
}

# True when the RabbitMQ server's Erlang VM (beam.smp ... -s rabbit boot) is
# running; CLI VMs (rabbitmqctl, rabbitmq-plugins) do not match.
beam_running() {
    # the host's broker only: RabbitMQ 4 (.ci/install/rabbitmq4.sh) runs in a root of its own
    local pid
    for pid in $(pgrep -f 'beam\.smp .* -s rabbit boot' 2>/dev/null); do
        [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "/" ] && return 0
    done
    return 1
}

# Fast check: port answers and the beam process is there.
is_up() {
    port_open && beam_running
}

install_pkg() {
    if dpkg-query -W -f='${Status}' rabbitmq-server 2>/dev/null | grep -q 'install ok installed'; then
        return 0
    fi
    log "installing rabbitmq-server (Debian package)"
    export DEBIAN_FRONTEND=noninteractive
    if ! as_root apt-get install -y --no-install-recommends rabbitmq-server >/tmp/rabbitmq-apt.log 2>&1; then
        log "apt-get install failed; retrying after apt-get update"
        as_root apt-get update >/dev/null 2>&1 || true
        as_root apt-get install -y --no-install-recommends rabbitmq-server >/tmp/rabbitmq-apt.log 2>&1 \
            || { tail -20 /tmp/rabbitmq-apt.log >&2; die "apt-get install rabbitmq-server failed"; }
    fi
}

CONFIG_CHANGED=0
write_config() {
    as_root mkdir -p /etc/rabbitmq
    if [ "$(cat "$ENV_CONF" 2>/dev/null || true)"$'\n' != "$ENV_CONTENT" ]; then
        log "writing $ENV_CONF"
        printf '%s' "$ENV_CONTENT" | as_root tee "$ENV_CONF" >/dev/null
        CONFIG_CHANGED=1
    fi
    if [ "$(cat "$CONF" 2>/dev/null || true)"$'\n' != "$CONF_CONTENT" ]; then
        log "writing $CONF"
        printf '%s' "$CONF_CONTENT" | as_root tee "$CONF" >/dev/null
        CONFIG_CHANGED=1
    fi
}

enable_plugin() {
    local enabled=/etc/rabbitmq/enabled_plugins
    if [ -f "$enabled" ] && grep -q 'rabbitmq_amqp1_0' "$enabled"; then
        return 0
    fi
    log "enabling rabbitmq_amqp1_0 (offline)"
    as_root rabbitmq-plugins enable --offline rabbitmq_amqp1_0 >/dev/null \
        || die "rabbitmq-plugins enable --offline rabbitmq_amqp1_0 failed"
}

start_broker() {
    if is_up; then
        log "already running on $HOST:$PORT"
        return 0
    fi
    if ! beam_running; then
        log "starting rabbitmq-server (detached)"
        # -detached runs rabbitmq-server as the rabbitmq user via Debian's wrapper.
        as_root env ERL_EPMD_ADDRESS=127.0.0.1 \
            rabbitmq-server -detached >/tmp/rabbitmq-start.log 2>&1 \
            || { cat /tmp/rabbitmq-start.log >&2; die "rabbitmq-server -detached failed"; }
    else
        log "beam.smp is running but port $PORT is not open yet; waiting"
    fi
    log "waiting for startup (timeout ${STARTUP_TIMEOUT}s)"
    # `rabbitmqctl await_startup` fails at once while the node is not yet
    # registered with epmd, so retry it until the overall deadline.
    local deadline=$((SECONDS + STARTUP_TIMEOUT)) remaining ok=0
    while :; do
        remaining=$((deadline - SECONDS))
        [ "$remaining" -gt 0 ] || break
        if timeout "$remaining" rabbitmqctl -n "$NODE" await_startup >/tmp/rabbitmq-await.log 2>&1; then
            ok=1
            break
        fi
        beam_running || { sleep 1; beam_running; } || break
        sleep 1
    done
    if [ "$ok" -ne 1 ]; then
        cat /tmp/rabbitmq-await.log >&2 || true
        tail -n 30 "/var/log/rabbitmq/$NODE.log" >&2 2>/dev/null || true
        if beam_running; then
            die "RabbitMQ did not finish starting within ${STARTUP_TIMEOUT}s"
        else
            die "RabbitMQ node exited during startup (see /var/log/rabbitmq/)"
        fi
    fi
    # await_startup returns when the app is booted; the listener should be open.
    local i
    for i in $(seq 1 20); do
        port_open && break
        sleep 0.5
    done
    port_open || die "RabbitMQ started but nothing listens on $HOST:$PORT"
    log "RabbitMQ is up on $HOST:$PORT (AMQP 1.0 enabled)"
}

stop_broker() {
    if ! beam_running && ! port_open; then
        log "not running"
        return 0
    fi
    if ! command -v rabbitmqctl >/dev/null 2>&1; then
        die "rabbitmqctl not found but something listens on $HOST:$PORT"
    fi
    log "stopping $NODE"
    if ! timeout 60 rabbitmqctl -n "$NODE" stop >/tmp/rabbitmq-stop.log 2>&1; then
        cat /tmp/rabbitmq-stop.log >&2 || true
        die "rabbitmqctl stop failed"
    fi
    local i
    for i in $(seq 1 40); do
        beam_running || break
        sleep 0.5
    done
    beam_running && die "beam.smp still running after stop"
    log "stopped"
}

cmd=${1:-start}
case "$cmd" in
    start|"")
        # Fast path: already installed, configured and running.
        if command -v rabbitmq-server >/dev/null 2>&1 && is_up; then
            write_config
            enable_plugin
            if [ "$CONFIG_CHANGED" -eq 1 ]; then
                log "config changed while running: restarting"
                stop_broker
                start_broker
            fi
            log "running on $HOST:$PORT"
            exit 0
        fi
        install_pkg
        write_config
        enable_plugin
        if [ "$CONFIG_CHANGED" -eq 1 ] && beam_running; then
            # started with another config (an earlier port, or the package's own start)
            log "config changed: restarting"
            stop_broker
        fi
        start_broker
        ;;
    stop)
        stop_broker
        ;;
    status)
        if is_up; then echo "up"; exit 0; else echo "down"; exit 1; fi
        ;;
    *)
        die "usage: $0 [start|stop|status]"
        ;;
esac
