"""TF Serving's REST API, transport-free: (method, path, body) -> (HTTP status, JSON pieces) over a `core.ServerCore`.

Endpoints (as TF Serving's `http_rest_api_handler.cc` and `http_rest_api_util.cc`: the path is matched as it was
sent, still percent-encoded and with its query, case-insensitively; the model name and a version label are then
percent-decoded; a version is ASCII digits read as an int64):
    GET  /v1/models/<name>[/versions/<v>|/labels/<l>]           GetModelStatus as JSON (a label is ignored: every
                                                                version, as stock's get_model_status_impl.cc):
         {"model_version_status": [{"version": "2", "state": "AVAILABLE",
                                    "status": {"error_code": "OK", "error_message": ""}}]}
    GET  /v1/models/<name>[/versions/<v>|/labels/<l>]/metadata  GetModelMetadata as JSON:
         {"model_spec": {"name": ..., "signature_name": "", "version": "2"},
          "metadata": {"signature_def": {"signature_def": {"default": {"inputs": ..., "outputs": ...,
                                                                        "method_name": ...}, ...}}}}
    POST /v1/models/<name>[/versions/<v>|/labels/<l>]:predict   Predict; body (JSON object):
         {"signature_name": "tokens",                      optional, default "serving_default"
          "instances": [...]  or  "inputs": {...},         row or columnar format (exactly one of them, see
                                                           `json_tensor`)
          "output_filter": ["elmo", "sequence_len"]}       optional; an extension of the embedded server
                                                           (stock TF Serving's REST API returns all outputs)
    POST /v1/models/<name>[...]:classify, :regress         checked as stock checks them (`inference`): ELMo's
                                                           signatures are not classification or regression
                                                           signatures (400); one that is would be 501
    GET  /monitoring/prometheus/metrics                    the batching counters, Prometheus text format

Errors: {"error": "<message>"} with the HTTP status of the gRPC code (`status.HTTP_STATUS`: 400 INVALID_ARGUMENT and
FAILED_PRECONDITION, 404 NOT_FOUND, 429 RESOURCE_EXHAUSTED, 501 UNIMPLEMENTED, 500 INTERNAL, 504 DEADLINE_EXCEEDED),
TF Serving's texts: an unknown signature is 400 `Serving signature name: "x" not found in signature def`
(http_rest_api_handler.cc `HttpRestApiHandler::GetInfoMap`), a version label the model does not have 400 `Unrecognized
servable version label: x` (server_core.cc `ServerCore::GetModelVersionForLabel`; a label is resolved to its version by
`core.ServerCore.resolve`), a path that is not an endpoint 400 `Malformed request: POST <path>`; a CORS preflight
(OPTIONS) 200 with an Origin of http(s)://..., else 400 (http_server.cc `RestApiRequestDispatcher::ProcessRequest`).
Internal errors show the client no server detail (the traceback goes to the server log).
"""

import json
import logging
import re
import time
import urllib.parse

import grpc
from google.protobuf import json_format
from tensorflow_serving.apis import get_model_metadata_pb2

from elmo_tf.bounds import INT64_MAX
from elmo_tf.serving.metrics import CONTENT_TYPE
from elmo_tf.serving.rest.json_examples import check_examples
from elmo_tf.serving.rest.json_tensor import decode_request, max_json_values, parse_json, signature_name
from elmo_tf.serving.rest.rest_json import error_body, outputs_to_json
from elmo_tf.serving.serving_error import (
    SIGNATURE_DEF_FIELD,
    ServingError,
    failed_precondition,
    invalid_argument,
    not_found,
)

logger = logging.getLogger(__name__)

# http_rest_api_util.cc kPathRegex; RE2's \d is ASCII only, Python's is not: [0-9]
PREDICT_PATH = re.compile(
    r"(?i)/v1/models/([^/:]+)(?:(?:/versions/([0-9]+))|(?:/labels/([^/:]+)))?:(classify|regress|predict)"
)
STATUS_PATH = re.compile(
    r"(?i)/v1/models(?:/([^/:]+))?(?:(?:/versions/([0-9]+))|(?:/labels/([^/:]+)))?(?:/(metadata))?"
)
API_PATH = re.compile(r"(?i)/v1/.*")


def _parse_version(text):
    """`absl::SimpleAtoi` of a path's version (ASCII digits, leading zeros allowed) as an int64
    (http_rest_api_util.cc `ParseModelInfo`)."""
    if not text:
        return None
    digits = text.lstrip("0")
    if len(digits) > 19 or int(digits or "0") > INT64_MAX:  # no int() of thousands of digits
        raise invalid_argument(f"Failed to convert version: {text} to numeric.")
    return int(digits or "0")


def _decode(text):
    """`DecodeArg` (http_rest_api_util.cc): percent-decoding as curl_easy_unescape ("+" stays "+")."""
    return urllib.parse.unquote(text, errors="replace") if text else text


def _signature_name_not_found(name):
    return invalid_argument(f'Serving signature name: "{name}" not found in signature def')


class RestApi:
    """Routes (method, path, body) to the core and renders JSON; transport-free, so it is testable alone.

    Args:
        core: the `core.ServerCore`.
        timeout: seconds a predict may wait for the model when `handle` is given no deadline.
        max_response_bytes: the JSON response limit (`max_message_bytes`).
    """

    def __init__(self, core, timeout, max_response_bytes):
        self.core = core
        self.timeout = timeout
        self.max_response_bytes = max_response_bytes
        self.max_json_values = max_json_values(core.options.limits)  # a body of more is refused unparsed

    def handle(self, method, path, body, deadline=None, cancelled=None, origin=""):
        """Returns (HTTP status, response byte pieces, content type). `path`: the request target as sent (still
        percent-encoded, with its query); `deadline`: `time.monotonic()` by which the model call must have started;
        `cancelled`: callable, True once the client has gone; `origin`: the Origin header (CORS preflight)."""
        metrics_path = self.core.options.prometheus_path
        if metrics_path is not None and method == "GET" and path.split("?", 1)[0] == metrics_path:
            return 200, [self.core.metrics.exposition()], CONTENT_TYPE
        started = time.monotonic()
        model_name, api = self._model_of(method, path)
        status, parts, content_type, code = self._answer(method, path, body, deadline, cancelled, origin)
        if model_name is not None:  # http_server.cc ProcessRequest: every model request counted, a success timed
            self.core.metrics.record_request(model_name, code)
            if status == 200 and api:
                self.core.metrics.record_latency(model_name, api, "REST", time.monotonic() - started)
        return status, parts, content_type

    @staticmethod
    def _model_of(method, path):
        """(model name, API verb or "") of a request under /v1/models/ (stock names the model for any of them), or
        (None, None)."""
        match = PREDICT_PATH.fullmatch(path) if method == "POST" else STATUS_PATH.fullmatch(path)
        if match is None:
            return None, None
        try:
            name = _decode(match.group(1)) or ""
        except ServingError:
            return None, None
        return name, (match.group(4).lower() if method == "POST" else "")

    def _answer(self, method, path, body, deadline, cancelled, origin):
        """(HTTP status, pieces, content type, gRPC code or None for OK)."""
        try:
            if not API_PATH.fullmatch(path):
                raise not_found(f"Not found: {method} {path[:200]} (the API is under /v1/models/)")
            if method == "OPTIONS":  # a CORS preflight: http_server.cc RestApiRequestDispatcher::ProcessRequest
                if not re.search(r"https?://", origin or ""):
                    raise failed_precondition("Origin header is missing in CORS preflight")
                return 200, [], "text/plain", None  # stock: an empty answer without its JSON header
            return 200, self._route(method, path, body, deadline, cancelled), "application/json", None
        except ServingError as e:
            logger.debug("%s %s: %s %s", method, path, e.code.name, e.details)
            return e.http_status, [error_body(e.details)], "application/json", e.code
        except MemoryError:
            logger.error("%s %s: out of memory", method, path)
            body = [error_body("out of memory: send fewer or shorter sentences")]
            return 429, body, "application/json", grpc.StatusCode.RESOURCE_EXHAUSTED
        except Exception as e:
            logger.exception("%s %s failed", method, path)
            body = [error_body(f"internal error ({type(e).__name__}; see the server log)")]
            return 500, body, "application/json", grpc.StatusCode.INTERNAL

    def _route(self, method, path, body, deadline, cancelled):
        """`HttpRestApiHandler::ProcessRequest` (http_rest_api_handler.cc): the response's byte pieces."""
        match = PREDICT_PATH.fullmatch(path) if method == "POST" else None
        if match:
            name, version, label, verb = match.groups()
            name, version, label = _decode(name), _parse_version(version), _decode(label)
            if verb.lower() == "predict":
                return self.predict(name, version, body, deadline, cancelled, label)
            return [self.infer(name, version, label, verb.lower(), body)]
        match = STATUS_PATH.fullmatch(path) if method == "GET" else None
        if match:
            name, version, label, metadata = match.groups()
            name, version, label = _decode(name) or "", _parse_version(version), _decode(label)
            if not name:
                raise invalid_argument("Missing model name in request.")
            text = self.metadata(name, version, label) if metadata else self.status(name, version)
            return [text.encode("utf-8")]
        raise invalid_argument(f"Malformed request: {method} {path}")

    def predict(self, name, version, body, deadline=None, cancelled=None, label=None):
        """`ProcessPredictRequest`: JSON errors first, then the model spec and signature, then the inputs."""
        doc = parse_json(body, self.max_json_values)
        signature = signature_name(doc)
        output_filter = doc.get("output_filter", [])
        if not isinstance(output_filter, list) or not all(isinstance(x, str) for x in output_filter):
            raise invalid_argument("'output_filter' must be a list of output names")
        timeout = self.timeout if deadline is None else deadline - time.monotonic()  # <= 0: not run (504)
        _, _, outputs = self.core.predict(
            name,
            version,
            signature,
            lambda budget: decode_request(doc, budget),
            tuple(output_filter),
            timeout=timeout,
            cancelled=cancelled,
            response_encoding="json",
            label=label,
            signature_not_found=_signature_name_not_found,
        )
        row_format = "instances" in doc
        doc.clear()  # the request's values are not needed while the response is written
        return outputs_to_json(outputs, row_format, self.max_response_bytes)

    def infer(self, name, version, label, method, body):
        """`ProcessClassifyRequest` / `ProcessRegressRequest`: the body, then the model and signature (raises)."""
        doc = parse_json(body, self.max_json_values)
        signature = signature_name(doc)
        check_examples(doc)
        self.core.infer(name, version, label, method, signature)
        raise AssertionError("ServerCore.infer returned")  # it always raises

    def status(self, name, version):
        response = self.core.model_status(name, version)
        return json.dumps(json_format.MessageToDict(response, always_print_fields_with_no_presence=True), indent=1)

    def metadata(self, name, version, label=None):
        response = self.core.model_metadata(name, version, label)
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        response.metadata[SIGNATURE_DEF_FIELD].Unpack(signature_map)
        options = dict(always_print_fields_with_no_presence=True, preserving_proto_field_name=True)
        return json.dumps(
            {
                "model_spec": json_format.MessageToDict(response.model_spec, **options),
                "metadata": {SIGNATURE_DEF_FIELD: json_format.MessageToDict(signature_map, **options)},
            },
            indent=1,
        )
