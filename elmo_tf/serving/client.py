"""Clients for ELMo on TF Serving (or the embedded server): gRPC (`ElmoClient`); REST (`ElmoRestClient`) is
`rest_client`'s, with the same methods.

`ElmoClient` speaks TF Serving's `PredictionService`/`ModelService` with `tensorflow_serving.apis`
(`PredictionServiceStub`, `PredictRequest`, `tf.make_tensor_proto`):
    client = ElmoClient("localhost:8500", model_name="elmo")
    out = client.embed(["The cat sat .", "Dogs bark"])               # signature "default"
    out["elmo"].shape, out["default"].shape, out.model_version       # (2, 3, 1024) (2, 1024) 1
    out = client.embed_tokens([["The", "cat"], ["Dogs"]], output_filter=["elmo", "mask"])   # signature "tokens"
Results are `Embeddings`: a dict output name -> NumPy array (float32 `word_emb`, `lstm_outputs1..L`, `elmo`,
`default`; int32 `sequence_len`; bool `mask`), with the model version and signature that answered.

Deadlines: every call has one (`timeout` seconds, per client or per call), covering its retries.
Retries: only UNAVAILABLE (server not up yet, restarting, connection lost) is retried, `max_retries` times with
exponential backoff and jitter (`initial_backoff` doubled up to `max_backoff`), within the deadline. Every other
status fails at once.
Message size: gRPC's 4 MiB default is too small for ELMo (16 sentences of 400 tokens with all outputs of the
original model are about 92 MB), so the channel's send and receive limits are `max_message_bytes` (256 MiB by
default; the embedded server uses the same default, stock TF Serving accepts up to 2 GiB). Ask only for the
outputs you need with `output_filter` to keep responses small.
Errors: a failed call raises `ServingError` with `.code` (a `grpc.StatusCode`) and `.details` (the server's message).
"""

import random
import time

import grpc
import numpy as np
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from elmo_tf.bounds import INT32_MAX
from elmo_tf.errors import check_int
from elmo_tf.saved_model.contract import SENTENCES, SENTENCES_SIGNATURE, SEQUENCE_LEN, TOKENS, TOKENS_SIGNATURE
from elmo_tf.serving.serving_error import ServingError, status_code

DEFAULT_MAX_MESSAGE_BYTES = 256 << 20


class Embeddings(dict):
    """Output name -> NumPy array, plus `model_name`, `model_version` and `signature_name` of the answer."""

    def __init__(self, arrays, model_name=None, model_version=None, signature_name=None):
        super().__init__(arrays)
        self.model_name = model_name
        self.model_version = model_version
        self.signature_name = signature_name


def _to_bytes(value, what):
    if isinstance(value, bytes):
        return value
    if isinstance(value, np.bytes_):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"{what} must be str or bytes, got {type(value).__name__}: {value!r}")


def sentences_array(sentences):
    """A list of sentences (str/bytes) -> object array of UTF-8 bytes `(batch,)`."""
    if isinstance(sentences, (str, bytes)):
        raise TypeError(
            f"sentences must be a list of strings, got a single {type(sentences).__name__}; wrap it in a list"
        )
    items = (
        [_to_bytes(s, "each sentence") for s in np.asarray(sentences, dtype=object).reshape(-1)]
        if isinstance(sentences, np.ndarray)
        else [_to_bytes(s, "each sentence") for s in sentences]
    )
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


def tokens_arrays(tokens, sequence_len=None):
    """Token lists (ragged, or padded with "") -> (object array of bytes `(batch, width)`, int32 `(batch,)`).

    Without `sequence_len`, each row's length is its number of tokens up to its last non-empty one
    (trailing "" are padding).
    """
    if isinstance(tokens, (str, bytes)):
        raise TypeError("tokens must be a list of token lists, got a single string")
    rows = [[_to_bytes(t, "each token") for t in row] for row in tokens]
    if any(isinstance(row, (str, bytes)) for row in tokens):
        raise TypeError("tokens must be a list of token lists (one list per sentence), got a list of strings")
    width = max((len(row) for row in rows), default=0)
    array = np.full((len(rows), width), b"", dtype=object)
    for k, row in enumerate(rows):
        array[k, : len(row)] = row
    if sequence_len is None:
        lengths = [max((i + 1 for i, t in enumerate(row) if t != b""), default=0) for row in rows]
    else:
        lengths = sequence_len
    lengths = np.asarray(lengths)
    if lengths.shape != (len(rows),) or (lengths.size and lengths.dtype.kind not in "iu"):
        raise ValueError(f"sequence_len must hold one integer per sentence ({len(rows)}), got {sequence_len!r}")
    return array, lengths.astype(np.int32)


def _tensor_proto(value):
    if isinstance(value, tensor_pb2.TensorProto):
        return value
    array = np.asarray(value)
    if array.dtype.kind in "OSU":
        flat = np.empty(array.size, dtype=object)
        flat[:] = [_to_bytes(v, "each string") for v in array.reshape(-1)]
        return tf.make_tensor_proto(flat.reshape(array.shape), dtype=tf.string, shape=array.shape)
    return tf.make_tensor_proto(array)


def tls_credentials(ca=None, cert=None, key=None):
    """`grpc.ChannelCredentials` for a server on TLS (`--ssl_config_file`): `ca`, a PEM file of the CAs to trust (None:
    the system's); `cert` and `key`, PEM files of this client's certificate and key, for a server that verifies
    clients (`client_verify: true`). ValueError naming the argument for a missing or unreadable file, or a cert
    without its key.

    Example:
        client = ElmoClient("elmo.internal:8500", credentials=tls_credentials(ca="ca.pem"))
    """
    if (cert is None) != (key is None):
        raise ValueError("cert and key go together: the client's certificate and its private key")
    pems = {}
    for name, path in (("ca", ca), ("cert", cert), ("key", key)):
        if path is None:
            pems[name] = None
            continue
        try:
            with open(path, "rb") as f:
                pems[name] = f.read(1 << 20)
        except OSError as e:
            raise ValueError(f"{name}: cannot read {path!r}: {e.strerror}") from None
        if b"-----BEGIN " not in pems[name]:
            raise ValueError(f"{name}: {path!r} holds no PEM block (-----BEGIN ...)")
    return grpc.ssl_channel_credentials(
        root_certificates=pems["ca"], private_key=pems["key"], certificate_chain=pems["cert"]
    )


class ElmoClient:
    """gRPC client for an ELMo SavedModel on TF Serving or `serving/serve.py`.

    Args:
        target: "host:port" of the gRPC API.
        model_name: the served model's name (`--model_name`).
        signature_name: the sentence signature `embed` calls ("default"; "serving_default" is the same function).
        version: ask for this version (NOT_FOUND unless it is served); None for the latest.
        timeout: default deadline of each call, seconds (retries included).
        max_message_bytes: gRPC max send and receive message size of the channel.
        max_retries: retries of a call that failed with UNAVAILABLE (0: none).
        initial_backoff: seconds before the first retry, doubled per retry up to `max_backoff`, each multiplied
            by a random factor in [0.5, 1].
        max_backoff: the most seconds between retries.
        credentials: `grpc.ChannelCredentials` for TLS (`tls_credentials`); None for an insecure channel.
        channel_options: extra gRPC channel options, list of (key, value).
    """

    def __init__(
        self,
        target="localhost:8500",
        model_name="elmo",
        signature_name=SENTENCES_SIGNATURE,
        version=None,
        timeout=60.0,
        max_message_bytes=DEFAULT_MAX_MESSAGE_BYTES,
        max_retries=3,
        initial_backoff=0.1,
        max_backoff=2.0,
        credentials=None,
        channel_options=(),
    ):
        if not timeout or timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        max_retries = check_int("max_retries", max_retries, 0)
        max_message_bytes = check_int("max_message_bytes", max_message_bytes, 1, maximum=INT32_MAX)  # a gRPC limit
        version = check_int("version", version, 0, allow_none=True)
        self.target = target
        self.model_name = model_name
        self.signature_name = signature_name
        self.version = version
        self.timeout = timeout
        self.max_retries = max_retries
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        options = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            *channel_options,
        ]
        self.channel = (
            grpc.secure_channel(target, credentials, options=options)
            if credentials is not None
            else grpc.insecure_channel(target, options=options)
        )
        self._predict = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        self._models = model_service_pb2_grpc.ModelServiceStub(self.channel)
        self._random = random.Random()

    def close(self):
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------------------------------------ calls

    def _call(self, method, request, timeout):
        """Calls `method(request)` within `timeout` seconds, retrying UNAVAILABLE; raises `ServingError`."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ServingError(
                    grpc.StatusCode.DEADLINE_EXCEEDED, f"deadline of {timeout:.3f} s exceeded after {attempt} attempts"
                )
            try:
                return method(request, timeout=remaining)
            except grpc.RpcError as e:
                code = e.code() if callable(getattr(e, "code", None)) else grpc.StatusCode.UNKNOWN
                details = e.details() if callable(getattr(e, "details", None)) else str(e)
                if code != grpc.StatusCode.UNAVAILABLE or attempt >= self.max_retries:
                    raise ServingError(code, details or code.name) from None
                pause = min(self.initial_backoff * 2**attempt, self.max_backoff) * self._random.uniform(0.5, 1.0)
                time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
                attempt += 1

    def _model_spec(self, spec, version, signature_name=None):
        spec.name = self.model_name
        version = self.version if version is None else version
        if version is not None:
            spec.version.value = version
        if signature_name is not None:
            spec.signature_name = signature_name

    def predict(self, inputs, signature_name=None, output_filter=None, timeout=None, version=None):
        """Any signature: `inputs` {alias: array-like or TensorProto} -> `Embeddings` {alias: NumPy array}.

        Strings (str/bytes, any nesting) become DT_STRING; NumPy arrays keep their dtype (use int32 for
        `sequence_len`).
        """
        request = predict_pb2.PredictRequest()
        self._model_spec(request.model_spec, version, self.signature_name if signature_name is None else signature_name)
        for alias, value in inputs.items():
            request.inputs[alias].CopyFrom(_tensor_proto(value))
        if output_filter:
            if isinstance(output_filter, str):
                raise TypeError("output_filter must be a list of output names, got a single string")
            request.output_filter.extend(output_filter)
        response = self._call(self._predict.Predict, request, timeout)
        return Embeddings(
            {alias: tf.make_ndarray(proto) for alias, proto in response.outputs.items()},
            response.model_spec.name,
            response.model_spec.version.value,
            response.model_spec.signature_name,
        )

    def embed(self, sentences, output_filter=None, timeout=None, version=None):
        """Sentences (list of str/bytes, tokenized by the model) -> `Embeddings` of the sentence signature.

        Outputs have shape `(batch, T, ...)`, T the longest sentence in tokens; an empty list is a valid batch.
        """
        return self.predict(
            {SENTENCES: sentences_array(sentences)}, self.signature_name, output_filter, timeout, version
        )

    def embed_tokens(self, tokens, sequence_len=None, output_filter=None, timeout=None, version=None):
        """Pre-tokenized sentences (list of token lists; ragged, or padded with "") -> `Embeddings` of "tokens".

        Args:
            tokens: one list of str/bytes tokens per sentence.
            sequence_len: real tokens per sentence; default: up to each row's last non-empty token.
        Outputs have shape `(batch, width, ...)`, width the longest row of `tokens`.
        """
        array, lengths = tokens_arrays(tokens, sequence_len)
        return self.predict({TOKENS: array, SEQUENCE_LEN: lengths}, TOKENS_SIGNATURE, output_filter, timeout, version)

    def model_status(self, version=None, timeout=None):
        """GetModelStatus: list of {"version", "state", "error_code", "error_message"}, highest version first."""
        request = get_model_status_pb2.GetModelStatusRequest()
        self._model_spec(request.model_spec, version)
        response = self._call(self._models.GetModelStatus, request, timeout)
        states = get_model_status_pb2.ModelVersionStatus.State
        return [
            {
                "version": s.version,
                "state": states.Name(s.state),
                "error_code": status_code(s.status.error_code).name,
                "error_message": s.status.error_message,
            }
            for s in response.model_version_status
        ]

    def metadata(self, version=None, timeout=None):
        """GetModelMetadata: {"model_name", "model_version", "signatures": {name: {"inputs": {alias: {"dtype",
        "shape"}}, "outputs": {...}, "method_name"}}}: dtypes as "DT_FLOAT", shapes with -1 for dynamic dims."""
        request = get_model_metadata_pb2.GetModelMetadataRequest()
        self._model_spec(request.model_spec, version)
        request.metadata_field.append("signature_def")
        response = self._call(self._predict.GetModelMetadata, request, timeout)
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(signature_map)

        def describe(infos):
            return {
                alias: {
                    "dtype": types_pb2.DataType.Name(info.dtype),
                    "shape": None if info.tensor_shape.unknown_rank else [d.size for d in info.tensor_shape.dim],
                }
                for alias, info in sorted(infos.items())
            }

        return {
            "model_name": response.model_spec.name,
            "model_version": response.model_spec.version.value,
            "signatures": {
                name: {"inputs": describe(sig.inputs), "outputs": describe(sig.outputs), "method_name": sig.method_name}
                for name, sig in sorted(signature_map.signature_def.items())
            },
        }

    def wait_for_model(self, timeout=60.0, version=None):
        """Waits until a version (or `version`) is AVAILABLE; returns the status list. Raises `ServingError`
        (DEADLINE_EXCEEDED) after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                status = self.model_status(timeout=max(0.1, min(5.0, deadline - time.monotonic())))
                if any(s["state"] == "AVAILABLE" and (version is None or s["version"] == version) for s in status):
                    return status
                last = status
            except ServingError as e:
                if e.code not in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.NOT_FOUND,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                ):
                    raise
                last = e
            time.sleep(0.1)
        raise ServingError(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"model {self.model_name} not available at {self.target} after {timeout} s (last: {last})",
        )
