"""Registers every Keras-serializable class of elmo_tf, so Keras finds them in `.keras` files.

`@keras.saving.register_keras_serializable(package="elmo_tf")` runs when its module is imported, and the package's
`__init__` is lazy (importing `elmo_tf` loads neither TensorFlow nor Keras). So `elmo_tf.__getattr__` calls
`register_all()` before it resolves any public name, and `elmo_tf.load_model` calls it before Keras reads a file.
`SERIALIZABLE_MODULES` lists every module holding a registered class (tests/test_package.py checks it against the
sources); importing them also imports TensorFlow and Keras.
"""

import importlib

SERIALIZABLE_MODULES = (
    "elmo_tf.layers.bilm",
    "elmo_tf.layers.char_cnn",
    "elmo_tf.layers.crf",
    "elmo_tf.layers.elmo_saved_model",
    "elmo_tf.layers.highway",
    "elmo_tf.layers.projected_lstm",
    "elmo_tf.layers.scalar_mix",
    "elmo_tf.layers.tokens_to_char_ids",
    "elmo_tf.models.bilm_pretrainer",
    "elmo_tf.models.elmo",
    "elmo_tf.models.language_model",
    "elmo_tf.ner.featurizer",
    "elmo_tf.ner.model",
    "elmo_tf.pretraining.optimizers",
)


# the modules above whose classes need TensorFlow (a SavedModel, pretraining, NER): left out on JAX and PyTorch, where
# the others (the layers, `ELMo`, `LanguageModel`) run
TENSORFLOW_ONLY_MODULES = (
    "elmo_tf.layers.elmo_saved_model",
    "elmo_tf.models.bilm_pretrainer",
    "elmo_tf.ner.featurizer",
    "elmo_tf.ner.model",
    "elmo_tf.pretraining.optimizers",
)


def register_all():
    """Imports every module of `SERIALIZABLE_MODULES` (a no-op once they are imported); on another Keras backend than
    TensorFlow, all but `TENSORFLOW_ONLY_MODULES` (so a JAX or PyTorch process loads no TensorFlow, installed or
    not)."""
    from elmo_tf.backend import is_tensorflow_backend

    skipped = () if is_tensorflow_backend() else TENSORFLOW_ONLY_MODULES
    for module in SERIALIZABLE_MODULES:
        if module not in skipped:
            importlib.import_module(module)
