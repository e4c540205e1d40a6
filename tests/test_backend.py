"""elmo_tf/backend.py: the `elmo-tf` commands run on TensorFlow whatever KERAS_BACKEND or keras.json say (a JAX or
PyTorch user's shell), and a process that already runs Keras on another backend gets one line saying why not."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from cli_testlib import REPO_ROOT, assert_one_error
from embed_testlib import read_output, write_lines

from elmo_tf.embed import embed_file
from elmo_tf.models import save_elmo


def _fresh(args, env_extra, timeout=300):
    """`python args...` in a fresh interpreter (the fork server has imported Keras already) with `env_extra`."""
    env = {key: value for key, value in os.environ.items() if key != "KERAS_BACKEND"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", **env_extra)
    return subprocess.run(
        [sys.executable, *map(str, args)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def _embed_args(model_dir, input_path, output_path):
    return ["-m", "elmo_tf", "embed", "--options", model_dir / "options.json", "--weights", model_dir / "weights.hdf5",
            "--input", input_path, "--output", output_path, "--quiet"]  # fmt: skip


def _embed_under(env, tiny_elmo, tmp_path):
    """embed's output in a fresh `elmo-tf embed` process under `env`, and the output of the same model here (on
    TensorFlow)."""
    save_elmo(tiny_elmo, tmp_path / "model")
    input_path = write_lines(tmp_path)
    result = _fresh(_embed_args(tmp_path / "model", input_path, tmp_path / "out.hdf5"), env)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    embed_file(tiny_elmo, input_path, tmp_path / "here.hdf5")
    return read_output(tmp_path / "out.hdf5"), read_output(tmp_path / "here.hdf5")


def _assert_same(output, reference):
    (arrays, index), (reference_arrays, reference_index) = output, reference
    assert index == reference_index and arrays.keys() == reference_arrays.keys()
    for key, value in reference_arrays.items():
        np.testing.assert_array_equal(arrays[key], value, err_msg=key)


@pytest.mark.slow
def test_embed_runs_on_tensorflow_under_keras_backend_jax(tiny_elmo, tmp_path):
    _assert_same(*_embed_under({"KERAS_BACKEND": "jax"}, tiny_elmo, tmp_path))


@pytest.mark.slow
def test_embed_runs_on_tensorflow_when_keras_json_says_jax(tiny_elmo, tmp_path):
    keras_home = tmp_path / "keras_home"  # a keras.json choosing JAX, as `keras.config.set_backend` users have
    keras_home.mkdir()
    (keras_home / "keras.json").write_text(json.dumps({"backend": "jax"}))
    _assert_same(*_embed_under({"KERAS_HOME": str(keras_home)}, tiny_elmo, tmp_path))


def test_a_process_already_on_jax_is_told_in_one_line(tiny_elmo, tmp_path):
    save_elmo(tiny_elmo, tmp_path / "model")
    input_path = write_lines(tmp_path)
    args = _embed_args(tmp_path / "model", input_path, tmp_path / "out.hdf5")[3:]
    code = (
        "import sys, keras\n"  # Keras imported first, on JAX: the backend can no longer change in this process
        "from elmo_tf.cli.main import main\n"
        f"sys.exit(main(['embed', *{[str(a) for a in args]!r}]))\n"
    )
    result = _fresh(["-c", code], {"KERAS_BACKEND": "jax"})
    assert_one_error(result, 1, "KERAS_BACKEND", "'jax'", "TensorFlow")
    assert not (tmp_path / "out.hdf5").exists()
