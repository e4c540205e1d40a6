"""elmo_tf: ELMo (Peters et al. 2018) as Keras 3 layers, with bilm-tf/AllenNLP weight interop.

Importing `elmo_tf` (or any submodule, such as the command lines' `elmo_tf.cli`) loads neither TensorFlow nor
Keras: the public names below are imported on first access (PEP 562), so `--help` and usage errors answer at once.
The first access of any of them (`from elmo_tf import ELMo`, `elmo_tf.load_elmo`) also registers every
Keras-serializable class of the package (`elmo_tf._registry`), as `elmo_tf.load_model` does before it reads a file.
"""

from elmo_tf import _lazy, _registry

__version__ = "0.1.0"

# module -> the public names imported from it (each imports TensorFlow)
_names, __getattr__, __dir__ = _lazy.lazy_namespace(
    __name__,
    {
        "elmo_tf.config": ("BiLMConfig", "get_config"),
        "elmo_tf.io": ("load_bilm_weights", "save_bilm_weights"),
        "elmo_tf.layers": (
            "BiLM",
            "CharCNN",
            "ELMoSavedModel",
            "Highway",
            "ProjectedLSTM",
            "ScalarMix",
            "TokensToCharIds",
        ),
        "elmo_tf.models": ("ELMo", "load_elmo", "save_elmo"),
        "elmo_tf.preprocessing": ("add_sentence_boundaries", "tokens_to_char_ids", "whitespace_tokenize"),
    },
    before=_registry.register_all,
)
__all__ = sorted([*_names, "load_model"])


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
