"""Packed merged calls: the sentences of several `default`/`tokens` requests run through the export's internal `packed`
signature (`elmo_tf.saved_model.contract`) as `elmo-tf embed` runs them: several sentences per row, each between its own
`<S>` and `</S>` with the biLM restarted at its start, and each distinct token through the char CNN once per call. A
merged call of the `default`/`tokens` signatures pads every sentence to the longest and encodes every occurrence.

The sentences are packed with embed's planning functions (`contract.pack_token_lists`: `pack_rows`,
`group_rows`, `packed_layout`), `max_rows` rows per call, and each request's outputs are put back together exactly as
its own signature gives them alone (same keys, shapes, dtypes and zeros at padded positions; values within float
rounding): `word_emb`, `lstm_outputs*`, `elmo` `(batch, T, ...)`, `default` (the mean of `elmo` over the sentence's
tokens), `sequence_len`, `mask`, with T the request's longest sentence (`default`) or its padded input's width
(`tokens`), both cut to the export's `max_tokens`.

What is packed: a signature whose outputs are exactly ELMo's (`contract.output_keys`) and whose inputs are
either one batch of sentences tokenized on whitespace (a `--tokenizer unicode_script` export's `default` is not packed:
its tokenizer runs in the graph only) or padded tokens with their lengths. Anything else (`lm`, NER exports, an
export without `packed`, a request whose `sequence_len` is out of range, a batch without a token) returns None and
takes the merged path of `elmo_tf.serving.batching.merge`.
"""

import logging
import math

import numpy as np

from elmo_tf.preprocessing.chars import token_bytes
from elmo_tf.preprocessing.tokenizer import split_tokens
from elmo_tf.saved_model.contract import (
    ACTIVATIONS,
    DEFAULT,
    ELMO,
    MASK,
    MAX_TOKENS,
    PACKED_SIGNATURE,
    SEQUENCE_LEN,
    STARTS,
    TABLE_ROWS,
    WORD_EMB,
    lstm_output_key,
    output_keys,
    pack_token_lists,
)
from elmo_tf.serving.limits.budget import RequestBudget
from elmo_tf.serving.limits.token_count import WhitespaceCounter
from elmo_tf.serving.serving_error import resource_exhausted
from elmo_tf.serving.signature import shape_text

logger = logging.getLogger(__name__)

SENTENCES_MODE = "sentences"
TOKENS_MODE = "tokens"


def packing_mode(runner):
    """How `runner`'s requests are read into token lists (`SENTENCES_MODE`, `TOKENS_MODE`), or None when its signature
    is not one the packed signature can answer."""
    signature = runner.signature
    layers = sum(1 for key in signature.outputs if key.startswith("lstm_outputs"))
    if set(signature.outputs) != set(output_keys(layers)):
        return None
    if len(signature.inputs) == 1 and len(signature.sentence_inputs) == 1:
        return SENTENCES_MODE if isinstance(runner.budget.counter, WhitespaceCounter) else None
    if len(signature.inputs) == 2 and signature.padded_input is not None and signature.lengths_input is not None:
        return TOKENS_MODE
    return None


class PackedBudget(RequestBudget):
    """The budget of a request sent to `packed` itself (an internal signature, but a SignatureDef the server answers):
    its work is every position of `table_rows` (rows x steps, whatever the distinct tokens), held to
    `max_request_tokens` like the rows x width of the other signatures (RESOURCE_EXHAUSTED above it). Checked on the
    declared shape (of `table_rows` and of `starts`, which has the same), before a TensorProto's values are read or a
    tensor built: a 113-byte request declaring `[1, 8192, 8192]` cost 320 MiB before it was refused (issue 38)."""

    def check_shape(self, alias, shape):
        shape = super().check_shape(alias, shape)
        if alias in (TABLE_ROWS, STARTS):
            positions, limit = math.prod(shape), self.limits.max_request_tokens
            if limit is not None and positions > limit:
                raise resource_exhausted(
                    f"the request holds {positions} packed positions ({alias} {shape_text(shape)}), above the "
                    f"server's limit of {limit} tokens of work per request (--max_request_tokens)"
                )
        return shape


def attach_packed(runners, probe=True):
    """Sets `runner.packed` (the `packed` signature's runner) on each runner of `runners` (name -> `SignatureRunner`)
    that `packing_mode` accepts, when there is a `packed` runner, and gives the `packed` runner a `PackedBudget`; with
    `probe`, reads the export's `max_tokens` now with one small call (`read_max_tokens`), else at the first packed
    call (a load without warm-up runs nothing). Returns the names of the runners it set."""
    packed = runners.get(PACKED_SIGNATURE)
    if packed is None:
        return []
    budget = packed.budget
    packed.budget = PackedBudget(packed.signature, budget.limits, packed.sizes, budget.counter)
    if probe:
        read_max_tokens(packed)
    names = []
    for name, runner in sorted(runners.items()):
        if name != PACKED_SIGNATURE and packing_mode(runner) is not None:
            runner.packed = packed
            names.append(name)
    return names


def read_max_tokens(packed):
    """The export's `max_tokens` (None: no cut), read with one small call of the `packed` runner the first time and
    kept in its `max_tokens` (0 there: read, no cut)."""
    if packed.max_tokens is None:
        ((inputs, _),) = pack_token_lists([[b"a"]])
        packed.max_tokens = int(packed.run(inputs)[MAX_TOKENS][0])
    return packed.max_tokens or None


def _token_lists(runner, request, max_tokens):
    """`(token lists, width)` of one request as its signature reads it; None when it must run alone (a
    `sequence_len` the signature refuses)."""
    signature = runner.signature
    if packing_mode(runner) == SENTENCES_MODE:
        lists = [split_tokens(token_bytes(s))[:max_tokens] for s in request.inputs[signature.sentence_inputs[0]]]
        return lists, max((len(t) for t in lists), default=0)
    tokens = request.inputs[signature.padded_input]
    lengths = np.asarray(request.inputs[signature.lengths_input])
    width = tokens.shape[1]
    if lengths.shape != (tokens.shape[0],) or (lengths < 0).any() or (lengths > width).any():
        return None
    if max_tokens is not None:
        width, lengths = min(width, max_tokens), np.minimum(lengths, max_tokens)
    return [[token_bytes(t) for t in row[:n]] for row, n in zip(tokens, lengths)], width


def _empty_outputs(runner, batch, width, layers, dim):
    """Zero outputs of `batch` sentences of `width` positions, keyed and typed as `runner`'s signature."""
    shapes = {WORD_EMB: (batch, width, dim // 2), ELMO: (batch, width, dim), DEFAULT: (batch, dim)}
    shapes.update({lstm_output_key(k): (batch, width, dim) for k in range(1, layers)})
    shapes.update({SEQUENCE_LEN: (batch,), MASK: (batch, width)})
    specs = runner.signature.outputs
    return {key: np.zeros(shape, specs[key].tf_dtype.as_numpy_dtype) for key, shape in shapes.items()}


def run_packed(runner, requests, max_rows):
    """Runs the sentences of `requests` (`budget.Request`s of `runner`) through `runner.packed`, `max_rows` rows per
    call; returns each request's outputs (alias -> array, all outputs) as its signature gives them alone, or None when
    they cannot be packed (see the module docstring). Raises what a packed call raised."""
    packed = getattr(runner, "packed", None)
    if packed is None:
        return None
    max_tokens = read_max_tokens(packed)
    read = [_token_lists(runner, r, max_tokens) for r in requests]
    if any(x is None for x in read):
        return None
    flat = [t for lists, _ in read for t in lists]
    calls = pack_token_lists(flat, max_rows)
    if not calls:
        return None
    got = {}  # flat sentence index -> (activations (L+1, n, 2P), elmo (n, 2P))
    for inputs, placed in calls:
        out = packed.run(inputs)
        acts, elmo = out[ACTIVATIONS][0], out[ELMO][0]
        for i, first in placed:
            n = len(flat[i])
            got[i] = (acts[:, first : first + n], elmo[first : first + n])
    layers, _, dim = next(iter(got.values()))[0].shape
    results, k = [], 0
    for lists, width in read:
        outputs = _empty_outputs(runner, len(lists), width, layers, dim)
        for row, tokens in enumerate(lists):
            n = len(tokens)
            outputs[SEQUENCE_LEN][row] = n
            outputs[MASK][row, :n] = True
            if n:
                acts, elmo = got[k + row]
                outputs[WORD_EMB][row, :n] = acts[0, :, : dim // 2]
                for layer in range(1, layers):
                    outputs[lstm_output_key(layer)][row, :n] = acts[layer]
                outputs[ELMO][row, :n] = elmo
                outputs[DEFAULT][row] = elmo.sum(axis=0) / n
        k += len(lists)
        results.append(outputs)
    return results
