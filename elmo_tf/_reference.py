"""The public API of elmo_tf as its reference documents it: which packages and modules are public, each one's
public names, and where each name is defined.

The packages' names are lazy (`elmo_tf._lazy`), invisible to static analysis, so each name is imported to find the
module that defines it. docs/gen_ref_pages.py renders a page per package from `reference_entries()` at
`mkdocs build` time, and tests/test_docs.py checks that every public module is covered.
"""

import ast
import contextlib
import importlib
import inspect
import os
import sys
from pathlib import Path

# the public packages and modules, in the reference's order, with a line on what each holds; the ones left out
# are NOT_DOCUMENTED
PACKAGES = {
    "elmo_tf": "The names most programs need, imported on first use.",
    "elmo_tf.config": "BiLMConfig: the architecture, to and from bilm-tf's options.json.",
    "elmo_tf.layers": "Keras layers (on every Keras backend): the char CNN, the biLM, the scalar mix, the CRF.",
    "elmo_tf.models": "ELMo (on every Keras backend), the pretraining model and the language model.",
    "elmo_tf.preprocessing": "Strings to token and char ids in TensorFlow ops and NumPy; the pretraining dataset.",
    "elmo_tf.presets": "Released models by name: the registry, downloads and the cache.",
    "elmo_tf.io": "Weight files, vocabularies, CoNLL files, token caches, atomic writers.",
    "elmo_tf.convert": "Other ELMo formats to options.json + weights.hdf5.",
    "elmo_tf.embed": "Files through the biLM: embedding (packing, the embedder, outputs) and scoring, resumable runs.",
    "elmo_tf.pretraining": "Pretraining a biLM under tf.distribute.",
    "elmo_tf.saved_model": "The SavedModel for TF Serving: versions, signatures, warmup file, the ELMo export.",
    "elmo_tf.serving": "The TF Serving-compatible model server and its clients.",
    "elmo_tf.ner": "Named-entity recognition on ELMo: data, the tagger, training, tuning, tagging, export.",
    "elmo_tf.beam": "Embedding on Apache Beam.",
    "elmo_tf.errors": "The package's error classes.",
    "elmo_tf.machine": "The CPU's model and vector flags, from /proc/cpuinfo.",
    "elmo_tf.precision": "The precision ELMo computes in: float32, bfloat16, or auto (bfloat16 where the CPU has it).",
    "elmo_tf.backend": "Which Keras backend runs: TensorFlow's own paths, or the keras.ops ones of JAX and PyTorch.",
}

# modules and packages of elmo_tf the API reference leaves out, and why
NOT_DOCUMENTED = {
    "elmo_tf.cli": "the command line: its guide and the generated command-line reference document it",
    "elmo_tf.bounds": "number ranges of the command lines' flags (internal)",
}


def public_names(package):
    """The public names of a package or module: its `__all__`, else the names it defines that do not start with
    `_` (functions and classes defined in the module itself)."""
    module = importlib.import_module(package)
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and value.__module__ == package
    ]


def defining_path(package, name):
    """The dotted path where `package.name` is defined (`elmo_tf.ELMo` -> `elmo_tf.models.elmo.ELMo`): a class's or
    function's own module, else (a constant) the module under `package` that assigns it at its top level."""
    value = getattr(importlib.import_module(package), name)
    if inspect.ismodule(value):
        return value.__name__
    value = inspect.unwrap(value)  # a functools.cache'd function is documented as the function it wraps
    module = getattr(value, "__module__", None)
    if (inspect.isclass(value) or inspect.isfunction(value)) and module and module.startswith("elmo_tf"):
        return f"{module}.{value.__qualname__}"
    for module_name, module in sorted(sys.modules.items()):
        if (module_name == package or module_name.startswith(package + ".")) and vars(module).get(name) is value:
            if name in assigned_names(module):
                return f"{module_name}.{name}"
    raise LookupError(f"cannot find the module that defines {package}.{name}")


def assigned_names(module):
    """The names a module assigns at its top level (`X = ...`, `X: T = ...`)."""
    tree = ast.parse(Path(module.__file__).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        for target in targets:
            names.update(t.id for t in ast.walk(target) if isinstance(t, ast.Name))
    return names


@contextlib.contextmanager
def native_stderr_silenced():
    """File descriptor 2 goes to /dev/null meanwhile: TensorFlow's C++ runtime prints absl and oneDNN notices there
    when it is imported, whatever TF_CPP_MIN_LOG_LEVEL says, and they are not this build's warnings. Python's own
    errors are raised as exceptions, after it is restored."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def reference_entries():
    """`{package: [(name, path, rendered_here)]}`: each public name, where it is defined, and whether this package's
    page renders it (the innermost exporting package does; the others link to it)."""
    with native_stderr_silenced():
        exported = {
            package: [(name, defining_path(package, name)) for name in public_names(package)] for package in PACKAGES
        }
    home = {}
    for package, entries in exported.items():
        for _, path in entries:
            if path not in home or len(package) > len(home[path]):
                home[path] = package
    return {
        package: [(name, path, home[path] == package) for name, path in entries]
        for package, entries in exported.items()
    }
