"""Files: weight files (bilm-tf/AllenNLP hdf5 + options.json), vocabularies, CoNLL, text, atomic writes.

Names are imported on first access (`elmo_tf._lazy`), so a module that needs no TensorFlow (`vocabulary`, `conll`,
`text`, `atomic`) loads none when imported.
"""

from elmo_tf import _lazy

__all__, __getattr__, __dir__ = _lazy.lazy_namespace(
    __name__,
    {
        "elmo_tf.io.bilm_hdf5": ("WeightFileError", "load_bilm_weights", "save_bilm_weights", "weight_map"),
        "elmo_tf.io.conll": ("ConllFormatError", "Sentence", "read_conll"),
        "elmo_tf.io.vocabulary": ("Vocabulary", "build_vocabulary", "count_words", "expand_glob"),
    },
)
