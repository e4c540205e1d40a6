"""JAX's fast paths, reached through the door `elmo_tf.layers.backends` (each function there calls the one of the
same name here; a path missing here declines, and the layer runs its `keras.ops` path).

- the recurrence (`projected_lstms`): `jax_recurrence.lstm_scan`, for the calls `backends.plain_float32_loop` lets
  through (`implementation="auto"`, float32), traced into the caller's `jax.jit` like any JAX function;
- the char CNN (`encode_tokens`, `encode_distinct`, `encode_real_tokens`): `jax_char_cnn`, on concrete arrays only
  (an eager call, as `ELMo.embed_tokens` makes): inside `jax.jit` or `jax.grad` the shapes cannot depend on the ids,
  and the layer's `keras.ops` path encodes every row at every position.

Imported only on the JAX backend.
"""

from elmo_tf.layers import backends
from elmo_tf.layers.backends import jax_char_cnn, jax_recurrence


def encode_tokens(char_cnn, char_ids):
    return jax_char_cnn.encode_tokens(char_cnn, char_ids)


def encode_distinct(char_cnn, char_ids):
    return jax_char_cnn.encode_distinct(char_cnn, char_ids)


def encode_real_tokens(char_cnn, char_ids):
    """`CharCNN.call`: the distinct rows (the padding rows' one all-zero row among them) encoded once."""
    return jax_char_cnn.encode_distinct(char_cnn, char_ids)


def projected_lstms(args, units, projection_dim, resets, training, implementation, gate_chunk, matmul_dtype):
    """`run_cells`'s loop on `jax_recurrence.lstm_scan`; declines what `backends.plain_float32_loop` refuses."""
    backends.plain_float32_loop(args, implementation, gate_chunk, matmul_dtype)
    return jax_recurrence.lstm_scan(*args, resets=resets)
