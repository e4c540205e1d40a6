"""elmo_tf/cli/embed.py: `python -m elmo_tf embed` writes the file `elmo_tf.embed.embed_file` writes; a missing
weights file and a zero batch size are one error line naming the flag (more errors: test_embed_errors.py)."""

import os
import sys

import forked
import numpy as np
import pytest
from embed_testlib import REPO_ROOT, read_output, write_lines

from elmo_tf.embed import embed_file
from elmo_tf.models import save_elmo


@pytest.fixture
def input_file(tmp_path):
    return write_lines(tmp_path)


def run_cli(*args):
    return forked.run(
        [sys.executable, "-m", "elmo_tf", "embed", *map(str, args)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )


def error_lines(stderr):
    return [line for line in stderr.splitlines() if "error:" in line]


@pytest.fixture
def saved_model(tiny_elmo, tmp_path):
    save_elmo(tiny_elmo, tmp_path / "model")
    return tmp_path / "model"


def test_cli_writes_the_file(saved_model, tiny_elmo, input_file, tmp_path):
    out = tmp_path / "cli.hdf5"
    result = run_cli(
        "--options",
        saved_model / "options.json",
        "--weights",
        saved_model / "weights.hdf5",
        "--input",
        input_file,
        "--output",
        out,
        "--layers",
        "top",
        "--batch-size",
        "2",
    )
    assert result.returncode == 0, result.stderr
    arrays, index = read_output(out)
    embed_file(tiny_elmo, input_file, tmp_path / "lib.hdf5", layers="top")
    expected, expected_index = read_output(tmp_path / "lib.hdf5")
    assert index == expected_index and set(arrays) == set(expected)
    for key in expected:
        np.testing.assert_allclose(arrays[key], expected[key], atol=1e-5, rtol=0, err_msg=key)


def test_cli_missing_weights_file(saved_model, input_file, tmp_path):
    out = tmp_path / "never.hdf5"
    result = run_cli(
        "--options",
        saved_model / "options.json",
        "--weights",
        tmp_path / "nope.hdf5",
        "--input",
        input_file,
        "--output",
        out,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "--weights" in lines[0] and "nope.hdf5" in lines[0], result.stderr
    assert not out.exists()


def test_cli_batch_size_zero(saved_model, input_file, tmp_path):
    out = tmp_path / "never.hdf5"
    result = run_cli(
        "--options",
        saved_model / "options.json",
        "--weights",
        saved_model / "weights.hdf5",
        "--input",
        input_file,
        "--output",
        out,
        "--batch-size",
        "0",
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "--batch-size" in lines[0], result.stderr
    assert not out.exists()
