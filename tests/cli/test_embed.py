"""elmo_tf/cli/embed.py: `python -m elmo_tf embed` writes the file `elmo_tf.embed.embed_file` writes, in float32 and in
bfloat16 (--precision: the file's attribute `precision` says which); a missing weights file and a zero batch size
are one error line naming the flag (more errors: test_embed_errors.py)."""

import os
import sys

import forked
import h5py
import numpy as np
import pytest
from embed_testlib import REPO_ROOT, read_output, write_lines

from elmo_tf.embed import embed_file
from elmo_tf.models import load_elmo, save_elmo


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


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_cli_writes_the_file(saved_model, tiny_elmo, input_file, tmp_path, precision):
    """The library's file, to float rounding, for the model computing in --precision; bfloat16's vectors differ from
    float32's by bfloat16's rounding (above 1e-4, below 0.1 on these tiny random weights), float32's are the
    library's float32 file."""
    out = tmp_path / "cli.hdf5"
    result = run_cli(
        "--precision",
        precision,
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
    assert f"computed in {precision}; wrote {out}" in result.stderr
    arrays, index = read_output(out)
    model = load_elmo(saved_model / "options.json", saved_model / "weights.hdf5", precision=precision)
    embed_file(model, input_file, tmp_path / "lib.hdf5", layers="top")
    expected, expected_index = read_output(tmp_path / "lib.hdf5")
    assert index == expected_index and set(arrays) == set(expected)
    for key in expected:
        np.testing.assert_allclose(arrays[key], expected[key], atol=1e-5, rtol=0, err_msg=key)
    for path in (out, tmp_path / "lib.hdf5"):
        with h5py.File(path, "r") as f:
            assert f.attrs["precision"] == precision
    embed_file(tiny_elmo, input_file, tmp_path / "float32.hdf5", layers="top")
    float32, _ = read_output(tmp_path / "float32.hdf5")
    worst = max(float(np.abs(arrays[key] - float32[key]).max(initial=0.0)) for key in float32)
    if precision == "float32":
        assert worst <= 1e-5
    else:
        assert 1e-4 < worst < 0.1, worst


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
