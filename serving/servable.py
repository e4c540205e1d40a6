"""One loaded version of a SavedModel: its SignatureDefs, request checks, model calls and merged (batched) calls.

A request is checked against the SignatureDef before the model runs, so a bad request fails alone with a clear
status, as TF Serving answers it:
    - unknown input names, missing inputs: INVALID_ARGUMENT ("input size does not match signature ...");
    - a dtype or rank that differs from the SignatureDef: INVALID_ARGUMENT naming the input, expected and received;
    - `sequence_len` (the `tokens` signature) with another batch size than `tokens`, or outside [0, width]:
      INVALID_ARGUMENT naming `sequence_len` (the graph would fail with the same message);
    - unknown or repeated `output_filter` names: INVALID_ARGUMENT;
    - more rows than `Limits.max_request_sentences`, a `tokens` input wider than `Limits.max_tokens_per_sentence`,
      a sentence with more whitespace-separated tokens than that, or a response estimated above
      `Limits.max_response_bytes`: RESOURCE_EXHAUSTED, before the model runs (the server checks the real
      response size again after the call: see `check_response_size`).
The token count of a `sentences` input is `len(sentence.split())` over ASCII whitespace: exact for `--tokenizer
whitespace` exports, a lower bound for `unicode_script` ones (which also split punctuation); an export's own
`--max-tokens` cut happens later, in the graph.

Merged calls (`SignatureRunner.run_batch`): the inputs of several requests to the same signature are concatenated
along axis 0; a rank-2 input with a dynamic axis 1 (`tokens`) is padded to the widest request with "" (0 for
numbers), which the `tokens` signature ignores beyond `sequence_len`. The outputs are split back by rows, and
outputs with a dynamic axis 1 (`word_emb`, `lstm_outputs*`, `elmo`, `mask`) are cut to the width the request
alone would have had: `min(own tokens width, merged width)` for `tokens`, the request's longest `sequence_len` for
`sentences`. A request's outputs are therefore the same, shape included, whether it was merged or not.
If a merged call fails, its requests are run one by one, so one request's error never reaches another.
"""

import dataclasses
import logging
import os

import grpc
import numpy as np
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import saved_model_pb2

from elmo_tf.preprocessing.tokenizer import split_tokens
from elmo_tf.serving_contract import SEQUENCE_LEN, TOKENS
from serving.status import ServingError, invalid_argument, resource_exhausted, status_code

logger = logging.getLogger("serving.servable")

SERVING_TAG = "serve"
DEFAULT_SIGNATURE = "serving_default"
MiB = 1 << 20
KiB = 1 << 10
WARMUP_TOKEN = b"warmup"


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

    def describe(self):
        return f"{dtype_name(self.dtype)} {shape_text(self.shape)}"


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-request limits; a request above one is answered RESOURCE_EXHAUSTED before the model runs.

    Args:
        max_request_sentences: rows (axis 0) of one request.
        max_tokens_per_sentence: width of a `tokens` input, and whitespace-separated tokens of each sentence of a
            `sentences` input; None for no limit.
        max_response_bytes: the requested outputs' estimated size (float32 4 bytes, bool 1 byte per element).
    """

    max_request_sentences: int = 256
    max_tokens_per_sentence: int = 1000
    max_response_bytes: int = 256 * MiB

    def __post_init__(self):
        for name in ("max_request_sentences", "max_response_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        value = self.max_tokens_per_sentence
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"max_tokens_per_sentence must be None or a positive int, got {value!r}")


@dataclasses.dataclass
class Request:
    """A checked request: NumPy inputs by alias, rows, the width of the padded input (or None), the estimated
    output width, and the output names to return (all outputs when the request named none)."""

    runner: "SignatureRunner"
    inputs: dict
    batch: int
    width: int
    time_estimate: int
    output_filter: tuple


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


class SignatureRunner:
    """Checks requests for one signature and calls its function, alone or on merged requests.

    Args:
        name: signature key, e.g. "default".
        function: the loaded concrete function (`loaded.signatures[name]`).
        signature_def: its `SignatureDef` proto (input/output aliases, dtypes, shapes).
        limits: `Limits`.
    """

    def __init__(self, name, function, signature_def, limits):
        self.name = name
        self.function = function
        self.signature_def = signature_def
        self.limits = limits
        self.inputs = {a: TensorSpec.from_tensor_info(i) for a, i in sorted(signature_def.inputs.items())}
        self.outputs = {a: TensorSpec.from_tensor_info(i) for a, i in sorted(signature_def.outputs.items())}
        padded = [a for a, s in self.inputs.items() if s.shape is not None and len(s.shape) == 2 and s.shape[1] is None]
        self.padded_input = padded[0] if len(padded) == 1 else None
        self.time_outputs = frozenset(
            a for a, s in self.outputs.items() if s.shape is not None and len(s.shape) >= 2 and s.shape[1] is None
        )
        specs = list(self.inputs.values()) + list(self.outputs.values())
        batch_major = bool(self.inputs) and all(s.shape and s.shape[0] is None for s in specs)
        self.inner_dims = {}  # alias -> dims after batch (and time), learned at warm-up
        self.mergeable = (
            batch_major
            and len(padded) <= 1
            and (not self.time_outputs or self.padded_input is not None or SEQUENCE_LEN in self.outputs)
        )

    # ------------------------------------------------------------------------------------------------ checks

    def _input_error(self, alias, message):
        return invalid_argument(f"input '{alias}' of signature '{self.name}': {message}")

    def check_shape(self, alias, shape):
        """Rank, static dims and size limits of input `alias` given its shape (before its values are read)."""
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
        if (
            alias == self.padded_input
            and self.limits.max_tokens_per_sentence is not None
            and shape[1] > self.limits.max_tokens_per_sentence
        ):
            raise resource_exhausted(
                f"input '{alias}' is {shape[1]} tokens wide, above the server's limit of "
                f"{self.limits.max_tokens_per_sentence} tokens per sentence (--max_tokens_per_sentence): "
                f"split long sentences"
            )
        return shape

    def check_tensor_proto(self, alias, proto):
        """dtype and shape of a `TensorProto` for input `alias`, before its values are read (a small proto can
        declare a huge shape)."""
        if alias not in self.inputs:
            raise self.unknown_inputs([alias])
        spec = self.inputs[alias]
        if proto.dtype != spec.dtype:
            raise self._input_error(alias, f"expected dtype {dtype_name(spec.dtype)}, got {dtype_name(proto.dtype)}")
        if proto.tensor_shape.unknown_rank:
            raise self._input_error(alias, "the TensorProto has an unknown rank; give its shape")
        self.check_shape(alias, [d.size for d in proto.tensor_shape.dim])

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

    def prepare(self, inputs, output_filter=()):
        """Checks NumPy `inputs` (alias -> array; strings as an object array of bytes) and returns a `Request`.

        Raises:
            ServingError: INVALID_ARGUMENT or RESOURCE_EXHAUSTED (see the module docstring).
        """
        self.check_input_names(inputs)
        arrays = {}
        for alias, value in inputs.items():
            spec = self.inputs[alias]
            array = np.asarray(value)
            if spec.is_string:
                if array.dtype.kind not in "OS":
                    raise self._input_error(alias, f"expected dtype DT_STRING, got {array.dtype}")
                array = array.astype(object)
                if any(not isinstance(x, bytes) for x in array.flat):
                    raise self._input_error(alias, "expected bytes values for DT_STRING")
            elif array.dtype != spec.tf_dtype.as_numpy_dtype:
                raise self._input_error(alias, f"expected dtype {dtype_name(spec.dtype)}, got {array.dtype}")
            self.check_shape(alias, array.shape)
            arrays[alias] = array
        batches = {alias: a.shape[0] for alias, a in arrays.items() if a.ndim}
        if len(set(batches.values())) > 1:
            if SEQUENCE_LEN in batches and TOKENS in batches:
                raise invalid_argument(
                    f"sequence_len must have one entry per row of tokens: got "
                    f"{batches[SEQUENCE_LEN]} lengths for {batches[TOKENS]} rows"
                )
            raise invalid_argument(
                "inputs must have the same size on axis 0 (the batch), got "
                + ", ".join(f"{a} {n}" for a, n in sorted(batches.items()))
            )
        batch = next(iter(batches.values()), 1)
        width = arrays[self.padded_input].shape[1] if self.padded_input else 0
        if TOKENS in arrays and SEQUENCE_LEN in arrays and arrays[SEQUENCE_LEN].ndim == 1:
            lengths = arrays[SEQUENCE_LEN]
            bad = np.flatnonzero((lengths < 0) | (lengths > width))
            if bad.size:
                row = int(bad[0])
                raise invalid_argument(
                    f"sequence_len must be in [0, {width}] (the width of tokens, axis 1), got "
                    f"{int(lengths[row])} at row {row}"
                )
        time_estimate = width
        for alias, array in arrays.items():
            spec = self.inputs[alias]
            if spec.is_string and array.ndim == 1 and alias != self.padded_input:
                counts = [len(split_tokens(s)) for s in array]
                longest = max(counts, default=0)
                time_estimate = max(time_estimate, longest)
                limit = self.limits.max_tokens_per_sentence
                if limit is not None and longest > limit:
                    row = counts.index(longest)
                    raise resource_exhausted(
                        f"sentence {row} of input '{alias}' has {longest} tokens, above the server's limit of "
                        f"{limit} tokens per sentence (--max_tokens_per_sentence): split long sentences"
                    )
        output_filter = self.check_output_filter(tuple(output_filter or ()))
        size = self.response_bytes(batch, time_estimate, output_filter)
        if size > self.limits.max_response_bytes:
            raise resource_exhausted(
                f"the response would be about {size_text(size)} ({batch} sentences x {time_estimate} tokens, "
                f"outputs {','.join(output_filter)}), above the server's limit of "
                f"{size_text(self.limits.max_response_bytes)} (--max_message_bytes): send fewer or shorter "
                f"sentences, or fewer outputs (output_filter)"
            )
        return Request(self, arrays, batch, width, time_estimate, output_filter)

    def response_bytes(self, batch, time, aliases):
        """Estimated bytes of outputs `aliases` for `batch` rows of `time` tokens (strings not counted).

        Dims after the batch (and time) axes come from the SignatureDef, or, where it leaves them unknown, from the
        outputs of the warm-up call.
        """
        total = 0
        for alias in aliases:
            spec = self.outputs[alias]
            if spec.is_string:
                continue
            inner = self.inner_dims.get(alias)
            if inner is None:
                if spec.shape is None:
                    continue
                inner = spec.shape[2:] if alias in self.time_outputs else spec.shape[1:]
            count = batch * (time if alias in self.time_outputs else 1)
            for dim in inner:
                count *= dim if dim is not None else 1
            total += count * spec.tf_dtype.size
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
                lengths = outputs[SEQUENCE_LEN][rows] if self.time_outputs else np.zeros(0)
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
