"""PyTorch's char CNN paths, reached through the door `elmo_tf.layers.backends`: each distinct token of a call encoded
once, and the char positions cut to the longest token (shapes that depend on the ids: PyTorch runs eagerly, so they
cost nothing to compile). The encoding itself is the layer's own `keras.ops` code (`CharCNN._encode_rows`, so every
`precision` it has applies), on fewer rows and positions: the same values as every row at every position, to float32
rounding, and the same gradients (a repeated token's is the sum over its occurrences; a max's tie is shared among
equal windows either way).

Imported only on the PyTorch backend.
"""

import torch


def kept_positions(char_cnn, chars):
    """How many char positions `encode_tokens` keeps of int `(n, max_chars)` `chars`: `CharCNN.cut_width` of the
    batch's longest token (its last id that is not `pad_id`, in a row with any id), found on the tensor itself."""
    real = (chars > 0).any(dim=1, keepdim=True)
    used = ((chars != char_cnn.pad_id) & real).any(dim=0)
    where = torch.nonzero(used)
    longest = int(where[-1, 0]) + 1 if len(where) else 0  # one read of the ids on the host
    return char_cnn.cut_width(longest)


def encode_tokens(char_cnn, char_ids):
    """`CharCNN.encode_tokens`: int `(n, input_width)` -> float32 `(n, projection_dim)`, the char positions cut to
    `kept_positions` (all of them when a word id follows the chars: ELMoForManyLangs)."""
    char_ids = char_cnn._check_ids(char_ids, 2)
    if not len(char_ids):  # no token (Keras's max of PyTorch refuses an empty batch)
        return torch.zeros((0, char_cnn.projection_dim), device=char_ids.device)
    if not char_cnn.word_vocab_size:
        char_ids = char_ids[:, : kept_positions(char_cnn, char_ids)]
    return char_cnn._encode_rows(char_ids)


def encode_distinct(char_cnn, char_ids):
    """`CharCNN.encode_distinct`: int `(..., input_width)` -> float32 `(..., projection_dim)`, each distinct row
    through `encode_tokens` once and gathered back (zeros for all-zero rows, which `encode_tokens` gives them)."""
    char_ids = char_cnn._check_ids(char_ids, None)
    flat = char_ids.reshape(-1, char_ids.shape[-1])
    distinct, index = torch.unique(flat, dim=0, return_inverse=True)
    vectors = encode_tokens(char_cnn, distinct)
    return vectors[index].reshape(*char_ids.shape[:-1], vectors.shape[-1])


def encode_real_tokens(char_cnn, char_ids):
    """`CharCNN.call`: the distinct rows (the padding rows' one all-zero row among them) encoded once."""
    return encode_distinct(char_cnn, char_ids)
