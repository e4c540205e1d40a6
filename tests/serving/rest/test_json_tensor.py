"""elmo_tf/serving/rest/json_tensor.py: JSON request bodies read as TF Serving's tensorflow_serving/util/json_tensor.cc
reads them, with its error texts; each test cites the lines of json_tensor.cc (or of its test, json_tensor_test.cc)
it follows. No server: the request budgets of serving_fake's signatures."""

import grpc
import numpy as np
import pytest
from serving_fake import sentences_budget, signature_budget, tokens_budget
from tensorflow.core.framework import types_pb2

from elmo_tf.serving.limits.budget import Limits
from elmo_tf.serving.rest.json_tensor import (
    debug_string,
    decode_request,
    leaf_value,
    parse_json,
    signature_name,
    type_name,
)
from elmo_tf.serving.serving_error import ServingError

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def error(call):
    with pytest.raises(ServingError) as info:
        call()
    return info.value.code, info.value.details


def decode(doc, budget=None):
    return decode_request(doc, budget or sentences_budget())


def test_parse_errors_as_stock():
    """ParseJson: an empty document; rapidjson's words for an invalid value; a document that is not an
    object; the bytes after the document are ignored (kParseStopWhenDoneFlag)."""
    assert error(lambda: parse_json(b"")) == (INVALID, "JSON Parse error: The document is empty")
    assert error(lambda: parse_json(b"  \n")) == (INVALID, "JSON Parse error: The document is empty")
    assert error(lambda: parse_json(b"instances = [1, 2]")) == (
        INVALID,
        "JSON Parse error: Invalid value. at offset: 0",
    )
    assert error(lambda: parse_json(b"[1, 2]")) == (INVALID, "JSON Value: [1, 2] Is not object")
    assert parse_json(b' {"instances": ["a"]} and more') == {"instances": ["a"]}
    assert error(lambda: parse_json(b'{"instances": [1' + b"0" * 5000 + b"]}"))[0] == INVALID


def test_signature_name_must_be_a_string():
    """FillSignature; json_tensor_test.cc SingleUnnamedTensorErrors."""
    doc = {"signature_name": 5, "instances": [[1, 2]]}
    code, details = error(lambda: signature_name(doc))
    assert code == INVALID
    assert details == (
        'JSON Value: {\n    "signature_name": 5,\n    "instances": [[1, 2]]\n} not formatted correctly. '
        "'signature_name' key must be a string value."
    )
    assert signature_name({"instances": []}) == ""


def test_debug_string_is_rapidjsons_pretty_writer_cut_at_256_bytes():
    """JsonValueToDebugString: PrettyWriter, arrays on one line, objects indented by 4, at most one token
    past 256 bytes."""
    assert debug_string({"a": [1, {"b": True}], "c": None}) == (
        '{\n    "a": [1, {\n            "b": true\n        }],\n    "c": null\n}'
    )
    assert debug_string("caf\u00e9") == '"caf\u00e9"'
    long = debug_string(list(range(1000)))
    assert long.startswith("[0, 1, 2") and 256 <= len(long) < 262 and not long.endswith("]")


def test_wrong_json_type_names_the_lowercase_dtype():
    """TypeError names TensorFlow's DataTypeString; json_tensor_test.cc SingleUnnamedTensorErrors,
    http_rest_api_handler_test.cc PredictRequestErrors."""
    assert [type_name(t) for t in (types_pb2.DT_STRING, types_pb2.DT_INT32, types_pb2.DT_FLOAT)] == [
        "string",
        "int32",
        "float",
    ]
    code, details = error(lambda: decode({"inputs": [1]}))
    assert (code, details) == (INVALID, "JSON Value: 1 Type: Number is not of expected type: string")
    budget = tokens_budget()
    for value, json_type in (("3", "String"), (True, "True"), (None, "Null"), (2**31, "Number"), (1.0, "Number")):
        doc = {"inputs": {"tokens": [["a"]], "sequence_len": [value]}}
        code, details = error(lambda doc=doc: decode(doc, budget))
        assert details.endswith(f"Type: {json_type} is not of expected type: int32"), details
    assert isinstance(leaf_value({"b64": "YQ"}, types_pb2.DT_STRING), bytes)  # absl's Base64Unescape: no padding
    assert error(lambda: decode({"inputs": [{"b64": "!!"}]})) == (INVALID, "Unable to base64 decode")


def test_ragged_instances_are_each_parsed_alone():
    """AddInstanceItem: each row has its own shape; a row of another size or shape than the first fails,
    wrapped by FillTensorMapFromInstancesList; json_tensor_test.cc SingleUnnamedTensorErrors,
    MultipleNamedTensorErrors."""
    budget = tokens_budget()
    rows = [{"tokens": ["a", "b", "c"], "sequence_len": 3}, {"tokens": ["a"], "sequence_len": 1}]
    assert error(lambda: decode({"instances": rows}, budget)) == (
        INVALID,
        "Failed to process element: 1 key: tokens of 'instances' list. Error: INVALID_ARGUMENT: "
        "Expecting tensor size: 3 but got: 1",
    )
    rows = [{"tokens": ["a", "b"], "sequence_len": 2}, {"tokens": [["a", "b"]], "sequence_len": 2}]
    assert error(lambda: decode({"instances": rows}, budget))[1].endswith("Expecting shape [2] but got: [1,2]")
    rows = [{"tokens": [["a", "b"], ["c"]], "sequence_len": 2}]
    assert error(lambda: decode({"instances": rows}, budget))[1].endswith(
        "INVALID_ARGUMENT: Encountered list at unexpected size: 1 at level: 1 expected size: 2"
    )
    assert error(lambda: decode({"instances": ["a", ["b"]]}))[1] == (
        "Failed to process element: 1 of 'instances' list. Error: INVALID_ARGUMENT: Expecting shape [] but got: [1]"
    )
    arrays = decode(
        {"instances": [{"tokens": ["a", "b"], "sequence_len": 2}, {"tokens": ["c", ""], "sequence_len": 1}]}, budget
    )
    np.testing.assert_array_equal(arrays["tokens"], np.array([[b"a", b"b"], [b"c", b""]], dtype=object))
    np.testing.assert_array_equal(arrays["sequence_len"], np.array([2, 1], np.int32))


def test_instances_format_errors():
    """FillPredictRequestFromJson and FillTensorMapFromInstancesList."""
    budget = tokens_budget()
    doc = {"instances": "a"}
    assert error(lambda: decode(doc)) == (
        INVALID,
        'JSON Value: {\n    "instances": "a"\n} Expecting \'instances\' to be an list/array',
    )
    assert error(lambda: decode({"instances": []}))[1].endswith("No values in 'instances' array")
    assert error(lambda: decode({"instances": [["a"]]}, budget))[1] == (
        "instances is a plain list, but expecting list of objects as multiple input tensors required as per "
        "tensorinfo_map"
    )
    rows = [{"tokens": ["a"], "sequence_len": 1}, ["a"]]
    assert (
        error(lambda: decode({"instances": rows}, budget))[1] == "Expecting object but got list at item 1 of input list"
    )
    assert error(lambda: decode({"instances": ["a", {"sentences": "b"}]}))[1] == (
        "Expecting value/list but got object at item 1 of input list"
    )
    rows = [{"tokens": ["a"]}]
    assert error(lambda: decode({"instances": rows}, budget))[1] == (
        'Failed to process element: 0 of \'instances\' list. JSON object: {\n    "tokens": ["a"]\n} keys must be '
        "equal to: sequence_len,tokens"
    )
    rows = [{"tokens": ["a"], "sequence_len": 1, "extra": 1}]
    assert error(lambda: decode({"instances": rows}, budget))[1] == (
        "Failed to process element: 0 key: extra of 'instances' list. Error: INVALID_ARGUMENT: JSON object: does not "
        "have named input: extra"
    )
    assert error(lambda: decode({"instances": ["a"], "inputs": ["a"]}))[1].endswith(
        "Not formatted correctly expecting only one of 'inputs' or 'instances' keys to exist "
    )
    assert error(lambda: decode({})) == (INVALID, "Missing 'inputs' or 'instances' key")


def test_columnar_format_as_stock():
    """FillTensorMapFromInputsMap: a bare value for one input, every input of the signature by name (keys
    it does not have are ignored), errors unwrapped."""
    budget = tokens_budget()
    assert error(lambda: decode({"inputs": [["a"]]}, budget))[1] == (
        "inputs is a plain value/list, but expecting an object as multiple input tensors required as per tensorinfo_map"
    )
    assert error(lambda: decode({"inputs": {"tokens": [["a"]]}}, budget))[1] == (
        "Missing named input: sequence_len in 'inputs' object."
    )
    arrays = decode({"inputs": {"tokens": [["a"]], "sequence_len": [1], "other": 5}}, budget)
    assert sorted(arrays) == ["sequence_len", "tokens"]
    assert error(lambda: decode({"inputs": ["a", ["b"]]}))[1] == "Encountered list at unexpected level: 1 expected < 1"
    assert error(lambda: decode({"inputs": [["a"], "b"]}))[1] == (
        'JSON Value: "b" found at incorrect level: 2 in the JSON DOM. Expected at level: 2'
    )


def test_budget_sees_the_shape_before_the_values():
    """The request budget is checked on the shape read from the first items, before any value is read (an
    extension: stock has no such limits)."""
    budget = sentences_budget(Limits(max_request_sentences=4))
    code, details = error(lambda: decode({"instances": ["a"] * 5 + [1]}, budget))  # 6 rows, the last one bad
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "has 6 rows" in details, details


def test_strings_keep_their_bytes():
    """rapidjson parses without validating UTF-8: invalid bytes inside a string reach the tensor as they were sent; a
    lone surrogate escape (which has no bytes) is INVALID_ARGUMENT, with a message that can be written."""
    doc = parse_json(b'{"instances": ["bad \xff\xfe bytes", "caf\xc3\xa9"]}')
    arrays = decode(doc)
    assert arrays["sentences"].tolist() == [b"bad \xff\xfe bytes", "caf\u00e9".encode()]
    code, details = error(lambda: decode(parse_json(b'{"instances": ["\\ud800"]}')))
    assert code == INVALID and "is not valid Unicode" in details
    details.encode("utf-8", "surrogatepass")


def test_a_body_of_more_json_values_than_any_request_holds_is_refused_before_it_is_parsed():
    """Hostile review (s12): Python's objects cost up to ~25x their JSON: 8 MiB of `[],` (2.8 million empty lists,
    within the REST body limit) parsed to ~190 MiB before the request budget saw a shape, and up to 8 such bodies
    fit the 64 MiB of bytes in flight. Values outside strings are counted first (`json_values`); a body above
    `max_values` (what the request limits allow: rows x (2 x tokens + 4) + 64) is RESOURCE_EXHAUSTED unparsed.
    Commas and brackets inside strings do not count."""
    import tracemalloc

    from elmo_tf.serving.rest.json_tensor import json_values, max_json_values

    limits = Limits(max_request_sentences=256, max_tokens_per_sentence=1000)
    allowed = max_json_values(limits)
    assert allowed == 256 * 2004 + 64
    assert json_values(b'{"instances": ["a, [b] {c}", "d\\", ["]}') == 4
    # the largest legal body of the tokens signature fits: 256 rows of 1000 tokens, each as {"b64": ...}
    row = "[" + ",".join(['{"b64": "YQ=="}'] * 1000) + "]"
    legal = (
        '{"inputs": {"tokens": [' + ",".join([row] * 256) + '], "sequence_len": [' + ",".join(["1000"] * 256) + "]}}"
    )
    assert json_values(legal.encode()) <= allowed
    hostile = b'{"instances": [' + b"[]," * (8 * 2**20 // 3 - 10) + b"[]]}"
    tracemalloc.start()
    with pytest.raises(ServingError) as info:
        parse_json(hostile, max_values=allowed)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info.value.details == (
        f"the request body holds {json_values(hostile)} JSON values, above the {allowed} the server's limits allow "
        "(--max_request_sentences x --max_tokens_per_sentence): split the request"
    )
    assert peak < 4 * len(hostile)  # the body's copies, never its objects


@pytest.mark.parametrize(
    "dtype, values, expected",
    [
        (types_pb2.DT_INT8, [300, -1, 127, -129, 2**31 - 1, -(2**31)], [44, -1, 127, 127, -1, 0]),
        (types_pb2.DT_UINT8, [-1, 256, 300, 255], [255, 0, 44, 255]),
        (types_pb2.DT_INT16, [40000, -32769, 7], [-25536, 32767, 7]),
    ],
)
def test_int8_int16_uint8_take_any_int32_narrowed_as_stock(dtype, values, expected):
    """AddValueToTensor: DT_INT8, DT_INT16 and DT_UINT8 share DT_INT32's case: any value that
    is an int32 (`val.IsInt()`) goes to int_val, and TensorFlow's Tensor::FromProto narrows it to the dtype
    (tensor.cc: PROTO_TRAITS(int8, int32, int), FromProtoField's std::copy_n: 300 as int8 is 44); a value beyond int32
    is the type error. The embedded server refused out-of-range values. Both formats, the fast path (plain ints) and
    `leaf_value` (the slow path) alike."""
    budget = signature_budget({"x": (dtype, [-1])})
    numpy_dtype = {types_pb2.DT_INT8: np.int8, types_pb2.DT_UINT8: np.uint8, types_pb2.DT_INT16: np.int16}[dtype]
    for doc in ({"inputs": {"x": values}}, {"instances": values}, {"instances": [{"x": v} for v in values]}):
        array = decode_request(doc, budget)["x"]
        assert array.dtype == numpy_dtype and array.tolist() == expected, (doc, array)
    assert [leaf_value(v, dtype) for v in values] == values  # int32 values: narrowed with the others by the array
    name = type_name(dtype)
    for value, json_type in ((2**31, "Number"), (-(2**31) - 1, "Number"), (1.0, "Number"), ("1", "String")):
        assert error(lambda value=value: decode_request({"inputs": {"x": [value]}}, budget)) == (
            INVALID,
            f"JSON Value: {debug_string(value)} Type: {json_type} is not of expected type: {name}",
        )


def test_dtypes_stock_does_not_convert_are_unimplemented_whatever_the_value():
    """AddValueToTensor's default case: DT_UINT16 (and half, ...) is UNIMPLEMENTED "Conversion of JSON
    Value: <value> to type: <dtype>" for a number and for a string alike; an object is FillTensorProto's type error
    (FillTensorProto) before it."""
    for dtype, name in ((types_pb2.DT_UINT16, "uint16"), (types_pb2.DT_HALF, "half")):
        budget = signature_budget({"x": (dtype, [-1])})
        for value, text in ((1, "1"), ("a", '"a"'), (None, "null")):
            assert error(lambda value=value, budget=budget: decode_request({"inputs": {"x": [value]}}, budget)) == (
                grpc.StatusCode.UNIMPLEMENTED,
                f"Conversion of JSON Value: {text} to type: {name}",
            )
        assert error(lambda budget=budget: decode_request({"inputs": {"x": [{"a": 1}]}}, budget)) == (
            INVALID,
            f'JSON Value: {{\n    "a": 1\n}} Type: Object is not of expected type: {name}',
        )
