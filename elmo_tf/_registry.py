"""Registers every Keras-serializable class of elmo_tf, so Keras finds them in `.keras` files.

`@keras.saving.register_keras_serializable(package="elmo_tf")` runs when its module is imported, and the package's
`__init__` is lazy (importing `elmo_tf` loads neither TensorFlow nor Keras). So `elmo_tf.__getattr__` calls
`register_all()` before it resolves any public name, and `elmo_tf.load_model` calls it before Keras reads a file.
`SERIALIZABLE_MODULES` lists every module holding a registered class (tests/test_package.py checks it against the
sources); importing them also imports TensorFlow and Keras.
"""

import importlib
import importlib.util

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


# the modules above whose classes need no TensorFlow: all that is registered where TensorFlow is not installed (the
# numeric layers and `ELMo`, which run on JAX and PyTorch)
BACKEND_NEUTRAL_MODULES = (
    "elmo_tf.layers.bilm",
    "elmo_tf.layers.char_cnn",
    "elmo_tf.layers.highway",
    "elmo_tf.layers.projected_lstm",
    "elmo_tf.layers.scalar_mix",
    "elmo_tf.models.elmo",
)


def register_all():
    """Imports every module of `SERIALIZABLE_MODULES` (a no-op once they are imported); where TensorFlow is not
    installed, those of `BACKEND_NEUTRAL_MODULES`."""
    with_tensorflow = importlib.util.find_spec("tensorflow") is not None
    for module in SERIALIZABLE_MODULES if with_tensorflow else BACKEND_NEUTRAL_MODULES:
        importlib.import_module(module)
