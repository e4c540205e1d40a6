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

test: lint
	$(PY) -m pytest -q --durations=15 tests

test-slow: venv
	$(PY) -m pytest -q -m slow tests

bench: venv
	$(PY) bench/embed_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache demo_out
