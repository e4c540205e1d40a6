"""The tests' own layout: tests/<path>/test_<module>.py mirrors elmo_tf/<path>/<module>.py, and every test module
has a unique basename (the test directories carry no `__init__.py`, so pytest imports them by basename)."""

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "elmo_tf"
# tests/export/ tests the export/ command-line directory and its C++ loader check (elmo_tf/saved_model/: in
# tests/saved_model/);
# tests/backends/ runs the layers and ELMo on the active Keras backend (make test: JAX; make test-torch: PyTorch)
NOT_PACKAGES = {"export", "backends"}


def test_module_basenames_are_unique():
    counts = Counter(path.name for path in TESTS.rglob("*.py"))
    assert [name for name, n in counts.items() if n > 1 and name != "conftest.py"] == []


def test_every_test_directory_mirrors_a_package_directory():
    directories = {path.parent.relative_to(TESTS) for path in TESTS.rglob("test_*.py")} - {Path(".")}
    strays = [str(d) for d in directories if str(d) not in NOT_PACKAGES and not (PACKAGE / d / "__init__.py").exists()]
    assert strays == []
