"""TensorFlow's fast paths of the layers, reached through the door `elmo_tf.layers.backends` (each function there
calls the one of the same name here). A function may decline with `NotImplementedError`; the layer then runs its
`keras.ops` path.

Char CNN: only the real tokens, or each distinct token once, and the char positions cut to the batch's longest token
(shapes that depend on the ids, which `jax.jit` cannot compile). CRF and scans: TensorFlow ops where Keras's fail in
graphs (an empty batch, an unknown number of steps). Recurrence: the compiled loops of `tensorflow_recurrence`.
Strings: tf.string tensors mapped in TF ops, which a SavedModel carries.
"""

import tensorflow as tf
from keras import ops

from elmo_tf.layers import low_precision
from elmo_tf.layers.backends import tensorflow_recurrence
from elmo_tf.layers.char_cnn import CUT_WIDTH_MULTIPLE
from elmo_tf.layers.lstm_constants import TENSORFLOW_IMPLEMENTATIONS
from elmo_tf.preprocessing.char_vocabulary import VocabularyCharMapping

# ----------------------------------------------------------------------------------------------------- char CNN


def encode_tokens(char_cnn, char_ids):
    """`CharCNN.encode_tokens` over the batch's longest token (see there): int32 `(n, input_width)` -> float32
    `(n, projection_dim)`."""
    char_ids = tf.convert_to_tensor(char_ids)
    max_chars = char_cnn.max_chars
    word_ids = char_ids[:, max_chars] if char_cnn.word_vocab_size else None
    char_ids = char_ids[:, :max_chars]
    pad = char_cnn.pad_id
    widest = char_cnn.widest
    real = tf.reduce_any(char_ids > 0, axis=1)  # (n,)
    used = tf.reduce_any(tf.logical_and(tf.not_equal(char_ids, pad), real[:, None]), axis=0)  # (max_chars,)
    longest = tf.reduce_max(tf.where(used, tf.range(1, max_chars + 1), 0))
    cut = longest <= max_chars - widest
    exact = tf.maximum(longest, 1) + widest - 1
    step = CUT_WIDTH_MULTIPLE
    rounded = tf.minimum((exact + step - 1) // step * step, max_chars)
    kept = tf.where(cut, rounded, max_chars)
    # the last row is one all-padding token: its max is the value of an all-padding window
    ids = tf.concat([char_ids[:, :kept], tf.fill([1, kept], tf.constant(pad, char_ids.dtype))], axis=0)
    add_padding_window = tf.logical_and(cut, real)[:, None]
    embedding, kernels, projection = char_cnn.operands()  # float32, or bfloat16 copies (precision="bfloat16")
    x = ops.take(embedding, ids, axis=0)  # (n + 1, kept, dim)
    pooled = []
    for kernel, bias in zip(kernels, char_cnn.conv_biases):
        if char_cnn.uses_bfloat16:
            conv = low_precision.conv1d(x, kernel)
        else:
            conv = tf.nn.conv1d(x, kernel, stride=1, padding="VALID")
        conv = ops.max(conv + bias, axis=1)
        tokens = tf.where(add_padding_window, tf.maximum(conv[:-1], conv[-1:]), conv[:-1])
        pooled.append(char_cnn.activation(tokens))
    h = char_cnn.highway(ops.concatenate(pooled, axis=-1))
    if word_ids is not None:  # ELMoForManyLangs: [word vector; highway(char CNN)] -> projection
        h = ops.concatenate([ops.take(char_cnn.word_embedding, word_ids, axis=0), h], axis=-1)
    return char_cnn.project(h, projection)


def encode_distinct(char_cnn, char_ids):
    """`CharCNN.encode_distinct`: the distinct rows through `CharCNN.encode_tokens` once, gathered back (see there)."""
    width = char_cnn.input_width
    char_ids = tf.cast(char_ids, tf.int32)
    if char_ids.shape.rank is not None and char_ids.shape[-1] not in (None, width):
        raise ValueError(f"CharCNN inputs must have shape (..., {width}), got {char_ids.shape}")
    flat = tf.reshape(char_ids, [-1, width])
    distinct, index = tf.raw_ops.UniqueV2(x=flat, axis=tf.constant([0], tf.int64))
    vectors = tf.gather(char_cnn.encode_tokens(distinct), index)
    vectors *= tf.cast(tf.reduce_any(flat > 0, axis=1), vectors.dtype)[:, None]
    shape = tf.concat([tf.shape(char_ids)[:-1], [char_cnn.projection_dim]], axis=0)
    return tf.reshape(vectors, shape)


def encode_real_tokens(char_cnn, char_ids):
    """`CharCNN.call` on checked int32 ids `(batch, tokens, input_width)`: the real tokens encoded, then scattered
    back (padding costs nothing)."""
    mask = tf.reduce_any(char_ids > 0, axis=-1)
    where = tf.where(mask)
    # (encode_tokens adds its own all-padding token, so the convolutions' batch is never empty)
    encoded = char_cnn.encode_tokens(tf.gather_nd(char_ids, where))
    shape = tf.concat([tf.shape(char_ids, out_type=tf.int64)[:2], [char_cnn.projection_dim]], axis=0)
    return tf.scatter_nd(where, encoded, shape)


# ------------------------------------------------------------------------------------------- CRF and the scans


def argmax(x, axis):
    return tf.argmax(x, axis=axis, output_type=tf.int32)


def reduce_max(x, axis):
    return tf.reduce_max(x, axis=axis)


def cond_more_than_one_step(potentials, scan, no_scan):
    return tf.cond(tf.shape(potentials)[1] > 1, scan, no_scan)


def scan_carries(step, init, xs, reverse=False):
    """Needs at least one step (the final carry is the last one stacked)."""
    carries = tf.scan(lambda carry, x: step(carry, x)[0], xs, initializer=init, reverse=reverse)
    return tf.nest.map_structure(lambda c: c[0] if reverse else c[-1], carries), carries


def scan_with_outputs(step, init, xs, zero_output):
    """`tf.scan` stacks carries only: each step's output rides in the carry, beside the state."""

    def carried(carry, x):
        state, out = step(carry[0], x)
        return (state, out), (state, out)

    (state, _), (_, outs) = scan_carries(carried, (init, zero_output), xs)
    return state, outs


def reverse_sequences(x, lengths):
    return tf.reverse_sequence(x, lengths, seq_axis=0, batch_axis=1)


# ------------------------------------------------------------------------------------------------- recurrence


def recurrence_implementations():
    return TENSORFLOW_IMPLEMENTATIONS


def projected_lstms(args, units, projection_dim, resets, training, implementation, gate_chunk, matmul_dtype):
    """`run_cells`'s loop (see there for `implementation`): `fast_gradient_scan` for "fast_gradient", or for "auto"
    in training without `gate_chunk`, else `projected_lstm_scan`. Declines "ops". The training scan runs its matmuls
    in `matmul_dtype`; the plain scan in its kernels' dtype (bfloat16 for the copies of cells computing in bfloat16,
    `precision`: `run_cells` passes them with `matmul_dtype="bfloat16"`).

    Args:
        args: the loops' positional arguments, inputs to `proj_clip`.
        units, projection_dim: the cells' sizes.
    """
    if implementation == "ops":
        raise NotImplementedError("implementation 'ops' is the keras.ops loop")
    if implementation == "fast_gradient" or (implementation == "auto" and training is True and gate_chunk is None):
        outs, cs, hs = tensorflow_recurrence.fast_gradient_scan(*args, resets=resets, matmul_dtype=matmul_dtype)
    else:
        stacked = tensorflow_recurrence.stack_directions(units, projection_dim)
        outs, cs, hs = tensorflow_recurrence.projected_lstm_scan(
            *args, resets=resets, chunk=gate_chunk, stack_directions=stacked
        )
    for out, c, h in zip(outs, cs, hs):  # the compiled loop may relax static dims
        out.set_shape([None, None, projection_dim])
        c.set_shape([None, units])
        h.set_shape([None, projection_dim])
    return outs, cs, hs


def read_variables(weights):
    return [tf.convert_to_tensor(w) for w in weights]


def dropout_seed_generator():
    return None  # tf.nn.dropout draws from TensorFlow's global random stream


def dropout(x, rate):
    return tf.nn.dropout(x, rate=rate)


# ---------------------------------------------------------------------------------------------------- strings


def accepts_string_tensors():
    return True


def string_char_ids(mapping, tokens):
    return mapping(tokens)


def vocabulary_char_mapping(*arguments):
    return VocabularyCharMapping(*arguments)


# ---------------------------------------------------------------------------------- ELMo's token-embedding cache


def encode_cached_tokens(char_cnn, cache, char_ids, token_ids, mask):
    """`ELMo.call`'s token vectors with a cache: char ids with boundaries `(batch, tokens + 2, width)`, `token_ids`
    `(batch, tokens)` (1 + the cache's row, 0 for words it does not hold), `mask` `(batch, tokens)`. Cached words take
    the cache's vector; the char CNN encodes the others (it encodes only rows with a non-zero char id)."""
    ids = tf.pad(tf.cast(token_ids, tf.int32) * tf.cast(mask, tf.int32), [[0, 0], [1, 1]])  # boundaries: 0
    hit = ids > 0
    return char_cnn.encode_distinct(tf.where(hit[:, :, None], 0, char_ids)) + cache.gather(ids)
