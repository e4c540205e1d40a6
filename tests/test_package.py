"""The package as users install and import it (elmo_tf/__init__.py, elmo_tf/_registry.py, pyproject.toml):
importing elmo_tf or its command lines loads neither TensorFlow nor Keras; the first use of any public name registers
every Keras-serializable class; a `.keras` file saved by one process loads in a fresh one the way the README shows;
the declared dependencies cover every third-party import; the wheel holds the `elmo_tf` package only.

Each check that depends on what a process has imported runs in a fresh subprocess.
"""

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from functools import cache
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from tiny_models import TINY

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "elmo_tf"
PUBLIC = [  # the public names of elmo_tf before it became lazy, and load_model
    *("BiLM", "BiLMConfig", "CharCNN", "ELMo", "ELMoSavedModel", "Highway", "ProjectedLSTM", "ScalarMix"),
    *("TokensToCharIds", "add_sentence_boundaries", "get_config", "load_bilm_weights", "load_elmo", "load_model"),
    *("save_bilm_weights", "save_elmo", "tokens_to_char_ids", "whitespace_tokenize"),
]
HEAVY = {"keras", "tensorflow"}
REGISTERED = re.compile(r"^@[\w.]*register_keras_serializable\(package=\"elmo_tf\"\)\n(?:class|def) (\w+)", re.M)
DECORATOR = re.compile(r"^\s*@[\w.]*register_keras_serializable\b", re.M)


def run_python(code, *args, cwd=None, env=None):
    """`python -c code args` with this checkout first on the path; (exit status, stdout, stderr)."""
    env = {**os.environ, **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    return result.returncode, result.stdout, result.stderr


def loaded_modules(names):
    """Code that prints which top-level packages of `names` the process imported."""
    return f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(names)!r}))"


def registered_classes():
    """{module name: [class or function names]} of everything the sources register with Keras."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        classes = REGISTERED.findall(text)
        assert len(classes) == len(DECORATOR.findall(text)), f"{path}: a registration this test does not read"
        if classes:
            module = ".".join(path.relative_to(REPO).with_suffix("").parts)
            found[module.removesuffix(".__init__")] = classes
    return found


def test_importing_the_package_and_its_command_lines_loads_neither_tensorflow_nor_keras():
    code = (
        "import sys, elmo_tf\n"
        "assert elmo_tf.serving.__name__ == 'elmo_tf.serving'  # a subpackage, imported on access\n"
        "import elmo_tf.cli, elmo_tf.cli.serve\n"
        "names = dir(elmo_tf)\n"
        "print(elmo_tf.__version__, sorted(elmo_tf.__all__) == sorted(set(names) & set(elmo_tf.__all__)))\n"
        "print(sorted(elmo_tf.__all__))\n" + loaded_modules(HEAVY | {"grpc", "h5py", "numpy"})
    )
    status, out, err = run_python(code)
    assert status == 0, err
    version_and_dir, public, loaded = out.splitlines()
    assert version_and_dir == "0.1.0 True"  # every public name is in dir() before any is resolved
    assert public == str(sorted(PUBLIC))
    assert loaded == "[]"


# modules below the command lines that load no TensorFlow: the parsers read their constants, types and checks
TF_FREE_MODULES = (
    *("elmo_tf.bounds", "elmo_tf.io.atomic", "elmo_tf.io.conll", "elmo_tf.io.text", "elmo_tf.io.vocabulary"),
    *("elmo_tf.preprocessing.tokenizer", "elmo_tf.pretraining.config"),
    *("elmo_tf.embed.packing", "elmo_tf.embed.output"),  # embed's plan and output file: plain Python, NumPy, h5py
)


def test_the_subpackages_are_lazy_so_their_tensorflow_free_modules_load_alone():
    """`elmo_tf.io`, `elmo_tf.preprocessing`, `elmo_tf.pretraining` and `elmo_tf.embed` import their names on first
    access: importing one of their TensorFlow-free modules (or a name of one) loads no TensorFlow; every name of
    `__all__` is in `dir()` and `import *` resolves them all."""
    code = (
        "import importlib, sys\n"
        f"for name in {TF_FREE_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "from elmo_tf.io import expand_glob\n"
        "from elmo_tf.embed import DTYPES, pack_rows\n"
        "from elmo_tf.pretraining import TrainConfig\n" + loaded_modules(HEAVY) + "\n"
        "import elmo_tf.embed, elmo_tf.io, elmo_tf.preprocessing, elmo_tf.pretraining\n"
        "for package in (elmo_tf.io, elmo_tf.preprocessing, elmo_tf.pretraining, elmo_tf.embed):\n"
        "    listed = set(package.__all__) <= set(dir(package))\n"
        "    namespace = {}\n"
        "    exec(f'from {package.__name__} import *', namespace)\n"
        "    print(package.__name__, listed, sorted(set(package.__all__) - set(namespace)))\n"
    )
    status, out, err = run_python(code, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert status == 0, err
    assert out.splitlines() == [
        "[]",
        "elmo_tf.io True []",
        "elmo_tf.preprocessing True []",
        "elmo_tf.pretraining True []",
        "elmo_tf.embed True []",
    ]


def test_serve_help_and_a_usage_error_answer_without_tensorflow():
    """serving/serve.py --help and --port x: the answer, and no TensorFlow, Keras or its start-up lines."""
    serve = str(REPO / "serving" / "serve.py")
    code = (
        "import atexit, runpy, sys\n"
        f"atexit.register(lambda: print('loaded:', sorted({{m.split('.')[0] for m in sys.modules}} & {HEAVY!r})))\n"
        f"sys.argv = [{serve!r}, *sys.argv[1:]]\n"
        f"runpy.run_path({serve!r}, run_name='__main__')"
    )
    status, out, err = run_python(code, "--help")
    assert status == 0 and err == "", err
    assert out.startswith("usage: serve.py") and "--model_base_path" in out
    assert out.splitlines()[-1] == "loaded: []"
    status, out, err = run_python(code, "--port", "x")
    assert status == 2 and err == "serve.py: error: argument --port: --port must be an integer, got 'x'\n", err
    assert out == "loaded: []\n"


def test_the_registry_lists_every_module_that_registers_a_class():
    from elmo_tf._registry import SERIALIZABLE_MODULES

    assert sorted(SERIALIZABLE_MODULES) == sorted(registered_classes())


def test_first_use_of_any_public_name_registers_every_class():
    """`elmo_tf.get_config` (the config module, which holds no layer) is enough for Keras to know every class."""
    names = sorted(f"elmo_tf>{name}" for classes in registered_classes().values() for name in classes)
    assert {"elmo_tf>ELMo", "elmo_tf>CRF", "elmo_tf>ScalarMix", "elmo_tf>NERTagger"} <= set(names)
    code = (
        "import sys, elmo_tf\n"
        "assert 'keras' not in sys.modules\n"
        "elmo_tf.get_config\n"
        "import keras\n"
        f"print([n for n in {names!r} if keras.saving.get_registered_object(n) is None])\n"
        "from elmo_tf import *\n"
        "print(sorted(n for n in elmo_tf.__all__ if n not in globals()))"
    )
    status, out, err = run_python(code, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert status == 0, err
    assert out.splitlines() == ["[]", "[]"]  # none unregistered, none missing from `import *`


SAVE = """
import sys

import keras
import numpy as np
import tensorflow as tf

from elmo_tf import BiLMConfig, ELMo, ScalarMix, TokensToCharIds
from elmo_tf.layers import CRF

rng = np.random.default_rng(0)


def save(model, inputs, directory):
    for w in model.weights:  # away from the initializers, so a weight that is not restored shows
        if "float" in str(w.dtype):
            w.assign(rng.normal(0.0, 0.3, w.shape).astype(w.dtype))
    model.save(f"{directory}/model.keras")
    outputs = keras.tree.flatten(model(inputs))
    arrays = {f"in{i}": np.asarray(x) for i, x in enumerate(keras.tree.flatten(inputs))}
    np.savez(f"{directory}/expected.npz", **arrays, **{f"out{i}": np.asarray(y) for i, y in enumerate(outputs)})


out = sys.argv[1]
char_ids = TokensToCharIds()(tf.constant([["The", "cat", "sat", "."], ["Hi", "", "", ""]])).numpy()
save(ELMo(BiLMConfig(**TINY)), char_ids, f"{out}/elmo")

layers = [keras.Input((None, 6), name=f"layer_{i}") for i in range(3)]
mask = keras.Input((None,), dtype="bool", name="mask")
mixed = ScalarMix(3, layer_norm=True)(layers, mask=mask)
potentials = keras.layers.Dense(4)(mixed)
allowed = [[not (i == 0 and j == 3) for j in range(4)] for i in range(4)]
tags = CRF(4, allowed_transitions=allowed)(potentials, mask=mask)
model = keras.Model([*layers, mask], {"mixed": mixed, "potentials": potentials, "tags": tags})
inputs = [rng.normal(size=(2, 5, 6)).astype("float32") for _ in range(3)] + [np.arange(5) < np.array([[5], [3]])]
save(model, inputs, f"{out}/mix_crf")
"""

LOAD = """
import sys

assert "keras" not in sys.modules and "tensorflow" not in sys.modules  # a fresh process: nothing registered
namespace = {}
exec(compile(sys.argv[1], "README: Saving and reloading .keras files", "exec"), namespace)
model = namespace["model"]

import numpy as np
import keras

expected = np.load("expected.npz")
inputs = [expected[f"in{i}"] for i in range(sum(k.startswith("in") for k in expected))]
outputs = keras.tree.flatten(model(inputs[0] if len(inputs) == 1 else inputs))
assert len(outputs) == sum(k.startswith("out") for k in expected)
for i, actual in enumerate(outputs):
    np.testing.assert_allclose(np.asarray(actual), expected[f"out{i}"], rtol=0, atol=1e-6, err_msg=f"output {i}")
print(type(model).__name__, sorted({type(layer).__name__ for layer in model.layers}))
"""


def readme_block(section):
    """The Python block of a section of docs/keras.md (README.md links there)."""
    text = (REPO / "docs" / "keras.md").read_text()
    start = text.index(f"## {section}")
    end = text.index("\n## ", start + 3)
    (block,) = re.findall(r"```python\n(.*?)```", text[start:end], flags=re.S)
    return block


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """`<dir>/{elmo,mix_crf}/model.keras` with `expected.npz` (inputs and outputs), written by another process."""
    directory = tmp_path_factory.mktemp("saved")
    for name in ("elmo", "mix_crf"):
        (directory / name).mkdir()
    status, _, err = run_python(f"TINY = {TINY!r}\n{SAVE}", str(directory), env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert status == 0, err
    return directory


@pytest.mark.parametrize(
    "name, classes",
    [
        ("elmo", "ELMo ['BiLM', 'CharCNN', 'ScalarMix']"),
        ("mix_crf", "Functional ['CRF', 'Dense', 'InputLayer', 'ScalarMix']"),
    ],
)
@pytest.mark.slow
def test_a_keras_file_loads_in_a_fresh_process_as_the_readme_shows(saved, name, classes):
    block = readme_block("Saving and reloading `.keras` files")
    assert 'elmo_tf.load_model("model.keras")' in block
    status, out, err = run_python(LOAD, block, cwd=saved / name, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert status == 0, err
    assert out.strip() == classes  # our classes, with the saved weights (outputs equal to 1e-6)


def third_party_imports(path):
    """(module-level, function-level) sets of the top-level third-party names `path` imports (`google.protobuf` kept
    whole: `google` is a namespace of several distributions)."""
    tree = ast.parse(path.read_text())
    top_level = set(map(id, tree.body))

    def name_of(module):
        parts = module.split(".")
        return ".".join(parts[:2]) if parts[0] == "google" else parts[0]

    found = (set(), set())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [name_of(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [name_of(node.module)]
        else:
            continue
        for name in names:
            if name.split(".")[0] not in sys.stdlib_module_names and name != "elmo_tf":
                found[id(node) not in top_level].add(name)
    return found


def declared():
    """(base requirement names, {extra: requirement names}) of pyproject.toml, self-references expanded."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = lambda requirements: {Requirement(r) for r in requirements}  # noqa: E731
    base = {canonicalize_name(r.name) for r in names(project["dependencies"])}
    raw = {extra: names(reqs) for extra, reqs in project["optional-dependencies"].items()}

    def expand(extra):
        out = set()
        for r in raw[extra]:
            if canonicalize_name(r.name) == canonicalize_name(project["name"]):
                for inner in r.extras:
                    out |= expand(inner)
            else:
                out.add(canonicalize_name(r.name))
        return out

    return base, {extra: expand(extra) for extra in raw}


def distributions(module):
    """Names of the installed distributions that provide the top-level `module`; for a module not installed here (an
    extra that `make test` leaves out, such as torch), the distribution of its own name."""
    if module.startswith("google."):
        return {"protobuf"} if module == "google.protobuf" else set()
    installed = _packages_distributions().get(module)
    return {canonicalize_name(d) for d in installed} if installed else {canonicalize_name(module)}


_packages_distributions = cache(packages_distributions)


# modules whose functions each run on one Keras backend and import that backend's package there
BACKEND_SWITCHES = {PACKAGE / "embed" / "backend_functions.py"}


def test_declared_dependencies_cover_every_third_party_import():
    """The library's module-level imports are base dependencies (elmo_tf/serving/: the `serving` extra;
    elmo_tf/ner/tuning.py, whose HyperModel subclasses keras_tuner's: the `ner` extra; elmo_tf/layers/backends/jax_*.py
    and torch_*.py, imported only on their Keras backend: the `jax` and `torch` extras); its function-level ones are
    base or an extra (in a module that switches on the Keras backend, BACKEND_SWITCHES, the `jax` and `torch`
    extras too: each imported in the function that runs only on it); the tests' are base or an extra (`test` among
    them; tests/backends' `jax` and `torch`)."""
    base, extras = declared()
    on_one_backend = extras["jax"] | extras["torch"]
    assert extras["all"] == extras["serving"] | extras["ner"] | extras["text"] | extras["beam"]
    assert extras["all"] <= extras["test"]
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")) + sorted((REPO / "tests").rglob("*.py")):
        module_level, function_level = third_party_imports(path)
        in_serving = path.is_relative_to(PACKAGE / "serving")
        module_extra = (
            extras["serving"]
            if in_serving
            else extras["ner"]
            if path == PACKAGE / "ner" / "tuning.py"
            else extras["beam"]  # elmo_tf/beam/: its DoFns subclass apache_beam's
            if path.is_relative_to(PACKAGE / "beam")
            else extras[path.name.split("_")[0]]  # a backend's fast paths, imported only on that Keras backend
            if path.parent == PACKAGE / "layers" / "backends" and path.name.split("_")[0] in ("jax", "torch")
            else set()
        )
        for level, modules in (("module", module_level), ("function", function_level)):
            for module in modules:
                if path.is_relative_to(REPO / "tests"):
                    allowed = base | extras["test"] | extras["jax"] | extras["torch"]  # tests/backends' runs
                    if any((REPO / "tests").rglob(f"{module}.py")) or (REPO / f"{module}.py").exists():
                        continue  # a helper of the tests, or demo.py
                elif level == "module":
                    allowed = base | module_extra
                else:
                    allowed = base | extras["all"] | (on_one_backend if path in BACKEND_SWITCHES else set())
                if not distributions(module) & allowed:
                    missing.append(f"{path.relative_to(REPO)}: {level}-level import {module} ({distributions(module)})")
    assert not missing, "\n".join(missing)


def test_the_wheel_holds_the_elmo_tf_package_only(tmp_path):
    """`pip wheel --no-deps` of a copy of the checkout: one top-level package, the declared metadata."""
    source = tmp_path / "src"
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__", "build", "dist", "*.egg-info", "demo_out"),
    )
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    import elmo_tf

    (wheel,) = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(f"elmo_tf-{elmo_tf.__version__}.dist-info/METADATA").decode()
    assert {name.split("/")[0] for name in names} == {"elmo_tf", f"elmo_tf-{elmo_tf.__version__}.dist-info"}
    assert "elmo_tf/_registry.py" in names and "elmo_tf/cli/serve.py" in names
    assert f"\nVersion: {elmo_tf.__version__}\n" in metadata
    assert "\nRequires-Dist: tensorflow<2.22,>=2.21\n" in metadata
    for extra in ("serving", "ner", "text", "beam", "test", "all"):
        assert f"\nProvides-Extra: {extra}\n" in metadata
