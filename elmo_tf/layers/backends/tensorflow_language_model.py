"""TensorFlow's fast paths of `elmo_tf.models.language_model`, reached through the door `elmo_tf.layers.backends`: the
full softmax in a `tf.while_loop` over the vocabulary's chunks, the scoring of the real positions only (gathered, then
scattered back: shapes that depend on the data), and the vocabulary on a `tf.lookup.StaticHashTable`, which a
SavedModel carries. The `keras.ops` twins are in `language_model` (`_full_softmax_ops`, `_score_every_position`,
`WordVocabulary`).
"""

import math

import numpy as np
import tensorflow as tf

from elmo_tf.layers.backends.tensorflow_precision import matmul


def full_softmax(states, targets, kernel, bias, chunk_size, top_k):
    """`language_model.full_softmax` (see there for the arguments and the outputs). A bfloat16 `kernel` (a language
    model's copy, `precision="bfloat16"`) multiplies bfloat16 operands with float32 accumulation
    (`tensorflow_precision.matmul`); the logits, their merges and the results stay float32."""
    vocab = int(kernel.shape[0])
    chunk_size = min(chunk_size, vocab)
    states = tf.convert_to_tensor(states)
    kernel = tf.convert_to_tensor(kernel)  # a read of a variable, not a copy
    bias = tf.cast(bias, states.dtype)
    targets = tf.cast(targets, tf.int32)
    n = tf.shape(states)[0]
    neg_inf = tf.constant(-np.inf, states.dtype)

    def body(i, running_max, running_sum, target_logit, top_values, top_ids):
        start = i * chunk_size
        size = tf.minimum(chunk_size, vocab - start)
        weights = tf.slice(kernel, [start, 0], [size, -1])
        logits = matmul(states, weights, transpose_b=True) + tf.slice(bias, [start], [size])
        new_max = tf.maximum(running_max, tf.reduce_max(logits, axis=1))
        running_sum = running_sum * tf.exp(running_max - new_max) + tf.reduce_sum(
            tf.exp(logits - new_max[:, None]), axis=1
        )
        local = targets - start
        inside = (local >= 0) & (local < size)
        picked = tf.gather(logits, tf.clip_by_value(local, 0, size - 1)[:, None], batch_dims=1)[:, 0]
        target_logit = tf.where(inside, picked, target_logit)
        if top_k:
            padded = tf.pad(logits, [[0, 0], [0, tf.maximum(top_k - size, 0)]], constant_values=-np.inf)
            values, ids = tf.math.top_k(padded, top_k)
            values, order = tf.math.top_k(tf.concat([top_values, values], axis=1), top_k)
            top_ids = tf.gather(tf.concat([top_ids, ids + start], axis=1), order, batch_dims=1)
            top_values = values
        return i + 1, new_max, running_sum, target_logit, top_values, top_ids

    k = max(top_k, 1)
    start = (
        tf.constant(0),
        tf.fill([n], neg_inf),
        tf.zeros([n], states.dtype),
        tf.zeros([n], states.dtype),
        tf.fill([n, k], neg_inf),
        tf.zeros([n, k], tf.int32),
    )
    chunks = math.ceil(vocab / chunk_size)
    # parallel_iterations=1: one chunk's logits at a time (the next matmul does not wait on the running values)
    _, running_max, running_sum, target_logit, top_values, top_ids = tf.while_loop(
        lambda i, *_: i < chunks, body, start, parallel_iterations=1, maximum_iterations=chunks
    )
    log_norm = running_max + tf.math.log(running_sum)
    result = {"log_probs": target_logit - log_norm}
    if top_k:
        result["top_k_log_probs"] = top_values - log_norm[:, None]
        result["top_k_ids"] = top_ids
    return result


def score_positions(states, targets, keep, kernel, bias, chunk_size, top_k):
    """`language_model.score_positions` (see there), scoring the positions where `keep` is True only: both
    directions' states gathered into one pass over the vocabulary, the results scattered back (zeros elsewhere)."""
    where = tf.where(keep)
    count = tf.shape(where)[0]
    scored = full_softmax(
        tf.concat([tf.gather_nd(s, where) for s in states], axis=0),
        tf.concat([tf.gather_nd(t, where) for t in targets], axis=0),
        kernel,
        bias,
        chunk_size,
        top_k,
    )
    shape = tf.shape(keep, out_type=tf.int64)
    directions = []
    for index in range(len(states)):
        rows = slice(index * count, (index + 1) * count)
        parts = {"log_probs": scored["log_probs"][rows]}
        if top_k:
            parts.update(top_k_ids=scored["top_k_ids"][rows], top_k_log_probs=scored["top_k_log_probs"][rows])
        dense = {}
        for key, values in parts.items():
            full_shape = shape if values.shape.rank == 1 else tf.concat([shape, tf.constant([top_k], tf.int64)], axis=0)
            dense[key] = tf.scatter_nd(where, values, full_shape)
        directions.append(dense)
    return directions


def word_vocabulary(words, unk_id):
    return TensorFlowWordVocabulary(words, unk_id)


class TensorFlowWordVocabulary(tf.Module):
    """`language_model.WordVocabulary` on TensorFlow: row j = word j on a `tf.lookup.StaticHashTable` (unknown words
    -> `unk_id`), created now, outside any traced function; tf.string tokens in, tf.string words out.

    Args:
        words: the V words of the softmax's rows (str or bytes).
        unk_id: the id of words not in the vocabulary.
    """

    def __init__(self, words, unk_id):
        super().__init__(name="word_vocabulary")
        with tf.init_scope():
            self.words = tf.constant(words, tf.string)
            self.table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(self.words, tf.range(len(words), dtype=tf.int32)),
                default_value=unk_id,
            )

    def token_ids(self, tokens):
        """tf.string `(...)` -> int32 word ids."""
        return self.table.lookup(tf.convert_to_tensor(tokens, tf.string))

    def words_of(self, ids):
        """int ids -> tf.string words."""
        return tf.gather(self.words, ids)

    def model_inputs(self, char_mapping, tokens):
        """tf.string tokens `(batch, T)` padded with "" -> `(char ids, word ids)`, the language model's inputs."""
        tokens = tf.convert_to_tensor(tokens, tf.string)
        return char_mapping(tokens), self.token_ids(tokens)

    def top_k_words(self, ids, sequence_len):
        """Top-k ids `(batch, T + 1, k)` -> their words, "" past each sentence's n + 1 (`sequence_len` n)."""
        valid = tf.sequence_mask(sequence_len + 1, tf.shape(ids)[1])[:, :, None]
        return tf.where(valid, self.words_of(ids), "")
