"""Where `NERTagger` lived before elmo_tf.ner: `.keras` files saved then name this module, which Keras imports."""

from elmo_tf.ner.model import NERTagger

__all__ = ["NERTagger"]
