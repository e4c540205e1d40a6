"""PyTorch's fast paths, reached through the door `elmo_tf.layers.backends` (each function there calls the one of the
same name here; a path missing here declines, and the layer runs its `keras.ops` path).

- the recurrence (`projected_lstms`): `torch_recurrence.lstm_scan`, for the calls `backends.plain_float32_loop` lets
  through (`implementation="auto"`, float32);
- the char CNN (`encode_tokens`, `encode_distinct`, `encode_real_tokens`): `torch_char_cnn`, each distinct token of a
  call once, over the char positions up to the longest token.

Imported only on the PyTorch backend.
"""

from elmo_tf.layers import backends
from elmo_tf.layers.backends import torch_char_cnn, torch_recurrence


def encode_tokens(char_cnn, char_ids):
    return torch_char_cnn.encode_tokens(char_cnn, char_ids)


def encode_distinct(char_cnn, char_ids):
    return torch_char_cnn.encode_distinct(char_cnn, char_ids)


def encode_real_tokens(char_cnn, char_ids):
    """`CharCNN.call`: the distinct rows (the padding rows' one all-zero row among them) encoded once."""
    return torch_char_cnn.encode_distinct(char_cnn, char_ids)


def projected_lstms(args, units, projection_dim, resets, training, implementation, gate_chunk, matmul_dtype):
    """`run_cells`'s loop on `torch_recurrence.lstm_scan`; declines what `backends.plain_float32_loop` refuses."""
    backends.plain_float32_loop(args, implementation, gate_chunk, matmul_dtype)
    return torch_recurrence.lstm_scan(*args, resets=resets)
