"""The biLM's top states and the word each one predicts: the forward pass that `BiLMPretrainer` trains and
`LanguageModel` scores, in `keras.ops` (every Keras backend; the dropout of training TensorFlow's where it runs)."""

import keras
from keras import ops

from elmo_tf.layers import backends
from elmo_tf.preprocessing.chars import add_sentence_boundaries


def lm_states(char_cnn, bilm, inputs, bos_id, eos_id, training=None, dropout=0.0, char_mapping=None):
    """The top biLM states and the word each one predicts, for `BiLMPretrainer` and `LanguageModel` alike.

    Args:
        char_cnn, bilm: the built `CharCNN` and `BiLM`.
        inputs: dict with `char_ids` int32 `(batch, tokens, 50)` and `token_ids` int32 `(batch, tokens)`.
        bos_id: vocabulary id of `<S>`.
        eos_id: vocabulary id of `</S>`.
        dropout: rate on the top layer, in training (pretraining: the TensorFlow backend).
        char_mapping: the model's own (`elmo_tf.preprocessing.char_vocabulary.char_mapping`), for its boundary
            rows; None: bilm-tf's bytes.
    Returns:
        dict: `forward` / `backward` float `(batch, tokens + 1, P)` (the state at position t of `<S> w_1 .. w_n` and
        of `w_1 .. w_n </S>`), `targets_forward` / `targets_backward` int32 `(batch, tokens + 1)` (the word each
        predicts), `weights` float `(batch, tokens + 1)` (1 at the n + 1 real positions).
    """
    char_ids = ops.cast(inputs["char_ids"], "int32")
    token_ids = ops.cast(inputs["token_ids"], "int32")
    mask = ops.any(char_ids > 0, axis=-1)
    lengths = ops.sum(ops.cast(mask, "int32"), axis=1)
    rows = () if char_mapping is None else (char_mapping.bos_row, char_mapping.eos_row)
    with_bounds = add_sentence_boundaries(char_ids, *rows)
    mask_b = ops.any(with_bounds > 0, axis=-1)
    top = bilm(char_cnn.encode_distinct(with_bounds), mask=mask_b, training=training)[-1]
    if training and dropout > 0:
        try:
            top = backends.dropout(top, dropout)
        except NotImplementedError:
            top = keras.random.dropout(top, dropout)
    p = bilm.projection_dim
    # ids with boundaries: <S> w_1 .. w_n </S> pad...
    column = ops.zeros((ops.shape(token_ids)[0], 1), "int32")  # (a slice of token_ids has no column when T is 0)
    ids = ops.concatenate([column + bos_id, token_ids * ops.cast(mask, "int32"), column], axis=1)
    positions = ops.arange(ops.shape(ids)[1], dtype="int32")
    ids = ops.where(ops.equal(positions[None, :], lengths[:, None] + 1), eos_id, ids)
    # forward: state at t predicts ids[t + 1]; backward: state at t + 1 predicts ids[t]
    weights = ops.cast(mask_b[:, 1:], top.dtype)
    return {
        "forward": top[:, :-1, :p],
        "backward": top[:, 1:, p:],
        "targets_forward": ids[:, 1:],
        "targets_backward": ids[:, :-1],
        "weights": weights,
    }
