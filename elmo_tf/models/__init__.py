"""The ELMo encoder, its language model and its pretrainer as Keras models.

Names are imported on first access (`elmo_tf._lazy`): `ELMo`, `load_elmo`, `save_elmo`, `LanguageModel` and
`load_language_model` run on every Keras backend and need no TensorFlow there; `BiLMPretrainer` (pretraining is
TensorFlow's) imports it.
"""

from elmo_tf import _lazy

__all__, __getattr__, __dir__ = _lazy.lazy_namespace(
    __name__,
    {
        "elmo_tf.models.bilm_pretrainer": ("BiLMPretrainer",),
        "elmo_tf.models.elmo": ("ELMo", "load_elmo", "save_elmo"),
        "elmo_tf.models.language_model": ("LanguageModel", "load_language_model"),
    },
)
