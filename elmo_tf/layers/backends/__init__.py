"""The door to a Keras backend's own fast paths: one function per path, which runs it or declines.

As `keras.layers.LSTM` calls `backend.lstm(...)` and runs its generic loop when the backend raises
`NotImplementedError` (keras/src/backend/tensorflow/rnn.py takes cuDNN or declines; JAX's and PyTorch's always
decline), a layer or model of elmo_tf calls one function here and, where it raises `NotImplementedError`, runs its own
`keras.ops` path: the same numbers on every backend (to float rounding). The layers never ask which backend runs;
this module does, once, in `_tensorflow`. Only TensorFlow has fast paths:

- `tensorflow_fast_paths`: the char CNN's real and distinct tokens, the CRF's and the scans' TensorFlow ops, the
  recurrence's choice of loop, the input dropout, the string mappings, ELMo's token-embedding cache;
- `tensorflow_recurrence`: the compiled projected-LSTM loops (`projected_lstm_scan`, `fast_gradient_scan`);
- `tensorflow_language_model`: the language model's full softmax, its scoring of real positions and its vocabulary.

Off TensorFlow every function declines without importing TensorFlow (a JAX or PyTorch process loads none of it).
"""

import keras

from elmo_tf.backend import is_tensorflow_backend


def _tensorflow():
    """`tensorflow_fast_paths` on the TensorFlow backend; `NotImplementedError` on any other."""
    if not is_tensorflow_backend():
        raise NotImplementedError(f"no TensorFlow fast path on the {keras.config.backend()!r} backend")
    from elmo_tf.layers.backends import tensorflow_fast_paths

    return tensorflow_fast_paths


def _tensorflow_language_model():
    """`tensorflow_language_model` on the TensorFlow backend; `NotImplementedError` on any other."""
    _tensorflow()
    from elmo_tf.layers.backends import tensorflow_language_model

    return tensorflow_language_model


# ----------------------------------------------------------------------------------------------------- char CNN


def encode_tokens(char_cnn, char_ids):
    """`CharCNN.encode_tokens`, convolving up to the batch's longest token only (shapes that depend on the ids)."""
    return _tensorflow().encode_tokens(char_cnn, char_ids)


def encode_distinct(char_cnn, char_ids):
    """`CharCNN.encode_distinct`, each distinct row encoded once (TensorFlow's `UniqueV2`)."""
    return _tensorflow().encode_distinct(char_cnn, char_ids)


def encode_real_tokens(char_cnn, char_ids):
    """`CharCNN.call`, the real tokens encoded alone and scattered back (padding costs nothing)."""
    return _tensorflow().encode_real_tokens(char_cnn, char_ids)


# ------------------------------------------------------------------------------------------- CRF and the scans


def argmax(x, axis):
    """int32 `ops.argmax` that takes an empty batch (Keras's TensorFlow argmax fails on one)."""
    return _tensorflow().argmax(x, axis)


def reduce_max(x, axis):
    """`ops.max` that takes an empty batch (Keras's TensorFlow max asserts the tensor is not empty)."""
    return _tensorflow().reduce_max(x, axis)


def cond_more_than_one_step(potentials, scan, no_scan):
    """`scan()` if `potentials` (batch, time, K) has more than one step, else `no_scan()`, decided when the graph
    runs (a time dimension unknown when traced: TensorFlow graphs only)."""
    return _tensorflow().cond_more_than_one_step(potentials, scan, no_scan)


def scan_carries(step, init, xs, reverse=False):
    """`ops.scan` of a `step` returning `(carry, carry)`, as `tf.scan` (Keras's TensorFlow scan fails in a graph with an
    unknown number of steps and several inputs)."""
    return _tensorflow().scan_carries(step, init, xs, reverse)


def scan_with_outputs(step, init, xs, zero_output):
    """`ops.scan(step, init, xs)` as `tf.scan`, each step's output carried from `zero_output` (see `scan_carries`)."""
    return _tensorflow().scan_with_outputs(step, init, xs, zero_output)


def reverse_sequences(x, lengths):
    """`ops_recurrence.reverse_by_lengths`, as `tf.reverse_sequence`."""
    return _tensorflow().reverse_sequences(x, lengths)


# ------------------------------------------------------------------------------------------------- recurrence


def recurrence_implementations():
    """The `implementation`s of `run_cells` that only this backend offers (TensorFlow: "scan", "fast_gradient")."""
    return _tensorflow().recurrence_implementations()


def projected_lstms(args, units, projection_dim, resets, training, implementation, gate_chunk, matmul_dtype):
    """`run_cells`'s loop on TensorFlow's compiled recurrences; declines `implementation="ops"` too."""
    return _tensorflow().projected_lstms(
        args, units, projection_dim, resets, training, implementation, gate_chunk, matmul_dtype
    )


def read_variables(weights):
    """Variables as tensors (Keras's TensorFlow `convert_to_tensor` gives the variables back)."""
    return _tensorflow().read_variables(weights)


def dropout_seed_generator():
    """The seed generator of a cell's input dropout: None, TensorFlow's `dropout` draws its own."""
    return _tensorflow().dropout_seed_generator()


def dropout(x, rate):
    """`keras.random.dropout(x, rate)`, as `tf.nn.dropout` (TensorFlow's global random stream)."""
    return _tensorflow().dropout(x, rate)


# ---------------------------------------------------------------------------------------------------- strings


def accepts_string_tensors():
    """True where string inputs reach a layer's `call` as the backend's own tensors (tf.string)."""
    return _tensorflow().accepts_string_tensors()


def string_char_ids(mapping, tokens):
    """A char mapping on tf.string tokens `(...)` -> int32 `(..., mapping.width)`, in TF ops (SavedModels too)."""
    return _tensorflow().string_char_ids(mapping, tokens)


def vocabulary_char_mapping(*arguments):
    """A char vocabulary's mapping of tf.string tokens on lookup tables (`VocabularyRows`' arguments)."""
    return _tensorflow().vocabulary_char_mapping(*arguments)


# ---------------------------------------------------------------------------------- ELMo's token-embedding cache


def encode_cached_tokens(char_cnn, cache, char_ids, token_ids, mask):
    """`ELMo.call`'s token vectors, cached words from `cache`, the others from the char CNN."""
    return _tensorflow().encode_cached_tokens(char_cnn, cache, char_ids, token_ids, mask)


# ------------------------------------------------------------------------------------------- language model


def full_softmax(states, targets, kernel, bias, chunk_size, top_k):
    """`language_model.full_softmax` in a `tf.while_loop` over the vocabulary's chunks."""
    return _tensorflow_language_model().full_softmax(states, targets, kernel, bias, chunk_size, top_k)


def score_positions(states, targets, keep, kernel, bias, chunk_size, top_k):
    """`language_model.score_positions`, scoring the real positions only (gathered, then scattered back)."""
    return _tensorflow_language_model().score_positions(states, targets, keep, kernel, bias, chunk_size, top_k)


def word_vocabulary(words, unk_id):
    """A language model's vocabulary on a `tf.lookup.StaticHashTable` (tf.string tokens in, tf.string words out)."""
    return _tensorflow_language_model().word_vocabulary(words, unk_id)
