"""JSON <-> tensors for TF Serving's REST API: the request formats read against a signature's request budget, and
the response written piece by piece within a size limit.

Row format: "instances" is a non-empty list with one item per row; with several inputs each item is an object
{"<input>": [...], "<other input>": 3} (all items of the same shape). The response is
{"predictions": [{"<output>": [[...]], ...}, ...]}, one object per row (or bare values with one output).
Columnar format: "inputs" is {"<input>": [[...], ...], ...} (or the bare value with one input), and the response
is {"outputs": {"<output>": [[[...]]], ...}}: whole tensors, batch first; an empty batch is allowed here only.
Input and output names are the SignatureDef's.
Values: strings as JSON strings (UTF-8) or {"b64": "<base64>"} for arbitrary bytes (invalid UTF-8 can only be
sent that way); integers as JSON integers; floats as numbers (NaN, Infinity accepted); bool as true/false.
Output floats are float32 values written as JSON numbers, each the shortest decimal that reads back as the same
float32 (0.1f is `0.1`, not the 0.10000000149011612 of its double), as TF Serving's json_tensor.cc `WriteDecimal`
does (a tensor holding NaN or Infinity is written by Python's json: `NaN`, `Infinity`, the others as their doubles'
text); string outputs whose name ends in "_bytes" are written as {"b64": ...}, as TF Serving does. Numeric tensors
are encoded by orjson (about 10x Python's json module on ELMo's outputs, and the float32 text is about half as long).
An array nested deeper than its input's rank is refused before any array is built, and its shape is checked against
the request budget (`budget.RequestBudget.check_shape`) before its values are read. The JSON response is abandoned
with RESOURCE_EXHAUSTED as soon as it passes its limit, so no response above it is ever built.
"""

import base64
import binascii
import json
import reprlib

import numpy as np
import orjson

from elmo_tf.serving.status import invalid_argument, resource_exhausted

CHUNK_BYTES = 256 << 10  # JSON responses are written in pieces of about this size
INT_RANGES = {
    np.dtype(t): (np.iinfo(t).min, np.iinfo(t).max)
    for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
}
_REPR = reprlib.Repr()  # Python 3.11's takes no arguments
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 3, 4, 4, 60, 60


def short_json(value, limit=80):
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
                    f"input '{alias}': JSON string {short_json(value)} is not valid Unicode; send "
                    f'arbitrary bytes as {{"b64": "<base64>"}}'
                ) from None
        if _is_b64(value) and isinstance(value["b64"], str):
            try:
                return base64.b64decode(value["b64"], validate=True)
            except (binascii.Error, ValueError):
                raise invalid_argument(f"input '{alias}': Unable to base64 decode {short_json(value)}") from None
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
        f"input '{alias}': JSON Value: {short_json(value)} Type: {json_type} is not of expected type: "
        f"{spec.describe().split()[0]}"
    )


def _width_hint(signature, alias, level):
    """What to do about rows of different lengths on a dynamic axis, from the signature (e.g. pad `tokens` with ""
    and give `sequence_len`)."""
    spec = signature.inputs[alias]
    if level == 0 or spec.shape is None or level >= len(spec.shape) or spec.shape[level] is not None:
        return ""
    lengths = [
        a
        for a, s in signature.inputs.items()
        if a != alias and s.shape is not None and len(s.shape) == 1 and s.tf_dtype.is_integer
    ]
    pad = '""' if spec.is_string else "0"
    give = f" and give {' or '.join(lengths)}" if lengths else ""
    return f" (rows of '{alias}' must have the same width: pad them with {pad}{give})"


def json_to_array(value, budget, alias):
    """Nested JSON lists -> a NumPy array for input `alias` of the signature of `budget` (a `budget.RequestBudget`;
    strings: object array of bytes).

    The shape is read along the first items, at most one level deeper than the signature's rank, and checked
    against the signature and the request limits (`budget.check_shape`) before anything is built; every list must
    then match it (a dense tensor). No recursion: any nesting depth is a clean error.
    Raises:
        ServingError: INVALID_ARGUMENT for a wrong rank, ragged lists, wrong leaf types or undecodable b64;
            RESOURCE_EXHAUSTED for a shape above the request limits.
    """
    signature = budget.signature
    spec = signature.inputs[alias]
    rank = len(spec.shape) if spec.shape is not None else None
    shape, probe = [], value
    while isinstance(probe, list) and (rank is None or len(shape) <= rank):
        shape.append(len(probe))
        probe = probe[0] if probe else None
    if rank is not None and len(shape) > rank:
        raise invalid_argument(
            f"input '{alias}' of signature '{signature.name}': expected rank {rank} ({spec.describe()}), got lists "
            f"nested more than {rank} deep"
        )
    budget.check_shape(alias, shape)
    items = [value]
    for level, size in enumerate(shape):
        below = []
        for item in items:
            if not isinstance(item, list):
                raise invalid_argument(
                    f"input '{alias}': JSON Value: {short_json(item)} found at incorrect level: "
                    f"{level + 1} in the JSON DOM. Expected at level: {len(shape)}"
                )
            if len(item) != size:
                raise invalid_argument(
                    f"input '{alias}': Encountered list at unexpected size: {len(item)} at "
                    f"level: {level} expected size: {size}{_width_hint(signature, alias, level)}"
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


def decode_instances(instances, budget):
    """The row format: a list of instances -> {alias: array} for the signature of `budget`."""
    if not isinstance(instances, list):
        raise invalid_argument("Expecting 'instances' to be an list/array")
    if not instances:
        raise invalid_argument("No values in 'instances' array")
    names = list(budget.signature.inputs)
    if not isinstance(instances[0], dict) or _is_b64(instances[0]):
        if len(names) > 1:
            raise invalid_argument(
                f"instances is a plain list, but expecting list of objects as multiple input "
                f"tensors required as per tensorinfo_map: {{{','.join(names)}}}"
            )
        return {names[0]: json_to_array(instances, budget, names[0])}
    columns = {name: [] for name in names}
    for k, instance in enumerate(instances):
        if not isinstance(instance, dict) or _is_b64(instance):
            raise invalid_argument(f"Expecting object but got list at item {k} of input list")
        if set(instance) != set(names):
            raise invalid_argument(
                f"Failed to process element: {k} of 'instances' list. JSON object: "
                f"{short_json(instance)} must only have keys: {','.join(names)}"
            )
        for name in names:
            columns[name].append(instance[name])
    return {name: json_to_array(values, budget, name) for name, values in columns.items()}


def decode_inputs(inputs, budget):
    """The columnar format: {alias: nested list} (or one bare value for a single input) -> {alias: array} for the
    signature of `budget`."""
    names = list(budget.signature.inputs)
    if not isinstance(inputs, dict) or _is_b64(inputs):
        if len(names) > 1:
            raise invalid_argument(
                f"inputs is a plain value/list, but expecting an object as multiple input tensors "
                f"required as per tensorinfo_map: {{{','.join(names)}}}"
            )
        return {names[0]: json_to_array(inputs, budget, names[0])}
    for name in names:
        if name not in inputs:
            raise invalid_argument(f"Missing named input: {name} in 'inputs' object.")
    extra = set(inputs) - set(names)
    if extra:
        raise budget.signature.unknown_inputs(extra)
    return {name: json_to_array(inputs[name], budget, name) for name in names}


# ---------------------------------------------------------------------------------------------------- tensors -> JSON


class JsonWriter:
    """Collects a JSON response as byte pieces of about `CHUNK_BYTES`, failing as soon as it passes `limit` bytes
    (RESOURCE_EXHAUSTED naming the limit and its flag), so a response above the limit is never built whole."""

    def __init__(self, limit):
        self.limit = limit
        self.parts, self._pending, self._pending_size, self.size = [], [], 0, 0

    def write(self, data):
        """Appends `data` (bytes; ASCII str is taken too)."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        self.size += len(data)
        if self.size > self.limit:
            raise resource_exhausted(
                f"the JSON response is more than {self.limit} bytes, the server's limit (--max_message_bytes): "
                f"send fewer or shorter sentences, or fewer outputs (output_filter)"
            )
        self._pending.append(data)
        self._pending_size += len(data)
        if self._pending_size >= CHUNK_BYTES:
            self._flush()

    def _flush(self):
        if self._pending:
            self.parts.append(b"".join(self._pending))
            self._pending, self._pending_size = [], 0

    def finish(self):
        self._flush()
        return self.parts


_ORJSON_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def _json_value(array, alias):
    """A NumPy array or scalar -> its JSON value as UTF-8 bytes (strings as UTF-8, or b64 for outputs named *_bytes;
    float32 as the shortest text that reads back as the same float32)."""
    if array.dtype == object or array.dtype.kind == "S":
        if alias.endswith("_bytes"):
            value = np.vectorize(lambda b: {"b64": base64.b64encode(b).decode("ascii")}, otypes=[object])(array)
        else:
            value = np.vectorize(lambda b: b.decode("utf-8", "replace"), otypes=[object])(array)
        return json.dumps(value.tolist() if array.size else array.tolist(), separators=(",", ":")).encode("ascii")
    if array.ndim == 0 or array.dtype.kind not in "biuf" or (array.dtype.kind == "f" and not np.isfinite(array).all()):
        # scalars, other dtypes, and NaN / Infinity, which orjson writes as null: Python's json (a float32 as the
        # text of its double, which reads back as the same float32)
        return json.dumps(array.tolist(), separators=(",", ":")).encode("ascii")
    return orjson.dumps(np.ascontiguousarray(array), option=_ORJSON_NUMPY)


def _write_array(writer, array, alias):
    """A whole tensor, batch first, written one row at a time."""
    if array.ndim == 0:
        return writer.write(_json_value(array, alias))
    writer.write(b"[")
    for k in range(array.shape[0]):
        writer.write((b"," if k else b"") + _json_value(array[k], alias))
    writer.write(b"]")


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
        writer.write(b'{"predictions":[')
        for k in range(batch.pop()):
            writer.write(b"," if k else b"")
            if len(names) == 1:
                writer.write(_json_value(outputs[names[0]][k], names[0]))
                continue
            for n, alias in enumerate(names):
                key = (b"{" if n == 0 else b",") + json.dumps(alias).encode("ascii") + b":"
                writer.write(key + _json_value(outputs[alias][k], alias))
            writer.write(b"}")
        writer.write(b"]}")
    elif len(names) == 1:
        writer.write(b'{"outputs":')
        _write_array(writer, outputs[names[0]], names[0])
        writer.write(b"}")
    else:
        for n, alias in enumerate(names):
            writer.write((b'{"outputs":{' if n == 0 else b",") + json.dumps(alias).encode("ascii") + b":")
            _write_array(writer, outputs[alias], alias)
        writer.write(b"}}" if names else b'{"outputs":{}}')
    return writer.finish()


def error_body(message):
    """The JSON body of an error answer: {"error": message}."""
    return json.dumps({"error": message}).encode("utf-8")
