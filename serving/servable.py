"""One loaded version of a SavedModel: its SignatureDefs, the request budget, model calls and merged (batched) calls.

Input roles come from the SignatureDef's shapes, never from names, so any export with these shapes is served alike:
the one rank-2 input with a dynamic axis 1 is the padded input (`tokens`, strings padded with ""), a rank-1 integer
input beside it its lengths (`sequence_len`), a rank-1 string input sentences (`sentences`, tokenized in the graph);
the one rank-1 integer output holds the outputs' lengths (`sequence_len`).

A request is checked before anything is built from it, so a bad or costly request fails alone and at once:
    INVALID_ARGUMENT (TF Serving's wording where it has one): unknown or missing inputs; a dtype or rank other than
        the SignatureDef's; lengths with another batch size than the padded input, or outside [0, width]; unknown or
        repeated `output_filter` names; a TensorProto whose values do not fit its shape (below).
    RESOURCE_EXHAUSTED, naming the limit, the value received and the flag that raises it (`Limits`; flags of
        `serving/serve.py`):
        rows of any input                                      max_request_sentences    --max_request_sentences
        the padded input's width; whitespace tokens of a       max_tokens_per_sentence  --max_tokens_per_sentence
            sentence
        tokens of work: rows x width (padded input), rows x    max_request_tokens       --max_request_tokens
            the longest sentence (the model pads every row
            to the longest)
        bytes in: each input as declared, elements x the       max_request_bytes        --max_message_bytes
            dtype's size; strings 32 bytes each plus their
            bytes (a value repeated to fill the shape counted
            each time)
        bytes out: the requested outputs' size estimated from  max_response_bytes       --max_message_bytes
            rows x tokens x widths, in the response's encoding
A sentence's tokens are `elmo_tf.preprocessing.tokenizer.split_tokens`'s (runs of ASCII whitespace), counted
without building them (`count_tokens`): exact for `--tokenizer whitespace` exports, a lower bound for
`unicode_script` ones (which also split punctuation); an export's own `--max-tokens` cut happens later, in the graph.

Response sizes (`SignatureRunner.response_bytes`) are estimated before the model runs; the server checks the real
size again after the call (`check_response_size`).
    "proto" (gRPC): elements x the dtype's size, as `tf.make_tensor_proto` writes them; a PredictResponse adds 24 to
        64 bytes per output (dtype, shape, key).
    "json" (REST): the text of Python's `json.dumps(..., separators=(",", ":"))` of `ndarray.tolist()`. A float32
        value is its double's repr, 17 significant digits: `JSON_FLOAT_BYTES` = 20 with its comma, about 5x its 4
        binary bytes (19.0 characters on average over the test model's outputs; 3 to 23). Padded positions are 0.0
        (`JSON_PAD_BYTES`), real positions the sentences' token counts or the lengths input. Ints cost their widest
        text (the lengths output: the width's), bools "false,", each list "[],", and the row format each output's key
        per row. Measured within 0.99x-1.01x of real responses of the test model, row and columnar formats (an
        all-zero output, such as `default` of empty sentences, is overestimated up to 5x). String outputs are not
        counted (ELMo has none).

TensorProtos (gRPC), `check_tensor_proto`: dtype, declared shape and budget are checked before `tf.make_ndarray`
reads a value (a 79-byte PredictRequest can declare [256, 1000] strings). TensorFlow's `Tensor::FromProto`
(tensorflow/core/framework/tensor.cc) accepts fewer values than the shape holds, `FromProtoField` filling the rest
with the last value (zeros or "" when there is none), and TF Serving serves the request. So does this server, and
the budget counts such a tensor at its declared size: one string declared [256, 1000] is 256,000 tokens of work
(refused by max_request_tokens), one 1 MiB string declared [16, 1000] is 16 GB in (refused by bytes in). More values
than the shape holds (FromProto ignores the extra, `tf.make_ndarray` fails) or a `tensor_content` other than
elements x the dtype's size (FromProto's decoder refuses it) is INVALID_ARGUMENT.

Merged calls (`SignatureRunner.run_batch`): the inputs of several requests to the same signature are concatenated
along axis 0, the padded input padded to the widest request with "" (0 for numbers), which the `tokens` signature
ignores beyond `sequence_len`. The outputs are split back by rows, and outputs with a dynamic axis 1 (`word_emb`,
`lstm_outputs*`, `elmo`, `mask`) cut to the width the request alone would have had: `min(own width, merged width)`
with a padded input, else the request's longest output length. A request's outputs are therefore the same, shape
included, whether it was merged or not. If a merged call fails, its requests are run one by one, so one request's
error never reaches another.
"""

import dataclasses
import logging
import math
import os

import grpc
import numpy as np
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import saved_model_pb2

from serving.status import ServingError, invalid_argument, resource_exhausted, status_code

logger = logging.getLogger("serving.servable")

SERVING_TAG = "serve"
DEFAULT_SIGNATURE = "serving_default"
MiB = 1 << 20
KiB = 1 << 10
WARMUP_TOKEN = b"warmup"
STRING_ELEMENT_BYTES = 32  # a string element's cost besides its bytes: a NumPy object reference (8), a TF tstring (24)
RESPONSE_ENCODINGS = ("proto", "json")

# JSON text of one output value, its separator included (see the module docstring for the measurements)
JSON_FLOAT_BYTES = 20
JSON_PAD_BYTES = 4  # "0.0,"
JSON_BOOL_BYTES = 6  # "false,"
JSON_LIST_BYTES = 3  # "[", "]", ","

INT_DTYPES = frozenset(getattr(types_pb2, f"DT_{t}INT{n}") for t in ("", "U") for n in (8, 16, 32, 64))

# the TensorProto field holding each dtype's values (TF's ProtoHelper); complex values take two entries each
_VALUE_FIELDS = {
    **{getattr(types_pb2, f"DT_{name}"): "int_val" for name in ("INT8", "INT16", "INT32", "UINT8", "UINT16")},
    types_pb2.DT_HALF: "half_val",
    types_pb2.DT_BFLOAT16: "half_val",
    types_pb2.DT_FLOAT: "float_val",
    types_pb2.DT_DOUBLE: "double_val",
    types_pb2.DT_INT64: "int64_val",
    types_pb2.DT_UINT32: "uint32_val",
    types_pb2.DT_UINT64: "uint64_val",
    types_pb2.DT_BOOL: "bool_val",
    types_pb2.DT_STRING: "string_val",
    types_pb2.DT_COMPLEX64: "scomplex_val",
    types_pb2.DT_COMPLEX128: "dcomplex_val",
}

# bytes.split()'s whitespace (ASCII space, \t, \n, \v, \f, \r) -> b" ", every other byte -> b"x"
_TOKEN_MAP = bytes(32 if b in b" \t\n\x0b\x0c\r" else 120 for b in range(256))
_COUNT_CHUNK = 1 << 20


def count_tokens(sentence):
    """len(`split_tokens(sentence)`) for `bytes`, without building the tokens: a 100 MB sentence of one-letter
    words would be 50 million bytes objects; this reads it in 1 MiB chunks."""
    count, previous = 0, b" "
    for start in range(0, len(sentence), _COUNT_CHUNK):
        part = previous + sentence[start : start + _COUNT_CHUNK].translate(_TOKEN_MAP)
        count += part.count(b" x")  # a token starts where a non-space follows a space (or the start)
        previous = part[-1:]
    return count


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


def _positive(name, value, optional=False):
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be {'None or ' if optional else ''}a positive int, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Limits:
    """The request budget; a request above one limit is answered RESOURCE_EXHAUSTED before the model runs (the
    module docstring says how each is counted). Flags are `serving/serve.py`'s.

    Args:
        max_request_sentences: rows (axis 0) of one request (--max_request_sentences).
        max_tokens_per_sentence: width of the padded input, and tokens of each sentence of a sentences input; None
            for no limit (--max_tokens_per_sentence, 0 for none).
        max_response_bytes: the requested outputs' estimated size in the response's encoding
            (--max_message_bytes).
        max_request_tokens: tokens of work of one request, rows x (width or longest sentence); None for no limit
            (--max_request_tokens). 16384 tokens take 0.4 s of the test model on two cores, the 256 x 1000
            allowed by the row and width limits 4.5 s; the original ELMo (about 0.2 GFLOP a token) would take
            some 10 s for 16384 at the 300 GFLOP/s DESIGN.md measured (an estimate).
        max_request_bytes: each input's size as declared, strings at 32 bytes plus their own (--max_message_bytes).
    """

    max_request_sentences: int = 256
    max_tokens_per_sentence: int = 1000
    max_response_bytes: int = 256 * MiB
    max_request_tokens: int = 16384
    max_request_bytes: int = 256 * MiB

    def __post_init__(self):
        for name in ("max_request_sentences", "max_response_bytes", "max_request_bytes"):
            _positive(name, getattr(self, name))
        for name in ("max_tokens_per_sentence", "max_request_tokens"):
            _positive(name, getattr(self, name), optional=True)


@dataclasses.dataclass
class Request:
    """A checked request: NumPy inputs by alias, rows, the width of the padded input (0 without one), the
    estimated output width (tokens), the output names to return (all outputs when the request named none), and
    its budget: tokens of work (rows x `time_estimate`), the estimated response bytes in `response_encoding`."""

    runner: "SignatureRunner"
    inputs: dict
    batch: int
    width: int
    time_estimate: int
    output_filter: tuple
    tokens: int = 0
    response_bytes: int = 0
    response_encoding: str = "proto"


def size_text(num_bytes):
    """1536 -> "1.5 KiB", 3 << 20 -> "3.0 MiB"."""
    return f"{num_bytes / MiB:.1f} MiB" if num_bytes >= MiB else f"{num_bytes / KiB:.1f} KiB"


def check_response_size(outputs, limit):
    """RESOURCE_EXHAUSTED when the arrays of `outputs` hold more than `limit` bytes (after the model ran)."""
    size = sum(value.nbytes for value in outputs.values() if value.dtype != object)
    if size > limit:
        raise resource_exhausted(
            f"the response is {size_text(size)} (outputs {','.join(outputs)}), above the "
            f"server's limit of {size_text(limit)} (--max_message_bytes): send fewer or shorter "
            f"sentences, or fewer outputs (output_filter)"
        )


def _clean_tf_message(message):
    # drop the op trace TF appends ("\n\t [[{{node ...}}]]")
    return message.split("\n\t [[")[0].split("\n\n")[0].strip()


def _json_int_bytes(dtype):
    info = np.iinfo(tf.dtypes.as_dtype(dtype).as_numpy_dtype)
    return max(len(str(info.min)), len(str(info.max))) + 1


class SignatureRunner:
    """Checks requests for one signature and calls its function, alone or on merged requests.

    Args:
        name: signature key, e.g. "default".
        function: the loaded concrete function (`loaded.signatures[name]`).
        signature_def: its `SignatureDef` proto (input/output aliases, dtypes, shapes).
        limits: `Limits`.
    Attributes (the input and output roles, from the SignatureDef's shapes; see the module docstring):
        padded_input: the rank-2 input with a dynamic axis 1, or None.
        lengths_input: the rank-1 integer input beside `padded_input`, or None.
        sentence_inputs: the rank-1 string inputs.
        lengths_output: the rank-1 integer output, or None.
        time_outputs: outputs with a dynamic axis 1 (one entry per token).
    """

    def __init__(self, name, function, signature_def, limits):
        self.name = name
        self.function = function
        self.signature_def = signature_def
        self.limits = limits
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
        self.inner_dims = {}  # alias -> dims after batch (and time), learned at warm-up
        self.mergeable = (
            batch_major
            and len(padded) <= 1
            and (not self.time_outputs or self.padded_input is not None or self.lengths_output is not None)
        )

    # ------------------------------------------------------------------------------------------------ checks

    def _input_error(self, alias, message):
        return invalid_argument(f"input '{alias}' of signature '{self.name}': {message}")

    def check_shape(self, alias, shape):
        """Rank and static dims of input `alias` given its shape, and the budget its shape alone decides (rows,
        width, tokens of work of the padded input, bytes of a numeric input), before its values are read.

        Returns:
            the shape as a tuple of ints.
        """
        spec = self.inputs[alias]
        shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise self._input_error(alias, f"negative dimension in shape {shape_text(shape)}")
        if spec.shape is not None:
            if len(shape) != len(spec.shape):
                raise self._input_error(
                    alias,
                    f"expected rank {len(spec.shape)} (shape {shape_text(spec.shape)}), "
                    f"got rank {len(shape)} (shape {shape_text(shape)})",
                )
            for axis, (want, got) in enumerate(zip(spec.shape, shape)):
                if want is not None and want != got:
                    raise self._input_error(
                        alias,
                        f"expected size {want} on axis {axis} "
                        f"(shape {shape_text(spec.shape)}), got shape {shape_text(shape)}",
                    )
        if shape and shape[0] > self.limits.max_request_sentences:
            raise resource_exhausted(
                f"input '{alias}' has {shape[0]} rows (sentences), above the server's limit of "
                f"{self.limits.max_request_sentences} per request (--max_request_sentences): split the request"
            )
        if alias == self.padded_input:
            limit = self.limits.max_tokens_per_sentence
            if limit is not None and shape[1] > limit:
                raise resource_exhausted(
                    f"input '{alias}' is {shape[1]} tokens wide, above the server's limit of "
                    f"{limit} tokens per sentence (--max_tokens_per_sentence): split long sentences"
                )
            self._check_work(alias, shape[0], shape[1], "wide")
        self._check_bytes(alias, math.prod(shape) * spec.item_size, shape)
        return shape

    def _check_work(self, alias, rows, tokens, what):
        limit = self.limits.max_request_tokens
        if limit is not None and rows * tokens > limit:
            detail = "tokens wide" if what == "wide" else "tokens in the longest sentence (every row is padded to it)"
            raise resource_exhausted(
                f"input '{alias}' is {rows} rows x {tokens} {detail} = {rows * tokens} tokens of work, above the "
                f"server's limit of {limit} tokens per request (--max_request_tokens): split the request"
            )

    def _check_bytes(self, alias, size, shape):
        limit = self.limits.max_request_bytes
        if size > limit:
            spec = self.inputs[alias]
            raise resource_exhausted(
                f"input '{alias}' ({dtype_name(spec.dtype)} {shape_text(shape)}) is {size} bytes "
                f"({size_text(size)}), above the server's limit of {limit} bytes ({size_text(limit)}) per input "
                f"(--max_message_bytes): send fewer or shorter sentences"
            )

    def _check_sentences(self, alias, counts, rows):
        """Budget of sentences input `alias` of `rows` rows, whose first `len(counts)` rows have `counts` tokens and
        the others as many as the last (TF's fill); returns (longest, total) tokens."""
        longest = max(counts, default=0)
        limit = self.limits.max_tokens_per_sentence
        if limit is not None and longest > limit:
            raise resource_exhausted(
                f"sentence {counts.index(longest)} of input '{alias}' has {longest} tokens, above the server's limit "
                f"of {limit} tokens per sentence (--max_tokens_per_sentence): split long sentences"
            )
        self._check_work(alias, rows, longest, "sentences")
        return longest, sum(counts) + (rows - len(counts)) * (counts[-1] if counts else 0)

    def check_tensor_proto(self, alias, proto):
        """Checks a `TensorProto` for input `alias` before its values are read by `tf.make_ndarray`: dtype, the
        declared shape and the budget it implies (rows, width, tokens of work, bytes in: a proto with fewer values
        than its shape is counted at its declared size, as TensorFlow fills it), value counts that do not fit the
        shape (INVALID_ARGUMENT), and for sentences the tokens of each given value.

        Returns:
            the declared shape as a tuple of ints.
        Raises:
            ServingError: INVALID_ARGUMENT or RESOURCE_EXHAUSTED (see the module docstring).
        """
        if alias not in self.inputs:
            raise self.unknown_inputs([alias])
        spec = self.inputs[alias]
        if proto.dtype != spec.dtype:
            raise self._input_error(alias, f"expected dtype {dtype_name(spec.dtype)}, got {dtype_name(proto.dtype)}")
        if proto.tensor_shape.unknown_rank:
            raise self._input_error(alias, "the TensorProto has an unknown rank; give its shape")
        shape = self.check_shape(alias, [d.size for d in proto.tensor_shape.dim])
        elements = math.prod(shape)
        if proto.tensor_content:
            if spec.is_string:
                raise self._input_error(alias, "DT_STRING values must be in string_val, not tensor_content")
            if len(proto.tensor_content) != elements * spec.tf_dtype.size:
                raise self._input_error(
                    alias,
                    f"tensor_content holds {len(proto.tensor_content)} bytes, shape {shape_text(shape)} of "
                    f"{dtype_name(spec.dtype)} needs {elements * spec.tf_dtype.size}",
                )
            return shape
        field = _VALUE_FIELDS.get(spec.dtype)
        if field is None:  # a dtype without a value field here: tf.make_ndarray decides
            return shape
        values = getattr(proto, field)
        count = len(values) // (2 if field in ("scomplex_val", "dcomplex_val") else 1)
        if count > elements:
            raise self._input_error(
                alias,
                f"the TensorProto holds {count} values, more than its shape {shape_text(shape)} holds ({elements})",
            )
        if spec.is_string:
            fill = (elements - count) * (len(values[-1]) if values else 0)
            self._check_bytes(alias, elements * spec.item_size + sum(len(v) for v in values) + fill, shape)
            if alias in self.sentence_inputs:
                self._check_sentences(alias, [count_tokens(v) for v in values], shape[0])
        return shape

    def unknown_inputs(self, names):
        return invalid_argument(
            f"input tensor alias not found in signature: {','.join(sorted(names))}. "
            f"Inputs expected to be in the set {{{','.join(self.inputs)}}}."
        )

    def check_input_names(self, names):
        names = set(names)
        extra = names - set(self.inputs)
        if extra:
            raise self.unknown_inputs(extra)
        missing = set(self.inputs) - names
        if missing:
            raise invalid_argument(
                f"input size does not match signature: {len(names)}!={len(self.inputs)} "
                f"len({{{','.join(sorted(names))}}}) != len({{{','.join(self.inputs)}}}). "
                f"Sent extra: {{}}. Missing but required: {{{','.join(sorted(missing))}}}."
            )

    def check_output_filter(self, output_filter):
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

    def prepare(self, inputs, output_filter=(), response_encoding="proto"):
        """Checks NumPy `inputs` (alias -> array; strings as an object array of bytes) and the budget, and returns a
        `Request`.

        Args:
            inputs: alias -> array.
            output_filter: output names to return (all when empty).
            response_encoding: "proto" (gRPC) or "json" (REST): how the response size is estimated.
        Raises:
            ServingError: INVALID_ARGUMENT or RESOURCE_EXHAUSTED (see the module docstring).
        """
        if response_encoding not in RESPONSE_ENCODINGS:
            raise ValueError(f"response_encoding must be one of {RESPONSE_ENCODINGS}, got {response_encoding!r}")
        self.check_input_names(inputs)
        arrays = {}
        for alias, value in inputs.items():
            spec = self.inputs[alias]
            array = np.asarray(value)
            if spec.is_string:
                if array.dtype.kind not in "OS":
                    raise self._input_error(alias, f"expected dtype DT_STRING, got {array.dtype}")
                array = array.astype(object)
            elif array.dtype != spec.tf_dtype.as_numpy_dtype:
                raise self._input_error(alias, f"expected dtype {dtype_name(spec.dtype)}, got {array.dtype}")
            shape = self.check_shape(alias, array.shape)
            if spec.is_string:
                if any(not isinstance(x, bytes) for x in array.flat):
                    raise self._input_error(alias, "expected bytes values for DT_STRING")
                self._check_bytes(alias, array.size * spec.item_size + sum(len(x) for x in array.flat), shape)
            arrays[alias] = array
        batches = {alias: a.shape[0] for alias, a in arrays.items() if a.ndim}
        if len(set(batches.values())) > 1:
            padded, lengths = self.padded_input, self.lengths_input
            if lengths in batches and padded in batches:
                raise invalid_argument(
                    f"{lengths} must have one entry per row of {padded}: got "
                    f"{batches[lengths]} lengths for {batches[padded]} rows"
                )
            raise invalid_argument(
                "inputs must have the same size on axis 0 (the batch), got "
                + ", ".join(f"{a} {n}" for a, n in sorted(batches.items()))
            )
        batch = next(iter(batches.values()), 1)
        width = arrays[self.padded_input].shape[1] if self.padded_input else 0
        time_estimate, real_tokens = width, batch * width
        if self.lengths_input is not None:
            lengths = arrays[self.lengths_input]
            bad = np.flatnonzero((lengths < 0) | (lengths > width))
            if bad.size:
                row = int(bad[0])
                raise invalid_argument(
                    f"{self.lengths_input} must be in [0, {width}] (the width of {self.padded_input}, axis 1), got "
                    f"{int(lengths[row])} at row {row}"
                )
            real_tokens = int(lengths.sum())
        for alias in self.sentence_inputs:
            counted = {}  # a value repeated (TF's fill) is counted once
            counts = [counted[s] if s in counted else counted.setdefault(s, count_tokens(s)) for s in arrays[alias]]
            longest, total = self._check_sentences(alias, counts, batch)
            if longest >= time_estimate:
                time_estimate, real_tokens = longest, total
        output_filter = self.check_output_filter(tuple(output_filter or ()))
        size = self.response_bytes(batch, time_estimate, output_filter, response_encoding, real_tokens)
        if size > self.limits.max_response_bytes:
            encoding = " as JSON" if response_encoding == "json" else ""
            raise resource_exhausted(
                f"the response would be about {size_text(size)}{encoding} ({batch} sentences x {time_estimate} "
                f"tokens, outputs {','.join(output_filter)}), above the server's limit of "
                f"{size_text(self.limits.max_response_bytes)} (--max_message_bytes): send fewer or shorter "
                f"sentences, or fewer outputs (output_filter)"
            )
        return Request(
            self, arrays, batch, width, time_estimate, output_filter, batch * time_estimate, size, response_encoding
        )

    def _inner_dims(self, alias):
        """Dims of output `alias` after the batch (and time) axes: from the warm-up call, else the SignatureDef (None
        entries count 1); None for an unknown rank."""
        inner = self.inner_dims.get(alias)
        if inner is None:
            spec = self.outputs[alias]
            if spec.shape is None:
                return None
            inner = spec.shape[2:] if alias in self.time_outputs else spec.shape[1:]
        return tuple(1 if d is None else d for d in inner)

    def response_bytes(self, batch, time, aliases, response_encoding="proto", real_tokens=None):
        """Estimated bytes of outputs `aliases` for `batch` rows of `time` tokens (strings not counted).

        Args:
            response_encoding: "proto" (elements x the dtype's size) or "json" (see the module docstring).
            real_tokens: positions that are not padding, for "json" (default `batch * time`: none is padding).
        Dims after the batch (and time) axes come from the SignatureDef, or, where it leaves them unknown, from the
        outputs of the warm-up call.
        """
        positions = batch * time
        real_tokens = positions if real_tokens is None else min(real_tokens, positions)
        total = 0
        for alias in aliases:
            spec = self.outputs[alias]
            inner = self._inner_dims(alias)
            if spec.is_string or inner is None:
                continue
            timed = alias in self.time_outputs
            per_row = math.prod(inner)
            if response_encoding == "proto":
                total += (positions if timed else batch) * per_row * spec.item_size
                continue
            if spec.is_int:
                value = pad = len(str(time)) + 1 if alias == self.lengths_output else _json_int_bytes(spec.dtype)
            elif spec.dtype == types_pb2.DT_BOOL:
                value = pad = JSON_BOOL_BYTES
            else:
                value, pad = JSON_FLOAT_BYTES, JSON_PAD_BYTES
            if timed:
                total += (real_tokens * value + (positions - real_tokens) * pad) * per_row
            else:
                total += batch * value * per_row
            shape = ((batch, time) if timed else (batch,)) + inner
            lists = 1 + sum(math.prod(shape[:axis]) for axis in range(1, len(shape)))  # one per index, last axis aside
            total += lists * JSON_LIST_BYTES + batch * (len(alias) + 4)  # the row format's "alias": per row
        return total

    def learn_inner_dims(self, outputs):
        """Records each output's dims after the batch (and time) axes from real outputs (the warm-up call)."""
        for alias, value in outputs.items():
            if alias in self.outputs:
                self.inner_dims[alias] = tuple(value.shape[2:] if alias in self.time_outputs else value.shape[1:])

    # ------------------------------------------------------------------------------------------------ calls

    def run(self, inputs):
        """One call of the signature function on NumPy `inputs`; returns alias -> NumPy array.

        Raises:
            ServingError: the function failed (TensorFlow's error code and first message line).
        """
        tensors = {alias: tf.constant(value, dtype=self.inputs[alias].tf_dtype) for alias, value in inputs.items()}
        try:
            outputs = self.function(**tensors)
        except tf.errors.OpError as e:
            raise ServingError(status_code(e.error_code), _clean_tf_message(e.message)) from None
        return {alias: value.numpy() for alias, value in outputs.items()}

    def _run_one(self, request):
        try:
            return self.run(request.inputs)
        except ServingError as e:
            return e
        except MemoryError:
            return resource_exhausted("out of memory while running the model: send fewer or shorter sentences")
        except Exception as e:  # never let one request take the server down
            logger.exception("signature %s failed", self.name)
            return ServingError(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")

    def run_batch(self, requests):
        """Runs `requests` (list of `Request`) in one call when there are several; returns, per request, its outputs
        (alias -> array, all outputs) or the `ServingError` it failed with."""
        if len(requests) == 1 or not self.mergeable:
            return [self._run_one(r) for r in requests]
        try:
            outputs = self.run(self._merge(requests))
        except Exception as e:  # one bad request must not fail the others: retry them alone
            logger.warning(
                "merged call of %d requests to %s failed (%s); running them one by one", len(requests), self.name, e
            )
            return [self._run_one(r) for r in requests]
        return self._split(outputs, requests)

    def _merge(self, requests):
        width = max(r.width for r in requests) if self.padded_input else 0
        merged = {}
        for alias, spec in self.inputs.items():
            parts = []
            for r in requests:
                part = r.inputs[alias]
                if alias == self.padded_input and part.shape[1] < width:
                    padded = np.full((part.shape[0], width), b"" if spec.is_string else 0, dtype=part.dtype)
                    padded[:, : part.shape[1]] = part
                    part = padded
                parts.append(part)
            merged[alias] = np.concatenate(parts, axis=0)
        return merged

    def _split(self, outputs, requests):
        merged_time = next((outputs[a].shape[1] for a in sorted(self.time_outputs) if a in outputs), 0)
        results, start = [], 0
        for r in requests:
            rows = slice(start, start + r.batch)
            start += r.batch
            if self.padded_input:
                own = min(r.width, merged_time)
            else:
                lengths = outputs[self.lengths_output][rows] if self.time_outputs else np.zeros(0)
                own = min(int(lengths.max()) if lengths.size else 0, merged_time)
            results.append(
                {
                    alias: value[rows, :own] if alias in self.time_outputs else value[rows]
                    for alias, value in outputs.items()
                }
            )
        return results

    def warmup_inputs(self):
        """One small valid-looking request: strings "warmup", numbers 1, dynamic dims 1."""
        inputs = {}
        for alias, spec in self.inputs.items():
            shape = tuple(1 if d is None else d for d in (spec.shape if spec.shape is not None else (1,)))
            if spec.is_string:
                inputs[alias] = np.full(shape, WARMUP_TOKEN, dtype=object)
            else:
                inputs[alias] = np.ones(shape, spec.tf_dtype.as_numpy_dtype)
        return inputs


# ---------------------------------------------------------------------------------------------------- loading


def read_signature_defs(export_dir, tag=SERVING_TAG):
    """The SignatureDefs (name -> proto) of the MetaGraph tagged `tag` in a SavedModel directory."""
    saved_model = saved_model_pb2.SavedModel()
    pb = os.path.join(export_dir, "saved_model.pb")
    pbtxt = os.path.join(export_dir, "saved_model.pbtxt")
    if os.path.isfile(pb):
        with open(pb, "rb") as f:
            saved_model.ParseFromString(f.read())
    elif os.path.isfile(pbtxt):
        with open(pbtxt, encoding="utf-8") as f:
            text_format.Parse(f.read(), saved_model)
    else:
        raise FileNotFoundError(f"{export_dir} holds no saved_model.pb or saved_model.pbtxt")
    for meta_graph in saved_model.meta_graphs:
        if tag in meta_graph.meta_info_def.tags:
            return dict(meta_graph.signature_def)
    raise ValueError(
        f"{export_dir}: no MetaGraph tagged {tag!r} (found "
        f"{[list(m.meta_info_def.tags) for m in saved_model.meta_graphs]})"
    )


def _load_op_libraries():
    # a `--tokenizer unicode_script` export needs tensorflow-text's ops registered before loading
    try:
        import tensorflow_text  # noqa: F401
    except ImportError:
        logger.debug("tensorflow-text not installed: exports using its ops will not load")


class Servable:
    """A loaded version of a model: `runners` by signature name, and the SignatureDefs for GetModelMetadata.

    Attributes:
        model_name, version, path: what was loaded from where.
        signature_defs: every SignatureDef of the MetaGraph (`__saved_model_init_op` included, as TF Serving
            reports them).
        runners: `SignatureRunner` by name, for the signatures that can be called.
        scheduler: the `BatchScheduler` feeding this version (set by the server when batching is on).
    """

    def __init__(self, model_name, version, path, loaded, signature_defs, runners):
        self.model_name = model_name
        self.version = version
        self.path = path
        self.loaded = loaded
        self.signature_defs = signature_defs
        self.runners = runners
        self.scheduler = None

    def runner(self, signature_name):
        """The runner of `signature_name` ("" means serving_default); NOT_FOUND when there is none."""
        name = signature_name or DEFAULT_SIGNATURE
        runner = self.runners.get(name)
        if runner is None:
            raise ServingError(
                grpc.StatusCode.NOT_FOUND,
                f'Serving signature key "{name}" not found. Signatures of model '
                f"{self.model_name} version {self.version}: {sorted(self.runners)}",
            )
        return runner

    def warm_up(self):
        """Runs every signature once: a missing op or a broken graph fails here, not at the first request."""
        for name, runner in sorted(self.runners.items()):
            runner.learn_inner_dims(runner.run(runner.warmup_inputs()))
            logger.debug("warmed up %s version %d signature %s", self.model_name, self.version, name)


def load_servable(model_name, version, path, limits=None):
    """Loads `path` (a SavedModel version directory) with `tf.saved_model.load`, and warms up every signature.

    Raises:
        Exception: whatever loading or warming up raised (the caller logs it and keeps the previous version).
    """
    _load_op_libraries()
    limits = limits or Limits()
    signature_defs = read_signature_defs(path)
    loaded = tf.saved_model.load(path, tags=[SERVING_TAG])
    runners = {
        name: SignatureRunner(name, function, signature_defs[name], limits)
        for name, function in loaded.signatures.items()
        if name in signature_defs
    }
    if not runners:
        raise ValueError(f"{path}: the SavedModel has no callable signatures")
    servable = Servable(model_name, version, path, loaded, signature_defs, runners)
    servable.warm_up()
    return servable
