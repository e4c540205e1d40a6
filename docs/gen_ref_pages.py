"""The API reference pages, written at `mkdocs build` time by mkdocs-gen-files: one page per public package of
elmo_tf, with every name of its `__all__` rendered from its docstring by mkdocstrings (`::: path`).

The packages' names are lazy (`elmo_tf._lazy`), invisible to static analysis: each name is imported here to find the
module that defines it, and rendered once, under that path, on the page of the innermost package that exports it;
the other packages that export it (`elmo_tf.ELMo`) link there. `reference_entries()` is also what
tests/test_docs.py checks the reference against.
"""

import ast
import contextlib
import importlib
import inspect
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# the public packages and modules, in the reference's order, with a line on what each holds; elmo_tf.cli is the
# command line (the "Command line" guide documents it), not an API
PACKAGES = {
    "elmo_tf": "The names most programs need, imported on first use.",
    "elmo_tf.config": "BiLMConfig: the architecture, to and from bilm-tf's options.json.",
    "elmo_tf.layers": "Keras layers: the char CNN, the biLM, the scalar mix, the CRF, preprocessing.",
    "elmo_tf.models": "ELMo, the pretraining model and the language model.",
    "elmo_tf.preprocessing": "Strings to token and char ids in TensorFlow ops; the pretraining dataset.",
    "elmo_tf.presets": "Released models by name: the registry, downloads and the cache.",
    "elmo_tf.io": "Weight files, vocabularies, CoNLL files, token caches, atomic writers.",
    "elmo_tf.convert": "Other ELMo formats to options.json + weights.hdf5.",
    "elmo_tf.embed": "Embedding files: packing, the embedder, outputs, resumable runs.",
    "elmo_tf.score": "Scoring a file with the biLM's language model.",
    "elmo_tf.pretraining": "Pretraining a biLM under tf.distribute.",
    "elmo_tf.export": "Versioned SavedModels for TF Serving.",
    "elmo_tf.serving_contract": "The exports' signatures: names, inputs and outputs.",
    "elmo_tf.serving_warmup": "TF Serving's warmup file.",
    "elmo_tf.serving": "The TF Serving-compatible model server and its clients.",
    "elmo_tf.ner": "Named-entity recognition on ELMo: data, the tagger, training, tuning, tagging, export.",
    "elmo_tf.beam": "Embedding on Apache Beam.",
    "elmo_tf.errors": "The package's error classes.",
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


def page(package, entries):
    lines = [
        f"# `{package}`",
        "",
        PACKAGES[package],
        "",
        f"::: {package}",
        "    options:",
        "      members: false",
        "      show_root_heading: false",
        "",
    ]
    linked = [(name, path) for name, path, here in entries if not here]
    if linked:
        lines += ["Also exported here, documented where they are defined:", ""]
        lines += [f"- [`{name}`][{path}]" for name, path in linked] + [""]
    for _name, path, here in entries:
        if here:
            lines += [f"::: {path}", ""]
    return "\n".join(lines)


def command_help(argv):
    """What `elmo-tf ARGV --help` prints (argparse's help text, 110 columns wide)."""
    import contextlib
    import io
    import os

    from elmo_tf.cli.main import main as cli_main

    out = io.StringIO()
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "110"
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            cli_main([*argv, "--help"])
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    return out.getvalue()


def command_line_page():
    """The command-line reference: `elmo-tf --help` and every subcommand's `--help`, as the parsers print them."""
    from elmo_tf.cli.main import COMMANDS

    lines = [
        "# Command line",
        "",
        "Every subcommand's `--help`, as `elmo-tf` prints it (generated from the parsers "
        "when this site is built). The guides explain the jobs; [The command line](../cli.md) the contract every "
        "command keeps.",
        "",
        "## elmo-tf",
        "",
        "```text",
        command_help([]).rstrip(),
        "```",
        "",
    ]
    for name in COMMANDS:
        lines += [f"## elmo-tf {name}", "", "```text", command_help([name]).rstrip(), "```", ""]
    return "\n".join(lines)


def main():
    import mkdocs_gen_files

    nav = mkdocs_gen_files.Nav()
    for package, entries in reference_entries().items():
        rel = Path("reference", f"{package}.md")
        nav[package] = f"{package}.md"
        with mkdocs_gen_files.open(rel, "w") as f:
            f.write(page(package, entries))
    nav["command line"] = "command-line.md"
    with mkdocs_gen_files.open("reference/command-line.md", "w") as f:
        f.write(command_line_page())
    with mkdocs_gen_files.open("reference/SUMMARY.md", "w") as f:
        f.writelines(nav.build_literate_nav())


if __name__ in {"__main__", "<run_path>"}:
    main()
