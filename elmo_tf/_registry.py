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


# the modules above whose classes need no TensorFlow: all that is registered on JAX and PyTorch (the layers and `ELMo`,
# which run there)
BACKEND_NEUTRAL_MODULES = (
    "elmo_tf.layers.bilm",
    "elmo_tf.layers.char_cnn",
    "elmo_tf.layers.crf",
    "elmo_tf.layers.highway",
    "elmo_tf.layers.projected_lstm",
    "elmo_tf.layers.scalar_mix",
    "elmo_tf.layers.tokens_to_char_ids",
    "elmo_tf.models.elmo",
    "elmo_tf.models.language_model",
)


def register_all():
    """Imports every module of `SERIALIZABLE_MODULES` (a no-op once they are imported); on another Keras backend than
    TensorFlow, those of `BACKEND_NEUTRAL_MODULES` (so a JAX or PyTorch process loads no TensorFlow, installed or
    not)."""
    import keras

    on_tensorflow = keras.config.backend() == "tensorflow"
    for module in SERIALIZABLE_MODULES if on_tensorflow else BACKEND_NEUTRAL_MODULES:
        importlib.import_module(module)
