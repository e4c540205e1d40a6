from elmo_tf.models.elmo import ELMo

__all__ = ["ELMo"]
