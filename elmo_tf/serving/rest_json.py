"""Tensors -> JSON for TF Serving's REST API: the response written piece by piece within a size limit (the request
side, JSON -> tensors, is `json_tensor`'s).

Row format (the request gave "instances"): {"predictions": [{"<output>": [[...]], ...}, ...]}, one object per row
(or bare values with one output). Columnar format (the request gave "inputs"): {"outputs": {"<output>": [[[...]]],
...}}: whole tensors, batch first. Output names are the SignatureDef's.
Output floats are float32 values written as JSON numbers (Python's float repr of the double: exact, round-trips to
float32; stock TF Serving writes the shortest text that round-trips the float32, json_tensor.cc `WriteDecimal`, so
the same value may be spelled with more digits here); string outputs whose name ends in "_bytes" are written as
{"b64": ...}, as TF Serving does. The JSON response is abandoned with RESOURCE_EXHAUSTED as soon as it passes its
limit, so no response above it is ever built.
"""

import base64
import json

import numpy as np

from elmo_tf.serving.status import invalid_argument, resource_exhausted

CHUNK_BYTES = 256 << 10  # JSON responses are written in pieces of about this size


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


def error_body(message):
    """The JSON body of an error answer: {"error": message}."""
    return json.dumps({"error": message}).encode("utf-8")
