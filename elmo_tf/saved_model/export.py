"""Versioned SavedModel export for TF Serving: `<base>/<version>/`, written atomically and checked before it appears.

`export_elmo` writes an `elmo_tf.ELMo` with the signatures of `elmo_tf.saved_model.contract`, TF Serving's warmup
file (`assets.extra/tf_serving_warmup_requests`, `elmo_tf.saved_model.warmup`: one request per signature, replayed at
load) and its metadata (`assets.extra/elmo_tf.json`, `elmo_tf.saved_model.metadata`: the precision it computes in
among them). A model computing in bfloat16 (`ELMo(precision="bfloat16")`) is exported as it computes: the graph holds
its bfloat16 copies of the weights, so TF Serving and any other loader run it in bfloat16. Each version is published
by `elmo_tf.saved_model.versions.publish_version` (atomic, never overwritten).
"""

import logging

import numpy as np
import tensorflow as tf

from elmo_tf.embed.embedder import model_precision
from elmo_tf.errors import ElmoTFError
from elmo_tf.preprocessing.tokenizer import check_max_tokens, check_tokenizer, make_tokenizer, split_tokens
from elmo_tf.saved_model.contract import (
    ACTIVATIONS,
    ELMO,
    LM_SIGNATURE,
    PACKED_SIGNATURE,
    SENTENCES,
    SENTENCES_SIGNATURE,
    SEQUENCE_LEN,
    SERVING_DEFAULT,
    SIGNATURES,
    TOKENS,
    TOKENS_SIGNATURE,
    activations_from_outputs,
    build_elmo_archive,
    elmo_outputs,
    lm_output_keys,
    pack_token_lists,
    packable,
)
from elmo_tf.saved_model.metadata import export_metadata, write_export_metadata
from elmo_tf.saved_model.versions import ExportError, publish_version  # noqa: F401 (ExportError: long imported from here)
from elmo_tf.saved_model.warmup import WARMUP_SENTENCES, run_warmup_requests, sentence_requests, write_warmup_requests

logger = logging.getLogger(__name__)

PARITY_ATOL = 1e-5
# A bfloat16 model's `packed` signature computes the same products as its padded path grouped differently (other rows
# per matmul, each distinct token through the char CNN once): a float32 sum that moves in its last bit can round to
# the other bfloat16 neighbour (a step of 0.4% of it), and the recurrence carries that on. So `check_export` allows it
# this share of the largest |value| of the model's outputs (the bound the tests hold bfloat16 to against float32).
# Measured on the original-size model (random weights, an AVX2 CPU): 6.1e-4 with 0.625 the largest value (0.1%); the
# padded signatures compute as the model does and stay within PARITY_ATOL, float32's packed one too (5e-7).
PACKED_BFLOAT16_BOUND = 0.01
CHECK_SENTENCES = (
    "The cat sat on the mat .",
    "Dogs are in the fog , aren't they ?",
    "ELMo",
    "",
    "Zürich , 2018 : naïve café !",
)


# ---------------------------------------------------------------------------------------------------- parity


def _pad(token_lists):
    width = max([len(t) for t in token_lists], default=0)
    tokens = np.array([[bytes(x) for x in t] + [b""] * (width - len(t)) for t in token_lists], dtype=object)
    return tokens.reshape(len(token_lists), width), np.array([len(t) for t in token_lists], np.int32)


def reference_tokens(sentences, tokenizer="whitespace", max_tokens=None):
    """Python-side tokenization of `sentences` (list of str/bytes): a list of token lists (bytes)."""
    sentences = [s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in sentences]
    if tokenizer == "whitespace":
        lists = [split_tokens(s) for s in sentences]
    else:
        tokens, lengths = make_tokenizer(tokenizer)(tf.constant(sentences, tf.string))
        lists = [list(row[:n]) for row, n in zip(tokens.numpy(), lengths.numpy())]
    return [t[:max_tokens] if max_tokens else t for t in lists]


def reference_outputs(model, token_lists):
    """The Keras model's outputs (NumPy) for a list of token lists, keyed like the signatures' outputs."""
    tokens, _ = _pad(token_lists)
    out = elmo_outputs(model, model.tokens_to_char_ids(tf.constant(tokens, tf.string)))
    return {key: np.asarray(value) for key, value in out.items()}


def compare_outputs(expected, actual):
    """Max |difference| per output key (float) or count of mismatches (int/bool); raises on missing keys/shapes."""
    if sorted(expected) != sorted(actual):
        raise ExportError(f"output keys differ: expected {sorted(expected)}, got {sorted(actual)}")
    diffs = {}
    for key in expected:
        a, b = np.asarray(expected[key]), np.asarray(actual[key])
        if a.shape != b.shape:
            raise ExportError(f"output {key!r}: shape {b.shape}, expected {a.shape}")
        if a.dtype.kind == "f":
            diffs[key] = float(np.max(np.abs(a - b))) if a.size else 0.0
        else:
            diffs[key] = float(np.sum(a != b))
    return diffs


def check_export(
    model, export_dir, tokenizer="whitespace", max_tokens=None, sentences=CHECK_SENTENCES, atol=PARITY_ATOL
):
    """Reloads `export_dir` with `tf.saved_model.load` and compares every signature with the Keras model.

    The `tokens` signature also gets junk beyond each `sequence_len`, which must not change anything.
    The requests of its warmup file (`elmo_tf.saved_model.warmup`), when it has one, must run too.
    Returns `{signature: {output: max |diff|}}`; raises `ExportError` when a difference exceeds `atol`
    (any difference for int/bool outputs); for a bfloat16 model's `packed` signature, `PACKED_BFLOAT16_BOUND` of the
    largest |value| of the model's outputs when that is more.
    """
    loaded = tf.saved_model.load(export_dir)
    missing = [name for name in SIGNATURES if name not in loaded.signatures]
    if missing:
        raise ExportError(f"{export_dir}: signatures {missing} missing (found {sorted(loaded.signatures)})")
    token_lists = reference_tokens(sentences, tokenizer, max_tokens)
    expected = reference_outputs(model, token_lists)
    tokens, lengths = _pad(token_lists)
    junk = np.where(tokens == b"", b"junk", tokens)  # beyond sequence_len: ignored
    encoded = tf.constant([s.encode("utf-8") if isinstance(s, str) else s for s in sentences], tf.string)
    results = {}
    for name in (SENTENCES_SIGNATURE, SERVING_DEFAULT):
        out = loaded.signatures[name](**{SENTENCES: encoded})
        results[name] = compare_outputs(expected, {k: v.numpy() for k, v in out.items()})
    out = loaded.signatures[TOKENS_SIGNATURE](**{TOKENS: tf.constant(junk, tf.string), SEQUENCE_LEN: lengths})
    results[TOKENS_SIGNATURE] = compare_outputs(expected, {k: v.numpy() for k, v in out.items()})
    if PACKED_SIGNATURE in loaded.signatures:
        results[PACKED_SIGNATURE] = check_packed(loaded.signatures[PACKED_SIGNATURE], token_lists, expected)
    tolerances = {sig: atol for sig in results}
    if PACKED_SIGNATURE in results and model_precision(model) == "bfloat16":
        largest = max(float(np.abs(v).max(initial=0.0)) for v in expected.values() if v.dtype.kind == "f")
        tolerances[PACKED_SIGNATURE] = max(atol, PACKED_BFLOAT16_BOUND * largest)
    bad = {
        f"{sig}/{key}": diff
        for sig, diffs in results.items()
        for key, diff in diffs.items()
        if diff > (tolerances[sig] if key not in expected or np.asarray(expected[key]).dtype.kind == "f" else 0)
    }
    if bad:
        allowed = ", ".join(f"{sig} {tolerances[sig]:.3g}" for sig in sorted({k.split("/")[0] for k in bad}))
        raise ExportError(f"{export_dir}: reloaded outputs differ from the Keras model's (allowed: {allowed}): {bad}")
    try:
        count = run_warmup_requests(loaded, export_dir)
    except (ElmoTFError, tf.errors.OpError) as e:
        raise ExportError(f"{export_dir}: a request of its warmup file fails: {e}") from None
    if count is not None:
        logger.info("the %d requests of the warmup file run", count)
    return results


def check_packed(function, token_lists, expected):
    """`{"activations": max |diff|, "elmo": max |diff|}` of the `packed` signature `function` on `token_lists`
    (packed as the embedded server packs them, `pack_token_lists`) against `expected` (`reference_outputs`)."""
    want = activations_from_outputs(expected)  # (batch, L+1, T, 2P)
    diffs = {ACTIVATIONS: 0.0, ELMO: 0.0}
    for inputs, placed in pack_token_lists(token_lists):
        out = function(**{k: tf.constant(v) for k, v in inputs.items()})
        acts, elmo = out[ACTIVATIONS].numpy()[0], out[ELMO].numpy()[0]
        for i, first in placed:
            n = len(token_lists[i])
            diffs[ACTIVATIONS] = max(
                diffs[ACTIVATIONS], float(np.abs(acts[:, first : first + n] - want[i, :, :n]).max())
            )
            diffs[ELMO] = max(diffs[ELMO], float(np.abs(elmo[first : first + n] - expected[ELMO][i, :n]).max()))
    return diffs


# ---------------------------------------------------------------------------------------------------- warmup


def warmup_requests(tokenizer="whitespace", sentences=WARMUP_SENTENCES, lm=False, packed=False):
    """The warmup file's requests of an ELMo export: `sentences` (8 sentences of news English, 21 tokens on average)
    to `default` and `serving_default`, and the same sentences tokenized (`tokenizer`) and padded to `tokens` (and to
    `lm` when the export has it), and packed into rows for the internal `packed` signature when it has it."""
    token_lists = reference_tokens(sentences, tokenizer)
    tokens, lengths = _pad(token_lists)
    token_signatures = (TOKENS_SIGNATURE, LM_SIGNATURE) if lm else (TOKENS_SIGNATURE,)
    requests = [
        *sentence_requests((SENTENCES_SIGNATURE, SERVING_DEFAULT), sentences),
        *((name, {TOKENS: tokens, SEQUENCE_LEN: lengths}) for name in token_signatures),
    ]
    if packed:
        requests += [(PACKED_SIGNATURE, inputs) for inputs, _ in pack_token_lists(token_lists)]
    return requests


def check_lm_export(lm, export_dir, max_tokens=None, sentences=CHECK_SENTENCES, atol=PARITY_ATOL):
    """Reloads `export_dir` and compares its `lm` signature with `lm` in process (junk beyond each `sequence_len`
    included); returns `{output: max |diff|}` (mismatching words counted); raises `ExportError` above `atol`."""
    loaded = tf.saved_model.load(export_dir)
    if LM_SIGNATURE not in loaded.signatures:
        raise ExportError(f"{export_dir}: signature {LM_SIGNATURE!r} missing (found {sorted(loaded.signatures)})")
    token_lists = [t[:max_tokens] if max_tokens else t for t in reference_tokens(sentences)]
    tokens, lengths = _pad(token_lists)
    width = tokens.shape[1]
    out = lm.score_tokens(tf.constant(tokens, tf.string))
    expected = {key: np.asarray(out[key])[:, : width + 1] for key in lm_output_keys(lm.top_k)}
    junk = np.where(tokens == b"", b"junk", tokens)
    got = loaded.signatures[LM_SIGNATURE](**{TOKENS: tf.constant(junk, tf.string), SEQUENCE_LEN: lengths})
    diffs = compare_outputs(expected, {k: v.numpy() for k, v in got.items()})
    bad = {k: d for k, d in diffs.items() if d > (atol if np.asarray(expected[k]).dtype.kind == "f" else 0)}
    if bad:
        raise ExportError(
            f"{export_dir}: the reloaded lm signature differs from the language model (atol {atol}): {bad}"
        )
    return diffs


# ---------------------------------------------------------------------------------------------------- export


def export_elmo(
    model,
    base_dir,
    version=None,
    tokenizer="whitespace",
    max_tokens=None,
    check=True,
    check_sentences=CHECK_SENTENCES,
    lm=None,
):
    """Writes `model` as `<base_dir>/<version>/`, a SavedModel with the serving signatures, a warmup
    file (`warmup_requests`) and its metadata (`elmo_tf.saved_model.metadata`); returns its path.

    Args:
        model: an `elmo_tf.ELMo` (with at least one mix; the first is exported as `elmo`), computing in its precision
            (`model.precision`: the export computes in it too, and records it).
        base_dir: the model's base path (the directory TF Serving polls), created when missing.
        version: positive int; default: the highest existing version + 1 (1 for a new base_dir).
        tokenizer: "whitespace" or "unicode_script" (see `elmo_tf.preprocessing.tokenizer`).
        max_tokens: optional int; both signatures cut sentences to their first `max_tokens` tokens.
        check: reload the written SavedModel and compare it with the Keras model before publishing it.
        check_sentences: sentences for that check.
        lm: optional `elmo_tf.models.LanguageModel` sharing `model`'s biLM, its vocabulary attached
            (`load_language_model(..., elmo=model)`): adds the `lm` signature (`elmo_tf.saved_model.contract`).
    Returns:
        the path of the new version directory.
    Raises:
        FileExistsError: the version exists (versions are never overwritten).
        ExportError: the check failed; nothing is published.
    """
    check_tokenizer(tokenizer)
    check_max_tokens(max_tokens)

    precision = model_precision(model)

    def write(tmp):
        logger.info("tracing signatures (tokenizer %s, max_tokens %s, precision %s)", tokenizer, max_tokens, precision)
        archive = build_elmo_archive(model, tokenizer, max_tokens, lm=lm)
        logger.info("writing the SavedModel")
        archive.write_out(tmp, verbose=False)
        write_warmup_requests(tmp, warmup_requests(tokenizer, lm=lm is not None, packed=packable(model)))
        write_export_metadata(tmp, export_metadata("elmo", precision, tokenizer, max_tokens))
        if check:
            logger.info("checking the reloaded SavedModel against the Keras model")
            results = check_export(model, tmp, tokenizer, max_tokens, check_sentences)
            worst = max(d for diffs in results.values() for d in diffs.values())
            logger.info("parity ok: max |diff| %.3g over signatures %s", worst, sorted(results))
            if lm is not None:
                diffs = check_lm_export(lm, tmp, max_tokens, check_sentences)
                logger.info("lm parity ok: max |diff| %.3g", max(diffs.values()))

    return publish_version(base_dir, version, write)
