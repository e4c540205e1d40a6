"""elmo_tf/serving/grpc/grpc_front.py over real gRPC on 127.0.0.1: malformed requests get TF Serving's statuses and
never take the server down, TensorProtos are checked before they are read, unknown models and versions are NOT_FOUND;
signatures, model specs, Classify, Regress and MultiInference are answered with stock TF Serving's codes and texts
(each test cites the TF Serving source it follows); calls whose request never arrives hold no thread (grpc.aio);
metadata and status requests; a message above the max receive size is refused by gRPC (the RSS growth of that case
is printed and bounded).
"""

import threading
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
    inference_pb2,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from elmo_tf.serving.client import ElmoClient
from elmo_tf.serving.serving_error import ServingError

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
        (  # the same count, another name: tensorflow/cc/saved_model/util.cc, GetInputValues
            lambda: {"other": strings(["a"])},
            "default",
            r"Signature input alias: sentences\(feed name: \S+\) not found in request and no default value provided\. "
            r"Inputs expected to be in the request \{other\}, or default input alias set: $",
        ),
        (
            lambda: {"sentences": strings(["a"]), "extra": strings(["b"])},
            "default",
            # predict_util.cc VerifyRequestInputsSize
            r"input size does not match signature: 2!=1 len\(\{extra,sentences\}\) != len\(\{sentences\}\)\. "
            r"Sent extra: \{extra\}\. Missing but required: \{\}\.",
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


def _predict_request(model="elmo", version=None, signature="default", label=None):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    if version is not None:
        request.model_spec.version.value = version
    if label is not None:
        request.model_spec.version_label = label
    request.inputs["sentences"].CopyFrom(strings(["a"]))
    return request


@pytest.mark.parametrize(
    "spec, code, details",
    [
        # basic_manager.cc GetUntypedServableHandle: "Servable not found for request: " + ServableRequest::DebugString()
        (dict(model="nope"), grpc.StatusCode.NOT_FOUND, "Servable not found for request: Latest(nope)"),
        (dict(version=3), grpc.StatusCode.NOT_FOUND, "Servable not found for request: Specific(elmo, 3)"),
        # predict_util.cc RunPredict (was NOT_FOUND here before issue 27)
        (dict(signature="nope"), grpc.StatusCode.FAILED_PRECONDITION, 'Serving signature key "nope" not found.'),
        # server_core.cc ServableRequestFromModelSpec (was NOT_FOUND)
        (dict(model=""), INVALID, "ModelSpec has no name specified."),
        # server_core.cc ServableRequestFromModelSpec, GetModelVersionForLabel: no labels configured (was NOT_FOUND)
        (dict(label="nosuchlabel"), INVALID, "Unrecognized servable version label: nosuchlabel"),
        (dict(model="nope", label="x"), INVALID, "Unrecognized servable version label: x"),  # before the model
    ],
)
def test_model_spec_errors_as_stock(stub, spec, code, details):
    got_code, got_details = rpc_error(lambda: stub.Predict(_predict_request(**spec), timeout=30))
    assert (got_code, got_details) == (code, details)


def test_metadata_and_status_model_spec_as_stock(server, stub):
    """GetModelMetadata checks the spec as Predict does (get_model_metadata_impl.cc SavedModelGetSignatureDef,
    ServerCore); GetModelStatus looks at a version number only (get_model_status_impl.cc GetModelStatusWithModelSpec): a
    label gives every version, an empty name is NOT_FOUND."""
    from tensorflow_serving.apis import model_service_pb2_grpc

    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = ""
    assert rpc_error(lambda: stub.GetModelMetadata(request, timeout=30)) == (
        INVALID,
        "ModelSpec has no name specified.",
    )
    request.model_spec.name, request.model_spec.version_label = "elmo", "stable"
    assert rpc_error(lambda: stub.GetModelMetadata(request, timeout=30)) == (
        INVALID,
        "Unrecognized servable version label: stable",
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    try:
        status_stub = model_service_pb2_grpc.ModelServiceStub(channel)
        by_label = get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "elmo", "version_label": "stable"})
        status = status_stub.GetModelStatus(by_label, timeout=30)
        assert [s.version for s in status.model_version_status] == [1]
        empty = get_model_status_pb2.GetModelStatusRequest(model_spec={"name": ""})
        assert rpc_error(lambda: status_stub.GetModelStatus(empty, timeout=30)) == (
            grpc.StatusCode.NOT_FOUND,
            "Could not find any versions of model ",
        )
    finally:
        channel.close()


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


def _classify_request(signature="default", model="elmo", cls=classification_pb2.ClassificationRequest):
    request = cls()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    return request


def test_classify_regress_on_a_predict_only_model_as_stock(stub):
    """Classify and Regress find the servable, then refuse ELMo's signatures as stock does (was UNIMPLEMENTED here
    before issue 27): classifier.cc GetClassificationSignatureDef and PreProcessClassification
    (PreProcessClassification: one input, one or two outputs), regressor.cc GetRegressionSignatureDef and
    PreProcessRegression (one input, one output); an unknown model is NOT_FOUND first."""
    outputs = len(
        _signature_map(stub).signature_def["default"].outputs
    )  # word_emb, lstm_outputs*, elmo, default, sequence_len, mask
    cases = [
        (stub.Classify, _classify_request(), INVALID, f"Expected one or two output Tensors, found {outputs}"),
        (stub.Classify, _classify_request("tokens"), INVALID, "Expected one input Tensor."),
        (stub.Classify, _classify_request("nope"), INVALID, "No signature was found with the name: nope"),
        (
            stub.Classify,
            _classify_request(model="nope"),
            grpc.StatusCode.NOT_FOUND,
            "Servable not found for request: Latest(nope)",
        ),
        (stub.Classify, _classify_request(model=""), INVALID, "ModelSpec has no name specified."),
        (stub.Classify, classification_pb2.ClassificationRequest(), INVALID, "Missing ModelSpec"),
        (stub.Regress, _classify_request(cls=regression_pb2.RegressionRequest), INVALID, "Expected one output Tensor."),
        (
            stub.Regress,
            _classify_request("tokens", cls=regression_pb2.RegressionRequest),
            INVALID,
            "Expected one input Tensor.",
        ),
    ]
    for method, request, code, details in cases:
        assert rpc_error(lambda method=method, request=request: method(request, timeout=30)) == (code, details)


def _signature_map(stub):
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "elmo"
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    stub.GetModelMetadata(request, timeout=30).metadata["signature_def"].Unpack(signature_map)
    return signature_map


def test_multi_inference_as_stock(stub):
    """MultiInference: the first task names the servable (multi_inference_helper.cc GetModelSpecFromRequest; none: an
    empty name, server_core.cc ServableRequestFromModelSpec), then multi_inference.cc
    TensorFlowMultiInferenceRunner::Infer checks each task in turn (the first of ELMo's fails before the next is looked
    at)."""

    def request(*tasks):
        multi = inference_pb2.MultiInferenceRequest()
        for name, signature, method in tasks:
            task = multi.tasks.add(method_name=method)
            task.model_spec.name, task.model_spec.signature_name = name, signature
        return multi

    classify, regress = "tensorflow/serving/classify", "tensorflow/serving/regress"
    cases = [
        (request(), INVALID, "ModelSpec has no name specified."),
        (
            request(("nope", "default", classify)),
            grpc.StatusCode.NOT_FOUND,
            "Servable not found for request: Latest(nope)",
        ),
        (
            request(("elmo", "default", classify), ("elmo", "default", regress)),
            INVALID,
            "Expected one or two output Tensors, found "
            + str(len(_signature_map(stub).signature_def["default"].outputs)),
        ),
        (request(("elmo", "tokens", regress), ("elmo", "tokens", classify)), INVALID, "Expected one input Tensor."),
        (request(("elmo", "nope", regress)), INVALID, "Requested signature not found in model graph: nope"),
        (
            request(("elmo", "default", "tensorflow/serving/predict")),
            grpc.StatusCode.UNIMPLEMENTED,
            "Unsupported signature method_name: tensorflow/serving/predict",
        ),
    ]
    for multi, code, details in cases:
        assert rpc_error(lambda multi=multi: stub.MultiInference(multi, timeout=30)) == (code, details)


def test_calls_whose_request_never_arrives_hold_no_thread(server, model):
    """Issue 27, second hostile review: 64 Predict calls on one channel whose request never arrives (stream_unary
    calls whose request iterator yields nothing) parked the sync server's handler threads, and a valid Predict and a
    GetModelStatus then missed a 5 s deadline. On the asyncio server (grpc.aio) such a call is a coroutine waiting
    for its message: both answer within 5 s on the same channel, and the hostile calls end when their client
    cancels them."""
    from tensorflow_serving.apis import model_service_pb2_grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    release = threading.Event()

    def nothing():
        release.wait(120)
        return
        yield  # a generator that yields nothing

    hostile = channel.stream_unary(
        "/tensorflow.serving.PredictionService/Predict",
        request_serializer=predict_pb2.PredictRequest.SerializeToString,
        response_deserializer=predict_pb2.PredictResponse.FromString,
    )
    calls = [hostile.future(nothing(), timeout=120) for _ in range(64)]
    try:
        time.sleep(1.0)  # the calls are open on the server
        assert not any(call.done() for call in calls)
        start = time.monotonic()
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(_predict_request(), timeout=5)
        status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
            get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "elmo"}), timeout=5
        )
        elapsed = time.monotonic() - start
        assert_parity(reference_sentences(model, ["a"]), {a: tf.make_ndarray(p) for a, p in response.outputs.items()})
        assert status.model_version_status[0].state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
        print(f"\n[hostile streams] valid Predict + GetModelStatus answered in {elapsed:.2f} s beside 64 open calls")
        assert not any(call.done() for call in calls)  # still open: they held nothing the valid calls needed
    finally:
        for call in calls:
            call.cancel()
        release.set()
        channel.close()
    assert all(call.cancelled() or call.done() for call in calls)


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


def _never_sending_calls(channel, count, release):
    def nothing():
        release.wait(120)
        return
        yield  # a generator that yields nothing

    hostile = channel.stream_unary(
        "/tensorflow.serving.PredictionService/Predict",
        request_serializer=predict_pb2.PredictRequest.SerializeToString,
        response_deserializer=predict_pb2.PredictResponse.FromString,
    )
    return [hostile.future(nothing(), timeout=120) for _ in range(count)]


def _codes(calls):
    codes = []
    for call in calls:
        with pytest.raises(grpc.RpcError) as info:
            call.result(timeout=10)
        codes.append(info.value.code())
    return codes


def test_calls_whose_request_never_arrives_cannot_fill_the_call_cap(base_path, model):
    """Hostile review (s12): grpc.aio's `maximum_concurrent_rpcs` counts a call from its headers, before its request
    message; `4 x grpc_max_threads` calls whose request never arrives held every place, and a valid Predict was then
    refused (RESOURCE_EXHAUSTED "Concurrent RPC limit exceeded!") for as long as the client held them. Waiting calls
    now have places of their own, and each ends (DEADLINE_EXCEEDED) `grpc_request_receive_timeout_s` after it
    started."""
    server = start_server(base_path, grpc_max_threads=2, grpc_request_receive_timeout_s=1.0)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    release = threading.Event()
    calls = _never_sending_calls(channel, 4 * 2 + 4, release)
    try:
        time.sleep(0.5)
        start = time.monotonic()
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(_predict_request(), timeout=5)
        elapsed = time.monotonic() - start
        assert_parity(reference_sentences(model, ["a"]), {a: tf.make_ndarray(p) for a, p in response.outputs.items()})
        print(f"\n[never-sending calls past 4 x grpc_max_threads] valid Predict answered in {elapsed:.2f} s")
        assert _codes(calls) == [grpc.StatusCode.DEADLINE_EXCEEDED] * len(calls)
    finally:
        for call in calls:
            call.cancel()
        release.set()
        channel.close()
        server.stop(grace=1.0)


def test_waiting_calls_are_capped(base_path, monkeypatch):
    """The waiting places are bounded too: past `MAX_WAITING_CALLS` the call that has waited longest gives its place
    up (RESOURCE_EXHAUSTED; issue 49: before, the newcomer was refused)."""
    from elmo_tf.serving.grpc import call_places, grpc_front

    monkeypatch.setattr(grpc_front, "MAX_WAITING_CALLS", 3)
    for shares in (call_places.CONNECTION_SHARE, call_places.ADDRESS_SHARE):  # the whole cap, alone (shares below)
        monkeypatch.setitem(shares, "waiting", 1.0)
    server = start_server(base_path, grpc_request_receive_timeout_s=2.0)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    release = threading.Event()
    calls = _never_sending_calls(channel, 5, release)
    try:
        assert sorted(_codes(calls), key=str) == sorted(
            [grpc.StatusCode.DEADLINE_EXCEEDED] * 3 + [EXHAUSTED] * 2, key=str
        )
    finally:
        release.set()
        channel.close()
        server.stop(grace=1.0)


def test_one_connection_and_one_address_hold_a_share_of_the_waiting_places(base_path, model, monkeypatch, tmp_path):
    """Issue 38: 1,045 calls that never sent their request, from 11 connections of one address, held all 1,024 waiting
    places, and every other client was refused. Now one connection holds at most a quarter of them and one address
    (all its connections) at most half, each call evicted past a share naming it; a client from another address (here
    the UNIX socket) still gets a place, and its valid Predict is answered."""
    from elmo_tf.serving.grpc import grpc_front

    monkeypatch.setattr(grpc_front, "MAX_WAITING_CALLS", 8)  # shares: 2 per connection, 4 per address
    socket_path = tmp_path / "grpc.sock"
    server = start_server(base_path, grpc_request_receive_timeout_s=3.0, grpc_socket_path=str(socket_path))
    release = threading.Event()
    own = [("grpc.use_local_subchannel_pool", 1)]  # else channels to one target share one connection
    channels = [grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}", options=own) for _ in range(3)]
    local = grpc.insecure_channel(f"unix:{socket_path}")
    try:
        first = _never_sending_calls(channels[0], 3, release)
        time.sleep(0.5)
        second = _never_sending_calls(channels[1], 2, release)
        time.sleep(0.5)
        third = _never_sending_calls(channels[2], 1, release)  # the address holds its 4 places already
        time.sleep(0.5)
        response = prediction_service_pb2_grpc.PredictionServiceStub(local).Predict(_predict_request(), timeout=5)
        assert_parity(reference_sentences(model, ["a"]), {a: tf.make_ndarray(p) for a, p in response.outputs.items()})
        details = {}
        for call in first + second + third:
            with pytest.raises(grpc.RpcError) as info:
                call.result(timeout=10)
            details.setdefault(info.value.code(), []).append(info.value.details())
        assert len(details[grpc.StatusCode.DEADLINE_EXCEEDED]) == 4, details
        refused = sorted(details[EXHAUSTED])
        assert len(refused) == 2, details
        assert any("from this connection (2, 25% of the server's 8)" in d for d in refused), refused
        assert any("from this address (4, 50% of the server's 8)" in d for d in refused), refused
    finally:
        release.set()
        for channel in [*channels, local]:
            channel.close()
        server.stop(grace=1.0)


def test_call_places_count_each_connection_and_address(monkeypatch):
    """The bookkeeping behind the shares of the working places: a connection at half the places is refused, another
    connection of the same address until three quarters, another address up to the whole; leaving frees them."""
    from elmo_tf.serving.grpc.call_places import CallPlaces, peer_address

    assert peer_address("ipv4:127.0.0.1:5000") == "ipv4:127.0.0.1" and peer_address("ipv6:[::1]:80") == "ipv6:[::1]"
    assert peer_address("unix:/tmp/s") == "unix:/tmp/s"
    places = CallPlaces(max_waiting=4, max_working=8, timeout=1.0)
    a1, a2, b = "ipv4:10.0.0.1:1", "ipv4:10.0.0.1:2", "ipv4:10.0.0.2:1"
    for _ in range(4):
        assert places.refusal(a1) is None
        places.take(a1)
    assert "from this connection (4, 50% of the server's 8)" in places.refusal(a1)
    for _ in range(2):
        places.take(a2)
    assert "from this address (6, 75% of the server's 8)" in places.refusal(a2)
    places.take(b)
    places.take(b)
    assert places.refusal(b) == "Concurrent RPC limit exceeded!"
    for peer in (a1, a2, b):
        places.release(peer)
    assert places.working == 5 and places.refusal(a2) is None


class _FakeWaiting:
    """A `call_places.Waiting` without a call: `done` when its message is in hand, `reason` once evicted."""

    def __init__(self, name, peer, done=False):
        self.name, self.peer, self.done, self.reason = name, peer, done, None

    def done_waiting(self):
        return self.done

    def evict(self, reason):
        assert self.reason is None, f"{self.name} evicted twice"
        self.reason = reason


def test_waiting_places_evict_the_longest_waiting_of_the_overfilled_group():
    """Issue 49, the policy of `CallPlaces.wait` (8 places: 2 per connection, 4 per address): a newcomer always gets a
    place; past its connection's share the oldest call of that connection gives its place up, past its address's share
    the oldest of that address (any of its connections), past the total the oldest of the address holding the most;
    a call whose message is in hand leaves without being evicted; the count never exceeds the bound."""
    from elmo_tf.serving.grpc.call_places import CallPlaces

    places = CallPlaces(max_waiting=8, max_working=8, timeout=1.0)
    calls = {}

    def wait(name, peer, done=False):
        calls[name] = _FakeWaiting(name, peer, done)
        places.wait(calls[name])
        assert places.waiting <= 8
        return calls[name]

    def evicted():
        return sorted(name for name, call in calls.items() if call.reason is not None)

    a1, a2, a3, b1, b2, c1 = (
        "ipv4:10.0.0.1:1",
        "ipv4:10.0.0.1:2",
        "ipv4:10.0.0.1:3",
        "ipv4:10.0.0.2:1",
        "ipv4:10.0.0.2:2",
        "unix:",
    )
    wait("a1-0", a1), wait("a1-1", a1)
    wait("a1-2", a1)  # the connection's share is 2: its oldest gives its place up
    assert evicted() == ["a1-0"] and "from this connection (2, 25% of the server's 8)" in calls["a1-0"].reason
    assert "had waited longest" in calls["a1-0"].reason and "gave its place to a newer call" in calls["a1-0"].reason
    wait("a2-0", a2), wait("a2-1", a2)
    wait("a3-0", a3)  # the address's share is 4: its oldest (on another connection) gives its place up
    assert evicted() == ["a1-0", "a1-1"] and "from this address (4, 50% of the server's 8)" in calls["a1-1"].reason
    wait("b1-0", b1), wait("b1-1", b1), wait("c1-0", c1)
    assert places.waiting == 7 and evicted() == ["a1-0", "a1-1"]
    wait("b2-0", b2)  # 8 of 8
    wait("c1-1", c1)  # past the total: the oldest of the address holding the most (10.0.0.1: 4)
    assert evicted() == ["a1-0", "a1-1", "a1-2"] and "places for calls waiting" in calls["a1-2"].reason
    calls["a2-0"].done = True  # its message is in hand (the handler has not run yet): it leaves, not evicted
    wait("a3-1", a3)
    assert evicted() == ["a1-0", "a1-1", "a1-2"] and places.waiting == 8
    wait("b2-1", b2)  # past the total: 10.0.0.2 now holds the most (4) and gives up its oldest
    assert evicted() == ["a1-0", "a1-1", "a1-2", "b1-0"]
    for call in calls.values():
        places.leave(call)
        places.leave(call)  # twice: nothing more
    assert places.waiting == 0 and places.most_waiting == 8
    assert places._waiting == {"connection": {}, "address": {}} and places._sizes == {}


def test_cancelled_calls_keep_their_place_until_their_work_has_ended(base_path, monkeypatch):
    """Hostile review (s12): a call's place among the `4 x grpc_max_threads` was freed when its client cancelled,
    while its work (holding the decoded request) still ran or waited in the thread pool's queue: a client sending
    Predict and cancelling it at once, again and again, grew that queue without bound behind a busy model. A place is
    now freed when the call's work has ended (or was taken off the queue before it started)."""
    from elmo_tf.serving import servable as servable_module

    release = threading.Event()
    run = servable_module.SignatureRunner.run

    def slow(self, inputs):
        release.wait(60)
        return run(self, inputs)

    server = start_server(base_path, grpc_max_threads=1, enable_batching=False)
    monkeypatch.setattr(servable_module.SignatureRunner, "run", slow)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    pool = server._grpc._pool
    try:
        queued = 0
        for _ in range(5):  # rounds of 8 calls, cancelled once the server has them
            calls = [stub.Predict.future(_predict_request(), timeout=60) for _ in range(8)]
            time.sleep(0.5)
            for call in calls:
                call.cancel()
            time.sleep(0.3)
            queued = max(queued, pool._work_queue.qsize())
        print(f"\n[cancel storm] at most {queued} calls' work queued behind a busy model (4 places)")
        assert queued <= 4
    finally:
        release.set()
        channel.close()
        server.stop(grace=1.0)


def test_connections_that_send_nothing_are_closed(base_path, monkeypatch):
    """Hostile review (s12): a TCP connection to the gRPC port that never sent HTTP/2's preface stayed open for gRPC's
    default handshake timeout (120 s), and an HTTP/2 connection without calls stayed open for good: idle connections
    without bound, each holding a descriptor of the process that serves both fronts and loads the versions. The
    handshake must complete within `grpc_request_receive_timeout_s`, and a connection without calls is closed after
    `MAX_CONNECTION_IDLE_S` (a client's channel reconnects on its next call)."""
    import socket

    from elmo_tf.serving.grpc import grpc_front

    monkeypatch.setattr(grpc_front, "MAX_CONNECTION_IDLE_S", 1.0)
    server = start_server(base_path, grpc_request_receive_timeout_s=1.0)
    silent = socket.create_connection(("127.0.0.1", server.grpc_port))
    idle = socket.create_connection(("127.0.0.1", server.grpc_port))
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    try:
        idle.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # preface, SETTINGS
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        stub.Predict(_predict_request(), timeout=30)
        for sock in (silent, idle):
            sock.settimeout(10)
            start = time.monotonic()
            while sock.recv(65536):  # the server's frames (SETTINGS, GOAWAY), then the close
                assert time.monotonic() - start < 10
        stub.Predict(_predict_request(), timeout=30)  # the channel, closed when idle, reconnects
    finally:
        silent.close()
        idle.close()
        channel.close()
        server.stop(grace=1.0)


def _honest_calls(channel, model):
    """A complete Predict and GetModelStatus on `channel`, each within 5 s; their time in seconds."""
    from tensorflow_serving.apis import model_service_pb2_grpc

    start = time.monotonic()
    response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(_predict_request(), timeout=5)
    status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
        get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "elmo"}), timeout=5
    )
    elapsed = time.monotonic() - start
    assert_parity(reference_sentences(model, ["a"]), {a: tf.make_ndarray(p) for a, p in response.outputs.items()})
    assert status.model_version_status[0].state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
    return elapsed


def test_a_call_whose_request_arrived_is_never_refused_for_calls_still_waiting(base_path, model, monkeypatch, tmp_path):
    """Issue 49: 1,045 calls that never sent their request, from 11 connections of one address, held that address's
    share of the waiting places, and a complete Predict or GetModelStatus from the same address (clients behind one
    proxy or NAT) was then refused at once (RESOURCE_EXHAUSTED "too many calls waiting for their request"). Stock
    dispatches a unary call once its message has arrived, so calls that never send never refuse one that did. Now a
    newcomer is never refused a waiting place: past a share (or the total) the call of that group that has waited
    longest gives its place up (RESOURCE_EXHAUSTED naming the share). Here 2 x 20 such calls from 4 connections of
    127.0.0.1 and 2 x 6 from the UNIX socket (another address) are past the connection's share (2), the address's (4)
    and the total (8); complete calls on an attacker's connection and on a new one of its address are answered within
    5 s each time, and the server never holds more than 8 waiting calls."""
    from elmo_tf.serving.grpc import grpc_front

    monkeypatch.setattr(grpc_front, "MAX_WAITING_CALLS", 8)  # shares: 2 per connection, 4 per address
    socket_path = tmp_path / "grpc.sock"
    server = start_server(base_path, grpc_request_receive_timeout_s=6.0, grpc_socket_path=str(socket_path))
    release = threading.Event()
    own = [("grpc.use_local_subchannel_pool", 1)]  # else channels to one target share one connection
    attackers = [grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}", options=own) for _ in range(4)]
    local = grpc.insecure_channel(f"unix:{socket_path}")
    fresh = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}", options=own)
    attack, times = [], []
    try:
        for _ in range(2):  # the attacker opens its calls again once the first have been answered
            for channel in attackers:
                attack += _never_sending_calls(channel, 5, release)
            attack += _never_sending_calls(local, 6, release)
            time.sleep(0.5)  # the calls are open on the server
            times += [_honest_calls(attackers[0], model), _honest_calls(fresh, model)]
        print(f"\n[never-sending calls from the same address] complete calls answered in {max(times):.2f} s at most")
        places = server._grpc._places
        assert places.waiting <= 8 and places.most_waiting <= 8, (places.waiting, places.most_waiting)
        details = {}
        for call in attack:
            with pytest.raises(grpc.RpcError) as info:
                call.result(timeout=15)
            details.setdefault(info.value.code(), []).append(info.value.details())
        assert set(details) <= {EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED}, details
        assert len(details.get(grpc.StatusCode.DEADLINE_EXCEEDED, [])) <= 8, details  # those still waiting at the end
        evicted = details[EXHAUSTED]
        assert len(evicted) >= len(attack) - 8, details
        assert all("had waited longest" in d and "gave its place to a newer call" in d for d in evicted), evicted
        assert any("from this address (4, 50% of the server's 8)" in d for d in evicted), evicted
    finally:
        release.set()
        for channel in [*attackers, local, fresh]:
            channel.close()
        server.stop(grace=1.0)
