"""The serving contract of an ELMo export: signature names, input and output keys, and the functions behind them.

One definition, used by the export (`elmo_tf.saved_model.export`), the embedded model server and the gRPC/REST clients
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

`packed` (internal: what the embedded server runs merged `default`/`tokens` requests through; clients keep using
`default`/`tokens`; not exported for a model whose mix normalizes per sentence, `mix_layer_norm`): sentences packed
into rows as `elmo-tf embed` packs them (`elmo_tf.embed.Embedder.embed_rows`, the same functions); one packed call
is a batch of one (axis 0 of every input and output is 1, so a batch-major server takes it as one request), inputs
    `tokens` tf.string `(1, N)`: the distinct tokens (read as `tokens` reads a token inside `sequence_len`),
    `table_rows` int32 `(1, R, S)`: per position, 0 padding, 1 `<S>`, 2 `</S>`, 3 + i the token `tokens[0, i]`,
    `starts` bool `(1, R, S)`: True where a sentence (its `<S>`) starts (the biLM restarts from the zero state)
    (`elmo_tf.embed.packed_layout`); the K token positions (`table_rows` >= 3) are output in row-major order:
outputs `activations` float32 `(1, L+1, K, 2P)` (`elmo_activations`' layout, `embed --layers all`), `elmo` float32
`(1, K, 2P)` (the first ScalarMix), and `max_tokens` int32 `(1,)`: the export's `max_tokens` (0: none), which the
caller applies before packing. Inputs of all ones (a synthetic warm-up) are valid: one `<S>`, no token.
`pack_token_lists` builds the inputs.

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

PACKED_SIGNATURE = "packed"  # internal, see the module docstring
TABLE_ROWS = "table_rows"
STARTS = "starts"
ACTIVATIONS = "activations"
MAX_TOKENS = "max_tokens"
PACKED_RESERVED_ROWS = 3  # table rows 0, 1, 2: padding, <S>, </S>

SENTENCES_SPEC = tf.TensorSpec([None], tf.string, name=SENTENCES)
TOKENS_SPECS = (tf.TensorSpec([None, None], tf.string, name=TOKENS), tf.TensorSpec([None], tf.int32, name=SEQUENCE_LEN))
PACKED_SPECS = (
    tf.TensorSpec([1, None], tf.string, name=TOKENS),
    tf.TensorSpec([1, None, None], tf.int32, name=TABLE_ROWS),
    tf.TensorSpec([1, None, None], tf.bool, name=STARTS),
)


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


def packable(model):
    """Whether `model` gets the `packed` signature: its first mix does not normalize per sentence (a packed row holds
    several sentences, so a per-sentence layer norm cannot be applied to the flat positions)."""
    return bool(model.mixes) and not model.mix_layer_norm


def packed_outputs(model, embedder, tokens, table_rows, starts, max_tokens=None):
    """The `packed` signature's outputs: the distinct `tokens` through the char CNN once (`embedder`'s
    `CharCNN.encode_distinct`, with `<S>`/`</S>`, read as the `tokens` signature reads a token: `tokens_char_ids`),
    then `embedder._run` (`elmo_tf.embed.Embedder` of `model`, layers "all") on the packed rows at every token
    position (row-major: `packed_layout`'s order), and the first mix. Inputs and outputs have a leading axis of 1."""
    tokens = tf.convert_to_tensor(tokens, tf.string)[0]
    table_rows, starts = table_rows[0], starts[0]
    mapping = model.char_mapping
    ids = tokens_char_ids(tokens[None], tf.shape(tokens)[:1], None, mapping)[0]
    bounds = tf.constant(np.stack([mapping.bos_row, mapping.eos_row]).astype(np.int32))
    vectors = embedder._encode(tf.concat([bounds, tf.cast(ids, tf.int32)], axis=0))
    table = tf.concat([tf.zeros([1, model.config.projection_dim], vectors.dtype), vectors], axis=0)
    positions = tf.cast(tf.where(table_rows >= PACKED_RESERVED_ROWS), tf.int32)  # (K, 2), row-major
    activations = embedder._run(table, table_rows, starts, positions)  # (L+1, K, 2P)
    layers = [activations[k][None] for k in range(model.num_output_layers)]
    elmo = model.scalar_mixes[0](layers)[0]
    return {
        ACTIVATIONS: activations[None],
        ELMO: elmo[None],
        MAX_TOKENS: tf.constant([max_tokens or 0], tf.int32),
    }


def pack_token_lists(token_lists, max_rows=None, row_length=None):
    """The `packed` signature's inputs for sentences given as token lists (bytes): packed into rows of `row_length`
    positions (`elmo_tf.embed.ROW_LENGTH`) and rows grouped `max_rows` per call (default: one call) with embed's
    planning functions (`pack_rows`, `group_rows`, `packed_layout`). Empty sentences are left out. Returns a list of
    `(inputs, placed)` per call: `inputs` alias -> array, `placed` the `(sentence index, first position)` of each of
    its sentences (position k of `activations[0]` is token k - first of that sentence)."""
    from elmo_tf.embed import BOUNDARIES, ROW_LENGTH, group_rows, pack_rows, packed_layout

    real = [i for i, t in enumerate(token_lists) if len(t)]
    if not real:
        return []
    rows = [
        [real[i] for i in row]
        for row in pack_rows([len(token_lists[i]) + BOUNDARIES for i in real], row_length or ROW_LENGTH)
    ]
    row_sizes = [sum(len(token_lists[i]) + BOUNDARIES for i in row) for row in rows]
    max_rows = max_rows or len(rows)
    calls = []
    for group in group_rows(row_sizes, max_rows, max_rows * 128):
        call_rows = [rows[r] for r in group]
        index, distinct, token_rows, placed = {}, [], [], []
        for i in (i for row in call_rows for i in row):
            placed.append((i, len(token_rows)))
            for token in token_lists[i]:
                row = index.get(token)
                if row is None:
                    row = index[token] = PACKED_RESERVED_ROWS + len(distinct)
                    distinct.append(token)
                token_rows.append(row)
        table_rows, starts, _ = packed_layout(
            [[len(token_lists[i]) for i in row] for row in call_rows], np.asarray(token_rows, np.int32)
        )
        tokens = np.empty([1, len(distinct)], dtype=object)
        tokens[0, :] = distinct
        inputs = {TOKENS: tokens, TABLE_ROWS: table_rows[None], STARTS: starts[None]}
        calls.append((inputs, placed))
    return calls


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
    endpoints (see the module docstring), the internal `packed` one (`packable` models), and `lm` when `lm` (a
    `LanguageModel` with its vocabulary, sharing the model's biLM: `load_language_model(..., elmo=model)`) is given.

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
    if packable(model):
        from elmo_tf.embed import Embedder

        embedder = Embedder(model, "all")

        def packed_fn(tokens, table_rows, starts):
            return packed_outputs(model, embedder, tokens, table_rows, starts, max_tokens)

        archive.add_endpoint(PACKED_SIGNATURE, packed_fn, input_signature=list(PACKED_SPECS))
    if lm is not None:
        if lm.vocabulary_table is None:
            raise ValueError("the language model has no vocabulary attached (use_vocabulary)")
        archive.track(lm)
        archive.track(lm.vocabulary_table)

        def lm_fn(tokens, sequence_len):
            return lm_outputs(lm, tokens, sequence_len, max_tokens)

        archive.add_endpoint(LM_SIGNATURE, lm_fn, input_signature=list(TOKENS_SPECS))
    return archive
