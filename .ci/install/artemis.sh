#!/usr/bin/env bash
# Install, configure and start a local ActiveMQ Artemis broker for the tests:
# AMQP 1.0 on 127.0.0.1:${ARTEMIS_PORT:-5673}, CORE (for the artemis CLI) on
# 127.0.0.1:${ARTEMIS_CORE_PORT:-61616}, nothing else, nothing off loopback.
#
# How this works
#   1. java/mvn come from Debian (openjdk-17-jre-headless, maven) when missing.
#   2. The bin distribution org.apache.activemq:apache-artemis:VERSION:tar.gz:bin
#      is copied from Maven Central with maven-dependency-plugin (it stays in the
#      local Maven repository, so a fresh `.tools/` costs no second download)
#      and unpacked to .tools/artemis/apache-artemis-VERSION/.
#   3. `artemis create` makes the instance .tools/artemis-instance/ once; its
#      pristine etc/broker.xml is kept as broker.xml.orig and the live
#      broker.xml is rendered from it on every start (render_broker_xml below):
#      loopback-only acceptors, plain AMQP addresses become ANYCAST queues,
#      auto-create off for `strict.#` (so tests can provoke amqp:not-found),
#      no HALT on a slow machine, no disk-usage blocking.
#   4. The broker runs as `bin/artemis run` in its own session (setsid nohup);
#      its java pid is in .tools/artemis-instance/data/artemis.pid (the same file
#      bin/artemis-service uses). start waits until the AMQP port accepts.
#
# Usage:
#   bash .ci/install/artemis.sh [start]   # install + configure + start (idempotent)
#   bash .ci/install/artemis.sh stop      # graceful stop (SIGTERM, bounded), then SIGKILL
#   bash .ci/install/artemis.sh status    # "up"/"down", exit 0 when up
#
# Environment:
#   ARTEMIS_VERSION          default 2.40.0 (newest org.apache.activemq release;
#                            later ones moved to groupId org.apache.artemis)
#   ARTEMIS_PORT             AMQP port, default 5673
#   ARTEMIS_CORE_PORT        CORE port for the CLI, default 61616
#   ARTEMIS_STARTUP_TIMEOUT  seconds to wait for the AMQP port, default 120
#   ARTEMIS_INSTANCE_NAME    instance folder under .tools/, default artemis-instance;
#                            with other ports, a private broker next to the shared
#                            one (tests that restart/kill it disturb everyone using it)
set -euo pipefail

VERSION=${ARTEMIS_VERSION:-2.40.0}
HOST=127.0.0.1
PORT=${ARTEMIS_PORT:-5673}
CORE_PORT=${ARTEMIS_CORE_PORT:-61616}
STARTUP_TIMEOUT=${ARTEMIS_STARTUP_TIMEOUT:-120}
USER_NAME=fedgate
USER_PASSWORD=fedgate
DEP_PLUGIN=org.apache.maven.plugins:maven-dependency-plugin:3.6.1

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TOOLS="$ROOT/.tools"
HOME_DIR="$TOOLS/artemis/apache-artemis-$VERSION"
INSTANCE="$TOOLS/${ARTEMIS_INSTANCE_NAME:-artemis-instance}"
PID_FILE="$INSTANCE/data/artemis.pid"
CONSOLE_LOG="$INSTANCE/log/console.log"

log() { echo "[artemis.sh] $*" >&2; }
die() { echo "[artemis.sh] ERROR: $*" >&2; exit 1; }

port_open() {  # $1 = port; true when something accepts TCP on HOST:$1
    timeout 2 bash -c "exec 3<>/dev/tcp/$HOST/$1" 2>/dev/null
}

broker_pid() {  # prints the pid of this instance's live broker, or fails
    local pid
    [ -f "$PID_FILE" ] || return 1
    pid=$(cat "$PID_FILE" 2>/dev/null) || return 1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
    # a recycled pid is not our broker
    tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -q -- "-Dartemis.instance=$INSTANCE " || return 1
    echo "$pid"
}

is_up() { broker_pid >/dev/null && port_open "$PORT"; }

listener_pid() {  # pid of whatever listens on HOST:$1 (empty when unknown)
    ss -Hltnp "sport = :$1" 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2
}

# -- install -----------------------------------------------------------------
ensure_packages() {  # java, mvn, ss (Debian packages)
    local missing=()
    command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
    command -v mvn >/dev/null 2>&1 || missing+=(maven)
    command -v ss >/dev/null 2>&1 || missing+=(iproute2)
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/artemis-apt.log 2>&1; then
        apt-get update -qq >/dev/null 2>&1 || true
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/artemis-apt.log 2>&1 \
            || { tail -20 /tmp/artemis-apt.log >&2; die "apt-get install ${missing[*]} failed"; }
    fi
}

install_dist() {
    [ -x "$HOME_DIR/bin/artemis" ] && return 0
    local dl="$TOOLS/artemis/download"
    local tarball="$dl/apache-artemis-$VERSION-bin.tar.gz"
    mkdir -p "$dl"
    log "fetching org.apache.activemq:apache-artemis:$VERSION:tar.gz:bin (Maven Central)"
    if ! mvn -B -q "$DEP_PLUGIN:copy" \
            -Dartifact="org.apache.activemq:apache-artemis:$VERSION:tar.gz:bin" \
            -DoutputDirectory="$dl" -Dmdep.overWriteReleases=false >/tmp/artemis-mvn.log 2>&1 \
            || [ ! -s "$tarball" ]; then
        tail -20 /tmp/artemis-mvn.log >&2
        die "could not fetch apache-artemis $VERSION from Maven Central"
    fi
    log "unpacking to ${HOME_DIR#"$ROOT"/}"
    rm -rf "$HOME_DIR.partial"
    mkdir -p "$HOME_DIR.partial"
    tar -xzf "$tarball" -C "$HOME_DIR.partial" --strip-components=1 || die "could not unpack $tarball"
    mv "$HOME_DIR.partial" "$HOME_DIR"
    rm -f "$tarball"  # a copy stays in the local Maven repository
}

# -- instance ----------------------------------------------------------------
create_instance() {
    # Recreate when missing or made from another Artemis version/home.
    if [ -f "$INSTANCE/etc/broker.xml.orig" ] \
            && grep -qF "ARTEMIS_HOME='$HOME_DIR'" "$INSTANCE/etc/artemis.profile" 2>/dev/null; then
        return 0
    fi
    if broker_pid >/dev/null; then stop_broker; fi
    log "creating broker instance ${INSTANCE#"$ROOT"/}"
    rm -rf "$INSTANCE"
    "$HOME_DIR/bin/artemis" create "$INSTANCE" \
        --user "$USER_NAME" --password "$USER_PASSWORD" --role amq \
        --allow-anonymous --silent --no-web --no-autotune --nio \
        --host "$HOST" --name fedgate-test --java-memory 512M \
        --no-hornetq-acceptor --no-mqtt-acceptor --no-stomp-acceptor \
        >/tmp/artemis-create.log 2>&1 \
        || { cat /tmp/artemis-create.log >&2; die "artemis create failed"; }
    cp "$INSTANCE/etc/broker.xml" "$INSTANCE/etc/broker.xml.orig"
}

# Prints the broker.xml we want, rendered from the pristine one.
render_broker_xml() {
    python3 - "$INSTANCE/etc/broker.xml.orig" "$HOST" "$PORT" "$CORE_PORT" <<'PY'
import re, sys
path, host, port, core_port = sys.argv[1:5]
xml = open(path, encoding="utf-8").read()

def sub1(pattern, repl, text):
    new, n = re.subn(pattern, lambda m: repl, text, count=1, flags=re.S)
    if n != 1:
        sys.exit(f"broker.xml: pattern not found: {pattern}")
    return new

amqp_opts = ("tcpSendBufferSize=1048576;tcpReceiveBufferSize=1048576;useEpoll=true;"
             "amqpCredits=1000;amqpLowCredits=300;amqpMinLargeMessageSize=102400;"
             "amqpDuplicateDetection=true")
xml = sub1(r"<acceptors>.*?</acceptors>", f"""<acceptors>
         <!-- fedgate tests: AMQP 1.0 only, loopback only -->
         <acceptor name="amqp">tcp://{host}:{port}?protocols=AMQP;{amqp_opts}</acceptor>
         <!-- CORE for the artemis CLI (queue stat/delete), loopback only -->
         <acceptor name="core">tcp://{host}:{core_port}?protocols=CORE;useEpoll=true</acceptor>
      </acceptors>""", xml)
# A 2-core shared CI machine can stall the broker for a while: log, never halt.
xml = sub1(r"<critical-analyzer-policy>HALT</critical-analyzer-policy>",
           "<critical-analyzer-policy>LOG</critical-analyzer-policy>", xml)
# Never block producers because the (shared) disk is getting full.
xml = sub1(r"<max-disk-usage>90</max-disk-usage>", "<max-disk-usage>100</max-disk-usage>", xml)
# Plain AMQP addresses ("orders") are auto-created as ANYCAST queues (Artemis'
# default would be MULTICAST: a topic that drops what nobody subscribed to).
xml = sub1(r'(<address-setting match="#">)',
           r"""<!-- fedgate tests: no auto-create under strict.# (attach -> amqp:not-found) -->
         <address-setting match="strict.#">
            <auto-create-queues>false</auto-create-queues>
            <auto-create-addresses>false</auto-create-addresses>
         </address-setting>
         <address-setting match="#">
            <default-address-routing-type>ANYCAST</default-address-routing-type>
            <default-queue-routing-type>ANYCAST</default-queue-routing-type>""", xml)
sys.stdout.write(xml)
PY
}

CONFIG_CHANGED=0
write_config() {
    local want
    want=$(render_broker_xml) || die "could not render broker.xml"
    if [ "$want" != "$(cat "$INSTANCE/etc/broker.xml")" ]; then
        printf '%s\n' "$want" >"$INSTANCE/etc/broker.xml"
        CONFIG_CHANGED=1
    fi
    # --allow-anonymous lets a client in as the guest user even when the
    # credentials it gave are wrong; credentialsInvalidate keeps ANONYMOUS (no
    # credentials) working but makes a bad PLAIN login fail SASL.
    local login="$INSTANCE/etc/login.config"
    if ! grep -q 'credentialsInvalidate=true' "$login"; then
        sed -i 's/org.apache.activemq.jaas.guest.role="amq";/org.apache.activemq.jaas.guest.role="amq"\n       credentialsInvalidate=true;/' "$login"
        grep -q 'credentialsInvalidate=true' "$login" || die "could not patch $login"
        CONFIG_CHANGED=1
    fi
    # JVM flags for a small shared machine: a 64M initial heap instead of 512M;
    # serial GC and C1 only start the broker in ~5 s instead of ~12 s on 2 busy
    # cores (peak throughput is lower; it is a test broker).
    local profile="$INSTANCE/etc/artemis.profile"
    if grep -q -- '-Xms512M\|-XX:+UseG1GC -XX:+UseStringDeduplication' "$profile"; then
        sed -i -e 's/-Xms512M/-Xms64M/' \
            -e 's/-XX:+UseG1GC -XX:+UseStringDeduplication/-XX:+UseSerialGC -XX:TieredStopAtLevel=1/' \
            "$profile"
        CONFIG_CHANGED=1
    fi
}

# -- run ---------------------------------------------------------------------
# The port is held by something else. Another checkout's test broker (a fresh
# CI clone next to a developer's tree) is stopped: one test broker per port.
# Anything else is an error.
free_port_from_other() {  # $1 = port, $2 = env var that moves it
    local other cmdline i
    other=$(listener_pid "$1")
    cmdline=$(tr '\0' ' ' 2>/dev/null <"/proc/${other:-0}/cmdline" || true)
    if [[ -n "$other" && "$cmdline" == *org.apache.activemq.artemis.boot.Artemis* \
            && "$cmdline" =~ -Dartemis\.instance=([^ ]*/\.tools/artemis-instance)\  ]]; then
        log "port $1 is held by the test broker of another checkout (pid $other, ${BASH_REMATCH[1]}); stopping it"
        kill -TERM "$other" 2>/dev/null || true
        for i in $(seq 1 150); do kill -0 "$other" 2>/dev/null || break; sleep 0.2; done
        kill -0 "$other" 2>/dev/null && kill -KILL "$other" 2>/dev/null
        for i in $(seq 1 50); do port_open "$1" || return 0; sleep 0.1; done
    fi
    die "port $HOST:$1 is taken by another process (pid ${other:-unknown}: ${cmdline:0:200}); stop it or set $2"
}

start_broker() {
    if ! broker_pid >/dev/null; then
        if port_open "$PORT"; then free_port_from_other "$PORT" ARTEMIS_PORT; fi
        if port_open "$CORE_PORT"; then free_port_from_other "$CORE_PORT" ARTEMIS_CORE_PORT; fi
    fi
    local t0=$SECONDS pid
    if ! pid=$(broker_pid); then
        log "starting Artemis $VERSION (AMQP $HOST:$PORT)"
        mkdir -p "$INSTANCE/log"
        # bin/artemis execs java, so $! is the broker's java pid; fd 9 (the
        # lock) is closed for it, or the broker would hold the lock forever.
        setsid nohup "$INSTANCE/bin/artemis" run >"$CONSOLE_LOG" 2>&1 </dev/null 9>&- &
        pid=$!
        echo "$pid" >"$PID_FILE"
    else
        log "broker pid $pid is running but $HOST:$PORT is not open yet; waiting"
    fi
    local deadline=$((SECONDS + STARTUP_TIMEOUT))
    while ! port_open "$PORT"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 40 "$CONSOLE_LOG" >&2 || true
            rm -f "$PID_FILE"
            die "Artemis exited during startup (log: ${CONSOLE_LOG#"$ROOT"/})"
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            tail -n 40 "$CONSOLE_LOG" >&2 || true
            die "Artemis did not open $HOST:$PORT within ${STARTUP_TIMEOUT}s (pid $pid still running)"
        fi
        sleep 0.2
    done
    log "Artemis is up on amqp://$HOST:$PORT (pid $pid, $((SECONDS - t0))s)"
}

stop_broker() {
    local pid i
    if ! pid=$(broker_pid); then
        rm -f "$PID_FILE"
        log "not running"
        return 0
    fi
    log "stopping pid $pid"
    kill -TERM "$pid" 2>/dev/null || true  # the broker's shutdown hook stops it cleanly
    for i in $(seq 1 150); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "still running after 30s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && die "pid $pid survives SIGKILL"
    fi
    rm -f "$PID_FILE"
    log "stopped"
}

# One start/stop at a time per instance (several test runs may share it).
with_lock() {
    mkdir -p "$TOOLS"
    exec 9>"$INSTANCE.lock"
    flock -w 300 9 || die "another artemis.sh held $INSTANCE.lock for 300s"
}

cmd=${1:-start}
case "$cmd" in
    start)
        with_lock
        if [ -x "$HOME_DIR/bin/artemis" ] && [ -f "$INSTANCE/etc/broker.xml.orig" ] && is_up; then
            write_config
            if [ "$CONFIG_CHANGED" -eq 1 ]; then
                log "configuration changed; restarting"
                stop_broker
                start_broker
            else
                log "already running on amqp://$HOST:$PORT (pid $(broker_pid))"
            fi
            exit 0
        fi
        ensure_packages
        install_dist
        create_instance
        write_config
        if [ "$CONFIG_CHANGED" -eq 1 ] && broker_pid >/dev/null; then
            log "configuration changed; restarting"
            stop_broker
        fi
        start_broker
        ;;
    stop)
        with_lock
        stop_broker
        ;;
    status)
        if is_up; then echo "up"; exit 0; else echo "down"; exit 1; fi
        ;;
    *)
        die "usage: $0 [start|stop|status]"
        ;;
esac
