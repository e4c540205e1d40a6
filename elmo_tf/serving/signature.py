"""A SignatureDef as the server reads it: its inputs' and outputs' dtypes and shapes, their roles, and the checks of
the names a request gives.

Input roles come from the SignatureDef's shapes, never from names, so any export with these shapes is served alike:
the one rank-2 input with a dynamic axis 1 is the padded input (`tokens`, strings padded with ""), a rank-1 integer
input beside it its lengths (`sequence_len`), a rank-1 string input sentences (`sentences`, tokenized in the graph);
the one rank-1 integer output holds the outputs' lengths (`sequence_len`). Outputs with a dynamic axis 1 have one
entry per token (`word_emb`, `lstm_outputs*`, `elmo`, `mask`).

Name errors are INVALID_ARGUMENT with TF Serving's wording: unknown or missing inputs, unknown or repeated
`output_filter` names.
"""

import dataclasses

import tensorflow as tf
from tensorflow.core.framework import types_pb2

from elmo_tf.serving.serving_error import invalid_argument

STRING_ELEMENT_BYTES = 32  # a string element's cost besides its bytes: a NumPy object reference (8), a TF tstring (24)
INT_DTYPES = frozenset(getattr(types_pb2, f"DT_{t}INT{n}") for t in ("", "U") for n in (8, 16, 32, 64))


def dtype_name(dtype):
    """`types_pb2.DataType` enum -> "DT_STRING"; unknown numbers as "DT_<n>"."""
    try:
        return types_pb2.DataType.Name(dtype)
    except ValueError:
        return f"DT_<{dtype}>"


def shape_text(shape):
    """(None, 3) -> "[-1,3]"; None (unknown rank) -> "[?]"."""
    if shape is None:
        return "[?]"
    return "[" + ",".join("-1" if d is None else str(d) for d in shape) + "]"


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """An input or output of a SignatureDef: dtype (`types_pb2.DataType`) and shape (None entries are dynamic;
    `shape` None for an unknown rank)."""

    dtype: int
    shape: tuple

    @classmethod
    def from_tensor_info(cls, info):
        if info.tensor_shape.unknown_rank:
            return cls(info.dtype, None)
        return cls(info.dtype, tuple(d.size if d.size >= 0 else None for d in info.tensor_shape.dim))

    @property
    def tf_dtype(self):
        return tf.dtypes.as_dtype(self.dtype)

    @property
    def is_string(self):
        return self.dtype == types_pb2.DT_STRING

    @property
    def is_int(self):
        return self.dtype in INT_DTYPES

    @property
    def rank(self):
        return None if self.shape is None else len(self.shape)

    @property
    def item_size(self):
        """Bytes per element: the dtype's size (at least 1); for strings `STRING_ELEMENT_BYTES`, their bytes aside."""
        return STRING_ELEMENT_BYTES if self.is_string else max(self.tf_dtype.size, 1)

    def describe(self):
        return f"{dtype_name(self.dtype)} {shape_text(self.shape)}"


class Signature:
    """The inputs, outputs and roles of one SignatureDef (see the module docstring).

    Args:
        name: signature key, e.g. "default".
        signature_def: its `SignatureDef` proto (input/output aliases, dtypes, shapes).
    Attributes:
        inputs, outputs: `TensorSpec` by alias, sorted by alias.
        padded_input: the rank-2 input with a dynamic axis 1, or None.
        lengths_input: the rank-1 integer input beside `padded_input`, or None.
        sentence_inputs: the rank-1 string inputs.
        lengths_output: the rank-1 integer output, or None.
        time_outputs: outputs with a dynamic axis 1 (one entry per token).
        mergeable: whether requests can be concatenated into one call and split back (`elmo_tf.serving.batching.merge`):
            every input and output batch-major, at most one padded input, and a way to tell each request's width.
    """

    def __init__(self, name, signature_def):
        self.name = name
        self.signature_def = signature_def
        self.inputs = {a: TensorSpec.from_tensor_info(i) for a, i in sorted(signature_def.inputs.items())}
        self.outputs = {a: TensorSpec.from_tensor_info(i) for a, i in sorted(signature_def.outputs.items())}
        padded = [a for a, s in self.inputs.items() if s.rank == 2 and s.shape[1] is None]
        self.padded_input = padded[0] if len(padded) == 1 else None
        lengths = [a for a, s in self.inputs.items() if s.rank == 1 and s.is_int]
        self.lengths_input = lengths[0] if self.padded_input is not None and len(lengths) == 1 else None
        self.sentence_inputs = tuple(a for a, s in self.inputs.items() if s.rank == 1 and s.is_string)
        lengths = [a for a, s in self.outputs.items() if s.rank == 1 and s.is_int]
        self.lengths_output = lengths[0] if len(lengths) == 1 else None
        self.time_outputs = frozenset(
            a for a, s in self.outputs.items() if s.shape is not None and len(s.shape) >= 2 and s.shape[1] is None
        )
        specs = list(self.inputs.values()) + list(self.outputs.values())
        batch_major = bool(self.inputs) and all(s.shape and s.shape[0] is None for s in specs)
        self.mergeable = (
            batch_major
            and len(padded) <= 1
            and (not self.time_outputs or self.padded_input is not None or self.lengths_output is not None)
        )

    def input_error(self, alias, message):
        """INVALID_ARGUMENT naming input `alias` and this signature."""
        return invalid_argument(f"input '{alias}' of signature '{self.name}': {message}")

    def check_input_names(self, names):
        """INVALID_ARGUMENT unless `names` are exactly the signature's inputs, in TF Serving's words and order: a
        count that differs first (predict_util.cc `VerifyRequestInputsSize`; SignatureDef defaults are not
        supported), then the first input the request lacks (tensorflow/cc/saved_model/util.cc, `GetInputValues`)."""
        names = set(names)
        expected = set(self.inputs)
        if len(names) != len(expected):
            raise invalid_argument(
                f"input size does not match signature: {len(names)}!={len(expected)} "
                f"len({{{','.join(sorted(names))}}}) != len({{{','.join(self.inputs)}}}). "
                f"Sent extra: {{{','.join(sorted(names - expected))}}}. "
                f"Missing but required: {{{','.join(sorted(expected - names))}}}."
            )
        for alias in self.inputs:
            if alias not in names:
                feed = self.signature_def.inputs[alias].name
                raise invalid_argument(
                    f"Signature input alias: {alias}(feed name: {feed}) not found in request and no default value "
                    f"provided. Inputs expected to be in the request {{{','.join(sorted(names))}}}, or default "
                    f"input alias set: "
                )

    def check_output_filter(self, output_filter):
        """The output names to return: `output_filter` checked (known, no repeats), or every output when empty."""
        seen = []
        for alias in output_filter:
            if alias not in self.outputs:
                raise invalid_argument(
                    f"output tensor alias not found in signature: {alias} Outputs expected to be "
                    f"in the set {{{','.join(self.outputs)}}}."
                )
            if alias in seen:
                raise invalid_argument(f"duplicate output tensor alias: {alias}")
            seen.append(alias)
        return tuple(seen) if seen else tuple(self.outputs)
