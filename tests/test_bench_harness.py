"""bench/common.py's worker protocol: a worker of another commit's tree imports that tree's elmo_tf and nothing of
this checkout's (the editable install's finder once served this checkout's modules to a baseline that lacked them)."""

import importlib.util
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "bench")


def _load_common():
    spec = importlib.util.spec_from_file_location("bench_common", os.path.join(BENCH, "common.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


common = _load_common()  # bench/common.py (the benchmark scripts import it as `common`, from bench/)

PROBE = f"""
import importlib.util, sys, types
sys.path.insert(0, {BENCH!r})
from common import add_worker_flags, serve_worker
import argparse

def probe(args):
    import elmo_tf
    if args.stray:  # a module of elmo_tf that came from somewhere else
        stray = types.ModuleType("elmo_tf.stray")
        stray.__file__ = {os.path.join(REPO, "elmo_tf", "stray.py")!r}
        sys.modules["elmo_tf.stray"] = stray
    return {{
        "elmo_tf": elmo_tf.__file__,
        "finds_pretraining": importlib.util.find_spec("elmo_tf.pretraining") is not None,
    }}

parser = argparse.ArgumentParser()
add_worker_flags(parser, ["probe"])
parser.add_argument("--stray", action="store_true")
sys.exit(serve_worker({{"probe": probe}}, parser.parse_args()))
"""


@pytest.fixture
def old_tree(tmp_path):
    """A commit's tree whose elmo_tf lacks the `pretraining` package this checkout has."""
    tree = tmp_path / "tree"
    (tree / "elmo_tf").mkdir(parents=True)
    (tree / "elmo_tf" / "__init__.py").write_text("")
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    return tree, script


def test_a_worker_of_another_tree_imports_only_that_tree(old_tree, tmp_path):
    tree, script = old_tree
    result = common.run_worker(str(script), "probe", [], str(tmp_path), pythonpath=str(tree))
    assert result["elmo_tf"] == str(tree / "elmo_tf" / "__init__.py")
    assert result["finds_pretraining"] is False  # this checkout's elmo_tf/pretraining is not offered to it


def test_our_own_worker_still_finds_this_checkout(old_tree, tmp_path):
    _, script = old_tree
    result = common.run_worker(str(script), "probe", [], str(tmp_path))
    assert result["elmo_tf"] == os.path.join(REPO, "elmo_tf", "__init__.py")
    assert result["finds_pretraining"] is True


def test_a_module_from_outside_the_tree_fails_the_worker(old_tree, tmp_path):
    tree, script = old_tree
    with pytest.raises(common.WorkerError, match=r"imported elmo_tf modules from elsewhere: elmo_tf\.stray"):
        common.run_worker(str(script), "probe", ["--stray"], str(tmp_path), pythonpath=str(tree))
