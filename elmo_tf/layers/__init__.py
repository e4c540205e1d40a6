"""Keras 3 layers of ELMo, registered under the package name "elmo_tf"."""

from elmo_tf.layers.bilm import BiLM
from elmo_tf.layers.char_cnn import CharCNN
from elmo_tf.layers.crf import CRF
from elmo_tf.layers.elmo_saved_model import ELMoSavedModel
from elmo_tf.layers.highway import Highway
from elmo_tf.layers.projected_lstm import ProjectedLSTM, ProjectedLSTMCell
from elmo_tf.layers.scalar_mix import ScalarMix
from elmo_tf.layers.tokens_to_char_ids import TokensToCharIds

__all__ = [
    "BiLM",
    "CRF",
    "CharCNN",
    "ELMoSavedModel",
    "Highway",
    "ProjectedLSTM",
    "ProjectedLSTMCell",
    "ScalarMix",
    "TokensToCharIds",
]
