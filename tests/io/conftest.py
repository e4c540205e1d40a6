"""Fixtures of the weight-file tests: a tiny biLM's weights.hdf5 and options.json written to the test's directory."""

import pytest

from elmo_tf.io import save_bilm_weights


@pytest.fixture
def saved(tiny_elmo, tmp_path):
    """`weights.hdf5` of `tiny_elmo` in `tmp_path`."""
    path = tmp_path / "weights.hdf5"
    save_bilm_weights(tiny_elmo, path)
    return path


@pytest.fixture
def options(tiny_config, tmp_path):
    """`options.json` of `tiny_config` in `tmp_path` (beside `saved`; test_options_errors.py has its own)."""
    path = tmp_path / "options.json"
    tiny_config.to_json(path)
    return path
