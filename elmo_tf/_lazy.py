"""Lazy package namespaces (PEP 562): a package's public names are imported from their modules on first access.

So importing a package (`elmo_tf`, `elmo_tf.io`, ...) runs none of its modules, and importing one of its modules
that needs no TensorFlow (`elmo_tf.io.vocabulary`, `elmo_tf.pretraining.config`) loads no TensorFlow: Python runs
every parent package's `__init__` first. This module imports nothing but the standard library.
"""

import importlib
import importlib.util
import sys


def lazy_namespace(package, exports, before=None):
    """The public names and the module-level `__getattr__` and `__dir__` of `package`, whose names are imported on first
    access.

    Args:
        package: the package's `__name__`.
        exports: module -> the public names it is imported from, e.g. `{"elmo_tf.io.vocabulary": ("Vocabulary",)}`.
        before: called before a public name is first imported (`elmo_tf` registers every Keras class so).
    Returns:
        `(names, __getattr__, __dir__)`: the public names sorted (for `__all__`); `__getattr__` gives a public name
        (kept in the package's namespace, so later accesses skip it) or a submodule by its name (`elmo_tf.io.atomic`
        after `import elmo_tf.io`); `__dir__` lists the public names before any is imported.
    Example:
        __all__, __getattr__, __dir__ = lazy_namespace(__name__, {"elmo_tf.io.vocabulary": ("Vocabulary",)})
    """
    module_of = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name):
        module = module_of.get(name)
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
        return sorted({*vars(sys.modules[package]), *module_of})

    return sorted(module_of), __getattr__, __dir__
