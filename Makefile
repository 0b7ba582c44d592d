# onceflow: the two commands of the README are `make run` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
ONCEFLOW := $(BIN)/onceflow
DEV := $(BIN)/onceflow-dev
STAMP := $(VENV)/.installed
RUN_RATE ?= 200
RUN_SECONDS ?= 3600

.PHONY: setup run stop status lint format docs test test-unit test-spark test-integration test-long test-topology test-secured chaos-short bench bench-short bench-quiet bench-writer bench-profile bench-sweep chaos chaos-seeds soak clean

$(STAMP): requirements.txt requirements-dev.txt constraints.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q -r requirements-dev.txt -c constraints.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

## run: the embedded stack (Kafka broker, topics), the generator, Airflow; Airflow's ip_count_deploy starts the job.
run: setup
	$(DEV) stack up
	$(DEV) produce --detach --rate $(RUN_RATE) --duration $(RUN_SECONDS) --late 0.01 --malformed 0.01
	$(DEV) airflow up
	@$(DEV) where

stop: setup
	$(DEV) stack down

status: setup
	$(DEV) stack status; $(ONCEFLOW) job status

LINTED := include dags plugins tests

## lint: ruff (lint + format check), the architecture contracts (import-linter), mypy. Seconds, no broker.
lint: setup
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/lint-imports
	$(BIN)/mypy

## docs: the generated reference pages (docs/configuration.md from onceflow.config)
docs: setup
	$(BIN)/python -m onceflow_dev.config_reference --out docs/configuration.md

format: setup
	$(BIN)/ruff check --fix $(LINTED)
	$(BIN)/ruff format $(LINTED)

## test: lint, unit tests (no broker, no JVM), the Spark plan tests (tests/spark), then integration tests against a real
## broker, real Spark and Airflow (started and stopped by the tests); each step stops the run on a failure. The
## running-Airflow module runs alone first (with the job beside Airflow's processes it keeps both cores busy); then the rest on TEST_WORKERS pytest-xdist
## workers (whole modules each, slowest first: tests/conftest.py), since one module at a time left a core idle about
## half the time (jobs starting, waiting on triggers, timeouts and restarts: docs/testing.md). TEST_WORKERS=1: serial.
TEST_WORKERS ?= 2
WORKERS = $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
AIRFLOW_RUNNING := tests/airflow/test_running_airflow.py
test: lint test-unit test-spark test-integration

test-unit: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/unit/control/test_dag_integrity.py tests/unit  # the DAG files parse first (seconds)

## test-spark: the tests that build Spark plans (one local JVM; no broker): the parsing rules in Spark, the apps' plans
test-spark: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/spark

test-integration: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=0 --durations-min=10 $(AIRFLOW_RUNNING)
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=0 --durations-min=10 -m "not long" \
		$(WORKERS) --ignore=$(AIRFLOW_RUNNING) tests/integration tests/airflow

## test-long: the integration tests marked `long`, ~16 min: a claim `make test` proves, proven again in another
## configuration (kill -9 under least-privileged principals; the table sink's savepoint under load), or an optional
## mode (the warm standby). Outside `make test` so that CI's run stays within its time (docs/testing.md).
test-long: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=0 --durations-min=10 -m long \
		$(WORKERS) tests/integration tests/airflow

## bench-short: the short variant of `make bench` (every row, every phase, a 30,000-record backlog; ~7 min), alone.
## Outside `make test` as every benchmark run is (its pure parts are unit tests: tests/unit/dev/test_bench_*.py).
BENCH_SHORT := tests/bench/test_short_bench.py
bench-short: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=5 $(BENCH_SHORT)

## test-topology: the cluster tests, ~15 min: three brokers with a Spark master and two workers
## (tests/topology/test_cluster.py: broker and worker deaths, a batch far larger than the driver, `stack up/status/
## down` in a fresh shell). Not in `make test`: with its own five-JVM topology it would take the suite past 45 minutes
## on 2 cores (docs/testing.md). The short chaos run is `make chaos-short`.
test-topology: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=10 tests/topology/test_cluster.py

## test-secured: the exactly-once suite and the running-Airflow tests again, on a SASL/SCRAM + TLS broker with ACLs:
## each job on its least-privileged principal, the DAGs on theirs through Airflow connections, and no password
## written anywhere (docs/security.md; ~20 min). The secured stack's own tests (test_security.py) run in `make test`.
test-secured: setup
	ONCEFLOW_TEST_KAFKA_SECURITY=SASL_SSL $(BIN)/python -m pytest -q -p no:cacheprovider \
		tests/integration/test_exactly_once.py tests/airflow/test_running_airflow.py

## bench: exactly-once vs Spark's at-least-once Kafka sink vs a plain transactional loop vs Flink 2.x's exactly-once
## KafkaSink (built with Maven into var/jvm on first use), side by side, each sink checked for correctness, and the
## second app (ip_networks) on the same backlog (~3 h: each latency row measures 1,200 s of steady state, about 240
## windows; BENCH_CONTENDERS=flink ~50 min). BENCH_RECORDS, BENCH_IPS, BENCH_LIVE_RATE, BENCH_LIVE_S (the latency
## phase's steady state, after its catch-up: BENCH_STEADY_S, BENCH_CATCHUP_MAX_S, and its warm-up, measured apart:
## BENCH_WARMUP_S, default 120), BENCH_TRIGGER_S, BENCH_MAX_OFFSETS,
## BENCH_FLINK (0: without Flink), BENCH_FLINK_FAST_MS (Flink's short checkpoint interval, default 500),
## BENCH_POSTGRES=0 (without the rows for ip_count into PostgreSQL: throughput, and latency polled from the table),
## BENCH_CONTENDERS (e.g. alo,flink: only these rows beside onceflow's; eos_loaded: onceflow's latency beside a second
## job fed BENCH_LOAD_RATE records/s, default BENCH_LIVE_RATE, paced BENCH_LOAD_MARGIN_MS after each multiple of the
## trigger, default half the trigger), BENCH_TOPOLOGY=cluster (the same run on the loopback
## cluster: three brokers, a Spark master and two workers; without eos_loaded). Its short variant: `make bench-short`.
bench: setup
	$(BIN)/python -m onceflow_dev.bench

## bench-quiet: CPU per minute of a job fed 200 records/s (onceflow, Spark's Kafka sink, Flink with 5 s checkpoints,
## one after another, each after a 10-minute warm-up) and its results' latency meanwhile, ~45 min. BENCH_QUIET_RATE,
## BENCH_QUIET_WARMUP_S, BENCH_QUIET_S, BENCH_FLINK=0,
## BENCH_QUIET_CONTENDERS (e.g. eos,eos_margin_0: onceflow with and without its pacing margin; eos_jit_default: HotSpot's JIT
## thresholds; eos_gc_jvm: the driver's full collections left to the JVM; eos_shuffle_2: two shuffle partitions).
bench-quiet: setup
	$(BIN)/python -m onceflow_dev.bench_quiet

## bench-writer: records/s of one transaction from the driver (bare producer vs the sink vs streamed from Spark, and
## the PostgreSQL sink both ways),
## on one broker and on three (replication 3, acks=all), ~10 min. BENCH_WRITER_SIZES, BENCH_WRITER_TOPOLOGIES.
bench-writer: setup
	$(BIN)/python -m onceflow_dev.bench_writer

## bench-profile: where a batch's time goes: read, parse, aggregate, state store, results to the driver, produce and
## commit, as a ladder of runs over `make bench`'s backlog (~8 min; BENCH_RECORDS applies).
bench-profile: setup
	$(BIN)/python -m onceflow_dev.bench_profile

## bench-sweep: the exactly-once job once per variant of its settings (trigger, close-out, state store, ...), ~30 min.
## BENCH_SWEEP=0,2,4 picks variants (see onceflow/bench_sweep.py); the BENCH_* workload variables apply.
bench-sweep: setup
	$(BIN)/python -m onceflow_dev.bench_sweep

## chaos: ~10 min of kill -9s, broker restarts, driver pauses and timed-out transactions, then an exact check.
## CHAOS_SECONDS, CHAOS_RECORDS, CHAOS_JOB_KILLS, CHAOS_BROKER_RESTARTS, CHAOS_STALLS, CHAOS_PAUSES, CHAOS_SEED,
## CHAOS_STANDBY (default 1), CHAOS_SECURED=1 (SASL/SCRAM over TLS with ACLs, the job as its own principal),
## CHAOS_APP (default ip_count; ip_networks: the stateless app, proven by its audit and the replay of its plan),
## CHAOS_SINK=postgres (the results in PostgreSQL, its server crash-restarted CHAOS_DATABASE_CRASHES times too).
## CHAOS_TOPOLOGY=cluster: three brokers and a Spark master with two workers; kill -9 of the sink's leader, of the
## transaction coordinator mid-transaction, of a Spark worker, of the driver, one broker down for minutes
## (CHAOS_BROKER_DOWN_S, CHAOS_LEADER_KILLS, CHAOS_COORDINATOR_KILLS, CHAOS_WORKER_KILLS; CHAOS_SECURED=1 too;
## CHAOS_DOUBLE_FAULT=1: a second node killed inside the outage, on purpose). CHAOS_CLASS_DATA=0, either topology: the
## job's drivers and executors without the class-data archive (ONCEFLOW_CLASS_DATA_SHARING, on by default). Liveness
## per fault against CHAOS_COMMIT_BOUND_S (120) and CHAOS_LAG_BOUND_S (300); a planned fault not injected fails the run.
chaos: setup
	$(BIN)/python -m onceflow_dev.$(if $(filter cluster,$(CHAOS_TOPOLOGY)),chaos_cluster,chaos)

## chaos-short: the short variant of `make chaos` as a test (tests/topology/test_chaos.py, seed 3: a kill -9, a broker
## restart, a driver pause, a transaction held past its timeout; ~5 min, its own broker). Outside `make test`, as every
## chaos run is: on a slow 2-core machine it took 13 min of the suite's time. A broker killed and restarted under a
## running job stays in `make test` (tests/integration/test_exactly_once.py).
chaos-short: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=5 tests/topology/test_chaos.py

## chaos-seeds: `make chaos` once per seed (CHAOS_SEEDS, default "1 2 3 4 4711"; CHAOS_TOPOLOGY=cluster too), one
## table of the verdicts and liveness figures (var/chaos-seeds/<topology>.md). ~13 min per seed on the cluster; on
## one node ~21 min with CHAOS_JOB_KILLS=10, 30 min or more at the default 20.
chaos-seeds: setup
	$(BIN)/python -m onceflow_dev.chaos_seeds

## soak: ~35 min of the embedded platform with Airflow, input flowing, short schedules and faults at random times;
## every scheduled run green (or failed under a fault and followed by a green one), the chain proves every batch
## once, lost 0, duplicated 0. SOAK_SECONDS, SOAK_RATE, SOAK_JOB_KILLS, SOAK_BROKER_RESTARTS, SOAK_PAUSES, SOAK_SEED.
soak: setup
	$(BIN)/python -m onceflow_dev.soak

clean:
	-$(DEV) stack down
	rm -rf var/kafka var/checkpoints var/run var/log
