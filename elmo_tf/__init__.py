"""elmo_tf: ELMo (Peters et al. 2018) as Keras 3 layers, with bilm-tf/AllenNLP weight interop."""

from elmo_tf.config import BiLMConfig, get_config
from elmo_tf.io import load_bilm_weights, load_elmo, save_bilm_weights, save_elmo
from elmo_tf.layers import BiLM, CharCNN, ELMoSavedModel, Highway, ProjectedLSTM, ScalarMix, TokensToCharIds
from elmo_tf.models import ELMo
from elmo_tf.preprocessing import add_sentence_boundaries, tokens_to_char_ids, whitespace_tokenize

__version__ = "0.1.0"
__all__ = [
    "BiLM",
    "BiLMConfig",
    "CharCNN",
    "ELMo",
    "ELMoSavedModel",
    "Highway",
    "ProjectedLSTM",
    "ScalarMix",
    "add_sentence_boundaries",
    "get_config",
    "load_bilm_weights",
    "load_elmo",
    "save_bilm_weights",
    "save_elmo",
    "TokensToCharIds",
    "tokens_to_char_ids",
    "whitespace_tokenize",
]
