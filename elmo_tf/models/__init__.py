from elmo_tf.models.bilm_pretrainer import BiLMPretrainer
from elmo_tf.models.elmo import ELMo

__all__ = ["BiLMPretrainer", "ELMo", "NERTagger"]


def __getattr__(name):  # `elmo_tf.models.NERTagger`, which lives with the rest of the NER task in elmo_tf.ner
    if name == "NERTagger":
        from elmo_tf.ner.model import NERTagger

        return NERTagger
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
