"""The code blocks of the docs that talk to a served export run against the shared embedded server (conftest.py),
with the docs' addresses (`localhost:8500`, `localhost:8501`, `models/elmo/1`) replaced by the test server's: the
gRPC client examples, the TF Hub migration, fine-tuning the export with ELMoSavedModel, and every `curl` line."""

import os

import numpy as np
import pytest
import requests
from docs_testlib import all_blocks, shell_commands
from serving_testlib import assert_parity, reference_sentences


def blocks_with(text, language="python"):
    blocks = [b for b in all_blocks(language) if text in b.code]
    assert blocks, f"no {language} block of the docs holds {text!r}"
    return blocks


def run_block(block, replacements):
    code = block.code
    for old, new in replacements.items():
        code = code.replace(old, new)
    namespace = {}
    exec(compile(code, block.where, "exec"), namespace)
    return namespace


def test_the_client_example_embeds_as_the_model_does(server, model):
    (block,) = blocks_with('ElmoClient("localhost:8500", model_name="elmo", timeout=30)')
    namespace = run_block(block, {"localhost:8500": f"127.0.0.1:{server.grpc_port}"})
    out = namespace["out"]  # the last call: embed_tokens with output_filter
    assert sorted(out) == ["elmo", "sequence_len"]
    expected = reference_sentences(model, ["The cat", "Dogs"])
    assert_parity(expected, dict(out), keys=["elmo", "sequence_len"])


def test_the_tf_hub_migration_example_runs(server, model):
    (block,) = blocks_with('ElmoClient("localhost:8500", model_name="elmo") as client:')
    namespace = run_block(block, {"localhost:8500": f"127.0.0.1:{server.grpc_port}"})
    expected = reference_sentences(model, ["The cat sat", "Dogs bark"])
    np.testing.assert_allclose(namespace["out"], expected["elmo"], atol=1e-5)


@pytest.mark.slow
def test_the_fine_tuning_example_trains_the_export(base_path):
    (block,) = blocks_with('ELMoSavedModel("models/elmo/1"')
    namespace = run_block(block, {'"models/elmo/1"': repr(os.path.join(base_path, "1"))})
    classifier = namespace["classifier"]
    import tensorflow as tf

    sentences = tf.constant(["The cat sat on the mat .", "Dogs bark"])
    before = [w.numpy().copy() for w in namespace["elmo"].trainable_weights]
    assert before  # trainable=True: the export's own variables train
    classifier.fit(sentences, np.array([0, 1]), epochs=1, verbose=0)
    changed = [not np.array_equal(b, w.numpy()) for b, w in zip(before, namespace["elmo"].trainable_weights)]
    assert any(changed)


@pytest.mark.parametrize("block", [b for b in all_blocks("bash") if "curl " in b.code], ids=lambda b: b.where)
def test_curl_examples_are_answered(block, server):
    """Each `curl -X POST URL -d BODY` of the docs, sent by requests to the test server's REST port: 200."""
    for tokens in shell_commands(block.code):
        if tokens[0] != "curl":
            continue
        url = tokens[tokens.index("-X") + 2].replace("localhost:8501", f"127.0.0.1:{server.rest_port}")
        body = tokens[tokens.index("-d") + 1]
        response = requests.post(url, data=body, timeout=60)
        assert response.status_code == 200, (block.where, response.text)
        assert "predictions" in response.json() or "outputs" in response.json()
