"""`Embedder`: an `ELMo` model run on packed rows of sentences, its token vectors computed once per batch.

- Packed rows (`elmo_tf.embed.packing`): the biLM restarts both directions from the zero state at every sentence
  (`BiLM(segment_starts=...)`), so a sentence gets exactly the vectors it gets alone.
- Token vectors: the char CNN runs once per distinct token of a batch (in chunks of `cnn_chunk` tokens, which
  bounds its memory), not once per occurrence, and not again for a token still in the LRU memo of recent tokens
  (`memo_size`); `<S>`/`</S>` once per model; with a token-embedding cache (`elmo_tf.io.token_cache.TokenCache`,
  the same object `ELMo.use_token_embeddings` takes), not at all for its words. A token's vector does not depend
  on its batch, so none of this changes an output beyond float rounding (tested to 1e-6).
- The input gates of each LSTM layer are computed `gate_chunk` steps at a time (bounded memory).
- Precision: the model's (`ELMo(precision=...)`): a bfloat16 model's traced functions read its layers' bfloat16
  copies, converted once (`elmo_tf.layers.low_precision`).
- Every Keras backend: the plan above is NumPy; the model runs through the two functions of
  `elmo_tf.embed.backend_functions` (`tf.function`s on TensorFlow, `jax.jit` under JAX, eager PyTorch), so this module
  imports no TensorFlow off it.
"""

import collections

import numpy as np

from elmo_tf.embed import backend_functions
from elmo_tf.embed.packing import BOUNDARIES, ROW_LENGTH, pack_rows, packed_layout, piece_batches
from elmo_tf.errors import check_int
from elmo_tf.io.token_cache import TokenCache
from elmo_tf.precision import PrecisionError, resolve_precision
from elmo_tf.preprocessing.chars import token_bytes

# A char-CNN call's tokens are padded with all-zero rows (no token; sliced off) to a multiple of this. TensorFlow's
# oneDNN convolutions keep a compiled primitive per input shape they meet (a cache per op, up to 1,024 each): a chunk
# of any size from 1 to `cnn_chunk`, times the cut width (`CharCNN.encode_tokens`), made a long embed run meet
# thousands of shapes, and its RSS grew by about 300 MiB over 100,000 lines (bench/README.md, "Corpus scale").
CNN_TOKENS_MULTIPLE = 32
# A char-CNN call's convolution outputs are about (tokens x cut width x 2,048 channels) floats: up to 110 MB for 256
# tokens at the full width of 50 (a token of 45 bytes or more among them). Fresh tokens go through the CNN shortest
# first, and a call holds at most `cnn_chunk` tokens and `cnn_chunk * CNN_WIDTH_PER_TOKEN` char positions (tokens x
# its longest token's cut width), so a batch with a long token needs no more memory than a typical one: the peak RSS
# of a long run no longer waits for the rare batch that has one (bench/README.md, "Corpus scale").
CNN_WIDTH_PER_TOKEN = 24
LAYER_CHOICES = ("all", "top", "average")


def _padded_count(count):
    """`count` tokens rounded up to a multiple of CNN_TOKENS_MULTIPLE, as a char-CNN call holds them."""
    return -(-count // CNN_TOKENS_MULTIPLE) * CNN_TOKENS_MULTIPLE


class Embedder:
    """Runs an `ELMo` model on lists of tokens in packed rows; any batch and length, compiled once (under JAX once per
    padded shape: a few per run).

    Args:
        model: an `ELMo` model.
        layers: "all" -> `(L+1, n, 2P)`, "top" -> `(n, 2P)`, "average" -> `(n, 2P)` (mean of the L+1 layers).
        token_embeddings: optional `elmo_tf.io.token_cache.TokenCache`, or `(vocabulary, array)`: tokens (bytes or
            str) and their precomputed token vectors `(len(vocabulary), P)` (`elmo_tf.io.token_embeddings`); other
            tokens go through the char CNN.
        row_length: positions per packed row (`embed_batch` packs its sentences into rows of this size).
        gate_chunk: LSTM steps whose input gates are computed at once.
        cnn_chunk: tokens per char-CNN call.
        memo_size: token vectors of the most recently seen distinct tokens kept from batch to batch (an LRU memo: a
            frequent word goes through the char CNN once per run, not once per batch; 0 turns it off). Memory:
            `memo_size * P` floats (16 MiB for 8192 tokens of the original P = 512).
        precision: None (the model's), or what the embedder must compute in: one of `elmo_tf.precision.PRECISIONS`,
            resolved ("auto") and checked against the model's computed precision (the model's layers hold the
            bfloat16 copies: load the model with the precision, `load_elmo(..., precision=...)`). A mismatch is a
            `PrecisionError` naming both.
    Attributes:
        precision: the precision computed in, "float32" or "bfloat16" (the model's).
    """

    def __init__(
        self,
        model,
        layers="all",
        token_embeddings=None,
        row_length=ROW_LENGTH,
        gate_chunk=8,
        cnn_chunk=256,
        memo_size=8192,
        precision=None,
    ):
        if layers not in LAYER_CHOICES:
            raise ValueError(f"layers must be one of {LAYER_CHOICES}, got {layers!r}")
        self.precision = model_precision(model)
        if precision is not None and resolve_precision(precision) != self.precision:
            raise PrecisionError(
                f"precision {precision!r} computes in {resolve_precision(precision)}, but the model computes in "
                f"{self.precision}: load the model with precision={precision!r}",
                key="precision",
            )
        self.model = model
        self.layers = layers
        self.row_length = check_int("row_length", row_length, 1)
        self.gate_chunk = check_int("gate_chunk", gate_chunk, 1)
        self.cnn_chunk = check_int("cnn_chunk", cnn_chunk, 1)
        self.memo_size = check_int("memo_size", memo_size, 0)
        self._memo = collections.OrderedDict()  # token bytes -> vector, least recently used first
        width = model.config.projection_dim
        mapping = model.char_mapping
        self._char_ids = mapping.numpy  # token list -> char ids (bilm-tf's bytes, or a char vocabulary)
        # the tokens reaching it are distinct already (`token_vectors`), so `encode_tokens`, not `encode_distinct`
        # (whose unique op would also fold the all-zero rows a chunk is padded with: see CNN_TOKENS_MULTIPLE); both
        # compiled as the backend's users compile a model (`backend_functions`)
        self._encode, self._run = backend_functions.functions(model, layers, self.gate_chunk)
        # rows 0, 1, 2 of every batch's vector table: padding, <S>, </S>
        self._fixed = np.concatenate(
            [
                np.zeros([1, width], np.float32),
                np.asarray(self._encode(np.stack([mapping.bos_row, mapping.eos_row]).astype(np.int32))),
            ]
        )
        self.token_cache = None if token_embeddings is None else TokenCache.of(token_embeddings, width)
        self.stats = {"tokens": 0, "distinct": 0, "cached": 0, "memo": 0, "positions": 0, "padded_positions": 0}

    def reset_memo(self):
        """Empties the LRU memo of token vectors (`embed_file` does at every shard, so that a shard is computed the
        same whatever ran before it in this process)."""
        self._memo.clear()

    @property
    def empty_shape(self):
        width = 2 * self.model.config.projection_dim
        return (self.model.num_output_layers, 0, width) if self.layers == "all" else (0, width)

    def token_vectors(self, tokens):
        """`(table, rows)`: the vector table of `tokens` (padding, `<S>`, `</S>`, then each distinct token once) and
        the table row of each token. Tokens of the token cache and of the memo are looked up, the others go through
        the char CNN (`CharCNN.encode_tokens`), shortest first, in calls of at most `cnn_chunk` tokens and a bounded
        number of char positions (`_cnn_calls`)."""
        rows_of, distinct = {}, []
        rows = np.empty(len(tokens), np.int32)
        for k, token in enumerate(tokens):
            row = rows_of.get(token)
            if row is None:
                row = rows_of[token] = len(self._fixed) + len(distinct)
                distinct.append(token)
            rows[k] = row
        vectors = np.empty([len(distinct), self._fixed.shape[1]], np.float32)
        fresh, cached, memo = [], 0, 0
        cache = self.token_cache
        cache_row = cache.row if cache is not None else (lambda token: None)
        for k, token in enumerate(distinct):
            row = cache_row(token)
            if row is not None:
                vectors[k] = cache.embedding[row]
                cached += 1
                continue
            vector = self._memo.get(token)
            if vector is not None:
                self._memo.move_to_end(token)
                vectors[k] = vector
                memo += 1
                continue
            fresh.append(k)
        if fresh:
            ids = self._char_ids([distinct[k] for k in fresh])
            lengths = self.model.char_cnn.token_lengths(ids)
            order = np.argsort(lengths, kind="stable")  # shortest first: calls of similar cut widths
            fresh_rows, ids = np.asarray(fresh)[order], ids[order]
            for start, stop in self._cnn_calls(lengths[order]):
                count = stop - start
                padded = np.pad(ids[start:stop], ((0, _padded_count(count) - count), (0, 0)))
                vectors[fresh_rows[start:stop]] = np.asarray(self._encode(padded))[:count]
        if self.memo_size:
            for k in fresh[-self.memo_size :]:
                self._memo[distinct[k]] = vectors[k].copy()
            while len(self._memo) > self.memo_size:
                self._memo.popitem(last=False)
        self.stats["distinct"] += len(distinct)
        self.stats["cached"] += cached
        self.stats["memo"] += memo
        return np.concatenate([self._fixed, vectors]), rows

    def _cnn_calls(self, lengths):
        """`(start, stop)` of each char-CNN call over tokens sorted by `lengths` (ascending): at most `cnn_chunk`
        tokens, and (tokens rounded up to CNN_TOKENS_MULTIPLE) x (`CharCNN.window_span` of the last one) at most
        `cnn_chunk * CNN_WIDTH_PER_TOKEN` char positions, but never fewer than CNN_TOKENS_MULTIPLE tokens."""
        budget = self.cnn_chunk * CNN_WIDTH_PER_TOKEN
        span = self.model.char_cnn.window_span
        start, n = 0, len(lengths)
        while start < n:
            stop = min(n, start + self.cnn_chunk)
            while stop - start > CNN_TOKENS_MULTIPLE:
                padded = _padded_count(stop - start)
                if padded * span(lengths[stop - 1]) <= budget:
                    break
                stop = start + padded - CNN_TOKENS_MULTIPLE
            yield start, stop
            start = stop

    def embed_rows(self, rows):
        """Embeds packed rows: `rows` is a list of rows, each a list of sentences (token lists, bytes or str, at
        least one token each). Returns one float32 array per sentence, rows first, in order."""
        sentences = [s for row in rows for s in row]
        if not sentences:
            return []
        if any(len(s) == 0 for s in sentences):
            raise ValueError("embed_rows: every sentence needs at least one token (write empty ones directly)")
        tokens = [token_bytes(t) for s in sentences for t in s]
        table, token_rows = self.token_vectors(tokens)
        table_rows, starts, positions = packed_layout([[len(s) for s in row] for row in rows], token_rows)
        self.stats["tokens"] += len(tokens)
        self.stats["positions"] += int((table_rows > 0).sum())
        self.stats["padded_positions"] += table_rows.size
        out = np.asarray(self._run(table, table_rows, starts, positions))
        results, k = [], 0
        for s in sentences:
            n = len(s)
            results.append(out[:, k : k + n] if self.layers == "all" else out[k : k + n])
            k += n
        return results

    def shape_of(self, n_tokens):
        """The shape of a sentence's array: `(L+1, n_tokens, 2P)` for "all" layers, `(n_tokens, 2P)` otherwise."""
        shape = list(self.empty_shape)
        shape[-2] = n_tokens
        return tuple(shape)

    def embed_pieces(self, tokens, max_sentence_tokens, batch_size=64, max_batch_tokens=None):
        """Embeds a long sentence (`tokens`, at least one) split into consecutive pieces of `max_sentence_tokens`
        tokens, each embedded as a sentence of its own (between its own `<S>` and `</S>`): yields the float32 array
        of each piece, in order (their concatenation along the token axis -2 is the sentence's array), computed in
        calls of at most `batch_size` pieces and `max_batch_tokens` positions (`piece_batches`), so that no model
        call grows with the sentence."""
        for call in piece_batches(len(tokens), max_sentence_tokens, batch_size, max_batch_tokens):
            yield from self.embed_rows([[tokens[start:stop]] for start, stop in call])

    def embed_batch(self, sentences):
        """`sentences`: list of token lists (bytes or str). Returns one float32 array per sentence (empty ones
        included), packing them into rows of `row_length` positions."""
        results = [np.zeros(self.empty_shape, np.float32) for _ in sentences]
        real = [i for i, s in enumerate(sentences) if len(s) > 0]
        if not real:
            return results
        rows = [
            [real[i] for i in row] for row in pack_rows([len(sentences[i]) + BOUNDARIES for i in real], self.row_length)
        ]
        embedded = self.embed_rows([[sentences[i] for i in row] for row in rows])
        for i, array in zip((i for row in rows for i in row), embedded):
            results[i] = array
        return results


def model_precision(model):
    """What `model` (an `ELMo`, or anything with a `char_cnn` and a `bilm`) computes in: "float32" or "bfloat16"."""
    precision = getattr(model, "precision", None)
    return precision if precision is not None else getattr(model.bilm, "precision", "float32")


def use_threads(threads):
    """Gives TensorFlow's intra-op and inter-op pools `threads` threads each (0 or None: TensorFlow's own choice),
    as `embed`, `score` and a Beam worker do before their model loads. A process whose TensorFlow already runs keeps
    its pools (TensorFlow's RuntimeError is ignored: a Beam worker may run several DoFns)."""
    if not threads:
        return
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:
        pass


def runtime_fingerprint():
    """What of the process a resumable run's journal records beside its settings (`embed_file`, `score_file`): the
    TensorFlow version and its thread pools (either can change the last bits of the arrays)."""
    import tensorflow as tf

    return {
        "tensorflow": tf.__version__,
        "threads": [
            tf.config.threading.get_intra_op_parallelism_threads(),
            tf.config.threading.get_inter_op_parallelism_threads(),
        ],
    }
