#!/usr/bin/env bash
# Stops the test brokers and whatever the tests started, then checks that nothing
# of theirs is left: no listener on the brokers' ports, no process running from
# pytest's temporary directories (nodes, clients). Exit 1 if something was left.
set -uo pipefail
cd "$(dirname "$0")/.."
log() { echo "[stop-test-services] $*" >&2; }
rc=0
bash .ci/install/rabbitmq.sh stop || rc=1
bash .ci/install/rabbitmq4.sh stop || rc=1
bash .ci/install/artemis.sh stop || rc=1
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

for port in "${RABBITMQ_PORT:-5682}" "${RABBITMQ4_PORT:-5684}" "${ARTEMIS_PORT:-5673}"; do
    if timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null; then
        log "something still listens on 127.0.0.1:$port"
        rc=1
    fi
done
[ "$rc" -eq 0 ] && log "brokers stopped; nothing left listening"
exit "$rc"
