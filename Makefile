# sparkbus: `make demo` and `make test` set everything up on a fresh machine (Python 3.10+, Java 17).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
AZURITE := .azurite/node_modules/.bin/azurite-blob
export PYSPARK_PYTHON := $(CURDIR)/$(BIN)/python
export PYSPARK_DRIVER_PYTHON := $(CURDIR)/$(BIN)/python
# Every install of the package is editable in setuptools' "compat" mode (see $(STAMP) for why), which
# setuptools announces with a warning on every install: chosen on purpose, so not printed.
EDITABLE := PYTHONWARNINGS="ignore:Compat editable installs" $(BIN)/python -m pip install --quiet

.PHONY: install demo test test-fast typecheck dist docs crash soak sdk-samples bench bench-send bench-receive bench-fanout bench-forward bench-throttle bench-aio bench-processor bench-store bench-archive bench-peers bench-peers-quick bench-servers clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# What the demo and the jobs need, and no more: the package with its spark extra, and the ui extra for the
# Explorer the demo names as the next thing to try (make demo).
RUNTIME := $(VENV)/.installed-runtime
$(RUNTIME): pyproject.toml | $(BIN)/python
	$(EDITABLE) -e '.[spark,ui]' --config-settings editable_mode=compat
	touch $(RUNTIME)

# Re-installs only when the package metadata changes; the package itself is installed editable, in the
# "compat" mode (the checkout on sys.path) so that Spark's lookup of pyspark_* data source modules, which
# lists importable modules, finds pyspark_sparkbus from any working directory (notebooks, jobs). strace
# (a Debian package) lets the durability test see the fsyncs; fuse3 mounts the tests' file system without
# hard links; Chromium and its driver, the browser the Explorer's tests drive (Selenium, headless).
$(STAMP): pyproject.toml | $(BIN)/python
	command -v strace >/dev/null || (apt-get update -qq && apt-get install -y -qq strace)
	command -v fusermount3 >/dev/null || (apt-get update -qq && apt-get install -y -qq fuse3)
	command -v chromedriver >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium chromium-driver)
	$(EDITABLE) -e '.[test]' --config-settings editable_mode=compat
	touch $(STAMP)

# Azurite, the Azure Storage emulator (npm), for the tests of namespaces on object storage; the tests start
# it on a free loopback port themselves.
$(AZURITE):
	command -v npm >/dev/null || (apt-get update -qq && apt-get install -y -qq npm)
	npm install --prefix .azurite --no-audit --no-fund --silent azurite@3

install: $(STAMP) $(AZURITE)

demo: $(RUNTIME)
	rm -rf .sparkbus/demo
	env -u PYSPARK_PYTHON -u PYSPARK_DRIVER_PYTHON $(BIN)/sparkbus submit --master "local[2]" \
		--conf spark.ui.enabled=false jobs/demo.py \
		--namespace .sparkbus/demo --definition conf/namespace.toml

# Three pytest workers (pytest-xdist) on two cores: with two, tests waited on JVMs, subprocesses, the
# emulators and timers for half of the run (docs/testing.md). The SparkSession's tests form one group, so
# the run starts one session.
TEST_WORKERS ?= 3
test: install typecheck
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

# mypy over the whole package, strict (pyproject.toml, [tool.mypy]).
typecheck: install
	$(BIN)/python -m mypy

# A wheel and an sdist in dist/ (pip install dist/sparkbus-*.whl, with [spark] where Spark is not provided).
dist: $(RUNTIME)
	rm -rf dist build
	$(BIN)/python -m pip install --quiet build
	$(BIN)/python -m build --outdir dist .

# The documentation site (mkdocs.yml, docs/) in site/: --strict fails on a broken link or a page left out of nav.
DOCS_STAMP := $(VENV)/.installed-docs
$(DOCS_STAMP): pyproject.toml | $(BIN)/python
	command -v chromedriver >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium chromium-driver)
	$(EDITABLE) -e '.[docs,ui,spark]' --config-settings editable_mode=compat
	touch $(DOCS_STAMP)

# First the Explorer's screenshots (docs/assets/explorer-*.png, headless Chromium: docs_screenshots.py) and
# the notebooks with their outputs (docs/notebooks/, docs_notebooks.py) are made again.
# NO_MKDOCS_2_WARNING: Material for MkDocs' banner about its successor.
docs: $(DOCS_STAMP)
	$(BIN)/python docs_screenshots.py
	$(BIN)/python docs_notebooks.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

test-fast: install typecheck
	$(BIN)/python -m pytest -m 'not slow' -n $(TEST_WORKERS) --dist loadgroup

# The crash harness's full run (`make test` runs 6 kills of it): CRASH_SEED=N replays a run.
crash: install
	CRASH_KILLS=$${CRASH_KILLS:-60} $(BIN)/python -m pytest tests/test_crash.py -s -p no:cacheprovider

# 4 senders and 4 receivers with the namespace service for SOAK_MINUTES (default 10), then a checker.
soak: install
	$(BIN)/python tests/soak.py --minutes $${SOAK_MINUTES:-10}

# azure-servicebus 7.15.0's 30 sync and 28 async samples, with only the import prefix changed (about 12 min).
sdk-samples: install
	$(BIN)/python tests/sdk_samples.py $(SAMPLES)

bench: bench-send bench-receive bench-fanout bench-forward bench-throttle bench-aio bench-processor bench-store bench-archive bench-peers

bench-send: install
	$(BIN)/python benchmarks/bench_send.py --bulk 1000000 --single 2000

bench-receive: install
	$(BIN)/python benchmarks/bench_receive.py --messages 200000 --processes 1,2,4 --per-send 10000,248 --single 1000 --history 1000000

bench-fanout: install
	$(BIN)/python benchmarks/bench_fanout.py --messages 1000000 --latency 200

bench-forward: install
	$(BIN)/python benchmarks/bench_forward.py --messages 200000 --latency 100

bench-throttle: install
	$(BIN)/python benchmarks/bench_throttle.py --budgets 1000,10000 --seconds 5 --sends 1000

bench-aio: install
	$(BIN)/python benchmarks/bench_aio.py --wakes 100 --coroutines 1000

bench-processor: install
	$(BIN)/python benchmarks/bench_processor.py --messages 1000 --calls 1,8

# Local disk, Azurite and S3 (SeaweedFS), each object store behind a proxy adding LATENCY_MS to every request
# (0 too): every operation's p50/p99, requests and sequential round trips, and 1/2/4-process throughput.
bench-archive: install
	$(BIN)/python benchmarks/bench_archive.py --messages 100000 --single 300 --rounds 3

bench-store: install
	$(BIN)/python benchmarks/bench_store.py --latency-ms 0,$${LATENCY_MS:-20} $(BENCH_STORE_ARGS)

# sparkbus beside PostgreSQL and RabbitMQ (Debian packages, installed if missing; their Debian services are not
# used: the benchmark starts its own instances on loopback, data under .bench-servers/, and stops them).
# BENCH_PEERS_ARGS passes options on, e.g. BENCH_PEERS_ARGS="--only sparkbus,postgres --workloads send,receive".
BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): pyproject.toml | $(STAMP)
	$(EDITABLE) -e '.[test,bench]' --config-settings editable_mode=compat
	touch $(BENCH_STAMP)

bench-servers:
	test -x /usr/lib/postgresql/15/bin/postgres -a -x /usr/lib/rabbitmq/bin/rabbitmq-server || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql rabbitmq-server)

bench-peers: $(BENCH_STAMP) bench-servers
	$(BIN)/python benchmarks/bench_peers.py $(BENCH_PEERS_ARGS)

bench-peers-quick: $(BENCH_STAMP) bench-servers
	$(BIN)/python benchmarks/bench_peers.py --quick $(BENCH_PEERS_ARGS)

clean:
	rm -rf $(VENV) .sparkbus .pytest_cache *.egg-info .azurite site
