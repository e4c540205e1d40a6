"""Training the NER head: the config, batches, span F1, early stopping on it, and the written output directory.

A sentence's way: `read_splits` (CoNLL file -> `Sentence`) -> `add_features` (ELMo activations, cached) ->
`NERBatches` (the head's inputs as `NERPipeline` makes them: `NERFeaturizer`'s mask, word ids, char ids, the
activations padded; tags through the `Encoder`) -> `NERTagger` (ScalarMix, biLSTM, CRF). `train_tagger` runs it all
and writes model.keras, encoder.json, metrics.json and config.json.
"""

import collections
import contextlib
import dataclasses
import logging
import math
import os
import time

import keras
import numpy as np
import tensorflow as tf

from elmo_tf.config import SEED_MAX
from elmo_tf.errors import ElmoTFError
from elmo_tf.io.atomic import atomic_path, write_json
from elmo_tf.ner.data import read_splits
from elmo_tf.ner.feature_cache import cached_features
from elmo_tf.ner.features import SentenceTooLongError
from elmo_tf.ner.model import NERTagger
from elmo_tf.ner.pipeline import NERPipeline, batch_inputs, decode_batch, length_groups
from elmo_tf.ner.tags import spans

logger = logging.getLogger(__name__)

OBJECTIVE = "val_span_f1"  # written into each epoch's logs by SpanF1Callback
CHAR_FILTERS = ((3, 50),)  # the head's own char CNN
CRF_SCHEMES = ("iob2", "bioes")


@dataclasses.dataclass
class NERConfig:
    """Hyperparameters of the NER head and its training, validated once.

    Attributes:
        crf_scheme: the scheme the CRF works in, with its transition constraints ("iob2" or "bioes").
        use_words, use_chars: the head's own word embedding / char CNN besides ELMo.
        lstm_units: biLSTM units per direction.
        dropout: on the features and on the biLSTM output, in [0, 1).
        gamma, gamma_trainable, mix_l2, mix_layer_norm: the ScalarMix over the biLM layers.
        epochs, patience: most epochs; epochs without a dev span F1 gain before stopping (best epoch kept).
        batch_size, learning_rate: Adam, gradient norm clipped at 5.
        seed: weights, dropout and batch order.
    """

    crf_scheme: str = "bioes"
    use_words: bool = True
    use_chars: bool = True
    lstm_units: int = 200
    dropout: float = 0.5
    gamma: float = 1.0
    gamma_trainable: bool = True
    mix_l2: float = 0.0
    mix_layer_norm: bool = False
    epochs: int = 30
    patience: int = 4
    batch_size: int = 32
    learning_rate: float = 1e-3
    seed: int = 1

    def __post_init__(self):
        if self.crf_scheme not in CRF_SCHEMES:
            raise ValueError(f"crf_scheme must be one of {CRF_SCHEMES}, got {self.crf_scheme!r}")
        for name in ("lstm_units", "epochs", "patience", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if not 0 < self.learning_rate < math.inf:
            raise ValueError(f"learning_rate must be > 0 and finite, got {self.learning_rate!r}")
        if not 0 < self.gamma < math.inf:
            raise ValueError(f"gamma must be > 0 and finite, got {self.gamma!r}")
        if not 0 <= self.mix_l2 < math.inf:
            raise ValueError(f"mix_l2 must be >= 0 and finite, got {self.mix_l2!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= SEED_MAX:
            raise ValueError(f"seed must be an int, 0 <= seed < 2**32 (numpy's range), got {self.seed!r}")

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass
class NERData:
    """What every training run (and every tuning trial) shares: the sentences, the encoder, the ELMo features.

    Attributes:
        scheme: the files' tag scheme. splits: `{split: [Sentence]}`. encoder: `Encoder`.
        features: `{split: per-sentence activations (L+1, n, dim)}`, or None per split without ELMo.
        num_layers, dim: the biLM's L+1 and 2P (0 and None without ELMo). source_info: the feature source.
    """

    scheme: str
    splits: dict
    encoder: object
    features: dict
    num_layers: int = 0
    dim: int = None
    source_info: dict = dataclasses.field(default_factory=lambda: {"kind": "none"})


def load_data(
    paths,
    tag_scheme="auto",
    crf_scheme="bioes",
    max_sentences=0,
    source=None,
    source_info=None,
    cache=None,
    progress=None,
):
    """Reads the splits (`elmo_tf.ner.data.read_splits`) and, with a `source`, computes each split's ELMo features
    once (`add_features`).

    Args:
        paths: `{split: path}` ("train", "dev", optional "test").
        source: a feature source (`elmo_tf.ner.features.open_feature_source`), or None for no ELMo.
        source_info: see `add_features`.
        cache: see `add_features`.
        progress: see `add_features`.
    Returns:
        `NERData`.
    """
    scheme, splits, encoder = read_splits(paths, tag_scheme, crf_scheme, max_sentences)
    data = NERData(scheme, splits, encoder, {name: None for name in splits})
    if source is not None:
        add_features(data, source, source_info, cache, progress)
    return data


def add_features(data, source, source_info=None, cache=None, progress=None):
    """Computes (or reads from `cache`) the ELMo features of every split of `data`, in place.

    Args:
        source: a feature source (`elmo_tf.ner.features.open_feature_source`).
        source_info: its description, recorded with the tagger together with the source's `identity` (what its
            features depend on: the cache key, and what tagging checks).
        cache: optional hdf5 path caching the features of every split (`elmo_tf.ner.features.cached_features`).
        progress: optional `progress(split, total)` returning a context manager with `.update(n)` (a tqdm bar).
    Raises:
        elmo_tf.ner.features.FeatureCacheError, SentenceTooLongError (its `.split` set): see `cached_features`.
    """
    for name, sentences in data.splits.items():
        start = time.perf_counter()
        with progress(name, len(sentences)) if progress else contextlib.nullcontext() as bar:
            try:
                data.features[name] = cached_features(
                    source, sentences, cache, key=name, progress=bar.update if bar else None
                )
            except SentenceTooLongError as e:
                e.split = name
                raise
        logger.info("ELMo features for %s: %d sentences in %.1f s", name, len(sentences), time.perf_counter() - start)
    data.num_layers, data.dim = source.num_layers, source.dim
    data.source_info = dict(source_info or {}, identity=source.identity)
    return data


class NERBatches(keras.utils.PyDataset):
    """Length-grouped, padded batches for `NERTagger.fit`: `(inputs dict, tag ids)`; batch order shuffled each epoch.

    The inputs are `elmo_tf.ner.pipeline.batch_inputs`: `NERFeaturizer`'s (mask, word ids, char ids) plus
    `activations` `(batch, L+1, T, dim)` when there are ELMo features; the sentences are grouped by length
    (`length_groups`); a batch's features are computed once and reused every epoch.

    Args:
        sentences: list of `elmo_tf.io.conll.Sentence`.
        encoder: `Encoder` (tags).
        featurizer: `NERFeaturizer`.
        features: optional list of per-sentence activations `(L+1, n, dim)` (None: no ELMo).
        with_tags: encode the sentences' tags (False: all-zero tag ids, for predictions only).
    """

    def __init__(
        self,
        sentences,
        encoder,
        featurizer,
        features=None,
        batch_size=32,
        shuffle=True,
        seed=0,
        with_tags=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.sentences, self.encoder, self.featurizer, self.features = sentences, encoder, featurizer, features
        self.batch_size, self.shuffle, self.with_tags = batch_size, shuffle, with_tags
        self.rng = np.random.default_rng(seed)
        self.groups = length_groups([len(s.tokens) for s in sentences], batch_size)
        self.order = self._plan()
        self._computed = {}

    def _plan(self):
        order = list(range(len(self.groups)))
        if self.shuffle:
            self.rng.shuffle(order)
        return order

    def on_epoch_end(self):
        if self.shuffle:
            self.order = self._plan()

    def __len__(self):
        return len(self.groups)

    def _compute(self, group):
        rows = self.groups[group]
        activations = None if self.features is None else [self.features[i] for i in rows]
        inputs = batch_inputs(self.featurizer, [self.sentences[i].tokens for i in rows], activations)
        tags = np.zeros([len(rows), inputs["mask"].shape[1]], np.int32)
        if self.with_tags:
            for r, i in enumerate(rows):
                tags[r, : len(self.sentences[i].tokens)] = self.encoder.encode_tags(self.sentences[i].tags)
        return rows, inputs, tags

    def batch(self, index):
        """(sentence indices, inputs dict, tag ids) of batch `index` in this epoch's order."""
        group = self.order[index]
        if group not in self._computed:
            self._computed[group] = self._compute(group)
        return self._computed[group]

    def __getitem__(self, index):
        _, inputs, tags = self.batch(index)
        return inputs, tags

    def dataset(self):
        """The batches as a `tf.data.Dataset` for `fit`, in the same order (reshuffled before every pass after the
        first, as Keras's `on_epoch_end` does), with the batch and time dimensions unknown.

        Keras's adapter for a PyDataset fixes every dimension its first two batches agree on: two first batches of
        the same width (or of empty sentences only) would make every later batch of another width fail mid-epoch.
        """
        inputs, tags = self[0]

        def spec(array, time_axis=1):
            shape = list(array.shape)
            shape[0] = shape[time_axis] = None
            return tf.TensorSpec(shape, tf.as_dtype(array.dtype))

        signature = ({k: spec(v, 2 if k == "activations" else 1) for k, v in inputs.items()}, spec(tags))
        passes = [0]

        def generate():
            if passes[0]:
                self.on_epoch_end()
            passes[0] += 1
            for index in range(len(self)):
                yield self[index]

        dataset = tf.data.Dataset.from_generator(generate, output_signature=signature)
        return dataset.apply(tf.data.experimental.assert_cardinality(len(self)))


def predict_tags(model, batches):
    """Predicted tag strings (source scheme) for every sentence of a `NERBatches`, in sentence order."""
    out = [None] * len(batches.sentences)
    for index in range(len(batches)):
        rows, inputs, _ = batches.batch(index)
        lengths = [len(batches.sentences[i].tokens) for i in rows]
        for i, tags in zip(rows, decode_batch(batches.encoder, model(inputs, training=False), lengths)):
            out[i] = tags
    return out


def span_scores(gold, predicted, scheme="iob2"):
    """Span-level exact-match precision, recall and F1, overall and per type (as conlleval counts them).

    Args:
        gold: list of tag-string sequences in `scheme`.
        predicted: list of tag-string sequences in `scheme`.
    Returns:
        dict: {"precision", "recall", "f1", "per_type": {type: {"precision", "recall", "f1", "support"}}}
        with values in percent.
    """
    if len(gold) != len(predicted):
        raise ValueError(f"gold has {len(gold)} sentences, predicted {len(predicted)}")
    correct, n_gold, n_pred = collections.Counter(), collections.Counter(), collections.Counter()
    for g, p in zip(gold, predicted):
        if len(g) != len(p):
            raise ValueError(f"a sentence has {len(g)} gold tags and {len(p)} predicted")
        gs, ps = set(spans(g, scheme)), set(spans(p, scheme))
        for kind, _, _ in gs:
            n_gold[kind] += 1
        for kind, _, _ in ps:
            n_pred[kind] += 1
        for kind, _, _ in gs & ps:
            correct[kind] += 1

    def prf(c, pr, go):
        precision = 100.0 * c / pr if pr else 0.0
        recall = 100.0 * c / go if go else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return {"precision": precision, "recall": recall, "f1": f1}

    result = prf(sum(correct.values()), sum(n_pred.values()), sum(n_gold.values()))
    result["per_type"] = {
        k: dict(prf(correct[k], n_pred[k], n_gold[k]), support=n_gold[k]) for k in sorted(set(n_gold) | set(n_pred))
    }
    return result


class SpanF1Callback(keras.callbacks.Callback):
    """Dev span F1 (conlleval exact match, the files' scheme) after every epoch into `logs["val_span_f1"]`, for
    `keras.callbacks.EarlyStopping` and KerasTuner, which must come after it in the callback list."""

    def __init__(self, batches, log=None):
        super().__init__()
        self.batches, self.log = batches, log

    def on_epoch_end(self, epoch, logs=None):
        gold = [s.tags for s in self.batches.sentences]
        f1 = span_scores(gold, predict_tags(self.model, self.batches), self.batches.encoder.source_scheme)["f1"]
        if logs is not None:
            logs[OBJECTIVE] = f1
        if self.log:
            self.log(f"epoch {epoch + 1}: dev span F1 {f1:.2f}")


def early_stopping(patience):
    """Stops after `patience` epochs without a dev span F1 gain and restores the best epoch's weights."""
    return keras.callbacks.EarlyStopping(monitor=OBJECTIVE, mode="max", patience=patience, restore_best_weights=True)


def new_tagger(config, data):
    """A compiled, built `NERTagger` for `config` and `data`, from a fresh Keras session and `config.seed`: every run
    with the same config starts from the same random state."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(config.seed)
    model = NERTagger(
        data.encoder.labels,
        config.crf_scheme,
        num_elmo_layers=data.num_layers,
        word_vocab_size=data.encoder.word_vocab_size(config.use_words),
        char_filters=CHAR_FILTERS if config.use_chars else (),
        lstm_units=config.lstm_units,
        dropout=config.dropout,
        gamma=config.gamma,
        gamma_trainable=config.gamma_trainable,
        mix_l2=config.mix_l2,
        mix_layer_norm=config.mix_layer_norm,
    )
    model.compile(optimizer=keras.optimizers.Adam(config.learning_rate, clipnorm=5.0))
    model.build_for(data.dim)
    return model


def batches_for(pipeline, data, split, config, shuffle=False):
    """`NERBatches` of `split` with the inputs `pipeline`'s head takes (its featurizer, the split's features)."""
    return NERBatches(
        data.splits[split],
        pipeline.encoder,
        pipeline.featurizer,
        data.features[split],
        batch_size=config.batch_size,
        shuffle=shuffle,
        seed=config.seed,
    )


def fit_tagger(model, data, config, epochs=None, callbacks=(), log=None, dev_batches=None, verbose=0):
    """Trains `model` on train with early stopping on dev span F1 (best epoch kept). `callbacks` run after the span
    F1 callback (they can read `val_span_f1`). Returns (History, the best epoch, 1-based)."""
    pipeline = NERPipeline(model, data.encoder)  # the features: `data`'s, computed once
    dev_batches = dev_batches or batches_for(pipeline, data, "dev", config)
    stopper = early_stopping(config.patience)
    history = model.fit(
        batches_for(pipeline, data, "train", config, shuffle=True).dataset(),
        epochs=epochs or config.epochs,
        shuffle=False,  # the batches shuffle themselves (seeded); Keras would only warn that it cannot
        callbacks=[SpanF1Callback(dev_batches, log=log), stopper, *callbacks],
        verbose=verbose,
    )
    return history, stopper.best_epoch + 1


def score(model, data, config, batches=None):
    """`{split: span_scores}` for dev and test (when present), in the files' scheme."""
    result, pipeline = {}, NERPipeline(model, data.encoder)
    for name in ("dev", "test"):
        if name in data.splits:
            split_batches = (batches or {}).get(name) or batches_for(pipeline, data, name, config)
            gold = [s.tags for s in data.splits[name]]
            result[name] = span_scores(gold, predict_tags(model, split_batches), data.scheme)
    return result


OUTPUT_FILES = ("model.keras", "encoder.json", "metrics.json", "config.json")  # in the order written


class OutputError(ElmoTFError):
    """An output file that cannot be written (a full disk, a file size limit); the message names it and why."""


def write_results(model, encoder, output, metrics, config_record):
    """Writes the output directory, each file atomically: `OUTPUT_FILES` (config.json last: a directory with it is
    complete).

    Raises:
        OutputError: naming the file and the error (ENOSPC, EFBIG, ...); its temporary is removed and the file
            as it was.
    """
    model_path, encoder_path, metrics_path, config_path = (os.path.join(output, name) for name in OUTPUT_FILES)
    path = output
    try:
        os.makedirs(output, exist_ok=True)
        path = model_path
        with atomic_path(model_path, suffix=".keras") as tmp:
            model.save(tmp)
        path = encoder_path
        encoder.save(encoder_path)
        path = metrics_path
        write_json(metrics_path, metrics, default=_json_default)
        path = config_path
        write_json(config_path, config_record, default=_json_default)
    except OSError as e:
        raise OutputError(f"cannot write {path!r}: {e.strerror or e}") from None


def _json_default(value):
    if hasattr(value, "item"):  # NumPy scalars
        return value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def train_tagger(config, data, output, record=None, log=None, extra_metrics=None):
    """Trains a tagger on `data` with `config`, scores dev/test, writes `output` (`write_results`: OutputError when a
    file cannot be written); returns the metrics dict.

    Args:
        record: extra entries for config.json (the command line, the files); the config and the feature source
            are always recorded (tagging reads `elmo_source`).
        log: optional callable for per-epoch lines.
        extra_metrics: entries added to metrics.json (a search's trials, say).
    """
    model = new_tagger(config, data)
    start = time.perf_counter()
    _, best_epoch = fit_tagger(model, data, config, log=log, verbose=2 if log else 0)
    metrics = {"best_epoch": best_epoch, "train_seconds": time.perf_counter() - start, **(extra_metrics or {})}
    metrics.update(score(model, data, config))
    for name in ("dev", "test"):
        if name in metrics:
            logger.info(
                "%s span F1 %.2f (P %.2f R %.2f)",
                name,
                metrics[name]["f1"],
                metrics[name]["precision"],
                metrics[name]["recall"],
            )
    config_record = dict(
        record or {},
        ner_config=dataclasses.asdict(config),
        tag_scheme_resolved=data.scheme,
        elmo_source=data.source_info,
    )
    write_results(model, data.encoder, output, metrics, config_record)
    logger.info("wrote %s", output)
    return metrics
