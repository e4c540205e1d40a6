"""The two model functions of `Embedder` (a char-CNN call, a packed batch's activations) on each Keras backend.

`Embedder` plans its batches in NumPy (`elmo_tf.embed.packing`: packed rows, each distinct token once) and runs the
model through two functions, compiled as each backend's users compile a model:
- TensorFlow: `tf.function`s with input signatures (one graph for every batch), the gathers inside the graph; the
  served `packed` signature is built from them (`elmo_tf.saved_model.contract`).
- JAX: the char CNN eagerly (`CharCNN.encode_tokens` cuts the char positions on concrete ids, and a call's tokens are
  padded to `CNN_TOKENS_MULTIPLE`, so its ops meet few shapes); the biLM and the layers `jax.jit`-compiled over the
  model's weights passed in (`keras.StatelessScope`, as Keras' own JAX trainer does: the weights are arguments, not
  constants folded into the program). Rows and steps are padded to `ROWS_MULTIPLE` and `STEPS_MULTIPLE`, so a run
  compiles a few programs (a batch of `batch_size` rows of `row_length` steps is almost every batch), not one per
  batch; padded rows and steps are all padding (a step no row uses skips its matmuls in JAX's loop).
- PyTorch: eagerly under `torch.no_grad()` (its recurrence is a fused loop of its own, `backends.torch_recurrence`).
Off TensorFlow the lookups of a batch's vectors and of its tokens' outputs are NumPy gathers around the call.

Each function takes and returns NumPy arrays (TensorFlow's return eager tensors, which NumPy reads as arrays).
"""

import contextlib

import keras
import numpy as np
from keras import ops

from elmo_tf.models.elmo import elmo_activations

ROWS_MULTIPLE = 8  # rows of a batch padded to a multiple of this off TensorFlow (JAX compiles once per shape)
STEPS_MULTIPLE = 16  # steps of a batch likewise


def _round_up(n, multiple):
    return -(-n // multiple) * multiple


def combine(acts, layers):
    """ELMo's L+1 layers `acts` as `layers` asks: "all" stacked `(L+1, ..., 2P)`, "top" the last, "average" their
    mean."""
    if layers == "all":
        return ops.stack(acts)
    if layers == "top":
        return acts[-1]
    return ops.sum(ops.stack(acts), axis=0) / len(acts)


def functions(model, layers, gate_chunk):
    """`(encode, run)` of `model` on this process's Keras backend:
    - `encode(ids)`: int32 char ids `(n, input width)` -> float32 `(n, P)` (`CharCNN.encode_tokens`);
    - `run(table, table_rows, starts, positions)`: a batch's vector table `(T, P)`, the table row of each position
      `(rows, steps)` (0: padding), the sentence starts `(rows, steps)` and the `(row, step)` of each real token
      `(n, 2)` -> the `layers` of those tokens, `(L+1, n, 2P)` or `(n, 2P)`.
    """
    backend = keras.config.backend()
    if backend == "tensorflow":
        return _tensorflow_functions(model, layers, gate_chunk)
    if backend not in ("jax", "torch"):
        raise NotImplementedError(f"the Embedder does not run on the {backend!r} backend")

    def activations(x, mask, starts):  # `gate_chunk` is TensorFlow's loop's: JAX's and PyTorch's have their own
        lstm = model.bilm(x, mask=mask, segment_starts=starts)
        return combine(elmo_activations(x, lstm), layers)

    compiled = _jax_jit(activations, model) if backend == "jax" else _eager(activations)
    return _eager(model.char_cnn.encode_tokens), _padded_runner(compiled, layers)


def _padded_runner(compiled, layers):
    """`run` off TensorFlow: rows and steps padded, the batch's vectors gathered in NumPy, `compiled` called, the real
    tokens' outputs gathered back."""

    def run(table, table_rows, starts, positions):
        rows, steps = table_rows.shape
        shape = (_round_up(rows, ROWS_MULTIPLE), _round_up(steps, STEPS_MULTIPLE))
        padded_rows = np.zeros(shape, np.int32)
        padded_rows[:rows, :steps] = table_rows
        padded_starts = np.zeros(shape, bool)
        padded_starts[:rows, :steps] = starts
        out = compiled(np.asarray(table, np.float32)[padded_rows], padded_rows > 0, padded_starts)
        index = (positions[:, 0], positions[:, 1])
        return out[(slice(None), *index)] if layers == "all" else out[index]

    return run


def _jax_jit(fn, model):
    """`fn` of NumPy arrays -> NumPy, `jax.jit`-compiled with the model's weights as arguments (`keras.StatelessScope`
    maps each variable to the value passed)."""
    import jax

    variables = list(model.variables)

    def pure(values, *args):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return fn(*args)

    jitted = jax.jit(pure)
    return lambda *args: np.asarray(jitted([v.value for v in variables], *args))


def _eager(fn):
    """`fn` of NumPy arrays -> NumPy, run eagerly (under PyTorch in `torch.no_grad()`: no autograd graph kept)."""
    if keras.config.backend() == "torch":
        import torch

        no_grad = torch.no_grad
    else:
        no_grad = contextlib.nullcontext

    def call(*args):
        with no_grad():
            return ops.convert_to_numpy(fn(*(ops.convert_to_tensor(a) for a in args)))

    return call


def _tensorflow_functions(model, layers, gate_chunk):
    """`(encode, run)` as `tf.function`s with input signatures: any batch and length in one graph each, the gathers of
    the batch's vectors and of its tokens' outputs inside it."""
    import tensorflow as tf

    width, char_width = model.config.projection_dim, model.char_mapping.width
    encode = tf.function(
        model.char_cnn.encode_tokens,
        input_signature=[tf.TensorSpec([None, char_width], tf.int32)],
        autograph=False,
    )

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, width], tf.float32),  # vector table of the batch
            tf.TensorSpec([None, None], tf.int32),  # (rows, steps): table row of each position, 0 = padding
            tf.TensorSpec([None, None], tf.bool),  # (rows, steps): a sentence starts here
            tf.TensorSpec([None, 2], tf.int32),  # (n, 2): (row, step) of every real token, in output order
        ],
        autograph=False,
    )
    def run(table, table_rows, starts, positions):
        x = tf.gather(table, table_rows)
        lstm = model.bilm(x, mask=table_rows > 0, segment_starts=starts, gate_chunk=gate_chunk)
        acts = elmo_activations(tf.gather_nd(x, positions), [tf.gather_nd(layer, positions) for layer in lstm])
        if layers == "all":
            return tf.stack(acts)  # (L+1, n, 2P)
        if layers == "top":
            return acts[-1]
        return tf.add_n(acts) / len(acts)

    return encode, run
