"""A fake `tokens`-like signature for unit tests of serving/servable.py and serving/batching.py (no model)."""

import time

import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from serving.servable import Limits, SignatureRunner


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
