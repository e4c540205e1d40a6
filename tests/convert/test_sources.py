"""elmo_tf/convert/__init__.py: the registry of sources (imported lazily, no TensorFlow at import) and `convert`'s
output dir: new or empty, never the source, written under a hidden temporary name and renamed, so nothing is left
after an error."""

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from convert_testlib import fixture_training_dir

from elmo_tf.convert import SOURCES, ConvertError, UnavailableSourceError, convert, source_module
from elmo_tf.errors import ElmoTFError

REPO_ROOT = Path(__file__).resolve().parents[2]
EFML_MISSING = importlib.util.find_spec("elmo_tf.convert.elmoformanylangs") is None


@pytest.fixture
def run_dir(tmp_path):
    return fixture_training_dir(tmp_path / "run")


def test_importing_the_package_loads_no_tensorflow():
    code = "import sys, elmo_tf.convert; print(sorted({'tensorflow', 'keras', 'h5py'} & set(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr


def test_registry_imports_the_source_modules_lazily():
    assert list(SOURCES) == ["elmoformanylangs", "bilm-tf-checkpoint", "tf-hub"]
    assert source_module("tf-hub").__name__ == "elmo_tf.convert.tf_hub"
    assert callable(source_module("bilm-tf-checkpoint").convert)
    with pytest.raises(ConvertError, match="unknown source 'bilm-tf'; expected one of elmoformanylangs, "):
        source_module("bilm-tf")


@pytest.mark.skipif(not EFML_MISSING, reason="the elmoformanylangs converter is installed")
def test_a_source_without_its_module_is_a_clear_error():
    with pytest.raises(UnavailableSourceError, match="elmoformanylangs: this elmo_tf has no converter for it yet"):
        source_module("elmoformanylangs")


def test_the_output_dir_is_new_or_empty_and_never_the_source(tmp_path, run_dir):
    with pytest.raises(ConvertError, match="is the source directory"):
        convert("bilm-tf-checkpoint", str(run_dir), str(run_dir))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(ConvertError, match="exists and is not empty"):
        convert("bilm-tf-checkpoint", str(run_dir), str(tmp_path / "full"))
    assert os.listdir(tmp_path / "full") == ["keep.txt"]
    with pytest.raises(ConvertError, match="takes no option vocab"):
        convert("bilm-tf-checkpoint", str(run_dir), str(tmp_path / "x"), vocab="v.txt")
    (tmp_path / "empty").mkdir()
    written = convert("bilm-tf-checkpoint", str(run_dir), str(tmp_path / "empty"))
    assert written[0] == str(tmp_path / "empty" / "options.json") and all(os.path.isfile(p) for p in written)
    written = convert("bilm-tf-checkpoint", str(run_dir), str(tmp_path / "a" / "b"))  # parents are made
    assert sorted(os.listdir(tmp_path / "a" / "b")) == ["options.json", "softmax.hdf5", "weights.hdf5"]


def test_an_error_midway_leaves_nothing(tmp_path, run_dir, monkeypatch):
    import elmo_tf.convert.bilm_tf_checkpoint as module

    def fail(*args, **kwargs):
        raise ConvertError("softmax exploded")

    monkeypatch.setattr(module, "_softmax", fail)  # after weights.hdf5 and options.json are written
    with pytest.raises(ConvertError, match="softmax exploded"):
        convert("bilm-tf-checkpoint", str(run_dir), str(tmp_path / "out"))
    with pytest.raises(ConvertError, match="softmax exploded"):  # the parents made for it go too
        convert("bilm-tf-checkpoint", str(run_dir), str(tmp_path / "new" / "out"))
    assert sorted(os.listdir(tmp_path)) == ["run"]


def test_an_empty_output_dir_given_through_a_symlink_is_written_through_it(tmp_path, run_dir):
    """`--output link` where link -> an empty dir: the files land in that dir and the link stays a link (the rename
    onto the link itself failed with a bare "Not a directory")."""
    (tmp_path / "empty").mkdir()
    os.symlink(tmp_path / "empty", tmp_path / "link")
    written = convert("bilm-tf-checkpoint", str(run_dir), str(tmp_path / "link"))
    assert os.path.islink(tmp_path / "link")
    assert sorted(os.listdir(tmp_path / "empty")) == ["options.json", "softmax.hdf5", "weights.hdf5"]
    assert written[0] == str(tmp_path / "link" / "options.json") and os.path.isfile(written[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "link", "run"]  # no temporary left


@contextlib.contextmanager
def no_hang(seconds=60):
    """Fails the test instead of blocking forever (opening a FIFO for reading waits for a writer)."""

    def fail(signum, frame):
        raise TimeoutError(f"blocked for {seconds} s")

    previous = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _replace(path, kind):
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()


NOT_REGULAR = [
    ("bilm-tf-checkpoint", "checkpoint", "fifo"),
    ("bilm-tf-checkpoint", "checkpoint", "dir"),
    ("bilm-tf-checkpoint", "options.json", "fifo"),
    ("bilm-tf-checkpoint", "options.json", "dir"),
    ("bilm-tf-checkpoint", "model.ckpt-1250.index", "fifo"),
    ("elmoformanylangs", "config.json", "fifo"),
    ("elmoformanylangs", "arch.json", "fifo"),
    ("elmoformanylangs", "char.dic", "fifo"),
    ("elmoformanylangs", "word.dic", "dir"),
    ("elmoformanylangs", "token_embedder.pkl", "fifo"),
    ("elmoformanylangs", "encoder.pkl", "fifo"),
    ("tf-hub", "tfhub_module.pb", "fifo"),
]


@pytest.mark.parametrize("source,name,kind", NOT_REGULAR)
def test_a_source_file_that_is_not_a_regular_file_is_refused_naming_it(tmp_path, source, name, kind):
    """A FIFO (which would block the read forever) or a directory where a source holds a file: one line naming it and
    what it is, nothing written."""
    if source == "bilm-tf-checkpoint":
        src = fixture_training_dir(tmp_path / "src")
    elif source == "elmoformanylangs":
        if EFML_MISSING:
            pytest.skip("the elmoformanylangs converter is not installed")
        src = Path(shutil.copytree(REPO_ROOT / "tests" / "fixtures" / "efml" / "word" / "model", tmp_path / "src"))
    else:
        src = tmp_path / "src"
        src.mkdir()
    _replace(src / name, kind)
    what = "is a FIFO" if kind == "fifo" else "is a directory"
    with no_hang(), pytest.raises(ElmoTFError) as info:
        convert(source, str(src), str(tmp_path / "out"))
    message = str(info.value)
    assert message.startswith(f"{src / name}: {what}") and "\n" not in message, message
    assert not (tmp_path / "out").exists()
