from elmo_tf.models.bilm_pretrainer import BiLMPretrainer
from elmo_tf.models.elmo import ELMo

__all__ = ["BiLMPretrainer", "ELMo"]
