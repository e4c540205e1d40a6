"""Tensors -> JSON for TF Serving's REST API: the response written piece by piece within a size limit (the request
side, JSON -> tensors, is `json_tensor`'s).

Row format (the request gave "instances"): {"predictions": [{"<output>": [[...]], ...}, ...]}, one object per row
(or bare values with one output). Columnar format (the request gave "inputs"): {"outputs": {"<output>": [[[...]]],
...}}: whole tensors, batch first. Output names are the SignatureDef's.
Output floats are float32 values written as JSON numbers, each the shortest decimal that reads back as the same
float32 (0.1f is `0.1`, not the 0.10000000149011612 of its double), as TF Serving's json_tensor.cc `WriteDecimal`
does (a tensor holding NaN or Infinity is written by Python's json: `NaN`, `Infinity`, the others as their doubles'
text); string outputs whose name ends in "_bytes" are written as {"b64": ...}, as TF Serving does. Numeric tensors
are encoded by orjson (about 10x Python's json module on ELMo's outputs, and the float32 text is about half as long).
The JSON response is abandoned with RESOURCE_EXHAUSTED as soon as it passes its limit, so no response above it is
ever built.
"""

import base64
import json

import numpy as np
import orjson

from elmo_tf.serving.serving_error import invalid_argument, resource_exhausted

CHUNK_BYTES = 256 << 10  # JSON responses are written in pieces of about this size


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
