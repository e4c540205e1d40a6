"""The serving contract of an ELMo export: signature names, input and output keys, and the functions behind them.

One definition, used by the export (`elmo_tf.export`), the embedded model server and the gRPC/REST clients
(`elmo_tf.serving`), the NER feature source and tagger export (`elmo_tf.ner`), and the tests; the names are the TF
Hub ELMo module's (README, "Export").

Signatures:
    `default` (also `serving_default`): input `sentences` tf.string `(batch,)`, tokenized in the graph.
    `tokens`: inputs `tokens` tf.string `(batch, T)` padded with "", `sequence_len` int32 `(batch,)`.
Outputs of both, `T` = the longest sentence of the batch (the `tokens` input's width for `tokens`):
    `word_emb` float32 `(batch, T, P)`: the char-CNN token layer.
    `lstm_outputs1`, `lstm_outputs2`, ... float32 `(batch, T, 2P)`: each biLM layer, forward and backward halves.
    `elmo` float32 `(batch, T, 2P)`: the model's (first) ScalarMix.
    `default` float32 `(batch, 2P)`: the mean of `elmo` over each sentence's real tokens (zeros for an empty one).
    `sequence_len` int32 `(batch,)`: real tokens per sentence.
    `mask` bool `(batch, T)`: True for real tokens. The TF Hub module documents no mask output; bool is what bilm-tf's
        `BidirectionalLanguageModel` returned as `mask` and what `elmo_tf.ELMo` returns.
All outputs are 0 (False) at padded positions. Batch and time dimensions are dynamic.

`lm` (only in exports given a softmax and its vocabulary): inputs as `tokens`; outputs
    `forward_log_probs`, `backward_log_probs` float32 `(batch, T + 1)`: `elmo_tf.models.language_model`'s
        `sentence_log_probs` (entry i - 1 is word i in both directions, entry n the sentence boundary), 0 past a
        row's n + 1 (T is the `tokens` input's width, also with `max_tokens`: a cut sentence ends at the cut);
    with a top k chosen at export, `forward_top_k_words` tf.string and `forward_top_k_log_probs` float32
        `(batch, T + 1, k)`, and `backward_...` ("" and 0 past a row's n + 1).

Edge cases (documented results, never a crash):
    - an empty or all-whitespace sentence: `sequence_len` 0, a row of zeros in every output, `default` zeros;
    - an empty batch `(0,)`: every output with batch 0 (and T 0);
    - `tokens` beyond `sequence_len` are ignored whatever they hold; an "" token inside `sequence_len` is embedded
      as a token without characters (begin-of-word, end-of-word), as AllenNLP's char mapper does;
    - `sequence_len` outside `[0, tokens width]`, or a batch size that differs from `tokens`', fails the request
      with INVALID_ARGUMENT and a message naming `sequence_len`;
    - tokenization as `elmo_tf.preprocessing.tokenizer` documents; tokens are cut to their first 48 bytes.
"""

import keras
import numpy as np
import tensorflow as tf

from elmo_tf.models.elmo import elmo_activations
from elmo_tf.preprocessing.char_vocabulary import BYTE_MAPPING
from elmo_tf.preprocessing.tokenizer import check_max_tokens, check_tokenizer, make_tokenizer

# signature keys
SENTENCES_SIGNATURE = "default"
TOKENS_SIGNATURE = "tokens"
SERVING_DEFAULT = "serving_default"
SIGNATURES = (SENTENCES_SIGNATURE, SERVING_DEFAULT, TOKENS_SIGNATURE)
LM_SIGNATURE = "lm"  # exported only with a softmax and its vocabulary

# input keys
SENTENCES = "sentences"
TOKENS = "tokens"
SEQUENCE_LEN = "sequence_len"  # also an output

# output keys (besides SEQUENCE_LEN)
WORD_EMB = "word_emb"
ELMO = "elmo"
DEFAULT = "default"
MASK = "mask"
LSTM_OUTPUTS_PREFIX = "lstm_outputs"
LM_DIRECTIONS = ("forward", "backward")

SENTENCES_SPEC = tf.TensorSpec([None], tf.string, name=SENTENCES)
TOKENS_SPECS = (tf.TensorSpec([None, None], tf.string, name=TOKENS), tf.TensorSpec([None], tf.int32, name=SEQUENCE_LEN))


def lstm_output_key(layer):
    """`lstm_outputs<layer>` for biLM layer `layer` (1-based)."""
    return f"{LSTM_OUTPUTS_PREFIX}{layer}"


def output_keys(num_layers):
    """The output keys of every signature, for an L-layer biLM, in order."""
    return (
        [WORD_EMB]
        + [lstm_output_key(layer) for layer in range(1, num_layers + 1)]
        + [ELMO, DEFAULT, SEQUENCE_LEN, MASK]
    )


def layer_keys(outputs):
    """`[word_emb, lstm_outputs1, ...]` present in an outputs dict (any mapping), in layer order."""
    keys, layer = [WORD_EMB], 1
    while lstm_output_key(layer) in outputs:
        keys.append(lstm_output_key(layer))
        layer += 1
    return keys


def activations_from_outputs(outputs):
    """The biLM activations `(batch, L+1, T, 2P)` (NumPy) from a signature's outputs, in the layout of
    `elmo_tf.models.elmo.elmo_activations` (`elmo_tf.ELMo`'s `activations`, `embed --layers all`)."""
    layers = elmo_activations(outputs[WORD_EMB], [outputs[k] for k in layer_keys(outputs)[1:]])
    return np.stack([np.asarray(x) for x in layers], axis=1)


def elmo_outputs(model, char_ids):
    """The signature outputs (dict keyed by `output_keys`) of an `elmo_tf.ELMo` on char ids `(batch, T, 50)`."""
    out = model(char_ids, training=False)  # an empty batch works as is: the char CNN handles zero tokens
    return {key: out[model.mixes[0] if key == ELMO else key] for key in output_keys(model.config.num_layers)}


def tokens_char_ids(tokens, sequence_len, max_tokens=None, mapping=BYTE_MAPPING):
    """The `tokens` signature's input handling: `(batch, T)` strings + lengths -> char ids `(batch, T', 50)`.

    Tokens at or beyond `sequence_len` become padding whatever they hold; "" inside the length becomes a token
    without characters; `max_tokens` cuts every sentence. Lengths outside `[0, T]` or a batch size that
    differs from `tokens`' raise InvalidArgumentError (in the graph).
    """
    tokens = tf.convert_to_tensor(tokens, tf.string)
    sequence_len = tf.convert_to_tensor(sequence_len, tf.int32)
    width = tf.shape(tokens)[1]
    checks = [
        tf.debugging.assert_equal(
            tf.shape(sequence_len)[0],
            tf.shape(tokens)[0],
            message=f"{SEQUENCE_LEN} must have one entry per row of {TOKENS}",
        ),
        tf.debugging.assert_non_negative(sequence_len, message=f"{SEQUENCE_LEN} must be >= 0"),
        tf.debugging.assert_less_equal(
            sequence_len, width, message=f"{SEQUENCE_LEN} must be <= the width of {TOKENS} (axis 1)"
        ),
    ]
    with tf.control_dependencies(checks):
        tokens = tf.identity(tokens)
    if max_tokens is not None:
        tokens = tokens[:, :max_tokens]
        sequence_len = tf.minimum(sequence_len, max_tokens)
    inside = tf.sequence_mask(sequence_len, tf.shape(tokens)[1])
    tokens = tf.where(inside, tokens, "")
    char_ids = mapping(tokens)
    empty = (inside & tf.equal(tokens, ""))[..., None]
    return tf.where(empty, tf.constant(mapping.empty_row), char_ids)


def lm_output_keys(top_k=0):
    """The output keys of the `lm` signature, for a top k chosen at export (0: none)."""
    keys = [f"{d}_log_probs" for d in LM_DIRECTIONS]
    if top_k:
        keys += [f"{d}_top_k_{part}" for d in LM_DIRECTIONS for part in ("words", "log_probs")]
    return keys


def lm_outputs(lm, tokens, sequence_len, max_tokens=None):
    """The `lm` signature's outputs (dict keyed by `lm_output_keys`) of an `elmo_tf.models.LanguageModel` (its
    vocabulary attached) on `tokens` `(batch, T)` + `sequence_len`, read as the `tokens` signature reads them
    (`tokens_char_ids`); every output is `T + 1` wide."""
    tokens = tf.convert_to_tensor(tokens, tf.string)
    width = tf.shape(tokens)[1]
    char_ids = tokens_char_ids(tokens, sequence_len, max_tokens)  # checks sequence_len
    kept = tokens[:, :max_tokens] if max_tokens is not None else tokens
    lengths = tf.convert_to_tensor(sequence_len, tf.int32)
    lengths = tf.minimum(lengths, max_tokens) if max_tokens is not None else lengths
    kept = tf.where(tf.sequence_mask(lengths, tf.shape(kept)[1]), kept, "")
    out = lm.score(char_ids, lm.token_ids(kept))
    result = {}
    for key in lm_output_keys(lm.top_k):
        value = out[key]
        pad = [[0, 0], [0, width + 1 - tf.shape(value)[1]]] + [[0, 0]] * (value.shape.rank - 2)
        result[key] = tf.pad(value, pad, constant_values="" if value.dtype == tf.string else 0)
    return result


def build_elmo_archive(model, tokenizer="whitespace", max_tokens=None, lm=None):
    """A `keras.export.ExportArchive` of an `elmo_tf.ELMo` with the `default`/`serving_default` and `tokens`
    endpoints (see the module docstring), and `lm` when `lm` (a `LanguageModel` with its vocabulary, sharing the
    model's biLM: `load_language_model(..., elmo=model)`) is given.

    Written with `ExportArchive` (track + add_endpoint): `tf.saved_model.save` of a `tf.Module` holding a Keras 3
    model loads in Python but fails in TF Serving's C++ loader (tensorflow/serving#2226).
    """
    check_tokenizer(tokenizer)
    check_max_tokens(max_tokens)
    if not model.mixes:
        raise ValueError("the model has no ScalarMix (mixes=()): the `elmo` and `default` outputs need one")
    tokenize = make_tokenizer(tokenizer, max_tokens)

    def sentences_fn(sentences):
        tokens, _ = tokenize(sentences)
        return elmo_outputs(model, model.tokens_to_char_ids(tokens))

    def tokens_fn(tokens, sequence_len):
        return elmo_outputs(model, tokens_char_ids(tokens, sequence_len, max_tokens, model.char_mapping))

    archive = keras.export.ExportArchive()
    archive.track(model)
    # the first endpoint is also written as `serving_default` (the same function, traced once)
    archive.add_endpoint(SENTENCES_SIGNATURE, sentences_fn, input_signature=[SENTENCES_SPEC])
    archive.add_endpoint(TOKENS_SIGNATURE, tokens_fn, input_signature=list(TOKENS_SPECS))
    if lm is not None:
        if lm.vocabulary_table is None:
            raise ValueError("the language model has no vocabulary attached (use_vocabulary)")
        archive.track(lm)
        archive.track(lm.vocabulary_table)

        def lm_fn(tokens, sequence_len):
            return lm_outputs(lm, tokens, sequence_len, max_tokens)

        archive.add_endpoint(LM_SIGNATURE, lm_fn, input_signature=list(TOKENS_SPECS))
    return archive
