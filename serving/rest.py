"""TF Serving's REST API over a `serving.server.ModelServer`, on aiohttp (asynchronous: no client holds a thread).

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
{"<input>": [...], "<other input>": 3} (all items of the same shape). The response is
{"predictions": [{"<output>": [[...]], ...}, ...]}, one object per row (or bare values with one output).
Columnar format: "inputs" is {"<input>": [[...], ...], ...} (or the bare value with one input), and the response
is {"outputs": {"<output>": [[[...]]], ...}}: whole tensors, batch first; an empty batch is allowed here only.
Input and output names are the SignatureDef's.
Values: strings as JSON strings (UTF-8) or {"b64": "<base64>"} for arbitrary bytes (invalid UTF-8 can only be
sent that way); integers as JSON integers; floats as numbers (NaN, Infinity accepted); bool as true/false.
Output floats are float32 values written as JSON numbers (Python's float repr: exact, round-trips to float32);
string outputs whose name ends in "_bytes" are written as {"b64": ...}, as TF Serving does.

Errors: {"error": "<message>"} with the HTTP status of the gRPC code (`serving.status.HTTP_STATUS`: 400
INVALID_ARGUMENT, 404 NOT_FOUND, 429 RESOURCE_EXHAUSTED, 501 UNIMPLEMENTED, 500 INTERNAL, 504 DEADLINE_EXCEEDED).
Malformed JSON of any nesting depth is a 400; an array nested deeper than its input's rank is refused before any
array is built. Classify and Regress answer 501; version labels answer 404 (the embedded server has none).
Internal errors show the client no server detail (the traceback goes to the server log).

Limits (what a client sees; every message names the limit, the value and the flag that raises it):
    - body size, `rest_api_max_body_bytes` (8 MiB by default, never above `max_message_bytes`): a larger
      Content-Length is answered 413 before any of the body is read; a chunked body is counted as it arrives and
      cut with a 413 at the limit. The connection is closed after a 413.
    - bytes in flight, `rest_api_max_bytes_in_flight` (64 MiB by default): request bodies being read or parsed
      plus responses not yet sent, over all connections; past it a request is answered 429 at once. (A legal
      request of the ELMo signatures at the default row and token limits is about 2 MB of JSON; parsing costs up
      to ~25x the body, hence the body limit well under the gRPC message size.)
    - whole-request deadline, `rest_api_timeout_in_ms` (30 s by default): headers must arrive within it of the
      connection opening (or of the previous response: idle keep-alive connections close then too); the body
      within it of the headers (408 and the connection closed); the model call gets what is left (504 after).
      A response must be written within it too, or the connection is dropped.
    - response size, `max_message_bytes`: the predict budget counts JSON's cost before the model runs (see
      `serving.servable`), and the JSON is written piece by piece and abandoned with a 429 as soon as it passes
      the limit, so no response above it is ever built.
    - HTTP framing: request line and each header at most 8190 bytes, at most 128 headers (aiohttp's parser: 400).

Threads: one event loop thread owns every connection (aiohttp); JSON parsing, the model call and JSON writing run
on a pool of `rest_api_num_threads` threads, so a slow client costs a socket and a coroutine, never a thread.
"""

import asyncio
import base64
import binascii
import concurrent.futures
import functools
import json
import logging
import re
import reprlib
import socket
import threading
import time

import grpc
import numpy as np
from aiohttp import web
from google.protobuf import json_format
from tensorflow_serving.apis import get_model_metadata_pb2

from serving.status import SIGNATURE_DEF_FIELD, ServingError, invalid_argument, not_found, resource_exhausted

logger = logging.getLogger("serving.rest")

PREDICT_PATH = re.compile(r"(?i)/v1/models/([^/:]+)(?:/versions/(\d+)|/labels/([^/:]+))?:(classify|regress|predict)")
STATUS_PATH = re.compile(r"(?i)/v1/models(?:/([^/:]+))?(?:/versions/(\d+)|/labels/([^/:]+))?(?:/(metadata))?")
API_PATH = re.compile(r"(?i)/v1/.*")
METRICS_PATH = "/monitoring/prometheus/metrics"
MiB = 1 << 20
DEFAULT_MAX_BODY_BYTES = 8 * MiB  # Python objects from JSON cost up to ~25x the body (a list of empty lists)
DEFAULT_MAX_BYTES_IN_FLIGHT = 64 * MiB
LINGER_SECONDS = 2.0  # after an error, unread body is drained (and dropped) this long before the connection closes
CHUNK_BYTES = 256 << 10  # JSON responses are written in pieces of about this size
INT_RANGES = {
    np.dtype(t): (np.iinfo(t).min, np.iinfo(t).max)
    for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
}
_REPR = reprlib.Repr()  # Python 3.11's takes no arguments
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 3, 4, 4, 60, 60


def _short(value, limit=80):
    """A JSON value for a message, cut short (containers are shown a few levels deep, whatever their depth)."""
    if isinstance(value, (list, dict)):
        text = _REPR.repr(value)
    else:
        text = json.dumps(value[: limit + 1] if isinstance(value, str) else value, ensure_ascii=False)
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
        if _is_b64(value) and isinstance(value["b64"], str):
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
                raise invalid_argument(f"input '{alias}': JSON Value: {value} is out of range for {spec.describe()}")
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


def _width_hint(runner, alias, level):
    """What to do about rows of different lengths on a dynamic axis, from the signature (e.g. pad `tokens` with ""
    and give `sequence_len`)."""
    spec = runner.inputs[alias]
    if level == 0 or spec.shape is None or level >= len(spec.shape) or spec.shape[level] is not None:
        return ""
    lengths = [
        a
        for a, s in runner.inputs.items()
        if a != alias and s.shape is not None and len(s.shape) == 1 and s.tf_dtype.is_integer
    ]
    pad = '""' if spec.is_string else "0"
    give = f" and give {' or '.join(lengths)}" if lengths else ""
    return f" (rows of '{alias}' must have the same width: pad them with {pad}{give})"


def json_to_array(value, runner, alias):
    """Nested JSON lists -> a NumPy array for input `alias` of `runner` (strings: object array of bytes).

    The shape is read along the first items, at most one level deeper than the signature's rank, and checked
    against the signature and the request limits (`runner.check_shape`) before anything is built; every list must
    then match it (a dense tensor). No recursion: any nesting depth is a clean error.
    Raises:
        ServingError: INVALID_ARGUMENT for a wrong rank, ragged lists, wrong leaf types or undecodable b64;
            RESOURCE_EXHAUSTED for a shape above the request limits.
    """
    spec = runner.inputs[alias]
    rank = len(spec.shape) if spec.shape is not None else None
    shape, probe = [], value
    while isinstance(probe, list) and (rank is None or len(shape) <= rank):
        shape.append(len(probe))
        probe = probe[0] if probe else None
    if rank is not None and len(shape) > rank:
        raise invalid_argument(
            f"input '{alias}' of signature '{runner.name}': expected rank {rank} ({spec.describe()}), got lists "
            f"nested more than {rank} deep"
        )
    runner.check_shape(alias, shape)
    items = [value]
    for level, size in enumerate(shape):
        below = []
        for item in items:
            if not isinstance(item, list):
                raise invalid_argument(
                    f"input '{alias}': JSON Value: {_short(item)} found at incorrect level: "
                    f"{level + 1} in the JSON DOM. Expected at level: {len(shape)}"
                )
            if len(item) != size:
                raise invalid_argument(
                    f"input '{alias}': Encountered list at unexpected size: {len(item)} at "
                    f"level: {level} expected size: {size}{_width_hint(runner, alias, level)}"
                )
            below.extend(item)
        items = below
    np_dtype = np.dtype(object) if spec.is_string else np.dtype(spec.tf_dtype.as_numpy_dtype)
    flat = []
    for item in items:
        if isinstance(item, list):
            raise invalid_argument(
                f"input '{alias}': Encountered list at unexpected level: {len(shape)} expected < {len(shape)}"
            )
        flat.append(_leaf(item, spec, alias, np_dtype))
    if spec.is_string:
        array = np.empty(len(flat), dtype=object)
        array[:] = flat
    else:
        array = np.array(flat, dtype=np_dtype)
    return array.reshape(shape)


def _is_b64(value):
    return isinstance(value, dict) and len(value) == 1 and "b64" in value


def decode_instances(instances, runner):
    """The row format: a list of instances -> {alias: array}."""
    if not isinstance(instances, list):
        raise invalid_argument("Expecting 'instances' to be an list/array")
    if not instances:
        raise invalid_argument("No values in 'instances' array")
    names = list(runner.inputs)
    if not isinstance(instances[0], dict) or _is_b64(instances[0]):
        if len(names) > 1:
            raise invalid_argument(
                f"instances is a plain list, but expecting list of objects as multiple input "
                f"tensors required as per tensorinfo_map: {{{','.join(names)}}}"
            )
        return {names[0]: json_to_array(instances, runner, names[0])}
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
    return {name: json_to_array(values, runner, name) for name, values in columns.items()}


def decode_inputs(inputs, runner):
    """The columnar format: {alias: nested list} (or one bare value for a single input) -> {alias: array}."""
    names = list(runner.inputs)
    if not isinstance(inputs, dict) or _is_b64(inputs):
        if len(names) > 1:
            raise invalid_argument(
                f"inputs is a plain value/list, but expecting an object as multiple input tensors "
                f"required as per tensorinfo_map: {{{','.join(names)}}}"
            )
        return {names[0]: json_to_array(inputs, runner, names[0])}
    for name in names:
        if name not in inputs:
            raise invalid_argument(f"Missing named input: {name} in 'inputs' object.")
    extra = set(inputs) - set(names)
    if extra:
        raise runner.unknown_inputs(extra)
    return {name: json_to_array(inputs[name], runner, name) for name in names}


# ---------------------------------------------------------------------------------------------------- tensors -> JSON


class JsonWriter:
    """Collects a JSON response as byte pieces of about `CHUNK_BYTES`, failing as soon as it passes `limit` bytes
    (RESOURCE_EXHAUSTED naming the limit and its flag), so a response above the limit is never built whole."""

    def __init__(self, limit):
        self.limit = limit
        self.parts, self._pending, self._pending_size, self.size = [], [], 0, 0

    def write(self, text):
        self.size += len(text)  # characters = bytes: json.dumps escapes non-ASCII
        if self.size > self.limit:
            raise resource_exhausted(
                f"the JSON response is more than {self.limit} bytes, the server's limit (--max_message_bytes): "
                f"send fewer or shorter sentences, or fewer outputs (output_filter)"
            )
        self._pending.append(text)
        self._pending_size += len(text)
        if self._pending_size >= CHUNK_BYTES:
            self._flush()

    def _flush(self):
        if self._pending:
            self.parts.append("".join(self._pending).encode("utf-8"))
            self._pending, self._pending_size = [], 0

    def finish(self):
        self._flush()
        return self.parts


def _json_value(array, alias):
    """A NumPy array or scalar -> its JSON value as text (strings as UTF-8, or b64 for outputs named *_bytes)."""
    if array.dtype == object or array.dtype.kind == "S":
        if alias.endswith("_bytes"):
            value = np.vectorize(lambda b: {"b64": base64.b64encode(b).decode("ascii")}, otypes=[object])(array)
        else:
            value = np.vectorize(lambda b: b.decode("utf-8", "replace"), otypes=[object])(array)
        return json.dumps(value.tolist() if array.size else array.tolist(), separators=(",", ":"))
    return json.dumps(array.tolist(), separators=(",", ":"))


def _write_array(writer, array, alias):
    """A whole tensor, batch first, written one row at a time."""
    if array.ndim == 0:
        return writer.write(_json_value(array, alias))
    writer.write("[")
    for k in range(array.shape[0]):
        writer.write(("," if k else "") + _json_value(array[k], alias))
    writer.write("]")


def outputs_to_json(outputs, row_format, limit):
    """{"predictions": [...]} (row) or {"outputs": ...} (columnar) as TF Serving writes them, as byte pieces.

    Raises:
        ServingError: RESOURCE_EXHAUSTED as soon as the JSON passes `limit` bytes; INVALID_ARGUMENT for the row
            format when the outputs' batch sizes differ.
    """
    writer = JsonWriter(limit)
    names = list(outputs)
    if row_format:
        batch = {outputs[a].shape[0] if outputs[a].ndim else None for a in names}
        if len(batch) != 1 or None in batch:
            raise invalid_argument(f"outputs have inconsistent batch sizes {sorted(batch, key=str)}: use 'inputs'")
        writer.write('{"predictions":[')
        for k in range(batch.pop()):
            writer.write("," if k else "")
            if len(names) == 1:
                writer.write(_json_value(outputs[names[0]][k], names[0]))
                continue
            for n, alias in enumerate(names):
                writer.write(("{" if n == 0 else ",") + json.dumps(alias) + ":" + _json_value(outputs[alias][k], alias))
            writer.write("}")
        writer.write("]}")
    elif len(names) == 1:
        writer.write('{"outputs":')
        _write_array(writer, outputs[names[0]], names[0])
        writer.write("}")
    else:
        for n, alias in enumerate(names):
            writer.write(('{"outputs":{' if n == 0 else ",") + json.dumps(alias) + ":")
            _write_array(writer, outputs[alias], alias)
        writer.write("}}" if names else '{"outputs":{}}')
    return writer.finish()


# ---------------------------------------------------------------------------------------------------- API


def _parse_version(text):
    if text is None:
        return None
    if len(text) > 19 or int(text) >= 2**63:
        raise invalid_argument(f"Failed to convert version: {text[:40]} to numeric.")
    return int(text)


def error_body(message):
    return json.dumps({"error": message}).encode("utf-8")


class RestApi:
    """Routes (method, path, body) to the server and renders JSON; transport-free, so it is testable alone.

    Args:
        server: the `ModelServer`.
        timeout: seconds a predict may wait for the model when `handle` is given no deadline.
        max_response_bytes: the JSON response limit (`max_message_bytes`).
    """

    def __init__(self, server, timeout, max_response_bytes):
        self.server = server
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
        if "instances" not in doc and "inputs" not in doc:
            raise invalid_argument("Missing 'inputs' or 'instances' key")
        row_format = "instances" in doc
        decode = functools.partial(
            decode_instances if row_format else decode_inputs, doc["instances" if row_format else "inputs"]
        )
        timeout = self.timeout if deadline is None else deadline - time.monotonic()  # <= 0: not run (504)
        _, _, outputs = self.server.predict(
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


# ---------------------------------------------------------------------------------------------------- HTTP server


def _listen(host, port):
    """A bound TCP socket for `host:port` (0: a free port); OSError naming the address if it cannot be had."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as e:
        raise OSError(f"cannot listen on {host}:{port} for REST: {e}") from None
    return sock


class _Held:
    """Bytes one request holds against the server's bytes-in-flight budget; released together at the end."""

    def __init__(self, rest):
        self.rest, self.size = rest, 0

    def add(self, size):
        self.size += size
        self.rest.in_flight += size

    def release(self):
        self.rest.in_flight -= self.size
        self.size = 0


class RestServer:
    """The REST API of a `ModelServer` on `options.host:options.rest_api_port` (0: a free port, see `.port`).

    Args:
        model_server: the `ModelServer` (predict, model_status, model_metadata, stats).
        options: its `ServerOptions`: host, rest_api_port, rest_api_num_threads, rest_api_timeout_in_ms,
            max_message_bytes, rest_api_max_body_bytes and rest_api_max_bytes_in_flight (None: the defaults here).
    """

    def __init__(self, model_server, options):
        self.timeout = options.rest_api_timeout_in_ms / 1000.0
        self.max_response_bytes = options.max_message_bytes
        body_limit = options.rest_api_max_body_bytes or DEFAULT_MAX_BODY_BYTES
        if options.max_message_bytes < body_limit:
            self.max_body_bytes, self.body_flag = options.max_message_bytes, "--max_message_bytes"
        else:
            self.max_body_bytes, self.body_flag = body_limit, "--rest_api_max_body_bytes"
        self.max_bytes_in_flight = options.rest_api_max_bytes_in_flight or DEFAULT_MAX_BYTES_IN_FLIGHT
        self.in_flight = 0  # bytes held by requests (bodies read, responses not yet sent); touched on the loop only
        self.api = RestApi(model_server, self.timeout, self.max_response_bytes)
        self._sock = _listen(options.host, options.rest_api_port)
        self.port = self._sock.getsockname()[1]
        self._pool = concurrent.futures.ThreadPoolExecutor(options.rest_api_num_threads, thread_name_prefix="rest")
        self._loop = asyncio.new_event_loop()
        self._thread = None
        self._runner = self._site = None
        self._active = 0

    # ------------------------------------------------------------------------------------------------ lifecycle

    def start(self):
        self._thread = threading.Thread(target=self._loop.run_forever, name="rest-loop", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result()
        return self

    async def _start(self):
        server = web.Server(
            self._handle, keepalive_timeout=self.timeout, lingering_time=LINGER_SECONDS, access_log=None
        )
        self._runner = web.ServerRunner(server, shutdown_timeout=1.0)
        await self._runner.setup()
        self._site = web.SockSite(self._runner, self._sock, backlog=128)
        await self._site.start()

    def stop(self, grace=5.0):
        """Stops listening, lets requests being handled finish (up to `grace` seconds), closes every connection."""
        if self._thread is not None:
            try:
                asyncio.run_coroutine_threadsafe(self._stop(grace), self._loop).result(grace + 10)
            except Exception:
                logger.warning("REST server did not stop cleanly", exc_info=True)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._thread = None
        if not self._loop.is_running():
            self._loop.close()
        self._sock.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _stop(self, grace):
        await self._site.stop()
        loop = asyncio.get_running_loop()
        end = loop.time() + grace
        while self._active and loop.time() < end:
            await asyncio.sleep(0.05)
        await self._runner.cleanup()

    # ------------------------------------------------------------------------------------------------ requests

    async def _handle(self, request):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout  # the loop's clock is time.monotonic()
        held = _Held(self)
        self._active += 1
        try:
            try:
                body = await self._read_body(request, held, deadline) if request.method == "POST" else b""
            except ServingError as e:
                logger.debug("%s %s: %s", request.method, request.path, e.details)
                response = web.Response(
                    status=e.http_status, body=error_body(e.details), content_type="application/json"
                )
                response.force_close()
                return response
            transport = request.transport
            status, parts, content_type = await loop.run_in_executor(
                self._pool,
                self.api.handle,
                request.method,
                request.path,
                body,
                deadline,
                lambda: transport is None or transport.is_closing(),
            )
            del body
            held.release()
            held.add(sum(len(part) for part in parts))
            return await self._respond(request, status, parts, content_type)
        finally:
            held.release()
            self._active -= 1

    async def _read_body(self, request, held, deadline):
        """The body, counted against the body limit and the bytes in flight as it arrives, within `deadline`."""
        length, limit = request.content_length, self.max_body_bytes
        if length is not None and length > limit:
            raise self._too_large(f"a request body of {length} bytes (Content-Length)")
        if self.in_flight >= self.max_bytes_in_flight:
            raise self._busy()
        if request.headers.get("Expect", "").lower() == "100-continue":
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = bytearray()
        try:
            async with asyncio.timeout_at(deadline):
                while chunk := await request.content.readany():
                    body += chunk
                    held.add(len(chunk))
                    if len(body) > limit:
                        raise self._too_large(f"a request body of more than {limit} bytes")
                    if self.in_flight > self.max_bytes_in_flight:
                        raise self._busy()
        except TimeoutError:
            raise ServingError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the request body was not received within {self.timeout:g} s, the server's limit "
                f"(--rest_api_timeout_in_ms)",
                http_status=408,
            ) from None
        except web.RequestPayloadError as e:
            raise invalid_argument(f"the request body could not be read: {e}") from None
        return body

    def _too_large(self, what):
        return ServingError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{what} is above the server's limit of {self.max_body_bytes} bytes ({self.body_flag}): "
            f"send fewer or shorter sentences per request",
            http_status=413,
        )

    def _busy(self):
        return resource_exhausted(
            f"REST requests in flight hold {self.in_flight} bytes, at the server's limit of "
            f"{self.max_bytes_in_flight} bytes (--rest_api_max_bytes_in_flight): retry later"
        )

    async def _respond(self, request, status, parts, content_type):
        response = web.StreamResponse(status=status, headers={"Content-Type": content_type})
        response.content_length = sum(len(part) for part in parts)
        try:
            async with asyncio.timeout(self.timeout):
                await response.prepare(request)
                for part in parts:
                    await response.write(part)
                await response.write_eof()
        except TimeoutError:
            logger.debug("%s %s: the client did not read its response in time", request.method, request.path)
            if request.transport is not None:
                request.transport.abort()
        return response
