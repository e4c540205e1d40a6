from elmo_tf.models.bilm_pretrainer import BiLMPretrainer
from elmo_tf.models.elmo import ELMo, load_elmo, save_elmo
from elmo_tf.models.language_model import LanguageModel, load_language_model

__all__ = ["BiLMPretrainer", "ELMo", "LanguageModel", "load_elmo", "load_language_model", "save_elmo"]
