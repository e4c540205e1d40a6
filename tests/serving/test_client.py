"""elmo_tf/serving/client.py: ElmoClient against the embedded server over gRPC (parity with the Keras model,
output_filter, status/metadata, errors, retries on UNAVAILABLE only, deadlines, message size)."""

import re
import time

import grpc
import numpy as np
import pytest
from serving_testlib import assert_parity, free_port, reference_sentences, reference_tokens

from elmo_tf.errors import ElmoTFError
from elmo_tf.serving.client import ElmoClient, tokens_arrays
from elmo_tf.serving.serving_error import ServingError

SENTENCES = [
    "The cat sat on the mat .",
    "Dogs are in the fog , aren't they ?",
    "ELMo",
    "",
    "Zürich , 2018 : naïve café !",
]
TOKENS = [["The", "cat", "sat"], ["Dogs"], [], ["naïve", "café", "!", "x" * 60]]


def test_embed_matches_keras(client, model):
    out = client.embed(SENTENCES)
    assert_parity(reference_sentences(model, SENTENCES), out)
    assert (out.model_name, out.model_version, out.signature_name) == ("elmo", 1, "default")


def test_embed_serving_default_signature_is_the_same(server, model):
    with ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo", signature_name="serving_default") as c:
        out = c.embed(SENTENCES[:2])
    assert out.signature_name == "serving_default"
    assert_parity(reference_sentences(model, SENTENCES[:2]), out)


def test_embed_tokens_matches_keras(client, model):
    out = client.embed_tokens(TOKENS)
    assert out.signature_name == "tokens"
    assert_parity(reference_tokens(model, TOKENS), out)


def test_embed_tokens_ignores_tokens_beyond_sequence_len(client, model):
    out = client.embed_tokens([["a", "b", "junk"], ["c", "junk", "junk"]], sequence_len=[2, 1])
    expected = reference_tokens(model, [["a", "b"], ["c"]])
    # the output keeps the width of the tokens input (3); positions beyond each length are zeros
    assert out["elmo"].shape[1] == 3
    np.testing.assert_allclose(out["elmo"][:, :2], expected["elmo"], atol=1e-5)
    assert not out["mask"][:, 2].any() and not out["elmo"][:, 2].any()
    np.testing.assert_array_equal(out["sequence_len"], [2, 1])


def test_tokens_arrays_trailing_empty_tokens_are_padding():
    array, lengths = tokens_arrays([["a", "", "b", ""], [""], ["c"]])
    assert array.shape == (3, 4)
    np.testing.assert_array_equal(lengths, [3, 0, 1])
    with pytest.raises(ValueError, match="sequence_len"):
        tokens_arrays([["a"]], sequence_len=[1, 2])
    with pytest.raises(TypeError, match="list of token lists"):
        tokens_arrays(["a", "b"])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_retries=-1), "max_retries must be an int >= 0, got -1"),
        (dict(max_retries=2.0), "max_retries must be an int >= 0, got 2.0"),
        (dict(max_message_bytes=0), "max_message_bytes must be an int in [1, 2147483647], got 0"),
        (dict(max_message_bytes=2**31), "max_message_bytes must be an int in [1, 2147483647], got 2147483648"),
        (dict(max_message_bytes=True), "max_message_bytes must be an int in [1, 2147483647], got True"),  # was 1 byte
        (dict(version=-1), "version must be None or an int >= 0, got -1"),
        (dict(version="2"), "version must be None or an int >= 0, got '2'"),
    ],
)
def test_constructor_refuses_bad_numbers_naming_the_argument(kwargs, message):
    with pytest.raises(ElmoTFError, match=re.escape(message)) as info:
        ElmoClient("127.0.0.1:1", **kwargs)
    assert info.value.key == next(iter(kwargs))


def test_constructor_takes_numpy_integers_as_ints():
    with ElmoClient("127.0.0.1:1", version=np.int64(3), max_retries=np.int32(2), max_message_bytes=np.int64(1024)) as c:
        assert (c.version, c.max_retries) == (3, 2) and type(c.version) is int and type(c.max_retries) is int


def test_output_filter_returns_only_those(client, model):
    out = client.embed(SENTENCES[:2], output_filter=["elmo", "sequence_len"])
    assert_parity(reference_sentences(model, SENTENCES[:2]), out, keys=["elmo", "sequence_len"])


def test_single_string_is_rejected_before_sending(client):
    with pytest.raises(TypeError, match="wrap it in a list"):
        client.embed("The cat sat .")
    with pytest.raises(TypeError, match="output_filter"):
        client.embed(["a"], output_filter="elmo")


def test_model_status_and_metadata(client):
    assert client.model_status() == [{"version": 1, "state": "AVAILABLE", "error_code": "OK", "error_message": ""}]
    meta = client.metadata()
    assert (meta["model_name"], meta["model_version"]) == ("elmo", 1)
    signatures = meta["signatures"]
    assert {"default", "serving_default", "tokens"} <= set(signatures)
    assert signatures["default"]["inputs"] == {"sentences": {"dtype": "DT_STRING", "shape": [-1]}}
    assert signatures["tokens"]["inputs"] == {
        "sequence_len": {"dtype": "DT_INT32", "shape": [-1]},
        "tokens": {"dtype": "DT_STRING", "shape": [-1, -1]},
    }
    assert signatures["tokens"]["outputs"]["elmo"] == {"dtype": "DT_FLOAT", "shape": [-1, -1, 64]}
    assert signatures["default"]["outputs"]["mask"] == {"dtype": "DT_BOOL", "shape": [-1, -1]}


@pytest.mark.parametrize(
    "kwargs, call, match",
    [
        (dict(model_name="nope"), lambda c: c.embed(["a"]), r"Servable not found for request: Latest\(nope\)"),
        (dict(version=7), lambda c: c.embed(["a"]), r"Specific\(elmo, 7\)"),
        (dict(version=9), lambda c: c.model_status(), "Could not find version 9 of model elmo"),
        (dict(model_name="nope"), lambda c: c.metadata(), r"Latest\(nope\)"),
    ],
)
def test_not_found_errors_carry_code_and_message(server, kwargs, call, match):
    with ElmoClient(f"127.0.0.1:{server.grpc_port}", **{"model_name": "elmo", **kwargs}) as c:
        with pytest.raises(ServingError, match=match) as info:
            call(c)
    assert info.value.code == grpc.StatusCode.NOT_FOUND
    assert info.value.http_status == 404


def test_unknown_signature_is_failed_precondition(server):
    """Stock TF Serving: predict_util.cc RunPredict, FAILED_PRECONDITION `Serving signature key "nope" not found.` (was
    NOT_FOUND here before issue 27); a client sees HTTP 400 for it, as the REST API answers."""
    with ElmoClient(f"127.0.0.1:{server.grpc_port}", model_name="elmo", signature_name="nope") as c:
        with pytest.raises(ServingError) as info:
            c.embed(["a"])
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.details == 'Serving signature key "nope" not found.'
    assert info.value.http_status == 400


class _FakeRpcError(grpc.RpcError):
    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return f"fake {self._code.name}"


def test_retries_unavailable_only_and_boundedly(client):
    calls = []

    def flaky(request, timeout):
        calls.append(timeout)
        if len(calls) < 3:
            raise _FakeRpcError(grpc.StatusCode.UNAVAILABLE)
        return "ok"

    client.initial_backoff = 0.01
    assert client._call(flaky, None, timeout=5) == "ok"
    assert len(calls) == 3 and all(0 < t <= 5 for t in calls)

    calls.clear()

    def invalid(request, timeout):
        calls.append(timeout)
        raise _FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT)

    with pytest.raises(ServingError, match="fake INVALID_ARGUMENT") as info:
        client._call(invalid, None, timeout=5)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT and len(calls) == 1  # never retried

    calls.clear()

    def down(request, timeout):
        calls.append(timeout)
        raise _FakeRpcError(grpc.StatusCode.UNAVAILABLE)

    with pytest.raises(ServingError) as info:
        client._call(down, None, timeout=5)
    assert info.value.code == grpc.StatusCode.UNAVAILABLE and len(calls) == client.max_retries + 1


def test_no_server_gives_unavailable_after_retries():
    start = time.monotonic()
    with ElmoClient(f"127.0.0.1:{free_port()}", "elmo", max_retries=2, initial_backoff=0.05, timeout=10) as c:
        with pytest.raises(ServingError) as info:
            c.embed(["a"])
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - start < 8


def test_deadline_exceeded(client):
    with pytest.raises(ServingError) as info:
        client.embed([" ".join(["w"] * 300)] * 32, timeout=0.001)
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_large_response_needs_raised_message_limit(server, client, model):
    """16 sentences x 400 tokens with all outputs (about 5.7 MB) exceed gRPC's 4 MiB default."""
    sentences = [" ".join(f"w{k}t{i}" for i in range(400)) for k in range(16)]
    out = client.embed(sentences)
    assert sum(v.nbytes for v in out.values()) > 4 << 20
    assert_parity(reference_sentences(model, sentences), out)
    with ElmoClient(f"127.0.0.1:{server.grpc_port}", "elmo", max_message_bytes=4 << 20) as small:
        with pytest.raises(ServingError) as info:
            small.embed(sentences)
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
