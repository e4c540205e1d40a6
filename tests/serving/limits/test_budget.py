"""elmo_tf/serving/limits/budget.py, the request budget: a TensorProto is checked from its declared shape before
`tf.make_ndarray` (issue 12, item 8: an 85-byte PredictRequest declaring [256, 1000] strings with one value), tokens
of work (rows x tokens), bytes in (a short string repeated to fill a declared shape), value counts that do not fit
the shape, dtype/rank/name checks of NumPy inputs, the response estimate checked before the model runs (JSON refused
where proto passes) and the real size after it. Over gRPC on 127.0.0.1: the 85-byte request is refused at once, four
clients sending it do not delay a valid request by more than a few seconds, and the server's RSS stays bounded.
"""

import os
import random
import threading
import time
import tracemalloc

import grpc
import numpy as np
import pytest
import tensorflow as tf
from serving_fake import (
    EXHAUSTED,
    INVALID,
    budget_error,
    declared,
    fake_runner,
    int32s,
    item_8_request,
    sentences_budget,
    signature_budget,
    strings,
    tokens_budget,
)
from serving_testlib import assert_parity, reference_sentences
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

import elmo_tf.serving.limits.token_count as tokens_module
from elmo_tf.preprocessing.tokenizer import split_tokens
from elmo_tf.serving.limits.budget import Limits, RequestBudget, check_response_size, count_tokens, read_tensor_proto
from elmo_tf.serving.serving_error import ServingError
from elmo_tf.serving.signature import Signature


def vm_rss_bytes(pid=None):
    with open(f"/proc/{pid or os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def test_count_tokens_is_split_tokens_without_the_tokens(monkeypatch):
    alphabet = [b"a", b"bc", b" ", b"\t", b"\n", b"\x0b", b"\x0c", b"\r", b"\x1c", b"\x85", b"\xa0", b"\x00", b"\xc3"]
    rng = random.Random(0)
    cases = [b"", b" ", b"a", b" a ", b"a  b\t\tc\n"] + [
        b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(2000)
    ]
    for chunk in (tokens_module.CHUNK_BYTES, 1, 2, 3, 7):  # tokens cut by chunk boundaries count once
        monkeypatch.setattr(tokens_module, "CHUNK_BYTES", chunk)
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


def test_item_8_request_is_refused_from_its_declared_shape():
    """85 bytes that TF would expand to 256 x 1000 tokens: RESOURCE_EXHAUSTED by the work budget, before
    make_ndarray, with the limit, the value and the flag."""
    request = item_8_request()
    assert request.ByteSize() <= 90, request.ByteSize()
    budget = tokens_budget()
    details = budget_error(lambda: budget.check_tensor_proto("tokens", request.inputs["tokens"]))
    assert details == (
        "input 'tokens' is 256 rows x 1000 tokens wide = 256000 tokens of work, above the server's limit of 16384 "
        "tokens per request (--max_request_tokens): split the request"
    )
    request = item_8_request("default")
    details = budget_error(lambda: sentences_budget().check_tensor_proto("sentences", request.inputs["sentences"]))
    assert "is 256 rows x 1000 tokens in the longest sentence (every row is padded to it) = 256000 tokens" in details
    assert "limit of 16384 tokens per request (--max_request_tokens)" in details


def test_fewer_values_than_the_shape_are_counted_at_the_declared_size():
    """As TF's Tensor::FromProto: the last value fills the shape (zeros or "" when there is none); the budget sees
    the declared size."""
    budget = tokens_budget(Limits(max_request_tokens=None))
    request = item_8_request()
    protos = request.inputs
    for alias in ("tokens", "sequence_len"):
        budget.check_tensor_proto(alias, protos[alias])
    prepared = budget.prepare({alias: tf.make_ndarray(protos[alias]) for alias in protos})
    assert (prepared.batch, prepared.width, prepared.tokens) == (256, 1000, 256_000)
    assert prepared.inputs["tokens"][255, 999] == b"word" and prepared.inputs["sequence_len"][255] == 1000
    # one 1000-word sentence declared 4 rows: 4 x 1000 tokens of work
    budget = sentences_budget()
    proto = strings([b" ".join([b"w"] * 1000)], [4])
    assert budget.check_tensor_proto("sentences", proto) == (4,)
    assert budget.prepare({"sentences": tf.make_ndarray(proto)}).tokens == 4000
    # no values at all: zeros (the budget still counts the declared rows)
    budget = tokens_budget()
    protos = {"tokens": strings([b"a"], [2, 3]), "sequence_len": int32s([], [2])}
    for alias, proto in protos.items():
        budget.check_tensor_proto(alias, proto)
    prepared = budget.prepare({alias: tf.make_ndarray(proto) for alias, proto in protos.items()})
    assert prepared.tokens == 6 and prepared.inputs["sequence_len"].tolist() == [0, 0]
    budget.check_tensor_proto("tokens", strings([], [2, 3]))


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
    budget = sentences_budget(limits) if alias == "sentences" else tokens_budget(limits)
    assert expected in budget_error(lambda: budget.check_tensor_proto(alias, proto()))


def test_inputs_of_any_rank_are_counted_by_elements_x_element_size():
    """An export with a float or string input of any rank: its declared bytes, whatever the proto holds."""
    budget = signature_budget({"features": (types_pb2.DT_FLOAT, [-1, -1, -1])})
    proto = declared(types_pb2.DT_FLOAT, "float_val", [0.5], [256, 1000, 1000])
    details = budget_error(lambda: budget.check_tensor_proto("features", proto))
    assert details.startswith("input 'features' (DT_FLOAT [256,1000,1000]) is 1024000000 bytes (976.6 MiB)")
    assert "(--max_message_bytes)" in details
    proto.tensor_shape.dim[2].size = 10
    assert budget.check_tensor_proto("features", proto) == (256, 1000, 10)
    # strings of any rank: 32 bytes an element besides their own bytes, so "" declared 2.56e11 times is refused
    budget = signature_budget({"grid": (types_pb2.DT_STRING, [-1, -1, -1])})
    details = budget_error(lambda: budget.check_tensor_proto("grid", strings([b""], [256, 10**6, 1000])))
    assert details.startswith("input 'grid' (DT_STRING [256,1000000,1000]) is 8192000000000 bytes")
    assert budget.check_tensor_proto("grid", strings([b""], [256, 1000, 10])) == (256, 1000, 10)  # 80 MiB


def test_value_counts_that_do_not_fit_the_shape_are_invalid_argument():
    budget = tokens_budget()
    details = budget_error(lambda: budget.check_tensor_proto("tokens", strings([b"a", b"b", b"c"], [1, 2])), INVALID)
    assert details == (
        "input 'tokens' of signature 'sig': the TensorProto holds 3 values, more than its shape [1,2] holds (2)"
    )
    proto = tf.make_tensor_proto(np.array([1, 2], np.int32))
    proto.tensor_content = proto.tensor_content[:5]
    details = budget_error(lambda: budget.check_tensor_proto("sequence_len", proto), INVALID)
    assert "tensor_content holds 5 bytes, shape [2] of DT_INT32 needs 8" in details
    proto = strings([b"a"], [1, 1])
    proto.tensor_content = b"\x01a"
    details = budget_error(lambda: budget.check_tensor_proto("tokens", proto), INVALID)
    assert "DT_STRING values must be in string_val" in details
    details = budget_error(lambda: budget.check_tensor_proto("tokens", int32s([1], [1, 1])), INVALID)
    assert "expected dtype DT_STRING, got DT_INT32" in details


def test_narrow_int_values_are_read_as_tensorflow_reads_them():
    """Tensor::FromProto (TensorFlow's tensor.cc: PROTO_TRAITS(int8, int32, int) and the same for int16, uint8,
    uint16; FromProtoField copies int_val with std::copy_n, a C++ conversion, and fills a short field with its last
    value) wraps int32 values into the dtype; `tf.make_ndarray` raises OverflowError for them under NumPy 2."""
    cases = [
        (types_pb2.DT_INT8, [300, -129, 2**31 - 1], [44, 127, -1, -1]),
        (types_pb2.DT_UINT8, [-1, 256, 300], [255, 0, 44, 44]),
        (types_pb2.DT_INT16, [40000, -1, 7], [-25536, -1, 7, 7]),
        (types_pb2.DT_UINT16, [-1, 70000, 1], [65535, 4464, 1, 1]),
    ]
    for dtype, values, expected in cases:
        proto = declared(dtype, "int_val", values, [4])
        array = read_tensor_proto(proto)
        assert array.dtype == tf.dtypes.as_dtype(dtype).as_numpy_dtype and array.tolist() == expected, dtype
    empty = declared(types_pb2.DT_INT8, "int_val", [], [2, 2])
    assert read_tensor_proto(empty).tolist() == [[0, 0], [0, 0]] and read_tensor_proto(empty).dtype == np.int8
    raw = tf.make_tensor_proto(np.array([-3, 4], np.int8))  # tensor_content: bytes of the dtype, nothing to narrow
    assert raw.tensor_content and read_tensor_proto(raw).tolist() == [-3, 4]
    budget = signature_budget({"x": (types_pb2.DT_INT8, [-1])})
    budget.check_tensor_proto("x", declared(types_pb2.DT_INT8, "int_val", [300], [3]))  # within the budget


def test_work_budget_is_rows_x_tokens():
    """The REST path (NumPy inputs): rows x width for the padded input, rows x the longest sentence for sentences
    (every row is padded to the longest), whatever the other rows hold."""
    budget = tokens_budget(Limits(max_request_tokens=100))
    ok = budget.prepare({"tokens": np.full((10, 10), b"w", object), "sequence_len": np.full(10, 10, np.int32)})
    assert (ok.tokens, ok.time_estimate) == (100, 10)
    details = budget_error(
        lambda: budget.prepare({"tokens": np.full((10, 11), b"w", object), "sequence_len": np.ones(10, np.int32)})
    )
    assert "input 'tokens' is 10 rows x 11 tokens wide = 110 tokens of work" in details
    assert "limit of 100 tokens per request (--max_request_tokens)" in details
    budget = sentences_budget(Limits(max_request_tokens=100))
    assert budget.prepare({"sentences": np.array([b"w " * 25, b"a", b"", b"b c"], object)}).tokens == 100
    details = budget_error(lambda: budget.prepare({"sentences": np.array([b"w " * 26, b"a", b"", b"b"], object)}))
    assert "input 'sentences' is 4 rows x 26 tokens in the longest sentence" in details
    budget = sentences_budget(Limits(max_request_tokens=None, max_tokens_per_sentence=None))
    assert budget.prepare({"sentences": np.array([b"w " * 5000] * 256, object)}, ["default"]).tokens == 256 * 5000


def test_string_bytes_count_each_repetition():
    """An object array may hold one big value many times (TF's fill): tf.constant would copy it each time."""
    budget = tokens_budget(Limits(max_request_bytes=1 << 20))
    big = b"x" * (64 << 10)
    budget.prepare({"tokens": np.full((1, 15), big, object), "sequence_len": np.ones(1, np.int32)})  # 0.94 MiB
    details = budget_error(
        lambda: budget.prepare({"tokens": np.full((1, 16), big, object), "sequence_len": np.ones(1, np.int32)})
    )
    assert (
        "input 'tokens' (DT_STRING [1,16]) is 1049088 bytes (1.0 MiB), above the server's limit of 1048576" in details
    )


def test_prepare_checks_dtype_rank_names_and_limits():
    runner = fake_runner(limits=Limits(max_request_sentences=2, max_tokens_per_sentence=3))
    for inputs, code, match in [
        ({"x": np.ones((1, 2), np.float64)}, grpc.StatusCode.INVALID_ARGUMENT, "expected dtype DT_FLOAT"),
        ({"x": np.ones(2, np.float32)}, grpc.StatusCode.INVALID_ARGUMENT, "expected rank 2"),
        (
            {"z": np.ones((1, 2), np.float32)},
            grpc.StatusCode.INVALID_ARGUMENT,
            r"Signature input alias: x\(feed name: \) not found in request",
        ),  # saved_model/util.cc
        ({"x": np.ones((3, 2), np.float32)}, grpc.StatusCode.RESOURCE_EXHAUSTED, "3 rows"),
        ({"x": np.ones((1, 4), np.float32)}, grpc.StatusCode.RESOURCE_EXHAUSTED, "4 tokens wide"),
    ]:
        with pytest.raises(ServingError, match=match) as info:
            runner.budget.prepare(inputs)
        assert info.value.code == code
    with pytest.raises(ServingError, match="duplicate output tensor alias: y"):
        runner.budget.prepare({"x": np.ones((1, 2), np.float32)}, ["y", "y"])


def test_json_estimate_refuses_what_proto_allows(loaded):
    limits = Limits(max_response_bytes=1 << 20)
    budget = RequestBudget(Signature("default", loaded.signature_defs["default"]), limits)
    budget.sizes.inner_dims = dict(loaded.runner("default").sizes.inner_dims)
    inputs = {"sentences": np.array([b"w " * 100] * 10, object)}
    assert budget.prepare(inputs).response_bytes == 10 * 100 * (32 + 3 * 64) * 4 + 10 * (64 * 4 + 4) + 10 * 100
    # 12 bytes a float32 as JSON: orjson writes the shortest text that reads back as the same float32 (response_size.py)
    details = budget_error(lambda: budget.prepare(inputs, response_encoding="json"))
    assert details.startswith("the response would be about 2.6 MiB as JSON (10 sentences x 100 tokens, outputs ")
    assert "above the server's limit of 1.0 MiB (--max_message_bytes)" in details
    assert budget.prepare(inputs, ["default"], response_encoding="json").response_bytes < 20_000
    with pytest.raises(ValueError, match="response_encoding must be one of"):
        budget.prepare(inputs, response_encoding="xml")


def test_response_size_is_checked_after_the_call():
    check_response_size({"y": np.zeros(100, np.float32)}, limit=400)
    with pytest.raises(
        ServingError,
        match=r"the response is 0.4 KiB \(outputs y\), above the server's limit of "
        r"0.4 KiB",
    ) as info:
        check_response_size({"y": np.zeros(101, np.float32)}, limit=400)
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


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
