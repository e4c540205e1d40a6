"""elmo_tf/serving/rest/json_examples.py: Classify and Regress bodies checked as stock's json_tensor.cc checks them,
with its error texts."""

import pytest

from elmo_tf.serving.rest.json_examples import check_examples
from elmo_tf.serving.serving_error import ServingError


def error(call):
    with pytest.raises(ServingError) as info:
        call()
    return info.value.code, info.value.details


def test_classify_bodies_as_stock():
    """FillClassifyRegressRequestFromJson, AddValueToFeature; json_tensor_test.cc ClassifyRegressRequestTest
    JsonErrors."""
    assert error(lambda: check_examples({}))[1].endswith(
        "When method is classify, key 'examples' is expected and was not found"
    )
    assert error(lambda: check_examples({"examples": {}}))[1].endswith("Expecting 'examples' value to be an list/array")
    assert error(lambda: check_examples({"examples": [1]}))[1] == "Example must be JSON object but got JSON Number"
    assert error(lambda: check_examples({"examples": [{"names": [None]}]}))[1] == (
        "Feature: names has element with unexpected JSON type: Null"
    )
    assert error(lambda: check_examples({"examples": [{"names": [1, "a"]}]}))[1] == (
        "Unexpected element type in feature: names expecting type: int64"
    )
    assert error(lambda: check_examples({"examples": [{"names": [2**64 - 1]}]}))[1] == (
        "Feature: names has uint64_t element. Only int64_t is supported."
    )
    check_examples({"context": {"a": 1}, "examples": [{"x": [1.5, 2.0], "y": "a", "z": {"b64": "YQ=="}}]})
