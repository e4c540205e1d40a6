"""Files: weight files (bilm-tf/AllenNLP hdf5 + options.json), vocabularies, CoNLL, text, atomic writes.

Names are imported on first access (`elmo_tf._lazy`), so a module that needs no TensorFlow (`vocabulary`, `conll`,
`text`, `atomic`) loads none when imported.
"""

from elmo_tf import _lazy

# public name -> the module it is imported from
_EXPORTS = {
    "ConllFormatError": "elmo_tf.io.conll",
    "Sentence": "elmo_tf.io.conll",
    "read_conll": "elmo_tf.io.conll",
    "Vocabulary": "elmo_tf.io.vocabulary",
    "build_vocabulary": "elmo_tf.io.vocabulary",
    "count_words": "elmo_tf.io.vocabulary",
    "expand_glob": "elmo_tf.io.vocabulary",
    "WeightFileError": "elmo_tf.io.bilm_hdf5",
    "load_bilm_weights": "elmo_tf.io.bilm_hdf5",
    "save_bilm_weights": "elmo_tf.io.bilm_hdf5",
    "weight_map": "elmo_tf.io.bilm_hdf5",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = _lazy.lazy_namespace(__name__, _EXPORTS)
