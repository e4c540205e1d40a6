"""elmo_tf/serving/limits/response_size.py: response sizes estimated before the model runs, for proto and JSON, against
real responses (in process and from the REST front on 127.0.0.1), with dims the SignatureDef leaves unknown learned at
warm-up."""

import http.client
import json
import urllib.parse

import numpy as np
import tensorflow as tf
from serving_fake import fake_runner
from tensorflow_serving.apis import predict_pb2

from elmo_tf.serving.rest.rest_json import outputs_to_json


def test_response_estimate_uses_dims_learned_at_warm_up():
    """A SignatureDef may leave inner dims unknown ([-1, -1, -1]); the warm-up outputs tell them."""
    runner = fake_runner(y_shape=(-1, -1))
    assert runner.sizes.response_bytes(batch=2, time=5, aliases=("y", "total")) == (2 * 5 + 2) * 4
    runner.sizes.learn_inner_dims({"y": np.zeros((1, 1, 7), np.float32), "total": np.zeros((1,), np.float32)})
    assert runner.sizes.inner_dims == {"y": (7,), "total": ()}
    assert runner.sizes.response_bytes(batch=2, time=5, aliases=("y",)) == 2 * 5 * 7 * 4


def proto_size(outputs):
    response = predict_pb2.PredictResponse()
    for alias, value in outputs.items():
        response.outputs[alias].CopyFrom(tf.make_tensor_proto(value))
    return response.ByteSize()


def json_sizes(outputs):
    """Lengths of TF Serving's columnar and row JSON responses, as the REST front writes them."""
    return tuple(len(b"".join(outputs_to_json(outputs, row_format, 2**40))) for row_format in (False, True))


def test_response_estimates_match_real_responses(loaded):
    """Estimated before the model runs, measured after: proto within 64 bytes per output (the tensors' bytes are
    exact), JSON at most 15% above (row and columnar: an upper estimate, float32 as its shortest text of 3 to 15
    characters, 12 counted); JSON is about 3x the binary size."""
    rng = np.random.default_rng(0)
    words = [w.encode() for w in "the cat sat on a mat , dogs bark at night ; Zürich 2018 naïve café !".split()]
    requests = []
    for rows, low, high in [(1, 30, 30), (8, 20, 20), (8, 1, 40), (16, 100, 100), (32, 0, 60)]:
        sentences = [b" ".join(rng.choice(words, size=rng.integers(low, high + 1))) for _ in range(rows)]
        requests.append(("default", {"sentences": np.array(sentences, object)}))
    tokens = np.full((4, 50), b"", object)
    tokens[:, :45] = b"word"
    requests.append(("tokens", {"tokens": tokens, "sequence_len": np.array([45, 10, 0, 30], np.int32)}))
    ratios = []
    for signature, inputs in requests:
        runner = loaded.runner(signature)
        for output_filter in [(), ("elmo", "mask", "sequence_len"), ("lstm_outputs1",)]:
            proto = runner.budget.prepare(inputs, output_filter)
            as_json = runner.budget.prepare(inputs, output_filter, response_encoding="json")
            outputs = runner.run(proto.inputs)
            outputs = {alias: outputs[alias] for alias in proto.output_filter}
            real = proto_size(outputs)
            overhead = 64 * len(outputs)  # dtype, shape and map key of each output
            assert real - overhead <= proto.response_bytes <= real, (signature, output_filter, proto, real)
            for real in json_sizes(outputs):
                assert 1.0 <= as_json.response_bytes / real <= 1.15, (signature, output_filter, as_json, real)
            ratios.append(as_json.response_bytes / proto.response_bytes)
    assert 1.5 < min(ratios) and 2.9 < max(ratios) < 3.2, ratios  # 3x; padding ("0.0,") makes JSON cheaper


def test_json_estimate_matches_the_rest_front(rest_url, loaded):
    """The REST front's real bodies (127.0.0.1, row and columnar formats) against the estimate it is checked with."""
    sentences = ["the cat sat on the mat .", "dogs bark", " ".join(["word"] * 60), ""]
    runner = loaded.runner("default")
    estimate = runner.budget.prepare(
        {"sentences": np.array([s.encode() for s in sentences], object)}, response_encoding="json"
    ).response_bytes
    parts = urllib.parse.urlsplit(rest_url)
    for body in ({"inputs": sentences}, {"instances": sentences}):
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        try:
            connection.request("POST", "/v1/models/elmo:predict", body=json.dumps(body).encode())
            response = connection.getresponse()
            real = len(response.read())
        finally:
            connection.close()
        assert response.status == 200
        print(f"\nJSON estimate {estimate} bytes, REST body {real} bytes ({next(iter(body))})")
        assert 1.0 <= estimate / real <= 1.15, (body, estimate, real)
