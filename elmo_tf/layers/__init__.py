"""Keras 3 layers of ELMo, registered under the package name "elmo_tf".

Names are imported on first access (`elmo_tf._lazy`): every layer but `ELMoSavedModel` (a TensorFlow SavedModel)
runs on every Keras backend and needs no TensorFlow off it (`TokensToCharIds` maps Python strings in NumPy there).
"""

from elmo_tf import _lazy

__all__, __getattr__, __dir__ = _lazy.lazy_namespace(
    __name__,
    {
        "elmo_tf.layers.bilm": ("BiLM",),
        "elmo_tf.layers.char_cnn": ("CharCNN",),
        "elmo_tf.layers.crf": ("CRF",),
        "elmo_tf.layers.elmo_saved_model": ("ELMoSavedModel",),
        "elmo_tf.layers.highway": ("Highway",),
        "elmo_tf.layers.projected_lstm": ("ProjectedLSTM", "ProjectedLSTMCell"),
        "elmo_tf.layers.scalar_mix": ("ScalarMix",),
        "elmo_tf.layers.tokens_to_char_ids": ("TokensToCharIds",),
    },
)
