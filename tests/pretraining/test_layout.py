"""elmo_tf/pretraining's shape (issue 26): the step, the loop, checkpoints, callbacks, model-dir I/O and evaluation
in modules of their own, each small, importing only lower floors (never the command-line code or another task)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "elmo_tf" / "pretraining"
MODULES = sorted(PACKAGE.rglob("*.py"))
# the floors below pretraining, and pretraining itself
ALLOWED = ("elmo_tf._lazy", "elmo_tf.config", "elmo_tf.errors", "elmo_tf.bounds", "elmo_tf.machine", "elmo_tf.io",
           "elmo_tf.layers", "elmo_tf.models", "elmo_tf.preprocessing", "elmo_tf.pretraining")  # fmt: skip


def _tree(path):
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _length(node):
    return node.end_lineno - node.lineno + 1


def test_the_parts_have_files_of_their_own():
    names = {p.relative_to(PACKAGE).as_posix() for p in MODULES}
    for part in ("config.py", "step.py", "trainer.py", "loop.py", "checkpoints.py", "model_dir.py", "evaluation.py",
                 "run.py", "callbacks/checkpoint_every.py", "callbacks/stop_after_minutes.py",
                 "callbacks/progress_bar.py", "callbacks/step_csv_logger.py"):  # fmt: skip
        assert part in names
    assert not (PACKAGE.parent / "pretrain.py").exists()


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_modules_are_small_and_import_only_lower_floors(path):
    tree = _tree(path)
    assert len(path.read_text(encoding="utf-8").splitlines()) <= 500
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            assert _length(node) <= 300, node.name
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body[1:] if ast.get_docstring(node) else node.body  # the code, not its docstring
            assert body[-1].end_lineno - body[0].lineno + 1 <= 80, node.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("elmo_tf"):
            # `from elmo_tf import _lazy` imports the module elmo_tf._lazy
            modules = [f"elmo_tf.{a.name}" for a in node.names] if node.module == "elmo_tf" else [node.module]
            for module in modules:
                assert module.startswith(ALLOWED), module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                assert not alias.name.startswith("elmo_tf") or alias.name.startswith(ALLOWED), alias.name


def test_the_trainer_owns_the_step_and_the_controller_the_loop():
    """Orbit's split: the loop (callbacks, stop agreement) is not in the trainer, and the step is not in the loop."""
    trainer = _tree(PACKAGE / "trainer.py")
    (cls,) = [n for n in trainer.body if isinstance(n, ast.ClassDef) and n.name == "Trainer"]
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    assert "_stop_requested" not in methods and "_any_worker" not in methods
    assert _length(methods["fit"]) <= 10  # delegates to loop.Controller
    loop_source = (PACKAGE / "loop.py").read_text(encoding="utf-8")
    assert "GradientTape" not in loop_source and "apply_gradients" not in loop_source
    assert "any_worker" in loop_source  # the stop every worker agrees on
