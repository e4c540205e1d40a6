"""REST client for ELMo on TF Serving (or the embedded server): `ElmoRestClient`, the methods of the gRPC client
(`client.ElmoClient`) over TF Serving's REST API (`/v1/models/<name>:predict`, columnar "inputs" format).
"""

import base64
import http.client
import json
import threading
import urllib.parse

import grpc
import numpy as np
import orjson

from elmo_tf.saved_model.contract import SENTENCES, SENTENCES_SIGNATURE, SEQUENCE_LEN, TOKENS, TOKENS_SIGNATURE
from elmo_tf.serving.client import Embeddings, sentences_array, tokens_arrays
from elmo_tf.serving.serving_error import GRPC_CODE_OF_HTTP, ServingError


def _loads(data):
    """A JSON response -> Python values: orjson (about 3x Python's json on ELMo's outputs), or Python's json for a
    body holding NaN or Infinity, which orjson refuses."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def _json_strings(array):
    """Object array of bytes -> nested lists of JSON strings ({"b64": ...} where not valid UTF-8)."""

    def one(b):
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            return {"b64": base64.b64encode(b).decode("ascii")}

    return np.vectorize(one, otypes=[object])(array).tolist() if array.size else array.tolist()


class ElmoRestClient:
    """REST client (TF Serving's `/v1/models/<name>:predict`, columnar "inputs" format) with the same methods.

    One keep-alive HTTP connection per thread. JSON has no dtypes: `mask` becomes bool, `sequence_len` and other
    whole-number outputs int32, the rest float32; an empty batch comes back as an empty array without its inner
    dimensions.

    Args:
        base_url: "http://host:8501".
        model_name: as `ElmoClient`.
        signature_name: as `ElmoClient`.
        version: as `ElmoClient`.
        timeout: as `ElmoClient`.
    """

    def __init__(
        self,
        base_url="http://localhost:8501",
        model_name="elmo",
        signature_name=SENTENCES_SIGNATURE,
        version=None,
        timeout=60.0,
    ):
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must look like http://host:port, got {base_url!r}")
        self.base_url = base_url
        self._parts = parts
        self.model_name = model_name
        self.signature_name = signature_name
        self.version = version
        self.timeout = timeout
        self._local = threading.local()

    def _connection(self):
        connection = getattr(self._local, "connection", None)
        if connection is None:
            cls = http.client.HTTPSConnection if self._parts.scheme == "https" else http.client.HTTPConnection
            connection = cls(self._parts.hostname, self._parts.port, timeout=self.timeout)
            self._local.connection = connection
        return connection

    def close(self):
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None

    def _path(self, version, suffix=""):
        version = self.version if version is None else version
        path = f"/v1/models/{urllib.parse.quote(self.model_name, safe='')}"
        if version is not None:
            path += f"/versions/{version}"
        return path + suffix

    def request(self, method, path, body=None):
        """One HTTP request; returns the decoded JSON. Raises `ServingError` (code from the HTTP status)."""
        payload = json.dumps(body, separators=(",", ":")).encode("utf-8") if body is not None else None
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        for attempt in range(2):  # a keep-alive connection the server closed is reopened once
            connection = self._connection()
            try:
                connection.request(method, path, body=payload, headers=headers)
                response = connection.getresponse()
                data = response.read()
                break
            except (
                http.client.RemoteDisconnected,
                ConnectionResetError,
                BrokenPipeError,
                http.client.CannotSendRequest,
            ) as e:
                self.close()
                if attempt:
                    raise ServingError(grpc.StatusCode.UNAVAILABLE, f"{type(e).__name__}: {e}") from None
            except OSError as e:
                self.close()
                raise ServingError(grpc.StatusCode.UNAVAILABLE, f"{type(e).__name__}: {e}") from None
        if response.status != 200:
            try:
                message = json.loads(data)["error"]
            except (ValueError, KeyError, TypeError):
                message = data.decode("utf-8", "replace")
            raise ServingError(
                GRPC_CODE_OF_HTTP.get(response.status, grpc.StatusCode.UNKNOWN), message, http_status=response.status
            )
        return _loads(data)

    def predict(self, inputs, signature_name=None, output_filter=None, version=None):
        body = {
            "signature_name": self.signature_name if signature_name is None else signature_name,
            "inputs": {
                alias: (_json_strings(v) if v.dtype == object else v.tolist())
                for alias, v in ((a, np.asarray(x)) for a, x in inputs.items())
            },
        }
        if output_filter:
            body["output_filter"] = list(output_filter)
        outputs = self.request("POST", self._path(version, ":predict"), body)["outputs"]
        if not isinstance(outputs, dict):  # a single output is written bare
            outputs = {(output_filter or ["output"])[0]: outputs}
        arrays = {}
        for alias, value in outputs.items():
            array = np.asarray(value)
            if alias == "mask":
                array = array.astype(bool)
            elif alias == SEQUENCE_LEN or array.dtype.kind in "iu":
                array = array.astype(np.int32)
            elif array.dtype.kind == "f":
                array = array.astype(np.float32)
            arrays[alias] = array
        return Embeddings(arrays, self.model_name, None, body["signature_name"])

    def embed(self, sentences, output_filter=None, version=None):
        return self.predict({SENTENCES: sentences_array(sentences)}, self.signature_name, output_filter, version)

    def embed_tokens(self, tokens, sequence_len=None, output_filter=None, version=None):
        array, lengths = tokens_arrays(tokens, sequence_len)
        return self.predict({TOKENS: array, SEQUENCE_LEN: lengths}, TOKENS_SIGNATURE, output_filter, version)

    def model_status(self, version=None):
        return self.request("GET", self._path(version))["model_version_status"]

    def metadata(self, version=None):
        return self.request("GET", self._path(version, "/metadata"))
