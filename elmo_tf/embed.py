"""Embedding many sentences with an `ELMo` model: packed rows, token vectors computed once per batch, streamed.

The library side of `python -m elmo_tf embed`; nothing here prints.

How a batch is run (`Embedder`):
  - Packed rows: a row holds several sentences back to back, each between its own `<S>` and `</S>`
    (`<S> a b </S> <S> c d e </S> ...`); the biLM restarts both directions from the zero state at every
    sentence (`BiLM(segment_starts=...)`), so a sentence gets exactly the vectors it gets alone. Rows are
    filled best-fit (`pack_rows`) so almost no step of the LSTM loop is spent on padding, whatever the order
    of the corpus.
  - Token vectors: the char CNN runs once per distinct token of a batch (in chunks of `cnn_chunk` tokens, which
    bounds its memory), not once per occurrence, and not again for a token still in the LRU memo of recent tokens
    (`memo_size`); `<S>`/`</S>` once per model; with a token-embedding cache (`elmo_tf.io.token_cache.TokenCache`,
    the same object `ELMo.use_token_embeddings` takes), not at all for its words. A token's vector does not depend
    on its batch, so none of this changes an output beyond float rounding (tested to 1e-6).
  - The input gates of each LSTM layer are computed `gate_chunk` steps at a time (bounded memory).

How a file is run (`embed_file`), resumable:
  - One plan: the input is read once and planned into batches (`iter_plan`), the same batches for the same input and
    settings; consecutive batches form shards of about `shard_tokens` tokens.
  - A journal: each shard is written, once done, as an embed output of its own lines (`write_embedding_file`) into
    `.<output name>.partial/` beside the output, fsync'd before it counts (`elmo_tf.io.journal.RunJournal`); at the
    end the shards are copied into the output (`merge_shards`) and the journal removed.
  - Resume: the same call with `resume=True` replays the plan, skips the shards on the disk and computes the others;
    the token memo restarts with every shard, so each shard is computed exactly as in an uninterrupted run and the
    file is the same, value for value. The journal's fingerprint (input content, model weights, token cache, every
    setting) must match, or the resume is refused.
  - `embed_sentences` + `write_embedding_file` embed any set of lines (a worker's share of a larger input, keeping
    their global line indices) into a valid embed output: the pieces a distributed job is made of.
"""

import bisect
import collections
import hashlib
import itertools
import json
import logging

import h5py
import numpy as np
import tensorflow as tf

from elmo_tf.errors import ElmoTFError, check_int
from elmo_tf.io.journal import RunJournal, check_unchanged, fault_point, file_digest, file_state
from elmo_tf.io.sentences import INDEX_DATASET, EmbeddingWriter, iter_sentences, sentence_key
from elmo_tf.io.text import TextFileError
from elmo_tf.io.token_cache import TokenCache
from elmo_tf.models.elmo import elmo_activations, model_fingerprint
from elmo_tf.preprocessing.chars import token_bytes

logger = logging.getLogger(__name__)

LAYER_CHOICES = ("all", "top", "average")
DTYPES = ("float32", "float16")  # of the written arrays; computed in float32 either way
SHARD_TOKENS = 50_000  # tokens per shard of embed_file's journal: about a minute of the original model on 2 cores
ROW_LENGTH = 64  # positions per packed row (a sentence of n tokens takes n + 2); longer sentences get a row each
BOUNDARIES = 2  # <S> and </S> around every sentence


def pack_rows(sizes, row_length=ROW_LENGTH):
    """Best-fit decreasing: puts items of `sizes` (positions each) into as few rows of `row_length` as it can.

    An item larger than `row_length` gets a row of its own. Returns a list of rows, each a list of item
    indices, the fullest rows first (rows of similar fill end up in the same batch).
    """
    row_length = check_int("row_length", row_length, 1)
    order = sorted(range(len(sizes)), key=lambda i: -sizes[i])
    rows, fill = [], []
    free = []  # sorted (room left, row number) of rows that can still take an item
    for i in order:
        size = sizes[i]
        if size < 1:
            raise ValueError(f"sizes must be positive, got {size} at {i}")
        k = bisect.bisect_left(free, (size, -1))
        if k < len(free):  # the row with the least room that still fits
            room, row = free.pop(k)
            rows[row].append(i)
            fill[row] += size
            if room - size > 0:
                bisect.insort(free, (room - size, row))
            continue
        rows.append([i])
        fill.append(size)
        if row_length - size > 0:
            bisect.insort(free, (row_length - size, len(rows) - 1))
    return [rows[r] for r in sorted(range(len(rows)), key=lambda r: -fill[r])]


def group_rows(row_sizes, batch_size, max_batch_positions=None):
    """Groups consecutive rows into batches of at most `batch_size` rows and `rows x longest <= max_batch_positions`
    positions (a row longer than that is a batch of its own). Returns lists of row numbers."""
    batch_size = check_int("batch_size", batch_size, 1)
    max_batch_positions = check_int("max_batch_positions", max_batch_positions, 1, allow_none=True)
    batches, batch, longest = [], [], 0
    for r, size in enumerate(row_sizes):
        new_longest = max(longest, size)
        if batch and (
            len(batch) == batch_size
            or (max_batch_positions is not None and (len(batch) + 1) * new_longest > max_batch_positions)
        ):
            batches.append(batch)
            batch, new_longest = [], size
        batch.append(r)
        longest = new_longest
    if batch:
        batches.append(batch)
    return batches


def plan_batches(
    lengths,
    batch_size=64,
    max_batch_tokens=None,
    sort=True,
    window=None,
    row_length=ROW_LENGTH,
):
    """Plans packed batches for sentences of `lengths` tokens, in one pass over them (a stream works the same).

    Sentences are gathered into a window, packed into rows (`pack_rows`, positions = tokens + 2) and the rows
    grouped into batches of `batch_size` rows (`group_rows`, at most `max_batch_tokens` positions each). A window
    is packed once it holds `window` sentences (default `50 * batch_size` with `sort`, one batch worth of
    positions without it: corpus order with only as much look-ahead as one batch needs); the rows of a last,
    incomplete batch go back to the window to be packed with the sentences that follow. Empty sentences (length
    0) are not batched; the caller writes them directly.

    Returns:
        list of batches; a batch is a list of rows; a row is a list of sentence indices.
    """
    return list(
        iter_batches(((i, n) for i, n in enumerate(lengths)), batch_size, max_batch_tokens, sort, window, row_length)
    )


def iter_batches(items, batch_size=64, max_batch_tokens=None, sort=True, window=None, row_length=ROW_LENGTH):
    """`plan_batches` over a stream: `items` yields `(key, n_tokens)`; yields batches (lists of rows of keys) as soon
    as they are complete, holding at most about one window of items."""
    batch_size = check_int("batch_size", batch_size, 1)
    row_length = check_int("row_length", row_length, 1)
    max_batch_tokens = check_int("max_batch_tokens", max_batch_tokens, 1, allow_none=True)
    window = check_int("window", window, 1, allow_none=True)
    pending = []  # (key, size in positions)
    filled = 0

    def full():
        if sort:
            return len(pending) >= (window or 50 * batch_size)
        return filled >= (window or batch_size * row_length)

    def flush(final):
        rows = pack_rows([size for _, size in pending], row_length)
        row_sizes = [sum(pending[i][1] for i in row) for row in rows]
        batches = group_rows(row_sizes, batch_size, max_batch_tokens)
        keep = []
        if not final and len(batches[-1]) < batch_size:
            keep = [pending[i] for r in batches.pop() for i in rows[r]]
        done = [[[pending[i][0] for i in rows[r]] for r in batch] for batch in batches]
        return done, keep

    for key, n in items:
        if n < 0:
            raise ValueError(f"lengths must be >= 0, got {n} for {key!r}")
        if n == 0:
            continue
        pending.append((key, n + BOUNDARIES))
        filled += n + BOUNDARIES
        if full():
            done, pending = flush(final=False)
            filled = sum(size for _, size in pending)
            yield from done
    if pending:
        done, _ = flush(final=True)
        yield from done


def packed_layout(row_lengths, token_rows):
    """The packed-row inputs of `Embedder._run` (also the served `packed` signature's, `elmo_tf.serving_contract`):
    `row_lengths` is a list of rows, each a list of sentence lengths (tokens, at least 1 each); `token_rows` the
    vector-table row of every token, sentences in order (table rows 0, 1, 2 are padding, `<S>`, `</S>`). Returns
    `(table_rows, starts, positions)`: int32 `(rows, steps)` (each sentence as `<S> tokens </S>`, 0 past a row's
    end), bool `(rows, steps)` (True where a sentence starts), int32 `(tokens, 2)` ((row, step) of every token)."""
    steps = max((sum(n + BOUNDARIES for n in row) for row in row_lengths), default=0)
    table_rows = np.zeros([len(row_lengths), steps], np.int32)
    starts = np.zeros([len(row_lengths), steps], bool)
    positions = np.empty([len(token_rows), 2], np.int32)
    bos, eos = 1, 2
    k = 0
    for r, row in enumerate(row_lengths):
        at = 0
        for n in row:
            starts[r, at] = True
            table_rows[r, at] = bos
            table_rows[r, at + 1 : at + 1 + n] = token_rows[k : k + n]
            table_rows[r, at + 1 + n] = eos
            positions[k : k + n, 0] = r
            positions[k : k + n, 1] = np.arange(at + 1, at + 1 + n)
            at += n + BOUNDARIES
            k += n
    return table_rows, starts, positions


class Embedder:
    """Runs an `ELMo` model on lists of tokens in packed rows; any batch and length, compiled once.

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
    ):
        if layers not in LAYER_CHOICES:
            raise ValueError(f"layers must be one of {LAYER_CHOICES}, got {layers!r}")
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
        self._encode = tf.function(
            lambda ids: model.char_cnn.encode_distinct(ids),
            input_signature=[tf.TensorSpec([None, mapping.width], tf.int32)],
        )
        # rows 0, 1, 2 of every batch's vector table: padding, <S>, </S>
        self._fixed = np.concatenate(
            [
                np.zeros([1, width], np.float32),
                self._encode(np.stack([mapping.bos_row, mapping.eos_row]).astype(np.int32)),
            ]
        )
        self.token_cache = None if token_embeddings is None else TokenCache.of(token_embeddings, width)
        self.stats = {"tokens": 0, "distinct": 0, "cached": 0, "memo": 0, "positions": 0, "padded_positions": 0}

        @tf.function(
            input_signature=[
                tf.TensorSpec([None, width], tf.float32),  # vector table of the batch
                tf.TensorSpec([None, None], tf.int32),  # (rows, steps): table row of each position, 0 = padding
                tf.TensorSpec([None, None], tf.bool),  # (rows, steps): a sentence starts here
                tf.TensorSpec([None, 2], tf.int32),  # (n, 2): (row, step) of every real token, in output order
            ]
        )
        def run(table, table_rows, starts, positions):
            x = tf.gather(table, table_rows)
            lstm = model.bilm(x, mask=table_rows > 0, segment_starts=starts, gate_chunk=self.gate_chunk)
            acts = elmo_activations(tf.gather_nd(x, positions), [tf.gather_nd(layer, positions) for layer in lstm])
            if layers == "all":
                return tf.stack(acts)  # (L+1, n, 2P)
            if layers == "top":
                return acts[-1]
            return tf.add_n(acts) / len(acts)

        self._run = run

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
        the char CNN (`CharCNN.encode_distinct`), `cnn_chunk` at a time."""
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
        for start in range(0, len(fresh), self.cnn_chunk):
            part = fresh[start : start + self.cnn_chunk]
            vectors[part] = self._encode(self._char_ids([distinct[k] for k in part])).numpy()
        if self.memo_size:
            for k in fresh[-self.memo_size :]:
                self._memo[distinct[k]] = vectors[k].copy()
            while len(self._memo) > self.memo_size:
                self._memo.popitem(last=False)
        self.stats["distinct"] += len(distinct)
        self.stats["cached"] += cached
        self.stats["memo"] += memo
        return np.concatenate([self._fixed, vectors]), rows

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
        out = self._run(table, table_rows, starts, positions).numpy()
        results, k = [], 0
        for s in sentences:
            n = len(s)
            results.append(out[:, k : k + n] if self.layers == "all" else out[k : k + n])
            k += n
        return results

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


def limit_malloc_arenas(arenas=2):
    """Caps glibc's malloc arenas for this process (`mallopt(M_ARENA_MAX, arenas)`); returns True when set.

    Each thread that allocates under contention gets an arena of its own, and freed memory stays in it: with
    TensorFlow's thread pools that is about 100 MB of peak RSS on the original model (measured with
    bench/embed_throughput.py, batch 32: 1,697 -> 1,599 MiB, speed within noise). Called by `python -m elmo_tf
    embed` before the model loads; a no-op where glibc is not the C library.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        return bool(libc.mallopt(-8, int(arenas)))  # M_ARENA_MAX = -8 in glibc's malloc.h
    except (OSError, AttributeError):
        return False


def check_dtype(dtype):
    """`dtype` ("float32" or "float16", or their numpy dtypes) as its name; ElmoTFError naming it otherwise."""
    name = np.dtype(dtype).name if isinstance(dtype, (type, np.dtype)) else dtype
    if name not in DTYPES:
        raise ElmoTFError(f"dtype must be one of {DTYPES}, got {dtype!r}", key="dtype")
    return name


def cast_embedding(array, dtype, index=None):
    """`array` (float32) as `dtype`, rounded to the nearest; ElmoTFError when a finite value does not fit (float16's
    largest is 65504: ELMo's outputs stay far below it, but a model with huge weights may not)."""
    with np.errstate(over="ignore"):  # checked below, with a message naming the line
        out = np.asarray(array, dtype=dtype)
    if out.dtype != np.float32 and not np.isfinite(out).all() and np.isfinite(array).all():
        where = f" (line index {index})" if index is not None else ""
        largest = float(np.abs(array).max())
        raise ElmoTFError(f"a value of magnitude {largest:.6g}{where} does not fit {dtype}: use float32", key="dtype")
    return out


def iter_plan(sentences, batch_size=64, max_batch_tokens=None, sort=True, row_length=ROW_LENGTH):
    """The work for a stream of `elmo_tf.io.sentences.Sentence`s, in the one order a run follows: yields
    `(empties, batch)`, the empty sentences read since the previous item and a batch (a list of rows, each a list of
    `Sentence`s; `iter_batches` plans them); the last item's batch is None (the empty lines read last, maybe none).
    The same stream and settings give the same items, however much of it is computed: what makes a resumed run
    follow the uninterrupted one batch for batch."""
    empties, pending = [], {}

    def items():
        for sentence in sentences:
            if not sentence.tokens:
                empties.append(sentence)
                continue
            pending[sentence.index] = sentence
            yield sentence.index, len(sentence.tokens)

    for batch in iter_batches(items(), batch_size, max_batch_tokens, sort, row_length=row_length):
        read, empties[:] = list(empties), []
        yield read, [[pending.pop(i) for i in row] for row in batch]
    yield list(empties), None


def _embed_items(embedder, items, dtype, progress=None):
    """(Sentence, array as `dtype`) for every sentence of the `(empties, batch)` items, in their order."""
    for empties, batch in items:
        for sentence in empties:
            yield sentence, np.zeros(embedder.empty_shape, dtype)
        done = len(empties)
        if batch:
            flat = [s for row in batch for s in row]
            arrays = embedder.embed_rows([[s.tokens for s in row] for row in batch])
            for sentence, array in zip(flat, arrays):
                yield sentence, cast_embedding(array, dtype, sentence.index)
            done += len(flat)
            fault_point("batch")
        if progress and done:
            progress(done)


def embed_sentences(
    embedder, sentences, batch_size=64, max_batch_tokens=None, sort=True, row_length=ROW_LENGTH, dtype="float32"
):
    """Yields `(sentence, array)` for each `Sentence` of `sentences` (any iterable: a file's `iter_sentences`, a set of
    lines of a larger input keeping their global `index`), packed and batched as `embed_file` does (`iter_plan`), as
    soon as each batch is done; empty sentences get `(L+1, 0, 2P)` zeros. `array` has `dtype` ("float32" or
    "float16"). What a worker of a distributed job calls on its lines before `write_embedding_file`."""
    dtype = check_dtype(dtype)
    if max_batch_tokens is None:
        max_batch_tokens = batch_size * 128
    yield from _embed_items(embedder, iter_plan(sentences, batch_size, max_batch_tokens, sort, row_length), dtype)


def write_embedding_file(path, embedded, dtype="float32", sentence_index=True, durable=False):
    """Writes `embedded`, `(Sentence, array)` pairs (`embed_sentences`), as a valid embed output for those sentences:
    a dataset per sentence named by its index, and `sentence_to_index` for them (keys in line order, so the last of
    equal lines wins, as in a whole file). Atomic (`EmbeddingWriter`); `durable`: fsync'd before and after the
    rename. Returns the number of datasets written."""
    lines = []
    with EmbeddingWriter(path, index=sentence_index, dtype=check_dtype(dtype), durable=durable) as writer:
        for sentence, array in embedded:
            writer.write(sentence.index, array)
            if sentence_index:
                lines.append((sentence.index, sentence.line))
        lines.sort(key=lambda pair: pair[0])
        for index, line in lines:
            writer.add_key(index, line)
        fault_point("shard-write")
    return writer.written


def _numbered_shards(items, shard_tokens):
    """`(shard number, empties, batch)` for the `iter_plan` items: a shard ends with the batch that brings its tokens
    to `shard_tokens` or more (a function of the plan alone, never of time). A last item without sentences is
    dropped."""
    number = tokens = 0
    for empties, batch in items:
        if batch is None and not empties:
            return
        yield number, empties, batch
        if batch is not None:
            tokens += sum(len(s.tokens) for row in batch for s in row)
            if tokens >= shard_tokens:
                number, tokens = number + 1, 0


def _cache_fingerprint(cache):
    if cache is None:
        return None
    digest = hashlib.sha256()
    for token in cache.tokens:
        digest.update(len(token).to_bytes(4, "little") + token)
    digest.update(np.ascontiguousarray(cache.embedding, np.float32).tobytes())
    return digest.hexdigest()


def _short_hash(value):
    return f"sha256 {value[:12]}"


FINGERPRINT_SHOWN = {
    "input": lambda v: f"sha256 {v['sha256'][:12]}, {v['size']} bytes",
    "model": _short_hash,
    "token_embeddings": _short_hash,
}


def run_fingerprint(embedder, digest, **settings):
    """What an embed run's output depends on, for `RunJournal`: the input's content (`file_digest`), the model's
    config and weights, the token cache, every setting, TensorFlow's version and thread counts."""
    return {
        "input": {"sha256": digest["sha256"], "size": digest["size"]},
        "model": model_fingerprint(embedder.model),
        "token_embeddings": _cache_fingerprint(embedder.token_cache),
        "layers": embedder.layers,
        **settings,
        "row_length": embedder.row_length,
        "gate_chunk": embedder.gate_chunk,
        "cnn_chunk": embedder.cnn_chunk,
        "memo_size": embedder.memo_size,
        "tensorflow": tf.__version__,
        "threads": [
            tf.config.threading.get_intra_op_parallelism_threads(),
            tf.config.threading.get_inter_op_parallelism_threads(),
        ],
    }


def _count_sentences(sentences, counts, keys):
    for sentence in sentences:
        counts["sentences"] += 1
        counts["tokens"] += len(sentence.tokens)
        counts["truncated"] += sentence.truncated
        counts["empty"] += not sentence.tokens
        if keys is not None:
            keys[sentence_key(sentence.line)] = str(sentence.index)
        yield sentence


def _finished_shards(journal):
    """`{number: sentences}` of the journal's finished shards; one that cannot be read is removed (written again)."""
    found = {}
    for number, path in sorted(journal.done.items()):
        try:
            with h5py.File(path, "r") as f:
                found[number] = sum(1 for name in f if name != INDEX_DATASET)
        except (OSError, ValueError) as e:
            logger.warning("shard %s cannot be read (%s): it is computed again", path, e)
            journal.discard(number)
    return found


def merged_sentence_index(paths):
    """The `sentence_to_index` of one file holding the lines of the embed outputs `paths`, from their own maps: the
    same mapping as one run over all the lines (a key maps to its last line), but a key found in several files is
    placed by the first file's line rather than its first line, so the JSON text may list keys in another order."""
    pairs = []
    for path in paths:
        with h5py.File(path, "r") as f:
            if INDEX_DATASET in f:
                pairs.extend((int(index), key) for key, index in json.loads(f[INDEX_DATASET][0]).items())
    pairs.sort()
    return {key: str(index) for index, key in pairs}


def merge_shards(paths, output_path, keys=None, dtype="float32", sentence_index=True):
    """Writes the datasets of the embed outputs `paths` (shards of one input, each line in one of them) into one
    file `output_path` (atomic and durable), with `keys` as its `sentence_to_index` (`{key: "index"}` in line order,
    as `embed_file` collects it; None: `merged_sentence_index(paths)`). Memory holds one dataset at a time (and the
    keys). Returns the datasets written."""
    if keys is None and sentence_index:
        keys = merged_sentence_index(paths)
    with EmbeddingWriter(output_path, index=sentence_index, dtype=check_dtype(dtype), durable=True) as writer:
        for path in paths:
            with h5py.File(path, "r") as f:
                for name in f:
                    if name != INDEX_DATASET:
                        writer.write(int(name), f[name][...])
            fault_point("merge")
        if keys:
            writer.add_keys(keys)
    fault_point("merged")
    return writer.written


def embed_file(
    model,
    input_path,
    output_path,
    batch_size=64,
    layers="all",
    max_batch_tokens=None,
    sort=True,
    max_sentence_tokens=None,
    progress=None,
    token_embeddings=None,
    sentence_index=True,
    row_length=ROW_LENGTH,
    dtype="float32",
    resume=False,
    shard_tokens=SHARD_TOKENS,
    on_start=None,
    notes=None,
):
    """Writes one dataset per input line ("0", "1", ...) plus `sentence_to_index` to `output_path` (hdf5); resumable.

    The input is read once, line by line (`elmo_tf.io.sentences.iter_sentences`), and packed into batches
    (`iter_plan`); consecutive batches form shards of about `shard_tokens` tokens, each written, as soon as it is
    done, to the run's journal beside the output (`elmo_tf.io.journal.RunJournal`: `.<output name>.partial/`, every
    shard complete and fsync'd before it counts). At the end the shards are copied into the output (written under a
    temporary name and renamed) and the journal is removed. An interrupted run (SIGKILL, SIGTERM, Ctrl-C, a full
    disk) leaves an existing output as it was and keeps its finished shards: the same call with `resume=True` reads
    the input again, skips the shards already written, computes the others and writes the same file as an
    uninterrupted run, value for value (the token memo restarts with every shard, so a shard is computed the same
    whether or not the run before it was interrupted). A resume whose input content, model, token cache or setting
    differs raises `ResumeRefused` naming each; without `resume`, a partial state is removed and the run starts over.
    Memory holds one window of sentences, one batch and one dataset being copied, whatever the file's size (plus,
    unless `sentence_index` is False, the keys of `sentence_to_index`). Disk: the output twice, briefly.

    Args:
        batch_size: packed rows per batch (a row holds several short sentences).
        sort: pack sentences of similar length together within windows of `50 * batch_size` sentences; without
            it, batches follow the file with one batch of look-ahead.
        max_batch_tokens: cap on rows x steps of a batch (default `128 * batch_size`).
        progress: optional callable `progress(n_sentences_done)` called after each batch computed in this run.
        token_embeddings: optional `(vocabulary, array)` or `TokenCache` (see `Embedder`).
        sentence_index: write `sentence_to_index` (AllenNLP's map from sentence to dataset name).
        dtype: "float32", or "float16" (half the file, each value rounded to the nearest float16).
        resume: continue the partial run of the same call into `output_path`, if there is one.
        shard_tokens: tokens per shard (at most that much work is lost to a kill; changes the run's fingerprint).
        on_start: optional callable `on_start(total_sentences, done_sentences)`, called once before the first batch
            (the input's line count, and how many lines a resumed run already has).
        notes: `{fingerprint name: text}` shown beside a differing value when a resume is refused (file names).
    Returns:
        dict of counts: sentences, tokens, empty, truncated (of the whole input); shards, resumed_shards,
        resumed_sentences; computed_tokens and the embedder's other stats (of the batches computed in this run).
    Raises:
        ResumeRefused, JournalBusy (`elmo_tf.io.journal`); `elmo_tf.io.atomic.WriteError`;
        `elmo_tf.io.text.TextFileError`.
    """
    dtype = check_dtype(dtype)
    shard_tokens = check_int("shard_tokens", shard_tokens, 1)
    embedder = Embedder(model, layers, token_embeddings=token_embeddings, row_length=row_length)
    if max_batch_tokens is None:
        max_batch_tokens = batch_size * 128
    sentences = iter_sentences(input_path, max_sentence_tokens)  # checks max_sentence_tokens now
    try:
        before = file_state(input_path)
        digest = file_digest(input_path)
    except OSError as e:
        raise TextFileError(f"{input_path}: {e.strerror or e}", path=str(input_path)) from None
    fingerprint = run_fingerprint(
        embedder,
        digest,
        dtype=dtype,
        batch_size=batch_size,
        max_batch_tokens=max_batch_tokens,
        sort=bool(sort),
        max_sentence_tokens=max_sentence_tokens,
        sentence_index=bool(sentence_index),
        shard_tokens=shard_tokens,
    )
    notes = {"input": str(input_path), **(notes or {})}
    counts = {"sentences": 0, "tokens": 0, "empty": 0, "truncated": 0}
    keys = {} if sentence_index else None
    with RunJournal(output_path, fingerprint, resume=resume, notes=notes, shown=FINGERPRINT_SHOWN) as journal:
        finished = _finished_shards(journal)
        if on_start:
            on_start(digest["lines"], sum(finished.values()))
        plan = iter_plan(_count_sentences(sentences, counts, keys), batch_size, max_batch_tokens, sort, row_length)
        shards = 0
        for number, group in itertools.groupby(_numbered_shards(plan, shard_tokens), key=lambda item: item[0]):
            shards = number + 1
            items = ((empties, batch) for _, empties, batch in group)
            if number in finished:
                collections.deque(items, maxlen=0)  # read past it: the plan goes on as in the first run
                continue
            embedder.reset_memo()
            embedded = _embed_items(embedder, items, dtype, progress)
            write_embedding_file(journal.shard_path(number), embedded, dtype, sentence_index, durable=True)
            fault_point("shard")
        check_unchanged(input_path, before)
        merge_shards([journal.shard_path(k) for k in range(shards)], output_path, keys, dtype, sentence_index)
    counts.update((key, value) for key, value in embedder.stats.items() if key != "tokens")
    counts.update(
        computed_tokens=embedder.stats["tokens"],
        shards=shards,
        resumed_shards=len(finished),
        resumed_sentences=sum(finished.values()),
    )
    return counts


__all__ = [
    "DTYPES",
    "Embedder",
    "LAYER_CHOICES",
    "ROW_LENGTH",
    "SHARD_TOKENS",
    "cast_embedding",
    "check_dtype",
    "embed_file",
    "embed_sentences",
    "group_rows",
    "iter_batches",
    "iter_plan",
    "limit_malloc_arenas",
    "merge_shards",
    "merged_sentence_index",
    "pack_rows",
    "packed_layout",
    "plan_batches",
    "run_fingerprint",
    "write_embedding_file",
]
