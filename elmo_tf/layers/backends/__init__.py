"""The door to a Keras backend's own fast paths: one function per path, which runs it or declines.

As `keras.layers.LSTM` calls `backend.lstm(...)` and runs its generic loop when the backend raises
`NotImplementedError` (keras/src/backend/tensorflow/rnn.py takes cuDNN or declines), a layer or model of elmo_tf calls
one function here and, where it raises `NotImplementedError`, runs its own `keras.ops` path: the same numbers on every
backend (to float rounding). The layers never ask which backend runs; this module does, in `_path`, and
hands each call to the module of the running backend, where a path it lacks declines:

- TensorFlow, `tensorflow_fast_paths`: the char CNN's real and distinct tokens, the CRF's and the scans' TensorFlow
  ops, the recurrence's choice of loop (`tensorflow_recurrence`), the input dropout, the string mappings, ELMo's
  token-embedding cache; `tensorflow_language_model`: the language model's full softmax, its scoring of real positions
  and its vocabulary;
- JAX, `jax_recurrence`: the recurrence (`lax.scan`, compiled by the caller's `jax.jit`); `jax_char_cnn`: the char
  CNN's distinct tokens (inside `jax.jit` too);
- PyTorch, `torch_recurrence`: the recurrence; `torch_char_cnn`: the char CNN's distinct tokens.

Each module imports only its own backend (a JAX or PyTorch process loads no TensorFlow).
"""

import keras

from elmo_tf.backend import is_tensorflow_backend

# the modules of each backend's fast paths (in this package), searched in order for a path's function
_MODULES = {
    "tensorflow": ("tensorflow_fast_paths",),
    "jax": ("jax_char_cnn", "jax_recurrence"),
    "torch": ("torch_char_cnn", "torch_recurrence"),
}


def _path(name):
    """The running backend's function `name`; `NotImplementedError` where that backend has no such path."""
    import importlib

    backend = keras.config.backend()
    for module in _MODULES.get(backend, ()):
        function = getattr(importlib.import_module(f"elmo_tf.layers.backends.{module}"), name, None)
        if function is not None:
            return function
    raise NotImplementedError(f"no {name} fast path on the {backend!r} backend")


def _tensorflow_language_model():
    """`tensorflow_language_model` on the TensorFlow backend; `NotImplementedError` on any other."""
    if not is_tensorflow_backend():
        raise NotImplementedError(f"no TensorFlow fast path on the {keras.config.backend()!r} backend")
    from elmo_tf.layers.backends import tensorflow_language_model

    return tensorflow_language_model


# ----------------------------------------------------------------------------------------------------- char CNN


def encode_tokens(char_cnn, char_ids):
    """`CharCNN.encode_tokens`, convolving up to the batch's longest token only (shapes that depend on the ids:
    TensorFlow, PyTorch, JAX outside a trace)."""
    return _path("encode_tokens")(char_cnn, char_ids)


def encode_distinct(char_cnn, char_ids):
    """`CharCNN.encode_distinct`, each distinct row encoded once (TensorFlow's `UniqueV2`, `torch.unique`, NumPy's
    `unique` for JAX outside a trace)."""
    return _path("encode_distinct")(char_cnn, char_ids)


def encode_real_tokens(char_cnn, char_ids):
    """`CharCNN.call`, padding rows costing nothing (TensorFlow: the real tokens alone, scattered back; PyTorch and
    JAX outside a trace: the distinct rows)."""
    return _path("encode_real_tokens")(char_cnn, char_ids)


# ------------------------------------------------------------------------------------------- CRF and the scans


def argmax(x, axis):
    """int32 `ops.argmax` that takes an empty batch (Keras's TensorFlow argmax fails on one)."""
    return _path("argmax")(x, axis)


def reduce_max(x, axis):
    """`ops.max` that takes an empty batch (Keras's TensorFlow max asserts the tensor is not empty)."""
    return _path("reduce_max")(x, axis)


def cond_more_than_one_step(potentials, scan, no_scan):
    """`scan()` if `potentials` (batch, time, K) has more than one step, else `no_scan()`, decided when the graph
    runs (a time dimension unknown when traced: TensorFlow graphs only)."""
    return _path("cond_more_than_one_step")(potentials, scan, no_scan)


def scan_carries(step, init, xs, reverse=False):
    """`ops.scan` of a `step` returning `(carry, carry)`, as `tf.scan` (Keras's TensorFlow scan fails in a graph with an
    unknown number of steps and several inputs)."""
    return _path("scan_carries")(step, init, xs, reverse)


def scan_with_outputs(step, init, xs, zero_output):
    """`ops.scan(step, init, xs)` as `tf.scan`, each step's output carried from `zero_output` (see `scan_carries`)."""
    return _path("scan_with_outputs")(step, init, xs, zero_output)


def reverse_sequences(x, lengths):
    """`ops_recurrence.reverse_by_lengths`, as `tf.reverse_sequence`."""
    return _path("reverse_sequences")(x, lengths)


# ------------------------------------------------------------------------------------------------- recurrence


def recurrence_implementations():
    """The `implementation`s of `run_cells` that only this backend offers (TensorFlow: "scan", "fast_gradient")."""
    return _path("recurrence_implementations")()


def projected_lstms(args, units, projection_dim, resets, training, implementation, gate_chunk, matmul_dtype):
    """`run_cells`'s loop: TensorFlow's compiled recurrences, JAX's `lax.scan` (`jax_recurrence`), PyTorch's loop
    (`torch_recurrence`). Every backend declines `implementation="ops"` (the `keras.ops` loop, the reference); JAX and
    PyTorch decline what `plain_float32_loop` refuses."""
    return _path("projected_lstms")(
        args, units, projection_dim, resets, training, implementation, gate_chunk, matmul_dtype
    )


def plain_float32_loop(args, implementation, gate_chunk, matmul_dtype):
    """`NotImplementedError` unless JAX's and PyTorch's loops run this call of `projected_lstms`: `implementation`
    "auto", no `gate_chunk` (`run_cells` refuses it off TensorFlow), matmuls in float32 (`matmul_dtype` None or
    "float32") and float32 inputs, kernels and states (a layer computing in bfloat16 runs the `keras.ops` loop)."""
    if implementation != "auto":
        raise NotImplementedError(f"implementation {implementation!r} is the keras.ops loop")
    if gate_chunk is not None or matmul_dtype not in (None, "float32"):
        raise NotImplementedError(f"gate_chunk {gate_chunk!r}, matmul_dtype {matmul_dtype!r}: the keras.ops loop")
    inputs, _, *weights = args[:8]
    for tensor in [*inputs, *(w for group in weights for w in group)]:
        if keras.backend.standardize_dtype(tensor.dtype) != "float32":
            raise NotImplementedError(f"{keras.backend.standardize_dtype(tensor.dtype)} operands: the keras.ops loop")


def read_variables(weights):
    """Variables as tensors (Keras's TensorFlow `convert_to_tensor` gives the variables back)."""
    return _path("read_variables")(weights)


def dropout_seed_generator():
    """The seed generator of a cell's input dropout: None, TensorFlow's `dropout` draws its own."""
    return _path("dropout_seed_generator")()


def dropout(x, rate):
    """`keras.random.dropout(x, rate)`, as `tf.nn.dropout` (TensorFlow's global random stream)."""
    return _path("dropout")(x, rate)


# ---------------------------------------------------------------------------------------------------- strings


def accepts_string_tensors():
    """True where string inputs reach a layer's `call` as the backend's own tensors (tf.string)."""
    return _path("accepts_string_tensors")()


def string_char_ids(mapping, tokens):
    """A char mapping on tf.string tokens `(...)` -> int32 `(..., mapping.width)`, in TF ops (SavedModels too)."""
    return _path("string_char_ids")(mapping, tokens)


def vocabulary_char_mapping(*arguments):
    """A char vocabulary's mapping of tf.string tokens on lookup tables (`VocabularyRows`' arguments)."""
    return _path("vocabulary_char_mapping")(*arguments)


# ---------------------------------------------------------------------------------- ELMo's token-embedding cache


def encode_cached_tokens(char_cnn, cache, char_ids, token_ids, mask):
    """`ELMo.call`'s token vectors, cached words from `cache`, the others from the char CNN."""
    return _path("encode_cached_tokens")(char_cnn, cache, char_ids, token_ids, mask)


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
