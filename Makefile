# agentplatform: make demo | make serve | make test | make lint | make stop
# With DATABASE_URL / CELERY_BROKER_URL (REDIS_URL) unset, every command here runs on the
# embedded PostgreSQL and Valkey that the first process starts from their wheels, data
# in var/ (docs/embedded.md). `make serve` and `make demo` stop them when they end;
# `make stop` stops them after any other command (migrate, a shell) left them running.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: setup demo serve stop test chaos lint format migrate clean bench prerequisites-%

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

# Commands that load the settings but use no server (collectstatic, mypy's Django plugin):
# placeholder URLs keep them from starting the embedded services.
NO_SERVICES := DATABASE_URL=postgres://none@127.0.0.1:9/none REDIS_URL=redis://127.0.0.1:9/0

setup: $(STAMP)
	$(NO_SERVICES) $(PY) manage.py collectstatic --noinput -v 0

migrate: setup
	$(PY) manage.py migrate --noinput -v 0

# The machine's own programs (git, bubblewrap; Chromium for the tests), checked before
# anything is installed; installed with apt-get when run as root.
prerequisites-%:
	@$(PYTHON) agentplatform/prerequisites.py $*

demo: prerequisites-demo migrate
	$(PY) manage.py demo

serve: prerequisites-serve migrate
	$(PY) manage.py serve

stop:
	$(PY) -m agentplatform.embedded stop

# The suite runs in TEST_PROCESSES processes (pytest-xdist), each with a test database,
# a Redis database and a directory of its own (tests/settings.py); on PostgreSQL and
# Valkey of its own, started and stopped by the run, unless DATABASE_URL and REDIS_URL
# name servers.
TEST_PROCESSES ?= 2
test: prerequisites-test setup
	$(PY) -m pytest -n $(TEST_PROCESSES)

# The fault-injection suite: its own PostgreSQL, Redis, web, workers and beat
# (README, Reliability). CHAOS_ARGS="--light" for the short subset.
chaos: prerequisites-chaos setup
	$(PY) -m tests.chaos $(CHAOS_ARGS)

# Benchmarks against baselines measured in the same run (see README, Performance).
# BENCH_ARGS="--only wake,steps --reps 5" narrows it; "--tiny" is a seconds-long smoke run.
bench: prerequisites-bench setup
	$(PY) -m bench.run $(BENCH_ARGS)

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(NO_SERVICES) $(PY) -m mypy

format: setup
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

clean:
	-$(PY) -m agentplatform.embedded stop
	rm -rf var test-output .pytest_cache .mypy_cache .ruff_cache
