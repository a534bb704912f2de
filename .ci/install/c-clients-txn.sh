#!/usr/bin/env bash
# Build .build/bench/txsend from bench/txsend.c: the benchmark sender of bench/transactions.py
# (plain, or in AMQP transactions of BATCH messages).
#
#   .build/bench/txsend HOST PORT ADDRESS COUNT BATCH [BODY_BYTES=100 [DURABLE=0]]
#
# Runs .ci/install/c-clients.sh first (proton's C library and headers, and the quiet receiver
# .build/bench/receive that the benchmark uses). Idempotent: rebuilds only when the binary is
# missing or this script / bench/txsend.c changed.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/../.." && pwd)
OUT="$REPO_ROOT/.build/bench"
SOURCE="$REPO_ROOT/bench/txsend.c"

log() { echo "[c-clients-txn.sh] $*" >&2; }
die() { echo "[c-clients-txn.sh] ERROR: $*" >&2; exit 1; }

bash "$SCRIPT_DIR/c-clients.sh"
want=$( { sha256sum "${BASH_SOURCE[0]}" "$SOURCE" | cut -d' ' -f1; } | tr '\n' ' ')
stamp="$OUT/.stamp-txn"
if [ -x "$OUT/txsend" ] && [ "$(cat "$stamp" 2>/dev/null || true)" = "$want" ]; then
    log "up to date: .build/bench/txsend"
    exit 0
fi
flags=$(pkg-config --cflags --libs libqpid-proton-proactor libqpid-proton-core 2>/dev/null \
        || pkg-config --cflags --libs libqpid-proton) || die "pkg-config libqpid-proton failed"
# shellcheck disable=SC2086
gcc -O2 -Wall -Wextra -Wno-unused-parameter -o "$OUT/txsend" "$SOURCE" $flags \
    || die "gcc failed"
echo "$want" > "$stamp"
log "built .build/bench/txsend"
