"""serving/server.py over real gRPC: malformed requests get TF Serving's statuses and never take the server down,
limits answer RESOURCE_EXHAUSTED, empty/odd inputs are served, 8 concurrent clients get correct answers."""

import threading

import grpc
import numpy as np
import pytest
import tensorflow as tf
from serving_testlib import assert_parity, reference_sentences, reference_tokens, start_server
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from serving.client import ElmoClient
from serving.status import ServingError

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


def test_empty_batch_and_empty_strings_are_served(client, model):
    out = client.embed([])
    assert out["elmo"].shape == (0, 0, 64) and out["default"].shape == (0, 64)
    out = client.embed(["", "   ", "\t"])
    assert_parity(reference_sentences(model, ["", "   ", "\t"]), out)
    assert not out["default"].any() and not out["sequence_len"].any()
    out = client.embed_tokens([])
    assert out["elmo"].shape[0] == 0


def test_invalid_utf8_is_served_byte_by_byte(client, model):
    sentences = [b"bad \xff\xfe bytes", b"\xc3", b"ok"]
    assert_parity(reference_sentences(model, sentences), client.embed(sentences))


def test_10000_token_sentence_is_resource_exhausted_by_default(client):
    with pytest.raises(ServingError, match="has 10000 tokens, above the server's limit of 1000") as info:
        client.embed([" ".join(["word"] * 10000)])
    assert info.value.code == EXHAUSTED
    with pytest.raises(ServingError, match="is 10000 tokens wide") as info:
        client.embed_tokens([["word"] * 10000])
    assert info.value.code == EXHAUSTED


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


def test_eight_concurrent_clients_all_correct(server, model):
    """8 threads, each with its own channel and inputs (both signatures), 6 requests each."""
    jobs = []
    for k in range(8):
        sentences = [" ".join(f"c{k}w{i}" for i in range(k + 1 + j)) for j in range(1 + k % 3)]
        jobs.append(
            (
                sentences,
                reference_sentences(model, sentences),
                [s.split() for s in sentences],
                reference_tokens(model, [s.split() for s in sentences]),
            )
        )
    failures, answers = [], []
    barrier = threading.Barrier(8)

    def worker(k):
        sentences, expected, tokens, expected_tokens = jobs[k]
        try:
            with ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo", timeout=60) as c:
                barrier.wait(timeout=30)
                for i in range(6):
                    if i % 2:
                        assert_parity(expected_tokens, c.embed_tokens(tokens))
                    else:
                        assert_parity(expected, c.embed(sentences))
                    answers.append(k)
        except Exception as e:  # collected: assertion errors in threads do not fail the test by themselves
            failures.append(f"client {k}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert not failures, failures
    assert len(answers) == 48


# ---------------------------------------------------------------------------------------------------- strict limits


@pytest.fixture(scope="module")
def strict_server(base_path):
    """Small limits, batching off: 4 sentences, 50 tokens, 128 KiB messages."""
    server = start_server(
        base_path,
        enable_batching=False,
        max_request_sentences=4,
        max_tokens_per_sentence=50,
        max_message_bytes=128 << 10,
    )
    yield server
    server.stop(grace=1.0)


@pytest.fixture
def strict_client(strict_server):
    with ElmoClient(f"127.0.0.1:{strict_server.grpc_port}", "elmo", timeout=60) as c:
        yield c


def test_limits_answer_resource_exhausted(strict_client):
    cases = [
        (lambda: strict_client.embed(["a"] * 5), r"5 rows \(sentences\), above the server's limit of 4"),
        (lambda: strict_client.embed([" ".join(["w"] * 51)]), "51 tokens, above the server's limit of 50"),
        (lambda: strict_client.embed_tokens([["w"] * 51]), "51 tokens wide"),
        (
            lambda: strict_client.embed([" ".join(["w"] * 50)] * 4),
            r"the response would be about 176\.2 KiB \(4 sentences x 50 tokens, outputs default,elmo,.*\), "
            r"above the server's limit of 128\.0 KiB \(--max_message_bytes\)",
        ),
        (lambda: strict_client.embed(["x" * (200 << 10)]), "larger than max"),
    ]  # gRPC's own limit
    for call, match in cases:
        with pytest.raises(ServingError, match=match) as info:
            call()
        assert info.value.code == EXHAUSTED


def test_output_filter_keeps_a_response_under_the_limit(strict_client, model):
    sentences = [" ".join(["w"] * 50)] * 4
    out = strict_client.embed(sentences, output_filter=["default"])
    assert_parity(reference_sentences(model, sentences), out, keys=["default"])


def test_unbatched_server_parity(strict_client, strict_server, model):
    assert_parity(reference_tokens(model, [["a", "b"], ["c"]]), strict_client.embed_tokens([["a", "b"], ["c"]]))
    assert strict_server.stats()["merged_requests"] == 0
