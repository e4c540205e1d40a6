"""tf.data input pipeline for biLM pretraining: text lines -> batches of char ids + token ids.

Batching (documented choice): stateless, length-bucketed sentences. Each line is one sentence or
paragraph; lines longer than `max_tokens` are cut into consecutive pieces of at most `max_tokens`
tokens, each trained as its own sentence with `<S>` / `</S>` around it, exactly as ELMo is used at
inference (zero initial state per sentence). Pieces are shuffled in a bounded buffer and grouped by
length so a batch carries little padding. The corpus is streamed (`TextLineDataset`), never loaded.

Bad lines, deliberately: empty and whitespace-only lines are skipped; bytes that are not UTF-8 are kept
(bilm-tf's byte mapping reads bytes, a char vocabulary maps them to its `<oov>`; the softmax vocabulary lookup
maps such words to `<UNK>`); a 10,000-token line becomes
ceil(10,000 / max_tokens) pieces.

Order is deterministic for a given seed, so a resumed run can skip the batches it already trained on.
"""

import tensorflow as tf

from elmo_tf.bounds import BATCH_SIZE, SHUFFLE_BUFFER, TOKENS
from elmo_tf.errors import ElmoTFError
from elmo_tf.preprocessing.char_vocabulary import BYTE_MAPPING


class LMDataError(ElmoTFError):
    """Text files that give the language model nothing to read (every line blank).

    Attributes:
        files: the files.
    """

    def __init__(self, message, files):
        super().__init__(message)
        self.files = files


def check_has_tokens(files):
    """Raises `LMDataError` naming the files unless a line of one of them holds a token (`lm_dataset` skips blank
    lines: without a token there is no batch). Reads up to the first such line only."""
    files = list(files)
    for path in files:
        with open(path, "rb") as f:
            if any(line.split() for line in f):  # ASCII whitespace, as tf.strings.split and tf.strings.strip
                return
    named = repr(files[0]) if len(files) == 1 else f"any of the {len(files)} files ({', '.join(map(repr, files))})"
    raise LMDataError(f"no tokens in {named}: every line is blank", files)


def vocabulary_table(words, unk_id=2):
    """A `tf.lookup.StaticHashTable` word -> id (ids are list positions), unknown words -> `unk_id`."""
    keys = tf.constant(list(words), tf.string)
    values = tf.range(len(words), dtype=tf.int32)
    return tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, values), default_value=unk_id)


def _pieces(line, max_tokens):
    """The line's tokens in consecutive pieces of at most `max_tokens` (no padding: a piece is as long as it is)."""
    tokens = tf.strings.split(line)
    starts = tf.range(0, tf.size(tokens), max_tokens)
    return tf.data.Dataset.from_tensor_slices(tf.RaggedTensor.from_row_starts(tokens, starts))


def lm_dataset(
    files,
    table,
    batch_size,
    max_tokens=50,
    shuffle_buffer=10000,
    seed=0,
    repeat=True,
    num_shards=1,
    shard_index=0,
    bucket_width=10,
    char_mapping=BYTE_MAPPING,
):
    """Batches for `BiLMPretrainer`: dicts with `char_ids` `(batch, T, width)` and `token_ids` `(batch, T)`.

    Args:
        files: list of text files.
        table: word -> id lookup (see `vocabulary_table`).
        batch_size: sentences per batch (per replica, when called from `distribute_datasets_from_function`), at
            most `elmo_tf.bounds.MAX_BUFFER`.
        max_tokens: longer lines are cut into pieces of at most this many tokens.
        shuffle_buffer: pieces in the shuffle buffer (0: no shuffling), at most `elmo_tf.bounds.MAX_BUFFER`.
        seed: shuffling seed; each pass over the data reshuffles deterministically.
        repeat: loop over the data forever (training); False gives one pass (evaluation).
        num_shards, shard_index: this input pipeline's share of the lines (multi-worker training).
        bucket_width: sentences are grouped in buckets of this many tokens of length, and a batch is padded to its
            longest sentence. The LSTMs compute on the padding too: with 64 PTB sentences, widths of 10 leave 22%
            of the positions padding, widths of 2 about 2% (1 gives none, with batches of equal lengths). Measured
            on PTB (bench/README.md, item 10): width 2 made steps about 8% faster, but 6,231 steps reached test
            perplexity 119.1 against 114.9 at width 10 (one run each), so 10 stays the default.
        char_mapping: tokens -> char ids, the model's own (`BiLMPretrainer.char_mapping`, from its config:
            `elmo_tf.preprocessing.char_vocabulary.char_mapping`); bilm-tf's UTF-8 bytes (width 50) by default.
    """
    for name, value, bounds in (
        ("batch_size", batch_size, BATCH_SIZE),
        ("max_tokens", max_tokens, TOKENS),
        ("bucket_width", bucket_width, TOKENS),
        ("shuffle_buffer", shuffle_buffer, SHUFFLE_BUFFER),
    ):
        problem = bounds.problem(value)
        if problem:
            raise ValueError(f"{name} {problem}")
    ds = tf.data.TextLineDataset(list(files))
    if num_shards > 1:
        ds = ds.shard(num_shards, shard_index)
    ds = ds.filter(lambda line: tf.strings.length(tf.strings.strip(line)) > 0)
    ds = ds.flat_map(lambda line: _pieces(line, max_tokens))
    if shuffle_buffer:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()

    def encode(tokens):
        return {"char_ids": char_mapping(tokens), "token_ids": table.lookup(tokens)}

    def bucket(x):  # lengths 1..w -> 0, w+1..2w -> 1, ...: bucket_by_sequence_length's buckets with boundaries
        # w+1, 2w+1, ... up to max_tokens, without a list of them (max_tokens may be 2**31 - 1)
        return tf.cast((tf.shape(x["token_ids"])[0] - 1) // bucket_width, tf.int64)

    ds = ds.map(encode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.group_by_window(bucket, lambda _, window: window.padded_batch(batch_size), window_size=batch_size)
    return ds.prefetch(tf.data.AUTOTUNE)
