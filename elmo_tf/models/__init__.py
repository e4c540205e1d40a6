from elmo_tf.models.bilm_pretrainer import BiLMPretrainer
from elmo_tf.models.elmo import ELMo, load_elmo, save_elmo

__all__ = ["BiLMPretrainer", "ELMo", "load_elmo", "save_elmo"]
