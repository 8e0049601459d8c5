# Two commands work on a fresh machine: `make demo` and `make test` (what CI runs).
# `make test-fast` leaves out the tests marked slow (runs, training, subprocesses): for the edit loop.
# Both run the tests on every CPU (pytest-xdist); PYTEST_WORKERS=0 runs them in this one process.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: demo test test-fast install clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

# The demo needs the package and TFLite Micro, not the test tools and the runtimes that check ported
# policies (torch among them): a fresh `make demo` installs less.
$(DEMO_STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[micro]'
	@touch $(DEMO_STAMP)

install: $(STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/compress-dqn run recipes/cartpole.yaml

# pytest-xdist: one worker per CPU; the tests that share a session fixture (a finished run) run in
# one worker (conftest.py's xdist_group marks), so each fixture is built once.
PYTEST_WORKERS ?= auto

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup --durations=25

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" -n $(PYTEST_WORKERS) --dist loadgroup

clean:
	rm -rf runs .pytest_cache
