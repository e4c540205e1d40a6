"""elmo_tf/serving/server.py (a core with both fronts) through the gRPC client on 127.0.0.1: empty and odd inputs are
served, the default token limit holds, 8 concurrent clients get correct answers, and a server with small limits and
batching off answers RESOURCE_EXHAUSTED above them and serves what fits. Listening as stock's Server::BuildAndStart
(tensorflow_serving/model_servers/server.cc): gRPC on a UNIX socket, REST skipped on gRPC's port or when it cannot
start; int8/uint8 inputs narrowed as stock narrows them, over both transports."""

import json
import logging
import os
import shutil
import socket
import stat
import tempfile
import threading
import urllib.request

import grpc
import pytest
from serving_testlib import (
    VALID,
    assert_parity,
    assert_serves,
    free_port,
    messages,
    reference_sentences,
    reference_tokens,
    start_server,
    wait_for,
)

from elmo_tf.serving.client import ElmoClient
from elmo_tf.serving.serving_error import ServingError

EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


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
    assert strict_server.core.stats()["merged_requests"] == 0


@pytest.mark.parametrize("field, value", [("port", 70000), ("rest_api_port", 65536), ("port", -1), ("port", True)])
def test_ports_out_of_range_are_refused(field, value):
    """A TCP port is 0 to 65535 (issue 27: --rest_api_port 70000 listened on 4464, as stock's evhttp does)."""
    from elmo_tf.serving.options import ServerOptions

    with pytest.raises(ValueError, match=f"{field} must be an int in \\[0, 65535\\]"):
        ServerOptions(**{field: value})
    assert ServerOptions(port=65535, rest_api_port=0).port == 65535


def test_stop_lets_calls_in_flight_finish(base_path, model, monkeypatch):
    """Hostile review (s12): what SIGTERM does (`ModelServer.stop(grace)`) with gRPC and REST calls in flight on a busy
    model: each is answered with its outputs, none is cut, and the stop returns once they are done."""
    import json
    import time
    import urllib.request

    from elmo_tf.serving import servable as servable_module

    run = servable_module.SignatureRunner.run

    entered = []

    def slow(self, inputs):
        entered.append(1)
        time.sleep(1.5)
        return run(self, inputs)

    server = start_server(base_path, enable_batching=False)
    monkeypatch.setattr(servable_module.SignatureRunner, "run", slow)
    results, errors = [], []

    def grpc_call():
        try:
            with ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo", timeout=30, max_retries=0) as client:
                results.append(client.embed(["a b"]))
        except Exception as e:
            errors.append(f"gRPC: {type(e).__name__}: {e}")

    def rest_call():
        body = json.dumps({"instances": ["a b"]}).encode()
        url = f"http://127.0.0.1:{server.rest_port}/v1/models/elmo:predict"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, body), timeout=30) as response:
                results.append(json.loads(response.read()))
        except Exception as e:
            errors.append(f"REST: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=f) for f in (grpc_call, grpc_call, rest_call, rest_call)]
    for t in threads:
        t.start()
    wait_for(lambda: len(entered) == 4, 30, "every call in the model")  # not a fixed sleep: slow machines differ
    start = time.monotonic()
    server.stop(grace=10.0)
    took = time.monotonic() - start
    for t in threads:
        t.join(30)
    print(f"\n[stop with 4 calls in flight] stopped in {took:.2f} s; errors {errors}")
    assert errors == [] and len(results) == 4
    assert took < 10.0


@pytest.fixture
def socket_path():
    """A UNIX socket path short enough for sun_path (108 bytes; pytest's tmp_path can be longer)."""
    directory = tempfile.mkdtemp(prefix="elmo-sock-", dir="/tmp")
    yield os.path.join(directory, "grpc.sock")
    shutil.rmtree(directory, ignore_errors=True)


def test_grpc_on_a_unix_socket_only_or_beside_the_port(base_path, expected, socket_path):
    """Stock listens on "unix:" + --grpc_socket_path (Server::BuildAndStart in server.cc), beside the TCP port or alone
    when the port is 0; a real client over the socket is answered. In this API no TCP port is `port=None` (0 picks a
    free one); neither is stock's error (the same function)."""
    from elmo_tf.serving.options import ServerOptions

    with pytest.raises(ValueError, match="At least one of server_options.grpc_port or server_options.grpc_socket_path"):
        ServerOptions(port=None)
    for port in (None, 0):
        server = start_server(base_path, port=port, grpc_socket_path=socket_path, rest_api_port=None)
        try:
            assert stat.S_ISSOCK(os.stat(socket_path).st_mode)
            assert (server.grpc_port is None) == (port is None)
            with ElmoClient(f"unix:{socket_path}", "elmo", timeout=30, max_retries=0) as c:
                out = c.embed(VALID)
            assert out.model_version == 1
            assert_parity(expected, out)
            if port is not None:
                assert_serves(server, expected)
        finally:
            server.stop(grace=1.0)


def test_rest_on_the_grpc_port_is_skipped_and_grpc_serves(base_path, expected, caplog):
    """Stock: an http_port equal to grpc_port logs "server_options.http_port cannot be same as grpc_port. ..." and
    exports no REST API (Server::BuildAndStart in server.cc); gRPC serves. Ours failed to start with a bind error."""
    port = free_port()
    with caplog.at_level(logging.ERROR, logger="elmo_tf.serving.server"):
        server = start_server(base_path, port=port, rest_api_port=port)
    try:
        assert server.grpc_port == port and server.rest_port is None
        assert messages(caplog, "http_port cannot be same as grpc_port") == [
            "server_options.http_port cannot be same as grpc_port. Please use a different port for HTTP/REST API. "
            "Skipped exporting HTTP/REST API."
        ]
        assert_serves(server, expected)
    finally:
        server.stop(grace=1.0)


def test_a_rest_port_that_cannot_be_bound_is_logged_and_grpc_serves(base_path, expected, caplog):
    """Stock: when the HTTP server cannot start it logs "Failed to start HTTP Server at ..." and BuildAndStart still
    returns OK (server.cc): gRPC serves on. Ours raised OSError (the CLI exited 1)."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    rest_port = taken.getsockname()[1]
    try:
        with caplog.at_level(logging.ERROR, logger="elmo_tf.serving.server"):
            server = start_server(base_path, rest_api_port=rest_port)
        try:
            assert server.rest_port is None and server.grpc_port
            (message,) = messages(caplog, "Failed to start HTTP Server at")
            assert message.startswith(f"Failed to start HTTP Server at 127.0.0.1:{rest_port} ("), message
            assert_serves(server, expected)
        finally:
            server.stop(grace=1.0)
    finally:
        taken.close()


@pytest.fixture(scope="module")
def narrow_base(tmp_path_factory):
    """A SavedModel whose signature takes int8 `x` [-1] and returns y = float(x)."""
    import tensorflow as tf

    class Narrow(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.int8, name="x")])
        def serve(self, x):
            return {"y": tf.cast(x, tf.float32)}

    base = tmp_path_factory.mktemp("narrow") / "elmo"
    module = Narrow()
    tf.saved_model.save(module, str(base / "1"), signatures={"serving_default": module.serve})
    return str(base)


def test_int8_values_beyond_the_dtype_are_narrowed_over_rest_and_grpc(narrow_base):
    """Stock reads a JSON int8 value as any int32 (json_tensor.cc AddValueToTensor, `val.IsInt()`) and a TensorProto's
    int_val into the int8 buffer with a C++ conversion (TensorFlow's tensor.cc, FromProtoField): 300 is 44, -129 is 127.
    Ours refused them over REST, and over gRPC `tf.make_ndarray` raised OverflowError (NumPy 2): INVALID_ARGUMENT
    "tensor parsing error: x"."""
    import tensorflow as tf
    from tensorflow.core.framework import tensor_pb2, types_pb2
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    server = start_server(narrow_base, enable_batching=False)
    try:
        body = json.dumps({"instances": [300, -1, -129, 127]}).encode()
        url = f"http://127.0.0.1:{server.rest_port}/v1/models/elmo:predict"
        with urllib.request.urlopen(urllib.request.Request(url, body), timeout=30) as response:
            assert json.load(response) == {"predictions": [44.0, -1.0, 127.0, 127.0]}
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "elmo"
        proto = tensor_pb2.TensorProto(dtype=types_pb2.DT_INT8, int_val=[300, -1, 2**31 - 1])
        proto.tensor_shape.dim.add(size=4)  # one value fewer than the shape: the last fills it, as FromProtoField
        request.inputs["x"].CopyFrom(proto)
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
        assert tf.make_ndarray(response.outputs["y"]).tolist() == [44.0, -1.0, -1.0, -1.0]
    finally:
        server.stop(grace=1.0)
