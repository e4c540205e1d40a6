"""elmo_tf/convert/__init__.py and `elmo-tf convert` (elmo_tf/cli/convert.py): the registry of sources, the atomic
output dir (nothing left on an error, never the source, never a non-empty dir), the CLI contract (one line, exit 1 for
a source that cannot be converted, exit 2 for a bad command line), and a converted checkpoint embedding exactly as the
hdf5 dump of the same weights does."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from convert_testlib import FIXTURES, random_softmax, read_hdf5, write_training_dir

from elmo_tf.cli.main import main
from elmo_tf.convert import SOURCES, ConvertError, UnavailableSourceError, convert, source_module

REPO_ROOT = Path(__file__).resolve().parents[2]
EFML_MISSING = importlib.util.find_spec("elmo_tf.convert.elmoformanylangs") is None


@pytest.fixture
def run_dir(tmp_path):
    """A bilm-tf training dir holding the fixture's weights (bilm-tf's lm_weights.hdf5) and a softmax."""
    if not (FIXTURES / "lm_weights.hdf5").is_file():
        pytest.skip(f"bilm-tf fixtures not found at {FIXTURES}")
    write_training_dir(tmp_path / "run", read_hdf5(FIXTURES / "lm_weights.hdf5"), random_softmax(11, 16))
    return tmp_path / "run"


def cli(capsys, *argv):
    """(exit status, stderr lines) of `elmo-tf convert ARGV` run in process."""
    try:
        code = main(["convert", *map(str, argv)], prog="elmo-tf")
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    return code, capsys.readouterr().err.splitlines()


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
def test_a_source_without_its_module_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(UnavailableSourceError, match="elmoformanylangs: this elmo_tf has no converter for it yet"):
        source_module("elmoformanylangs")
    code, err = cli(capsys, "--from", "elmoformanylangs", tmp_path, "--output", tmp_path / "out")
    assert code == 2 and len(err) == 1 and err[0].startswith("elmo-tf convert: error: --from: elmoformanylangs: ")


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


def test_cli_converts_and_answers_bad_input_in_one_line(tmp_path, run_dir, capsys):
    code, err = cli(capsys, "--from", "bilm-tf-checkpoint", run_dir, "--output", tmp_path / "out")
    assert code == 0, err
    assert sorted(os.listdir(tmp_path / "out")) == ["options.json", "softmax.hdf5", "weights.hdf5"]
    # an empty checkpoint dir: exit 1, one line naming the dir and what was expected, nothing written
    (tmp_path / "empty").mkdir()
    code, err = cli(capsys, "--from", "bilm-tf-checkpoint", tmp_path / "empty", "--output", tmp_path / "out2")
    assert code == 1 and err == [
        f"elmo-tf convert: error: {tmp_path / 'empty'}: no TF checkpoint in it; expected model.ckpt-<step>.index "
        "and .data files (bilm-tf's training dir)"
    ]
    assert not (tmp_path / "out2").exists()
    # command-line errors: exit 2, one line naming the flag
    cases = [
        (["--output", tmp_path / "out"], "--output: "),  # exists and is not empty
        (["--output", run_dir], "is the source DIR"),
        (["--output", tmp_path / "o3", "--options", tmp_path / "none.json"], "--options: no such file"),
    ]
    for extra, needle in cases:
        code, err = cli(capsys, "--from", "bilm-tf-checkpoint", run_dir, *extra)
        assert code == 2 and len(err) == 1 and needle in err[0], (extra, err)
    code, err = cli(capsys, "--from", "tf-hub", tmp_path / "empty", "--output", tmp_path / "o4")
    assert code == 1 and len(err) == 1 and "tfhub_module.pb: no such file" in err[0]
    assert sorted(os.listdir(tmp_path)) == ["empty", "out", "run"]


def test_embed_on_a_converted_checkpoint_equals_embed_on_the_dump(tmp_path, run_dir, capsys):
    """`elmo-tf embed` with the converted dir's options.json + weights.hdf5 writes the same numbers as with the
    options.json + weight file bilm-tf's dump_weights wrote for the same weights."""
    assert main(["convert", "--from", "bilm-tf-checkpoint", str(run_dir), "--output", str(tmp_path / "out")]) == 0
    sentences = tmp_path / "s.txt"
    sentences.write_text("The cat sat on the mat .\nHello\nÜber café naïve , ok ?\n")
    outputs = {}
    for key, options, weights in (
        ("converted", tmp_path / "out" / "options.json", tmp_path / "out" / "weights.hdf5"),
        ("dump", FIXTURES / "options.json", FIXTURES / "lm_weights.hdf5"),
    ):
        out = tmp_path / f"{key}.hdf5"
        argv = ["embed", "--options", options, "--weights", weights, "--input", sentences, "--output", out]
        assert main([str(a) for a in argv]) == 0, capsys.readouterr().err
        with h5py.File(out, "r") as f:
            outputs[key] = {k: f[k][...] for k in ("0", "1", "2")}
    for k in ("0", "1", "2"):
        assert outputs["converted"][k].shape[0] == 3 and np.abs(outputs["dump"][k]).max() > 0
        np.testing.assert_array_equal(outputs["converted"][k], outputs["dump"][k])
