"""Preprocessing layer: tf.string tokens -> ELMo char ids, inside a Keras model."""

import keras

from elmo_tf.preprocessing.chars import MAX_CHARS, tokens_to_char_ids


@keras.saving.register_keras_serializable(package="elmo_tf")
class TokensToCharIds(keras.layers.Layer):
    """Maps tokens to char ids as the original does (see `elmo_tf.preprocessing.tokens_to_char_ids`).

    Call arguments:
        inputs: tf.string `(batch, tokens)`, padded with "".
    Returns:
        int32 `(batch, tokens, 50)`, all-zero rows for "".
    """

    def __init__(self, **kwargs):
        kwargs.setdefault("trainable", False)
        super().__init__(**kwargs)

    def call(self, inputs):
        return tokens_to_char_ids(inputs)

    def compute_output_spec(self, inputs):
        return keras.KerasTensor(tuple(inputs.shape) + (MAX_CHARS,), dtype="int32")
