"""`elmo-tf convert` (elmo_tf/cli/convert.py): the CLI contract (one line, exit 1 for a source that cannot be
converted, exit 2 for a bad command line, nothing written either way), and a converted bilm-tf checkpoint embedding
exactly as the hdf5 dump of the same weights does (`elmo-tf embed`)."""

import importlib.util
import os

import h5py
import numpy as np
import pytest
from convert_testlib import FIXTURES, fixture_training_dir

from elmo_tf.cli.main import main

EFML_MISSING = importlib.util.find_spec("elmo_tf.convert.elmoformanylangs") is None


@pytest.fixture
def run_dir(tmp_path):
    return fixture_training_dir(tmp_path / "run")


def cli(capsys, *argv):
    """(exit status, stderr lines) of `elmo-tf convert ARGV` run in process."""
    try:
        code = main(["convert", *map(str, argv)], prog="elmo-tf")
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    return code, capsys.readouterr().err.splitlines()


@pytest.mark.skipif(not EFML_MISSING, reason="the elmoformanylangs converter is installed")
def test_a_source_without_its_module_is_a_usage_error(tmp_path, capsys):
    code, err = cli(capsys, "--from", "elmoformanylangs", tmp_path, "--output", tmp_path / "out")
    assert code == 2 and len(err) == 1 and err[0].startswith("elmo-tf convert: error: --from: elmoformanylangs: ")
    code, err = cli(capsys, "--from", "elmoformanylangs", tmp_path, "--output", tmp_path / "out", "--options", __file__)
    assert code == 2 and err == ["elmo-tf convert: error: --options: not used by --from elmoformanylangs"]


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
