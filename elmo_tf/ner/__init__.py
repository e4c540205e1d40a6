"""NER on ELMo, the task whole (Peters et al. 2018, sec. 5): CoNLL data and tag schemes, the one featurizer (TF ops,
used in training and inside the tagger's SavedModel), ELMo features (in process or served, cached), the biLSTM-CRF
tagger, the one pipeline assembling them (used by training, tagging and the export), its training loop, the
KerasTuner search and the tagger export.

Modules, in the order a sentence meets them:
    `data`       read_splits, Encoder (labels, word vocabulary), detect_scheme     (files: `elmo_tf.io.conll`)
    `tags`       IOB1 / IOB2 / BIOES: spans, conversion, CRF transition constraints
    `features`   InProcessFeatures, ServedFeatures (packed to the server's limits), open_feature_source
    `feature_cache` cached_features: one hdf5 file, keyed by the biLM's content and the sentences
    `featurizer` NERFeaturizer: tokens -> mask, word ids, char ids
    `model`      NERTagger: ScalarMix -> biLSTM -> CRF
    `pipeline`   NERPipeline: featurizer + feature source + head, on the host and in a graph
    `training`   NERConfig, load_data, NERBatches, train_tagger, span_scores
    `tuning`     search (KerasTuner HyperModel over gamma, dropout, mix L2)
    `tagging`    load_tagger, the recorded feature source, tag_sentences, output formats
    `export`     export_tagger: sentences -> tags and spans, one SavedModel
"""

from elmo_tf.ner.data import Encoder, NERDataError, read_splits
from elmo_tf.ner.feature_cache import cached_features
from elmo_tf.ner.features import InProcessFeatures, ServedFeatures, open_feature_source
from elmo_tf.ner.featurizer import NERFeaturizer
from elmo_tf.ner.model import NERTagger
from elmo_tf.ner.pipeline import NERPipeline
from elmo_tf.ner.training import NERBatches, NERConfig, NERData, load_data, predict_tags, span_scores, train_tagger

__all__ = [
    "Encoder",
    "InProcessFeatures",
    "NERBatches",
    "NERConfig",
    "NERData",
    "NERDataError",
    "NERFeaturizer",
    "NERPipeline",
    "NERTagger",
    "ServedFeatures",
    "cached_features",
    "load_data",
    "open_feature_source",
    "predict_tags",
    "read_splits",
    "span_scores",
    "train_tagger",
]
