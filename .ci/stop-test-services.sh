#!/usr/bin/env bash
# Stops the test brokers (and etcd) and whatever the tests started, then checks that nothing
# of theirs is left: no listener on the brokers' ports (AMQP, Artemis CORE, Erlang
# distribution and port mapper) nor on those `make run` needs (5672, 8080), no process
# running from pytest's temporary directories (nodes, clients). Exit 1 if something was
# left. (pytest itself fails the run when a process a test started still listens:
# tests/support/listeners.py; the brokers outlive pytest, so they are checked here.)
set -uo pipefail
cd "$(dirname "$0")/.."
log() { echo "[stop-test-services] $*" >&2; }
rc=0
bash .ci/install/rabbitmq.sh stop || rc=1
bash .ci/install/rabbitmq4.sh stop || rc=1
bash .ci/install/artemis.sh stop || rc=1
bash .ci/install/etcd.sh stop || rc=1
# the Erlang port mapper RabbitMQ's tools started (refuses while a node is registered)
if command -v epmd >/dev/null 2>&1; then epmd -kill >/dev/null 2>&1 || true; fi

# processes started by tests run from or with files under pytest's temp dirs
leftover=$(pgrep -f "pytest-of-$(id -un)/" || true)
if [ -n "$leftover" ]; then
    log "processes left by tests (stopping them):"
    ps -o pid=,args= -p $leftover | cut -c1-200 >&2 || true
    kill $leftover 2>/dev/null || true
    sleep 1
    kill -9 $leftover 2>/dev/null || true
    rc=1
fi

# Listeners: `ss -Hltn` lists sockets in LISTEN state only (a TIME_WAIT socket left by a
# closed connection is not one). Without ss, a connect() says whether something accepts.
listening() {  # $1 = port (any local address)
    if command -v ss >/dev/null 2>&1; then
        [ -n "$(ss -Hltn "sport = :$1" 2>/dev/null)" ]
    else
        timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
    fi
}
holder() {  # $1 = port: "pid command" of the process that listens, when ss may say
    local pid
    pid=$(ss -Hltnp "sport = :$1" 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
    [ -n "$pid" ] && echo "$pid $(tr '\0\n' '  ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-160)"
}
started_at() { awk '{ sub(/^.*\) /, ""); print $20 }' "/proc/$1/stat" 2>/dev/null; }  # clock ticks after boot

# The suite's brokers: RabbitMQ 3.10 (AMQP, Erlang distribution 25672), RabbitMQ 4.0 (AMQP,
# distribution 25684, its own epmd 4370), Artemis (AMQP, CORE), etcd (clients, peers).
# Nothing else has them.
for port in "${RABBITMQ_PORT:-5682}" 25672 "${RABBITMQ4_PORT:-5684}" 25684 4370 \
            "${ARTEMIS_PORT:-5673}" "${ARTEMIS_CORE_PORT:-61616}" \
            "${ETCD_PORT:-2479}" "${ETCD_PEER_PORT:-2480}"; do
    if listening "$port"; then
        log "something still listens on port $port: $(holder "$port" || echo '(process unknown)')"
        rc=1
    fi
done
# What `make run` needs (AMQP 5672, the admin API 8080) and the Erlang port mapper: the
# suite must not hold them, but they may be someone's own (a node started before the
# tests, a system epmd, another user's process: ss names only our own). Only a process
# of ours started after this run began (our parent, .ci/run-tests.sh) fails it.
run_started=$(started_at "$PPID")
for port in 5672 8080 4369; do
    listening "$port" || continue
    what=$(holder "$port" || true)
    since=${what:+$(started_at "${what%% *}")}
    if [ -n "$since" ] && [ -n "$run_started" ] && [ "$since" -ge "$run_started" ]; then
        log "something still listens on port $port: $what"
        rc=1
    else
        log "note: port $port is held by ${what:-a process we may not see}, not started by the tests"
    fi
done
[ "$rc" -eq 0 ] && log "brokers stopped; nothing left listening"
exit "$rc"
