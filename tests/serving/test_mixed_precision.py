"""elmo_tf/serving/mixed_precision.py: `serve --mixed_precision`, stock TF Serving's flag, does what stock does with it
(saved_model_bundle_factory.cc): "bfloat16" turns on the auto_mixed_precision_onednn_bfloat16 grappler pass before a
version loads, with stock's log line; another value is stock's warning and a float32 model; empty, nothing.
A real server (a subprocess on 127.0.0.1) and a real gRPC client: the served numbers are the Keras model's to bfloat16
rounding, not to float32's."""

import logging
import os

import numpy as np
import pytest
from serving_testlib import free_port, kill_if_running, reference_sentences, serve_embedded, stop_with_sigterm

from elmo_tf.serving.client import ElmoClient
from elmo_tf.serving.mixed_precision import GRAPPLER_PASS, apply_mixed_precision
from elmo_tf.serving.options import ServerOptions

SENTENCES = ["The cat sat on the mat .", "Dogs are in the fog , aren't they ?", "ELMo"]


def _float_diffs(expected, got):
    return {
        key: float(np.abs(np.asarray(got[key]) - value).max())
        for key, value in expected.items()
        if np.asarray(value).dtype.kind == "f" and np.asarray(value).size
    }


@pytest.mark.slow
def test_bfloat16_rewrites_the_served_graph_as_stock_does(base_path, model):
    """TF_ENABLE_ONEDNN_OPTS=1 registers the pass on any CPU (on AVX-512 CPUs it is on by default): the served
    outputs then differ from the float32 model's by bfloat16's rounding (above 1e-4, far above float32's 1e-6), and stay
    within it (5e-2 on outputs of magnitude up to about 3, the clip)."""
    port = free_port()
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1")  # not forkable: a fresh interpreter (tests/forked.py)
    flags = ["--model_base_path", base_path, "--model_name", "elmo", "--port", port, "--mixed_precision=bfloat16"]
    process = serve_embedded(*flags, "--enable_model_warmup=false", env=env)
    try:
        with ElmoClient(f"127.0.0.1:{port}", "elmo", timeout=120) as client:
            client.wait_for_model(timeout=180)
            got = client.embed(SENTENCES)
        output = stop_with_sigterm(process)
        assert process.returncode == 0, output[-3000:]
    finally:
        kill_if_running(process)
    assert "Running inference with bfloat16 auto mixed precision" in output, output[-3000:]
    diffs = _float_diffs(reference_sentences(model, SENTENCES), got)
    assert 1e-4 < max(diffs.values()) < 5e-2, diffs
    np.testing.assert_array_equal(got["sequence_len"], [7, 9, 1])


def test_another_value_is_stock_s_warning_and_float32(caplog):
    """Stock logs "<value> auto mixed precision is not supported. Valid option: bfloat16" and loads the model as it
    is: the server starts, nothing is rewritten."""
    import tensorflow as tf

    with caplog.at_level(logging.INFO, logger="elmo_tf.serving.mixed_precision"):
        assert apply_mixed_precision("float16") is False
        assert apply_mixed_precision("") is False
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["float16 auto mixed precision is not supported. Valid option: bfloat16"]
    assert caplog.records[0].levelno == logging.WARNING
    assert not tf.config.optimizer.get_experimental_options().get(GRAPPLER_PASS)


@pytest.mark.parametrize("value", [None, 1, b"bfloat16"])
def test_server_options_take_a_string_only(value):
    with pytest.raises(ValueError, match=rf"mixed_precision must be a string .*got {value!r}"):
        ServerOptions(mixed_precision=value)


def test_the_default_is_stock_s_none():
    assert ServerOptions().mixed_precision == ""


def test_a_served_version_knows_the_precision_its_export_records(loaded, tmp_path, caplog):
    """The export's `assets.extra/elmo_tf.json` (elmo_tf.saved_model.metadata) gives the servable its precision; a
    version without it is None, and one whose file is not JSON is logged, never a failed load."""
    from elmo_tf.saved_model.metadata import metadata_path
    from elmo_tf.serving.servable import export_precision

    assert loaded.precision == "float32"
    assert export_precision(str(tmp_path)) is None
    path = metadata_path(str(tmp_path))
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write("{not json")
    with caplog.at_level(logging.WARNING, logger="elmo_tf.serving.servable"):
        assert export_precision(str(tmp_path)) is None
    assert "elmo_tf.json: not elmo_tf's export metadata" in caplog.text
