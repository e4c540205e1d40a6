"""The request budget of serving/servable.py: a TensorProto is checked from its declared shape before
`tf.make_ndarray` (issue 12, item 8: an 85-byte PredictRequest declaring [256, 1000] strings with one value), tokens
of work (rows x tokens), bytes in (a short string repeated to fill a declared shape), value counts that do not fit
the shape, input roles from the SignatureDef, and response sizes estimated before the model runs, for proto and JSON,
against real responses. Over gRPC on 127.0.0.1: the 85-byte request is refused at once, four clients sending it do
not delay a valid request by more than a few seconds, and the server's RSS stays bounded.
"""

import http.client
import json
import os
import random
import threading
import time
import tracemalloc
import urllib.parse

import grpc
import numpy as np
import pytest
import tensorflow as tf
from serving_testlib import assert_parity, reference_sentences
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

import serving.servable as servable
from elmo_tf.preprocessing.tokenizer import split_tokens
from serving.servable import Limits, SignatureRunner, count_tokens, load_servable
from serving.status import ServingError

INVALID = grpc.StatusCode.INVALID_ARGUMENT
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


# ---------------------------------------------------------------------------------------------------- helpers


def _info(dtype, shape):
    info = meta_graph_pb2.TensorInfo(dtype=dtype)
    for size in shape:
        info.tensor_shape.dim.add(size=size)
    return info


def signature_runner(inputs, outputs=None, limits=None):
    """A SignatureRunner over a SignatureDef with `inputs` {alias: (dtype, shape)} and ELMo-like outputs; its
    function is never called."""
    signature = meta_graph_pb2.SignatureDef(method_name="tensorflow/serving/predict")
    for alias, (dtype, shape) in inputs.items():
        signature.inputs[alias].CopyFrom(_info(dtype, shape))
    outputs = outputs or {
        "elmo": (types_pb2.DT_FLOAT, [-1, -1, 64]),
        "default": (types_pb2.DT_FLOAT, [-1, 64]),
        "sequence_len": (types_pb2.DT_INT32, [-1]),
        "mask": (types_pb2.DT_BOOL, [-1, -1]),
    }
    for alias, (dtype, shape) in outputs.items():
        signature.outputs[alias].CopyFrom(_info(dtype, shape))
    return SignatureRunner("sig", None, signature, limits or Limits())


def tokens_runner(limits=None, tokens="tokens", lengths="sequence_len"):
    return signature_runner(
        {tokens: (types_pb2.DT_STRING, [-1, -1]), lengths: (types_pb2.DT_INT32, [-1])}, limits=limits
    )


def sentences_runner(limits=None, alias="sentences"):
    return signature_runner({alias: (types_pb2.DT_STRING, [-1])}, limits=limits)


def declared(dtype, field, values, shape):
    """A TensorProto of `dtype` with `values` in `field` (as clients write them) declaring `shape`, which may hold
    more elements than the values (TensorFlow repeats the last one)."""
    proto = tensor_pb2.TensorProto(dtype=dtype, **{field: values})
    for size in shape:
        proto.tensor_shape.dim.add(size=size)
    return proto


def strings(values, shape):
    return declared(types_pb2.DT_STRING, "string_val", values, shape)


def int32s(values, shape):
    return declared(types_pb2.DT_INT32, "int_val", values, shape)


def item_8_request(signature="tokens"):
    """Issue 12, item 8: a PredictRequest of about 85 bytes declaring 256 x 1000 tokens with one string value (TF
    repeats the last value to fill the shape) and 256 lengths of 1000 with one value."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "elmo"
    request.model_spec.signature_name = signature
    if signature == "tokens":
        request.inputs["tokens"].CopyFrom(strings([b"word"], [256, 1000]))
        request.inputs["sequence_len"].CopyFrom(int32s([1000], [256]))
    else:
        request.inputs["sentences"].CopyFrom(strings([b" ".join([b"w"] * 1000)], [256]))
    return request


def budget_error(call, code=EXHAUSTED):
    """Runs `call`, which must raise ServingError with `code` within 0.2 s; returns its message."""
    start = time.perf_counter()
    with pytest.raises(ServingError) as info:
        call()
    assert time.perf_counter() - start < 0.2
    assert info.value.code == code, info.value
    return info.value.details


def vm_rss_bytes(pid=None):
    with open(f"/proc/{pid or os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


# ---------------------------------------------------------------------------------------------------- token counts


def test_count_tokens_is_split_tokens_without_the_tokens(monkeypatch):
    alphabet = [b"a", b"bc", b" ", b"\t", b"\n", b"\x0b", b"\x0c", b"\r", b"\x1c", b"\x85", b"\xa0", b"\x00", b"\xc3"]
    rng = random.Random(0)
    cases = [b"", b" ", b"a", b" a ", b"a  b\t\tc\n"] + [
        b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(2000)
    ]
    for chunk in (servable._COUNT_CHUNK, 1, 2, 3, 7):  # tokens cut by chunk boundaries count once
        monkeypatch.setattr(servable, "_COUNT_CHUNK", chunk)
        for sentence in cases:
            assert count_tokens(sentence) == len(split_tokens(sentence)), (chunk, sentence)
    monkeypatch.undo()
    big = b"w " * 5_000_000  # 10 MB, 5 million tokens: split() would build 5 million bytes objects
    tracemalloc.start()
    start = time.perf_counter()
    try:
        assert count_tokens(big) == 5_000_000
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak  # 1 MiB chunks
    assert elapsed < 2.0, elapsed


# ---------------------------------------------------------------------------------------------------- TensorProtos


def test_item_8_request_is_refused_from_its_declared_shape():
    """85 bytes that TF would expand to 256 x 1000 tokens: RESOURCE_EXHAUSTED by the work budget, before
    make_ndarray, with the limit, the value and the flag."""
    request = item_8_request()
    assert request.ByteSize() <= 90, request.ByteSize()
    runner = tokens_runner()
    details = budget_error(lambda: runner.check_tensor_proto("tokens", request.inputs["tokens"]))
    assert details == (
        "input 'tokens' is 256 rows x 1000 tokens wide = 256000 tokens of work, above the server's limit of 16384 "
        "tokens per request (--max_request_tokens): split the request"
    )
    request = item_8_request("default")
    details = budget_error(lambda: sentences_runner().check_tensor_proto("sentences", request.inputs["sentences"]))
    assert "is 256 rows x 1000 tokens in the longest sentence (every row is padded to it) = 256000 tokens" in details
    assert "limit of 16384 tokens per request (--max_request_tokens)" in details


def test_fewer_values_than_the_shape_are_counted_at_the_declared_size():
    """As TF's Tensor::FromProto: the last value fills the shape (zeros or "" when there is none); the budget sees
    the declared size."""
    runner = tokens_runner(Limits(max_request_tokens=None))
    request = item_8_request()
    protos = request.inputs
    for alias in ("tokens", "sequence_len"):
        runner.check_tensor_proto(alias, protos[alias])
    prepared = runner.prepare({alias: tf.make_ndarray(protos[alias]) for alias in protos})
    assert (prepared.batch, prepared.width, prepared.tokens) == (256, 1000, 256_000)
    assert prepared.inputs["tokens"][255, 999] == b"word" and prepared.inputs["sequence_len"][255] == 1000
    # one 1000-word sentence declared 4 rows: 4 x 1000 tokens of work
    runner = sentences_runner()
    proto = strings([b" ".join([b"w"] * 1000)], [4])
    assert runner.check_tensor_proto("sentences", proto) == (4,)
    assert runner.prepare({"sentences": tf.make_ndarray(proto)}).tokens == 4000
    # no values at all: zeros (the budget still counts the declared rows)
    runner = tokens_runner()
    protos = {"tokens": strings([b"a"], [2, 3]), "sequence_len": int32s([], [2])}
    for alias, proto in protos.items():
        runner.check_tensor_proto(alias, proto)
    prepared = runner.prepare({alias: tf.make_ndarray(proto) for alias, proto in protos.items()})
    assert prepared.tokens == 6 and prepared.inputs["sequence_len"].tolist() == [0, 0]
    runner.check_tensor_proto("tokens", strings([], [2, 3]))


@pytest.mark.parametrize(
    "case, alias, proto, limits, expected",
    [
        (
            "rows",
            "sentences",
            lambda: strings([b"a"], [10**9]),
            Limits(),
            "input 'sentences' has 1000000000 rows (sentences), above the server's limit of 256 per request "
            "(--max_request_sentences)",
        ),
        (
            "width",
            "tokens",
            lambda: strings([b"a"], [1, 10**12]),
            Limits(),
            "input 'tokens' is 1000000000000 tokens wide, above the server's limit of 1000 tokens per sentence "
            "(--max_tokens_per_sentence)",
        ),
        (
            "width without a width limit",
            "tokens",
            lambda: strings([b"a"], [1, 10**12]),
            Limits(max_tokens_per_sentence=None),
            "input 'tokens' is 1 rows x 1000000000000 tokens wide = 1000000000000 tokens of work, above the "
            "server's limit of 16384 tokens per request (--max_request_tokens)",
        ),
        (
            "a 1 MiB string repeated 16,000 times",
            "tokens",
            lambda: strings([b"x" * (1 << 20)], [16, 1000]),
            Limits(),
            "input 'tokens' (DT_STRING [16,1000]) is 16777728000 bytes (16000.5 MiB), above the server's limit of "
            "268435456 bytes (256.0 MiB) per input (--max_message_bytes)",
        ),
        (
            "a sentence of 2000 tokens",
            "sentences",
            lambda: strings([b"a", b"w " * 2000], [2]),
            Limits(),
            "sentence 1 of input 'sentences' has 2000 tokens, above the server's limit of 1000 tokens per sentence "
            "(--max_tokens_per_sentence)",
        ),
    ],
)
def test_huge_declared_shapes_are_refused_before_reading(case, alias, proto, limits, expected):
    runner = sentences_runner(limits) if alias == "sentences" else tokens_runner(limits)
    assert expected in budget_error(lambda: runner.check_tensor_proto(alias, proto()))


def test_inputs_of_any_rank_are_counted_by_elements_x_element_size():
    """An export with a float or string input of any rank: its declared bytes, whatever the proto holds."""
    runner = signature_runner({"features": (types_pb2.DT_FLOAT, [-1, -1, -1])})
    proto = declared(types_pb2.DT_FLOAT, "float_val", [0.5], [256, 1000, 1000])
    details = budget_error(lambda: runner.check_tensor_proto("features", proto))
    assert details.startswith("input 'features' (DT_FLOAT [256,1000,1000]) is 1024000000 bytes (976.6 MiB)")
    assert "(--max_message_bytes)" in details
    proto.tensor_shape.dim[2].size = 10
    assert runner.check_tensor_proto("features", proto) == (256, 1000, 10)
    # strings of any rank: 32 bytes an element besides their own bytes, so "" declared 2.56e11 times is refused
    runner = signature_runner({"grid": (types_pb2.DT_STRING, [-1, -1, -1])})
    details = budget_error(lambda: runner.check_tensor_proto("grid", strings([b""], [256, 10**6, 1000])))
    assert details.startswith("input 'grid' (DT_STRING [256,1000000,1000]) is 8192000000000 bytes")
    assert runner.check_tensor_proto("grid", strings([b""], [256, 1000, 10])) == (256, 1000, 10)  # 80 MiB


def test_value_counts_that_do_not_fit_the_shape_are_invalid_argument():
    runner = tokens_runner()
    details = budget_error(lambda: runner.check_tensor_proto("tokens", strings([b"a", b"b", b"c"], [1, 2])), INVALID)
    assert details == (
        "input 'tokens' of signature 'sig': the TensorProto holds 3 values, more than its shape [1,2] holds (2)"
    )
    proto = tf.make_tensor_proto(np.array([1, 2], np.int32))
    proto.tensor_content = proto.tensor_content[:5]
    details = budget_error(lambda: runner.check_tensor_proto("sequence_len", proto), INVALID)
    assert "tensor_content holds 5 bytes, shape [2] of DT_INT32 needs 8" in details
    proto = strings([b"a"], [1, 1])
    proto.tensor_content = b"\x01a"
    details = budget_error(lambda: runner.check_tensor_proto("tokens", proto), INVALID)
    assert "DT_STRING values must be in string_val" in details
    details = budget_error(lambda: runner.check_tensor_proto("tokens", int32s([1], [1, 1])), INVALID)
    assert "expected dtype DT_STRING, got DT_INT32" in details


# ---------------------------------------------------------------------------------------------------- tokens of work


def test_work_budget_is_rows_x_tokens():
    """The REST path (NumPy inputs): rows x width for the padded input, rows x the longest sentence for sentences
    (every row is padded to the longest), whatever the other rows hold."""
    runner = tokens_runner(Limits(max_request_tokens=100))
    ok = runner.prepare({"tokens": np.full((10, 10), b"w", object), "sequence_len": np.full(10, 10, np.int32)})
    assert (ok.tokens, ok.time_estimate) == (100, 10)
    details = budget_error(
        lambda: runner.prepare({"tokens": np.full((10, 11), b"w", object), "sequence_len": np.ones(10, np.int32)})
    )
    assert "input 'tokens' is 10 rows x 11 tokens wide = 110 tokens of work" in details
    assert "limit of 100 tokens per request (--max_request_tokens)" in details
    runner = sentences_runner(Limits(max_request_tokens=100))
    assert runner.prepare({"sentences": np.array([b"w " * 25, b"a", b"", b"b c"], object)}).tokens == 100
    details = budget_error(lambda: runner.prepare({"sentences": np.array([b"w " * 26, b"a", b"", b"b"], object)}))
    assert "input 'sentences' is 4 rows x 26 tokens in the longest sentence" in details
    runner = sentences_runner(Limits(max_request_tokens=None, max_tokens_per_sentence=None))
    assert runner.prepare({"sentences": np.array([b"w " * 5000] * 256, object)}, ["default"]).tokens == 256 * 5000


def test_string_bytes_count_each_repetition():
    """An object array may hold one big value many times (TF's fill): tf.constant would copy it each time."""
    runner = tokens_runner(Limits(max_request_bytes=1 << 20))
    big = b"x" * (64 << 10)
    runner.prepare({"tokens": np.full((1, 15), big, object), "sequence_len": np.ones(1, np.int32)})  # 0.94 MiB
    details = budget_error(
        lambda: runner.prepare({"tokens": np.full((1, 16), big, object), "sequence_len": np.ones(1, np.int32)})
    )
    assert (
        "input 'tokens' (DT_STRING [1,16]) is 1049088 bytes (1.0 MiB), above the server's limit of 1048576" in details
    )


def test_input_roles_come_from_the_signature_def():
    """Other names, same shapes: the padded input, its lengths and sentences are found by shape."""
    runner = tokens_runner(Limits(max_request_tokens=20), tokens="words", lengths="n")
    assert (runner.padded_input, runner.lengths_input, runner.sentence_inputs) == ("words", "n", ())
    assert runner.lengths_output == "sequence_len"
    details = budget_error(
        lambda: runner.prepare({"words": np.full((2, 3), b"w", object), "n": np.array([1, 4], np.int32)}), INVALID
    )
    assert details == "n must be in [0, 3] (the width of words, axis 1), got 4 at row 1"
    details = budget_error(
        lambda: runner.prepare({"words": np.full((2, 3), b"w", object), "n": np.array([1], np.int32)}), INVALID
    )
    assert details == "n must have one entry per row of words: got 1 lengths for 2 rows"
    assert "input 'words' is 3 rows x 7 tokens wide" in budget_error(
        lambda: runner.prepare({"words": np.full((3, 7), b"w", object), "n": np.ones(3, np.int32)})
    )
    runner = sentences_runner(Limits(max_tokens_per_sentence=2), alias="text")
    assert runner.sentence_inputs == ("text",) and runner.padded_input is None
    assert "sentence 0 of input 'text' has 3 tokens" in budget_error(
        lambda: runner.prepare({"text": np.array([b"a b c"], object)})
    )


# ---------------------------------------------------------------------------------------------------- bytes out


@pytest.fixture(scope="module")
def loaded(base_path):
    return load_servable("elmo", 1, os.path.join(base_path, "1"))


def proto_size(outputs):
    response = predict_pb2.PredictResponse()
    for alias, value in outputs.items():
        response.outputs[alias].CopyFrom(tf.make_tensor_proto(value))
    return response.ByteSize()


def json_sizes(outputs):
    """Lengths of TF Serving's columnar and row JSON responses, as Python's json writes them."""
    columnar = json.dumps({"outputs": {a: v.tolist() for a, v in outputs.items()}}, separators=(",", ":"))
    rows = next(iter(outputs.values())).shape[0]
    predictions = [{a: v[k].tolist() for a, v in outputs.items()} for k in range(rows)]
    return len(columnar), len(json.dumps({"predictions": predictions}, separators=(",", ":")))


def test_response_estimates_match_real_responses(loaded):
    """Estimated before the model runs, measured after: proto within 64 bytes per output (the tensors' bytes are
    exact), JSON within 2% (row and columnar); JSON is about 5x the binary size (float32 as 17-digit decimal
    text)."""
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
            proto = runner.prepare(inputs, output_filter)
            as_json = runner.prepare(inputs, output_filter, response_encoding="json")
            outputs = runner.run(proto.inputs)
            outputs = {alias: outputs[alias] for alias in proto.output_filter}
            real = proto_size(outputs)
            overhead = 64 * len(outputs)  # dtype, shape and map key of each output
            assert real - overhead <= proto.response_bytes <= real, (signature, output_filter, proto, real)
            for real in json_sizes(outputs):
                assert 0.97 <= as_json.response_bytes / real <= 1.03, (signature, output_filter, as_json, real)
            ratios.append(as_json.response_bytes / proto.response_bytes)
    assert 2.5 < min(ratios) and 5.0 < max(ratios) < 5.3, ratios  # 5x; padding ("0.0,") makes JSON cheaper


def test_json_estimate_refuses_what_proto_allows(loaded):
    limits = Limits(max_response_bytes=1 << 20)
    runner = SignatureRunner("default", None, loaded.signature_defs["default"], limits)
    runner.inner_dims = dict(loaded.runner("default").inner_dims)
    inputs = {"sentences": np.array([b"w " * 100] * 10, object)}
    assert runner.prepare(inputs).response_bytes == 10 * 100 * (32 + 3 * 64) * 4 + 10 * (64 * 4 + 4) + 10 * 100
    details = budget_error(lambda: runner.prepare(inputs, response_encoding="json"))
    assert details.startswith("the response would be about 4.3 MiB as JSON (10 sentences x 100 tokens, outputs ")
    assert "above the server's limit of 1.0 MiB (--max_message_bytes)" in details
    assert runner.prepare(inputs, ["default"], response_encoding="json").response_bytes < 20_000
    with pytest.raises(ValueError, match="response_encoding must be one of"):
        runner.prepare(inputs, response_encoding="xml")


# ---------------------------------------------------------------------------------------------------- a real server


def test_item_8_over_grpc_is_refused_at_once_and_starves_nobody(server, client, model):
    """The 85-byte request to the shared server (127.0.0.1, default limits): RESOURCE_EXHAUSTED in well under a
    second; 4 clients sending it in a loop do not delay a valid request by more than a few seconds; the process's
    RSS (the server runs in it) grows by less than 64 MiB over 1,000 of them."""
    valid = ["a valid sentence for the budget test"]
    expected = reference_sentences(model, valid)
    assert_parity(expected, client.embed(valid))  # warm
    start = time.perf_counter()
    for _ in range(3):
        client.embed(valid)
    baseline = (time.perf_counter() - start) / 3
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    hostile = [item_8_request("tokens"), item_8_request("default")]
    assert hostile[0].ByteSize() <= 90 and hostile[1].ByteSize() < 2100  # a sentence of 1000 tokens: 1999 bytes

    def refused(request):
        start = time.perf_counter()
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(request, timeout=30)
        assert info.value.code() == EXHAUSTED and "(--max_request_tokens)" in info.value.details()
        return time.perf_counter() - start

    try:
        one = max(refused(r) for r in hostile)
        assert one < 0.5, one
        rss_before = vm_rss_bytes()
        stop, failures, counts = threading.Event(), [], [0] * 4

        def attacker(k):
            try:
                while not stop.is_set() and counts[k] < 250:  # bounded: 1,000 requests in all
                    refused(hostile[counts[k] % 2])
                    counts[k] += 1
            except Exception as e:  # collected: failures in threads do not fail the test by themselves
                failures.append(f"attacker {k}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=attacker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        try:
            time.sleep(0.2)
            start = time.perf_counter()
            out = client.embed(valid)
            delayed = time.perf_counter() - start
        finally:
            for t in threads:
                t.join(120)
            stop.set()
        assert not any(t.is_alive() for t in threads)
        assert not failures, failures
        assert sum(counts) == 1000
        assert_parity(expected, out)
        assert delayed < baseline + 3.0, (delayed, baseline)
        rss_after = vm_rss_bytes()
        print(
            f"\nitem 8 over gRPC: {hostile[0].ByteSize()}/{hostile[1].ByteSize()} bytes, "
            f"refused in {one * 1000:.1f} ms; valid request {baseline * 1000:.1f} ms alone, "
            f"{delayed * 1000:.1f} ms under 4 attackers; "
            f"RSS {rss_before / 2**20:.1f} -> {rss_after / 2**20:.1f} MiB over {sum(counts)} hostile requests"
        )
        assert rss_after - rss_before < 64 << 20, (rss_before, rss_after)
    finally:
        channel.close()


def test_repeated_big_string_over_grpc_is_refused_before_it_is_built(server, client, model):
    """A 1 MiB string declared [16, 1000]: tf.constant would copy it 16,000 times (16 GiB); refused from the
    declared size, and the server goes on serving."""
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "elmo"
    request.model_spec.signature_name = "tokens"
    request.inputs["tokens"].CopyFrom(strings([b"x" * (1 << 20)], [16, 1000]))
    request.inputs["sequence_len"].CopyFrom(int32s([1000], [16]))
    try:
        client.embed(["warm"])
        rss_before = vm_rss_bytes()
        start = time.perf_counter()
        for _ in range(20):
            with pytest.raises(grpc.RpcError) as info:
                stub.Predict(request, timeout=30)
            assert info.value.code() == EXHAUSTED
            assert "16777728000 bytes" in info.value.details() and "(--max_message_bytes)" in info.value.details()
        elapsed = (time.perf_counter() - start) / 20
        rss_after = vm_rss_bytes()
    finally:
        channel.close()
    print(
        f"\n1 MiB string declared [16, 1000] over gRPC: refused in {elapsed * 1000:.1f} ms; "
        f"RSS {rss_before / 2**20:.1f} -> {rss_after / 2**20:.1f} MiB over 20 requests"
    )
    assert elapsed < 0.5
    assert rss_after - rss_before < 64 << 20, (rss_before, rss_after)
    start = time.perf_counter()
    assert_parity(reference_sentences(model, ["still serving"]), client.embed(["still serving"]))
    assert time.perf_counter() - start < 5.0


def test_json_estimate_matches_the_rest_front(rest_url, loaded):
    """The REST front's real bodies (127.0.0.1, row and columnar formats) against the estimate it is checked with."""
    sentences = ["the cat sat on the mat .", "dogs bark", " ".join(["word"] * 60), ""]
    runner = loaded.runner("default")
    estimate = runner.prepare(
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
        assert 0.98 <= estimate / real <= 1.02, (body, estimate, real)
