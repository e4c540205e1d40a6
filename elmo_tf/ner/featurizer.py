"""The NER head's own inputs from tokens, in TF ops: the one featurizer of training and of the tagger export."""

import keras
import numpy as np
import tensorflow as tf

from elmo_tf.preprocessing.chars import MAX_CHARS, tokens_to_char_ids

PAD_WORD, UNK_WORD = 0, 1  # word ids: 0 padding, 1 unknown, vocabulary words from 2
MASK, WORD_IDS, CHAR_IDS = "mask", "word_ids", "char_ids"


def lowercase(tokens):
    """The word-feature normalization, `tf.strings.lower` over UTF-8: tf.string tensor -> tf.string tensor.
    Invalid UTF-8 bytes are kept as they are."""
    return tf.strings.lower(tokens, encoding="utf-8")


def lowercase_words(words):
    """`lowercase` for a Python list of str: list of str (what the vocabulary is built from)."""
    if not words:
        return []
    lowered = lowercase(tf.constant(list(words), tf.string)).numpy()
    return [w.decode("utf-8", "surrogateescape") for w in lowered]


@keras.saving.register_keras_serializable(package="elmo_tf")
class NERFeaturizer(keras.layers.Layer):
    """Tokens -> `mask`, `word_ids` (lowercased vocabulary lookup) and `char_ids`, the inputs of `NERTagger`.

    Training (`elmo_tf.ner.training.NERBatches`), tagging and the tagger's SavedModel (`elmo_tf.ner.export`) all call
    this layer, built by `elmo_tf.ner.pipeline.NERPipeline`, so the features a tagger is served with are the ones it
    was trained on, byte for byte.

    Args:
        words: the word vocabulary (already lowercased with `lowercase`), ids 2, 3, ... in order; None for a tagger
            without word features. An empty list maps every word to `UNK_WORD`.
        use_chars: emit `char_ids`, the input of the tagger's own char CNN (its own embedding of bilm-tf's 262
            byte ids): bilm-tf's UTF-8 byte mapping whatever the biLM, since a tagger may have no biLM at all. The
            biLM never reads them: it maps tokens by its own mapping (`InProcessFeatures.graph_activations`).
    Call arguments:
        inputs: `(tokens, sequence_len)`: tf.string `(batch, T)` padded with "", int32 `(batch,)`.
    Returns:
        dict: `mask` bool `(batch, T)`; with words `word_ids` int32 `(batch, T)` (0 padding, 1 unknown);
        with chars `char_ids` int32 `(batch, T, 50)` (all-zero rows at padding).
    """

    def __init__(self, words=None, use_chars=True, **kwargs):
        kwargs.setdefault("trainable", False)
        super().__init__(**kwargs)
        self.words = None if words is None else [str(w) for w in words]
        self.use_chars = bool(use_chars)
        self.lookup = (
            keras.layers.StringLookup(vocabulary=self.words, mask_token="", num_oov_indices=1, name="word_lookup")
            if self.words
            else None
        )
        self.built = True  # no weights: the vocabulary is the lookup's (an asset, not a variable)

    def call(self, inputs):
        tokens, sequence_len = inputs
        tokens = tf.convert_to_tensor(tokens, tf.string)
        mask = tf.sequence_mask(tf.convert_to_tensor(sequence_len, tf.int32), tf.shape(tokens)[1])
        tokens = tf.where(mask, tokens, "")
        out = {MASK: mask}
        if self.words is not None:
            if self.lookup is not None:
                ids = tf.cast(self.lookup(lowercase(tokens)), tf.int32)  # "" -> 0, unknown -> 1, words -> 2..
            else:
                ids = tf.fill(tf.shape(tokens), UNK_WORD)
            out[WORD_IDS] = tf.where(mask, ids, PAD_WORD)
        if self.use_chars:
            out[CHAR_IDS] = tokens_to_char_ids(tokens)
        return out

    def compute_output_spec(self, inputs):
        tokens = inputs[0]
        out = {MASK: keras.KerasTensor(tokens.shape, dtype="bool")}
        if self.words is not None:
            out[WORD_IDS] = keras.KerasTensor(tokens.shape, dtype="int32")
        if self.use_chars:
            out[CHAR_IDS] = keras.KerasTensor(tuple(tokens.shape) + (MAX_CHARS,), dtype="int32")
        return out

    def featurize(self, token_lists):
        """NumPy features of a batch of token lists (str): pads them with "" and calls the layer."""
        width = max([len(t) for t in token_lists], default=0)
        tokens = np.full([len(token_lists), width], b"", dtype=object)
        for row, token_list in enumerate(token_lists):
            tokens[row, : len(token_list)] = [t.encode("utf-8", "surrogateescape") for t in token_list]
        lengths = np.array([len(t) for t in token_lists], np.int32)
        out = self((tf.constant(tokens.reshape(len(token_lists), width), tf.string), tf.constant(lengths)))
        return {k: v.numpy() for k, v in out.items()}

    def get_config(self):
        config = super().get_config()
        config.update(words=self.words, use_chars=self.use_chars)
        return config
