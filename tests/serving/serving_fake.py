"""Fake signatures for the tests of the request budget, merged calls and batching (no model): a `tokens`-like runner
whose function doubles its input, request budgets of SignatureDefs with any inputs, TensorProtos declaring any shape.
"""

import time

import grpc
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow_serving.apis import predict_pb2

from elmo_tf.serving.limits.budget import Limits, RequestBudget
from elmo_tf.serving.servable import SignatureRunner
from elmo_tf.serving.serving_error import ServingError
from elmo_tf.serving.signature import Signature

INVALID = grpc.StatusCode.INVALID_ARGUMENT
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


def _info(dtype, shape):
    info = meta_graph_pb2.TensorInfo(dtype=dtype)
    for size in shape:
        info.tensor_shape.dim.add(size=size)
    return info


def fake_runner(delay=0.0, calls=None, y_shape=(-1, -1), limits=None):
    """A `tokens`-like signature: x float [B, W] -> y = 2x [B, W], total [B]; fails on negative values."""
    signature = meta_graph_pb2.SignatureDef(method_name="tensorflow/serving/predict")
    signature.inputs["x"].CopyFrom(_info(types_pb2.DT_FLOAT, [-1, -1]))
    signature.outputs["y"].CopyFrom(_info(types_pb2.DT_FLOAT, list(y_shape)))
    signature.outputs["total"].CopyFrom(_info(types_pb2.DT_FLOAT, [-1]))

    def function(x):
        if calls is not None:
            calls.append(x.shape)
        time.sleep(delay)
        if tf.reduce_any(x < 0):
            raise tf.errors.InvalidArgumentError(None, None, "x must be >= 0\n\t [[{{node Assert}}]]")
        return {"y": 2 * x, "total": tf.reduce_sum(x, axis=1)}

    return SignatureRunner("fake", function, signature, limits or Limits(max_request_sentences=16))


def signature_budget(inputs, outputs=None, limits=None):
    """The request budget of a SignatureDef with `inputs` {alias: (dtype, shape)} and ELMo-like outputs."""
    signature = meta_graph_pb2.SignatureDef(method_name="tensorflow/serving/predict")
    for alias, (dtype, shape) in inputs.items():
        signature.inputs[alias].CopyFrom(_info(dtype, shape))
    outputs = outputs or {
        "elmo": (types_pb2.DT_FLOAT, [-1, -1, 64]),
        "default": (types_pb2.DT_FLOAT, [-1, 64]),
        "sequence_len": (types_pb2.DT_INT32, [-1]),
        "mask": (types_pb2.DT_BOOL, [-1, -1]),
    }
    for alias, (dtype, shape) in outputs.items():
        signature.outputs[alias].CopyFrom(_info(dtype, shape))
    return RequestBudget(Signature("sig", signature), limits or Limits())


def tokens_budget(limits=None, tokens="tokens", lengths="sequence_len"):
    return signature_budget(
        {tokens: (types_pb2.DT_STRING, [-1, -1]), lengths: (types_pb2.DT_INT32, [-1])}, limits=limits
    )


def sentences_budget(limits=None, alias="sentences"):
    return signature_budget({alias: (types_pb2.DT_STRING, [-1])}, limits=limits)


def declared(dtype, field, values, shape):
    """A TensorProto of `dtype` with `values` in `field` (as clients write them) declaring `shape`, which may hold
    more elements than the values (TensorFlow repeats the last one)."""
    proto = tensor_pb2.TensorProto(dtype=dtype, **{field: values})
    for size in shape:
        proto.tensor_shape.dim.add(size=size)
    return proto


def strings(values, shape):
    return declared(types_pb2.DT_STRING, "string_val", values, shape)


def int32s(values, shape):
    return declared(types_pb2.DT_INT32, "int_val", values, shape)


def item_8_request(signature="tokens"):
    """Issue 12, item 8: a PredictRequest of about 85 bytes declaring 256 x 1000 tokens with one string value (TF
    repeats the last value to fill the shape) and 256 lengths of 1000 with one value."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "elmo"
    request.model_spec.signature_name = signature
    if signature == "tokens":
        request.inputs["tokens"].CopyFrom(strings([b"word"], [256, 1000]))
        request.inputs["sequence_len"].CopyFrom(int32s([1000], [256]))
    else:
        request.inputs["sentences"].CopyFrom(strings([b" ".join([b"w"] * 1000)], [256]))
    return request


def budget_error(call, code=EXHAUSTED):
    """Runs `call`, which must raise ServingError with `code` within 0.2 s; returns its message."""
    start = time.perf_counter()
    with pytest.raises(ServingError) as info:
        call()
    assert time.perf_counter() - start < 0.2
    assert info.value.code == code, info.value
    return info.value.details
