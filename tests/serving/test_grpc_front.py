"""elmo_tf/serving/grpc_front.py over real gRPC on 127.0.0.1: malformed requests get TF Serving's statuses and never
take the server down, TensorProtos are checked before they are read, unknown models/versions/signatures are
NOT_FOUND, metadata and status requests, Classify is UNIMPLEMENTED, and a message above the max receive size is
refused by gRPC (the RSS growth of that case is printed and bounded).
"""

import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from serving_testlib import assert_parity, assert_serves, reference_sentences, report, rss_mib, start_server
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from elmo_tf.serving.client import ElmoClient
from elmo_tf.serving.status import ServingError

INVALID = grpc.StatusCode.INVALID_ARGUMENT
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.fixture
def stub(server):
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    yield prediction_service_pb2_grpc.PredictionServiceStub(channel)
    channel.close()


def predict(stub, inputs, signature="default", model="elmo"):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    for alias, proto in inputs.items():
        request.inputs[alias].CopyFrom(proto)
    return stub.Predict(request, timeout=30)


def rpc_error(call):
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


def strings(values, shape=None):
    return tf.make_tensor_proto(values, dtype=tf.string, shape=shape)


@pytest.mark.parametrize(
    "inputs, signature, match",
    [
        (
            lambda: {"sentences": tf.make_tensor_proto(np.zeros(2, np.float32))},
            "default",
            "input 'sentences' of signature 'default': expected dtype DT_STRING, got DT_FLOAT",
        ),
        (lambda: {"sentences": strings([["a", "b"]])}, "default", r"expected rank 1 \(shape \[-1\]\), got rank 2"),
        (lambda: {"sentences": strings("a")}, "default", "expected rank 1"),
        (lambda: {}, "default", "Missing but required: {sentences}"),
        (
            lambda: {"sentences": strings(["a"]), "extra": strings(["b"])},
            "default",
            "input tensor alias not found in signature: extra",
        ),
        (lambda: {"tokens": strings([["a", "b"]])}, "tokens", "Missing but required: {sequence_len}"),
        (
            lambda: {"tokens": strings([["a", "b"]]), "sequence_len": tf.make_tensor_proto(np.array([1], np.int64))},
            "tokens",
            "input 'sequence_len' of signature 'tokens': expected dtype DT_INT32, got DT_INT64",
        ),
        (
            lambda: {"tokens": strings([["a", "b"]]), "sequence_len": tf.make_tensor_proto(np.array([3], np.int32))},
            "tokens",
            r"sequence_len must be in \[0, 2\] \(the width of tokens, axis 1\), got 3 at row 0",
        ),
        (
            lambda: {"tokens": strings([["a", "b"]]), "sequence_len": tf.make_tensor_proto(np.array([-1], np.int32))},
            "tokens",
            "sequence_len must be in",
        ),
        (
            lambda: {"tokens": strings([["a", "b"]]), "sequence_len": tf.make_tensor_proto(np.array([1, 1], np.int32))},
            "tokens",
            "sequence_len must have one entry per row of tokens: got 2 lengths for 1 rows",
        ),
    ],
)
def test_malformed_inputs_are_invalid_argument(stub, inputs, signature, match):
    code, details = rpc_error(lambda: predict(stub, inputs(), signature))
    assert code == INVALID
    assert __import__("re").search(match, details), details


def test_request_without_deadline(stub, model):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "elmo"
    request.inputs["sentences"].CopyFrom(strings(["no deadline here"]))
    response = stub.Predict(request)  # TF Serving clients often set none
    assert response.model_spec.version.value == 1
    assert_parity(
        reference_sentences(model, ["no deadline here"]),
        {alias: tf.make_ndarray(proto) for alias, proto in response.outputs.items()},
    )


def test_malformed_tensor_proto(stub):
    proto = tf.make_tensor_proto(np.array([1, 2], np.int32))
    proto.tensor_content = proto.tensor_content[:5]  # 5 bytes for 2 int32
    code, details = rpc_error(lambda: predict(stub, {"tokens": strings([["a", "b"]]), "sequence_len": proto}, "tokens"))
    assert code == INVALID and "input 'sequence_len'" in details, details


def test_huge_declared_shape_is_refused_before_reading(stub):
    """A tiny proto can declare a huge shape (TensorFlow repeats the last value): refused from the shape alone."""
    proto = strings(["a"])
    proto.tensor_shape.dim[0].size = 10**9
    code, details = rpc_error(lambda: predict(stub, {"sentences": proto}))
    assert code == EXHAUSTED and "1000000000 rows" in details and "--max_request_sentences" in details


def test_unknown_signature_version_model_are_not_found(stub, server):
    for model, version, signature, match in [
        ("nope", None, "default", r"Latest\(nope\)"),
        ("elmo", 3, "default", r"Specific\(elmo, 3\)"),
        ("elmo", None, "nope", 'Serving signature key "nope" not found'),
    ]:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model
        request.model_spec.signature_name = signature
        if version is not None:
            request.model_spec.version.value = version
        request.inputs["sentences"].CopyFrom(strings(["a"]))
        code, details = rpc_error(lambda request=request: stub.Predict(request, timeout=30))
        assert code == grpc.StatusCode.NOT_FOUND and __import__("re").search(match, details), details


def test_metadata_and_status_requests(stub, server):
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = "elmo"
    code, details = rpc_error(lambda: stub.GetModelMetadata(request, timeout=30))
    assert code == INVALID and "at least one metadata_field" in details
    request.metadata_field.append("signature_def")
    response = stub.GetModelMetadata(request, timeout=30)
    assert response.model_spec.version.value == 1
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    response.metadata["signature_def"].Unpack(signature_map)
    assert signature_map.signature_def["tokens"].method_name == "tensorflow/serving/predict"
    from tensorflow_serving.apis import model_service_pb2_grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
        get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "elmo"}), timeout=30
    )
    channel.close()
    assert [(s.version, s.state) for s in status.model_version_status] == [
        (1, get_model_status_pb2.ModelVersionStatus.AVAILABLE)
    ]


def test_classify_is_unimplemented(stub):
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "elmo"
    code, _ = rpc_error(lambda: stub.Classify(request, timeout=30))
    assert code == grpc.StatusCode.UNIMPLEMENTED


def test_server_still_serves_after_bad_requests(client, model, stub):
    for _ in range(3):
        rpc_error(lambda: predict(stub, {"sentences": tf.make_tensor_proto(np.zeros(2, np.float32))}))
    assert_parity(reference_sentences(model, ["still alive"]), client.embed(["still alive"]))


def test_message_above_the_max_receive_size_is_refused(base_path, expected):
    """gRPC's max receive size is max_message_bytes (1 MiB here): 20 messages of 2 MiB are RESOURCE_EXHAUSTED
    before the server reads them."""
    server = start_server(base_path, rest_api_port=None, max_message_bytes=1 << 20)
    try:
        assert_serves(server, expected)
        before = rss_mib()
        start = time.monotonic()
        with ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo", timeout=10, max_retries=0) as c:
            for _ in range(20):
                with pytest.raises(ServingError) as info:
                    c.embed(["x" * (2 << 20)])
                assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "larger than max" in info.value.details, info.value.details
        refused = (time.monotonic() - start) / 20
        served = assert_serves(server, expected)
        after = rss_mib()
    finally:
        server.stop(grace=1.0)
    print(f"\n[max receive] {refused:.3f} s per refused message")
    report("max receive size", before, after, served)
    assert after - before < 100  # this process also holds the client's 2 MiB requests
