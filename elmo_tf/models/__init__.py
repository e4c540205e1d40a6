from elmo_tf.models.bilm_pretrainer import BiLMPretrainer
from elmo_tf.models.elmo import ELMo
from elmo_tf.models.ner_tagger import NERTagger

__all__ = ["BiLMPretrainer", "ELMo", "NERTagger"]
