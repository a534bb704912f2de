# fedgate: two commands on a fresh Debian machine.
#   make run    set up, then start a node on the embedded default
#   make test   set up every test prerequisite, then run the test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONFIG ?= deploy/examples/standalone.toml
PYTEST_ARGS ?=

.PHONY: run test venv system npm brokers nemesis bench bench-deps bench-durable bench-fragments bench-proxy bench-replication bench-transactions fuzz fuzz-large soak replication-long load-demo clean

$(STAMP): pyproject.toml proxy/amqp/_fastpath.c
	bash .ci/install/system.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

npm:
	bash .ci/install/npm.sh

run: venv
	$(VENV)/bin/fedgate serve --config $(CONFIG) $(if $(LISTEN),--listen $(LISTEN))

brokers:
	bash .ci/install/rabbitmq.sh
	bash .ci/install/rabbitmq4.sh
	bash .ci/install/artemis.sh

test: venv npm brokers
	bash .ci/install/chromium.sh
	bash .ci/install/dmz.sh
	bash .ci/install/toxiproxy.sh
	bash .ci/install/etcd.sh
	bash .ci/install/java.sh
	bash .ci/install/jms.sh
	bash .ci/install/go-client.sh
	PY=$(PY) bash .ci/run-tests.sh $(PYTEST_ARGS)

# the Spark load generator against its own two-node demo cluster (see README)
load-demo: venv
	bash .ci/install/java.sh
	$(VENV)/bin/fedgate-load --demo --producers 3 --consumers 2 --messages 2000 --out var/load-demo

# long fuzzing run (>= 100,000 malformed frames against a live node);
# FUZZ_SEED=N and FUZZ_CASES=N override the seed and the size
fuzz: venv
	$(PY) -m pytest -m fuzz_long -s tests/faults/test_fuzz.py

# random mixes of message sizes (1 B to 16 MiB) through nodes, clients reading at random
# speeds (opt-in, longer than make test's one mix per case); FEDGATE_LARGE_RUNS=N mixes,
# FEDGATE_LARGE_SEED=N the first seed (a failing test's id shows its seed)
FEDGATE_LARGE_RUNS ?= 30
fuzz-large: venv
	FEDGATE_LARGE_RUNS=$(FEDGATE_LARGE_RUNS) $(PY) -m pytest -q tests/protocol/test_large_messages_random.py tests/integration/test_large_messages_tcp.py

# soak run (opt-in): half the measured max rate through a proxy and a
# fragmented queue for FEDGATE_SOAK_SECONDS (default 1800); RSS and fd bounds
soak: venv
	$(PY) -m pytest -m soak -s tests/faults/test_soak.py

# replicated queues' long runs (opt-in): the issue's 20 kill/restart cycles under load
# (make test runs 4); FEDGATE_REPLICATION_CYCLES=N, FEDGATE_REPLICATION_SEED=N
FEDGATE_REPLICATION_CYCLES ?= 20
replication-long: venv
	bash .ci/install/etcd.sh start
	FEDGATE_REPLICATION_CYCLES=$(FEDGATE_REPLICATION_CYCLES) $(PY) -m pytest -s -o timeout=900 \
		tests/faults/test_replication_faults.py -k repeated

# the nemesis (issue #42, opt-in): seeded fault schedules against replicated queues and
# fragments, every link through a Toxiproxy, Jepsen's total-queue check (docs/nemesis.md);
# NEMESIS_SEEDS seeds from NEMESIS_SEED, NEMESIS_SECONDS of faults each, both modes and the
# control run; the table of every run at the end (var/nemesis/results.jsonl)
NEMESIS_SEEDS ?= 20
NEMESIS_SEED ?= 1
NEMESIS_SECONDS ?= 300
nemesis: venv
	bash .ci/install/etcd.sh
	bash .ci/install/toxiproxy.sh
	mkdir -p var/nemesis
	for seed in $$(seq $(NEMESIS_SEED) $$(( $(NEMESIS_SEED) + $(NEMESIS_SEEDS) - 1 ))); do \
		NEMESIS_SEED=$$seed NEMESIS_SECONDS=$(NEMESIS_SECONDS) NEMESIS_RESULTS=var/nemesis/results.jsonl \
			NEMESIS_KEEP=var/nemesis/runs \
			$(PY) -m pytest -q -s tests/nemesis || exit 1; \
	done
	$(PY) tests/nemesis/summary.py var/nemesis/results.jsonl

bench-deps: venv
	bash .ci/install/rabbitmq.sh
	bash .ci/install/c-clients.sh

bench: bench-deps
	$(PY) bench/local_queue.py

bench-proxy: bench-deps
	$(PY) bench/proxy.py

bench-fragments: bench-deps
	$(PY) bench/fragments.py

bench-durable: venv
	bash .ci/install/c-clients-durable.sh
	$(PY) bench/durable.py

bench-replication: venv
	bash .ci/install/c-clients.sh
	bash .ci/install/etcd.sh start
	$(PY) bench/replication.py --failover-runs 20

bench-transactions: venv
	bash .ci/install/c-clients-txn.sh
	$(PY) bench/transactions.py

clean:
	rm -rf $(VENV) .build tests/js/node_modules tests/jms/target
