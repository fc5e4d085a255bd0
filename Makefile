# The two commands of the README: `make demo` and `make test`.
# Both create .venv with what they need. `make test` also needs memcached
# and Chromium, and installs them with Debian's apt-get (as root or through
# sudo -n) when they are missing.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO_INI := examples/accommodation/development.ini

.PHONY: demo test lint format docs buildout bench-cache bench-fastpath bench-rwsplit bench-memcached bench-overhead bench-retries bench-silent-replica bench-threads bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Installed once, again when the metadata changes.
$(VENV)/.testing: $(BIN)/python setup.cfg pyproject.toml examples/accommodation/pyproject.toml
	$(BIN)/pip install --quiet -e '.[testing]' -e examples/accommodation
	touch $@

$(VENV)/.demo: $(BIN)/python setup.cfg pyproject.toml examples/accommodation/pyproject.toml
	$(BIN)/pip install --quiet -e . -e examples/accommodation
	touch $@

demo: $(VENV)/.demo
	$(BIN)/pserve $(DEMO_INI)

lint: $(VENV)/.testing
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The tests start (and stop) memcached servers of their own, and load the
# dashboard in headless Chromium: .ci/memcached.sh and .ci/chromium.sh
# install them when they are not here.
test: lint
	bash .ci/memcached.sh
	bash .ci/chromium.sh
	$(BIN)/sphinx-build -q -W -b html docs docs/_build/html
	$(BIN)/pytest --cov --cov-report=term-missing $(PYTEST_ARGS)

format: $(VENV)/.testing
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

docs: $(VENV)/.testing
	$(BIN)/sphinx-build -W -b html docs docs/_build/html

# buildout.cfg, checked in a fresh clone of HEAD: `buildout`, then its
# bin/pytest (PYTEST_ARGS as for `make test`). Minutes: not in `make test`.
buildout:
	bash .ci/buildout.sh

bench-cache: $(VENV)/.testing
	$(BIN)/python benchmarks/bench_cache.py

bench-fastpath: $(VENV)/.testing
	$(BIN)/python benchmarks/bench_fastpath.py --http

bench-rwsplit: $(VENV)/.testing
	$(BIN)/python benchmarks/bench_rwsplit.py

bench-memcached: $(VENV)/.testing
	$(BIN)/python benchmarks/bench_memcached.py

bench-overhead: $(VENV)/.testing
	$(BIN)/python benchmarks/bench_overhead.py

# Retries under contention on PostgreSQL, back-off on and off.
bench-retries: $(VENV)/.testing
	$(BIN)/python benchmarks/stress_retries.py
	$(BIN)/python benchmarks/stress_retries.py --database mysql

bench-silent-replica: $(VENV)/.testing
	$(BIN)/python benchmarks/stress_silent_replica.py
	$(BIN)/python benchmarks/stress_silent_replica.py --database mysql

# The headline figure: the accommodation site before and after, on the
# PostgreSQL server of DBTUNE_TEST_POSTGRESQL; installs wrk and memcached
# when missing, and saves the chart to docs/_static/headline.png.
bench: $(VENV)/.testing
	$(BIN)/python benchmarks/headline.py --chart docs/_static/headline.png

# Starts gunicorn servers on loopback; installs wrk when missing.
bench-threads: $(VENV)/.testing
	$(BIN)/python benchmarks/threads_vs_processes.py

clean:
	rm -rf $(VENV) .coverage .pytest_cache .ruff_cache docs/_build
