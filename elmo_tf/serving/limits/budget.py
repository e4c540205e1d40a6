"""The request budget: what one request may cost, checked before anything is built from it, so a bad or costly request
fails alone and at once.

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
            to the longest); x the position cost of a
            signature with a softmax (`lm`, below)
        bytes in: each input as declared, elements x the       max_request_bytes        --max_message_bytes
            dtype's size; strings 32 bytes each plus their
            bytes (a value repeated to fill the shape counted
            each time)
        bytes out: the requested outputs' size estimated from  max_response_bytes       --max_message_bytes
            rows x tokens x widths, in the response's encoding
            (`elmo_tf.serving.limits.response_size`)
A signature whose function reads a softmax kernel `(V, P)` (the `lm` signature) scores every position of both
directions over the whole vocabulary: a position costs `softmax_position_cost` = 1 + 2 V P / `BILM_TOKEN_MACS` tokens of
work (9.1 at the original ELMo's 793,471 x 512 softmax; about 1 for a small one).
Input roles (padded input, lengths, sentences) are the signature's (`elmo_tf.serving.signature`). A sentence's tokens
are those the signature's own tokenizer makes (`elmo_tf.serving.limits.token_count`): runs of ASCII whitespace counted
in Python for a `--tokenizer whitespace` export, tensorflow-text's UnicodeScriptTokenizer run on the sentences for a
`unicode_script` one (`["a," * 1500]` is 3,000 tokens), counted before the model runs and stopped once a sentence
passes what the limits allow; an export's own `--max-tokens` cut happens later, in the graph.

TensorProtos (gRPC), `RequestBudget.check_tensor_proto`: dtype, declared shape and budget are checked before
`tf.make_ndarray` reads a value (a 79-byte PredictRequest can declare [256, 1000] strings). TensorFlow's
`Tensor::FromProto` (tensorflow/core/framework/tensor.cc) accepts fewer values than the shape holds, `FromProtoField`
filling the rest with the last value (zeros or "" when there is none), and TF Serving serves the request. So does this
server, and the budget counts such a tensor at its declared size: one string declared [256, 1000] is 256,000 tokens of
work (refused by max_request_tokens), one 1 MiB string declared [16, 1000] is 16 GB in (refused by bytes in). More
values than the shape holds (FromProto ignores the extra, `tf.make_ndarray` fails) or a `tensor_content` other than
elements x the dtype's size (FromProto's decoder refuses it) is INVALID_ARGUMENT. The values are read as FromProto
reads them (`read_tensor_proto`: int8/int16/uint8/uint16 values in `int_val` narrowed, not refused).
"""

import dataclasses
import math

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, types_pb2

from elmo_tf.errors import check_int
from elmo_tf.serving.limits.byte_units import MiB, size_text
from elmo_tf.serving.limits.response_size import RESPONSE_ENCODINGS, ResponseSizes
from elmo_tf.serving.limits.token_count import WhitespaceCounter, count_tokens
from elmo_tf.serving.serving_error import invalid_argument, resource_exhausted
from elmo_tf.serving.signature import dtype_name, shape_text

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


_NARROW_INT_VAL = (types_pb2.DT_INT8, types_pb2.DT_INT16, types_pb2.DT_UINT8, types_pb2.DT_UINT16)


def read_tensor_proto(proto):
    """The NumPy array of a checked `TensorProto` (`RequestBudget.check_tensor_proto`), as `Tensor::FromProto` reads
    it: `tf.make_ndarray`, except that the int32 `int_val` of an int8, int16, uint8 or uint16 tensor is narrowed to
    the dtype as TensorFlow's FromProtoField copies it (tensor.cc: `PROTO_TRAITS(int8, int32, int)`, `std::copy_n`:
    a C++ conversion, 300 as int8 is 44, -1 as uint8 is 255), where `tf.make_ndarray` under NumPy 2 raises
    OverflowError."""
    if proto.dtype in _NARROW_INT_VAL and not proto.tensor_content and proto.int_val:
        wide = tensor_pb2.TensorProto(dtype=types_pb2.DT_INT32, tensor_shape=proto.tensor_shape, int_val=proto.int_val)
        return tf.make_ndarray(wide).astype(tf.dtypes.as_dtype(proto.dtype).as_numpy_dtype)
    return tf.make_ndarray(proto)


SOFTMAX_KERNEL = "softmax_kernel"  # the name of `elmo_tf.models.LanguageModel`'s softmax weights
BILM_TOKEN_MACS = 10**8  # multiply-adds of one token through the original ELMo biLM (about 0.2 GFLOP)


def softmax_position_cost(variables):
    """Tokens of work of one position of a signature whose function reads `variables` (`ConcreteFunction.variables`):
    1 + 2 V P / `BILM_TOKEN_MACS` for a softmax kernel `(V, P)` among them, else 1."""
    for variable in variables:
        if SOFTMAX_KERNEL in variable.name and variable.shape.rank == 2:
            rows, width = (int(d) for d in variable.shape)
            return 1.0 + 2.0 * rows * width / BILM_TOKEN_MACS
    return 1.0


def check_response_size(outputs, limit):
    """RESOURCE_EXHAUSTED when the arrays of `outputs` hold more than `limit` bytes (after the model ran)."""
    size = sum(value.nbytes for value in outputs.values() if value.dtype != object)
    if size > limit:
        raise resource_exhausted(
            f"the response is {size_text(size)} (outputs {','.join(outputs)}), above the "
            f"server's limit of {size_text(limit)} (--max_message_bytes): send fewer or shorter "
            f"sentences, or fewer outputs (output_filter)"
        )


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
            some 10 s for 16384 at 300 GFLOP/s (an estimate).
        max_request_bytes: each input's size as declared, strings at 32 bytes plus their own (--max_message_bytes).
    """

    max_request_sentences: int = 256
    max_tokens_per_sentence: int = 1000
    max_response_bytes: int = 256 * MiB
    max_request_tokens: int = 16384
    max_request_bytes: int = 256 * MiB

    def __post_init__(self):
        for name in ("max_request_sentences", "max_response_bytes", "max_request_bytes"):
            check_int(name, getattr(self, name), 1)
        for name in ("max_tokens_per_sentence", "max_request_tokens"):
            check_int(name, getattr(self, name), 1, allow_none=True)


@dataclasses.dataclass
class Request:
    """A checked request: NumPy inputs by alias, rows, the width of the padded input (0 without one), the
    estimated output width (tokens), the output names to return (all outputs when the request named none), and
    its budget: tokens of work (rows x `time_estimate`), the estimated response bytes in `response_encoding`."""

    inputs: dict
    batch: int
    width: int
    time_estimate: int
    output_filter: tuple
    tokens: int = 0
    response_bytes: int = 0
    response_encoding: str = "proto"


def _batch_size(signature, arrays):
    """The rows shared by every input (1 when every input is a scalar); INVALID_ARGUMENT if they differ."""
    batches = {alias: a.shape[0] for alias, a in arrays.items() if a.ndim}
    if len(set(batches.values())) > 1:
        padded, lengths = signature.padded_input, signature.lengths_input
        if lengths in batches and padded in batches:
            raise invalid_argument(
                f"{lengths} must have one entry per row of {padded}: got "
                f"{batches[lengths]} lengths for {batches[padded]} rows"
            )
        raise invalid_argument(
            "inputs must have the same size on axis 0 (the batch), got "
            + ", ".join(f"{a} {n}" for a, n in sorted(batches.items()))
        )
    return next(iter(batches.values()), 1)


def _sentence_counts(counter, limits, values, rows):
    """(token counts of the sentences `values`, per row, counted by `counter`; the row counted only in
    part, or None). A value repeated (TF's fill) is counted once; counting stops at the first sentence above
    what the limits allow a sentence of a request of `rows` rows (rows after it count 0: the request fails)."""
    values = list(values)
    unique = list(dict.fromkeys(values))
    bounds = [limits.max_tokens_per_sentence]
    if limits.max_request_tokens is not None and rows:
        bounds.append(limits.max_request_tokens // rows)
    bounds = [b for b in bounds if b is not None]
    counts, partial = counter.counts(unique, min(bounds) if bounds else None)
    by_value = dict(zip(unique, counts))
    partial_row = values.index(unique[partial]) if partial is not None else None
    return [by_value.get(v, 0) for v in values], partial_row


class RequestBudget:
    """Checks requests to one signature against `Limits`, from what they declare before what they hold.

    Args:
        signature: `elmo_tf.serving.signature.Signature`.
        limits: `Limits`.
        sizes: the signature's `ResponseSizes` (a new one when None).
        counter: how the signature's tokenizer counts the tokens of a sentences input
            (`elmo_tf.serving.limits.token_count`; runs of ASCII whitespace when None).
        position_cost: tokens of work per position (`softmax_position_cost`; 1 for the ELMo signatures).
    """

    def __init__(self, signature, limits, sizes=None, counter=None, position_cost=1.0):
        self.counter = counter if counter is not None else WhitespaceCounter()
        self.signature = signature
        self.limits = limits
        self.sizes = sizes if sizes is not None else ResponseSizes(signature)
        self.position_cost = position_cost

    # ------------------------------------------------------------------------------------------------ shapes

    def check_shape(self, alias, shape):
        """Rank and static dims of input `alias` given its shape, and the budget its shape alone decides (rows,
        width, tokens of work of the padded input, bytes of a numeric input), before its values are read.

        Returns:
            the shape as a tuple of ints.
        """
        spec = self.signature.inputs[alias]
        shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise self.signature.input_error(alias, f"negative dimension in shape {shape_text(shape)}")
        if spec.shape is not None:
            if len(shape) != len(spec.shape):
                raise self.signature.input_error(
                    alias,
                    f"expected rank {len(spec.shape)} (shape {shape_text(spec.shape)}), "
                    f"got rank {len(shape)} (shape {shape_text(shape)})",
                )
            for axis, (want, got) in enumerate(zip(spec.shape, shape)):
                if want is not None and want != got:
                    raise self.signature.input_error(
                        alias,
                        f"expected size {want} on axis {axis} "
                        f"(shape {shape_text(spec.shape)}), got shape {shape_text(shape)}",
                    )
        if shape and shape[0] > self.limits.max_request_sentences:
            raise resource_exhausted(
                f"input '{alias}' has {shape[0]} rows (sentences), above the server's limit of "
                f"{self.limits.max_request_sentences} per request (--max_request_sentences): split the request"
            )
        if alias == self.signature.padded_input:
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
        work = rows * tokens * self.position_cost
        if limit is not None and work > limit:
            detail = "tokens wide" if what == "wide" else "tokens in the longest sentence (every row is padded to it)"
            cost = "" if self.position_cost == 1 else f" x {self.position_cost:.3g} (the softmax's cost per position)"
            raise resource_exhausted(
                f"input '{alias}' is {rows} rows x {tokens} {detail}{cost} = {work:.0f} tokens of work, above the "
                f"server's limit of {limit} tokens per request (--max_request_tokens): split the request"
            )

    def _check_bytes(self, alias, size, shape):
        limit = self.limits.max_request_bytes
        if size > limit:
            spec = self.signature.inputs[alias]
            raise resource_exhausted(
                f"input '{alias}' ({dtype_name(spec.dtype)} {shape_text(shape)}) is {size} bytes "
                f"({size_text(size)}), above the server's limit of {limit} bytes ({size_text(limit)}) per input "
                f"(--max_message_bytes): send fewer or shorter sentences"
            )

    def _check_sentences(self, alias, counts, rows, partial=None):
        """Budget of sentences input `alias` of `rows` rows, whose first `len(counts)` rows have `counts` tokens and
        the others as many as the last (TF's fill); returns (longest, total) tokens. `partial`: the row whose count
        is a lower bound (its counting stopped above the limits), or None."""
        longest = max(counts, default=0)
        limit = self.limits.max_tokens_per_sentence
        if limit is not None and longest > limit:
            row = counts.index(longest)
            raise resource_exhausted(
                f"sentence {row} of input '{alias}' has {'at least ' if row == partial else ''}{longest} tokens, "
                f"above the server's limit of {limit} tokens per sentence (--max_tokens_per_sentence): split long "
                f"sentences"
            )
        self._check_work(alias, rows, longest, "sentences")
        return longest, sum(counts) + (rows - len(counts)) * (counts[-1] if counts else 0)

    # ------------------------------------------------------------------------------------------------ TensorProtos

    def check_tensor_proto(self, alias, proto):
        """Checks a `TensorProto` for input `alias` before its values are read by `tf.make_ndarray`: dtype, the
        declared shape and the budget it implies (rows, width, tokens of work, bytes in: a proto with fewer values
        than its shape is counted at its declared size, as TensorFlow fills it), value counts that do not fit the
        shape (INVALID_ARGUMENT), and for sentences of a whitespace-tokenized signature the tokens of each given value
        (another tokenizer's tokens are counted by `prepare`, once the array is read, still before the model runs).

        Returns:
            the declared shape as a tuple of ints.
        Raises:
            ServingError: INVALID_ARGUMENT or RESOURCE_EXHAUSTED (see the module docstring).
        """
        signature = self.signature
        if alias not in signature.inputs:
            signature.check_input_names([alias])  # raises: check_tensor_proto is called after check_input_names
        spec = signature.inputs[alias]
        if proto.dtype != spec.dtype:
            raise signature.input_error(
                alias, f"expected dtype {dtype_name(spec.dtype)}, got {dtype_name(proto.dtype)}"
            )
        if proto.tensor_shape.unknown_rank:
            raise signature.input_error(alias, "the TensorProto has an unknown rank; give its shape")
        shape = self.check_shape(alias, [d.size for d in proto.tensor_shape.dim])
        elements = math.prod(shape)
        if proto.tensor_content:
            if spec.is_string:
                raise signature.input_error(alias, "DT_STRING values must be in string_val, not tensor_content")
            if len(proto.tensor_content) != elements * spec.tf_dtype.size:
                raise signature.input_error(
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
            raise signature.input_error(
                alias,
                f"the TensorProto holds {count} values, more than its shape {shape_text(shape)} holds ({elements})",
            )
        if spec.is_string:
            fill = (elements - count) * (len(values[-1]) if values else 0)
            self._check_bytes(alias, elements * spec.item_size + sum(len(v) for v in values) + fill, shape)
            if alias in signature.sentence_inputs and isinstance(self.counter, WhitespaceCounter):
                # exact and cheap here; another tokenizer's count waits for `prepare`, still before the model runs
                self._check_sentences(alias, [count_tokens(v) for v in values], shape[0])
        return shape

    # ------------------------------------------------------------------------------------------------ requests

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
        self.signature.check_input_names(inputs)
        arrays = {alias: self._check_array(alias, value) for alias, value in inputs.items()}
        batch = _batch_size(self.signature, arrays)
        width = arrays[self.signature.padded_input].shape[1] if self.signature.padded_input else 0
        time_estimate, real_tokens = self._tokens(arrays, batch, width)
        output_filter = self.signature.check_output_filter(tuple(output_filter or ()))
        size = self.sizes.response_bytes(batch, time_estimate, output_filter, response_encoding, real_tokens)
        if size > self.limits.max_response_bytes:
            encoding = " as JSON" if response_encoding == "json" else ""
            raise resource_exhausted(
                f"the response would be about {size_text(size)}{encoding} ({batch} sentences x {time_estimate} "
                f"tokens, outputs {','.join(output_filter)}), above the server's limit of "
                f"{size_text(self.limits.max_response_bytes)} (--max_message_bytes): send fewer or shorter "
                f"sentences, or fewer outputs (output_filter)"
            )
        return Request(
            arrays, batch, width, time_estimate, output_filter, batch * time_estimate, size, response_encoding
        )

    def _check_array(self, alias, value):
        """Input `alias` as a NumPy array of the signature's dtype, its shape and bytes within the budget."""
        spec = self.signature.inputs[alias]
        array = np.asarray(value)
        if spec.is_string:
            if array.dtype.kind not in "OS":
                raise self.signature.input_error(alias, f"expected dtype DT_STRING, got {array.dtype}")
            array = array.astype(object)
        elif array.dtype != spec.tf_dtype.as_numpy_dtype:
            raise self.signature.input_error(alias, f"expected dtype {dtype_name(spec.dtype)}, got {array.dtype}")
        shape = self.check_shape(alias, array.shape)
        if spec.is_string:
            if any(not isinstance(x, bytes) for x in array.flat):
                raise self.signature.input_error(alias, "expected bytes values for DT_STRING")
            self._check_bytes(alias, array.size * spec.item_size + sum(len(x) for x in array.flat), shape)
        return array

    def _tokens(self, arrays, batch, width):
        """(estimated output width, real tokens): the padded input's width and lengths, or the longest sentence and
        the sentences' tokens, whichever is wider; checks the lengths and the sentences' budget."""
        signature = self.signature
        time_estimate, real_tokens = width, batch * width
        if signature.lengths_input is not None:
            lengths = arrays[signature.lengths_input]
            bad = np.flatnonzero((lengths < 0) | (lengths > width))
            if bad.size:
                row = int(bad[0])
                raise invalid_argument(
                    f"{signature.lengths_input} must be in [0, {width}] (the width of {signature.padded_input}, "
                    f"axis 1), got {int(lengths[row])} at row {row}"
                )
            real_tokens = int(lengths.sum())
        for alias in signature.sentence_inputs:
            counts, partial = _sentence_counts(self.counter, self.limits, arrays[alias], batch)
            longest, total = self._check_sentences(alias, counts, batch, partial)
            if longest >= time_estimate:
                time_estimate, real_tokens = longest, total
        return time_estimate, real_tokens
