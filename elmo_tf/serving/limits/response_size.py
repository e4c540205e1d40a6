"""The size of a response, estimated before the model runs, in the encoding it will be written in.

    "proto" (gRPC): elements x the dtype's size, as `tf.make_tensor_proto` writes them; a PredictResponse adds 24 to
        64 bytes per output (dtype, shape, key).
    "json" (REST): the text `elmo_tf.serving.rest.rest_json` writes. A float32 value is the shortest text that reads
        back as the same float32 (as TF Serving writes it), up to 9 significant digits: `JSON_FLOAT_BYTES` = 12 with its
        comma, an upper estimate (10.4 to 11.7 characters on average over the test model's outputs; 3 to 15), about 3x
        its 4 binary bytes. Padded positions are 0.0 (`JSON_PAD_BYTES`), real positions the sentences' token counts or
        the lengths input. Ints cost their widest text (the lengths output: the width's), bools "false,", each list
        "[],", and the row format each output's key per row. Measured 1.0x-1.15x of real responses of the test model,
        row and columnar formats (an all-zero output, such as `default` of empty sentences, is overestimated up to 3x).
        String outputs are not counted (ELMo has none).
Dims after the batch (and time) axes come from the SignatureDef, or, where it leaves them unknown, from the outputs of
the warm-up call (`learn_inner_dims`). The request budget (`elmo_tf.serving.limits.budget`) refuses a request whose
estimate is above its limit; the server checks the real size again after the call (`budget.check_response_size`).
"""

import math

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import types_pb2

RESPONSE_ENCODINGS = ("proto", "json")

# JSON text of one output value, its separator included (see the module docstring for the measurements)
JSON_FLOAT_BYTES = 12
JSON_PAD_BYTES = 4  # "0.0,"
JSON_BOOL_BYTES = 6  # "false,"
JSON_LIST_BYTES = 3  # "[", "]", ","


def _json_int_bytes(dtype):
    info = np.iinfo(tf.dtypes.as_dtype(dtype).as_numpy_dtype)
    return max(len(str(info.min)), len(str(info.max))) + 1


class ResponseSizes:
    """Estimates the bytes of a signature's outputs for a request of a given batch and width.

    Args:
        signature: `elmo_tf.serving.signature.Signature`.
    Attributes:
        inner_dims: alias -> dims after batch (and time), learned at warm-up.
    """

    def __init__(self, signature):
        self.signature = signature
        self.inner_dims = {}

    def learn_inner_dims(self, outputs):
        """Records each output's dims after the batch (and time) axes from real outputs (the warm-up call)."""
        signature = self.signature
        for alias, value in outputs.items():
            if alias in signature.outputs:
                self.inner_dims[alias] = tuple(value.shape[2:] if alias in signature.time_outputs else value.shape[1:])

    def _inner_dims(self, alias):
        """Dims of output `alias` after the batch (and time) axes: from the warm-up call, else the SignatureDef (None
        entries count 1); None for an unknown rank."""
        inner = self.inner_dims.get(alias)
        if inner is None:
            spec = self.signature.outputs[alias]
            if spec.shape is None:
                return None
            inner = spec.shape[2:] if alias in self.signature.time_outputs else spec.shape[1:]
        return tuple(1 if d is None else d for d in inner)

    def response_bytes(self, batch, time, aliases, response_encoding="proto", real_tokens=None):
        """Estimated bytes of outputs `aliases` for `batch` rows of `time` tokens (strings not counted).

        Args:
            response_encoding: "proto" (elements x the dtype's size) or "json" (see the module docstring).
            real_tokens: positions that are not padding, for "json" (default `batch * time`: none is padding).
        """
        positions = batch * time
        real_tokens = positions if real_tokens is None else min(real_tokens, positions)
        total = 0
        for alias in aliases:
            spec = self.signature.outputs[alias]
            inner = self._inner_dims(alias)
            if spec.is_string or inner is None:
                continue
            timed = alias in self.signature.time_outputs
            per_row = math.prod(inner)
            if response_encoding == "proto":
                total += (positions if timed else batch) * per_row * spec.item_size
            else:
                total += self._json_bytes(alias, spec, inner, batch, time, real_tokens)
        return total

    def _json_bytes(self, alias, spec, inner, batch, time, real_tokens):
        positions, per_row = batch * time, math.prod(inner)
        timed = alias in self.signature.time_outputs
        if spec.is_int:
            value = pad = len(str(time)) + 1 if alias == self.signature.lengths_output else _json_int_bytes(spec.dtype)
        elif spec.dtype == types_pb2.DT_BOOL:
            value = pad = JSON_BOOL_BYTES
        else:
            value, pad = JSON_FLOAT_BYTES, JSON_PAD_BYTES
        if timed:
            total = (real_tokens * value + (positions - real_tokens) * pad) * per_row
        else:
            total = batch * value * per_row
        shape = ((batch, time) if timed else (batch,)) + inner
        lists = 1 + sum(math.prod(shape[:axis]) for axis in range(1, len(shape)))  # one per index, last axis aside
        return total + lists * JSON_LIST_BYTES + batch * (len(alias) + 4)  # the row format's "alias": per row
