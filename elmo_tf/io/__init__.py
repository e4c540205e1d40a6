"""Weight files (bilm-tf/AllenNLP hdf5 + options.json)."""

from elmo_tf.io.bilm_hdf5 import WeightFileError, load_bilm_weights, save_bilm_weights, weight_map
from elmo_tf.io.conll import ConllFormatError, Sentence, read_conll
from elmo_tf.io.vocabulary import Vocabulary, build_vocabulary, count_words, expand_glob

__all__ = [
    "ConllFormatError",
    "Sentence",
    "read_conll",
    "Vocabulary",
    "build_vocabulary",
    "count_words",
    "expand_glob",
    "WeightFileError",
    "load_bilm_weights",
    "save_bilm_weights",
    "weight_map",
]
