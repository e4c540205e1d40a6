"""Classify and Regress request bodies checked as TF Serving's `tensorflow_serving/util/json_tensor.cc` checks them
(`FillClassifyRegressRequestFromJson`, `MakeExampleFromJsonObject`, `AddValueToFeature`), with its error texts; they
are checked, not run (ELMo's signatures are neither classification nor regression ones). Predict bodies are
`json_tensor`'s.
"""

from elmo_tf.serving.rest.json_tensor import b64_value, format_error, is_b64, json_type
from elmo_tf.serving.serving_error import ServingError, invalid_argument


def _feature_kind_error(name, kind):
    return invalid_argument(f"Unexpected element type in feature: {name} expecting type: {kind}")


def _check_feature(name, values):
    """`AddValueToFeature` over one feature's values."""
    kind = None
    for value in values:
        if value is None or isinstance(value, list) or (isinstance(value, dict) and not is_b64(value)):
            raise invalid_argument(f"Feature: {name} has element with unexpected JSON type: {json_type(value)}")
        if isinstance(value, (str, dict)):
            want = "bytes"
            if isinstance(value, dict) and isinstance(b64_value(value), ServingError):
                raise b64_value(value)
        elif isinstance(value, float):
            want = "float"
        else:
            want = "int64"
            if not isinstance(value, bool) and value > 2**63 - 1:
                if value <= 2**64 - 1:
                    raise invalid_argument(f"Feature: {name} has uint64_t element. Only int64_t is supported.")
                want = "float"  # rapidjson reads a larger integer as a double
        if kind is not None and kind != want:
            raise _feature_kind_error(name, kind)
        kind = want


def _check_example(value):
    """`MakeExampleFromJsonObject`."""
    if not isinstance(value, dict):
        raise invalid_argument(f"Example must be JSON object but got JSON {json_type(value)}")
    for name, content in value.items():
        _check_feature(name, content if isinstance(content, list) else [content])


def check_examples(doc):
    """A Classify or Regress body (`FillClassifyRegressRequestFromJson`): "context" and "examples"."""
    if "context" in doc:
        _check_example(doc["context"])
    if "examples" not in doc:
        raise format_error(doc, "When method is classify, key 'examples' is expected and was not found")
    examples = doc["examples"]
    if not isinstance(examples, list):
        raise format_error(doc, "Expecting 'examples' value to be an list/array")
    if not examples:
        raise format_error(doc, "'examples' value is an empty array")
    for example in examples:
        _check_example(example)
