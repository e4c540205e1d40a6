"""NER on ELMo: features (in process or from a model server), batches, span F1 and early stopping.

The same `NERTagger` head trains on features from either source: `InProcessFeatures` runs a frozen
`ELMo` here; `ServedFeatures` asks a TF Serving-compatible server (the `tokens` signature) over gRPC.
Both give, per sentence, the biLM activations `(L+1, n_tokens, 2P)` with the token layer duplicated,
exactly the layout of `python -m elmo_tf embed --layers all`.
"""

import collections
import json
import math
import os

import keras
import numpy as np

from elmo_tf.preprocessing.chars import tokens_to_char_ids_numpy
from elmo_tf.preprocessing.tags import convert, spans

PAD_WORD, UNK_WORD = 0, 1


def _in_batches(fetch, sentences, batch_size, progress=None):
    """Per-sentence arrays of `fetch` called on chunks of `batch_size`; `progress(n)` after each chunk."""
    out = []
    for start in range(0, len(sentences), batch_size):
        chunk = sentences[start : start + batch_size]
        out.extend(fetch(chunk))
        if progress:
            progress(len(chunk))
    return out


class InProcessFeatures:
    """biLM activations from an `ELMo` model run in this process."""

    def __init__(self, elmo, batch_size=32):
        from elmo_tf.embed import Embedder

        self.embedder = Embedder(elmo, layers="all")
        self.batch_size = batch_size
        self.dim = 2 * elmo.config.projection_dim
        self.num_layers = elmo.num_output_layers

    def __call__(self, sentences, progress=None):
        return _in_batches(
            lambda chunk: self.embedder.embed_batch([[t.encode("utf-8") for t in s] for s in chunk]),
            sentences,
            self.batch_size,
            progress,
        )


class ServedFeatures:
    """biLM activations from a model server's `tokens` signature (TF Serving or `serving/serve.py`)."""

    def __init__(self, client, batch_size=32):
        self.client = client
        self.batch_size = batch_size
        probe = self._fetch([["probe"]])[0]
        self.num_layers, _, self.dim = probe.shape

    def _fetch(self, sentences):
        width = max(1, max(len(s) for s in sentences))
        tokens = np.array([list(s) + [""] * (width - len(s)) for s in sentences], dtype=object)
        lengths = np.array([len(s) for s in sentences], np.int32)
        out = self.client.embed_tokens(tokens, sequence_len=lengths)
        word = out["word_emb"]
        layers = [np.concatenate([word, word], axis=-1)]
        k = 1
        while f"lstm_outputs{k}" in out:
            layers.append(out[f"lstm_outputs{k}"])
            k += 1
        stacked = np.stack(layers, axis=1)  # (batch, L+1, T, 2P)
        return [stacked[i, :, :n] for i, n in enumerate(lengths)]

    def __call__(self, sentences, progress=None):
        return _in_batches(self._fetch, sentences, self.batch_size, progress)


class Encoder:
    """Label map, word vocabulary (from training sentences) and scheme conversion for one tagger."""

    def __init__(self, labels, scheme, words=None, source_scheme=None):
        self.labels = list(labels)
        self.scheme = scheme
        self.source_scheme = source_scheme or scheme
        self.label_ids = {label: i for i, label in enumerate(self.labels)}
        self.words = list(words or [])
        self.word_ids = {w: i + 2 for i, w in enumerate(self.words)}

    @classmethod
    def fit(cls, sentences, source_scheme, scheme="bioes", min_word_count=2):
        tags = [convert(s.tags, source_scheme, scheme) for s in sentences]
        labels = ["O"] + sorted({t for seq in tags for t in seq} - {"O"})
        counts = collections.Counter(w.lower() for s in sentences for w in s.tokens)
        words = sorted(w for w, n in counts.items() if n >= min_word_count)
        return cls(labels, scheme, words, source_scheme)

    def encode_tags(self, tags):
        converted = convert(tags, self.source_scheme, self.scheme)
        unknown = [t for t in converted if t not in self.label_ids]
        if unknown:
            raise ValueError(f"tag {unknown[0]!r} is not among the labels seen in training ({self.labels})")
        return [self.label_ids[t] for t in converted]

    def decode_tags(self, ids):
        return convert([self.labels[i] for i in ids], self.scheme, self.source_scheme)

    def to_json(self):
        return {"labels": self.labels, "scheme": self.scheme, "source_scheme": self.source_scheme, "words": self.words}

    @classmethod
    def from_json(cls, data):
        return cls(data["labels"], data["scheme"], data["words"], data["source_scheme"])

    def save(self, path):
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f)

    @classmethod
    def load(cls, path):
        with open(path, encoding="utf-8") as f:
            return cls.from_json(json.load(f))


class NERBatches(keras.utils.PyDataset):
    """Length-grouped, padded batches for `NERTagger.fit`: `(inputs dict, tag ids)`; shuffled each epoch.

    Args:
        sentences: list of `elmo_tf.io.conll.Sentence`.
        encoder: `Encoder`.
        features: optional list of per-sentence activations `(L+1, n, dim)` (None: no ELMo).
        use_words, use_chars: add `word_ids` / `char_ids` inputs.
    """

    def __init__(
        self,
        sentences,
        encoder,
        features=None,
        batch_size=32,
        shuffle=True,
        use_words=True,
        use_chars=True,
        seed=0,
        with_tags=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.sentences, self.encoder, self.features = sentences, encoder, features
        self.batch_size, self.shuffle = batch_size, shuffle
        self.use_words, self.use_chars, self.with_tags = use_words, use_chars, with_tags
        self.rng = np.random.default_rng(seed)
        self.order = self._plan()

    def _plan(self):
        idx = sorted(range(len(self.sentences)), key=lambda i: len(self.sentences[i].tokens))
        batches = [idx[i : i + self.batch_size] for i in range(0, len(idx), self.batch_size)]
        if self.shuffle:
            self.rng.shuffle(batches)
        return batches

    def on_epoch_end(self):
        if self.shuffle:
            self.order = self._plan()

    def __len__(self):
        return len(self.order)

    def batch(self, index):
        rows = self.order[index]
        width = max(1, max(len(self.sentences[i].tokens) for i in rows))
        mask = np.zeros([len(rows), width], bool)
        tags = np.zeros([len(rows), width], np.int32)
        inputs = {}
        if self.features is not None:
            layers, _, dim = self.features[rows[0]].shape
            acts = np.zeros([len(rows), layers, width, dim], np.float32)
        if self.use_words:
            word_ids = np.zeros([len(rows), width], np.int32)
        if self.use_chars:
            char_ids = np.zeros([len(rows), width, 50], np.int32)
        for r, i in enumerate(rows):
            s = self.sentences[i]
            n = len(s.tokens)
            mask[r, :n] = True
            if self.with_tags:
                tags[r, :n] = self.encoder.encode_tags(s.tags)
            if self.features is not None:
                acts[r, :, :n] = self.features[i]
            if self.use_words:
                word_ids[r, :n] = [self.encoder.word_ids.get(w.lower(), UNK_WORD) for w in s.tokens]
            if self.use_chars and n:
                char_ids[r, :n] = tokens_to_char_ids_numpy(s.tokens)
        inputs["mask"] = mask
        if self.features is not None:
            inputs["activations"] = acts
        if self.use_words:
            inputs["word_ids"] = word_ids
        if self.use_chars:
            inputs["char_ids"] = char_ids
        return rows, inputs, tags

    def __getitem__(self, index):
        _, inputs, tags = self.batch(index)
        return inputs, tags


def predict_tags(model, batches):
    """Predicted tag strings (source scheme) for every sentence of a `NERBatches`, in sentence order."""
    out = [None] * len(batches.sentences)
    for index in range(len(batches)):
        rows, inputs, _ = batches.batch(index)
        pred = np.asarray(model(inputs, training=False))
        for r, i in enumerate(rows):
            n = len(batches.sentences[i].tokens)
            out[i] = batches.encoder.decode_tags(pred[r, :n].tolist())
    return out


def span_scores(gold, predicted, scheme="iob2"):
    """Span-level exact-match precision, recall and F1, overall and per type (as conlleval counts them).

    Args:
        gold, predicted: lists of tag-string sequences in `scheme`.
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
    """Dev span F1 after every epoch into `logs["val_span_f1"]`; keeps the best weights; stops after
    `patience` epochs without improvement (early stopping on dev span F1)."""

    def __init__(self, batches, patience=3, log=None):
        super().__init__()
        self.batches, self.patience, self.log = batches, patience, log
        self.best, self.best_epoch, self.best_weights, self.wait = -math.inf, -1, None, 0

    def on_epoch_end(self, epoch, logs=None):
        gold = [s.tags for s in self.batches.sentences]
        f1 = span_scores(gold, predict_tags(self.model, self.batches), self.batches.encoder.source_scheme)["f1"]
        if logs is not None:
            logs["val_span_f1"] = f1
        if self.log:
            self.log(f"epoch {epoch + 1}: dev span F1 {f1:.2f}")
        if f1 > self.best:
            self.best, self.best_epoch, self.wait = f1, epoch, 0
            self.best_weights = [w.numpy() for w in self.model.weights]
        else:
            self.wait += 1
            if self.wait >= self.patience:
                self.model.stop_training = True

    def on_train_end(self, logs=None):
        if self.best_weights is not None:
            for w, value in zip(self.model.weights, self.best_weights):
                w.assign(value)


def cached_features(source, sentences, cache_path=None, key="features", source_info="", progress=None):
    """Per-sentence activations from `source`, stored in / read from an hdf5 cache when `cache_path` is set.

    A cached entry is used only when it was made for the same number of sentences, the same tokens and the
    same `source_info` (a description of the feature source); otherwise it is recomputed and replaced.
    `progress(n)`, when given, is passed to the source, which calls it as sentences are computed.
    """
    import hashlib

    import h5py

    tokens = [s.tokens for s in sentences]
    digest = hashlib.sha256(json.dumps([source_info, tokens]).encode()).hexdigest()
    if cache_path and os.path.exists(cache_path):
        with h5py.File(cache_path, "r") as f:
            if key in f and f[key].attrs.get("digest") == digest:
                return [f[key][str(i)][...] for i in range(len(sentences))]
    features = source(tokens, progress=progress)
    if cache_path:
        with h5py.File(cache_path, "a") as f:
            if key in f:
                del f[key]
            group = f.create_group(key)
            group.attrs["digest"] = digest
            for i, array in enumerate(features):
                group.create_dataset(str(i), data=array)
    return features
