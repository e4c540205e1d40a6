"""Which Keras backend runs: the switch between TensorFlow's own paths and the `keras.ops` ones of JAX and PyTorch.

Imports Keras only when asked (importing this module loads neither Keras nor TensorFlow).
"""

import os
import sys

from elmo_tf.errors import ElmoTFError


class BackendError(ElmoTFError):
    """Keras already runs on another backend than the one a caller needs (the message names both)."""


def is_tensorflow_backend():
    """Whether Keras runs on TensorFlow (`keras.config.backend()`): where the TensorFlow-only paths apply."""
    import keras

    return keras.config.backend() == "tensorflow"


def use_tensorflow_backend():
    """Makes Keras run on TensorFlow in this process, whatever `KERAS_BACKEND` or `~/.keras/keras.json` say.

    The `elmo-tf` commands are TensorFlow programs (tf.data input, SavedModel export, TensorFlow's compiled
    recurrence), so a JAX or PyTorch user's shell (`KERAS_BACKEND=jax`) must not change them. Keras reads its
    backend once, when it is first imported: before that, this sets `KERAS_BACKEND=tensorflow` (which also wins over
    keras.json, and reaches the processes a command starts); after it, the backend cannot change.

    Returns:
        The value `KERAS_BACKEND` had before (None when unset), for a caller that wants to say it was overridden.
    Raises:
        BackendError: Keras was already imported with another backend in this process.
    """
    before = os.environ.get("KERAS_BACKEND")
    keras = sys.modules.get("keras")
    if keras is not None and hasattr(keras, "config"):
        backend = keras.config.backend()
        if backend != "tensorflow":
            raise BackendError(
                f"the elmo-tf commands run on TensorFlow, but this process already imported Keras with the "
                f"{backend!r} backend (KERAS_BACKEND={before!r}): run the command in a process of its own "
                "(the `elmo-tf` console script sets the backend itself)",
                key="KERAS_BACKEND",
            )
        return before
    os.environ["KERAS_BACKEND"] = "tensorflow"
    return before
