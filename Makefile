# Set-up is part of every target: the virtualenv is created from requirements.txt when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DATA ?=

.PHONY: venv lint docs demo test test-torch test-slow bench clean

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

venv: $(VENV)/.installed

# The documentation site (mkdocs-material; the API reference generated from the docstrings by mkdocstrings, the
# command-line reference from the parsers: docs/gen_ref_pages.py) into site/. --strict: a broken link, a reference that
# does not resolve or a docstring griffe cannot read fails the build. The two variables silence the banners of
# mkdocs-material 9.7+ about MkDocs 2 (not warnings of this site).
DOCS_ENV := DISABLE_MKDOCS_2_WARNING=true NO_MKDOCS_2_WARNING=1 TF_CPP_MIN_LOG_LEVEL=2
docs: venv
	$(DOCS_ENV) $(VENV)/bin/mkdocs build --strict --quiet

demo: venv
	$(PY) demo.py $(if $(DATA),--data $(DATA),)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Two workers over the test files (pytest-xdist, --dist loadfile), then tests/serving on two workers of its own: its
# tests time clients and servers (slow clients, deadlines, versions swapped under load), so they do not run beside the
# training and export tests. Serial, the suite took 18-21 min here; tests/serving alone 3:20 on one worker, 1:54-2:03
# on two (issue 37). A third worker was no faster: the suite is CPU-bound (12:38 against 11:56 on two).
test: lint docs
	@.ci/machine
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=15 --ignore=tests/serving tests
	KERAS_BACKEND=jax $(BACKEND_TESTS)
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=5 tests/serving

# The numeric layers and ELMo under another Keras backend, in a pytest process of its own (KERAS_BACKEND is read when
# Keras is imported): make test runs them under JAX (its CPU wheels are in requirements.txt); test-torch under PyTorch,
# whose CPU build (torch 2.13.0) it installs first (17 s here from the wheel on disk; pip takes a CUDA build of several
# GB where that wheel is not on disk).
BACKEND_TESTS := $(PY) -m pytest -q -p no:cacheprovider --durations=5 tests/backends tests/test_fixture_parity.py
test-torch: venv
	$(PY) -m pip install -q torch==2.13.0
	KERAS_BACKEND=torch $(BACKEND_TESTS)

test-slow: venv
	$(PY) -m pytest -q -m slow tests

bench: venv
	$(PY) bench/embed_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache demo_out site
