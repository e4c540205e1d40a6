"""TF Serving's REST API, transport-free: (method, path, body) -> (HTTP status, JSON pieces) over a `core.ServerCore`.

Endpoints (as TF Serving's `http_rest_api_handler`; model names are URL-decoded, paths are case-insensitive):
    GET  /v1/models/<name>[/versions/<v>]             GetModelStatus as JSON:
         {"model_version_status": [{"version": "2", "state": "AVAILABLE",
                                    "status": {"error_code": "OK", "error_message": ""}}]}
    GET  /v1/models/<name>[/versions/<v>]/metadata    GetModelMetadata as JSON:
         {"model_spec": {"name": ..., "signature_name": "", "version": "2"},
          "metadata": {"signature_def": {"signature_def": {"default": {"inputs": ..., "outputs": ...,
                                                                        "method_name": ...}, ...}}}}
    POST /v1/models/<name>[/versions/<v>]:predict     Predict; body (JSON object):
         {"signature_name": "tokens",                      optional, default "serving_default"
          "instances": [...]  or  "inputs": {...},         row or columnar format (exactly one of them, see
                                                           `rest_json`)
          "output_filter": ["elmo", "sequence_len"]}       optional; an extension of the embedded server
                                                           (stock TF Serving's REST API returns all outputs)
    GET  /monitoring/prometheus/metrics                    the batching counters, Prometheus text format

Errors: {"error": "<message>"} with the HTTP status of the gRPC code (`status.HTTP_STATUS`: 400 INVALID_ARGUMENT,
404 NOT_FOUND, 429 RESOURCE_EXHAUSTED, 501 UNIMPLEMENTED, 500 INTERNAL, 504 DEADLINE_EXCEEDED). Malformed JSON of any
nesting depth is a 400. Classify and Regress answer 501; version labels answer 404 (the embedded server has none).
Internal errors show the client no server detail (the traceback goes to the server log).
"""

import functools
import json
import logging
import re
import time

import grpc
from google.protobuf import json_format
from tensorflow_serving.apis import get_model_metadata_pb2

from elmo_tf.serving.rest_json import decode_inputs, decode_instances, error_body, outputs_to_json, short_json
from elmo_tf.serving.status import SIGNATURE_DEF_FIELD, ServingError, invalid_argument, not_found

logger = logging.getLogger(__name__)

PREDICT_PATH = re.compile(r"(?i)/v1/models/([^/:]+)(?:/versions/(\d+)|/labels/([^/:]+))?:(classify|regress|predict)")
STATUS_PATH = re.compile(r"(?i)/v1/models(?:/([^/:]+))?(?:/versions/(\d+)|/labels/([^/:]+))?(?:/(metadata))?")
API_PATH = re.compile(r"(?i)/v1/.*")
METRICS_PATH = "/monitoring/prometheus/metrics"


def _parse_version(text):
    if text is None:
        return None
    if len(text) > 19 or int(text) >= 2**63:
        raise invalid_argument(f"Failed to convert version: {text[:40]} to numeric.")
    return int(text)


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

    def handle(self, method, path, body, deadline=None, cancelled=None):
        """Returns (HTTP status, response byte pieces, content type). `deadline`: `time.monotonic()` by which the
        model call must have started; `cancelled`: callable, True once the client has gone."""
        try:
            if method == "GET" and path == METRICS_PATH:
                return 200, [self.metrics().encode("utf-8")], "text/plain; version=0.0.4"
            if not API_PATH.fullmatch(path):
                raise not_found(f"Not found: {method} {path[:200]} (the API is under /v1/models/)")
            match = PREDICT_PATH.fullmatch(path) if method == "POST" else None
            if match:
                name, version, label, verb = match.groups()
                if label:
                    raise not_found(f"Unrecognized servable version label: {label} (this server has no labels)")
                if verb.lower() != "predict":
                    raise ServingError(
                        grpc.StatusCode.UNIMPLEMENTED, f"{verb} is not implemented by the embedded server; use :predict"
                    )
                return 200, self.predict(name, _parse_version(version), body, deadline, cancelled), "application/json"
            match = STATUS_PATH.fullmatch(path) if method == "GET" else None
            if match:
                name, version, label, metadata = match.groups()
                if not name:
                    raise invalid_argument("Missing model name in request.")
                if label:
                    raise not_found(f"Unrecognized servable version label: {label} (this server has no labels)")
                version = _parse_version(version)
                text = self.metadata(name, version) if metadata else self.status(name, version)
                return 200, [text.encode("utf-8")], "application/json"
            raise invalid_argument(f"Malformed request: {method} {path[:200]}")
        except ServingError as e:
            logger.debug("%s %s: %s %s", method, path, e.code.name, e.details)
            return e.http_status, [error_body(e.details)], "application/json"
        except MemoryError:
            logger.error("%s %s: out of memory", method, path)
            return 429, [error_body("out of memory: send fewer or shorter sentences")], "application/json"
        except Exception as e:
            logger.exception("%s %s failed", method, path)
            return 500, [error_body(f"internal error ({type(e).__name__}; see the server log)")], "application/json"

    def predict(self, name, version, body, deadline=None, cancelled=None):
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError) as e:  # RecursionError: nesting deeper than the parser's stack
            raise invalid_argument(f"JSON Parse error: {str(e)[:200]}") from None
        if not isinstance(doc, dict):
            raise invalid_argument(f"JSON Value: {short_json(doc)} Is not object")
        signature_name = doc.get("signature_name", "")
        if not isinstance(signature_name, str):
            raise invalid_argument("'signature_name' key must be a string value.")
        output_filter = doc.get("output_filter", [])
        if not isinstance(output_filter, list) or not all(isinstance(x, str) for x in output_filter):
            raise invalid_argument("'output_filter' must be a list of output names")
        if "instances" in doc and "inputs" in doc:
            raise invalid_argument(
                "Not formatted correctly expecting only one of 'inputs' or 'instances' keys to exist"
            )
        if "instances" not in doc and "inputs" not in doc:
            raise invalid_argument("Missing 'inputs' or 'instances' key")
        row_format = "instances" in doc
        decode = functools.partial(
            decode_instances if row_format else decode_inputs, doc["instances" if row_format else "inputs"]
        )
        timeout = self.timeout if deadline is None else deadline - time.monotonic()  # <= 0: not run (504)
        _, _, outputs = self.core.predict(
            name,
            version,
            signature_name,
            decode,
            tuple(output_filter),
            timeout=timeout,
            cancelled=cancelled,
            response_encoding="json",
        )
        del doc, decode
        return outputs_to_json(outputs, row_format, self.max_response_bytes)

    def status(self, name, version):
        response = self.core.model_status(name, version)
        return json.dumps(json_format.MessageToDict(response, always_print_fields_with_no_presence=True), indent=1)

    def metadata(self, name, version):
        response = self.core.model_metadata(name, version)
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

    def metrics(self):
        stats = self.core.stats()
        lines = []
        for metric, key, help_text in (
            ("elmo_serving_requests_total", "requests", "Predict requests that reached the model"),
            ("elmo_serving_model_calls_total", "model_calls", "signature function calls (merged batches)"),
            ("elmo_serving_rows_total", "rows", "rows (sentences) run"),
            ("elmo_serving_merged_requests_total", "merged_requests", "requests that shared a model call"),
        ):
            lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} counter"]
            for label, counters in stats["by_signature"].items():
                model, signature = label.split("/", 1)
                lines.append(f'{metric}{{model="{model}",signature="{signature}"}} {counters.get(key, 0)}')
        for metric, key, help_text in (
            ("elmo_serving_rejected_in_flight_total", "rejected_in_flight", "requests refused at the in-flight cap"),
            ("elmo_serving_deadline_exceeded_total", "deadline_exceeded", "requests whose deadline passed"),
        ):
            if key in stats:
                lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} counter", f"{metric} {stats[key]}"]
        lines += ["# HELP elmo_serving_version the model version served", "# TYPE elmo_serving_version gauge"]
        for model, version in stats["served_versions"].items():
            lines.append(f'elmo_serving_version{{model="{model}"}} {version if version is not None else -1}')
        return "\n".join(lines) + "\n"
