#!/usr/bin/env bash
# Runs the test suite, then stops what it started: the brokers (RabbitMQ 3.10 on 5682,
# RabbitMQ 4.0 on 5684, Artemis on 5673, etcd on 2479) and any process a test left behind, and fails if
# anything still listens. Also on failure and on Ctrl-C, so `make test` then `make run` works.
#   bash .ci/run-tests.sh [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

stop() { bash .ci/stop-test-services.sh; }
trap 'stop; exit 130' INT TERM

# two workers (pytest-xdist; PYTEST_WORKERS=0 for one process): most tests wait on real
# processes, so two at once nearly halve the run on 2 cores; the tests of the shared brokers
# stay on one worker (tests/conftest.py)
workers=${PYTEST_WORKERS:-2}
# every worker collects the same tests: the random large-message mix's seed (in its tests' ids)
# is drawn once here (support/large_mix.py)
export FEDGATE_LARGE_SEED=${FEDGATE_LARGE_SEED:-$(( (RANDOM << 15) | RANDOM ))}
if [ "$workers" -gt 0 ]; then
    set -- -n "$workers" --dist loadgroup "$@"
fi
"$PY" -m pytest "$@"
status=$?
if ! stop && [ "$status" -eq 0 ]; then
    status=1
fi
exit "$status"
