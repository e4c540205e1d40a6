"""elmo_tf/serving/rest/rest_api.py over real HTTP on 127.0.0.1: TF Serving's /v1/models endpoints, row ("instances")
and columnar ("inputs") predict formats with parity, b64 strings, versions, metrics, and errors as {"error": ...} with
TF Serving's HTTP codes and texts, malformed requests included; paths, version numbers and labels read as stock reads
them (each expectation cites the TF Serving source it follows)."""

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


# Each expectation is stock TF Serving's answer: the file and line of its source are given beside it.
FAILED_ELEMENT = "Failed to process element: {} of 'instances' list. Error: INVALID_ARGUMENT: "


@pytest.mark.parametrize(
    "path, body, status, match",
    [
        # basic_manager.cc GetUntypedServableHandle
        ("/v1/models/nope:predict", {"instances": ["a"]}, 404, r"^Servable not found for request: Latest\(nope\)$"),
        ("/v1/models/elmo/versions/5:predict", {"instances": ["a"]}, 404, r"Specific\(elmo, 5\)"),
        # http_rest_api_handler.cc GetInfoMap (was 404 before issue 27)
        (
            "/v1/models/elmo:predict",
            {"signature_name": "nope", "instances": ["a"]},
            400,
            '^Serving signature name: "nope" not found in signature def$',
        ),
        # json_tensor.cc FillPredictRequestFromJson
        ("/v1/models/elmo:predict", {"instances": ["a"], "inputs": ["a"]}, 400, "only one of 'inputs' or 'instances'"),
        ("/v1/models/elmo:predict", {"signature_name": "default"}, 400, "^Missing 'inputs' or 'instances' key$"),
        ("/v1/models/elmo:predict", {"instances": []}, 400, "No values in 'instances' array"),
        # json_tensor.cc TypeError (DataTypeString's lowercase name), FillTensorMapFromInstancesList (each row alone)
        (
            "/v1/models/elmo:predict",
            {"instances": [1, 2]},
            400,
            "^" + FAILED_ELEMENT.format(0) + "JSON Value: 1 Type: Number is not of expected type: string$",
        ),
        ("/v1/models/elmo:predict", {"inputs": {"sentences": [["a"]]}}, 400, "expected rank 1"),
        # json_tensor.cc FillTensorProto
        (
            "/v1/models/elmo:predict",
            {"signature_name": "tokens", "inputs": {"tokens": [["a", "b"], ["c"]], "sequence_len": [2, 1]}},
            400,
            "^Encountered list at unexpected size: 1 at level: 1 expected size: 2$",
        ),
        # json_tensor.cc FillTensorMapFromInstancesList, AddInstanceItem: ragged rows, each parsed alone
        (
            "/v1/models/elmo:predict",
            {
                "signature_name": "tokens",
                "instances": [{"tokens": ["a", "b", "c"], "sequence_len": 3}, {"tokens": ["a"], "sequence_len": 1}],
            },
            400,
            r"^Failed to process element: 1 key: tokens of 'instances' list\. Error: INVALID_ARGUMENT: "
            r"Expecting tensor size: 3 but got: 1$",
        ),
        # json_tensor.cc FillTensorMapFromInputsMap
        (
            "/v1/models/elmo:predict",
            {"signature_name": "tokens", "inputs": {"tokens": [["a"]]}},
            400,
            "^Missing named input: sequence_len in 'inputs' object.$",
        ),
        (
            "/v1/models/elmo:predict",
            {"signature_name": "tokens", "inputs": {"tokens": [["a"]], "sequence_len": [1.5]}},
            400,
            "^JSON Value: 1.5 Type: Number is not of expected type: int32$",
        ),
        (
            "/v1/models/elmo:predict",
            {"signature_name": "tokens", "inputs": {"tokens": [["a"]], "sequence_len": [4]}},
            400,
            r"sequence_len must be in \[0, 1\]",
        ),
        ("/v1/models/elmo:predict", {"inputs": {"sentences": [{"b64": "!!"}]}}, 400, "^Unable to base64 decode$"),
        ("/v1/models/elmo:predict", {"inputs": ["a"], "output_filter": ["nope"]}, 400, "output tensor alias not found"),
        ("/v1/models/elmo:predict", {"inputs": [" ".join(["w"] * 10000)]}, 429, "has 10000 tokens"),
        # classifier.cc PreProcessClassification, regressor.cc PreProcessRegression: the servable is found, its
        # signature refused (was 501); json_tensor.cc FillClassifyRegressRequestFromJson: the body is read first
        ("/v1/models/elmo:classify", {"examples": []}, 400, "'examples' value is an empty array"),
        ("/v1/models/elmo:classify", {"examples": [{"x": 1}]}, 400, "^Expected one or two output Tensors, found"),
        ("/v1/models/elmo:regress", {"examples": [{"x": 1}]}, 400, r"^Expected one output Tensor\.$"),
        (
            "/v1/models/elmo:classify",
            {"signature_name": "tokens", "examples": [{"x": 1.5}]},
            400,
            r"^Expected one input Tensor\.$",
        ),
        ("/v1/models/nope:regress", {"examples": [{"x": 1}]}, 404, r"Latest\(nope\)"),
        # server_core.cc ServableRequestFromModelSpec, GetModelVersionForLabel (was 404)
        (
            "/v1/models/elmo/labels/stable:predict",
            {"instances": ["a"]},
            400,
            "^Unrecognized servable version label: stable$",
        ),
        # http_rest_api_handler.cc ProcessRequest, http_rest_api_util.cc kPathRegex: RE2's \d is ASCII only
        ("/v1/nonsense", {}, 400, "^Malformed request: POST /v1/nonsense$"),
        (
            "/v1/models/elmo/versions/%D9%A2:predict",
            {"instances": ["a"]},
            400,
            "^Malformed request: POST /v1/models/elmo/versions/%D9%A2:predict$",
        ),
        ("/v1/models/elmo/versions/-1:predict", {"instances": ["a"]}, 400, "^Malformed request"),
    ],
)
def test_predict_errors(rest_url, path, body, status, match):
    got, answer = call(rest_url + path, "POST", body)
    assert got == status, answer
    assert set(answer) == {"error"} and __import__("re").search(match, answer["error"]), answer


def test_paths_are_read_as_stock_reads_them(rest_url, server, model):
    """http_rest_api_util.cc: a version is ASCII digits read by absl::SimpleAtoi (leading zeros allowed,
    ParseModelInfo); the model name is percent-decoded (DecodeArg, in ParseModelInfo); the path is matched with its
    query (evhttp_request.cc ParsedEvRequest::decode: uri_path() is path and query), so a query makes it malformed."""
    expected = reference_sentences(model, ["a"])["default"]
    for path in ("/v1/models/elmo/versions/0001:predict", "/v1/models/%65lmo:predict", "/V1/MODELS/elmo:PREDICT"):
        got, body = call(rest_url + path, "POST", {"instances": ["a"]})
        assert got == 200, (path, body)
        np.testing.assert_allclose(body["predictions"][0]["default"], expected[0], atol=1e-5)
    got, body = post(server.rest_port, {"instances": ["a"]}, path="/v1/models/elmo:predict?x=1")
    assert got == 400 and body["error"] == "Malformed request: POST /v1/models/elmo:predict?x=1", body


def test_version_labels_as_stock(rest_url):
    """GetModelStatus looks at a version number only (get_model_status_impl.cc GetModelStatusWithModelSpec): by label it
    is every version, 200 (was 404); metadata resolves the label (server_core.cc GetModelVersionForLabel): 400."""
    got, body = call(f"{rest_url}/v1/models/elmo/labels/stable")
    assert got == 200 and [s["version"] for s in body["model_version_status"]] == ["1"], body
    got, body = call(f"{rest_url}/v1/models/elmo/labels/stable/metadata")
    assert got == 400 and body["error"] == "Unrecognized servable version label: stable", body


def test_bad_json_and_unknown_paths(rest_url):
    # json_tensor.cc ParseJson, http_rest_api_handler_test.cc PredictRequestErrors
    got, answer = call(f"{rest_url}/v1/models/elmo:predict", "POST", raw=b"")
    assert got == 400 and answer["error"] == "JSON Parse error: The document is empty", answer
    got, answer = call(f"{rest_url}/v1/models/elmo:predict", "POST", raw=b"instances = [1, 2]")
    assert got == 400 and answer["error"].startswith("JSON Parse error: Invalid value."), answer
    got, answer = call(f"{rest_url}/v1/models/elmo:predict", "POST", raw=b"{not json")
    assert got == 400 and answer["error"].startswith("JSON Parse error")
    got, answer = call(f"{rest_url}/v1/models/elmo:predict", "POST", raw=b"[1, 2]")
    assert got == 400 and answer["error"] == "JSON Value: [1, 2] Is not object", answer
    # json_tensor.cc FillSignature, http_rest_api_handler_test.cc PredictRequestErrors
    got, answer = call(f"{rest_url}/v1/models/elmo:predict", "POST", raw=b'{"signature_name": 100}')
    assert got == 400 and answer["error"].endswith("'signature_name' key must be a string value."), answer
    got, answer = call(f"{rest_url}/v1/models/nope")
    assert got == 404 and "Could not find any versions of model nope" in answer["error"]
    got, answer = call(f"{rest_url}/v1/models/elmo/versions/4")
    assert got == 404 and "Could not find version 4 of model elmo" in answer["error"]
    got, answer = call(f"{rest_url}/elsewhere")
    assert got == 404


def test_trailing_bytes_after_the_document_are_ignored(rest_url):
    """rapidjson's kParseStopWhenDoneFlag (json_tensor.cc ParseJson): stock serves a body with bytes after its JSON
    document (was a 400 here before issue 27)."""
    got, answer = call(f"{rest_url}/v1/models/elmo:predict", "POST", raw=b'{"instances": ["a"]} trailing')
    assert got == 200 and len(answer["predictions"]) == 1, answer


def test_columnar_inputs_the_signature_lacks_are_ignored(rest_url):
    """FillTensorMapFromInputsMap (json_tensor.cc) reads the signature's inputs and ignores other keys."""
    got, answer = call(f"{rest_url}/v1/models/elmo:predict", "POST", {"inputs": {"sentences": ["a"], "extra": [1]}})
    assert got == 200 and len(answer["outputs"]["default"]) == 1, answer


def test_empty_batch_in_columnar_format(rest_url):
    got, body = call(f"{rest_url}/v1/models/elmo:predict", "POST", {"inputs": {"sentences": []}})
    assert got == 200, body
    assert body["outputs"]["default"] == [] and body["outputs"]["sequence_len"] == []


def test_no_metrics_endpoint_unless_monitoring_enables_it(rest_url):
    """Stock serves Prometheus metrics only when --monitoring_config_file enables them (tests/serving/test_metrics.py
    has the enabled server); otherwise the path is like any other outside /v1/: 404."""
    got, body = call(f"{rest_url}/monitoring/prometheus/metrics")
    assert got == 404 and "Not found" in body["error"], body


def test_malformed_requests_are_400(strict):
    port = strict.rest_port
    cases = [
        b"",
        b"\xff\xfe{not utf-8",
        b'{"instances": ["a"]',
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


def test_cors_preflight_as_stock(rest_url):
    """An OPTIONS request is a CORS preflight: 200 with an http(s) Origin, else FAILED_PRECONDITION (400)
    `Origin header is missing in CORS preflight` (http_server.cc RestApiRequestDispatcher::ProcessRequest; was
    "Malformed request" here)."""
    got, body = call(f"{rest_url}/v1/models/elmo:predict", "OPTIONS", headers={"Origin": "https://example.com"})
    assert got == 200, body
    got, body = call(f"{rest_url}/v1/models/elmo:predict", "OPTIONS")
    assert got == 400 and body == {"error": "Origin header is missing in CORS preflight"}, body
