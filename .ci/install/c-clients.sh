#!/usr/bin/env bash
# Build quiet benchmark variants of Debian's Qpid Proton C examples `send` and
# `receive` into .build/bench/ (git-ignored) at the repository root.
#
# Debian's sources (package libqpid-proton11-dev-examples) are copied to
# .build/bench/src/ and adapted here at build time; no Debian source is kept in
# the repository.
#
# Resulting programs (positional args, as the stock examples, plus one optional):
#   .build/bench/send    HOST PORT ADDRESS COUNT [BODY_BYTES=100] [RATE=0]
#   .build/bench/receive HOST PORT ADDRESS COUNT [CREDIT_WINDOW=1000]
# Both connect to HOST:PORT, attach to ADDRESS and exit after COUNT messages
# (send: COUNT accepted; receive: COUNT received and accepted); exit status 0 on
# success, 1 on any error condition. receive prints only one summary line.
# send's RATE paces it to RATE messages per second (0: as fast as credit allows),
# so that a broker's CPU per message can be compared at the same rate.
#
# Idempotent: installs packages only if missing; rebuilds only when a binary
# is missing or this script / the installed example sources changed.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/../.." && pwd)
OUT="$REPO_ROOT/.build/bench"
SRC="$OUT/src"
PKGS=(libqpid-proton11-dev-examples libqpid-proton11-dev pkg-config gcc)

log() { echo "[c-clients.sh] $*" >&2; }
die() { echo "[c-clients.sh] ERROR: $*" >&2; exit 1; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi; }

installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

install_pkgs() {
    local missing=() p
    for p in "${PKGS[@]}"; do installed "$p" || missing+=("$p"); done
    [ "${#missing[@]}" -eq 0 ] && return 0
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! as_root apt-get install -y --no-install-recommends "${missing[@]}" >/tmp/c-clients-apt.log 2>&1; then
        as_root apt-get update >/dev/null 2>&1 || true
        as_root apt-get install -y --no-install-recommends "${missing[@]}" >/tmp/c-clients-apt.log 2>&1 \
            || { tail -20 /tmp/c-clients-apt.log >&2; die "apt-get install ${missing[*]} failed"; }
    fi
}

# Directory holding the C examples, found from the package's file list.
examples_dir() {
    local f
    f=$(dpkg -L libqpid-proton11-dev-examples | grep -E '/examples/c/send\.c$' | head -n1) || true
    [ -n "$f" ] && [ -f "$f" ] || die "send.c not found in libqpid-proton11-dev-examples"
    dirname "$f"
}

# perl -0 substitution that must match exactly once (fails loudly if Debian's
# source changed in a way this script does not expect).
# usage: edit FILE 'perl-regex' 'replacement'
edit() {
    local file=$1 re=$2 rep=$3
    RE="$re" REP="$rep" perl -0 -i -e '
        local $/; my $s = <>;
        my $re = $ENV{RE}; my $rep = $ENV{REP};
        my $n = () = $s =~ /$re/g;
        if ($n != 1) { print STDERR "pattern matched $n times: $re\n"; print $s; exit 3; }
        $s =~ s{$re}{
            my @g = map { defined $_ ? $_ : "" } ($1, $2, $3);
            my $r = $rep; $r =~ s/\$(\d)/$g[$1 - 1]/g; $r
        }e;
        print $s;
    ' "$file" || die "patching $(basename "$file") failed (pattern: $re)"
}

patch_receive() {
    local f="$SRC/receive.c"
    # Credit window: variable, default 1000 (stock: whole COUNT granted at once).
    edit "$f" 'static const int BATCH = 1000;[^\n]*' \
        'static int BATCH = 1000; /* credit window (bench: 5th arg) */'
    # Quiet: decode each message (validates it) but do not print it.
    edit "$f" '/\* Print the decoded message \*/' '/* bench: decoded, not printed */'
    edit "$f" '\n\s*pn_string_t \*s = pn_string\(NULL\);\n\s*pn_inspect\(pn_message_body\(m\), s\);\n\s*printf\("%s\\n", pn_string_get\(s\)\);\n\s*pn_free\(s\);' \
        ''
    # An empty delivery is reported as an error instead of an assertion abort.
    edit "$f" '(static void decode_message\(pn_rwbytes_t data\) \{\n)' \
        '$1  if (data.size == 0 || !data.start) {
    fprintf(stderr, "decode_message: empty message\n");
    exit_code = 1;
    return;
  }
'
    # Initial credit: at most one window, never more than COUNT.
    edit "$f" 'pn_link_flow\(l, app->message_count \? app->message_count : BATCH\);' \
        'pn_link_flow(l, (app->message_count && app->message_count < BATCH) ? app->message_count : BATCH);'
    # Top the window up as messages arrive (never granting beyond COUNT).
    edit "$f" '\} else if \(\+\+app->received >= app->message_count\) \{' \
        '} else if (++app->received < app->message_count) {
           int want = app->message_count - app->received;
           int credit = pn_link_credit(l);
           if (want > BATCH) want = BATCH;
           if (credit < BATCH/2 && credit < want) pn_link_flow(l, want - credit);
         } else {'
    # Optional 5th argument: credit window.
    edit "$f" '(app\.message_count = \(argc > 4\) \? atoi\(argv\[4\]\) : 10;)' \
        '$1
  if (argc > 5 && atoi(argv[5]) > 0) BATCH = atoi(argv[5]);'
}

patch_send() {
    local f="$SRC/send.c"
    # Body: BODY_BYTES (default 100) of binary instead of the map {"sequence": n}.
    edit "$f" '\n\s*pn_data_put_map\(body\);\n\s*pn_data_enter\(body\);\n\s*pn_data_put_string\(body, [^\n]*\n\s*pn_data_put_int\(body, app->sent\);[^\n]*\n\s*pn_data_exit\(body\);' \
        '
  {
    static char buf[65536];
    size_t n = (size_t)app->body_size;
    int len;
    if (n > sizeof(buf)) n = sizeof(buf);
    memset(buf, '"'"'x'"'"', n);
    len = snprintf(buf, sizeof(buf), "seq=%d;", app->sent);
    if (len > 0 && (size_t)len < n) buf[len] = '"'"'x'"'"'; /* drop the NUL */
    pn_data_put_binary(body, pn_bytes(n, buf));
  }'
    edit "$f" '(\n\s*int message_count;)' '$1
  int body_size;'
    edit "$f" '(#include <stdlib\.h>)' '$1
#include <string.h>'
    # Settle acknowledged deliveries (stock keeps them all until exit).
    edit "$f" '(if \(pn_delivery_remote_state\(d\) == PN_ACCEPTED\) \{)' '$1
       pn_delivery_settle(d);'
    # Optional 5th argument: body size in bytes (default 100).
    edit "$f" '(app\.message_count = \(argc > 4\) \? atoi\(argv\[4\]\) : 10;)' \
        '$1
  app.body_size = (argc > 5 && atoi(argv[5]) >= 0) ? atoi(argv[5]) : 100;
  app.rate = (argc > 6 && atof(argv[6]) > 0) ? atof(argv[6]) : 0;'
    # Optional 6th argument: pace to RATE messages/s. Sending moves out of the
    # flow handler into send_some(), which a 1 ms proactor timer wakes (through
    # pn_connection_wake, so the link is touched only in its connection's batch).
    edit "$f" '(\n\s*int body_size;)' '$1
  double rate, t0;
  int timer_set;
  pn_link_t *sender;'
    edit "$f" '(#include <string\.h>)' '$1
#include <time.h>'
    edit "$f" '(?s)(/\* Returns true to continue, false if finished \*/)' \
        'static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* bench: send what credit and the pace allow; re-arm the timer when paced. */
static void send_some(app_data_t *app) {
  pn_link_t *sender = app->sender;
  int limit = app->message_count;
  if (!sender) return;
  if (app->rate > 0) {
    double t = now_s();
    if (app->t0 == 0) app->t0 = t;
    limit = (int)((t - app->t0) * app->rate) + 1;
    if (limit > app->message_count) limit = app->message_count;
  }
  while (pn_link_credit(sender) > 0 && app->sent < limit) {
    ++app->sent;
    pn_delivery(sender, pn_dtag((const char *)&app->sent, sizeof(app->sent)));
    send_message(app, sender);
  }
  if (app->rate > 0 && app->sent < app->message_count && pn_link_credit(sender) > 0
      && !app->timer_set) {
    app->timer_set = 1;
    pn_proactor_set_timeout(app->proactor, 1);
  }
}

$1'
    edit "$f" '(?s)case PN_LINK_FLOW: \{.*?\n     break;\n   \}' \
        'case PN_LINK_FLOW: {
     /* The peer has given us some credit, now we can send messages */
     app->sender = pn_event_link(event);
     send_some(app);
     break;
   }

   case PN_CONNECTION_WAKE:
     send_some(app);
     break;

   case PN_PROACTOR_TIMEOUT:
     app->timer_set = 0;
     if (app->sender && app->acknowledged < app->message_count)
       pn_connection_wake(pn_session_connection(pn_link_session(app->sender)));
     break;'
}

# SASL ANONYMOUS offered (stock: no SASL layer): RabbitMQ 4 requires SASL; fedgate,
# RabbitMQ 3.10 and Artemis take either.
patch_sasl() {
    local f
    for f in "$SRC/send.c" "$SRC/receive.c"; do
        edit "$f" 'pn_proactor_connect2\(app\.proactor, NULL, NULL, addr\);' \
            '{
    pn_transport_t *t = pn_transport();
    pn_sasl_allowed_mechs(pn_sasl(t), "ANONYMOUS");
    pn_proactor_connect2(app.proactor, NULL, t, addr);
  }'
        edit "$f" '(#include <proton/connection\.h>)' '$1
#include <proton/sasl.h>'
    done
}

build() {
    local exdir flags stamp want
    exdir=$(examples_dir)
    want=$( { sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1;
              cat "$exdir/send.c" "$exdir/receive.c" | sha256sum | cut -d' ' -f1;
              dpkg-query -W -f='${Version}' libqpid-proton11-dev; } | tr '\n' ' ')
    stamp="$OUT/.stamp"
    if [ -x "$OUT/send" ] && [ -x "$OUT/receive" ] && [ "$(cat "$stamp" 2>/dev/null || true)" = "$want" ]; then
        log "up to date: .build/bench/send, .build/bench/receive"
        return 0
    fi
    log "building quiet send/receive from $exdir"
    rm -rf "$SRC"
    mkdir -p "$SRC"
    cp "$exdir/send.c" "$exdir/receive.c" "$SRC/"
    chmod u+w "$SRC"/*.c
    patch_send
    patch_receive
    patch_sasl
    flags=$(pkg-config --cflags --libs libqpid-proton) || die "pkg-config libqpid-proton failed"
    local t
    for t in send receive; do
        # shellcheck disable=SC2086
        gcc -O2 -Wall -o "$OUT/$t.tmp" "$SRC/$t.c" $flags -lpthread \
            || die "compiling $t.c failed"
        mv -f "$OUT/$t.tmp" "$OUT/$t"
    done
    printf '%s' "$want" >"$stamp"
    log "built .build/bench/send and .build/bench/receive"
}

install_pkgs
build
