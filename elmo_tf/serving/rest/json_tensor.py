"""JSON request bodies -> tensors, as TF Serving's `tensorflow_serving/util/json_tensor.cc` reads them, with its error
texts; the response side is `rest_json`'s.

Predict (`FillPredictRequestFromJson`): the body is parsed (an empty body: "JSON Parse error: The
document is empty"; trailing bytes after the document are ignored, rapidjson's kParseStopWhenDoneFlag), must be an
object, `signature_name` a string; then, once the signature is known, exactly one of "instances" (the row format)
and "inputs" (the columnar format):
    - row format (`FillTensorMapFromInstancesList`): a non-empty list; plain values/lists for a signature
      of one input, else one object per row whose keys are exactly the signature's inputs. Each row is read alone
      (`AddInstanceItem`): its shape is that of its first items, every list must match it, and every row
      must have the size and shape of the first ("Expecting tensor size: 3 but got: 1", "Expecting shape [3] but
      got: [1,3]"), errors wrapped in "Failed to process element: <k> [key: <input> ]of 'instances' list. Error:
      INVALID_ARGUMENT: ...".
    - columnar format (`FillTensorMapFromInputsMap`): one value for a single input, else an object with
      every input (keys the signature does not have are ignored, as stock ignores them).
Values (`AddValueToTensor`): "JSON Value: <value> Type: <JSON type> is not of expected type: <dtype>" with
TensorFlow's lowercase type names (`string`, `int32`, `float`); integers must fit the field stock stores them in:
int32 for int8, int16, uint8 and int32 (rapidjson's `IsInt`), then narrowed to the dtype as TensorFlow's
`Tensor::FromProto` narrows its `int_val` (a C++ conversion: 300 as int8 is 44, -1 as uint8 is 255), int64, uint32
and uint64 their own range; a dtype stock's switch leaves out (uint16, half, ...) is UNIMPLEMENTED "Conversion of JSON
Value: ... to type: ..." whatever the value; strings are JSON strings or {"b64": "<base64>"}.
The request budget (`budget.RequestBudget.check_shape`) sees each input's shape, taken from its first items, before
any array is built; the shape is checked against the signature's rank and static dims once the values are read.
Classify/Regress bodies (`FillClassifyRegressRequestFromJson`) are checked, not run: `json_examples.check_examples`.
"""

import base64
import binascii
import json
import re

import grpc
import numpy as np
import tensorflow as tf
from tensorflow.core.framework import types_pb2

from elmo_tf.serving.serving_error import ServingError, invalid_argument, resource_exhausted
from elmo_tf.serving.signature import dtype_name

DEBUG_STRING_BYTES = 256  # kMaxJsonDebugStringBytes
_JSON_SPACE = " \t\n\r"
# rapidjson's GetParseError_En texts of the errors Python's json module reports alike
_PARSE_ERRORS = {
    "Expecting value": "Invalid value.",
    "Expecting property name enclosed in double quotes": "Missing a name for object member.",
    "Expecting ':' delimiter": "Missing a colon after a name of object member.",
    "Unterminated string starting at": "Missing a closing quotation mark in string.",
}
_INT32 = (-(2**31), 2**31 - 1)
_INT_RANGES = {  # rapidjson's IsInt (int32: the int_val field of int8, int16, uint8), IsInt64, IsUint, IsUint64
    types_pb2.DT_INT8: _INT32,
    types_pb2.DT_INT16: _INT32,
    types_pb2.DT_INT32: _INT32,
    types_pb2.DT_UINT8: _INT32,
    types_pb2.DT_INT64: (-(2**63), 2**63 - 1),
    types_pb2.DT_UINT32: (0, 2**32 - 1),
    types_pb2.DT_UINT64: (0, 2**64 - 1),
}
_NARROWED = (types_pb2.DT_INT8, types_pb2.DT_INT16, types_pb2.DT_UINT8)  # int32 values cast to the dtype
_FLOATS = (types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE)
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)


# ---------------------------------------------------------------------------------------------------- debug strings


def json_type(value):
    """rapidjson's type name of a JSON value (`JsonTypeString`)."""
    if value is None:
        return "Null"
    if isinstance(value, bool):
        return "True" if value else "False"
    return {dict: "Object", list: "Array", str: "String"}.get(type(value), "Number")


def type_name(dtype):
    """TensorFlow's `DataTypeString`: DT_STRING -> "string", DT_FLOAT -> "float"."""
    return dtype_name(dtype).removeprefix("DT_").lower()


def _scalar_text(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value).replace("e+", "e").replace("inf", "Infinity").replace("nan", "NaN")
    return json.dumps(value, ensure_ascii=False)


def debug_string(value, limit=DEBUG_STRING_BYTES):
    """A JSON value as TF Serving shows it in messages (`JsonValueToDebugString`): rapidjson's PrettyWriter
    with arrays on one line, objects indented by 4, cut at the first token written once `limit` bytes are out."""
    out, size = [], 0
    levels = []  # [is_array, values written] per open container
    stack = [("value", value)]
    while stack and size < limit:
        kind, item = stack.pop()
        if kind in ("end_array", "end_object"):
            _, count = levels.pop()
            text = ("\n" + " " * 4 * len(levels) if count and kind == "end_object" else "") + "]}"[kind == "end_object"]
        else:
            prefix = ""
            if levels:
                level = levels[-1]
                if level[0]:
                    prefix = ", " if level[1] else ""
                else:
                    prefix = (":" + " " if level[1] % 2 else ",\n") if level[1] else "\n"
                    if level[1] % 2 == 0:
                        prefix += " " * 4 * len(levels)
                level[1] += 1
            if kind == "value" and isinstance(item, list):
                text = prefix + "["
                levels.append([True, 0])
                stack.append(("end_array", None))
                stack.extend(("value", v) for v in reversed(item))
            elif kind == "value" and isinstance(item, dict):
                text = prefix + "{"
                levels.append([False, 0])
                stack.append(("end_object", None))
                for key, v in reversed(list(item.items())):
                    stack.extend((("value", v), ("key", key)))
            else:
                text = prefix + _scalar_text(item)
        out.append(text)
        size += len(text.encode("utf-8", "surrogatepass"))
    return "".join(out)


def format_error(doc, *parts):
    """`FormatError`: "JSON Value: <doc> <parts>"."""
    return invalid_argument(f"JSON Value: {debug_string(doc)} {''.join(parts)}")


# ---------------------------------------------------------------------------------------------------- the document


def json_values(body):
    """An upper bound of the JSON values in `body` (bytes), counted without parsing: 1 + the commas, brackets and
    braces outside strings (each value but the first follows a comma or opens its container)."""
    bare = _JSON_STRING.sub(b"", bytes(body))
    return 1 + bare.count(b",") + bare.count(b"[") + bare.count(b"{")


def max_json_values(limits):
    """The JSON values a request within `limits` (`budget.Limits`) can need: each of its rows a list of at most
    `max_tokens_per_sentence` strings, each string possibly a {"b64": ...} object, plus the row, its length and some
    keys; None without a token limit."""
    if limits.max_tokens_per_sentence is None:
        return None
    return limits.max_request_sentences * (2 * limits.max_tokens_per_sentence + 4) + 64


def parse_json(body, max_values=None):
    """`ParseJson`: the body's JSON object (dict); INVALID_ARGUMENT as stock words it. A body of more than
    `max_values` JSON values (`json_values`; None: no limit) is RESOURCE_EXHAUSTED before it is parsed: Python's
    objects cost up to ~25x their JSON (8 MiB of `[],` are ~190 MiB of lists)."""
    if not body:
        raise invalid_argument("JSON Parse error: The document is empty")
    if max_values is not None and (count := json_values(body)) > max_values:
        raise resource_exhausted(
            f"the request body holds {count} JSON values, above the {max_values} the server's limits allow "
            "(--max_request_sentences x --max_tokens_per_sentence): split the request"
        )
    text = bytes(body).decode("utf-8", "surrogateescape")  # rapidjson keeps invalid UTF-8 in strings as it is
    start = len(text) - len(text.lstrip(_JSON_SPACE))
    if start == len(text):
        raise invalid_argument("JSON Parse error: The document is empty")
    try:
        doc, _ = json.JSONDecoder().raw_decode(text, start)  # kParseStopWhenDoneFlag: what follows is ignored
    except json.JSONDecodeError as e:
        message = _PARSE_ERRORS.get(e.msg, e.msg)
        raise invalid_argument(f"JSON Parse error: {message} at offset: {e.pos}") from None
    except RecursionError:  # nesting deeper than the parser's stack
        raise invalid_argument("JSON Parse error: Nesting too deep.") from None
    except ValueError as e:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise invalid_argument(f"JSON Parse error: {str(e)[:200]}") from None
    if not isinstance(doc, dict):
        raise format_error(doc, "Is not object")
    return doc


def signature_name(doc):
    """`FillSignature`: the optional "signature_name" ("" when absent)."""
    name = doc.get("signature_name", "")
    if not isinstance(name, str):
        raise format_error(doc, "not formatted correctly. 'signature_name' key must be a string value.")
    return name


# ---------------------------------------------------------------------------------------------------- values


def is_b64(value):
    """`IsValBase64Object`: an object of one key "b64" holding a string."""
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def _is_element_object(value):
    return isinstance(value, dict) and not is_b64(value)


def _type_error(value, dtype):
    return invalid_argument(
        f"JSON Value: {debug_string(value)} Type: {json_type(value)} is not of expected type: {type_name(dtype)}"
    )


def b64_value(value):
    if not is_b64(value):
        return invalid_argument(f"JSON Value: {debug_string(value)} not formatted correctly for base64 data")
    text = value["b64"]
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        return invalid_argument("Unable to base64 decode")


def leaf_value(value, dtype):
    """One JSON scalar as a Python value of `dtype` (`AddValueToTensor` and the b64 objects `FillTensorProto` reads), or
    the `ServingError` it fails with."""
    if dtype == types_pb2.DT_STRING:
        if isinstance(value, dict):
            return b64_value(value)
        if not isinstance(value, str):
            return _type_error(value, dtype)
        try:
            return value.encode("utf-8", "surrogateescape")  # invalid UTF-8 of the body comes back as it was
        except UnicodeEncodeError:  # a lone surrogate from a \ud800 escape
            return invalid_argument(
                f'JSON Value: {debug_string(value)} is not valid Unicode; send arbitrary bytes as {{"b64": "<base64>"}}'
            )
    if dtype == types_pb2.DT_BOOL:
        return value if isinstance(value, bool) else _type_error(value, dtype)
    if isinstance(value, dict):  # FillTensorProto: an object is a type error for any dtype but string
        return _type_error(value, dtype)
    bounds = _INT_RANGES.get(dtype)
    if bounds is None and dtype not in _FLOATS:  # AddValueToTensor's default case, whatever the value
        return ServingError(
            grpc.StatusCode.UNIMPLEMENTED,
            f"Conversion of JSON Value: {debug_string(value)} to type: {type_name(dtype)}",
        )
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _type_error(value, dtype)
    if dtype in _FLOATS:
        try:
            return float(value)
        except OverflowError:  # an integer beyond a double: rapidjson reads it as +-inf
            return float("inf") if value > 0 else float("-inf")
    if isinstance(value, float) or not bounds[0] <= value <= bounds[1]:
        return _type_error(value, dtype)
    return value  # int8, int16, uint8: narrowed with the others by `_array`


# ---------------------------------------------------------------------------------------------------- tensors


def dense_shape(value):
    """`GetDenseTensorShape`: the shape read along the first items (no recursion)."""
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        value = value[0] if value else None
    return shape


def _fast_converter(dtype):
    """A quick conversion of the common leaves of `dtype` (None for anything else: `leaf_value` decides)."""
    if dtype == types_pb2.DT_STRING:

        def convert(value):
            if type(value) is str:
                try:
                    return value.encode("utf-8", "surrogateescape")
                except UnicodeEncodeError:
                    return None
            return None

        return convert
    low, high = _INT_RANGES.get(dtype, (None, None))
    if low is not None:
        return lambda value: value if type(value) is int and low <= value <= high else None
    return lambda value: None


def _leaves(items, rank, dtype, convert, out):
    """The items of a list at the last level: each a leaf (no list), converted."""
    append = out.append
    for value in items:
        converted = convert(value)
        if converted is None:
            if isinstance(value, list):
                raise invalid_argument(f"Encountered list at unexpected level: {rank} expected < {rank}")
            converted = leaf_value(value, dtype)
            if isinstance(converted, ServingError):
                raise converted
        append(converted)


def fill_values(value, shape, dtype, out):
    """`FillTensorProto`, depth first and without recursion: appends `value`'s leaves (converted to
    `dtype`) to `out`, raising INVALID_ARGUMENT where a value is not where `shape` puts it (the first error in the
    order stock meets them). Returns the leaf count."""
    rank, count = len(shape), 0
    convert = _fast_converter(dtype)
    stack = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if not isinstance(item, list):
            if level != rank:
                raise invalid_argument(
                    f"JSON Value: {debug_string(item)} found at incorrect level: {level + 1} in the JSON DOM. "
                    f"Expected at level: {rank}"
                )
            _leaves((item,), rank, dtype, convert, out)
            count += 1
            continue
        if level >= rank:
            raise invalid_argument(f"Encountered list at unexpected level: {level} expected < {rank}")
        if len(item) != shape[level]:
            raise invalid_argument(
                f"Encountered list at unexpected size: {len(item)} at level: {level} expected size: {shape[level]}"
            )
        if level == rank - 1:
            _leaves(item, rank, dtype, convert, out)
            count += len(item)
        else:
            stack.extend((v, level + 1) for v in reversed(item))
    return count


def _array(values, dtype, shape):
    """The array of `dtype` of the converted `values`; int8, int16 and uint8 values (int32 ones) narrowed as
    `Tensor::FromProto` narrows `int_val` (NumPy's cast wraps, as the C++ conversion does)."""
    if dtype == types_pb2.DT_STRING:
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return array.reshape(shape)
    numpy_dtype = tf.dtypes.as_dtype(dtype).as_numpy_dtype
    if dtype in _NARROWED:
        return np.array(values, dtype=np.int32).astype(numpy_dtype).reshape(shape)
    return np.array(values, dtype=numpy_dtype).reshape(shape)


def _precheck(budget, alias, shape):
    """The budget of a shape read from the first items, before any value is read (only when its rank is the
    signature's: a wrong rank is reported once the values are read, as stock reports its errors first)."""
    spec = budget.signature.inputs[alias]
    if spec.shape is None or len(spec.shape) == len(shape):
        budget.check_shape(alias, shape)


def _column(value, budget, alias):
    """One input of the columnar format (errors unwrapped, as stock returns them)."""
    shape = dense_shape(value)
    _precheck(budget, alias, shape)
    values = []
    fill_values(value, shape, budget.signature.inputs[alias].dtype, values)
    return _array(values, budget.signature.inputs[alias].dtype, budget.check_shape(alias, shape))


class _Rows:
    """The rows of one input in the row format: each row read alone, all of the first row's size and shape."""

    def __init__(self, alias, dtype):
        self.alias, self.dtype = alias, dtype
        self.values, self.shape, self.size, self.rows = [], None, None, 0

    def add(self, item):
        shape = dense_shape(item)
        size = fill_values(item, shape, self.dtype, self.values)
        if self.size is None:
            self.shape, self.size = shape, size
        elif self.size != size:
            raise invalid_argument(f"Expecting tensor size: {self.size} but got: {size}")
        elif self.shape != shape:
            raise invalid_argument(f"Expecting shape {_shape_text(self.shape)} but got: {_shape_text(shape)}")
        self.rows += 1


def _shape_text(shape):
    return "[" + ",".join(str(d) for d in shape) + "]"


def _failed(k, key, error):
    where = f"{k} key: {key}" if key is not None else f"{k}"
    return invalid_argument(
        f"Failed to process element: {where} of 'instances' list. Error: {error.code.name}: {error.details}"
    )


def _instances(doc, budget):
    instances = doc["instances"]
    if not isinstance(instances, list):
        raise format_error(doc, "Expecting 'instances' to be an list/array")
    if not instances:
        raise format_error(doc, "No values in 'instances' array")
    inputs = budget.signature.inputs
    names = list(inputs)
    if not isinstance(instances[0], dict) and len(names) > 1:
        raise invalid_argument(
            "instances is a plain list, but expecting list of objects as multiple input tensors required as per "
            "tensorinfo_map"
        )
    objects = _is_element_object(instances[0])
    first = instances[0] if objects else {names[0]: instances[0]}
    for alias, item in first.items():
        if alias in inputs:
            _precheck(budget, alias, [len(instances), *dense_shape(item)])
    rows = {}
    for k, element in enumerate(instances):
        if objects != _is_element_object(element):
            raise invalid_argument(
                f"Expecting {'object but got list' if objects else 'value/list but got object'} at item {k} of "
                f"input list"
            )
        for key, item in element.items() if objects else [(None, element)]:
            alias = names[0] if key is None else key
            try:
                if alias not in inputs:
                    raise invalid_argument(f"JSON object: does not have named input: {alias}")
                rows.setdefault(alias, _Rows(alias, inputs[alias].dtype)).add(item)
            except ServingError as e:
                raise _failed(k, key, e) from None
        if objects and set(element) != set(names):
            raise invalid_argument(
                f"Failed to process element: {k} of 'instances' list. JSON object: {debug_string(element)} keys "
                f"must be equal to: {','.join(sorted(names))}"
            )
    return {
        alias: _array(r.values, r.dtype, budget.check_shape(alias, [r.rows, *r.shape])) for alias, r in rows.items()
    }


def _inputs(doc, budget):
    value, names = doc["inputs"], list(budget.signature.inputs)
    if not isinstance(value, dict) or is_b64(value):
        if len(names) > 1:
            raise invalid_argument(
                "inputs is a plain value/list, but expecting an object as multiple input tensors required as per "
                "tensorinfo_map"
            )
        return {names[0]: _column(value, budget, names[0])}
    arrays = {}
    for name in names:
        if name not in value:
            raise invalid_argument(f"Missing named input: {name} in 'inputs' object.")
        arrays[name] = _column(value[name], budget, name)
    return arrays


def decode_request(doc, budget):
    """The inputs of a Predict body `doc` (a dict from `parse_json`) for the signature of `budget` (a
    `budget.RequestBudget`): {alias: array}, strings as object arrays of bytes.

    Raises:
        ServingError: INVALID_ARGUMENT with stock's texts; RESOURCE_EXHAUSTED above the request budget.
    """
    if "instances" in doc and "inputs" in doc:
        raise format_error(doc, "Not formatted correctly expecting only one of 'inputs' or 'instances' keys to exist ")
    if "instances" in doc:
        return _instances(doc, budget)
    if "inputs" in doc:
        return _inputs(doc, budget)
    raise invalid_argument("Missing 'inputs' or 'instances' key")
