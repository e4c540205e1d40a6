# Set-up is part of every target: the virtualenv is created from requirements.txt when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DATA ?=

.PHONY: venv lint docs demo test test-torch test-avx2 test-slow bench clean

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
MAIN_TESTS := $(PY) -m pytest -q -n 2 --dist loadfile --ignore=tests/serving tests
SERVING_TESTS := $(PY) -m pytest -q -n 2 --dist loadfile tests/serving
test: lint docs
	@.ci/machine
	$(MAIN_TESTS) --durations=15
	KERAS_BACKEND=jax $(BACKEND_TESTS)
	$(SERVING_TESTS) --durations=5

# The numeric layers and ELMo under another Keras backend, in a pytest process of its own (KERAS_BACKEND is read when
# Keras is imported): make test runs them under JAX (its CPU wheels are in requirements.txt); test-torch under PyTorch,
# whose CPU build (torch 2.13.0) it installs first (17 s here from the wheel on disk; pip takes a CUDA build of several
# GB where that wheel is not on disk).
# Two workers, each test sent to the idler one (--dist loadgroup; the three tests that compare with one TensorFlow run
# of the module go to one worker): 101 s here against 138 s on one.
BACKEND_TESTS := $(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup --durations=5 tests/backends tests/test_fixture_parity.py
test-torch: venv
	$(PY) -m pip install -q torch==2.13.0
	KERAS_BACKEND=torch $(BACKEND_TESTS)

# The tests whose numbers depend on the CPU's vector instructions (bfloat16 and float16 matmuls, oneDNN's kernels, the
# recorded outputs of the original code), under an emulated AVX2-only CPU (an AMD EPYC-Milan in QEMU's user mode:
# .ci/emulate-avx2, which needs qemu-user 7.2+). 6:44 on this 2-core AVX512_BF16 machine, 147 passed, 7 skipped.
AVX2_TESTS := tests/layers/backends/test_tensorflow_recurrence.py tests/layers/test_matmul_precision.py tests/layers/test_bilm.py \
	tests/models/test_bilm_pretrainer_fast_step.py tests/pretraining/test_loop.py tests/test_machine.py \
	tests/test_fixture_parity.py tests/embed/test_output.py tests/io/test_torch_pickle.py tests/backends \
	tests/test_precision_contract.py tests/layers/test_low_precision.py tests/layers/backends/test_tensorflow_precision.py
test-avx2: venv
	.ci/emulate-avx2 -q -n 2 --dist loadfile -p no:cacheprovider --durations=5 $(AVX2_TESTS)

# The checks behind the `slow` marker, in make test's three stages (pytest's exit 5, "no tests collected", is not a
# failure: a stage may have none). They are the costly twins of checks make test keeps (the bfloat16, converted-model
# and fresh-process variants, the C++ loader's other exports, the kill/resume and full-disk matrices, eager JAX
# replays), so make test stays within 15 minutes on 2 cores; .ci/run runs both.
test-slow: venv
	$(MAIN_TESTS) -m slow --durations=10
	KERAS_BACKEND=jax $(BACKEND_TESTS) -m slow || [ $$? -eq 5 ]
	$(SERVING_TESTS) -m slow || [ $$? -eq 5 ]

bench: venv
	$(PY) bench/embed_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache demo_out site
