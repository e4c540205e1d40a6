"""Preprocessing layer: tf.string tokens -> ELMo char ids, inside a Keras model (on JAX and PyTorch: Python strings
-> char ids in NumPy, handed to the model as the backend's tensors)."""

import keras
import numpy as np

from elmo_tf.layers import backends
from elmo_tf.preprocessing.char_rows import BYTE_MAPPING, VocabularyRows, vocabulary_arguments


def vocabulary_mapping(*arguments):
    """A char vocabulary's mapping (`VocabularyRows`' arguments): on the TensorFlow backend
    `char_vocabulary.VocabularyCharMapping` (lookup tables a SavedModel carries, `backends.vocabulary_char_mapping`),
    elsewhere `VocabularyRows` (NumPy)."""
    try:
        return backends.vocabulary_char_mapping(*arguments)
    except NotImplementedError:
        return VocabularyRows(*arguments)


def char_mapping(config):
    """The char mapping of a `BiLMConfig`: `BYTE_MAPPING` (bilm-tf), or its vocabulary's (`vocabulary_mapping`). Both
    map Python strings in NumPy (`.numpy(tokens)`, every backend); on TensorFlow they map tf.string tensors too."""
    return BYTE_MAPPING if config.char_vocabulary is None else vocabulary_mapping(*vocabulary_arguments(config))


def _pairs(value):
    return None if value is None else [list(p) for p in value]


@keras.saving.register_keras_serializable(package="elmo_tf")
class TokensToCharIds(keras.layers.Layer):
    """Maps tokens to char ids as the original does (see `elmo_tf.preprocessing.tokens_to_char_ids`), or, given a
    char vocabulary, as ELMoForManyLangs does (`elmo_tf.preprocessing.char_vocabulary.VocabularyCharMapping`).

    Args:
        char_vocabulary: None (bilm-tf's UTF-8 byte mapping), or `(entry, id)` pairs of a char vocabulary.
        special_ids: the char vocabulary's special ids (see `VocabularyCharMapping`).
        word_vocabulary: `(entry, id)` pairs of a word vocabulary, or None (see `VocabularyCharMapping`).
        word_special_ids: the word vocabulary's special ids. `TokensToCharIds.for_config(elmo.config)` fills these
            four arguments from a model's config.
    Call arguments:
        inputs: tf.string `(batch, tokens)`, padded with "" (on JAX and PyTorch: a NumPy array or nested lists of
            `str`/`bytes`, mapped in NumPy, as keras-hub's tokenizers hand their outputs to those backends).
    Returns:
        int32 `(batch, tokens, 50)` (51 with a word vocabulary: the word id column), all-zero rows for "".
    """

    def __init__(self, char_vocabulary=None, special_ids=None, word_vocabulary=None, word_special_ids=None, **kwargs):
        kwargs.setdefault("trainable", False)
        super().__init__(**kwargs)
        try:
            backends.accepts_string_tensors()  # TensorFlow: Keras converts strings to tf.string tensors
        except NotImplementedError:  # strings reach `call` as they are (keras-hub's preprocessing layers do so)
            self._convert_input_args = False
            self._allow_non_tensor_positional_args = True
        self.char_vocabulary = None if char_vocabulary is None else [tuple(p) for p in char_vocabulary]
        self.special_ids = None if special_ids is None else dict(special_ids)
        self.word_vocabulary = None if word_vocabulary is None else [tuple(p) for p in word_vocabulary]
        self.word_special_ids = None if word_special_ids is None else dict(word_special_ids)
        if self.char_vocabulary is None:
            self.mapping = BYTE_MAPPING
        else:  # TensorFlow's lookup tables (a SavedModel carries them), or NumPy's off TensorFlow
            self.mapping = vocabulary_mapping(
                self.char_vocabulary, self.special_ids, self.word_vocabulary, self.word_special_ids
            )

    @classmethod
    def for_config(cls, config, **kwargs):
        """The layer that maps tokens as a model of `BiLMConfig` `config` expects."""
        if config.char_vocabulary is None:
            return cls(**kwargs)
        return cls(
            config.char_vocabulary,
            config.char_special_ids,
            config.word_vocabulary,
            config.word_special_ids,
            **kwargs,
        )

    def call(self, inputs):
        try:
            return backends.string_char_ids(self.mapping, inputs)
        except NotImplementedError:
            tokens = np.asarray(inputs, dtype=object)
            ids = self.mapping.numpy(tokens.reshape(-1).tolist()).reshape(tokens.shape + (self.mapping.width,))
            return keras.ops.convert_to_tensor(ids)

    def compute_output_spec(self, inputs):
        return keras.KerasTensor(tuple(inputs.shape) + (self.mapping.width,), dtype="int32")

    def get_config(self):
        config = super().get_config()
        config.update(
            char_vocabulary=_pairs(self.char_vocabulary),
            special_ids=self.special_ids,
            word_vocabulary=_pairs(self.word_vocabulary),
            word_special_ids=self.word_special_ids,
        )
        return config
