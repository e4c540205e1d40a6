"""elmo_tf/serving/rest_api.py over real HTTP on 127.0.0.1: TF Serving's /v1/models endpoints, row ("instances") and
columnar ("inputs") predict formats with parity, b64 strings, versions, metrics, and errors as {"error": ...} with TF
Serving's HTTP codes, malformed requests included."""

import base64

import numpy as np
import pytest
from rest_testlib import (
    arrays,
    assert_still_serving,
    call,
    get,
    post,
)
from serving_testlib import assert_parity, reference_sentences, reference_tokens

SENTENCES = ["The cat sat on the mat .", "ELMo", ""]


def test_model_status(rest_url):
    status, body = call(f"{rest_url}/v1/models/elmo")
    assert status == 200
    assert body == {
        "model_version_status": [
            {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
        ]
    }
    status, body = call(f"{rest_url}/v1/models/elmo/versions/1")
    assert status == 200 and body["model_version_status"][0]["version"] == "1"


def test_model_metadata(rest_url):
    status, body = call(f"{rest_url}/v1/models/elmo/metadata")
    assert status == 200
    assert body["model_spec"] == {"name": "elmo", "signature_name": "", "version": "1"}
    signatures = body["metadata"]["signature_def"]["signature_def"]
    assert {"default", "serving_default", "tokens"} <= set(signatures)
    sentences = signatures["default"]["inputs"]["sentences"]
    assert sentences["dtype"] == "DT_STRING" and sentences["tensor_shape"]["dim"] == [{"size": "-1", "name": ""}]
    assert signatures["tokens"]["method_name"] == "tensorflow/serving/predict"


def test_predict_columnar_matches_keras(rest_url, model):
    status, body = call(f"{rest_url}/v1/models/elmo:predict", "POST", {"inputs": {"sentences": SENTENCES}})
    assert status == 200, body
    assert_parity(reference_sentences(model, SENTENCES), arrays(body["outputs"]))


def test_predict_bare_columnar_input_and_b64(rest_url, model):
    raw = b"bad \xff\xfe bytes"
    status, body = call(
        f"{rest_url}/v1/models/elmo/versions/1:predict",
        "POST",
        {"signature_name": "serving_default", "inputs": ["ok then", {"b64": base64.b64encode(raw).decode()}]},
    )
    assert status == 200, body
    assert_parity(reference_sentences(model, [b"ok then", raw]), arrays(body["outputs"]))


def test_predict_row_format_with_two_inputs(rest_url, model):
    instances = [
        {"tokens": ["The", "cat", ""], "sequence_len": 2},
        {"tokens": ["Dogs", "bark", "!"], "sequence_len": 3},
    ]
    status, body = call(
        f"{rest_url}/v1/models/elmo:predict", "POST", {"signature_name": "tokens", "instances": instances}
    )
    assert status == 200, body
    predictions = body["predictions"]
    assert len(predictions) == 2 and set(predictions[0]) == {
        "word_emb",
        "lstm_outputs1",
        "lstm_outputs2",
        "elmo",
        "default",
        "sequence_len",
        "mask",
    }
    expected = reference_tokens(model, [["The", "cat", ""], ["Dogs", "bark", "!"]])
    expected_first = reference_tokens(model, [["The", "cat"]])
    np.testing.assert_allclose(predictions[1]["elmo"], expected["elmo"][1], atol=1e-5)
    np.testing.assert_allclose(np.asarray(predictions[0]["elmo"])[:2], expected_first["elmo"][0], atol=1e-5)
    assert predictions[0]["mask"] == [True, True, False] and predictions[0]["sequence_len"] == 2


def test_predict_single_output_is_written_bare(rest_url, model):
    status, body = call(
        f"{rest_url}/v1/models/elmo:predict", "POST", {"instances": ["a b", "c"], "output_filter": ["default"]}
    )
    assert status == 200, body
    np.testing.assert_allclose(body["predictions"], reference_sentences(model, ["a b", "c"])["default"], atol=1e-5)


@pytest.mark.parametrize(
    "path, body, status, match",
    [
        ("/v1/models/nope:predict", {"instances": ["a"]}, 404, r"Servable not found for request: Latest\(nope\)"),
        ("/v1/models/elmo/versions/5:predict", {"instances": ["a"]}, 404, r"Specific\(elmo, 5\)"),
        ("/v1/models/elmo:predict", {"signature_name": "nope", "instances": ["a"]}, 404, 'signature key "nope"'),
        ("/v1/models/elmo:predict", {"instances": ["a"], "inputs": ["a"]}, 400, "only one of 'inputs' or 'instances'"),
        ("/v1/models/elmo:predict", {"signature_name": "default"}, 400, "Missing 'inputs' or 'instances' key"),
        ("/v1/models/elmo:predict", {"instances": []}, 400, "No values in 'instances' array"),
        (
            "/v1/models/elmo:predict",
            {"instances": [1, 2]},
            400,
            "JSON Value: 1 Type: Number is not of expected type: DT_STRING",
        ),
        ("/v1/models/elmo:predict", {"inputs": {"sentences": [["a"]]}}, 400, "expected rank 1"),
        (
            "/v1/models/elmo:predict",
            {"signature_name": "tokens", "inputs": {"tokens": [["a", "b"], ["c"]], "sequence_len": [2, 1]}},
            400,
            r"Encountered list at unexpected size: 1 at level: 1 expected size: 2 \(rows of 'tokens' must",
        ),
        (
            "/v1/models/elmo:predict",
            {"signature_name": "tokens", "inputs": {"tokens": [["a"]]}},
            400,
            "Missing named input: sequence_len",
        ),
        (
            "/v1/models/elmo:predict",
            {"signature_name": "tokens", "inputs": {"tokens": [["a"]], "sequence_len": [1.5]}},
            400,
            "is not of expected type: DT_INT32",
        ),
        (
            "/v1/models/elmo:predict",
            {"signature_name": "tokens", "inputs": {"tokens": [["a"]], "sequence_len": [4]}},
            400,
            r"sequence_len must be in \[0, 1\]",
        ),
        ("/v1/models/elmo:predict", {"inputs": {"sentences": [{"b64": "!!"}]}}, 400, "Unable to base64 decode"),
        ("/v1/models/elmo:predict", {"inputs": ["a"], "output_filter": ["nope"]}, 400, "output tensor alias not found"),
        ("/v1/models/elmo:predict", {"inputs": [" ".join(["w"] * 10000)]}, 429, "has 10000 tokens"),
        ("/v1/models/elmo:classify", {"examples": []}, 501, "classify is not implemented"),
        ("/v1/models/elmo/labels/stable:predict", {"instances": ["a"]}, 404, "version label"),
        ("/v1/nonsense", {}, 400, "Malformed request: POST /v1/nonsense"),
    ],
)
def test_predict_errors(rest_url, path, body, status, match):
    got, answer = call(rest_url + path, "POST", body)
    assert got == status, answer
    assert set(answer) == {"error"} and __import__("re").search(match, answer["error"]), answer


def test_bad_json_and_unknown_paths(rest_url):
    got, answer = call(f"{rest_url}/v1/models/elmo:predict", "POST", raw=b"{not json")
    assert got == 400 and answer["error"].startswith("JSON Parse error")
    got, answer = call(f"{rest_url}/v1/models/elmo:predict", "POST", raw=b"[1, 2]")
    assert got == 400 and "Is not object" in answer["error"]
    got, answer = call(f"{rest_url}/v1/models/nope")
    assert got == 404 and "Could not find any versions of model nope" in answer["error"]
    got, answer = call(f"{rest_url}/v1/models/elmo/versions/4")
    assert got == 404 and "Could not find version 4 of model elmo" in answer["error"]
    got, answer = call(f"{rest_url}/elsewhere")
    assert got == 404


def test_empty_batch_in_columnar_format(rest_url):
    got, body = call(f"{rest_url}/v1/models/elmo:predict", "POST", {"inputs": {"sentences": []}})
    assert got == 200, body
    assert body["outputs"]["default"] == [] and body["outputs"]["sequence_len"] == []


def test_metrics_endpoint(rest_url):
    call(f"{rest_url}/v1/models/elmo:predict", "POST", {"inputs": ["count me"]})
    got, text = call(f"{rest_url}/monitoring/prometheus/metrics")
    assert got == 200
    prefix = 'elmo_serving_requests_total{model="elmo",signature="serving_default"}'
    line = next(x for x in text.splitlines() if x.startswith(prefix))
    assert int(line.split()[-1]) >= 1
    assert 'elmo_serving_version{model="elmo"} 1' in text


def test_malformed_requests_are_400(strict):
    port = strict.rest_port
    cases = [
        b"",
        b"\xff\xfe{not utf-8",
        b'{"instances": ["a"]',
        b'{"instances": ["a"]} trailing',
        b'{"instances": [1' + b"0" * 5000 + b"]}",  # an integer too long to convert
        b'{"instances": ["\\ud800"]}',  # a lone surrogate
        b'{"signature_name": "tokens", "inputs": {"tokens": [[["a"]]], "sequence_len": [1]}}',
        b'{"signature_name": "tokens", "instances": [{"tokens": ["a"], "sequence_len": [[[1]]]}]}',
    ]
    for raw in cases:
        status, body = post(port, raw)
        assert status == 400, (raw[:60], body)
    status, body = get(port, "/v1/models/elmo/versions/" + "9" * 5000)
    assert status == 400 and "Failed to convert version" in body["error"], body
    assert_still_serving(port)
