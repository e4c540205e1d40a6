"""Tokens -> character ids, exactly as bilm-tf / AllenNLP do it, in TF ops, and a NumPy twin that needs no TensorFlow.

A token becomes `MAX_CHARS` (50) ids: begin-of-word, the token's UTF-8 bytes cut to the first 48 bytes,
end-of-word, then padding. The literal tokens `<S>` / `</S>` map to the sentence-boundary rows, as in
both original implementations. Every id is shifted by +1 (here, once) so an all-zero row means
"no token": the empty string "" is padding and maps to zeros.
"""

import numpy as np

MAX_CHARS = 50
MAX_BYTES = MAX_CHARS - 2  # room for begin/end of word

# Raw ids of the original code (before the +1 shift).
_BOS_CHAR = 256  # begin of sentence
_EOS_CHAR = 257  # end of sentence
_BOW_CHAR = 258  # begin of word
_EOW_CHAR = 259  # end of word
_PAD_CHAR = 260  # padding inside a token

OFFSET = 1  # applied once, in this module: id 0 is reserved for "no token"
BOW = _BOW_CHAR + OFFSET
EOW = _EOW_CHAR + OFFSET
PAD = _PAD_CHAR + OFFSET
NUM_CHAR_IDS = 262  # rows of the char embedding after the zero row is prepended

BOS_TOKEN = "<S>"
EOS_TOKEN = "</S>"


def _special_row(char):
    row = np.full([MAX_CHARS], _PAD_CHAR, np.int32)
    row[0], row[1], row[2] = _BOW_CHAR, char, _EOW_CHAR
    return row + OFFSET


BOS_CHAR_IDS = _special_row(_BOS_CHAR)  # the sentence-start token's 50 ids (shifted)
EOS_CHAR_IDS = _special_row(_EOS_CHAR)  # the sentence-end token's 50 ids (shifted)


def token_bytes(token):
    """A token (str or bytes) as bytes: bytes as they are, str as UTF-8, a lone surrogate (how text decoded with
    `errors="surrogateescape"` holds an invalid byte) back as the byte it stands for."""
    return token.encode("utf-8", "surrogateescape") if isinstance(token, str) else bytes(token)


def tokens_to_char_ids(tokens):
    """Maps a string tensor of tokens to char ids: `(...,)` tf.string -> `(..., 50)` int32.

    Bytes are used as they are (no UTF-8 validation: invalid UTF-8 maps byte by byte, like the
    original's byte mapping); tokens longer than 48 bytes are cut to their first 48 bytes; "" gives
    an all-zero row (padding). Padding must come after a sentence's real tokens: the model treats
    every all-zero row as padding and places `</S>` after the last real token.

    Args:
        tokens: tf.string tensor of any shape.
    Returns:
        int32 tensor `tokens.shape + (50,)`.
    """
    import tensorflow as tf  # deferred: the constants and the NumPy twin need no TensorFlow

    tokens = tf.convert_to_tensor(tokens)
    if tokens.dtype != tf.string:
        raise TypeError(f"tokens must be a tf.string tensor, got dtype {tokens.dtype.name}")
    cut = tf.strings.substr(tokens, 0, MAX_BYTES, unit="BYTE")
    n_bytes = tf.strings.length(cut, unit="BYTE")[..., None]
    raw = tf.cast(tf.io.decode_raw(cut, tf.uint8, fixed_length=MAX_BYTES), tf.int32)
    # shift the bytes right by one position to make room for begin-of-word
    body = tf.concat([tf.zeros_like(raw[..., :1]), raw, tf.zeros_like(raw[..., :1])], axis=-1)
    pos = tf.range(MAX_CHARS, dtype=tf.int32)
    ids = (
        tf.where(
            pos == 0, _BOW_CHAR, tf.where(pos <= n_bytes, body, tf.where(pos == n_bytes + 1, _EOW_CHAR, _PAD_CHAR))
        )
        + OFFSET
    )
    ids = tf.where((tokens == BOS_TOKEN)[..., None], tf.constant(BOS_CHAR_IDS), ids)
    ids = tf.where((tokens == EOS_TOKEN)[..., None], tf.constant(EOS_CHAR_IDS), ids)
    return tf.where((tokens == "")[..., None], 0, ids)


def tokens_to_char_ids_numpy(tokens):
    """NumPy twin of `tokens_to_char_ids` for a list of `str`/`bytes` tokens: `(n, 50)` int32."""
    out = np.zeros([len(tokens), MAX_CHARS], np.int32)
    for k, token in enumerate(tokens):
        raw = token_bytes(token)
        if raw == b"":
            continue
        if raw == BOS_TOKEN.encode():
            out[k] = BOS_CHAR_IDS
        elif raw == EOS_TOKEN.encode():
            out[k] = EOS_CHAR_IDS
        else:
            raw = raw[:MAX_BYTES]
            row = np.full([MAX_CHARS], _PAD_CHAR, np.int32)
            row[0] = _BOW_CHAR
            row[1 : 1 + len(raw)] = np.frombuffer(raw, np.uint8)
            row[1 + len(raw)] = _EOW_CHAR
            out[k] = row + OFFSET
    return out


def add_sentence_boundaries(char_ids, bos_row=BOS_CHAR_IDS, eos_row=EOS_CHAR_IDS):
    """Puts the begin- and end-of-sentence tokens around each sentence: `(batch, T, W)` -> `(batch, T + 2, W)`.

    Sentences are left-aligned (real tokens first, all-zero rows after); the end token goes right after
    each sentence's last real token, so an empty sentence becomes `<S> </S>`. `bos_row` / `eos_row`: the
    boundary tokens' ids (`W` of them; bilm-tf's by default). In `keras.ops`: a tensor of the Keras backend.
    """
    from keras import ops  # deferred: importing this module loads no Keras

    char_ids = ops.convert_to_tensor(char_ids)
    dtype = char_ids.dtype
    lengths = ops.sum(ops.cast(ops.any(char_ids > 0, axis=-1), "int32"), axis=1)
    bos = ops.broadcast_to(ops.cast(np.asarray(bos_row)[None, None], dtype), (ops.shape(char_ids)[0], 1, len(bos_row)))
    padded = ops.concatenate([bos, char_ids, ops.zeros_like(bos)], axis=1)
    positions = ops.arange(ops.shape(padded)[1], dtype="int32")
    is_eos = ops.equal(positions[None, :], lengths[:, None] + 1)
    return ops.where(is_eos[:, :, None], ops.cast(np.asarray(eos_row), dtype), padded)
