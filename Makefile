# Set-up is part of every target: the virtualenv is created from requirements.txt when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DATA ?=

.PHONY: venv lint demo test test-slow bench clean

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) demo.py $(if $(DATA),--data $(DATA),)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Two workers over the test files (pytest-xdist, --dist loadfile), then tests/serving alone: its tests time clients
# and servers (slow clients, deadlines, versions swapped under load), which a second worker on the 2 cores would
# starve. Serial, the suite took 18-21 min here; this way 10:48-12:37 (issue 13, session 7).
test: lint
	@.ci/machine
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=15 --ignore=tests/serving tests
	$(PY) -m pytest -q --durations=5 tests/serving

test-slow: venv
	$(PY) -m pytest -q -m slow tests

bench: venv
	$(PY) bench/embed_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache demo_out
