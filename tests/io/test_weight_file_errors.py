"""elmo_tf/io/bilm_hdf5.py: every bad weight file raises `WeightFileError` (a ValueError) naming the file and
the dataset; `load_elmo` raises only ConfigError / WeightFileError, never KeyError, TypeError or OSError."""

import json

import h5py
import numpy as np
import pytest

from elmo_tf.config import ConfigError
from elmo_tf.io import WeightFileError, load_bilm_weights
from elmo_tf.models import load_elmo

BIAS = "RNN_0/RNN/MultiRNNCell/Cell1/LSTMCell/B"  # (64,) in the tiny config


def replace(path, name, data=None, **kwargs):
    with h5py.File(path, "r+") as f:
        del f[name]
        f.create_dataset(name, data=data, **kwargs)


def weight_error(options, weights):
    with pytest.raises(WeightFileError) as info:
        load_elmo(options, weights)
    message = str(info.value)
    assert message.startswith(f"{weights}: ") and "\n" not in message
    return message


def test_a_dataset_of_strings(options, saved):
    replace(saved, BIAS, data=np.array(["0.1"] * 64, dtype=object), dtype=h5py.string_dtype())
    assert weight_error(options, saved) == f"{saved}: dataset {BIAS!r} holds strings, expected floating-point numbers"


def test_fixed_length_bytes_and_complex_numbers(options, saved):
    replace(saved, BIAS, data=np.array([b"x"] * 64))
    assert "holds strings" in weight_error(options, saved)
    replace(saved, BIAS, data=np.zeros(64, np.complex64))
    assert f"dataset {BIAS!r} holds dtype complex64, expected floating-point numbers" in weight_error(options, saved)


def test_integers_and_float64_are_converted(make_elmo, saved):
    replace(saved, BIAS, data=np.arange(64, dtype=np.int32))
    replace(saved, "CNN/b_cnn_0", data=np.full(4, 0.5, np.float64))
    model = make_elmo(seed=3)
    load_bilm_weights(model, saved)
    np.testing.assert_array_equal(model.bilm.get_lstm("forward", 1).bias.numpy(), np.arange(64, dtype=np.float32))


def test_wrong_shape_and_missing_dataset(options, saved):
    replace(saved, BIAS, data=np.zeros((64, 1), np.float32))
    assert weight_error(options, saved) == (
        f"{saved}: dataset {BIAS!r} has shape (64, 1), expected (64,) from the options"
    )
    with h5py.File(saved, "r+") as f:
        del f[BIAS]
    assert weight_error(options, saved) == f"{saved}: has no dataset {BIAS!r} (expected shape (64,) from the options)"


def test_a_name_that_is_a_dataset_where_a_group_is_expected(options, saved):
    with h5py.File(saved, "r+") as f:
        del f["CNN"]
        f.create_dataset("CNN", data=np.zeros(3, np.float32))
    message = weight_error(options, saved)
    assert "'CNN/W_cnn_0'" in message


def test_a_dangling_soft_link(options, saved):
    with h5py.File(saved, "r+") as f:
        del f[BIAS]
        f[BIAS] = h5py.SoftLink("/nowhere/at/all")
    assert f"{BIAS!r}" in weight_error(options, saved)


@pytest.mark.parametrize("fraction", [0.0, 0.01, 0.2, 0.5, 0.9, 0.999])
def test_truncated_files(options, saved, tmp_path, fraction):
    data = saved.read_bytes()
    cut = tmp_path / "cut.hdf5"
    cut.write_bytes(data[: int(len(data) * fraction)])
    message = weight_error(options, cut)
    assert "truncated" in message


def test_not_hdf5_a_directory_and_a_missing_file(options, tmp_path):
    text = tmp_path / "weights.txt"
    text.write_text("this is not hdf5\n" * 100)
    assert "cannot read the weight file (truncated, or not HDF5)" in weight_error(options, text)
    assert weight_error(options, tmp_path) == f"{tmp_path}: is a directory, not an HDF5 weight file"
    assert weight_error(options, tmp_path / "nope.hdf5") == f"{tmp_path / 'nope.hdf5'}: no such weight file"
    assert "not HDF5" in weight_error(options, options)  # the options given as weights


def test_load_elmo_checks_the_options_first(options, saved, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"lstm": {"dim": "4096"}, "char_cnn": {}}))
    with pytest.raises(ConfigError, match="bad.json: "):
        load_elmo(bad, saved)


def test_a_failed_load_changes_no_variable(make_elmo, saved):
    replace(saved, BIAS, data=np.full(64, np.nan, np.float32))
    model = make_elmo(seed=7)
    before = [v.numpy().copy() for v in model.weights]
    with pytest.raises(WeightFileError, match="NaN"):
        load_bilm_weights(model, saved)
    for old, var in zip(before, model.weights):
        np.testing.assert_array_equal(old, var.numpy())


def test_corrupted_bytes_give_weight_file_errors_only(make_elmo, saved, tmp_path):
    """Garbage written over 16 bytes at 80 places (headers, b-trees, data): the load succeeds (data bytes that
    still make finite floats) or raises WeightFileError; never an h5py KeyError/OSError/TypeError traceback."""
    data = saved.read_bytes()
    model = make_elmo()
    rng = np.random.default_rng(0)
    outcomes = {"loaded": 0, "error": 0}
    for k, start in enumerate(np.linspace(0, len(data) - 16, 80).astype(int)):
        broken = bytearray(data)
        broken[start : start + 16] = rng.integers(0, 256, 16, dtype=np.uint8).tobytes()
        path = tmp_path / f"broken{k}.hdf5"
        path.write_bytes(bytes(broken))
        try:
            load_bilm_weights(model, path)
            outcomes["loaded"] += 1
        except WeightFileError as e:
            assert str(e).startswith(f"{path}: ") and "\n" not in str(e)
            outcomes["error"] += 1
    assert outcomes["error"] > 0, outcomes  # the sweep does hit metadata
