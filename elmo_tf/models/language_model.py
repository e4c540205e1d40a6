"""The biLM as a language model: the softmax on the top biLM layer, per-token log-probabilities and top-k words.

`LanguageModel` is `BiLMPretrainer`'s forward pass (`lm_states`) with the full softmax over the whole vocabulary
(`full_softmax`, computed a chunk of the vocabulary at a time) instead of the sampled one; `sentence_log_probs`
is that code path for any model holding a `char_cnn`, a `bilm` and a `softmax_kernel` / `softmax_bias`, so
`elmo_tf.pretraining.evaluate_perplexity` computes its perplexities from it too.
"""

import math

import keras
import numpy as np
import tensorflow as tf

from elmo_tf.config import BiLMConfig
from elmo_tf.errors import ElmoTFError, check_int
from elmo_tf.models.bilm_pretrainer import lm_states
from elmo_tf.models.elmo import build_bilm_layers
from elmo_tf.preprocessing.char_vocabulary import char_mapping

DIRECTIONS = ("forward", "backward")
DEFAULT_CHUNK_SIZE = 8192  # words per slice of the softmax: 8192 x 2 x 3,200 positions of a batch = 210 MB of logits


def full_softmax(states, targets, kernel, bias, chunk_size=DEFAULT_CHUNK_SIZE, top_k=0):
    """`log p(y | s) = s . w_y + b_y - logsumexp_v(s . w_v + b_v)` over the whole vocabulary, `chunk_size` words at
    a time: the logits of one chunk `(N, chunk_size)` exist at once, never `(N, V)`; the logsumexp is merged over the
    chunks (running maximum and rescaled sum) and so is the top k (the k best of the best so far and the chunk's).

    The target's logit is taken from the same matmul as the others, so its log-probability equals its entry in the
    top k exactly. Ties in the top k go to the lower id.

    Args:
        states: float `(N, P)`; targets: int `(N,)` word ids.
        kernel: float `(V, P)`; bias: float `(V,)` (variables or tensors; V static).
        chunk_size: words per chunk.
        top_k: 0, or how many of the most likely words to return (at most V).
    Returns:
        dict: `log_probs` float `(N,)`; with `top_k`, `top_k_log_probs` float `(N, k)` (decreasing) and
        `top_k_ids` int32 `(N, k)`.
    """
    vocab = int(kernel.shape[0])
    chunk_size = min(chunk_size, vocab)
    states = tf.convert_to_tensor(states)
    kernel = tf.convert_to_tensor(kernel)  # a read of a variable, not a copy
    bias = tf.cast(bias, kernel.dtype)
    targets = tf.cast(targets, tf.int32)
    n = tf.shape(states)[0]
    neg_inf = tf.constant(-np.inf, states.dtype)

    def body(i, running_max, running_sum, target_logit, top_values, top_ids):
        start = i * chunk_size
        size = tf.minimum(chunk_size, vocab - start)
        weights = tf.slice(kernel, [start, 0], [size, -1])
        logits = tf.matmul(states, weights, transpose_b=True) + tf.slice(bias, [start], [size])
        new_max = tf.maximum(running_max, tf.reduce_max(logits, axis=1))
        running_sum = running_sum * tf.exp(running_max - new_max) + tf.reduce_sum(
            tf.exp(logits - new_max[:, None]), axis=1
        )
        local = targets - start
        inside = (local >= 0) & (local < size)
        picked = tf.gather(logits, tf.clip_by_value(local, 0, size - 1)[:, None], batch_dims=1)[:, 0]
        target_logit = tf.where(inside, picked, target_logit)
        if top_k:
            padded = tf.pad(logits, [[0, 0], [0, tf.maximum(top_k - size, 0)]], constant_values=-np.inf)
            values, ids = tf.math.top_k(padded, top_k)
            values, order = tf.math.top_k(tf.concat([top_values, values], axis=1), top_k)
            top_ids = tf.gather(tf.concat([top_ids, ids + start], axis=1), order, batch_dims=1)
            top_values = values
        return i + 1, new_max, running_sum, target_logit, top_values, top_ids

    k = max(top_k, 1)
    start = (
        tf.constant(0),
        tf.fill([n], neg_inf),
        tf.zeros([n], states.dtype),
        tf.zeros([n], states.dtype),
        tf.fill([n, k], neg_inf),
        tf.zeros([n, k], tf.int32),
    )
    chunks = math.ceil(vocab / chunk_size)
    # parallel_iterations=1: one chunk's logits at a time (the next matmul does not wait on the running values)
    _, running_max, running_sum, target_logit, top_values, top_ids = tf.while_loop(
        lambda i, *_: i < chunks, body, start, parallel_iterations=1, maximum_iterations=chunks
    )
    log_norm = running_max + tf.math.log(running_sum)
    result = {"log_probs": target_logit - log_norm}
    if top_k:
        result["top_k_log_probs"] = top_values - log_norm[:, None]
        result["top_k_ids"] = top_ids
    return result


def _backward_order(x, lengths):
    """`(batch, T + 1, ...)` in the pretrainer's backward order (entry 0 predicts `<S>`, entry i word i) -> the
    words first, then `<S>`: entry i - 1 is word i for i = 1..n, entry n is `<S>`; past n unchanged (zeros)."""
    steps = tf.shape(x)[1]
    position = tf.range(steps)[None, :]
    n = lengths[:, None]
    source = tf.where(position < n, position + 1, tf.where(position == n, 0, position))
    return tf.gather(x, source, batch_dims=1)


def sentence_log_probs(model, inputs, chunk_size=DEFAULT_CHUNK_SIZE, top_k=0):
    """Per-token log-probabilities of both directions of a biLM with a softmax (a `LanguageModel`, or a
    `BiLMPretrainer`: anything with `char_cnn`, `bilm`, `softmax_kernel`, `softmax_bias`, `bos_id`, `eos_id`).

    For a sentence w_1..w_n (both directions in forward order, so entry i - 1 is about word i in both):
        forward_log_probs  (n + 1): log p(w_1 | <S>), ..., log p(w_n | <S> w_1..w_n-1), log p(</S> | <S> w_1..w_n);
        backward_log_probs (n + 1): log p(w_i | w_i+1..w_n </S>) for i = 1..n, then log p(<S> | w_1..w_n </S>).
    Entries past n are 0 (top-k ids 0). Words not in the vocabulary are scored as its unknown word (their
    `token_ids`). Both directions share one pass over the vocabulary (`full_softmax`); only real positions are scored.

    Args:
        inputs: dict with `char_ids` int32 `(batch, T, 50)` and `token_ids` int32 `(batch, T)`.
        top_k: 0, or the number of most likely words per position and direction.
    Returns:
        dict: `forward_log_probs`, `backward_log_probs` float `(batch, T + 1)`, `sequence_len` int32 `(batch,)`;
        with `top_k`, `{direction}_top_k_ids` int32 and `{direction}_top_k_log_probs` float `(batch, T + 1, k)`.
    """
    mapping = getattr(model, "char_mapping", None)
    out = lm_states(
        model.char_cnn, model.bilm, inputs, model.bos_id, model.eos_id, training=False, char_mapping=mapping
    )
    keep = out["weights"] > 0  # (batch, T + 1): positions 0..n
    lengths = tf.reduce_sum(tf.cast(keep, tf.int32), axis=1) - 1
    where = tf.where(keep)
    states = [tf.gather_nd(out[d], where) for d in DIRECTIONS]
    targets = [tf.gather_nd(out[f"targets_{d}"], where) for d in DIRECTIONS]
    count = tf.shape(where)[0]
    scored = full_softmax(
        tf.concat(states, axis=0),
        tf.concat(targets, axis=0),
        model.softmax_kernel,
        model.softmax_bias,
        chunk_size=chunk_size,
        top_k=top_k,
    )
    shape = tf.shape(keep, out_type=tf.int64)
    result = {"sequence_len": lengths}
    for index, direction in enumerate(DIRECTIONS):
        rows = slice(None, count) if index == 0 else slice(count, None)
        parts = {"log_probs": scored["log_probs"][rows]}
        if top_k:
            parts.update(top_k_ids=scored["top_k_ids"][rows], top_k_log_probs=scored["top_k_log_probs"][rows])
        for key, values in parts.items():
            full_shape = shape if values.shape.rank == 1 else tf.concat([shape, tf.constant([top_k], tf.int64)], axis=0)
            dense = tf.scatter_nd(where, values, full_shape)
            if direction == "backward":
                dense = _backward_order(dense, lengths)
            result[f"{direction}_{key}"] = dense
    return result


class LMInputError(ElmoTFError):
    """A softmax or vocabulary that does not fit the language model."""


@keras.saving.register_keras_serializable(package="elmo_tf")
class LanguageModel(keras.Model):
    """ELMo's biLM with its softmax, as a language model: per-token log-probabilities in both directions and,
    optionally, the k most likely words at every position (`sentence_log_probs`).

    Sublayers `char_cnn`, `bilm` and weights `softmax_kernel` `(V, P)`, `softmax_bias` `(V,)` are named as in
    `BiLMPretrainer`, so `elmo_tf.io.load_bilm_weights` and `elmo_tf.io.softmax.load_softmax_weights` fill them
    (`load_language_model` does both). The full softmax runs `chunk_size` words at a time (memory bounded at an
    800k-word vocabulary).

    Args:
        config: `BiLMConfig` or options dict.
        vocab_size: V, the softmax's rows.
        bos_id: vocabulary id of `<S>` (`LMVocabulary` gives the three).
        eos_id: vocabulary id of `</S>`.
        unk_id: vocabulary id of `<UNK>`.
        top_k: 0, or how many most likely words to return per position and direction (at most V).
        chunk_size: words per slice of the softmax.
        bilm_layers: optional `(char_cnn, bilm)` to share (an `ELMo`'s: one copy of the weights in an export);
            not part of the config.
    Call arguments:
        inputs: dict with `char_ids` int32 `(batch, T, 50)` and `token_ids` int32 `(batch, T)` (unknown words as
            `unk_id`).
    Returns:
        the dict of `sentence_log_probs`.
    Example:
        lm = load_language_model("options.json", "weights.hdf5", "softmax.hdf5", "vocab.txt", top_k=5)
        out = lm.score_tokens(tf.constant([["The", "cat", "sat", "."]]))
    """

    def __init__(
        self,
        config=None,
        vocab_size=None,
        bos_id=0,
        eos_id=1,
        unk_id=2,
        top_k=0,
        chunk_size=DEFAULT_CHUNK_SIZE,
        bilm_layers=None,
        **kwargs,
    ):
        kwargs.setdefault("name", "language_model")
        super().__init__(**kwargs)
        if config is None:
            config = BiLMConfig()
        elif isinstance(config, dict):
            config = BiLMConfig.from_options(config)
        vocab_size = check_int("vocab_size", vocab_size, 3)
        for name, value in (("bos_id", bos_id), ("eos_id", eos_id), ("unk_id", unk_id)):
            if check_int(name, value, 0) >= vocab_size:
                raise ElmoTFError(f"{name} must be < vocab_size {vocab_size}, got {value}", key=name)
        self.top_k = check_int("top_k", top_k, 0)
        if self.top_k > vocab_size:
            raise ElmoTFError(f"top_k must be <= vocab_size {vocab_size}, got {top_k}", key="top_k")
        self.chunk_size = check_int("chunk_size", chunk_size, 1)
        self.config = config
        self.char_mapping = char_mapping(config)  # strings -> this model's char ids, as `ELMo.char_mapping`
        self.vocab_size, self.bos_id, self.eos_id, self.unk_id = vocab_size, bos_id, eos_id, unk_id
        self.char_cnn, self.bilm = bilm_layers if bilm_layers is not None else build_bilm_layers(config)
        self.softmax_kernel = self.add_weight(
            name="softmax_kernel", shape=(vocab_size, config.projection_dim), initializer="zeros"
        )
        self.softmax_bias = self.add_weight(name="softmax_bias", shape=(vocab_size,), initializer="zeros")
        self._words = self._table = None
        self.built = True

    def call(self, inputs, training=None):
        return sentence_log_probs(self, inputs, self.chunk_size, self.top_k)

    # ------------------------------------------------------------------------------------------ strings in

    def use_vocabulary(self, words):
        """Attaches the vocabulary (V words, row j = word j) for `score_tokens` and the top-k words; its table is
        created now, outside any traced function. Not part of the config (vocabularies are assets)."""
        words = list(words)
        if len(words) != self.vocab_size:
            raise LMInputError(f"the vocabulary has {len(words)} words, the softmax {self.vocab_size} rows")
        with tf.init_scope():
            self._words = tf.constant(words, tf.string)
            self._table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(self._words, tf.range(len(words), dtype=tf.int32)),
                default_value=self.unk_id,
            )

    @property
    def vocabulary_table(self):
        """The attached `tf.lookup.StaticHashTable` word -> id (unknown words -> `unk_id`), or None; an export
        tracks it."""
        return self._table

    def token_ids(self, tokens):
        """tf.string `(...)` -> int32 word ids (`unk_id` for words not in the vocabulary)."""
        if self._table is None:
            raise LMInputError("token_ids needs a vocabulary: call use_vocabulary first")
        return self._table.lookup(tf.convert_to_tensor(tokens, tf.string))

    def top_k_words(self, ids):
        """int ids -> tf.string words of the attached vocabulary."""
        if self._words is None:
            raise LMInputError("top_k_words needs a vocabulary: call use_vocabulary first")
        return tf.gather(self._words, ids)

    def score_tokens(self, tokens):
        """Scores tf.string tokens `(batch, T)` padded with "" (after each sentence's real tokens); returns
        `score`'s outputs."""
        tokens = tf.convert_to_tensor(tokens, tf.string)
        return self.score(self.char_mapping(tokens), self.token_ids(tokens))

    def score(self, char_ids, token_ids):
        """The outputs of `call` on char ids `(batch, T, 50)` and word ids `(batch, T)`, with, for a top k,
        `{direction}_top_k_words` tf.string `(batch, T + 1, k)` beside the ids ("" past a sentence's n + 1)."""
        out = self({"char_ids": char_ids, "token_ids": token_ids}, training=False)
        if self.top_k:
            valid = tf.sequence_mask(out["sequence_len"] + 1, tf.shape(out["forward_log_probs"])[1])[:, :, None]
            for direction in DIRECTIONS:
                words = self.top_k_words(out[f"{direction}_top_k_ids"])
                out[f"{direction}_top_k_words"] = tf.where(valid, words, "")
        return out

    def get_config(self):
        config = super().get_config()
        config.update(
            config=self.config.to_options(),
            vocab_size=self.vocab_size,
            bos_id=self.bos_id,
            eos_id=self.eos_id,
            unk_id=self.unk_id,
            top_k=self.top_k,
            chunk_size=self.chunk_size,
        )
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def load_language_model(options_path, weights_path, softmax_path, vocab_path, elmo=None, **kwargs):
    """A `LanguageModel` from a biLM's `options.json` + `weights.hdf5`, its `softmax.hdf5` (the layout of the
    released `*_softmax_weights.hdf5`) and its vocabulary (one word per line, row j = line j + 1), attached.

    Args:
        elmo: optional `ELMo` of the same biLM whose char CNN and biLM are shared (its weights are used as they
            are; `weights_path` is then not read).
        kwargs: `top_k`, `chunk_size`.
    Raises:
        ElmoTFError naming the file: `ConfigError` (options), `WeightFileError` (weights; a softmax that is not
        `(words, projection_dim)`, or not readable), `LMVocabularyError` (a vocabulary without `<S>`, `</S>`,
        `<UNK>`, or unreadable).
    """
    from elmo_tf.io.bilm_hdf5 import load_bilm_weights
    from elmo_tf.io.softmax import LMVocabulary, check_softmax, load_softmax_weights

    config = elmo.config if elmo is not None else BiLMConfig.from_json(options_path)
    vocab = LMVocabulary.load(vocab_path)
    check_softmax(softmax_path, len(vocab), config.projection_dim, vocab_path)  # before any big allocation
    layers = (elmo.char_cnn, elmo.bilm) if elmo is not None else None
    model = LanguageModel(config, len(vocab), vocab.bos_id, vocab.eos_id, vocab.unk_id, bilm_layers=layers, **kwargs)
    if elmo is None:
        load_bilm_weights(model, weights_path)
    load_softmax_weights(softmax_path, model.softmax_kernel, model.softmax_bias)
    model.use_vocabulary(vocab.words)
    return model
