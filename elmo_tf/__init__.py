"""elmo_tf: ELMo (Peters et al. 2018) as Keras 3 layers, with bilm-tf/AllenNLP weight interop.

Importing `elmo_tf` (or any submodule, such as the command lines' `elmo_tf.cli`) loads neither TensorFlow nor
Keras: the public names below are imported on first access (PEP 562), so `--help` and usage errors answer at once.
The first access of any of them (`from elmo_tf import ELMo`, `elmo_tf.load_elmo`) also registers every
Keras-serializable class of the package (`elmo_tf._registry`), as `elmo_tf.load_model` does before it reads a file.
"""

from elmo_tf import _lazy, _registry

__version__ = "0.1.0"

# public name -> the module it is imported from (each imports TensorFlow)
_EXPORTS = {
    "BiLMConfig": "elmo_tf.config",
    "get_config": "elmo_tf.config",
    "load_bilm_weights": "elmo_tf.io",
    "load_elmo": "elmo_tf.models",
    "save_bilm_weights": "elmo_tf.io",
    "save_elmo": "elmo_tf.models",
    "BiLM": "elmo_tf.layers",
    "CharCNN": "elmo_tf.layers",
    "ELMoSavedModel": "elmo_tf.layers",
    "Highway": "elmo_tf.layers",
    "ProjectedLSTM": "elmo_tf.layers",
    "ScalarMix": "elmo_tf.layers",
    "TokensToCharIds": "elmo_tf.layers",
    "ELMo": "elmo_tf.models",
    "add_sentence_boundaries": "elmo_tf.preprocessing",
    "tokens_to_char_ids": "elmo_tf.preprocessing",
    "whitespace_tokenize": "elmo_tf.preprocessing",
}
__all__ = sorted([*_EXPORTS, "load_model"])


def load_model(filepath, **kwargs):
    """`keras.saving.load_model(filepath, **kwargs)` once every elmo_tf class is registered with Keras.

    Use it for a `.keras` file holding elmo_tf layers or models in a process that has not used any elmo_tf name
    yet: Keras finds a custom class only once its module has been imported.

    Example:
        model = elmo_tf.load_model("tagger.keras")  # same keyword arguments as keras.saving.load_model
    """
    _registry.register_all()
    import keras

    return keras.saving.load_model(filepath, **kwargs)


__getattr__, __dir__ = _lazy.lazy_namespace(__name__, _EXPORTS, before=_registry.register_all)
