# Everything runs from a virtualenv made with the Python found as $(PYTHON): .venv for
# the default python3, .venv-py3.13 for `make test PYTHON=python3.13` (one per
# interpreter, so the support matrix's lanes never share one).
PYTHON ?= python3
ifeq ($(origin PYTHON),command line)
PYTHON_VERSION := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
ifeq ($(PYTHON_VERSION),)
$(error PYTHON=$(PYTHON) does not run; name an interpreter, e.g. PYTHON=$$(pyenv root)/versions/3.13.0/bin/python3)
endif
VENV   ?= .venv-py$(PYTHON_VERSION)
else
VENV   ?= .venv
endif
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
# Test processes (pytest-xdist): most tests wait on a server, a subprocess or a clock,
# so two cores keep more than two busy.
TEST_WORKERS ?= 4
# The tests marked `quiet` measure a rate or a latency, which a loaded machine skews:
# `make test` runs them after the others, once no other `make test` sharing this lock
# file (the other CI lane, say) still runs its main part.
QUIET_LOCK ?= $(or $(FLOWWARDEN_TEST_QUIET_LOCK),/tmp/flowwarden-test-quiet.lock)
# Markers `make test` leaves out (`make test TEST_SKIP=faults`: .ci/run runs the fault
# tests beside the lanes, with `make test-faults`).
TEST_SKIP ?=
# The fault tests mostly wait for a partition to end: more processes than cores.
FAULT_WORKERS ?= 4

.PHONY: demo test test-fast test-faults test-deps print-venv lint format docs serve serve-demo bench clean

## demo: set up and run the sample project on SQLite (no servers needed)
demo: $(VENV)/.demo-installed
	$(PY) manage.py migrate --noinput -v 0
	$(PY) manage.py demo

## test: set up, lint (ruff, import contracts), build the docs (warnings are errors)
## and run the whole test suite in $(TEST_WORKERS) processes (server lanes skip when
## their server is down), then the quiet tests on their own
test: $(VENV)/.test-installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m sphinx -W -q -b html -d $(VENV)/docs-doctrees docs $(VENV)/docs-html
	@status=0; \
	flock -s $(QUIET_LOCK) $(PY) -m pytest -n $(TEST_WORKERS) --maxschedchunk 1 --durations=10 \
		-m "not quiet$(foreach marker,$(TEST_SKIP), and not $(marker))" || status=1; \
	echo "== the quiet tests (time-sensitive figures), alone on the machine"; \
	flock -x $(QUIET_LOCK) $(PY) -m pytest -m quiet || status=1; \
	exit $$status

## test-fast: the edit-test loop: every test that needs no server, no subprocess and
## no browser (SQLite and in-process fakes only), in under 90 seconds
test-fast: $(VENV)/.test-installed
	$(PY) -m pytest -n $(TEST_WORKERS) -q -m "not lane and not slow and not browser and not chaos and not subprocess"

## test-faults: the network-fault tests alone (tests/faults: silent partitions of a
## namespace of the test's own; they need root, iproute2 and socat, and skip without)
test-faults: $(VENV)/.test-installed
	$(PY) -m pytest -n $(FAULT_WORKERS) -q --durations=10 -m faults tests/faults

## test-deps: set up the virtualenv of `make test` without running anything
test-deps: $(VENV)/.test-installed

print-venv:
	@echo $(VENV)

lint: $(VENV)/.test-installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

## docs: build the documentation into docs/_build/html (warnings are errors)
docs: $(VENV)/.test-installed
	$(PY) -m sphinx -W -q -b html docs docs/_build/html

format: $(VENV)/.test-installed
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

serve: $(VENV)/.demo-installed
	$(PY) manage.py runserver

## serve-demo: run the story, leave one approval pending, start the site with demo logins
serve-demo: $(VENV)/.demo-installed
	$(PY) manage.py migrate --noinput -v 0
	$(PY) manage.py demo --serve

bench: $(VENV)/.test-installed
	$(PY) bench/checkpoint_writes.py
	$(PY) bench/stream_throughput.py
	$(PY) bench/async_streams.py
	$(PY) bench/initial_sync.py
	$(PY) bench/leader_fencing.py
	$(PY) bench/workflow_steps.py
	$(PY) bench/workflow_providers.py
	$(PY) bench/approval_decisions.py
	$(PY) bench/snapshot_listing.py
	$(PY) bench/listings.py
	$(PY) bench/queues.py

$(VENV)/.venv-created:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	touch $@

$(VENV)/.demo-installed: $(VENV)/.venv-created setup.cfg pyproject.toml
	$(PIP) install --quiet -e ".[testkit,drf]"
	touch $@

# mysqlclient compiles against libmariadb-dev; without it the MariaDB lane skips.
$(VENV)/.test-installed: $(VENV)/.venv-created setup.cfg pyproject.toml
	$(PIP) install --quiet -e ".[all,test]"
	@# Scheduled starts' tests: django-celery-beat 2.9 declares Django<6.1, which would
	@# take the Django 6.1 lane back to 6.0; installed without its Django pin (its other
	@# requirements as it states them), it runs on 6.1 too (the lane's tests say so).
	@# The same lines as docs/install.md's (tests/packaging/test_install_lines.py checks both).
	$(PIP) install --quiet --no-deps "django-celery-beat==2.9.0"
	$(PIP) install --quiet "django-timezone-field>=5.0" "cron-descriptor>=1.2.32,<2" "python-crontab>=2.3.4" tzdata
	@if pkg-config --exists libmariadb 2>/dev/null || pkg-config --exists mariadb 2>/dev/null; then \
		$(PIP) install --quiet "mysqlclient>=2.2.1" >$(VENV)/mysqlclient-build.log 2>&1 \
		|| echo "mysqlclient did not build (see $(VENV)/mysqlclient-build.log): the MariaDB lane will skip"; \
	else \
		echo "MariaDB lane: apt-get install libmariadb-dev pkg-config, then rerun make test (it skips until then)"; \
	fi
	touch $(VENV)/.demo-installed $@

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache sampleproject/db.sqlite3 docs/_build
