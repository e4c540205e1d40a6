"""elmo_tf/serving/grpc/grpc_parse.py and its use by the gRPC front (127.0.0.1): request messages are parsed off the
event loop, a message with more protobuf entries than any request within the budget needs is refused before it is parsed
(naming the limit), and while a hostile client sends one, another client's GetModelStatus is answered at once (issue
38: 1.44 s instead of 8 ms). Every method still answers normal requests, small (parsed on the loop) and large (parsed
on the pool); declared shapes are refused before a tensor is built, for the internal `packed` signature too.
"""

import threading
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from serving_testlib import assert_parity, reference_sentences
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from elmo_tf.serving.grpc import grpc_front, grpc_parse
from elmo_tf.serving.limits.budget import Limits
from elmo_tf.serving.serving_error import ServingError

EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
PREDICT = "/tensorflow.serving.PredictionService/Predict"
STALL_BOUND_S = 0.3  # another client's GetModelStatus while the hostile message is handled (1.4 s before issue 38)


def varint(value):
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field(number, payload):
    """A length-delimited field of the wire format."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def hostile_predict(entries, form="strings"):
    """A PredictRequest of `entries` entries of 2 bytes each, built as bytes (never as a message, so this process
    spends nothing on it): "strings", for `default`, its `sentences` TensorProto declaring [1] and holding `entries`
    empty strings (the issue's form); "map entries", `entries` empty entries of `inputs` (upb's costliest per byte:
    a map insertion each, 49 ns per byte against 11 for strings)."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "elmo"
    if form == "map entries":
        return request.SerializeToString() + b"\x12\x00" * entries
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, tensor_shape={"dim": [{"size": 1}]})
    entry = field(1, b"sentences") + field(2, tensor.SerializeToString() + b"\x42\x00" * entries)
    return request.SerializeToString() + field(2, entry)


def status_request():
    return get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "elmo"})


def predict_request(sentences, signature="default"):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "elmo"
    request.model_spec.signature_name = signature
    request.inputs["sentences"].CopyFrom(tf.make_tensor_proto(sentences, dtype=tf.string))
    return request


@pytest.fixture
def channels(server):
    """Two channels with connections of their own (the hostile client's and another client's)."""
    own = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_send_message_length", 1 << 30)]
    opened = [grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}", options=own) for _ in range(2)]
    yield opened
    for channel in opened:
        channel.close()


# ------------------------------------------------------------------------------------------------ over gRPC


# entries in each form that held the event loop 0.8-3 s before issue 38 on a 2-core machine (80 MB and 24 MB)
HOSTILE = {"strings": 40_000_000, "map entries": 12_000_000}


@pytest.mark.parametrize("form", sorted(HOSTILE))
def test_a_hostile_message_of_many_entries_does_not_stall_another_client(server, channels, form):
    """Issue 38: a 60 MB Predict of 20M strings (refused by the budget once parsed) held the event loop while upb
    parsed it, and another client's GetModelStatus took 1.44 s. A message of millions of entries is now refused
    from its entry count before it is parsed, off the loop: the other client's calls, timed back to back from before
    it is sent until its answer, each take under STALL_BOUND_S (what is left is gRPC's own copy of the bytes, some
    1 ms per MB, on the loop)."""
    hostile_channel, other_channel = channels
    status = model_service_pb2_grpc.ModelServiceStub(other_channel)
    status.GetModelStatus(status_request(), timeout=10)
    grpc.channel_ready_future(hostile_channel).result(timeout=10)
    data = hostile_predict(HOSTILE[form], form)  # built first: this process's GIL is the server's too
    latencies, started, done = [], threading.Event(), threading.Event()

    def probe():
        while not done.is_set() and len(latencies) < 100_000:
            start = time.monotonic()
            status.GetModelStatus(status_request(), timeout=30)
            latencies.append(time.monotonic() - start)
            if len(latencies) == 5:
                started.set()

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        assert started.wait(10)
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            hostile_channel.unary_unary(PREDICT)(data, timeout=60)
        hostile_s = time.monotonic() - start
    finally:
        done.set()
        prober.join(60)
    during = latencies[5:]
    print(
        f"\n[hostile {len(data) / 1e6:.0f} MB of {HOSTILE[form]} {form}] answered in {hostile_s:.3f} s; another "
        f"client's GetModelStatus: {len(during)} calls meanwhile, slowest {max(during) * 1000:.1f} ms"
    )
    assert during
    assert max(during) < STALL_BOUND_S, f"slowest GetModelStatus {max(during):.3f} s"
    limit = grpc_parse.ParseLimits.from_limits(Limits())
    assert info.value.code() == EXHAUSTED, info.value.details()
    assert f"above the server's limit of {limit.max_entries} per request" in info.value.details()
    assert "(4 x --max_request_tokens 16384 + 4096)" in info.value.details()


def test_every_method_answers_small_and_large_messages(server, model, channels):
    """Each method answers as before, for a message parsed on the loop and for one above INLINE_PARSE_BYTES parsed
    on the pool: Predict (served, equal to the model), GetModelMetadata, GetModelStatus (a long version label plays
    no part), and Classify, Regress, MultiInference (the stock refusals of ELMo's signatures, whatever the
    examples)."""
    channel = channels[0]
    predict = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    status = model_service_pb2_grpc.ModelServiceStub(channel)
    padding = "x" * (2 * grpc_parse.INLINE_PARSE_BYTES)
    for big in (False, True):
        sentences = ["a small request", "x" * (2 * grpc_parse.INLINE_PARSE_BYTES) if big else "b"]
        response = predict.Predict(predict_request(sentences), timeout=30)
        assert_parity(
            reference_sentences(model, sentences), {a: tf.make_ndarray(p) for a, p in response.outputs.items()}
        )
        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        request.model_spec.name = "elmo"
        request.model_spec.signature_name = padding if big else ""
        assert predict.GetModelMetadata(request, timeout=30).model_spec.version.value == 1
        label_request = get_model_status_pb2.GetModelStatusRequest(
            model_spec={"name": "elmo", "version_label": padding if big else "stable"}
        )
        assert [s.version for s in status.GetModelStatus(label_request, timeout=30).model_version_status] == [1]
        example = tf.train.Example()
        example.features.feature["text"].bytes_list.value.append(padding.encode() if big else b"t")
        classify = classification_pb2.ClassificationRequest(model_spec={"name": "elmo", "signature_name": "tokens"})
        classify.input.example_list.examples.append(example)
        regress = regression_pb2.RegressionRequest(model_spec={"name": "elmo", "signature_name": "tokens"})
        regress.input.example_list.examples.append(example)
        multi = inference_pb2.MultiInferenceRequest()
        multi.tasks.add(model_spec={"name": "elmo", "signature_name": "nope"}, method_name="tensorflow/serving/regress")
        multi.input.example_list.examples.append(example)
        assert (classify.ByteSize() > grpc_parse.INLINE_PARSE_BYTES) == big
        for call, message, details in (
            (predict.Classify, classify, "Expected one input Tensor."),
            (predict.Regress, regress, "Expected one input Tensor."),
            (predict.MultiInference, multi, "Requested signature not found in model graph: nope"),
        ):
            with pytest.raises(grpc.RpcError) as info:
                call(message, timeout=30)
            assert (info.value.code(), info.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, details)


@pytest.mark.parametrize("size", [3, 3 * grpc_parse.INLINE_PARSE_BYTES])
def test_a_message_that_cannot_be_parsed_is_internal(channels, size):
    """As gRPC's C++ server (stock's) answers one (grpcpp/impl/generic_serialize.h), on the loop and on the pool: a
    length-delimited field that runs past the end of the message."""
    data = field(1, b"x" * size)[:-1]
    with pytest.raises(grpc.RpcError) as info:
        channels[0].unary_unary(PREDICT)(data, timeout=30)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert info.value.details() == "Failed to parse the request message as tensorflow.serving.PredictRequest"


def _declared(dtype, dims):
    return tensor_pb2.TensorProto(
        dtype=dtype, tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[{"size": d} for d in dims])
    )


@pytest.mark.parametrize(
    "signature, inputs, details",
    [
        ("default", {"sentences": _declared(types_pb2.DT_STRING, [10**9])}, "1000000000 rows"),
        (
            "tokens",
            {
                "tokens": _declared(types_pb2.DT_STRING, [256, 1000]),
                "sequence_len": _declared(types_pb2.DT_INT32, [256]),
            },
            "256000 tokens of work",
        ),
        (
            "packed",  # issue 38: 113 bytes declaring [1, 8192, 8192] cost 320 MiB before they were refused
            {
                "tokens": _declared(types_pb2.DT_STRING, [1, 1]),
                "table_rows": _declared(types_pb2.DT_INT32, [1, 8192, 8192]),
                "starts": _declared(types_pb2.DT_BOOL, [1, 8192, 8192]),
            },
            "67108864 packed positions",
        ),
    ],
)
def test_declared_shapes_are_refused_before_a_tensor_is_built(channels, monkeypatch, signature, inputs, details):
    """Every signature the server answers, the internal `packed` one too: a small message declaring a huge shape is
    RESOURCE_EXHAUSTED from its TensorProtos' declared shapes, and no tensor is read from it."""
    read = []
    monkeypatch.setattr(grpc_front, "read_tensor_proto", lambda proto: read.append(proto))
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = "elmo", signature
    for alias, proto in inputs.items():
        request.inputs[alias].CopyFrom(proto)
    assert request.ByteSize() < 200
    with pytest.raises(grpc.RpcError) as info:
        prediction_service_pb2_grpc.PredictionServiceStub(channels[0]).Predict(request, timeout=30)
    assert info.value.code() == EXHAUSTED and details in info.value.details(), info.value.details()
    assert read == []


# ------------------------------------------------------------------------------------------------ the entry count


def test_entries_are_counted_at_every_depth():
    """Each field of the wire format counts, in submessages and map entries too; a packed run of varints counts one
    per 8 bytes, a packed run of floats and a string's contents count by nothing but their field."""
    request = predict_pb2.PredictRequest(output_filter=["elmo"])
    request.model_spec.name = "elmo"  # model_spec, name: 2 (the output filter: 1)
    tensor = request.inputs["tokens"]  # the map entry, its key, its value: 3
    tensor.dtype = types_pb2.DT_STRING  # 1
    tensor.tensor_shape.dim.add(size=2)  # tensor_shape, dim, size: 3
    tensor.string_val.extend([b"a", b"b" * 100_000])  # 2
    lengths = request.inputs["sequence_len"]  # 3
    lengths.int_val.extend([300] * 40)  # packed: 1 + 80 bytes // 8 = 11
    floats = request.inputs["weights"]  # 3
    floats.float_val.extend([1.0] * 1000)  # packed fixed-width: 1
    floats.variant_val.add().tensors.add().string_val.append(b"x")  # a recursive type, TensorProto in TensorProto: 3
    descriptor = predict_pb2.PredictRequest.DESCRIPTOR
    expected = 2 + 1 + 3 + 1 + 3 + 2 + 3 + 11 + 3 + 1 + 3
    assert grpc_parse.count_entries(request.SerializeToString(), descriptor, 10**6) == expected
    unknown = request.SerializeToString() + varint(99 << 3) + varint(5)  # an unknown field counts too
    assert grpc_parse.count_entries(unknown, descriptor, 10**6) == expected + 1


def test_the_count_stops_past_the_limit_and_on_malformed_messages():
    """A hostile message costs at most limit + 1 steps; a malformed one stops the count where it breaks (upb then
    refuses it, having parsed fewer entries), and nothing raises."""
    descriptor = predict_pb2.PredictRequest.DESCRIPTOR
    data = hostile_predict(1_000_000)
    start = time.perf_counter()
    assert grpc_parse.count_entries(data, descriptor, 1000) == 1001
    assert grpc_parse.count_entries(data[:-1], descriptor, 1000) < 1000  # its map entry runs past the end
    assert time.perf_counter() - start < 0.1
    for broken in (b"\x0a\xff", b"\x08" + b"\xff" * 20, b"\x0f", b"\x12\x05\x12\x09abc", b"\xff" * 12):
        assert grpc_parse.count_entries(broken, descriptor, 1000) <= 2, broken
        with pytest.raises(ServingError) as info:  # counted first when above 4 bytes, then refused by upb
            grpc_parse.parse(broken, predict_pb2.PredictRequest, grpc_parse.ParseLimits(max_entries=2, source=""))
        assert info.value.code == grpc.StatusCode.INTERNAL, broken


def test_the_largest_requests_the_budget_allows_are_within_the_limit():
    """The limit follows the budget: a `tokens` request at max_request_tokens (64 x 256 tokens, one entry each) and a
    `packed` one at as many positions, its table_rows and starts as unpacked entries (the costliest form), are
    within it; one more token's worth of entries than the limit is refused, naming the limit and its flag."""
    limits = Limits()
    parse_limits = grpc_parse.ParseLimits.from_limits(limits)
    assert parse_limits.max_entries == 4 * 16384 + 4096
    descriptor = predict_pb2.PredictRequest.DESCRIPTOR
    tokens = predict_pb2.PredictRequest()
    tokens.inputs["tokens"].CopyFrom(tf.make_tensor_proto(np.full([64, 256], b"word", object)))
    tokens.inputs["sequence_len"].CopyFrom(tf.make_tensor_proto(np.full([64], 256, np.int32)))
    packed = predict_pb2.PredictRequest()
    packed.inputs["tokens"].CopyFrom(tf.make_tensor_proto(np.full([1, 16384], b"w", object)))
    for alias, dtype, entry in (  # int_val and bool_val entries one by one
        ("table_rows", types_pb2.DT_INT32, b"\x38" + varint(300)),
        ("starts", types_pb2.DT_BOOL, b"\x58\x01"),
    ):
        header = _declared(dtype, [1, 128, 128]).SerializeToString()
        packed.MergeFromString(field(2, field(1, alias.encode()) + field(2, header + entry * 16384)))
    for request in (tokens, packed):
        data = request.SerializeToString()
        assert grpc_parse.count_entries(data, descriptor, parse_limits.max_entries) <= parse_limits.max_entries
        grpc_parse.parse(data, predict_pb2.PredictRequest, parse_limits)
    small = grpc_parse.ParseLimits.from_limits(Limits(max_request_tokens=1000))
    with pytest.raises(ServingError) as info:
        grpc_parse.parse(hostile_predict(small.max_entries), predict_pb2.PredictRequest, small)
    assert info.value.code == EXHAUSTED
    assert f"above the server's limit of {4 * 1000 + 4096} per request (4 x --max_request_tokens 1000 + 4096)" in (
        info.value.details
    )


def test_without_a_token_limit_the_entries_follow_the_other_limits():
    unbounded = Limits(max_request_tokens=None)
    assert grpc_parse.ParseLimits.from_limits(unbounded) == grpc_parse.ParseLimits(
        4 * 256 * 1000 + 4096, "4 x --max_request_sentences 256 x --max_tokens_per_sentence 1000 + 4096"
    )
    neither = Limits(max_request_tokens=None, max_tokens_per_sentence=None, max_request_bytes=1 << 20)
    assert grpc_parse.ParseLimits.from_limits(neither).max_entries == 4 * (1 << 20) // 32 + 4096
