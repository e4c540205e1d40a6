"""The biLM as a language model: the softmax on the top biLM layer, per-token log-probabilities and top-k words.

`LanguageModel` is `BiLMPretrainer`'s forward pass (`lm_states`) with the full softmax over the whole vocabulary
(`full_softmax`, computed a chunk of the vocabulary at a time) instead of the sampled one; `sentence_log_probs`
is that code path for any model holding a `char_cnn`, a `bilm` and a `softmax_kernel` / `softmax_bias`, so
`elmo_tf.pretraining.evaluate_perplexity` computes its perplexities from it too.

TensorFlow's fast paths (a `tf.while_loop` over the vocabulary, only the real positions scored, the vocabulary on a
lookup table) come through the door `elmo_tf.layers.backends` (`tensorflow_language_model`). Where it declines (JAX,
PyTorch) the same numbers come from `keras.ops` here: the vocabulary's chunks in a Python loop, every position scored
(masked after), the vocabulary as a Python dict and the words as Python strings (`WordVocabulary`).
"""

import keras
import numpy as np
from keras import ops

from elmo_tf.config import BiLMConfig
from elmo_tf.errors import ElmoTFError, check_int
from elmo_tf.layers import backends, low_precision
from elmo_tf.layers.tokens_to_char_ids import char_mapping
from elmo_tf.models.elmo import build_bilm_layers, weights_loaded
from elmo_tf.models.lm_states import lm_states
from elmo_tf.precision import PrecisionError
from elmo_tf.preprocessing.char_rows import sentences_to_char_ids
from elmo_tf.preprocessing.chars import token_bytes

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
        kernel: float `(V, P)`; bias: float `(V,)` (variables or tensors; V static). A bfloat16 kernel (a language
            model's copy, `precision="bfloat16"`): the logits' matmuls take bfloat16 operands with float32
            accumulation; the logits and everything after them stay float32.
        chunk_size: words per chunk.
        top_k: 0, or how many of the most likely words to return (at most V).
    Returns:
        dict: `log_probs` float `(N,)`; with `top_k`, `top_k_log_probs` float `(N, k)` (decreasing) and
        `top_k_ids` int32 `(N, k)`.
    """
    try:
        return backends.full_softmax(states, targets, kernel, bias, chunk_size, top_k)
    except NotImplementedError:
        return _full_softmax_ops(states, targets, kernel, bias, chunk_size, top_k)


def _full_softmax_ops(states, targets, kernel, bias, chunk_size, top_k):
    """`full_softmax` in `keras.ops` (JAX, PyTorch): the same merges, over the chunks in a Python loop (the
    vocabulary's size is static)."""
    vocab = int(kernel.shape[0])
    chunk_size = min(chunk_size, vocab)
    states = ops.convert_to_tensor(states)
    kernel = ops.convert_to_tensor(kernel)
    bias = ops.cast(bias, states.dtype)
    targets = ops.cast(targets, "int32")
    low = keras.backend.standardize_dtype(kernel.dtype) == low_precision.LOW
    multiply = low_precision.matmul if low else ops.matmul
    n = ops.shape(states)[0]
    k = max(top_k, 1)
    running_max = ops.full((n,), -np.inf, states.dtype)
    running_sum = ops.zeros((n,), states.dtype)
    target_logit = ops.zeros((n,), states.dtype)
    top_values, top_ids = ops.full((n, k), -np.inf, states.dtype), ops.zeros((n, k), "int32")
    for start in range(0, vocab, chunk_size):
        size = min(chunk_size, vocab - start)
        logits = multiply(states, ops.transpose(kernel[start : start + size])) + bias[start : start + size]
        new_max = ops.maximum(running_max, ops.max(logits, axis=1))
        running_sum = running_sum * ops.exp(running_max - new_max) + ops.sum(ops.exp(logits - new_max[:, None]), 1)
        running_max = new_max
        local = targets - start
        inside = ops.logical_and(local >= 0, local < size)
        picked = ops.take_along_axis(logits, ops.clip(local, 0, size - 1)[:, None], axis=1)[:, 0]
        target_logit = ops.where(inside, picked, target_logit)
        if top_k:
            values, ids = ops.top_k(logits, min(top_k, size))
            ids = ops.cast(ids, "int32") + start
            values, order = ops.top_k(ops.concatenate([top_values, values], axis=1), top_k)
            top_ids = ops.take_along_axis(ops.concatenate([top_ids, ids], axis=1), ops.cast(order, "int32"), 1)
            top_values = values
    log_norm = running_max + ops.log(running_sum)
    result = {"log_probs": target_logit - log_norm}
    if top_k:
        result["top_k_log_probs"] = top_values - log_norm[:, None]
        result["top_k_ids"] = top_ids
    return result


def _backward_order(x, lengths):
    """`(batch, T + 1, ...)` in the pretrainer's backward order (entry 0 predicts `<S>`, entry i word i) -> the
    words first, then `<S>`: entry i - 1 is word i for i = 1..n, entry n is `<S>`; past n unchanged (zeros)."""
    position = ops.arange(ops.shape(x)[1], dtype="int32")[None, :]
    n = ops.cast(lengths, "int32")[:, None]
    source = ops.where(position < n, position + 1, ops.where(ops.equal(position, n), 0, position))
    source = ops.reshape(source, tuple(ops.shape(source)) + (1,) * (len(x.shape) - 2))
    return ops.take_along_axis(x, ops.broadcast_to(source, ops.shape(x)), axis=1)


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
    lengths = ops.sum(ops.cast(keep, "int32"), axis=1) - 1
    scored = score_positions(
        [out[d] for d in DIRECTIONS],
        [out[f"targets_{d}"] for d in DIRECTIONS],
        keep,
        softmax_operand(model),
        model.softmax_bias,
        chunk_size,
        top_k,
    )
    result = {"sequence_len": lengths}
    for direction, parts in zip(DIRECTIONS, scored):
        for key, dense in parts.items():
            result[f"{direction}_{key}"] = _backward_order(dense, lengths) if direction == "backward" else dense
    return result


def softmax_operand(model):
    """The softmax kernel as `model`'s logits' matmuls take it: its bfloat16 copy where the model computes in bfloat16
    (a `LanguageModel(precision="bfloat16")`), else the float32 variable."""
    if getattr(model, low_precision.HOLDER, None) is None:
        return model.softmax_kernel
    (kernel,) = low_precision.read(model)
    return kernel


def score_positions(states, targets, keep, kernel, bias, chunk_size=DEFAULT_CHUNK_SIZE, top_k=0):
    """`full_softmax` of every direction's states at the positions where `keep` is True, zeros elsewhere.

    On TensorFlow only those positions are scored (`backends.score_positions`: gathered, one pass over the vocabulary
    for all directions, scattered back); elsewhere every position is (shapes that do not depend on the data, as
    `jax.jit` needs), then masked.

    Args:
        states: per direction, float `(batch, T, P)`; targets: per direction, int `(batch, T)`.
        keep: bool `(batch, T)`.
        kernel, bias, chunk_size, top_k: `full_softmax`'s.
    Returns:
        per direction, a dict of `full_softmax`'s keys -> float or int32 `(batch, T)` (`(batch, T, k)` for the top k).
    """
    try:
        return backends.score_positions(states, targets, keep, kernel, bias, chunk_size, top_k)
    except NotImplementedError:
        pass
    batch, steps = ops.shape(keep)[0], ops.shape(keep)[1]
    p = states[0].shape[-1]
    scored = full_softmax(
        ops.concatenate([ops.reshape(s, (-1, p)) for s in states], axis=0),
        ops.concatenate([ops.reshape(t, (-1,)) for t in targets], axis=0),
        kernel,
        bias,
        chunk_size=chunk_size,
        top_k=top_k,
    )
    count = batch * steps
    directions = []
    for index in range(len(states)):
        rows = slice(index * count, (index + 1) * count)
        dense = {}
        for key, values in scored.items():
            values = ops.reshape(values[rows], (batch, steps) + tuple(values.shape[1:]))
            kept = keep if len(values.shape) == 2 else keep[:, :, None]
            dense[key] = ops.where(kept, values, ops.zeros_like(values))
        directions.append(dense)
    return directions


class WordVocabulary:
    """A language model's vocabulary in NumPy, where the backend has no lookup table (`backends.word_vocabulary`:
    TensorFlow's): row j = word j; a dict of the words' bytes (as TensorFlow's table compares) -> a word's first row,
    the words as str; sentences of Python strings in.

    Args:
        words: the V words of the softmax's rows (str or bytes).
        unk_id: the id of words not in the vocabulary.
    """

    def __init__(self, words, unk_id):
        self.words = np.array([token_bytes(w).decode("utf-8", "replace") for w in words], object)
        self.table = {token_bytes(w): i for i, w in reversed(list(enumerate(words)))}
        self.unk_id = unk_id

    def token_ids(self, tokens):
        """Sentences of Python strings (any lengths) -> int32 NumPy `(batch, longest)`, 0 past each sentence."""
        sentences = [[token_bytes(t) for t in sentence if len(t)] for sentence in tokens]
        ids = np.zeros([len(sentences), max(map(len, sentences), default=0)], np.int32)
        for k, sentence in enumerate(sentences):
            ids[k, : len(sentence)] = [self.table.get(t, self.unk_id) for t in sentence]
        return ids

    def words_of(self, ids):
        """int ids -> a NumPy array of str."""
        return self.words[ops.convert_to_numpy(ids)]

    def model_inputs(self, char_mapping, tokens):
        """Sentences of Python strings -> `(char ids, word ids)` NumPy, the language model's inputs."""
        return sentences_to_char_ids(char_mapping, tokens), self.token_ids(tokens)

    def top_k_words(self, ids, sequence_len):
        """Top-k ids `(batch, T + 1, k)` -> their words, "" past each sentence's n + 1 (`sequence_len` n)."""
        steps = ops.shape(ids)[1]
        valid = np.arange(steps)[None, :, None] <= ops.convert_to_numpy(sequence_len)[:, None, None]
        return np.where(valid, self.words_of(ids), "")


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
        precision: None, or one of `elmo_tf.precision.PRECISIONS`: what the char CNN, the biLM and the softmax's
            matmuls compute in (bfloat16: on bfloat16 copies of the weights converted once, float32 accumulation;
            logits, log-probabilities and every output float32). None: the shared `bilm_layers`' precision, else
            "float32". Shared layers computing in another precision: `PrecisionError`. The config keeps the value
            asked for; the attribute `precision` is the computed one.
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
        precision=None,
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
        self.requested_precision, self.precision = _lm_precision(precision, bilm_layers)
        if bilm_layers is not None:
            self.char_cnn, self.bilm = bilm_layers
        else:
            self.char_cnn, self.bilm = build_bilm_layers(config, precision=self.precision)
        self.softmax_kernel = self.add_weight(
            name="softmax_kernel", shape=(vocab_size, config.projection_dim), initializer="zeros"
        )
        self.softmax_bias = self.add_weight(name="softmax_bias", shape=(vocab_size,), initializer="zeros")
        low_precision.attach(self, [self.softmax_kernel])
        self._vocabulary = None  # `use_vocabulary`
        self.built = True

    def call(self, inputs, training=None):
        return sentence_log_probs(self, inputs, self.chunk_size, self.top_k)

    # ------------------------------------------------------------------------------------------ strings in

    def use_vocabulary(self, words):
        """Attaches the vocabulary (V words, row j = word j) for `score_tokens` and the top-k words: TensorFlow's lookup
        table (`backends.word_vocabulary`, created now, outside any traced function), else a `WordVocabulary`. Not part
        of the config (vocabularies are assets)."""
        words = list(words)
        if len(words) != self.vocab_size:
            raise LMInputError(f"the vocabulary has {len(words)} words, the softmax {self.vocab_size} rows")
        try:
            self._vocabulary = backends.word_vocabulary(words, self.unk_id)
        except NotImplementedError:
            self._vocabulary = WordVocabulary(words, self.unk_id)

    @property
    def vocabulary_table(self):
        """The attached vocabulary's table word -> id (unknown words -> `unk_id`): a `tf.lookup.StaticHashTable`,
        which an export tracks (on JAX and PyTorch a dict), or None."""
        return None if self._vocabulary is None else self._vocabulary.table

    def _attached(self, method):
        if self._vocabulary is None:
            raise LMInputError(f"{method} needs a vocabulary: call use_vocabulary first")
        return self._vocabulary

    def token_ids(self, tokens):
        """tf.string `(...)` -> int32 word ids (`unk_id` for words not in the vocabulary). On JAX and PyTorch:
        sentences of Python strings (any lengths) -> int32 NumPy `(batch, longest)`, 0 past each sentence."""
        return self._attached("token_ids").token_ids(tokens)

    def top_k_words(self, ids):
        """int ids -> tf.string words of the attached vocabulary (on JAX and PyTorch: a NumPy array of str)."""
        return self._attached("top_k_words").words_of(ids)

    def score_tokens(self, tokens):
        """Scores tf.string tokens `(batch, T)` padded with "" (after each sentence's real tokens); returns
        `score`'s outputs. On JAX and PyTorch: sentences of Python strings, as `ELMo.embed_tokens` takes them."""
        return self.score(*self._attached("token_ids").model_inputs(self.char_mapping, tokens))

    def score(self, char_ids, token_ids):
        """The outputs of `call` on char ids `(batch, T, 50)` and word ids `(batch, T)`, with, for a top k,
        `{direction}_top_k_words` tf.string `(batch, T + 1, k)` beside the ids ("" past a sentence's n + 1; on JAX
        and PyTorch a NumPy array of str)."""
        out = self({"char_ids": char_ids, "token_ids": token_ids}, training=False)
        if self.top_k:
            vocabulary = self._attached("top_k_words")
            for direction in DIRECTIONS:
                words = vocabulary.top_k_words(out[f"{direction}_top_k_ids"], out["sequence_len"])
                out[f"{direction}_top_k_words"] = words
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
        if self.requested_precision is not None:
            config["precision"] = self.requested_precision
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def _lm_precision(precision, bilm_layers):
    """`(requested, computed)` of a `LanguageModel`'s `precision` (None: the shared layers', else float32)."""
    shared = None if bilm_layers is None else getattr(bilm_layers[1], "precision", "float32")
    if precision is None:
        return None, shared or "float32"
    requested, computed = low_precision.layer_precision(precision)
    if shared is not None and shared != computed:
        raise PrecisionError(
            f"precision {precision!r} computes in {computed}, but the shared char CNN and biLM compute in {shared}",
            key="precision",
        )
    return requested, computed


def load_language_model(options_path, weights_path, softmax_path, vocab_path, elmo=None, **kwargs):
    """A `LanguageModel` from a biLM's `options.json` + `weights.hdf5`, its `softmax.hdf5` (the layout of the
    released `*_softmax_weights.hdf5`) and its vocabulary (one word per line, row j = line j + 1), attached.

    Args:
        elmo: optional `ELMo` of the same biLM whose char CNN and biLM are shared (its weights are used as they
            are; `weights_path` is then not read).
        kwargs: `top_k`, `chunk_size`, `precision` (None: `elmo`'s, else float32).
    Raises:
        ElmoTFError naming the file: `ConfigError` (options), `WeightFileError` (weights; a softmax that is not
        `(words, projection_dim)`, or not readable), `LMVocabularyError` (a vocabulary without `<S>`, `</S>`,
        `<UNK>`, or unreadable).
    """
    from elmo_tf.io.bilm_hdf5 import check_weight_file, load_bilm_weights
    from elmo_tf.io.softmax import LMVocabulary, check_softmax, load_softmax_weights

    config = elmo.config if elmo is not None else BiLMConfig.from_json(options_path)
    if elmo is None:
        check_weight_file(config, weights_path)  # the file's shapes (metadata) before any tensor is allocated
    vocab = LMVocabulary.load(vocab_path)
    check_softmax(softmax_path, len(vocab), config.projection_dim, vocab_path)  # before any big allocation
    layers = (elmo.char_cnn, elmo.bilm) if elmo is not None else None
    model = LanguageModel(config, len(vocab), vocab.bos_id, vocab.eos_id, vocab.unk_id, bilm_layers=layers, **kwargs)
    if elmo is None:
        load_bilm_weights(model, weights_path)
    load_softmax_weights(softmax_path, model.softmax_kernel, model.softmax_bias)
    weights_loaded(model)
    model.use_vocabulary(vocab.words)
    return model
