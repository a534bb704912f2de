#!/usr/bin/env bash
# Build .build/bench/send-durable: the quiet benchmark sender of c-clients.sh
# with the AMQP header's durable field set on every message
# (pn_message_set_durable), for bench/durable.py.
#
#   .build/bench/send-durable HOST PORT ADDRESS COUNT [BODY_BYTES=100]
#
# Runs .ci/install/c-clients.sh first (packages, patched sources in
# .build/bench/src/), then patches a copy of its send.c here at build time; no
# Debian source is kept in the repository. Idempotent: rebuilds only when the
# binary is missing or this script / the patched send.c changed.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/../.." && pwd)
OUT="$REPO_ROOT/.build/bench"
SRC="$OUT/src"

log() { echo "[c-clients-durable.sh] $*" >&2; }
die() { echo "[c-clients-durable.sh] ERROR: $*" >&2; exit 1; }

bash "$SCRIPT_DIR/c-clients.sh"
[ -f "$SRC/send.c" ] || die "$SRC/send.c missing after c-clients.sh"

want=$( { sha256sum "${BASH_SOURCE[0]}" "$SRC/send.c" | cut -d' ' -f1; } | tr '\n' ' ')
stamp="$OUT/.stamp-durable"
if [ -x "$OUT/send-durable" ] && [ "$(cat "$stamp" 2>/dev/null || true)" = "$want" ]; then
    log "up to date: .build/bench/send-durable"
    exit 0
fi

cp "$SRC/send.c" "$SRC/send-durable.c"
# Set the header's durable field right after the message is cleared (once per send).
count=$(grep -c 'pn_message_clear(app->message);' "$SRC/send-durable.c" || true)
[ "$count" = "1" ] || die "expected one pn_message_clear(app->message) in send.c, found $count"
sed -i 's|pn_message_clear(app->message);|pn_message_clear(app->message);\n  pn_message_set_durable(app->message, true);|' \
    "$SRC/send-durable.c"
grep -q 'pn_message_set_durable(app->message, true);' "$SRC/send-durable.c" || die "patch failed"

flags=$(pkg-config --cflags --libs libqpid-proton) || die "pkg-config libqpid-proton failed"
# shellcheck disable=SC2086
gcc -O2 -Wall -o "$OUT/send-durable.tmp" "$SRC/send-durable.c" $flags -lpthread \
    || die "compiling send-durable.c failed"
mv -f "$OUT/send-durable.tmp" "$OUT/send-durable"
printf '%s' "$want" >"$stamp"
log "built .build/bench/send-durable"
