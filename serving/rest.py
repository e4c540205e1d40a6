"""TF Serving's REST API on the embedded server (`serving.server.ModelServer`), with the standard library.

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
          "instances": [...]  or  "inputs": {...},         row or columnar format (exactly one of them)
          "output_filter": ["elmo", "sequence_len"]}       optional; an extension of the embedded server
                                                           (stock TF Serving's REST API returns all outputs)
    GET  /monitoring/prometheus/metrics                    the batching counters, Prometheus text format
Row format: "instances" is a non-empty list with one item per row; with several inputs each item is an object
{"tokens": [...], "sequence_len": 3} (all items of the same shape). The response is
{"predictions": [{"elmo": [[...]], "default": [...], ...}, ...]}, one object per row (or bare values with one
output). Columnar format: "inputs" is {"tokens": [[...], ...], "sequence_len": [...]} (or the bare value with one
input), and the response is {"outputs": {"elmo": [[[...]]], ...}}: whole tensors, batch first; an empty batch
(`{"inputs": {"sentences": []}}`) is allowed here only.
Values: strings as JSON strings (UTF-8) or {"b64": "<base64>"} for arbitrary bytes (invalid UTF-8 can only be
sent that way); int32 as JSON integers; floats as numbers (NaN, Infinity accepted); bool as true/false.
Output floats are float32 values written as JSON numbers (Python's float repr: exact, round-trips to float32).

Errors: {"error": "<message>"} with the HTTP status of the gRPC code (`serving.status.HTTP_STATUS`: 400
INVALID_ARGUMENT, 404 NOT_FOUND, 429 RESOURCE_EXHAUSTED, 501 UNIMPLEMENTED, 500 INTERNAL, 504 DEADLINE_EXCEEDED).
A body above `max_body_bytes` is refused unread (429, connection closed); a POST needs a Content-Length (411).
Classify and Regress answer 501; version labels answer 404 (the embedded server has none).

Threads: a fixed pool of `num_threads` handler threads; each keeps one HTTP/1.1 keep-alive connection while it
is open (idle connections close after 60 s). When all are busy, new connections wait in the listen backlog.
"""

import base64
import binascii
import http.server
import json
import logging
import queue
import re
import socket
import threading
import urllib.parse

import grpc
import numpy as np
from google.protobuf import json_format
from tensorflow_serving.apis import get_model_metadata_pb2

from serving.status import SIGNATURE_DEF_FIELD, ServingError, invalid_argument, not_found

logger = logging.getLogger("serving.rest")

PREDICT_PATH = re.compile(r"(?i)/v1/models/([^/:]+)(?:/versions/(\d+)|/labels/([^/:]+))?:(classify|regress|predict)")
STATUS_PATH = re.compile(r"(?i)/v1/models(?:/([^/:]+))?(?:/versions/(\d+)|/labels/([^/:]+))?(?:/(metadata))?")
API_PATH = re.compile(r"(?i)/v1/.*")
METRICS_PATH = "/monitoring/prometheus/metrics"
IDLE_TIMEOUT = 60.0
INT_RANGES = {
    np.dtype(t): (np.iinfo(t).min, np.iinfo(t).max)
    for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
}


def _short(value, limit=80):
    text = json.dumps(value) if not isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "..."


# ---------------------------------------------------------------------------------------------------- JSON -> tensors


def _leaf(value, spec, alias, np_dtype):
    """One JSON scalar -> a Python value of the spec's dtype (`np_dtype`, worked out once per input);
    INVALID_ARGUMENT if it does not fit."""
    if spec.is_string:
        if isinstance(value, str):
            try:
                return value.encode("utf-8")
            except UnicodeEncodeError:
                raise invalid_argument(
                    f"input '{alias}': JSON string {_short(value)} is not valid Unicode; send "
                    f'arbitrary bytes as {{"b64": "<base64>"}}'
                ) from None
        if isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
            try:
                return base64.b64decode(value["b64"], validate=True)
            except (binascii.Error, ValueError):
                raise invalid_argument(f"input '{alias}': Unable to base64 decode {_short(value)}") from None
    elif np_dtype == np.bool_:
        if isinstance(value, bool):
            return value
    elif np_dtype.kind in "iu":
        if isinstance(value, int) and not isinstance(value, bool):
            low, high = INT_RANGES[np_dtype]
            if not low <= value <= high:
                raise invalid_argument(
                    f"input '{alias}': JSON Value: {value} is out of range for {spec.describe().split()[0]}"
                )
            return value
    elif np_dtype.kind == "f":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    json_type = {dict: "Object", list: "Array", str: "String", bool: "Bool", type(None): "Null"}.get(
        type(value), "Number"
    )
    raise invalid_argument(
        f"input '{alias}': JSON Value: {_short(value)} Type: {json_type} is not of expected type: "
        f"{spec.describe().split()[0]}"
    )


def json_to_array(value, spec, alias):
    """Nested JSON lists -> a NumPy array of `spec`'s dtype (strings: object array of bytes).

    The shape is read along the first items; every list must match it (a dense tensor).
    Raises:
        ServingError: INVALID_ARGUMENT for ragged lists, wrong leaf types, or undecodable b64.
    """
    np_dtype = np.dtype(object) if spec.is_string else np.dtype(spec.tf_dtype.as_numpy_dtype)
    shape = []
    probe = value
    while isinstance(probe, list):
        shape.append(len(probe))
        if not probe:
            break
        probe = probe[0]
    flat = []

    def walk(item, level):
        if isinstance(item, list):
            if level >= len(shape):
                raise invalid_argument(
                    f"input '{alias}': Encountered list at unexpected level: {level} expected < {len(shape)}"
                )
            if len(item) != shape[level]:
                hint = (
                    " (rows of 'tokens' must have the same width: pad them with \"\" and give sequence_len)"
                    if alias == "tokens"
                    else ""
                )
                raise invalid_argument(
                    f"input '{alias}': Encountered list at unexpected size: {len(item)} at "
                    f"level: {level} expected size: {shape[level]}{hint}"
                )
            for sub in item:
                walk(sub, level + 1)
        else:
            if level != len(shape):
                raise invalid_argument(
                    f"input '{alias}': JSON Value: {_short(item)} found at incorrect level: "
                    f"{level + 1} in the JSON DOM. Expected at level: {len(shape)}"
                )
            flat.append(_leaf(item, spec, alias, np_dtype))

    walk(value, 0)
    if spec.is_string:
        array = np.empty(len(flat), dtype=object)
        array[:] = flat
    else:
        array = np.array(flat, dtype=np_dtype)
    return array.reshape(shape)


def _is_b64(value):
    return isinstance(value, dict) and set(value) == {"b64"}


def decode_instances(instances, runner):
    """The row format: a list of instances -> {alias: array}."""
    if not isinstance(instances, list):
        raise invalid_argument("Expecting 'instances' to be an list/array")
    if not instances:
        raise invalid_argument("No values in 'instances' array")
    names = list(runner.inputs)
    objects = isinstance(instances[0], dict) and not _is_b64(instances[0])
    if not objects:
        if len(names) > 1:
            raise invalid_argument(
                f"instances is a plain list, but expecting list of objects as multiple input "
                f"tensors required as per tensorinfo_map: {{{','.join(names)}}}"
            )
        return {names[0]: json_to_array(instances, runner.inputs[names[0]], names[0])}
    columns = {name: [] for name in names}
    for k, instance in enumerate(instances):
        if not isinstance(instance, dict) or _is_b64(instance):
            raise invalid_argument(f"Expecting object but got list at item {k} of input list")
        if set(instance) != set(names):
            raise invalid_argument(
                f"Failed to process element: {k} of 'instances' list. JSON object: "
                f"{_short(instance)} must only have keys: {','.join(names)}"
            )
        for name in names:
            columns[name].append(instance[name])
    return {name: json_to_array(values, runner.inputs[name], name) for name, values in columns.items()}


def decode_inputs(inputs, runner):
    """The columnar format: {alias: nested list} (or one bare value for a single input) -> {alias: array}."""
    names = list(runner.inputs)
    if not isinstance(inputs, dict) or _is_b64(inputs):
        if len(names) > 1:
            raise invalid_argument(
                f"inputs is a plain value/list, but expecting an object as multiple input tensors "
                f"required as per tensorinfo_map: {{{','.join(names)}}}"
            )
        return {names[0]: json_to_array(inputs, runner.inputs[names[0]], names[0])}
    for name in names:
        if name not in inputs:
            raise invalid_argument(f"Missing named input: {name} in 'inputs' object.")
    extra = set(inputs) - set(names)
    if extra:
        raise runner.unknown_inputs(extra)
    return {name: json_to_array(inputs[name], runner.inputs[name], name) for name in names}


# ---------------------------------------------------------------------------------------------------- tensors -> JSON


def _json_value(array, alias):
    if array.dtype == object or array.dtype.kind == "S":
        if alias.endswith("_bytes"):
            return np.vectorize(lambda b: {"b64": base64.b64encode(b).decode("ascii")}, otypes=[object])(array).tolist()
        return np.vectorize(lambda b: b.decode("utf-8", "replace"), otypes=[object])(array).tolist()
    return array.tolist()


def outputs_to_json(outputs, row_format):
    """{"predictions": [...]} (row) or {"outputs": ...} (columnar) as TF Serving writes them."""
    if row_format:
        batch = {a.shape[0] for a in outputs.values()}
        if len(batch) != 1:
            raise invalid_argument(f"outputs have inconsistent batch sizes {sorted(batch)}: use the 'inputs' format")
        columns = {alias: _json_value(value, alias) for alias, value in outputs.items()}
        if len(columns) == 1:
            predictions = next(iter(columns.values()))
        else:
            predictions = [{alias: column[k] for alias, column in columns.items()} for k in range(batch.pop())]
        return {"predictions": predictions}
    columns = {alias: _json_value(value, alias) for alias, value in outputs.items()}
    return {"outputs": next(iter(columns.values())) if len(columns) == 1 else columns}


# ---------------------------------------------------------------------------------------------------- API


def _parse_version(text):
    if text is None:
        return None
    version = int(text)
    if version >= 2**63:
        raise invalid_argument(f"Failed to convert version: {text} to numeric.")
    return version


class RestApi:
    """Routes (method, path, body) to the server and renders JSON; transport-free, so it is testable alone."""

    def __init__(self, server, timeout):
        self.server = server
        self.timeout = timeout

    def handle(self, method, path, body):
        """Returns (HTTP status, response bytes, content type)."""
        try:
            if method == "GET" and path == METRICS_PATH:
                return 200, self.metrics().encode("utf-8"), "text/plain; version=0.0.4"
            if not API_PATH.fullmatch(path):
                raise not_found(f"Not found: {method} {path} (the API is under /v1/models/)")
            match = PREDICT_PATH.fullmatch(path) if method == "POST" else None
            if match:
                name, version, label, verb = match.groups()
                if label:
                    raise not_found(f"Unrecognized servable version label: {label} (this server has no labels)")
                if verb.lower() != "predict":
                    raise ServingError(
                        grpc.StatusCode.UNIMPLEMENTED, f"{verb} is not implemented by the embedded server; use :predict"
                    )
                return 200, self.predict(name, _parse_version(version), body), "application/json"
            match = STATUS_PATH.fullmatch(path) if method == "GET" else None
            if match:
                name, version, label, metadata = match.groups()
                if not name:
                    raise invalid_argument("Missing model name in request.")
                if label:
                    raise not_found(f"Unrecognized servable version label: {label} (this server has no labels)")
                version = _parse_version(version)
                text = self.metadata(name, version) if metadata else self.status(name, version)
                return 200, text.encode("utf-8"), "application/json"
            raise invalid_argument(f"Malformed request: {method} {path}")
        except ServingError as e:
            logger.debug("%s %s: %s %s", method, path, e.code.name, e.details)
            return e.http_status, self.error_body(e.details), "application/json"
        except MemoryError:
            logger.error("%s %s: out of memory", method, path)
            return 429, self.error_body("out of memory: send fewer or shorter sentences"), "application/json"
        except Exception as e:
            logger.exception("%s %s failed", method, path)
            return 500, self.error_body(f"{type(e).__name__}: {e}"), "application/json"

    @staticmethod
    def error_body(message):
        return json.dumps({"error": message}).encode("utf-8")

    def predict(self, name, version, body):
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError) as e:
            raise invalid_argument(f"JSON Parse error: {e}") from None
        if not isinstance(doc, dict):
            raise invalid_argument(f"JSON Value: {_short(doc)} Is not object")
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
        if "instances" in doc:
            row_format = True
            decode = lambda runner: decode_instances(doc["instances"], runner)  # noqa: E731
        elif "inputs" in doc:
            row_format = False
            decode = lambda runner: decode_inputs(doc["inputs"], runner)  # noqa: E731
        else:
            raise invalid_argument("Missing 'inputs' or 'instances' key")
        _, _, outputs = self.server.predict(
            name, version, signature_name, decode, tuple(output_filter), timeout=self.timeout
        )
        return json.dumps(outputs_to_json(outputs, row_format), separators=(",", ":")).encode("utf-8")

    def status(self, name, version):
        response = self.server.model_status(name, version)
        return json.dumps(json_format.MessageToDict(response, always_print_fields_with_no_presence=True), indent=1)

    def metadata(self, name, version):
        response = self.server.model_metadata(name, version)
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
        stats = self.server.stats()
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
        lines += ["# HELP elmo_serving_version the model version served", "# TYPE elmo_serving_version gauge"]
        for model, version in stats["served_versions"].items():
            lines.append(f'elmo_serving_version{{model="{model}"}} {version if version is not None else -1}')
        return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------- HTTP server


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "elmo_tf-serving"
    timeout = IDLE_TIMEOUT  # idle keep-alive connections are closed after this

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def _reply(self, status, body, content_type="application/json", close=False):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def _dispatch(self, method):
        server = self.server
        server.active_begin()
        try:
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            body = b""
            if method == "POST":
                length = self.headers.get("Content-Length")
                if length is None:
                    self._reply(411, RestApi.error_body("a POST needs a Content-Length header"), close=True)
                    return
                try:
                    length = int(length)
                    if length < 0:
                        raise ValueError(length)
                except ValueError:
                    self._reply(400, RestApi.error_body(f"bad Content-Length: {length!r}"), close=True)
                    return
                if length > server.max_body_bytes:
                    self._reply(
                        429,
                        RestApi.error_body(
                            f"request body of {length} bytes is above the server's limit of {server.max_body_bytes} "
                            f"bytes (--max_message_bytes)"
                        ),
                        close=True,
                    )
                    return
                body = self.rfile.read(length)
            status, payload, content_type = server.api.handle(method, path, body)
            self._reply(status, payload, content_type)
        finally:
            server.active_end()

    def log_message(self, fmt, *args):
        logger.debug("%s %s", self.address_string(), fmt % args)


class _PooledHTTPServer(http.server.HTTPServer):
    """An HTTPServer whose connections are handled by a fixed pool of daemon threads."""

    allow_reuse_address = True
    request_queue_size = 128
    daemon_threads = True

    def __init__(self, address, api, num_threads, max_body_bytes):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)
        self.api = api
        self.max_body_bytes = max_body_bytes
        self._jobs = queue.Queue()
        self._slots = threading.Semaphore(num_threads)
        self._closing = False
        self._lock = threading.Lock()
        self._connections = set()
        self._active = 0
        self._idle = threading.Condition(self._lock)
        self._workers = [threading.Thread(target=self._work, name=f"rest-{k}", daemon=True) for k in range(num_threads)]
        for worker in self._workers:
            worker.start()

    def process_request(self, request, client_address):
        while not self._slots.acquire(timeout=0.5):  # all handlers busy: wait (the listen backlog holds the rest)
            if self._closing:
                self.shutdown_request(request)
                return
        self._jobs.put((request, client_address))

    def _work(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            request, client_address = job
            with self._lock:
                self._connections.add(request)
            try:
                self.finish_request(request, client_address)
            except Exception:
                self.handle_error(request, client_address)
            finally:
                with self._lock:
                    self._connections.discard(request)
                self.shutdown_request(request)
                self._slots.release()

    def handle_error(self, request, client_address):
        logger.debug("connection from %s ended with an error", client_address, exc_info=True)

    def active_begin(self):
        with self._lock:
            self._active += 1

    def active_end(self):
        with self._lock:
            self._active -= 1
            self._idle.notify_all()

    def close_all(self, grace):
        """Waits up to `grace` seconds for requests being handled, then closes every connection."""
        self._closing = True
        with self._lock:
            self._idle.wait_for(lambda: self._active == 0, timeout=grace)
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for _ in self._workers:
            self._jobs.put(None)


class RestServer:
    """The REST API of a `ModelServer` on `host:port` (0: a free port, see `.port`)."""

    def __init__(self, model_server, host, port, num_threads, timeout, max_body_bytes):
        self.api = RestApi(model_server, timeout)
        try:
            self._httpd = _PooledHTTPServer((host, port), self.api, num_threads, max_body_bytes)
        except OSError as e:
            raise OSError(f"cannot listen on {host}:{port} for REST: {e}") from None
        self.port = self._httpd.server_address[1]
        self._thread = None

    def start(self):
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2}, name="rest-accept", daemon=True
        )
        self._thread.start()

    def stop(self, grace=5.0):
        self._httpd._closing = True
        self._httpd.shutdown()
        self._httpd.close_all(grace)
        self._httpd.server_close()
