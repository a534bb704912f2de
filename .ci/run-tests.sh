#!/usr/bin/env bash
# Runs the test suite, then stops what it started: the brokers (RabbitMQ 3.10 on 5682,
# RabbitMQ 4.0 on 5684, Artemis on 5673, etcd on 2479) and any process a test left behind, and fails if
# anything still listens. Also on failure and on Ctrl-C, so `make test` then `make run` works.
#   bash .ci/run-tests.sh [pytest args...]
#
# Two pytest processes at once (PYTEST_PARALLEL=0: one): most tests wait on real processes,
# so two shorten the run on 2 cores. One runs the tests marked `side`: those of the shared
# brokers (some restart or kill them), one after the other, and tests/faults; the other runs
# everything else. Then the tests marked `serial` (the nemesis: its gaps are timed) run alone.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
MARKS="not fuzz_long and not soak"
side=""

stop() { bash .ci/stop-test-services.sh; }
trap '[ -n "$side" ] && kill "$side" 2>/dev/null; stop; exit 130' INT TERM

ok() { [ "$1" -eq 0 ] || [ "$1" -eq 5 ]; }  # 5: the arguments select none of these tests

if [ "${PYTEST_PARALLEL:-1}" != "0" ]; then
    base=$(mktemp -d "${TMPDIR:-/tmp}/fedgate-tests.XXXXXX")
    FEDGATE_TEST_PORTS=20000-26000 "$PY" -m pytest -m "$MARKS and side and not serial" --basetemp "$base/side" "$@" \
        > "$base/side.log" 2>&1 &
    side=$!
    FEDGATE_TEST_PORTS=26000-32000 "$PY" -m pytest -m "$MARKS and not side and not serial" --basetemp "$base/rest" "$@"
    rest=$?
    wait "$side"
    brokers=$?
    side=""
    echo "============= the brokers' tests and tests/faults (run beside the others) ============="
    cat "$base/side.log"
    "$PY" -m pytest -m "$MARKS and serial" --basetemp "$base/serial" "$@"
    serial=$?
    status=0
    for code in "$rest" "$brokers" "$serial"; do
        ok "$code" || status=$code
    done
    rm -rf "$base"
else
    "$PY" -m pytest "$@"
    status=$?
fi
if ! stop && [ "$status" -eq 0 ]; then
    status=1
fi
exit "$status"
