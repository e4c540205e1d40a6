"""Lazy package namespaces (PEP 562): a package's public names are imported from their modules on first access.

So importing a package (`elmo_tf`, `elmo_tf.io`, ...) runs none of its modules, and importing one of its modules
that needs no TensorFlow (`elmo_tf.io.vocabulary`, `elmo_tf.pretraining.config`) loads no TensorFlow: Python runs
every parent package's `__init__` first. This module imports nothing but the standard library.
"""

import importlib
import importlib.util
import sys


def lazy_namespace(package, exports, before=None):
    """The module-level `__getattr__` and `__dir__` of `package`, whose public names are imported on first access.

    Args:
        package: the package's `__name__`.
        exports: public name -> the module it is imported from.
        before: called before a public name is first imported (`elmo_tf` registers every Keras class so).
    Returns:
        `(__getattr__, __dir__)`. `__getattr__` gives a public name (kept in the package's namespace, so later
        accesses skip it) or a submodule by its name (`elmo_tf.io.atomic` after `import elmo_tf.io`).
    Example:
        _EXPORTS = {"Vocabulary": "elmo_tf.io.vocabulary"}
        __all__ = sorted(_EXPORTS)
        __getattr__, __dir__ = lazy_namespace(__name__, _EXPORTS)
    """

    def __getattr__(name):
        module = exports.get(name)
        if module is not None:
            if before is not None:
                before()
            value = getattr(importlib.import_module(module), name)
            setattr(sys.modules[package], name, value)
            return value
        if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is not None:
            return importlib.import_module(f"{package}.{name}")  # binds itself as an attribute of the package
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__
