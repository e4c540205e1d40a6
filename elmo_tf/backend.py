"""Which Keras backend runs: the switch between TensorFlow's own paths and the `keras.ops` ones of JAX and PyTorch.

Imports Keras only when asked (importing this module loads neither Keras nor TensorFlow).
"""


def is_tensorflow_backend():
    """Whether Keras runs on TensorFlow (`keras.config.backend()`): where the TensorFlow-only paths apply."""
    import keras

    return keras.config.backend() == "tensorflow"
