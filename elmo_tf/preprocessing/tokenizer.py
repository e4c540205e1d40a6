"""Raw sentences -> padded tokens, in TF ops (runs in tf.data and inside SavedModels)."""

import tensorflow as tf


def whitespace_tokenize(sentences, max_tokens=None):
    """Splits each sentence on runs of ASCII whitespace: `(batch,)` tf.string -> tokens, lengths.

    Args:
        sentences: tf.string `(batch,)`.
        max_tokens: optional int; sentences with more tokens are cut to their first `max_tokens`.
    Returns:
        tokens: tf.string `(batch, tokens)`, padded with "" (an empty sentence is a row of "").
        sequence_len: int32 `(batch,)`, the number of real tokens per sentence.
    """
    sentences = tf.convert_to_tensor(sentences)
    if sentences.dtype != tf.string:
        raise TypeError(f"sentences must be a tf.string tensor, got dtype {sentences.dtype.name}")
    if sentences.shape.rank is not None and sentences.shape.rank != 1:
        raise ValueError(f"sentences must have rank 1 (batch,), got shape {sentences.shape}")
    ragged = tf.strings.split(sentences)
    if max_tokens is not None:
        ragged = ragged[:, :max_tokens]
    tokens = ragged.to_tensor(default_value="")
    return tokens, tf.cast(ragged.row_lengths(), tf.int32)
